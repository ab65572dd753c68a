"""The Evolved Transformer's encoder and decoder cells (So et al. 2019, "The Evolved
Transformer", sec. 5 and Figure 3), as Narang et al. 2021 (Table 1) ran them.

Every block reads a LayerNorm of its input and joins a residual (the figure's pre-norm
cells); "Sep" is a depthwise separable convolution (a width-k kernel per channel along the
length, then a pointwise d_in -> d_out map), narrower outputs are zero-padded to the wider
branch before a sum. Widths for d = d_model, H = num_heads:

encoder cell
    1. x += GLU(LN x)                                    (x W_a) ⊙ σ(x W_b), d -> d
    2. h = LN x;  l = ReLU(h W_{d->4d});  r = ReLU(Conv3x1_{d->d/2} h)
       x += pad_d(Sep9x1_{4d->d/2}(LN(l + pad_4d r)))
    3. x += SelfAttention_H(LN x)
    4. x += FFN_ReLU(LN x)                               d -> d_ff -> d
decoder cell
    1. h = LN x;  x += SelfAttention_2H(h) + EncDecAttention_H(h, memory)
    2. h = LN x;  l = ReLU(Sep11x1_{d->2d} h);  r = Sep7x1_{d->d/2} h
       x += Sep7x1_{2d->d}(LN(l + pad_2d r))
    3. x += SelfAttention_H(LN x)
    4. x += EncDecAttention_H(LN x, memory)
    5. x += FFN_Swish(LN x)

Encoder convolutions are centred; decoder convolutions see the current and previous
positions only (causal), and decode step by step from a cache of their inputs. Taps
outside the sequence or the attention mask (padding, other packed segments) read 0. One
cell holds about two Transformer layers (Narang et al. halve the layer count: 6 + 6 at
the paper scale). The 2H-head self-attention reads the shared relative-position bias of
head h // 2. Dropout follows each branch (So et al. appendix: as the Transformer).
"""
from __future__ import annotations

from typing import Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from t2t.errors import ConfigError
from t2t.nn.blocks import LayerFields
from t2t.nn.attention import MultiHeadAttention
from t2t.nn.config import TransformerConfig
from t2t.nn.dense import Dense, kernel_init
from t2t.nn.dropout import Dropout
from t2t.nn.lightweight_conv import cached_inputs, conv_windows
from t2t.nn.mlp import MlpBlock
from t2t.nn.norms import make_norm
from t2t.nn.weighted import check_replaced_layer


def check_evolved_config(cfg: TransformerConfig) -> None:
    """One-line errors for options the Evolved Transformer cells do not combine with."""
    check_replaced_layer(cfg)
    if not cfg.pre_norm or cfg.d_model % 2:
        raise ConfigError(f"layer_type='evolved' needs pre_norm=True and an even d_model, "
                          f"got pre_norm={cfg.pre_norm}, d_model={cfg.d_model}")


def pad_to(x: jax.Array, width: int) -> jax.Array:
    """[..., c] -> [..., width], zeros appended (c <= width)."""
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, width - x.shape[-1])])


class Conv1D(nn.Module):
    """A width-k convolution along the length, [b, l, c_in] -> [b, l, features].

    `separable`: depthwise kernel [k, c_in] then pointwise [c_in, features] (+ bias);
    otherwise a full kernel [k, c_in, features]. Tap j of position i reads i - left + j,
    left = k - 1 (causal) or (k - 1) // 2 (centred)."""

    config: TransformerConfig
    features: int
    width: int
    axes: Tuple[str, str]          # logical names of the input and output channels
    separable: bool = True
    causal: bool = False
    decode: bool = False

    @nn.compact
    def __call__(self, x: jax.Array, mask: Optional[jax.Array] = None,
                 decode_index: Optional[jax.Array] = None) -> jax.Array:
        cfg = self.config
        dtype, c = cfg.compute_dtype, x.shape[-1]
        keys, start = cached_inputs(self, x, self.decode and self.causal, decode_index)
        left = self.width - 1 if self.causal else (self.width - 1) // 2
        windows, valid = conv_windows(keys, mask, start + jnp.arange(x.shape[1]),
                                      self.width, left)                   # [b, l, k, c]
        windows = windows * valid[..., None].astype(windows.dtype)
        if not self.separable:
            kernel = self.param("kernel", nn.with_logical_partitioning(
                kernel_init(cfg, in_axis=(0, 1), out_axis=2), (None,) + self.axes),
                (self.width, c, self.features), cfg.params_dtype)
            return jnp.einsum("blkc,kco->blo", windows, kernel.astype(dtype))
        depthwise = self.param("depthwise", nn.with_logical_partitioning(
            kernel_init(cfg, in_axis=0, out_axis=1), (None, self.axes[0])),
            (self.width, c), cfg.params_dtype)
        y = jnp.einsum("blkc,kc->blc", windows, depthwise.astype(dtype))    # [b, l, c]
        return Dense(self.features, self.axes, use_bias=True, dtype=dtype,
                     param_dtype=cfg.params_dtype, kernel_init=kernel_init(cfg),
                     name="pointwise")(y)


class EvolvedLayer(LayerFields):
    """One Evolved Transformer cell, called like `TransformerLayer`: the encoder cell, or
    the decoder cell when `causal` (its cross-attention branches run only given
    `encoded`)."""

    def _residual(self, x, name, fn):
        """x + Dropout(fn(LN x))."""
        h = make_norm(self.config, f"{name}_norm")(x)
        return x + Dropout(self.config.dropout_rate)(fn(h), deterministic=self.deterministic)

    def _drop(self, x):
        return Dropout(self.config.dropout_rate)(x, deterministic=self.deterministic)

    def _attention(self, name, heads=None, decode=False):
        cfg = self.config if heads is None else self.config.replace(num_heads=heads)
        return MultiHeadAttention(cfg, self.deterministic, decode, name=name)

    def _conv(self, name, features, width, axes, separable=True):
        return Conv1D(self.config, features, width, axes, separable, self.causal, self.decode,
                      name=name)

    @nn.compact
    def __call__(self, x, encoded=None, self_mask=None, self_bias=None, cross_mask=None,
                 positions=None, decode_index=None, self_kv=None):
        x = (self._decoder(x, encoded, self_mask, self_bias, cross_mask, decode_index)
             if self.causal else self._encoder(x, self_mask, self_bias))
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        return (x, None) if self.scanned else x

    def _encoder(self, x, mask, bias):
        cfg = self.config
        d = cfg.d_model
        glu = Dense((2, d), ("embed", None, "mlp"), use_bias=cfg.use_bias,
                    dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype,
                    kernel_init=kernel_init(cfg, in_axis=0, out_axis=(1, 2)), name="glu")
        x = self._residual(x, "glu", lambda h: (lambda g: g[..., 0, :] * jax.nn.sigmoid(
            g[..., 1, :]))(glu(h)))                                          # 1. GLU

        def convs(h):                                                        # 2.
            left = jax.nn.relu(Dense(4 * d, ("embed", "mlp"), use_bias=cfg.use_bias,
                                     dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype,
                                     kernel_init=kernel_init(cfg), name="conv1x1")(h))
            right = jax.nn.relu(self._conv("conv3x1", d // 2, 3, ("embed", "mlp"),
                                           separable=False)(h, mask))
            mid = make_norm(cfg, "conv_mid_norm")(self._drop(left) + pad_to(self._drop(right),
                                                                        4 * d))
            return pad_to(self._conv("sep_conv9x1", d // 2, 9, ("mlp", "embed"))(mid, mask), d)

        x = self._residual(x, "conv", convs)
        attention = self._attention("self_attention")
        x = self._residual(x, "self_attention", lambda h: attention(h, h, mask, bias))  # 3.
        return self._residual(x, "mlp", MlpBlock(cfg, self.deterministic, name="mlp"))  # 4.

    def _decoder(self, x, encoded, mask, bias, cross_mask, decode_index):
        cfg = self.config
        d, h2 = cfg.d_model, 2 * cfg.num_heads
        wide = self._attention("wide_self_attention", h2, self.decode)
        wide_bias = None if bias is None else jnp.repeat(bias, 2, axis=1)   # head h // 2
        branch_cross = self._attention("branch_cross_attention") if encoded is not None else None

        def attentions(h):                                                   # 1.
            out = wide(h, h, mask, wide_bias, None, None, decode_index)
            return out if branch_cross is None else out + branch_cross(h, encoded, cross_mask)

        def convs(h):                                                        # 2.
            left = jax.nn.relu(self._conv("sep_conv11x1", 2 * d, 11, ("embed", "mlp"))(
                h, mask, decode_index))
            right = self._conv("sep_conv7x1_1", d // 2, 7, ("embed", "mlp"))(h, mask,
                                                                              decode_index)
            mid = make_norm(cfg, "conv_mid_norm")(self._drop(left) + pad_to(self._drop(right),
                                                                        2 * d))
            return self._conv("sep_conv7x1_2", d, 7, ("mlp", "embed"))(mid, mask, decode_index)

        x = self._residual(x, "branch_attention", attentions)
        x = self._residual(x, "conv", convs)
        attention = self._attention("self_attention", decode=self.decode)
        x = self._residual(x, "self_attention", lambda h: attention(        # 3.
            h, h, mask, bias, None, None, decode_index))
        if encoded is not None:                                              # 4.
            cross = self._attention("cross_attention")
            x = self._residual(x, "cross_attention", lambda h: cross(h, encoded, cross_mask))
        swish = MlpBlock(cfg.replace(mlp_activations=("swish",)), self.deterministic,
                         name="mlp")
        return self._residual(x, "mlp", swish)                               # 5.
