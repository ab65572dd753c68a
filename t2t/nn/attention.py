"""Multi-head attention (self and cross), attention masks, and the decoding KV cache."""
from __future__ import annotations

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax
from jax.ad_checkpoint import checkpoint_name

from t2t.nn import attention_kernels, block_sparse, longformer, mixed_einsum
from t2t.nn.config import TransformerConfig
from t2t.nn.dense import Dense, kernel_init
from t2t.nn.dropout import keep_mask
from t2t.nn.linformer import LowRankKeys
from t2t.nn.position import apply_rotary
from t2t.nn.residual import fixup_bias, fixup_init
from t2t.nn.sparse_attention import BIG_NEG, TokenMask
from t2t.nn.synthesizer import SyntheticLogits, mix_logits, uses_dot_product
from t2t.precision import GPU_PLATFORMS

# `checkpoint_name`s of the projections, which remat policies may keep (stacks.py)
QKV_NAMES = ("query_proj", "key_proj", "value_proj")
OUT_NAME = "out_proj"


# ----------------------------------------------------------------------------- masks
# All masks are boolean [batch, 1, q_len, k_len]: True where a query may attend a key.

def segment_mask(q_segments: jax.Array, k_segments: jax.Array) -> jax.Array:
    """Same packed example and a real key (segment 0 is padding)."""
    same = q_segments[:, :, None] == k_segments[:, None, :]
    return (same & (k_segments[:, None, :] > 0))[:, None]


def causal_mask(length: int) -> jax.Array:
    """[1, 1, length, length] lower triangle (key index <= query index)."""
    idx = jnp.arange(length)
    return (idx[None, :] <= idx[:, None])[None, None]


def prefix_lm_mask(causal_attention: jax.Array) -> jax.Array:
    """Causal, plus full attention among positions flagged 1 (the prefix/inputs part)."""
    prefix = causal_attention.astype(bool)
    both = prefix[:, :, None] & prefix[:, None, :]
    return causal_mask(prefix.shape[1]) | both[:, None]


def combine_masks(*masks: Optional[jax.Array]) -> Optional[jax.Array]:
    masks = [m for m in masks if m is not None]
    if not masks:
        return None
    out = masks[0]
    for m in masks[1:]:
        out = out & m
    return out


# ------------------------------------------------------------------------- attention
def dot_product_attention(q, k, v, mask, bias, *, scale, dropout_rate, dropout_rng,
                          deterministic, dtype, kernel="xla"):
    """Softmax(q·kᵀ·scale + bias, masked) · v.

    q [batch, q_len, heads, head_dim], k/v [batch, k_len, heads, head_dim],
    mask bool [batch|1, 1, q_len, k_len] (or a `SegmentedMask` carrying one),
    bias [batch|1, heads, q_len, k_len]. `kernel` is `TransformerConfig.attention_kernel`
    (t2t/nn/attention_kernels.py: "cudnn" is jax.nn.dot_product_attention, "splash" the
    TPU kernel); neither has attention-probability dropout, so training with that dropout
    takes the XLA path below.
    """
    kernel = attention_kernels.choose(
        kernel, q_len=q.shape[1], k_len=k.shape[1], bias=bias is not None,
        dropout=not deterministic and dropout_rate > 0.0,
        structured=mask is None or isinstance(mask, attention_kernels.SegmentedMask),
        batch_heads=(q.shape[0], q.shape[2]), dtype=jnp.dtype(q.dtype).name,
        head_dim=q.shape[-1])
    if kernel == "splash":
        q = q * jnp.asarray(scale, q.dtype) if scale != 1.0 else q
        return attention_kernels.splash_attention(q, k, v, mask)
    if kernel == "cudnn" and _structured_for_cudnn(mask):
        return _cudnn_structured(q, k, v, mask, bias, scale)
    mask = attention_kernels.dense(mask)
    if kernel == "cudnn":
        return _jax_attention(q, k, v, mask, bias, scale)
    if scale != 1.0:
        q = q * jnp.asarray(scale, q.dtype)
    logits = mixed_einsum.einsum("bqhd,bkhd->bhqk", q, k, dtype)       # float32
    if bias is not None:
        logits = logits + bias.astype(jnp.float32)
    return attend(logits, v, mask, dropout_rate=dropout_rate, dropout_rng=dropout_rng,
                  deterministic=deterministic, dtype=dtype)


def _structured_for_cudnn(mask) -> bool:
    """A `cudnn_mask` (TransformerConfig.attention_structure): causal and/or lengths."""
    return isinstance(mask, attention_kernels.SegmentedMask) and (
        mask.causal or mask.lengths_exact is not None)


def _cudnn_structured(q, k, v, mask, bias, scale):
    """cuDNN told the mask's structure: `is_causal`, and the rows' lengths where every row
    is one example then padding; a batch with another row (packed) takes the dense mask,
    chosen on the device."""
    if mask.lengths_exact is None:                       # causal (or nothing), no padding
        return _jax_attention(q, k, v, None, bias, scale, causal=mask.causal)

    def by_lengths(q, k, v, bias):
        return _jax_attention(q, k, v, None, bias, scale, causal=mask.causal,
                              lengths=(mask.q_lengths, mask.k_lengths))

    def by_mask(q, k, v, bias):
        return _jax_attention(q, k, v, mask.dense, bias, scale)

    return lax.cond(mask.lengths_exact, by_lengths, by_mask, q, k, v, bias)


def _jax_attention(q, k, v, mask, bias, scale, *, causal=False, lengths=(None, None)):
    """`jax.nn.dot_product_attention`: cuDNN's fused kernel on a GPU, JAX's XLA version
    elsewhere. On the GPU bias [1, heads, q, k] stays unbroadcast (cuDNN sums its gradient
    over the batch itself); a mask is folded into it as -inf-like entries by JAX, while
    `causal` (is_causal) and `lengths` (query and key lengths [batch] or None) reach the
    kernel as its own mask types."""
    if bias is not None:
        bias = bias.astype(q.dtype)
    structure = {name: value for name, value in (
        ("is_causal", causal), ("query_seq_lengths", lengths[0]),
        ("key_value_seq_lengths", lengths[1])) if value is not None and value is not False}
    if attention_kernels.target_platform() in GPU_PLATFORMS:
        return jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask, scale=scale,
                                            implementation="cudnn", **structure)
    b, ql, h, _ = q.shape
    shape = (b, h, ql, k.shape[1])
    if mask is not None:
        mask = jnp.broadcast_to(mask, shape)
    if bias is not None:
        bias = jnp.broadcast_to(bias, shape)
    return jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask, scale=scale,
                                        implementation="xla", **structure)


def attend(logits, v, mask, *, dropout_rate, dropout_rng, deterministic, dtype):
    """Softmax(logits, masked) · v: logits [batch, heads, q_len, k_len] (float32), v [batch,
    k_len, heads, head_dim] -> [batch, q_len, heads, head_dim]; attention dropout on the
    weights. Dot-product attention and the synthesizer (t2t/nn/synthesizer.py) share it."""
    logits = logits.astype(jnp.float32)
    if mask is not None:
        logits = jnp.where(mask, logits, BIG_NEG)
    weights = jax.nn.softmax(logits, axis=-1).astype(dtype)
    if not deterministic and dropout_rate > 0.0:
        keep = keep_mask(dropout_rng, 1.0 - dropout_rate, weights.shape)
        weights = jnp.where(keep, weights / (1.0 - dropout_rate), 0.0).astype(dtype)
    return mixed_einsum.einsum("bhqk,bkhd->bqhd", weights, v, dtype).astype(dtype)


class MultiHeadAttention(nn.Module):
    """Self- or cross-attention with per-head projections `query, key, value, out`.

    Kernels: query/key/value [embed, heads, kv], out [heads, kv, embed].
    With `decode=True` (self-attention only) keys and values of past steps live in the
    "cache" collection: the first (init) call sizes the cache from its input length;
    later calls take one token and write it at `decode_index`.
    A `t2t.nn.sparse_attention.TokenMask` as the mask (the Encoder's, with a sparse
    `config.attention_pattern`) runs that pattern: `sliding_window` (t2t/nn/longformer.py)
    or `block_sparse` (t2t/nn/block_sparse.py), with this layer's `layer_index`.
    """

    config: TransformerConfig
    deterministic: bool = True
    decode: bool = False
    use_prefix: bool = False   # prefix tuning: `config.prefix_length` learned key/value slots
    synthetic: bool = False    # `config.synthesizer` logits (self-attention; synthesizer.py)
    low_rank: bool = False     # Linformer: keys/values projected along the length (linformer.py)
    layer_index: int = 0       # the stack's layer it serves (sparse patterns: window, plan)

    @nn.compact
    def __call__(self, inputs_q: jax.Array, inputs_kv: jax.Array,
                 mask: Optional[jax.Array] = None, bias: Optional[jax.Array] = None,
                 q_positions: Optional[jax.Array] = None,
                 k_positions: Optional[jax.Array] = None,
                 decode_index: Optional[jax.Array] = None) -> jax.Array:
        cfg = self.config
        dtype = cfg.compute_dtype
        head_shape = (cfg.num_heads, cfg.head_dim)
        qkv_axes = ("embed", "heads", "kv")

        def proj(name, init):
            return Dense(head_shape, qkv_axes, use_bias=cfg.use_bias, dtype=dtype,
                         param_dtype=cfg.params_dtype, kernel_init=init, name=name)

        base_init = fixup_init(cfg, kernel_init(cfg, in_axis=0, out_axis=(1, 2),
                                                distribution="normal"), last=False)
        if cfg.attention_scale == "folded":   # T5: 1/sqrt(head_dim) lives in the query init
            def q_init(*args):
                return base_init(*args) / jnp.sqrt(cfg.head_dim).astype(args[-1])
            scale = 1.0
        else:
            q_init = base_init
            scale = cfg.head_dim ** -0.5
        synthetic = self.synthetic and cfg.synthesizer != "none"
        dot = not synthetic or uses_dot_product(cfg)   # plain synthesizers: no q, k
        v = checkpoint_name(proj("value", base_init)(inputs_kv), "value_proj")  # [b, k, h, d]
        q = k = None
        if dot:
            q = checkpoint_name(proj("query", q_init)(inputs_q), "query_proj")     # [b, q, h, d]
            k = checkpoint_name(proj("key", base_init)(inputs_kv), "key_proj")     # [b, k, h, d]
        if dot and cfg.position_embedding == "rotary" and q_positions is not None:
            q = apply_rotary(q, q_positions, cfg.rotary_base)
            k = apply_rotary(k, k_positions if k_positions is not None else q_positions,
                             cfg.rotary_base)
        if dot:
            q = nn.with_logical_constraint(q, ("batch", "length", "heads", "kv"))
            k = nn.with_logical_constraint(k, ("batch", "length", "heads", "kv"))
        v = nn.with_logical_constraint(v, ("batch", "length", "heads", "kv"))

        if self.decode or self.use_prefix and cfg.prefix_length or synthetic or (
                self.low_rank and cfg.linformer_k):       # these read the mask array
            mask = attention_kernels.dense(mask)
        stepping = self.decode and self.has_variable("cache", "cached_key")
        if self.decode:                                # plain synthesizers cache v twice
            k, v = self._update_cache(v if k is None else k, v, decode_index)
        if self.use_prefix and cfg.prefix_length:
            k, v, mask, bias = self._prepend_prefix(k, v, mask, bias)
        if self.low_rank and cfg.linformer_k:          # [b, n, h, d] -> [b, k, h, d]
            k, v = LowRankKeys(cfg, name="linformer")(k, v, mask)
            mask = None                                # every query sees the k mixed slots

        dropout_rng = None
        if not self.deterministic and cfg.attn_dropout_rate > 0.0:
            dropout_rng = self.make_rng("dropout")
        drop = dict(dropout_rate=cfg.attn_dropout_rate, dropout_rng=dropout_rng,
                    deterministic=self.deterministic, dtype=dtype)
        if synthetic:                                  # [b, h, q, k] from the query tokens
            logits = SyntheticLogits(cfg, name="synthesizer")(
                inputs_q, v.shape[1], decode_index if stepping else 0)
            if dot:
                q, bias = mix_logits(self, logits, q, bias)
        if isinstance(mask, TokenMask):                # sparse encoder self-attention
            out = self._sparse(inputs_q, q, k, v, mask, scale, dropout_rng,
                               lambda name, query: proj(name, q_init if query else base_init))
        elif synthetic and not dot:
            out = attend(logits, v, mask, **drop)
        else:
            out = dot_product_attention(q, k, v, mask, bias, scale=scale,
                                        kernel=cfg.attention_kernel, **drop)
        out = nn.with_logical_constraint(out, ("batch", "length", "heads", "kv"))
        out = fixup_bias(self, "fixup_bias_out", out)  # Fixup: a scalar bias before `out`
        out_init = fixup_init(cfg, kernel_init(cfg, in_axis=(0, 1), out_axis=2,
                                               distribution="normal"), last=True)
        out = Dense(cfg.d_model, ("heads", "kv", "embed"), contract=2, use_bias=cfg.use_bias,
                    dtype=dtype, param_dtype=cfg.params_dtype, kernel_init=out_init,
                    name="out")(out)
        return checkpoint_name(out, OUT_NAME)

    def _sparse(self, inputs_q, q, k, v, mask: TokenMask, scale, dropout_rng, projection):
        """`config.attention_pattern`'s attention over q, k, v [b, l, h, d] (projected);
        `block_sparse` inputs too short for the pattern attend densely over the valid tokens
        (`TokenMask.dense`), attention dropout included, as transformers' original_full."""
        cfg = self.config
        drop = dict(dropout_rate=cfg.attn_dropout_rate, dropout_rng=dropout_rng,
                    deterministic=self.deterministic, dtype=cfg.compute_dtype)
        if cfg.attention_pattern == "sliding_window":
            return longformer.attention(cfg, self.layer_index, inputs_q, q, k, v, mask,
                                        projection=projection, scale=scale, **drop)
        if not block_sparse.use_block_sparse(q.shape[1], cfg.sparse_block_size,
                                             cfg.num_random_blocks):
            return dot_product_attention(q, k, v, mask.dense(), None, scale=scale,
                                         kernel=cfg.attention_kernel, **drop)
        return block_sparse.encoder_attention(cfg, q, k, v, mask.valid,
                                              layer_index=self.layer_index, scale=scale,
                                              dtype=cfg.compute_dtype,
                                              segment_ids=mask.segment_ids)

    def _prepend_prefix(self, k, v, mask, bias):
        """Prefix tuning (Li & Liang 2021): keys/values [b, k, h, d] -> [b, p + k, h, d] with
        the learned `prefix_key`/`prefix_value` [p, h, d] first. Every query sees the prefix
        (mask columns True, bias columns 0); it carries no position (no rotary, no bucket)."""
        cfg = self.config
        shape, axes = (cfg.prefix_length, cfg.num_heads, cfg.head_dim), (None, "heads", "kv")
        init = nn.with_logical_partitioning(nn.initializers.normal(cfg.initializer_range), axes)
        b, p = k.shape[0], cfg.prefix_length
        pk, pv = (jnp.broadcast_to(self.param(name, init, shape, cfg.params_dtype)
                                   .astype(k.dtype), (b,) + shape)
                  for name in ("prefix_key", "prefix_value"))
        k, v = jnp.concatenate([pk, k], axis=1), jnp.concatenate([pv, v], axis=1)
        if mask is not None:                                  # [b|1, 1, q, k] -> [.., p + k]
            mask = jnp.concatenate(
                [jnp.ones(mask.shape[:-1] + (p,), bool), mask], axis=-1)
        if bias is not None:                                  # [b|1, h, q, k] -> [.., p + k]
            bias = jnp.concatenate([jnp.zeros(bias.shape[:-1] + (p,), bias.dtype), bias], -1)
        return k, v, mask, bias

    def _update_cache(self, k, v, decode_index):
        """Init: create zeroed caches shaped like k/v. Step: write k/v at decode_index."""
        initialized = self.has_variable("cache", "cached_key")
        cached_k = self.variable("cache", "cached_key", jnp.zeros, k.shape, k.dtype)
        cached_v = self.variable("cache", "cached_value", jnp.zeros, v.shape, v.dtype)
        if not initialized:
            return k, v
        if decode_index is None:
            raise ValueError("decode=True needs decode_index after the cache is initialised")
        start = (0, decode_index, 0, 0)
        cached_k.value = lax.dynamic_update_slice(cached_k.value,
                                                  k.astype(cached_k.value.dtype), start)
        cached_v.value = lax.dynamic_update_slice(cached_v.value,
                                                  v.astype(cached_v.value.dtype), start)
        return cached_k.value, cached_v.value
