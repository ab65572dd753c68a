"""Picking positions out of a sequence (BERT's masked positions, SpanBERT's span boundaries)."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def gather_positions(x: jax.Array, positions: jax.Array) -> jax.Array:
    """x [batch, length, d], positions [batch, p] -> [batch, p, d]."""
    return jnp.take_along_axis(x, positions[..., None].astype(jnp.int32), axis=1)
