"""Synthetic attention logits (Tay et al. 2020, "Synthesizer: Rethinking Self-Attention").

Self-attention's weights come from the query token alone or from learned tables instead of
query-key dot products; `config.synthesizer` picks the variant (Narang et al. 2021, Table 1):

* ``dense`` (sec. 3.1, eq. 1-2): B_i = F(X_i) = W2 ReLU(W1 X_i + b1) + b2 per head, one
  logit per key slot j < ℓ (W1 [embed, heads, kv], W2 [heads, kv, ℓ]); Y = softmax(B) G(X)
  with G the value projection.
* ``random`` (sec. 3.2): B = R, a learned [heads, ℓ, ℓ] table independent of the input.
* ``factorized`` (sec. 3.2, "Factorized Random Synthesizer"): R = R1 R2ᵀ with R1, R2
  [heads, ℓ, k] (k = `synthesizer_rank`). Narang et al. report it at the random
  synthesizer's cost (10.1T ops, fewer parameters than the vanilla model), i.e. this
  input-independent factorisation.
* ``*_plus`` (sec. 3.3, mixture of synthesizers with unit weights): softmax(B + QKᵀ/√d + P)
  with P the relative position bias of the dot-product attention.
* ``*_plus_alpha``: softmax(α B + (1 − α)(QKᵀ/√d + P)), one learned α = sigmoid(a) per layer
  (a = 0 at init: α = 1/2), Tay et al. eq. 6 with α1 + α2 = 1 ("a scalar α ... to
  interpolate", Narang et al. sec. 2.7).

Plain variants have no query/key projections and no position bias (B is itself a function
of the slots). Logits for query slot i and key slot j are B[i, j] (random) or F(X_i)[j]
(dense), so causal and padding masks apply as to dot-product logits, and decoding reads
row `decode_index + t` of the table against the cache's slots. ℓ = `synthesizer_length`
(or `max_length`) bounds both lengths.
"""
from __future__ import annotations

from typing import Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from t2t.errors import ConfigError, UserError
from t2t.nn import mixed_einsum
from t2t.nn.config import TransformerConfig
from t2t.nn.dense import Dense, kernel_init


def check_synthesizer_config(cfg: TransformerConfig) -> None:
    """One-line errors for synthesizer options that cannot work (called by TransformerConfig)."""
    if synthesizer_length(cfg) < 1 or cfg.synthesizer_rank < 1:
        raise ConfigError(f"synthesizer_length and synthesizer_rank must be positive, got "
                          f"{synthesizer_length(cfg)} and {cfg.synthesizer_rank}")
    if cfg.prefix_length:
        raise ConfigError("synthesizer has no logits for prefix-tuning slots; "
                          "set prefix_length=0")


def synthesizer_length(cfg: TransformerConfig) -> int:
    return cfg.synthesizer_length or cfg.max_length


def uses_dot_product(cfg: TransformerConfig) -> bool:
    """The plus variants keep query/key projections; the plain ones have none."""
    return "_plus" in cfg.synthesizer


class SyntheticLogits(nn.Module):
    """x [batch, q_len, embed] -> logits [batch, heads, q_len, k_len] for query slots
    `q_start .. q_start + q_len - 1` against key slots `0 .. k_len - 1`."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, x: jax.Array, k_len: int, q_start=0) -> jax.Array:
        cfg = self.config
        length, kind = synthesizer_length(cfg), cfg.synthesizer.split("_")[0]
        q_len = x.shape[1]
        if max(q_len, k_len) > length:
            raise UserError(f"synthesizer attention over {max(q_len, k_len)} positions, but "
                            f"synthesizer_length is {length}; raise it")
        dtype, pdtype = cfg.compute_dtype, cfg.params_dtype
        if kind == "dense":
            hidden = Dense((cfg.num_heads, cfg.head_dim), ("embed", "heads", "kv"), use_bias=True,
                           dtype=dtype, param_dtype=pdtype,
                           kernel_init=kernel_init(cfg, in_axis=0, out_axis=(1, 2)),
                           name="dense_1")(x)                          # [b, q, h, kv]
            w2 = self.param("dense_2", nn.with_logical_partitioning(
                _per_head_init(cfg), ("heads", "kv", None)),
                (cfg.num_heads, cfg.head_dim, length), pdtype)        # each head's own W2
            b2 = self.param("dense_2_bias", nn.with_logical_partitioning(
                nn.initializers.zeros, ("heads", None)), (cfg.num_heads, length), pdtype)
            logits = mixed_einsum.einsum("bqhd,hdl->bhql", jax.nn.relu(hidden),
                                         w2[:, :, :k_len], dtype, laid_out=True)  # [b,h,q,k]
            return (logits + b2[:, None, :k_len].astype(jnp.float32)).astype(dtype)
        table = self._table(kind, length)                          # [h, ℓ, ℓ] rows, cols
        rows = jax.lax.dynamic_slice_in_dim(table[0], q_start, q_len, axis=1)   # [h, q, ·]
        if kind == "random":
            out = rows[:, :, :k_len]
        else:                                                       # factorized: R1 R2ᵀ
            out = jnp.einsum("hqr,hkr->hqk", rows, table[1][:, :k_len])
        return jnp.broadcast_to(out[None], (x.shape[0],) + out.shape).astype(dtype)

    def _table(self, kind: str, length: int) -> Tuple[jax.Array, Optional[jax.Array]]:
        """random: (R [h, ℓ, ℓ], None); factorized: (R1, R2), each [h, ℓ, k]. N(0, 1) init
        (factorized: N(0, 1/√k) so R1 R2ᵀ is N(0, 1)-scaled too)."""
        cfg = self.config
        axes = ("heads", None, None)
        if kind == "random":
            init = nn.with_logical_partitioning(nn.initializers.normal(1.0), axes)
            r = self.param("random", init, (cfg.num_heads, length, length), cfg.params_dtype)
            return r, None
        k = cfg.synthesizer_rank
        init = nn.with_logical_partitioning(nn.initializers.normal(k ** -0.25), axes)
        return tuple(self.param(name, init, (cfg.num_heads, length, k), cfg.params_dtype)
                     for name in ("random_1", "random_2"))


def _per_head_init(cfg: TransformerConfig):
    """W2 [heads, kv, ℓ]: the config's kernel init with fan-in kv (heads are a batch axis)."""
    if cfg.kernel_init == "normal":
        return nn.initializers.normal(stddev=cfg.initializer_range)
    return nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal", in_axis=1,
                                            out_axis=2, batch_axis=(0,))


def mix_logits(module: nn.Module, synthetic: jax.Array, q: Optional[jax.Array],
               bias: Optional[jax.Array]) -> Tuple[Optional[jax.Array], jax.Array]:
    """(query to use, bias to use) so that dot_product_attention's softmax(q·kᵀ·scale + bias)
    is the variant's mix: plus: (q, B + P); plus_alpha: (q (1−α), αB + (1−α)P). `module` is
    the calling attention (its `alpha` parameter lives there)."""
    cfg = module.config
    if not cfg.synthesizer.endswith("alpha"):
        return q, synthetic if bias is None else synthetic + bias.astype(synthetic.dtype)
    a = module.param("synthesizer_alpha", nn.with_logical_partitioning(
        nn.initializers.zeros, ()), (), cfg.params_dtype)
    alpha = jax.nn.sigmoid(a.astype(jnp.float32))
    mixed = alpha * synthetic.astype(jnp.float32)
    if bias is not None:
        mixed = mixed + (1.0 - alpha) * bias.astype(jnp.float32)
    return q * (1.0 - alpha).astype(q.dtype), mixed
