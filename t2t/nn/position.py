"""Position information: learned/sinusoidal tables, T5 relative bias, rotary (RoPE)."""
from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from t2t.nn.config import TransformerConfig


def sinusoidal(positions: jax.Array, features: int, base: float = 10000.0) -> jax.Array:
    """Vaswani et al. PE: sin on even, cos on odd features.  [...] -> [..., features]."""
    half = features // 2
    inv_freq = base ** (-jnp.arange(half, dtype=jnp.float32) * 2.0 / features)
    angles = positions.astype(jnp.float32)[..., None] * inv_freq       # [..., half]
    pe = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)        # [..., half, 2]
    pe = pe.reshape(positions.shape + (2 * half,))
    if features % 2:
        pe = jnp.pad(pe, [(0, 0)] * positions.ndim + [(0, 1)])
    return pe


def relative_position_bucket(relative_position: jax.Array, bidirectional: bool,
                             num_buckets: int = 32, max_distance: int = 128) -> jax.Array:
    """T5's bucketing of (key - query) distances: exact below num_buckets/2, log above."""
    buckets = jnp.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).astype(jnp.int32) * num_buckets
        distance = jnp.abs(relative_position)
    else:
        distance = -jnp.minimum(relative_position, 0)
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    scaled = (jnp.log(jnp.maximum(distance, 1).astype(jnp.float32) / max_exact)
              / math.log(max_distance / max_exact) * (num_buckets - max_exact))
    large = jnp.minimum(max_exact + scaled.astype(jnp.int32), num_buckets - 1)
    return buckets + jnp.where(is_small, distance, large)


class RelativePositionBias(nn.Module):
    """One table [heads, buckets] per stack, shared by its layers (T5)."""

    config: TransformerConfig
    bidirectional: bool

    @nn.compact
    def __call__(self, q_positions: jax.Array, k_positions: jax.Array) -> jax.Array:
        """[q_len], [k_len] (or with a leading batch dim) -> bias [1|batch, heads, q, k]."""
        cfg = self.config
        table = self.param(
            "rel_embedding",
            nn.with_logical_partitioning(
                nn.initializers.variance_scaling(1.0, "fan_avg", "uniform"),
                ("heads", "relpos_buckets")),
            (cfg.num_heads, cfg.relative_buckets), cfg.params_dtype)
        relative = k_positions[..., None, :] - q_positions[..., :, None]  # [..., q, k]
        buckets = relative_position_bucket(relative, self.bidirectional, cfg.relative_buckets,
                                           cfg.relative_max_distance)
        bias = jnp.take(table, buckets, axis=1)                      # [heads, ..., q, k]
        bias = jnp.moveaxis(bias, 0, -3)                            # [..., heads, q, k]
        if bias.ndim == 3:
            bias = bias[None]
        return bias.astype(cfg.compute_dtype)


def apply_rotary(x: jax.Array, positions: jax.Array, base: float = 10000.0) -> jax.Array:
    """RoPE, rotate-half form.  x [batch, length, heads, head_dim], positions [batch, length]."""
    dim = x.shape[-1]
    inv_freq = base ** (-jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)   # [dim/2]
    angles = positions.astype(jnp.float32)[..., None] * inv_freq            # [b, l, dim/2]
    cos = jnp.concatenate([jnp.cos(angles)] * 2, axis=-1)[:, :, None, :]
    sin = jnp.concatenate([jnp.sin(angles)] * 2, axis=-1)[:, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return (x.astype(jnp.float32) * cos + rotated * sin).astype(x.dtype)
