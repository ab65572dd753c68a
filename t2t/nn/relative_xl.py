"""Transformer-XL relative positional attention (Dai et al. 2019, §3.3), as XLNet uses it
(Yang et al. 2019, §2.4 and App. A.2), with XLNet's relative segment encodings (§2.5).

The score of query i and key j (key index j counts the memory first, so query i sits at
absolute position mlen + i) is Dai et al.'s eq. (a)+(b)+(c)+(d) regrouped as

    score(i, j) = (q_i + u)·k_j + (q_i + v)·W_r R_{mlen+i-j} + (q_i + b)·s_ij

u = `r_w_bias` (content), v = `r_r_bias` (position), b = `r_s_bias` (segment); R_d is the
sinusoidal encoding of the distance d (`relative_encoding`) and s_ij = `seg_embed`[0] when
i and j lie in the same segment, [1] otherwise (XLNet §2.5: only *whether* two positions
share a segment is encoded, never which segment). Scores are scaled by 1/sqrt(head_dim).
"""
from __future__ import annotations

from typing import Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from t2t.nn.attention import BIG_NEG
from t2t.nn.config import TransformerConfig
from t2t.nn.dense import Dense, kernel_init
from t2t.nn.dropout import Dropout
from t2t.nn.norms import make_norm

ATTENTION_TYPES = ("bi", "uni")


def relative_distances(q_len: int, k_len: int, attn_type: str = "bi",
                       clamp_len: int = -1) -> jax.Array:
    """The distances the encoding table holds, largest first: k_len, k_len - 1, ... down to
    1 - q_len ("bi": keys may follow the query) or to 0 ("uni").  -> [R] float32.

    `clamp_len` > 0 clips them to [-clamp_len, clamp_len] (Transformer-XL's clamp).
    """
    if attn_type not in ATTENTION_TYPES:
        raise ValueError(f"attn_type={attn_type!r}; choose one of {list(ATTENTION_TYPES)}")
    end = -q_len if attn_type == "bi" else -1
    d = jnp.arange(k_len, end, -1, dtype=jnp.float32)
    if clamp_len > 0:
        d = jnp.clip(d, -clamp_len, clamp_len)
    return d


def relative_encoding(distances: jax.Array, d_model: int) -> jax.Array:
    """Sinusoids of the distances, all sines then all cosines (Transformer-XL's layout,
    Vaswani et al.'s frequencies 1/10000^(2k/d)).  [R] -> [R, d_model]."""
    inv_freq = 1.0 / (10000.0 ** (jnp.arange(0, d_model, 2, dtype=jnp.float32) / d_model))
    angles = distances[:, None] * inv_freq[None, :]                    # [R, d/2]
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


def shift_to_keys(scores: jax.Array, k_len: int) -> jax.Array:
    """Position scores per table row -> per key.  [b, n, q, R] -> [b, n, q, k_len].

    Row r of the table holds distance k_len - r (`relative_distances`); key j seen from
    query i (absolute position mlen + i = i + k_len - q_len) is at distance mlen + i - j,
    i.e. row q_len - i + j: out[i, j] = scores[i, q_len - i + j]. Flattened, that is element
    i·R + q_len - i + j = q_len + i·(R - 1) + j, so dropping the first q_len elements and
    reading rows of R - 1 lines every query up with its keys (slices, no gather). Where the
    row would pass the table (future keys in "uni" mode, hidden by the causal mask) the
    value is another row's and unused.
    """
    *lead, q_len, rows = scores.shape
    flat = scores.reshape(*lead, q_len * rows)[..., q_len:]
    return flat.reshape(*lead, q_len, rows - 1)[..., :k_len]


class RelativeAttention(nn.Module):
    """One layer's relative multi-head attention and its post-LN residual block.

    Params: `query`, `key`, `value`, `relative` kernels [embed, heads, kv] (no biases),
    `out` [heads, kv, embed]; `r_w_bias`, `r_r_bias`, `r_s_bias` [heads, kv];
    `seg_embed` [2, heads, kv]; `norm` (LayerNorm). XLNet's two streams share all of them:
    `keys` once per layer, then `attend` + `output` per stream.
    """

    config: TransformerConfig

    def setup(self):
        cfg = self.config
        head = (cfg.num_heads, cfg.head_dim)
        init = kernel_init(cfg, in_axis=0, out_axis=(1, 2), distribution="normal")

        def proj(name):
            return Dense(head, ("embed", "heads", "kv"), dtype=cfg.compute_dtype,
                         param_dtype=cfg.params_dtype, kernel_init=init, name=name)

        self.query, self.key, self.value, self.relative = (
            proj(n) for n in ("query", "key", "value", "relative"))
        self.out = Dense(cfg.d_model, ("heads", "kv", "embed"), contract=2,
                         dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype,
                         kernel_init=kernel_init(cfg, in_axis=(0, 1), out_axis=2,
                                                 distribution="normal"), name="out")
        bias_init = nn.with_logical_partitioning(nn.initializers.normal(cfg.initializer_range),
                                                 ("heads", "kv"))
        self.r_w_bias, self.r_r_bias, self.r_s_bias = (
            self.param(n, bias_init, head, cfg.params_dtype)
            for n in ("r_w_bias", "r_r_bias", "r_s_bias"))
        self.seg_embed = self.param(
            "seg_embed", nn.with_logical_partitioning(
                nn.initializers.normal(cfg.initializer_range), (None, "heads", "kv")),
            (2,) + head, cfg.params_dtype)
        self.norm = make_norm(cfg, "norm")
        self.dropout = Dropout(cfg.dropout_rate)
        self.attention_dropout = Dropout(cfg.attn_dropout_rate)

    def keys(self, context: jax.Array, rel: jax.Array
             ) -> Tuple[jax.Array, jax.Array, jax.Array]:
        """context [b, k, d] (memory then current states), rel [R, d] encodings ->
        content keys and values [b, k, h, kv], position keys [R, h, kv]."""
        return self.key(context), self.value(context), self.relative(rel)

    def attend(self, x: jax.Array, keys: Tuple[jax.Array, jax.Array, jax.Array],
               visible: Optional[jax.Array], different_segment: Optional[jax.Array],
               target_mapping: Optional[jax.Array] = None, *,
               deterministic: bool = True) -> jax.Array:
        """Queries from x [b, q, d] over `keys` -> attention output [b, q, h, kv].

        visible: bool [b|1, q, k], True where query i may attend key j (None = all).
        different_segment: bool [b, q, k] (None: no segment term, as HF without
        token_type_ids). target_mapping [b, p, q] (XLNet's query stream, x [b, p, d]):
        prediction m's query stands at the positions row m marks, and its output is read
        back from them.
        """
        cfg = self.config
        k_h, v_h, k_r = keys
        q = self.query(x)                                              # [b, q|p, h, kv]
        if target_mapping is not None:
            q = jnp.einsum("bphk,bpl->blhk", q, target_mapping.astype(q.dtype))
        f32 = jnp.float32
        content = jnp.einsum("bqhk,bjhk->bhqj", q + self.r_w_bias.astype(q.dtype), k_h,
                             preferred_element_type=f32)
        position = jnp.einsum("bqhk,rhk->bhqr", q + self.r_r_bias.astype(q.dtype), k_r,
                              preferred_element_type=f32)
        scores = content + shift_to_keys(position, k_h.shape[1])
        if different_segment is not None:
            seg = jnp.einsum("bqhk,shk->bhqs", q + self.r_s_bias.astype(q.dtype),
                             self.seg_embed.astype(q.dtype), preferred_element_type=f32)
            scores = scores + jnp.where(different_segment[:, None], seg[..., 1:2],
                                        seg[..., 0:1])
        scores = scores * (cfg.head_dim ** -0.5)
        if visible is not None:
            scores = jnp.where(visible[:, None], scores, BIG_NEG)
        weights = jax.nn.softmax(scores, axis=-1).astype(cfg.compute_dtype)   # [b, h, q, k]
        weights = self.attention_dropout(weights, deterministic=deterministic)
        out = jnp.einsum("bhqj,bjhk->bqhk", weights, v_h,
                         preferred_element_type=f32).astype(cfg.compute_dtype)
        if target_mapping is not None:
            out = jnp.einsum("blhk,bpl->bphk", out, target_mapping.astype(out.dtype))
        return out

    def output(self, residual: jax.Array, attended: jax.Array, *,
               deterministic: bool = True) -> jax.Array:
        """LayerNorm(residual + dropout(out(attended))).  -> [b, q, d]."""
        y = self.dropout(self.out(attended), deterministic=deterministic)
        return self.norm(residual + y)
