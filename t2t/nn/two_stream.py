"""XLNet's two-stream self-attention (Yang et al. 2019, §2.3, eq. 4 and Fig. 1).

Each layer keeps two representations of every position: the content stream h (what
Transformer-XL computes: it may see its own token) and the query stream g (it knows the
position it predicts but must not see that token). For a factorization order z, with
rank(j) the step at which position j comes in z:

    h_i attends every j with rank(j) <= rank(i)      (content stream, eq. 4 bottom)
    g_i attends every j with rank(j) <  rank(i)      (query stream,   eq. 4 top)

plus all of the memory (cached states of the previous segment, Transformer-XL §3.2). Both
streams share the layer's parameters; only g's initial value differs (a learned `mask_emb`).
Masks here are boolean "visible" arrays [batch, q_len, k_len] (True = may attend), keys
ordered memory first; Hugging Face's `perm_mask` is the opposite sense (1 = blocked).
"""
from __future__ import annotations

from typing import Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from t2t.nn.config import TransformerConfig
from t2t.nn.dropout import Dropout
from t2t.nn.mlp import MlpBlock
from t2t.nn.norms import make_norm
from t2t.nn.relative_xl import RelativeAttention


def ranks_of(order: jax.Array) -> jax.Array:
    """A factorization order (positions in the order they are predicted) -> each position's
    rank (its step in the order).  [..., L] -> [..., L]."""
    return jnp.argsort(order, axis=-1)


def permutation_visibility(ranks: jax.Array) -> Tuple[jax.Array, jax.Array]:
    """(content, query) visibility among the current positions from their ranks.
    [b, L] -> two bool [b, L, L] (query i, key j): rank(j) <= rank(i) and rank(j) < rank(i)."""
    q, k = ranks[..., :, None], ranks[..., None, :]
    return k <= q, k < q


def perm_mask_from_ranks(ranks: jax.Array) -> jax.Array:
    """Hugging Face's `perm_mask` for an order: 1.0 where i may not attend j (rank(j) >=
    rank(i)).  [b, L] -> float32 [b, L, L]."""
    return (~permutation_visibility(ranks)[1]).astype(jnp.float32)


def stream_visibility(q_len: int, mem_len: int, perm_mask: Optional[jax.Array] = None,
                      attention_mask: Optional[jax.Array] = None, attn_type: str = "bi",
                      same_length: bool = False
                      ) -> Tuple[Optional[jax.Array], Optional[jax.Array]]:
    """(content, query) visibility [b|1, q_len, mem_len + q_len], or (None, None) when every
    key is visible to both streams.

    perm_mask [b, q, q] (1 = blocked, HF's sense), attention_mask [b, q] (1 = real token;
    padding keys are hidden), attn_type "uni" adds Transformer-XL's causal mask (with
    `same_length`, every query sees the same number of keys). The memory is visible to all.
    The content stream additionally always sees its own position.
    """
    k_len = mem_len + q_len
    i = jnp.arange(q_len)[:, None]
    j = jnp.arange(k_len)[None, :]
    blocked = None
    if attn_type == "uni":
        blocked = j > i + mem_len                                       # [q, k]
        if same_length:
            blocked = blocked | ((j < i) & (j < q_len))
        blocked = blocked[None]
    data = None
    if attention_mask is not None:
        data = (jnp.asarray(attention_mask) == 0)[:, None, :]           # [b, 1, q]
    if perm_mask is not None:
        perm = jnp.asarray(perm_mask) > 0                               # [b, q, q]
        data = perm if data is None else data | perm
    if data is not None:
        memory = jnp.zeros(data.shape[:2] + (mem_len,), bool)
        data = jnp.concatenate([memory, data], axis=-1)                 # [b, q|1, k]
        blocked = data if blocked is None else blocked | data
    if blocked is None:
        return None, None
    query = ~blocked
    content = query | (j == i + mem_len)[None]
    return content, query


class TwoStreamLayer(nn.Module):
    """One XLNet layer: relative attention then the feed-forward block, both post-LN, run
    on the content stream h [b, q, d] and (when given) the query stream g [b, q|p, d]."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, h: jax.Array, g: Optional[jax.Array], rel: jax.Array,
                 content_visible: Optional[jax.Array], query_visible: Optional[jax.Array],
                 different_segment: Optional[jax.Array], memory: Optional[jax.Array] = None,
                 target_mapping: Optional[jax.Array] = None, *, deterministic: bool = True
                 ) -> Tuple[jax.Array, Optional[jax.Array]]:
        cfg = self.config
        attention = RelativeAttention(cfg, name="attention")
        context = h if memory is None else jnp.concatenate([memory.astype(h.dtype), h], 1)
        keys = attention.keys(context, rel)                           # shared by both streams

        def attend(x, visible, mapping=None):
            out = attention.attend(x, keys, visible, different_segment, mapping,
                                   deterministic=deterministic)
            return attention.output(x, out, deterministic=deterministic)

        mlp = MlpBlock(cfg, deterministic, name="mlp")
        norm = make_norm(cfg, "mlp_norm")
        dropout = Dropout(cfg.dropout_rate)

        def feed_forward(x):
            return norm(x + dropout(mlp(x), deterministic=deterministic))

        h = attend(h, content_visible)
        if g is not None:
            g = feed_forward(attend(g, query_visible, target_mapping))
        h = nn.with_logical_constraint(feed_forward(h), ("batch", "length", "embed"))
        return h, g
