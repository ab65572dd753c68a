"""N-d dense layer (einsum over a full-rank kernel) and the initializers t2t uses.

flax's DenseGeneral breaks with logical partitioning under `jax.set_mesh` in this JAX
version, so kernels are created directly with `nn.with_logical_partitioning`.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple, Union

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from t2t.nn import mixed_einsum
from t2t.nn.config import TransformerConfig

Initializer = Callable[..., jax.Array]
Axes = Tuple[Optional[str], ...]


def kernel_init(config: TransformerConfig, in_axis=-2, out_axis=-1, scale: float = 1.0,
                distribution: str = "truncated_normal") -> Initializer:
    """Kernel initializer: T5's fan-in variance scaling or BERT/GPT-2's normal(0.02)."""
    if config.kernel_init == "normal":
        return nn.initializers.normal(stddev=config.initializer_range * scale)
    return nn.initializers.variance_scaling(scale, "fan_in", distribution,
                                            in_axis=in_axis, out_axis=out_axis)


def embedding_init(config: TransformerConfig) -> Initializer:
    """Token embeddings: T5 uses normal(1.0); BERT/GPT-2 normal(initializer_range)."""
    if config.kernel_init == "normal":
        return nn.initializers.normal(stddev=config.initializer_range)
    return nn.initializers.normal(stddev=1.0)


def matmul(x: jax.Array, kernel: jax.Array, contract: int, dtype) -> jax.Array:
    """Contract the last `contract` dims of x with the first of kernel, f32 accumulation.

    The backward products are laid out for XLA:CPU's fast dot kernels, float32 included, and
    under a low-precision `dtype` take `dtype` operands as well (`t2t.nn.mixed_einsum`).
    """
    letters = "abcdefghijklmnopqrstuvwxyz"
    batch, inner = letters[:x.ndim - contract], letters[x.ndim - contract:x.ndim]
    outer = letters[x.ndim:x.ndim + kernel.ndim - contract]
    spec = f"{batch}{inner},{inner}{outer}->{batch}{outer}"
    y = mixed_einsum.einsum(spec, x, kernel, dtype, float32_layout=True)
    return y.astype(dtype)


@jax.custom_vjp
def add_bias(y: jax.Array, bias: jax.Array) -> jax.Array:
    """y [..., *F] + bias [*F] (cast to y's dtype).

    The same sum as autodiff's, but the bias gradient (g summed over the leading dims) is
    computed as a product with a vector of ones, float32 accumulation: XLA:CPU runs it as one
    matmul, where autodiff's reduction became a slow reduce-window (72 of them in a GPT-2
    small step: benchmarks/README.md).
    """
    return y + bias.astype(y.dtype)


def _add_bias_fwd(y, bias):
    return add_bias(y, bias), bias


def _add_bias_bwd(bias, g):
    lead = g.ndim - bias.ndim
    ones = jnp.ones(g.shape[:lead], g.dtype)
    dims = tuple(range(lead))
    db = lax.dot_general(ones, g, ((dims, dims), ((), ())),
                         preferred_element_type=jnp.float32)      # [*F]
    return g, db.astype(bias.dtype)


add_bias.defvjp(_add_bias_fwd, _add_bias_bwd)


class Dense(nn.Module):
    """y = x · W (+ b), contracting the last `contract` dims of x.

    features: output shape appended after the batch dims, e.g. (heads, head_dim).
    kernel_axes: logical names for `in_shape + features`.
    """

    features: Union[int, Sequence[int]]
    kernel_axes: Axes
    contract: int = 1
    use_bias: bool = False
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    kernel_init: Initializer = nn.initializers.lecun_normal()

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        features = (self.features,) if isinstance(self.features, int) else tuple(self.features)
        shape = tuple(x.shape[-self.contract:]) + features
        if len(self.kernel_axes) != len(shape):
            raise ValueError(f"{self.name}: kernel_axes {self.kernel_axes} do not match "
                             f"kernel shape {shape}")
        kernel_init = nn.with_logical_partitioning(self.kernel_init, self.kernel_axes)
        kernel = self.param("kernel", kernel_init, shape, self.param_dtype)
        y = matmul(x, kernel, self.contract, self.dtype)
        if self.use_bias:
            bias_axes = self.kernel_axes[self.contract:]
            bias_init = nn.with_logical_partitioning(nn.initializers.zeros, bias_axes)
            bias = self.param("bias", bias_init, features, self.param_dtype)
            y = add_bias(y, bias)
        return y
