"""Product-key memory layer (Lample et al. 2019, "Large Memory Layers with Product Keys").

In place of the feed-forward layer of the decoder layers `config.pkm_layers` (sec. 3;
Narang et al. 2021, appendix B: one memory, before the decoder's last layer): per head, a
query q(x) [d_k] is split into halves q1, q2 scored against two sets of n sub-keys; the
keys of the memory are the n² pairs
(i, j) with score q1·K1_i + q2·K2_j. The top k of each half's scores contain the top k of
the Cartesian product, so the top k over the k² candidate pairs are the exact top k over
all n² keys (sec. 3.2, "Product keys"); their scores, softmax-normalised, weigh the memory
values V [n², d_model]; heads share the values and their outputs are summed (sec. 3.2,
"Multi-head memory attention").

The query network is a linear map followed by LayerNorm on each head's query; the paper
uses batch normalization there (sec. 3.3, "Query batch normalization"). t2t uses LayerNorm
so the layer needs no mutable batch statistics (same role: keeps the query's scale, and
so the key usage, balanced).
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from t2t.errors import ConfigError
from t2t.nn.config import TransformerConfig
from t2t.nn.dense import Dense, kernel_init
from t2t.nn.norms import normalize


def check_pkm_config(cfg: TransformerConfig) -> None:
    """One-line errors for memory options that cannot work (TransformerConfig)."""
    if cfg.pkm_key_dim % 2 or cfg.pkm_key_dim <= 0:
        raise ConfigError(f"pkm_key_dim must be even and positive, got {cfg.pkm_key_dim}")
    if not 1 <= cfg.pkm_topk <= cfg.pkm_num_keys:
        raise ConfigError(f"pkm_topk={cfg.pkm_topk} must be between 1 and "
                          f"pkm_num_keys={cfg.pkm_num_keys}")
    if cfg.pkm_heads < 1:
        raise ConfigError(f"pkm_heads must be >= 1, got {cfg.pkm_heads}")
    if any(not 0 <= i < cfg.num_decoder_layers for i in cfg.pkm_layers):
        raise ConfigError(f"pkm_layers={tuple(cfg.pkm_layers)} must be decoder layer indices "
                          f"in [0, num_decoder_layers={cfg.num_decoder_layers})")
    if cfg.scan_layers or cfg.share_layers:
        raise ConfigError("pkm_layers needs distinct layers: set scan_layers=False and "
                          "share_layers=False")


def is_pkm_layer(cfg: TransformerConfig, index: int, stack: str) -> bool:
    """Whether layer `index` of `stack` has a memory instead of its feed-forward (decoder
    layers only: Lample et al.'s language models, Narang et al.'s decoder)."""
    return stack == "decoder" and index in cfg.pkm_layers


def product_key_lookup(q1, q2, keys1, keys2, topk: int):
    """Exact top-k over the n² product keys. q1/q2 [..., h, d_k/2], keys [h, n, d_k/2]
    -> (scores [..., h, k] float32, memory slots [..., h, k] int32, slot = i * n + j)."""
    n = keys1.shape[1]
    s1 = jnp.einsum("...hd,hnd->...hn", q1, keys1, preferred_element_type=jnp.float32)
    s2 = jnp.einsum("...hd,hnd->...hn", q2, keys2, preferred_element_type=jnp.float32)
    v1, i1 = jax.lax.top_k(s1, topk)                                    # [..., h, k]
    v2, i2 = jax.lax.top_k(s2, topk)
    pair_scores = v1[..., :, None] + v2[..., None, :]                   # [..., h, k, k]
    pair_slots = i1[..., :, None] * n + i2[..., None, :]
    flat = pair_scores.shape[:-2] + (topk * topk,)
    scores, best = jax.lax.top_k(pair_scores.reshape(flat), topk)       # [..., h, k]
    slots = jnp.take_along_axis(pair_slots.reshape(flat), best, axis=-1)
    return scores, slots.astype(jnp.int32)


class ProductKeyMemory(nn.Module):
    """[batch, length, d_model] -> [batch, length, d_model].

    Parameters: `query` [d_model, heads, d_k] (+ `query_norm_scale`/`_bias` [d_k]),
    `sub_keys_1`/`sub_keys_2` [heads, n, d_k/2], `values` [n², d_model].
    """

    config: TransformerConfig
    deterministic: bool = True

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config
        h, n, dk = cfg.pkm_heads, cfg.pkm_num_keys, cfg.pkm_key_dim
        q = Dense((h, dk), ("embed", "heads", None), use_bias=cfg.use_bias,
                  dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype,
                  kernel_init=kernel_init(cfg, in_axis=0, out_axis=(1, 2)), name="query")(x)
        param = lambda name, init, shape, axes: self.param(  # noqa: E731
            name, nn.with_logical_partitioning(init, axes), shape, cfg.params_dtype)
        scale = param("query_norm_scale", nn.initializers.ones, (dk,), (None,))
        bias = param("query_norm_bias", nn.initializers.zeros, (dk,), (None,))
        q = normalize(q, scale, bias, cfg.norm_eps)                     # [b, l, h, d_k] f32
        key_init = nn.initializers.normal(stddev=(dk // 2) ** -0.5)
        keys1 = param("sub_keys_1", key_init, (h, n, dk // 2), ("heads", None, None))
        keys2 = param("sub_keys_2", key_init, (h, n, dk // 2), ("heads", None, None))
        scores, slots = product_key_lookup(q[..., :dk // 2], q[..., dk // 2:],
                                           keys1.astype(jnp.float32),
                                           keys2.astype(jnp.float32), cfg.pkm_topk)
        weights = jax.nn.softmax(scores, axis=-1)                       # [b, l, h, k]
        values = param("values", nn.initializers.normal(stddev=cfg.d_model ** -0.5),
                       (n * n, cfg.d_model), (None, "embed"))
        rows = jnp.take(values, slots, axis=0).astype(cfg.compute_dtype)  # [b, l, h, k, d]
        out = jnp.einsum("blhk,blhkd->bld", weights.astype(cfg.compute_dtype), rows,
                         preferred_element_type=jnp.float32)
        return out.astype(cfg.compute_dtype)
