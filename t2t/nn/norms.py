"""LayerNorm (BERT, GPT-2) and RMSNorm (T5), computed in float32."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from t2t.nn.config import TransformerConfig


class _Norm(nn.Module):
    """x / rms(x) * scale over the last axis; `center` subtracts the mean and adds a bias."""

    eps: float = 1e-6
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    center = False  # class constant, not a field

    def _param(self, name, init, features):
        return self.param(name, nn.with_logical_partitioning(init, ("embed",)), (features,),
                          self.param_dtype)

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        features = x.shape[-1]
        scale = self._param("scale", nn.initializers.ones, features)
        x = x.astype(jnp.float32)
        if self.center:
            x = x - jnp.mean(x, axis=-1, keepdims=True)
        y = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + self.eps) * scale
        if self.center:
            y = y + self._param("bias", nn.initializers.zeros, features)
        return y.astype(self.dtype)


class LayerNorm(_Norm):
    """LayerNorm with learned scale and bias (BERT eps 1e-12, GPT-2 1e-5)."""

    eps: float = 1e-12
    center = True


class RMSNorm(_Norm):
    """T5's LayerNorm: no mean subtraction, no bias (eps 1e-6)."""


def make_norm(config: TransformerConfig, name: str) -> nn.Module:
    """The config's norm (LayerNorm or RMSNorm) with its eps and dtype."""
    cls = LayerNorm if config.norm_type == "layer" else RMSNorm
    return cls(eps=config.norm_eps, dtype=config.compute_dtype,
               param_dtype=config.params_dtype, name=name)
