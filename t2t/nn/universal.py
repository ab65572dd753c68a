"""Universal Transformer (Dehghani et al. 2019): one shared layer applied recurrently.

With `config.universal_steps = T` a stack is one `TransformerLayer` applied T times (its
parameters shared by the steps, `nn.scan` with the parameters broadcast; each step keeps its
own decoding cache). Before every step the coordinate embedding of sec. 2.1 is added:

    P^t[i, 2j]   = sin(i / 10000^(2j/d)) + sin(t / 10000^(2j/d))
    P^t[i, 2j+1] = cos(i / 10000^(2j/d)) + cos(t / 10000^(2j/d))

with i the token's position (0-based, as t2t's positions) and t = 1..T the step.

`config.universal_act` adds adaptive computation time (sec. 2.2, after Graves 2016): per
position a halting unit p_t = sigmoid(w·s_t + b) (b = 1 at init, as the authors'
tensor2tensor code); a position still running adds p_t to its halting probability until
that would pass `universal_act_threshold`, when it halts and its remainder
R = 1 − (probability so far) is used instead; the output is Graves' weighted sum
s_out = Σ_t w_t · layer(s_t), w_t = p_t (running), R (halting step), 0 (halted), so the
weights of a halted position sum to 1. (tensor2tensor's code interpolates instead,
out_t = w_t · layer(s_t) + (1 − w_t) · out_{t−1}; this follows the papers.) Halted
positions keep being transformed (their states feed the others' attention) but no longer
change their output; positions still running after T steps output their partial sum.
Halting is tracked by a boolean so float rounding of 1 − R + R cannot restart a halted
position. The ponder cost mean(N + R) (N: steps taken) is sown in the
"universal" collection; `ponder_loss` weights it by `universal_ponder_weight` for the loss.
"""
from __future__ import annotations

from typing import Any, Dict, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from t2t.errors import ConfigError
from t2t.nn.blocks import TransformerLayer
from t2t.nn.config import TransformerConfig

PONDER_COLLECTION = "universal"


def check_universal_config(cfg: TransformerConfig) -> None:
    """One-line errors for Universal Transformer options (called by TransformerConfig)."""
    if cfg.universal_steps < 0:
        raise ConfigError(f"universal_steps must be >= 0 (0 = off), got {cfg.universal_steps}")
    if not 0.0 < cfg.universal_act_threshold <= 1.0:
        raise ConfigError(f"universal_act_threshold must be in (0, 1], got "
                          f"{cfg.universal_act_threshold}")
    if cfg.scan_layers or cfg.share_layers or cfg.moe_num_experts:
        raise ConfigError("universal_steps replaces the layer stack by one recurrent layer: "
                          "set scan_layers=False, share_layers=False, moe_num_experts=0")


def coordinate_signal(positions: jax.Array, step: jax.Array, d_model: int) -> jax.Array:
    """positions [batch, length], step (scalar, 1-based) -> P^t [batch, length, d_model]."""
    j = jnp.arange(0, d_model, 2, dtype=jnp.float32)                 # the 2j of sec. 2.1
    inv = 1.0 / (10000.0 ** (j / d_model))                           # [ceil(d/2)]
    pos = positions.astype(jnp.float32)[..., None] * inv             # [b, l, d/2]
    t = jnp.asarray(step, jnp.float32) * inv                         # [d/2]
    signal = jnp.stack([jnp.sin(pos) + jnp.sin(t), jnp.cos(pos) + jnp.cos(t)], axis=-1)
    return signal.reshape(positions.shape + (-1,))[..., :d_model]    # interleaved sin, cos


class _Step(nn.Module):
    """One recurrent step: carry -> carry (see the module docstring)."""

    config: TransformerConfig
    deterministic: bool = True
    decode: bool = False

    @nn.compact
    def __call__(self, carry, step, encoded, self_mask, self_bias, cross_mask, positions,
                 decode_index):
        cfg = self.config
        state, output, halting, remainders, n_updates, halted = carry
        state = state + coordinate_signal(positions, step, cfg.d_model).astype(state.dtype)
        transformed = TransformerLayer(cfg, self.deterministic, self.decode, name="layer")(
            state, encoded, self_mask, self_bias, cross_mask, positions, decode_index)
        if not cfg.universal_act:
            return (transformed, transformed, halting, remainders, n_updates, halted), None
        p = jax.nn.sigmoid(nn.Dense(1, dtype=jnp.float32, param_dtype=cfg.params_dtype,
                                    bias_init=nn.with_logical_partitioning(
                                        nn.initializers.ones, (None,)),
                                    kernel_init=nn.with_logical_partitioning(
                                        nn.initializers.lecun_normal(), ("embed", None)),
                                    name="halting")(state.astype(jnp.float32))[..., 0])
        running = (~halted).astype(jnp.float32)                          # [b, l]
        would_be = halting + p * running
        new_halted = (would_be > cfg.universal_act_threshold).astype(jnp.float32) * running
        still = (would_be <= cfg.universal_act_threshold).astype(jnp.float32) * running
        halting = halting + p * still
        remainders = remainders + new_halted * (1.0 - halting)
        halting = halting + new_halted * remainders
        n_updates = n_updates + still + new_halted
        w = (p * still + new_halted * remainders)[..., None]             # [b, l, 1]
        output = (output.astype(jnp.float32)                           # Σ_t w_t layer(s_t)
                  + transformed.astype(jnp.float32) * w).astype(state.dtype)
        halted = halted | (new_halted > 0)
        return (transformed, output, halting, remainders, n_updates, halted), None


class UniversalStack(nn.Module):
    """[batch, length, embed] -> same: `universal_steps` applications of one shared layer."""

    config: TransformerConfig
    deterministic: bool = True
    decode: bool = False

    @nn.compact
    def __call__(self, x, encoded=None, self_mask=None, self_bias=None, cross_mask=None,
                 positions=None, decode_index=None):
        cfg = self.config
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(x.shape[1], dtype=jnp.int32), x.shape[:2])
        scanned = nn.scan(_Step, variable_broadcast="params",
                          variable_axes={"cache": 0, "intermediates": 0},
                          split_rngs={"params": False, "dropout": True},
                          in_axes=(0,) + (nn.broadcast,) * 6, length=cfg.universal_steps)
        zeros = jnp.zeros(x.shape[:2], jnp.float32)
        carry = (x, jnp.zeros_like(x), zeros, zeros, zeros, jnp.zeros(x.shape[:2], bool))
        steps = jnp.arange(1, cfg.universal_steps + 1, dtype=jnp.int32)
        carry, _ = scanned(cfg, self.deterministic, self.decode, name="step")(
            carry, steps, encoded, self_mask, self_bias, cross_mask, positions, decode_index)
        _, output, _, remainders, n_updates, _ = carry
        if cfg.universal_act:
            self.sow(PONDER_COLLECTION, "ponder_cost", jnp.mean(n_updates + remainders))
            self.sow(PONDER_COLLECTION, "steps", jnp.mean(n_updates))
        return output


def ponder_loss(cfg: TransformerConfig, sown: Any) -> Tuple[jax.Array, Dict[str, jax.Array]]:
    """(universal_ponder_weight x the summed ponder costs of the stacks, metrics) from a
    model's "universal" collection; 0 and no metrics without ACT."""
    costs, steps = [], []
    for path, leaf in jax.tree_util.tree_flatten_with_path(sown)[0]:
        name = next(k.key for k in reversed(path) if isinstance(k, jax.tree_util.DictKey))
        (costs if name == "ponder_cost" else steps).append(jnp.ravel(leaf))
    if not costs:
        return jnp.zeros((), jnp.float32), {}
    cost = jnp.sum(jnp.concatenate(costs))
    return (cfg.universal_ponder_weight * cost,
            {"ponder_cost": cost, "act_steps": jnp.mean(jnp.concatenate(steps))})
