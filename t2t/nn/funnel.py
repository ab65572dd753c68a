"""Funnel-Transformer encoder (Dai et al. 2020, "Funnel-Transformer: Filtering out Sequential
Redundancy for Efficient Language Processing", sec. 2.2).

The encoder's layers form blocks (`config.funnel_blocks`, layers per block). Between two
blocks the sequence is mean-pooled with stride 2 (window 2): the first layer of the next
block attends from the pooled queries to the unpooled keys and values ("pool-query-only",
sec. 2.2), its residual stream is the pooled one, and the rest of the block runs on the
pooled sequence. The encoder's output is the last block's [batch, ceil(L / 2^(B-1)), d]; the
decoder cross-attends to it (`pool_segments_to` shortens the encoder's segment ids to
match). An odd length pools its last position alone.

Packing and padding: a pooled position belongs to the segment of the first real token of
its pair, and averages only the tokens of that segment (so two packed examples never mix);
a pair of padding tokens stays padding (segment 0). Relative positions of pooled tokens
are their first token's original positions (0, 2, 4, ... after one pooling).
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from t2t.errors import ConfigError
from t2t.nn.attention import segment_mask
from t2t.nn.config import TransformerConfig
from t2t.nn.moe import is_moe_layer
from t2t.nn.position import RelativePositionBias


def check_funnel_config(cfg: TransformerConfig) -> None:
    """One-line errors for funnel options that cannot work (TransformerConfig)."""
    blocks = tuple(cfg.funnel_blocks)
    if any(b < 1 for b in blocks) or sum(blocks) != cfg.num_encoder_layers:
        raise ConfigError(f"funnel_blocks={blocks} must be positive layer counts summing to "
                          f"num_encoder_layers={cfg.num_encoder_layers}")
    if cfg.scan_layers or cfg.share_layers or cfg.share_encoder_decoder or cfg.encoder_causal:
        raise ConfigError("funnel_blocks needs scan_layers, share_layers, "
                          "share_encoder_decoder and encoder_causal all False")
    if cfg.position_embedding == "rotary":
        raise ConfigError("funnel_blocks does not support rotary positions (pooled queries "
                          "and unpooled keys sit at different positions); use 'relative'")


def pool_segments(segment_ids: jax.Array) -> jax.Array:
    """[batch, L] -> [batch, ceil(L / 2)]: the segment of each pair's first real token."""
    if segment_ids.shape[1] % 2:
        segment_ids = jnp.pad(segment_ids, ((0, 0), (0, 1)))
    a, b = segment_ids[:, 0::2], segment_ids[:, 1::2]
    return jnp.where(a > 0, a, b)


def pool_sequence(x: jax.Array, segment_ids: Optional[jax.Array]
                  ) -> Tuple[jax.Array, Optional[jax.Array]]:
    """Stride-2 mean pooling: x [b, L, d] -> [b, ceil(L/2), d] (and the pooled segment ids).

    Without segment ids each pair is averaged; with them, only the pair's tokens of the
    pooled segment are (a padding pair pools to 0).
    """
    if x.shape[1] % 2:
        x = jnp.pad(x, ((0, 0), (0, 1), (0, 0)), mode="edge")
    pairs = x.reshape(x.shape[0], x.shape[1] // 2, 2, x.shape[2]).astype(jnp.float32)
    if segment_ids is None:
        return jnp.mean(pairs, axis=2).astype(x.dtype), None
    pooled_seg = pool_segments(segment_ids)                            # [b, L/2]
    seg = segment_ids if segment_ids.shape[1] % 2 == 0 else jnp.pad(segment_ids,
                                                                      ((0, 0), (0, 1)))
    seg = seg.reshape(seg.shape[0], -1, 2)                            # [b, L/2, 2]
    w = ((seg == pooled_seg[..., None]) & (seg > 0)).astype(jnp.float32)[..., None]
    mean = jnp.sum(pairs * w, axis=2) / jnp.maximum(jnp.sum(w, axis=2), 1.0)
    return mean.astype(x.dtype), pooled_seg


def pool_segments_to(segment_ids: Optional[jax.Array], length: int) -> Optional[jax.Array]:
    """Pool encoder segment ids [b, L] until they match a funnel's output length."""
    if segment_ids is None:
        return None
    while segment_ids.shape[1] > length:
        segment_ids = pool_segments(segment_ids)
    return segment_ids


class FunnelStack(nn.Module):
    """The funnel encoder's layers: x [b, L, d] -> [b, ceil(L / 2^(B-1)), d].

    `layer_class` is the stack's TransformerLayer (remat-wrapped or not); layers are named
    `layer_{i}` by their index in the whole encoder, like `LayerStack`'s.
    """

    config: TransformerConfig
    layer_class: Any

    @nn.compact
    def __call__(self, x: jax.Array, segment_ids: Optional[jax.Array] = None, *,
                 deterministic: bool = True) -> jax.Array:
        cfg = self.config
        relpos = (RelativePositionBias(cfg, bidirectional=True, name="relpos")
                  if cfg.position_embedding == "relative" else None)
        stride, index = 1, 0
        for b, depth in enumerate(cfg.funnel_blocks):
            for j in range(depth):
                kv, kv_seg, kv_stride = None, segment_ids, stride
                if b > 0 and j == 0:                           # pool-query-only layer
                    kv, kv_stride = x, stride // 2
                    x, segment_ids = pool_sequence(x, segment_ids)
                q_idx = jnp.arange(x.shape[1]) * stride
                k_len = x.shape[1] if kv is None else kv.shape[1]
                k_idx = jnp.arange(k_len) * kv_stride
                mask = None if segment_ids is None else segment_mask(segment_ids, kv_seg)
                bias = None if relpos is None else relpos(q_idx, k_idx)
                layer = self.layer_class(cfg, deterministic, moe=is_moe_layer(cfg, index),
                                         name=f"layer_{index}")
                x = layer(x, None, mask, bias, self_kv=kv)
                index += 1
            stride *= 2
        return x
