"""Mixture-of-experts feed-forward: Switch (top-1, Fedus et al. 2021) and GShard (top-2,
Lepikhin et al. 2020) routing with a capacity per expert.

Each row of the batch is one routing group (its tokens compete for the experts' slots), so
routing never depends on how the batch is split between devices. Per group of S tokens an
expert has C = min(S, max(min_capacity, ceil(k * S * capacity_factor / E))) slots; slots go
to every token's first choice, in position order, before any second choice (GShard), and a
choice past its expert's last slot is dropped: a token that loses all its choices comes out
as zeros, so the layer's residual connection carries it on unchanged.

Dispatch and combine are einsums with one-hot tensors [group, token, expert, slot], as in
GShard, rather than a sort and gather: the shapes are static, there is no scatter, and the
dispatched tokens [expert, group, slot, embed] are constrained to be split over the
``expert`` mesh axis while the tokens [group, token, embed] are split over it by group, so
XLA's SPMD partitioner turns the change of layout into an all-to-all (and the combine into
the reverse one). The one-hot einsums cost S * E * C * d_model per group, small beside the
experts' own matmuls at the group sizes of pretraining.

The router runs in float32 whatever the matmul dtype (Switch's "selective precision").
Each MoE layer sows into the ``moe`` collection the load-balancing loss (Switch eq. 4,
E * sum_i f_i * P_i with f_i the fraction of a group's tokens whose first choice is expert i
and P_i the mean router probability of i, averaged over groups), the router z-loss (ST-MoE:
the mean over tokens of logsumexp(logits)^2) and the fraction of token choices dropped;
:func:`router_losses` turns them into the term the model adds to its loss, and metrics.
"""
from __future__ import annotations

import math
from typing import Any, Dict, NamedTuple, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from t2t.nn import mixed_einsum
from t2t.nn.config import TransformerConfig
from t2t.nn.dense import kernel_init
from t2t.nn.dropout import Dropout
from t2t.nn.mlp import get_activation

MOE_COLLECTION = "moe"
_SOWN = ("load_balancing_loss", "router_z_loss", "dropped_fraction")


def check_moe_config(cfg: TransformerConfig) -> None:
    """One-line errors for MoE options that cannot work (called by TransformerConfig)."""
    e, k = cfg.moe_num_experts, cfg.moe_top_k
    if e < 0:
        raise ValueError(f"moe_num_experts must be >= 0 (0 = no experts), got {e}")
    if not 1 <= k <= e:
        raise ValueError(f"moe_top_k={k} must be between 1 and moe_num_experts={e}")
    if cfg.moe_capacity_factor <= 0 or cfg.moe_eval_capacity_factor <= 0:
        raise ValueError("moe_capacity_factor and moe_eval_capacity_factor must be positive, "
                         f"got {cfg.moe_capacity_factor} and {cfg.moe_eval_capacity_factor}")
    if cfg.moe_min_capacity < 1 or cfg.moe_every < 1:
        raise ValueError(f"moe_min_capacity and moe_every must be >= 1, got "
                         f"{cfg.moe_min_capacity} and {cfg.moe_every}")
    if not 0 <= cfg.moe_router_jitter < 1:
        raise ValueError(f"moe_router_jitter must be in [0, 1), got {cfg.moe_router_jitter}")
    if cfg.moe_every != 1 and (cfg.scan_layers or cfg.share_layers):
        what = "scan_layers" if cfg.scan_layers else "share_layers"
        raise ValueError(f"moe_every={cfg.moe_every} needs distinct layers, but {what}=True "
                         "makes them all alike; set moe_every=1 or " f"{what}=False")


def is_moe_layer(cfg: TransformerConfig, index: int) -> bool:
    """Whether layer `index` of a stack has experts (Switch: every other, from the second)."""
    return cfg.moe_num_experts > 0 and index % cfg.moe_every == cfg.moe_every - 1


def expert_capacity(tokens: int, num_experts: int, top_k: int, factor: float,
                    min_capacity: int) -> int:
    """Slots per expert for a group of `tokens` (never more than the group holds)."""
    return min(tokens, max(min_capacity, math.ceil(top_k * tokens * factor / num_experts)))


class Routing(NamedTuple):
    dispatch: jax.Array   # [group, token, expert, slot] 0/1: where each token goes
    combine: jax.Array    # [group, token, expert, slot] its gate there (0 if dropped)
    probs: jax.Array      # [group, token, expert] router softmax, float32
    top1: jax.Array       # [group, token] int32 first choice


def route(logits: jax.Array, top_k: int, capacity: int) -> Routing:
    """Top-k routing of router `logits` [group, token, expert] into `capacity` slots.

    Top-2 gates are renormalised to sum to 1 (GShard); a top-1 gate is the probability
    itself (Switch), so the router gets a gradient through it.
    """
    g, s, e = logits.shape
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)        # [g, s, e]
    gates, experts = jax.lax.top_k(probs, top_k)                       # [g, s, k]
    if top_k > 1:
        gates = gates / jnp.sum(gates, axis=-1, keepdims=True)
    choice = jax.nn.one_hot(experts, e, dtype=jnp.int32)               # [g, s, k, e]
    # Priority: all first choices (in token order), then all second choices.
    by_rank = jnp.swapaxes(choice, 1, 2).reshape(g, top_k * s, e)      # [g, k*s, e]
    position = jnp.cumsum(by_rank, axis=1) - 1
    position = jnp.swapaxes(position.reshape(g, top_k, s, e), 1, 2)   # [g, s, k, e]
    position = jnp.sum(position * choice, axis=-1)                     # [g, s, k]
    slot = jax.nn.one_hot(position, capacity, dtype=jnp.float32)       # past the end: zeros
    choice = choice.astype(jnp.float32)
    dispatch = jnp.einsum("gske,gskc->gsec", choice, slot)
    combine = jnp.einsum("gsk,gske,gskc->gsec", gates, choice, slot)
    return Routing(dispatch, combine, probs, experts[..., 0])


def load_balancing_loss(probs: jax.Array, top1: jax.Array) -> jax.Array:
    """Switch eq. 4 per group, E * sum_i f_i * P_i, averaged over groups (1.0 if uniform)."""
    e = probs.shape[-1]
    f = jnp.mean(jax.nn.one_hot(top1, e, dtype=jnp.float32), axis=1)   # [g, e]
    p = jnp.mean(probs, axis=1)                                        # [g, e]
    return e * jnp.mean(jnp.sum(f * p, axis=-1))


def router_z_loss(logits: jax.Array) -> jax.Array:
    """ST-MoE's z-loss: mean over tokens of logsumexp(logits)^2."""
    return jnp.mean(jnp.square(jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)))


def _expert_init(cfg: TransformerConfig):
    """Per-expert kernels [expert, in, out]: fan-in scaled over `in` only (or normal)."""
    if cfg.kernel_init == "normal":
        return nn.initializers.normal(stddev=cfg.initializer_range)
    return nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal", in_axis=-2,
                                            out_axis=-1, batch_axis=(0,))


class Router(nn.Module):
    """[group, token, embed] -> float32 logits [group, token, expert]."""

    config: TransformerConfig
    deterministic: bool = True

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config
        init = nn.with_logical_partitioning(kernel_init(cfg), ("embed", None))
        kernel = self.param("kernel", init, (x.shape[-1], cfg.moe_num_experts), jnp.float32)
        x = x.astype(jnp.float32)
        eps = cfg.moe_router_jitter
        if eps and not self.deterministic:
            x = x * jax.random.uniform(self.make_rng("dropout"), x.shape, jnp.float32,
                                       1.0 - eps, 1.0 + eps)
        return jnp.einsum("gsm,me->gse", x, kernel, precision=jax.lax.Precision.HIGHEST)


class ExpertDense(nn.Module):
    """Each expert's own dense layer: [expert, group, slot, in] -> [..., features]."""

    config: TransformerConfig
    features: int
    kernel_axes: Tuple[str, str, str]

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config
        kernel = self.param("kernel", nn.with_logical_partitioning(
            _expert_init(cfg), self.kernel_axes),
            (x.shape[0], x.shape[-1], self.features), cfg.params_dtype)
        y = mixed_einsum.einsum("egci,eio->egco", x, kernel, cfg.compute_dtype, laid_out=True)
        if cfg.use_bias:
            bias = self.param("bias", nn.with_logical_partitioning(
                nn.initializers.zeros, (self.kernel_axes[0], self.kernel_axes[2])),
                (x.shape[0], self.features), cfg.params_dtype)
            y = y + bias[:, None, None, :].astype(jnp.float32)
        return y.astype(cfg.compute_dtype)


class MoeBlock(nn.Module):
    """Drop-in for `MlpBlock`: [batch, length, embed] -> same, each row a routing group.

    Every expert is an `MlpBlock` of the config's activations and `moe_d_ff` (default d_ff;
    kernels `wi`/`wi_i`, `wo` with a leading expert dimension), weighted by its gate.
    """

    config: TransformerConfig
    deterministic: bool = True

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config
        groups, tokens, _ = x.shape
        factor = (cfg.moe_eval_capacity_factor if self.deterministic
                  else cfg.moe_capacity_factor)
        capacity = expert_capacity(tokens, cfg.moe_num_experts, cfg.moe_top_k, factor,
                                   cfg.moe_min_capacity)
        logits = Router(cfg, self.deterministic, name="router")(x)        # [g, s, e]
        r = route(logits, cfg.moe_top_k, capacity)
        self.sow(MOE_COLLECTION, "load_balancing_loss", load_balancing_loss(r.probs, r.top1))
        self.sow(MOE_COLLECTION, "router_z_loss", router_z_loss(logits))
        self.sow(MOE_COLLECTION, "dropped_fraction",
                 1.0 - jnp.sum(r.dispatch) / (groups * tokens * cfg.moe_top_k))

        dt = cfg.compute_dtype
        dispatched_axes = ("expert", "expert_group", "length", "embed")
        h = mixed_einsum.einsum("gsec,gsm->egcm", r.dispatch, x, dt,
                                laid_out=True).astype(dt)              # all-to-all
        h = nn.with_logical_constraint(h, dispatched_axes)            # [e, g, c, embed]
        acts = cfg.mlp_activations
        hidden = None
        for i, act in enumerate(acts):
            name = "wi" if len(acts) == 1 else f"wi_{i}"
            y = get_activation(act)(ExpertDense(cfg, cfg.moe_d_ff or cfg.d_ff,
                                                ("expert", "embed", "mlp"),
                                                name=name)(h))
            hidden = y if hidden is None else hidden * y
        hidden = nn.with_logical_constraint(hidden, ("expert", "expert_group", "length", "mlp"))
        hidden = Dropout(cfg.mlp_dropout_rate)(hidden, deterministic=self.deterministic)
        out = ExpertDense(cfg, x.shape[-1], ("expert", "mlp", "embed"), name="wo")(hidden)
        out = nn.with_logical_constraint(out, dispatched_axes)        # [e, g, c, embed]
        y = mixed_einsum.einsum("gsec,egcm->gsm", r.combine, out, dt,
                                laid_out=True).astype(dt)              # all-to-all back
        return nn.with_logical_constraint(y, ("batch", "length", "embed"))


def router_losses(cfg: TransformerConfig, sown: Any) -> Tuple[jax.Array, Dict[str, jax.Array]]:
    """(the term to add to the loss, metrics) from a model's ``moe`` collection.

    The loss sums every MoE layer's weighted load-balancing and z-losses; the metrics
    (`moe_load_balancing_loss`, `moe_router_z_loss`, `moe_dropped_fraction`) are their
    means over the layers.
    """
    values: Dict[str, list] = {name: [] for name in _SOWN}
    for path, leaf in jax.tree_util.tree_flatten_with_path(sown)[0]:
        name = next(k.key for k in reversed(path) if isinstance(k, jax.tree_util.DictKey))
        values[name].append(jnp.ravel(leaf))            # [1], or [layers] under nn.scan
    if not values["load_balancing_loss"]:
        return jnp.zeros((), jnp.float32), {}
    per_layer = {name: jnp.concatenate(v) for name, v in values.items()}
    loss = (cfg.moe_load_balancing_weight * jnp.sum(per_layer["load_balancing_loss"])
            + cfg.moe_router_z_loss_weight * jnp.sum(per_layer["router_z_loss"]))
    return loss, {f"moe_{name}": jnp.mean(v) for name, v in per_layer.items()}
