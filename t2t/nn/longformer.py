"""Longformer self-attention (Beltagy et al. 2020): a sliding window plus global tokens.

`config.attention_pattern = "sliding_window"` gives the encoder this attention, as
transformers' ``LongformerSelfAttention`` computes it:

* local rows: token i attends the keys j with |i - j| <= w/2 (w = `attention_window` of its
  layer, even; one value or one per layer, as HF's) and every global token, with the
  ordinary `query`/`key`/`value` projections; a global key inside the window counts once;
* global rows: a global token attends every token of its example with the separate
  `query_global`/`key_global`/`value_global` projections (`global_projections=True`, the
  paper's sec. 3.1 and HF's; False: the ordinary ones), and is attended by every token;
* padding (and, packed, other examples' tokens) is never attended.

Time and memory are O(l * w) (plus O(l * g) for g global tokens): the queries are cut into
blocks of w/2 and each block scores only its own and its two neighbouring key blocks
([b, h, l/(w/2), w/2, 3w/2]); no l x l matrix is built. The length need not be a multiple
of the window (HF pads the input to one; t2t pads inside, and the outputs at the real
positions are the same). The global tokens are gathered into `max_global_tokens` slots per
row (a static shape): a row's global tokens past that many attend and are attended as local
ones. Padding queries get a mean of the values (HF's get zeros); no real token reads them.

On a TPU (`attention_kernel` "splash" or "auto") the local rows run in the Pallas splash
kernel (`attention_kernels.splash_attention`) with a banded mask: the keys are the global
slots (padded to the kernel's 128-wide blocks) followed by the tokens, the mask the slot
columns or (`LogicalOr`) the band `LocalMask` shifted past them, and the segment ids keep
each query to its example's slots and window and out of the in-slot tokens' own columns.
Where the kernel cannot run (attention dropout in training, a length that is not a
multiple of 128) the layer takes the XLA path above and says why in one log line. The
global rows are g x l einsums either way.
"""
from __future__ import annotations

from typing import Callable, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from t2t.errors import ConfigError
from t2t.nn import attention_kernels
from t2t.nn.sparse_attention import TokenMask, masked_softmax


def check_longformer_config(cfg) -> None:
    """ConfigError (one line) unless the window fields fit; stores the windows as a tuple."""
    windows = cfg.attention_window
    windows = (windows,) if isinstance(windows, int) else tuple(int(w) for w in windows)
    object.__setattr__(cfg, "attention_window", windows)
    if len(windows) not in (1, cfg.num_encoder_layers):
        raise ConfigError(f"attention_window has {len(windows)} values; give one, or one per "
                          f"encoder layer ({cfg.num_encoder_layers})")
    bad = [w for w in windows if w <= 0 or w % 2]
    if bad:
        raise ConfigError(f"attention_window values must be positive and even (w/2 keys on "
                          f"each side), got {bad}")
    if cfg.max_global_tokens < 0:
        raise ConfigError(f"max_global_tokens must be >= 0, got {cfg.max_global_tokens}")


def layer_window(cfg, layer_index: int) -> int:
    """The full window w of encoder layer `layer_index`."""
    windows = cfg.attention_window
    return windows[0] if len(windows) == 1 else windows[layer_index]


def scored_pairs(length: int, window: int) -> int:
    """(query, key) pairs one head of one layer attends over ``length`` tokens with full
    window ``window`` and no global tokens: the band |i - j| <= w/2 cut at both ends, the
    paper's count (a FLOP count's attention term is 4 * head_dim * heads * this); length^2
    once w/2 >= length - 1. The banded XLA path scores 3w/2 keys a query and the splash path
    whole 128 x 128 tiles, the masked rest being layout, not model FLOPs."""
    half = min(window // 2, length - 1)
    return length + 2 * half * length - half * half - half


def global_slots(global_tokens: Optional[jax.Array], max_global: int, length: int,
                 batch: int) -> jax.Array:
    """The positions of each row's first `max_global` global tokens [batch, g], `length`
    in the slots left empty (g = min(max_global, length); 0 without global tokens)."""
    if global_tokens is None or max_global == 0:
        return jnp.zeros((batch, 0), jnp.int32)
    size = min(max_global, length)
    return jax.vmap(lambda g: jnp.nonzero(g, size=size, fill_value=length)[0])(
        global_tokens).astype(jnp.int32)


def gather(x: jax.Array, index: jax.Array) -> jax.Array:
    """x [b, l, ...] at index [b, g] (clipped to the last row) -> [b, g, ...]."""
    index = jnp.minimum(index, x.shape[1] - 1)
    return jnp.take_along_axis(x, index.reshape(index.shape + (1,) * (x.ndim - 2)), axis=1)


def _pad(x: jax.Array, before: int, after: int, value=0) -> jax.Array:
    widths = [(0, 0), (before, after)] + [(0, 0)] * (x.ndim - 2)
    return jnp.pad(x, widths, constant_values=value)


def _key_blocks(x: jax.Array, chunk: int, blocks: int, value=0) -> jax.Array:
    """[b, l, ...] -> [b, blocks, 3 * chunk, ...]: the keys of query block n are the
    positions (n - 1) * chunk .. (n + 2) * chunk - 1 (`value` outside 0..l-1)."""
    x = _pad(x, chunk, blocks * chunk - x.shape[1] + chunk, value)
    x = x.reshape((x.shape[0], blocks + 2, chunk) + x.shape[2:])
    return jnp.concatenate([x[:, :-2], x[:, 1:-1], x[:, 2:]], axis=2)


def _splash_local_rows(q, k, v, valid, seg, in_slot, slots, chunk: int) -> jax.Array:
    """The local rows [b, l, h, d] by the splash kernel (q already scaled)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
    b, l = q.shape[:2]
    block = attention_kernels.SPLASH_BLOCK
    width = -(-slots.shape[1] // block) * block                # slot columns, whole blocks
    slots = jnp.pad(slots, ((0, 0), (0, width - slots.shape[1])), constant_values=l)
    never, padding = jnp.int32(-2), jnp.int32(-3)
    # a query attends a key iff their segment ids match: its example's slots and window
    # tokens; in-slot tokens only as slots; a padding query its padding neighbours
    slot_seg = jnp.where(slots < l, gather(seg, slots), never)
    token_seg = jnp.where(valid & ~in_slot, seg, jnp.where(valid, never, padding))
    segments = attention_kernels.SegmentedMask(
        None, jnp.where(valid, seg, padding), jnp.concatenate([slot_seg, token_seg], 1))
    shape = (l, width + l)
    band = sm.LocalMask(shape, (chunk, chunk), offset=width)
    if width:
        columns = np.zeros(shape, bool)
        columns[:, :width] = True
        band = sm.LogicalOr(band, sm.NumpyMask(columns))
    keys = jnp.concatenate([gather(k, slots), k], 1)
    values = jnp.concatenate([gather(v, slots), v], 1)
    return attention_kernels.splash_attention(q, keys, values, segments, pattern=band)


def sliding_window_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: TokenMask, *,
                             window: int, slots: jax.Array, scale: float,
                             global_qkv: Optional[Tuple[jax.Array, jax.Array, jax.Array]] = None,
                             dropout_rate: float = 0.0, dropout_rng=None,
                             deterministic: bool = True, dtype=jnp.float32,
                             kernel: str = "xla") -> jax.Array:
    """q, k, v [b, l, h, d] -> [b, l, h, d].

    `slots` [b, g]: the global tokens' positions (`global_slots`); `global_qkv`: the global
    rows' queries [b, g, h, d] and the keys and values they read [b, l, h, d] (default: the
    ordinary projections). Query-key logits are scaled by `scale`. `kernel`: "xla" (the
    banded einsums) or "splash" (the local rows in the TPU kernel; no dropout).
    """
    b, l, h, d = q.shape
    chunk = window // 2
    seg = (jnp.zeros((b, l), jnp.int32) if mask.segment_ids is None
           else mask.segment_ids.astype(jnp.int32))
    in_slot = jnp.zeros((b, l), bool).at[jnp.arange(b)[:, None], slots].set(True, mode="drop")
    q = (q * jnp.asarray(scale, q.dtype)) if scale != 1.0 else q
    rngs = (None, None) if dropout_rng is None else jax.random.split(dropout_rng)
    if kernel == "splash":
        out = _splash_local_rows(q, k, v, mask.valid, seg, in_slot, slots, chunk)
    else:
        out = _banded_local_rows(q, k, v, mask.valid, seg, in_slot, slots, chunk,
                                 dropout_rate, rngs[0], deterministic, dtype)
    return _with_global_rows(out.astype(dtype), q, k, v, mask.valid, seg, slots, global_qkv,
                             scale, dropout_rate, rngs[1], deterministic, dtype)


def _banded_local_rows(q, k, v, valid, seg, in_slot, slots, chunk, dropout_rate, rng,
                       deterministic, dtype) -> jax.Array:
    """The local rows [b, l, h, d] by blocks of `chunk` queries (q already scaled)."""
    b, l, h, d = q.shape
    blocks = -(-l // chunk)
    padded = blocks * chunk
    qb = _pad(q, 0, padded - l).reshape(b, blocks, chunk, h, d)
    seg_q = _pad(seg, 0, padded - l, -1).reshape(b, blocks, chunk)

    # the band: each query block against its own and its neighbours' key blocks
    rel = jnp.arange(3 * chunk)[None, :] - chunk - jnp.arange(chunk)[:, None]   # j - i
    band = (jnp.abs(rel) <= chunk)[None, None]                                   # [1,1,c,3c]
    local_keys = _key_blocks(valid & ~in_slot, chunk, blocks, False)            # [b, n, 3c]
    seg_k = _key_blocks(seg, chunk, blocks, -2)
    band_mask = band & local_keys[:, :, None, :] & (seg_q[..., None] == seg_k[:, :, None, :])
    band_logits = jnp.einsum("bnqhd,bnkhd->bhnqk", qb, _key_blocks(k, chunk, blocks),
                             preferred_element_type=jnp.float32)
    # every local row also reads the global tokens, with the ordinary keys and values
    slot_ok = (slots < l) & gather(valid, slots)                                # [b, g]
    glob_mask = (slot_ok[:, None, :] & (seg_q.reshape(b, padded)[:, :, None]
                                        == gather(seg, slots)[:, None, :]))    # [b, L, g]
    glob_logits = jnp.einsum("bnqhd,bghd->bhnqg", qb, gather(k, slots),
                             preferred_element_type=jnp.float32)
    g = slots.shape[1]
    logits = jnp.concatenate([glob_logits, band_logits], axis=-1)
    full_mask = jnp.concatenate([glob_mask.reshape(b, blocks, chunk, g), band_mask], axis=-1)
    probs = masked_softmax(logits, full_mask[:, None], dtype, dropout_rate,
                           None if deterministic else rng)
    out = (jnp.einsum("bhnqg,bghd->bnqhd", probs[..., :g], gather(v, slots),
                      preferred_element_type=jnp.float32)
           + jnp.einsum("bhnqk,bnkhd->bnqhd", probs[..., g:], _key_blocks(v, chunk, blocks),
                        preferred_element_type=jnp.float32))
    return out.reshape(b, padded, h, d)[:, :l]


def _with_global_rows(out, q, k, v, valid, seg, slots, global_qkv, scale, dropout_rate, rng,
                      deterministic, dtype) -> jax.Array:
    """`out` with the global tokens' rows replaced: each attends every token of its
    example (q already scaled; `global_qkv`'s query not yet)."""
    b = out.shape[0]
    if slots.shape[1] == 0:
        return out
    gq, gk, gv = global_qkv if global_qkv is not None else (gather(q, slots), k, v)
    if global_qkv is not None and scale != 1.0:
        gq = gq * jnp.asarray(scale, gq.dtype)
    row_mask = (valid[:, None, :]
                & (gather(seg, slots)[:, :, None] == seg[:, None, :]))[:, None]  # [b,1,g,l]
    row_logits = jnp.einsum("bghd,blhd->bhgl", gq, gk, preferred_element_type=jnp.float32)
    row_probs = masked_softmax(row_logits, row_mask, dtype, dropout_rate,
                               None if deterministic else rng)
    rows = jnp.einsum("bhgl,blhd->bghd", row_probs, gv,
                      preferred_element_type=jnp.float32).astype(dtype)
    return out.at[jnp.arange(b)[:, None], slots].set(rows, mode="drop")


def attention(cfg, layer_index: int, inputs: jax.Array, q: jax.Array, k: jax.Array,
              v: jax.Array, mask: TokenMask, *, projection: Callable[[str, bool], Callable],
              scale: float, dropout_rate: float, dropout_rng, deterministic: bool,
              dtype) -> jax.Array:
    """MultiHeadAttention's sliding-window path: q, k, v [b, l, h, d] (projected) ->
    [b, l, h, d]. `projection(name, is_query)` makes a [embed -> heads, kv] projection in
    the calling attention module (the global ones: `query_global`, `key_global`,
    `value_global`, created whether or not this batch has global tokens)."""
    b, l = inputs.shape[:2]
    slots = global_slots(mask.global_tokens, cfg.max_global_tokens, l, b)
    global_qkv = None
    if cfg.global_projections:
        has_rows = slots.shape[1] > 0
        at_slots = gather(inputs, slots)
        kv_inputs = inputs if has_rows else inputs[:, :0]     # params only, no rows to serve
        global_qkv = (projection("query_global", True)(at_slots),
                      projection("key_global", False)(kv_inputs),
                      projection("value_global", False)(kv_inputs))
        if not has_rows:
            global_qkv = None
    block = attention_kernels.SPLASH_BLOCK
    width = -(-slots.shape[1] // block) * block               # the splash path's slot keys
    kernel = attention_kernels.choose(
        cfg.attention_kernel, q_len=l, k_len=width + l, bias=False,
        dropout=not deterministic and dropout_rate > 0.0, structured=True,
        batch_heads=(b, q.shape[2]), dtype=jnp.dtype(q.dtype).name, head_dim=q.shape[-1])
    return sliding_window_attention(
        q, k, v, mask, window=layer_window(cfg, layer_index), slots=slots, scale=scale,
        global_qkv=global_qkv, dropout_rate=dropout_rate, dropout_rng=dropout_rng,
        deterministic=deterministic, dtype=dtype,
        kernel="splash" if kernel == "splash" else "xla")
