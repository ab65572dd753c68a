"""Transparent attention (Bapna et al. 2018, "Training Deeper Neural Machine Translation
Models with Transparent Attention", sec. 3).

Decoder layer j cross-attends to a learned mix of every encoder layer's output, the
embedding output included (layer 0):

    s_j = sum_{i=0..N} softmax_i(W)_{i,j} · h_i,      W [N + 1, M] learned

with N encoder layers and M decoder layers. The encoder hands over all its states,
stacked as [batch, N + 1, length, d_model] (each through the encoder's final norm in a
pre-LN stack, so every state is on the scale a decoder usually reads); `TransparentMix`
turns them into one memory per decoder layer [batch, M, length, d_model]. W starts at 0:
every layer starts from the plain average.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from t2t.nn.config import TransformerConfig


class TransparentMix(nn.Module):
    """states [batch, N + 1, length, d] -> per-decoder-layer memories [batch, M, length, d]."""

    config: TransformerConfig
    num_targets: int

    @nn.compact
    def __call__(self, states: jax.Array) -> jax.Array:
        cfg = self.config
        w = self.param("mix_logits", nn.with_logical_partitioning(
            nn.initializers.zeros, (None, None)), (states.shape[1], self.num_targets),
            cfg.params_dtype)
        weights = jax.nn.softmax(w.astype(jnp.float32), axis=0)         # [N + 1, M]
        mixed = jnp.einsum("bsld,sm->bmld", states.astype(jnp.float32), weights)
        return mixed.astype(states.dtype)


def layer_memory(encoded, index: int):
    """The memory decoder layer `index` reads: encoded [b, l, d], or its own slice of a
    transparent mix [b, M, l, d]."""
    if encoded is None or encoded.ndim == 3:
        return encoded
    return encoded[:, index]
