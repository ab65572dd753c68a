"""LayerNorm (BERT, GPT-2) and RMSNorm (T5), computed in float32."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from t2t.nn.config import TransformerConfig


class LayerNorm(nn.Module):
    """LayerNorm over the last axis with learned scale and bias."""

    eps: float = 1e-12
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        features = x.shape[-1]
        scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
                           (features,), self.param_dtype)
        bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
                          (features,), self.param_dtype)
        x = x.astype(jnp.float32)
        mean = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
        y = (x - mean) * jax.lax.rsqrt(var + self.eps)
        return (y * scale + bias).astype(self.dtype)


class RMSNorm(nn.Module):
    """T5's LayerNorm: no mean subtraction, no bias; x / rms(x) * scale."""

    eps: float = 1e-6
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        features = x.shape[-1]
        scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
                           (features,), self.param_dtype)
        x = x.astype(jnp.float32)
        var = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
        return (x * jax.lax.rsqrt(var + self.eps) * scale).astype(self.dtype)


def make_norm(config: TransformerConfig, name: str) -> nn.Module:
    """The config's norm (LayerNorm or RMSNorm) with its eps and dtype."""
    cls = LayerNorm if config.norm_type == "layer" else RMSNorm
    return cls(eps=config.norm_eps, dtype=config.compute_dtype,
               param_dtype=config.params_dtype, name=name)
