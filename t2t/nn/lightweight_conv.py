"""Lightweight and dynamic convolutions in place of self-attention (Wu et al. 2019, "Pay Less
Attention with Lightweight and Dynamic Convolutions", sec. 3).

The block (sec. 3, fig. 2b): a linear map d -> 2d and a GLU, the convolution, a linear map
d -> d. The convolution is depthwise over the d channels, which form H groups of d / H
channels sharing one kernel of width k; each kernel is softmax-normalised over its k taps
(eq. 2-3, LightConv), and the normalised weights are dropped out in training ("weight
dropout", DropConnect, at the attention dropout rate):

    LightConv(X)_{i,c}   = sum_j softmax(W_{h(c)})_j · X_{i + j - p, c}        W [H, k]
    DynamicConv(X)_{i,c} = the same with W_h = (W^Q X_i)_h, a kernel predicted from the
                           current position by a linear map d -> H·k (eq. 4)

`conv_groups` sets H apart from the heads (d: a kernel per channel) and `conv_pointwise`
adds a pointwise d -> d map with bias after the taps (a separable convolution): the block
Narang et al. 2021 ran (4 d² like attention, not Wu et al.'s 3 d²; Table 1's counts).

Encoder kernels are centred (p = (k - 1) / 2); decoder kernels see the current and the
k - 1 previous positions only (p = k - 1, causal). Taps outside the sequence or outside
the attention mask (padding, other packed segments) contribute 0, like the paper's zero
padding. Decoding keeps the block's GLU outputs in the "cache" collection and reads each
step's window from it.
"""
from __future__ import annotations

from typing import Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from t2t.errors import ConfigError
from t2t.nn import attention_kernels
from t2t.nn.config import TransformerConfig
from t2t.nn.dense import Dense, kernel_init
from t2t.nn.dropout import keep_mask


def check_convolution_config(cfg: TransformerConfig) -> None:
    """One-line errors for convolution options that cannot work (TransformerConfig)."""
    groups = cfg.conv_groups or cfg.num_heads
    if cfg.conv_kernel_size < 1 or cfg.conv_groups < 0 or cfg.d_model % groups:
        raise ConfigError(f"convolutions need conv_kernel_size >= 1 and d_model divisible by "
                          f"the channel groups (conv_groups, default num_heads), got "
                          f"{cfg.conv_kernel_size} and {cfg.d_model} / {groups}")
    if cfg.share_encoder_decoder or cfg.funnel_blocks:
        raise ConfigError("convolution needs share_encoder_decoder=False (encoder kernels are "
                          "centred, decoder kernels causal) and funnel_blocks=()")


def conv_windows(keys: jax.Array, mask: Optional[jax.Array], q_index: jax.Array, width: int,
                 left: int):
    """Each query's window: keys [b, T, d], query positions q_index [l] -> (windows
    [b, l, k, d], valid [b|1, l, k]): tap j of query i reads position i - left + j."""
    pos = q_index[:, None] - left + jnp.arange(width)[None, :]            # [l, k]
    valid = ((pos >= 0) & (pos < keys.shape[1]))[None]                    # [1, l, k]
    safe = jnp.clip(pos, 0, keys.shape[1] - 1)
    windows = jnp.take(keys, safe, axis=1)                                # [b, l, k, d]
    mask = attention_kernels.dense(mask)
    if mask is not None:                                                  # [b|1, 1, l, T]
        rows = mask[:, 0]
        valid = valid & jnp.take_along_axis(rows, jnp.broadcast_to(
            safe[None], (rows.shape[0],) + safe.shape), axis=-1)
    return windows, valid


def depthwise_conv(windows: jax.Array, weights: jax.Array, valid: jax.Array) -> jax.Array:
    """windows [b, l, k, d], weights [b|1, l|1, H, k] (normalised), valid [b|1, l, k]
    -> [b, l, d]: channel c uses its group h = c // (d / H)."""
    b, l, k, d = windows.shape
    h = weights.shape[-2]
    weights = weights * valid[:, :, None, :].astype(weights.dtype)        # [b, l, H, k]
    grouped = windows.reshape(b, l, k, h, d // h)
    out = jnp.einsum("blhk,blkhc->blhc", weights.astype(jnp.float32),
                     grouped.astype(jnp.float32))
    return out.reshape(b, l, d)


def cached_inputs(module: nn.Module, x: jax.Array, decode: bool,
                  decode_index: Optional[jax.Array]) -> Tuple[jax.Array, jax.Array]:
    """(the sequence a causal convolution reads, its first query position): `x` itself, or
    while decoding the module's cache of inputs [b, T, c] with `x` written at
    `decode_index` (the first, initialising call sizes the cache)."""
    if not decode:
        return x, 0
    ready = module.has_variable("cache", "conv_inputs")
    cache = module.variable("cache", "conv_inputs", jnp.zeros, x.shape, x.dtype)
    if not ready:
        return x, 0
    cache.value = lax.dynamic_update_slice(cache.value, x.astype(cache.value.dtype),
                                           (0, decode_index, 0))
    return cache.value, decode_index


class ConvolutionBlock(nn.Module):
    """[batch, length, d_model] -> same; called like `MultiHeadAttention` (keys, bias and
    positions unused) so a layer can hold it as its self-attention.

    Parameters: `input` [d, 2, d] (the GLU's two halves), `kernel` [H, k] (lightweight) or
    `kernel_proj` [d, H, k] (dynamic), `pointwise` [d, d] + bias (`conv_pointwise`),
    `out` [d, d]; H = `conv_groups` or num_heads.
    """

    config: TransformerConfig
    deterministic: bool = True
    decode: bool = False
    causal: bool = False

    @nn.compact
    def __call__(self, inputs_q: jax.Array, inputs_kv=None, mask: Optional[jax.Array] = None,
                 bias=None, q_positions=None, k_positions=None,
                 decode_index: Optional[jax.Array] = None) -> jax.Array:
        cfg = self.config
        d, h, k = cfg.d_model, cfg.conv_groups or cfg.num_heads, cfg.conv_kernel_size
        dense = lambda feats, axes, name, init: Dense(  # noqa: E731
            feats, axes, use_bias=cfg.use_bias, dtype=cfg.compute_dtype,
            param_dtype=cfg.params_dtype, kernel_init=init, name=name)
        glu_in = dense((2, d), ("embed", None, "mlp"), "input",
                       kernel_init(cfg, in_axis=0, out_axis=(1, 2)))(inputs_q)  # [b, l, 2, d]
        u = glu_in[..., 0, :] * jax.nn.sigmoid(glu_in[..., 1, :])               # [b, l, d]
        if cfg.convolution == "dynamic":                                        # eq. 4
            logits = dense((h, k), ("mlp", None, None), "kernel_proj",
                           kernel_init(cfg, in_axis=0, out_axis=(1, 2)))(u)    # [b, l, H, k]
        else:
            logits = self.param("kernel", nn.with_logical_partitioning(
                nn.initializers.normal(1.0), ("heads", None)), (h, k), cfg.params_dtype)[None, None]
        weights = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)            # eq. 2
        rate = cfg.attn_dropout_rate
        if not self.deterministic and rate > 0.0:                               # DropConnect
            keep = keep_mask(self.make_rng("dropout"), 1.0 - rate, u.shape[:2] + (h, k))
            weights = jnp.where(keep, weights / (1.0 - rate), 0.0)
        left = k - 1 if self.causal else (k - 1) // 2
        keys, start = cached_inputs(self, u, self.decode, decode_index)
        q_index = start + jnp.arange(u.shape[1])
        windows, valid = conv_windows(keys, mask, q_index, k, left)
        out = depthwise_conv(windows, weights, valid).astype(cfg.compute_dtype)  # [b, l, d]
        if cfg.conv_pointwise:                                       # separable: taps, then
            out = Dense(d, ("mlp", None), use_bias=True, dtype=cfg.compute_dtype,  # d -> d
                        param_dtype=cfg.params_dtype, kernel_init=kernel_init(cfg),
                        name="pointwise")(out)
        return dense(d, ("mlp", "embed"), "out", kernel_init(cfg))(out)
