"""The Weighted Transformer's branched attention (Ahmed et al. 2017, "Weighted Transformer
Network for Machine Translation", sec. 3, eqs. 2-3), as Narang et al. 2021 (Table 1) ran it.

Each of the M = H heads is a branch: its attention output is projected to d_model by its own
W^O_i, scaled by the concatenation weight κ_i, passed through the feed-forward network, and
the branches are summed with the addition weights α_i:

    head_i    = Attention(Q W^Q_i, K W^K_i, V W^V_i)                  [b, q, d_v]
    h̄ead_i    = head_i W^O_i × κ_i                                     [b, q, d_model]
    Branched  = Σ_i α_i FFN(h̄ead_i),   κ, α ≥ 0,  Σ_i κ_i = Σ_i α_i = 1   (eq. 3)

The FFN's weights are shared by the branches (eq. 3 applies one FFN; the paper's model
keeps the Transformer's parameter count), and the layer replaces the attention +
feed-forward pair: an encoder layer is one branched self-attention, a decoder layer a
branched self-attention then a branched encoder-decoder attention, each its own FFN
(Narang et al.'s 280M at the paper scale is 223M plus one FFN per decoder layer).
κ and α are kept on the simplex by z ↦ relu(z) / Σ_j (relu(z_j) + 1e-4), initialised
U(0, 1), the constraint the Mesh TensorFlow layer Narang et al. used applies after each
update; here it maps the stored weights in the forward pass.
"""
from __future__ import annotations

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from t2t.errors import ConfigError
from t2t.nn.blocks import LayerFields
from t2t.nn.attention import dot_product_attention
from t2t.nn.config import TransformerConfig
from t2t.nn.dense import Dense, kernel_init
from t2t.nn.dropout import Dropout
from t2t.nn.mlp import MlpBlock
from t2t.nn.norms import make_norm

SIMPLEX_EPS = 1e-4


def check_replaced_layer(cfg: TransformerConfig) -> None:
    """`layer_type` replaces the whole layer: a ConfigError for the options that change
    parts of the standard layer or stack instead."""
    others = {"moe_num_experts": 0, "convolution": "none", "synthesizer": "none",
              "residual_scaling": "none", "universal_steps": 0, "linformer_k": 0,
              "funnel_blocks": (), "pkm_layers": (), "adapter_size": 0, "prefix_length": 0,
              "share_encoder_decoder": False}
    clash = [name for name, off in others.items() if getattr(cfg, name) != off]
    if clash:
        raise ConfigError(f"layer_type={cfg.layer_type!r} replaces the whole layer; unset "
                          f"{', '.join(clash)}")


def check_weighted_config(cfg: TransformerConfig) -> None:
    """One-line errors for options the branched layer does not combine with."""
    check_replaced_layer(cfg)
    if cfg.position_embedding == "rotary":
        raise ConfigError("layer_type='weighted' does not take rotary positions")


def simplex(z: jax.Array) -> jax.Array:
    """[M] -> [M], non-negative and summing to 1 (up to M·1e-4): relu(z) / Σ(relu(z) + ε)."""
    z = jax.nn.relu(z.astype(jnp.float32))
    return z / jnp.sum(z + SIMPLEX_EPS)


class BranchedAttention(nn.Module):
    """inputs_q [b, q, d], inputs_kv [b, k, d] -> [b, q, d] (eq. 3; mask [b|1, 1, q, k],
    bias [b|1, H, q, k]). Parameters: query/key/value [d, H, d_v], out [H, d_v, d] (one
    W^O_i per head, not summed over heads), kappa [H], alpha [H], mlp (the shared FFN)."""

    config: TransformerConfig
    deterministic: bool = True
    decode: bool = False

    @nn.compact
    def __call__(self, inputs_q: jax.Array, inputs_kv: jax.Array,
                 mask: Optional[jax.Array] = None, bias: Optional[jax.Array] = None,
                 decode_index: Optional[jax.Array] = None) -> jax.Array:
        cfg = self.config
        h, dv, d, dtype = cfg.num_heads, cfg.head_dim, cfg.d_model, cfg.compute_dtype
        init = kernel_init(cfg, in_axis=0, out_axis=(1, 2), distribution="normal")
        folded = cfg.attention_scale == "folded"     # T5: 1/sqrt(dv) in the query init
        proj = lambda name, x, scale=1.0: Dense(  # noqa: E731
            (h, dv), ("embed", "heads", "kv"), use_bias=cfg.use_bias, dtype=dtype,
            param_dtype=cfg.params_dtype, name=name,
            kernel_init=lambda *a: init(*a) * jnp.asarray(scale, a[-1]))(x)
        q = proj("query", inputs_q, dv ** -0.5 if folded else 1.0)          # [b, q, H, dv]
        k, v = proj("key", inputs_kv), proj("value", inputs_kv)              # [b, k, H, dv]
        if self.decode:
            k, v = self._cached(k, v, decode_index)
        rng = (self.make_rng("dropout") if not self.deterministic and cfg.attn_dropout_rate
               else None)
        heads = dot_product_attention(q, k, v, mask, bias, scale=1.0 if folded else dv ** -0.5,
                                      dropout_rate=cfg.attn_dropout_rate, dropout_rng=rng,
                                      deterministic=self.deterministic, dtype=dtype)
        w_out = self.param("out", nn.with_logical_partitioning(
            kernel_init(cfg, in_axis=1, out_axis=2, distribution="normal"),
            ("heads", "kv", "embed")), (h, dv, d), cfg.params_dtype)
        branches = jnp.einsum("bqhv,hvd->bqhd", heads, w_out.astype(dtype))   # [b, q, H, d]
        weight = lambda name: simplex(self.param(name, nn.with_logical_partitioning(  # noqa
            nn.initializers.uniform(1.0), ("heads",)), (h,), cfg.params_dtype))
        kappa, alpha = weight("kappa"), weight("alpha")                      # [H] each
        branches = branches * kappa.astype(dtype)[:, None]
        b, length = branches.shape[:2]
        ffn = MlpBlock(cfg, self.deterministic, name="mlp")(
            branches.reshape(b, length * h, d)).reshape(b, length, h, d)      # per branch
        return jnp.einsum("bqhd,h->bqd", ffn, alpha.astype(dtype))

    def _cached(self, k, v, decode_index):
        """Self-attention decoding: the first call sizes zeroed key/value caches [b, T, H,
        dv]; each later one writes its keys/values at `decode_index` and reads them all."""
        ready = self.has_variable("cache", "cached_key")
        ck = self.variable("cache", "cached_key", jnp.zeros, k.shape, k.dtype)
        cv = self.variable("cache", "cached_value", jnp.zeros, v.shape, v.dtype)
        if not ready:
            return k, v
        ck.value = lax.dynamic_update_slice(ck.value, k.astype(ck.value.dtype),
                                            (0, decode_index, 0, 0))
        cv.value = lax.dynamic_update_slice(cv.value, v.astype(cv.value.dtype),
                                            (0, decode_index, 0, 0))
        return ck.value, cv.value


class WeightedLayer(LayerFields):
    """One Weighted Transformer layer, called like `TransformerLayer`: a branched
    self-attention and, given `encoded`, a branched encoder-decoder attention, each with
    the layer's norm and residual (pre- or post-LN) and no separate feed-forward."""

    @nn.compact
    def __call__(self, x, encoded=None, self_mask=None, self_bias=None, cross_mask=None,
                 positions=None, decode_index=None, self_kv=None):
        cfg = self.config
        drop = Dropout(cfg.dropout_rate)

        def sublayer(x, name, fn):
            norm = make_norm(cfg, f"{name}_norm")
            if cfg.pre_norm:
                return x + drop(fn(norm(x)), deterministic=self.deterministic)
            return norm(x + drop(fn(x), deterministic=self.deterministic))

        attend = BranchedAttention(cfg, self.deterministic, self.decode, name="self_attention")
        x = sublayer(x, "self_attention", lambda h: attend(h, h, self_mask, self_bias,
                                                           decode_index))
        if encoded is not None:
            cross = BranchedAttention(cfg, self.deterministic, name="cross_attention")
            x = sublayer(x, "cross_attention", lambda h: cross(h, encoded, cross_mask))
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        return (x, None) if self.scanned else x
