"""LayerNorm (BERT, GPT-2) and RMSNorm (T5), computed in float32.

Both go through one normalisation with a hand-written backward pass (`normalize`):
dx = r·(g·γ − mean(g·γ) − x̂·mean(g·γ·x̂)) in one fused expression. Left to autodiff, the
mean-subtraction's backward leaves a per-row term in every residual-stream gradient, and
XLA:CPU then re-fuses the whole chain of residual additions into each consumer (the HLO of
a GPT-2 small step held several times the additions); the explicit form is faster per
GPT-2 train step on CPU (measured by benchmarks/train_step.py, recorded in
benchmarks/README.md) and gives the same gradients (tests/nn/test_layers.py).
Like every `jax.custom_vjp`, it supports reverse-mode autodiff only (no `jax.jvp`).
"""
from __future__ import annotations

import functools
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from t2t.nn.config import TransformerConfig


def normalize(x: jax.Array, scale: jax.Array, bias: Optional[jax.Array], eps: float) -> jax.Array:
    """(x − mean) / sqrt(var + eps) · scale + bias over the last axis, in float32.

    `bias=None` is RMSNorm: x / sqrt(mean(x²) + eps) · scale (no centring). Returns float32.
    """
    return _normalize(x, scale, bias, float(eps), bias is not None, jnp.dtype(x.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _normalize(x, scale, bias, eps, centered, x_dtype):
    return _normalize_fwd(x, scale, bias, eps, centered, x_dtype)[0]


def _normalize_fwd(x, scale, bias, eps, centered, x_dtype):
    x = x.astype(jnp.float32)                                   # [..., d]
    if centered:
        x = x - jnp.mean(x, axis=-1, keepdims=True)
    r = jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps)  # [..., 1]
    x_hat = x * r
    y = x_hat * scale
    if centered:
        y = y + bias
    return y, (x_hat, r, scale)


def _normalize_bwd(eps, centered, x_dtype, residuals, g):
    x_hat, r, scale = residuals
    g = g.astype(jnp.float32)
    batch_axes = tuple(range(g.ndim - 1))
    g_hat = g * scale                                            # dL/dx̂
    dx = g_hat - x_hat * jnp.mean(g_hat * x_hat, axis=-1, keepdims=True)
    if centered:
        dx = dx - jnp.mean(g_hat, axis=-1, keepdims=True)
    d_scale = jnp.sum(g * x_hat, axis=batch_axes)
    d_bias = jnp.sum(g, axis=batch_axes) if centered else None
    return (dx * r).astype(x_dtype), d_scale, d_bias


_normalize.defvjp(_normalize_fwd, _normalize_bwd)


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
        bias = self._param("bias", nn.initializers.zeros, features) if self.center else None
        return normalize(x, scale, bias, self.eps).astype(self.dtype)


class LayerNorm(_Norm):
    """LayerNorm with learned scale and bias (BERT eps 1e-12, GPT-2 1e-5)."""

    eps: float = 1e-12
    center = True


class RMSNorm(_Norm):
    """T5's LayerNorm: no mean subtraction, no bias (eps 1e-6)."""


class NoNorm(nn.Module):
    """`norm_type="none"` (ReZero, Fixup: t2t/nn/residual.py): x in the compute dtype."""

    dtype: jnp.dtype = jnp.float32

    def __call__(self, x: jax.Array) -> jax.Array:
        return x.astype(self.dtype)


def make_norm(config: TransformerConfig, name: str) -> nn.Module:
    """The config's norm (LayerNorm, RMSNorm or none) with its eps and dtype."""
    if config.norm_type == "none":
        return NoNorm(dtype=config.compute_dtype, name=name)
    cls = LayerNorm if config.norm_type == "layer" else RMSNorm
    return cls(eps=config.norm_eps, dtype=config.compute_dtype,
               param_dtype=config.params_dtype, name=name)
