"""Dropout whose masks are JAX's bits, made without JAX's rolled loop on the CPU.

`jax.random.bernoulli` with a Threefry key hashes one 64-bit counter per element with
Threefry-2x32 (20 rounds; Salmon et al. 2011). On the CPU, JAX lowers those rounds as a
loop of 5 iterations, and XLA:CPU writes the loop's two [shape] uint32 states to memory
and back at every iteration: at the `micro` ablation scale, random bits were a fifth of a
T5 training step. `keep_mask` computes the same hash with the rounds written out, which XLA
fuses into one pass (a 2M-element mask: 7x less CPU time, benchmarks/README.md), computed
once per mask on the CPU (`_hashed_once`), and returns **the same mask, bit for bit**
(tests/nn/test_dropout.py): runs, checkpoints and grids trained with flax's `nn.Dropout`
stay reproducible. Keys of other PRNG implementations, JAX's non-partitionable Threefry
mode and masks of 2**32 elements or more go to `jax.random.bernoulli` itself.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

THREEFRY = "threefry2x32"
ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))   # Threefry-2x32, alternating every 4 rounds
KEY_PARITY = 0x1BD11BDA
FLOAT32_MANTISSA = 23                              # jax.random.uniform's float32 resolution


def threefry2x32(k1, k2, x1, x2) -> Tuple[jax.Array, jax.Array]:
    """Threefry-2x32 with 20 rounds of the counter pair (x1, x2) under the key (k1, k2):
    uint32 arrays in, two uint32 arrays of x1's shape out (JAX's threefry2x32_p)."""
    keys = (k1, k2, k1 ^ k2 ^ np.uint32(KEY_PARITY))
    x1, x2 = x1 + keys[0], x2 + keys[1]
    for i in range(5):                     # 5 x (4 rounds, then a key injection)
        for r in ROTATIONS[i % 2]:
            x1 = x1 + x2
            x2 = (lax.shift_left(x2, np.uint32(r))
                  | lax.shift_right_logical(x2, np.uint32(32 - r))) ^ x1
        x1 = x1 + keys[(i + 1) % 3]
        x2 = x2 + keys[(i + 2) % 3] + np.uint32(i + 1)
    return x1, x2


def _threefry_words(key: jax.Array) -> Optional[jax.Array]:
    """The key's two uint32 words, or None for a key this module does not reproduce."""
    if not jax.config.jax_threefry_partitionable:
        return None
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(key) if str(jax.random.key_impl(key)) == THREEFRY else None
    return key if jax.config.jax_default_prng_impl == THREEFRY else None


def _linear_index(shape: Sequence[int]) -> jax.Array:
    """uint32 [shape]: each element's row-major position (built from per-axis iotas, which
    XLA's SPMD partitioner splits like the mask itself)."""
    strides = np.cumprod((tuple(shape[1:]) + (1,))[::-1])[::-1]
    return sum(lax.broadcasted_iota(jnp.uint32, tuple(shape), axis) * np.uint32(stride)
               for axis, stride in enumerate(strides))


def keep_mask(key: jax.Array, keep_prob: float, shape: Sequence[int]) -> jax.Array:
    """bool [shape], True with probability `keep_prob`: `jax.random.bernoulli(key,
    keep_prob, shape)`, the same values."""
    shape = tuple(int(d) for d in shape)
    words = _threefry_words(key)
    if words is None or not shape or math.prod(shape) >= 2 ** 32:
        return jax.random.bernoulli(key, keep_prob, shape)
    lo = _linear_index(shape)
    bits1, bits2 = threefry2x32(words[0], words[1], jnp.zeros_like(lo), lo)
    # uniform = mantissa / 2**23 < float32(keep_prob)  <=>  mantissa < ceil(keep_prob * 2**23)
    threshold = math.ceil(float(np.float32(keep_prob)) * 2 ** FLOAT32_MANTISSA)
    mantissa = lax.shift_right_logical(bits1 ^ bits2, np.uint32(32 - FLOAT32_MANTISSA))
    return lax.platform_dependent(mantissa < np.uint32(threshold), cpu=_hashed_once,
                                  default=lambda keep: keep)


def _hashed_once(keep: jax.Array) -> jax.Array:
    """`keep`, looked up in [False, True]: the same mask, which XLA:CPU computes once.

    XLA:CPU's fusion copies a chain of cheap elementwise ops into every fusion that reads its
    result, and the hash is some 150 of them. In a train step a mask is read by the forward
    select, the backward one and the reductions fused with them, so every mask was hashed
    some 26 times over (the tiny BART step: 9,413 shifts in the optimized HLO for 364
    traced), and the step compiled in 10.2 s (5.3 s now; 4.1 s without dropout) at the test
    suite's settings. A gather is an op XLA's fusion does not copy: the hash ends in one
    fusion, and its readers load a byte an element. Other backends keep the chain: their
    fusion weighs what a copy costs."""
    return jnp.take(jnp.asarray([False, True]), keep.astype(jnp.int32), mode="clip",
                    unique_indices=False, indices_are_sorted=False)


class Dropout(nn.Module):
    """flax's `nn.Dropout` (same fields, same outputs) with masks from `keep_mask`."""

    rate: float
    broadcast_dims: Sequence[int] = ()
    deterministic: Optional[bool] = None
    rng_collection: str = "dropout"

    @nn.compact
    def __call__(self, inputs, deterministic: Optional[bool] = None,
                 rng: Optional[jax.Array] = None):
        deterministic = nn.merge_param("deterministic", self.deterministic, deterministic)
        if self.rate == 0.0 or deterministic:
            return inputs
        if self.rate == 1.0:
            return jnp.zeros_like(inputs)
        keep_prob = 1.0 - self.rate
        if rng is None:
            rng = self.make_rng(self.rng_collection)
        shared = {axis % inputs.ndim for axis in self.broadcast_dims}
        mask_shape = [1 if axis in shared else d for axis, d in enumerate(inputs.shape)]
        mask = jnp.broadcast_to(keep_mask(rng, keep_prob, mask_shape), inputs.shape)
        return lax.select(mask, inputs / keep_prob, jnp.zeros_like(inputs))
