"""Which kernel computes attention (`TransformerConfig.attention_kernel`), and the TPU one.

- "xla": t2t's own einsum → masked float32 softmax → einsum (t2t/nn/attention.py); the
  [batch, heads, q_len, k_len] logits live in memory.
- "cudnn": `jax.nn.dot_product_attention` with `implementation="cudnn"` on an NVIDIA GPU
  (cuDNN's fused flash-attention kernel: bfloat16/float16 inputs, head_dim <= 256 and a
  multiple of 8, even lengths with a bias, more than one query; otherwise the layer falls
  back to XLA and says why), JAX's XLA implementation of the same function elsewhere (the
  CPU tests).
- "splash": the Pallas splash-attention kernel for TPUs
  (`jax.experimental.pallas.ops.tpu.splash_attention`): FlashAttention's blockwise online
  softmax (Dao et al. 2022, Algorithm 1), which never materialises the logits, with
  block-sparse causal and packed-segment masks. Off a TPU it runs in Pallas' interpreter
  (slow; for tests).
- "auto": splash on a TPU, cuDNN on a GPU, XLA elsewhere (the CPU).

With `TransformerConfig.attention_structure` the stacks tell cuDNN's kernel the mask's
structure instead of a dense mask (`cudnn_mask`): causality as `is_causal` (the kernel skips
the masked upper triangle) and padding as per-row sequence lengths, and T5's relative
position bias stays [1, heads, q, k] (cuDNN reduces its gradient over the batch). Lengths
describe a row only when it holds one example followed by padding (segment ids 1...1 0...0);
a batch where some row does not (packed rows) takes the dense mask instead, decided on the
device per call (`lax.cond`, which reads one predicate back on a GPU).

Splash takes no additive bias and has no attention-probability dropout, and it needs the
mask as structure (causal, segment ids) rather than as a dense boolean array; lengths must
be multiples of its 128-wide blocks. Where a layer cannot use the kernel asked for, it
falls back to XLA and says why in one log line (T5's relative position bias is the usual
reason). The platform is the one the step is compiled for: the mesh's devices under
`jax.set_mesh` (a TPU slice in `t2t compile`), else JAX's default backend.
"""
from __future__ import annotations

import functools
import logging
import math
from typing import Optional

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from t2t.precision import GPU_PLATFORMS

_log = logging.getLogger(__name__)

KERNELS = ("auto", "xla", "cudnn", "splash")
AUTO = {"tpu": "splash", **{gpu: "cudnn" for gpu in GPU_PLATFORMS}}
CUDNN_DTYPES = ("bfloat16", "float16")   # cuDNN's fused attention takes no float32
SPLASH_BLOCK = 128     # the kernel's default q and kv block: lengths must be multiples
QKV_AXES = ("batch", "length", "heads", "kv")


@flax.struct.dataclass
class SegmentedMask:
    """An attention mask with its structure kept for a kernel: `dense` bool [batch|1, 1,
    q_len, k_len] is what XLA attention reads (and drops when unused); the kernel reads the
    segment ids [batch, q_len] / [batch, k_len] (None: one segment, no padding) and
    `causal`. The stacks build it only where splash may run (`wants_structure`)."""

    dense: Optional[jax.Array]
    q_segments: Optional[jax.Array] = None
    k_segments: Optional[jax.Array] = None
    causal: bool = flax.struct.field(pytree_node=False, default=False)
    # cuDNN (`cudnn_mask`): real tokens per row [batch] int32, and whether they describe
    # the mask exactly (scalar bool: every row is one example, then padding)
    q_lengths: Optional[jax.Array] = None
    k_lengths: Optional[jax.Array] = None
    lengths_exact: Optional[jax.Array] = None


def dense(mask):
    """The boolean mask array of `mask` (a SegmentedMask, an array or None)."""
    return mask.dense if isinstance(mask, SegmentedMask) else mask


def target_platform() -> str:
    """"tpu", "gpu", "cpu", ...: the platform of the mesh being traced for, else JAX's."""
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty and mesh.abstract_device is not None:
        return mesh.abstract_device.platform
    return jax.default_backend()


def resolve(kernel: str, platform: Optional[str] = None) -> str:
    """The kernel `kernel` names on `platform` (default: `target_platform()`)."""
    if kernel != "auto":
        return kernel
    return AUTO.get(platform or target_platform(), "xla")


def wants_structure(kernel: str, platform: Optional[str] = None) -> bool:
    """Whether the stacks should pass SegmentedMasks (the kernel resolves to splash)."""
    return resolve(kernel, platform) == "splash"


def cudnn_structure(config, platform: Optional[str] = None) -> bool:
    """Whether `config.attention_structure` applies: its kernel resolves to cuDNN's (the
    stacks then build `cudnn_mask`s and keep T5's bias unbroadcast over the batch)."""
    return bool(config.attention_structure) and resolve(config.attention_kernel,
                                                        platform) == "cudnn"


def choose(kernel: str, *, q_len: int, k_len: int, bias: bool, dropout: bool,
           structured: bool, platform: Optional[str] = None,
           batch_heads: Optional[tuple] = None, dtype: Optional[str] = None,
           head_dim: Optional[int] = None) -> str:
    """"xla", "cudnn" or "splash" for one attention call; a fallback to XLA is logged
    once with its reason. `structured`: the mask is None or a SegmentedMask;
    `batch_heads`: (batch, heads), checked against the mesh's split of them; `dtype` (the
    inputs' dtype name) and `head_dim`: checked against cuDNN's limits on a GPU."""
    platform = platform or target_platform()
    chosen = resolve(kernel, platform)
    if chosen == "cudnn" and dropout:
        return _fall_back(kernel, chosen, "attention-probability dropout in training")
    if chosen == "cudnn" and platform in GPU_PLATFORMS:
        return _cudnn_or_xla(kernel, q_len=q_len, k_len=k_len, bias=bias, dtype=dtype,
                             head_dim=head_dim)
    if chosen != "splash":
        return chosen
    if bias:
        return _fall_back(kernel, chosen, "an additive attention bias (T5's relative "
                          "position bias)")
    if dropout:
        return _fall_back(kernel, chosen, "attention-probability dropout in training")
    if not structured:
        return _fall_back(kernel, chosen, "a dense mask (prefix LM, decoding, or a layer "
                          "type that builds its own)")
    if q_len % SPLASH_BLOCK or k_len % SPLASH_BLOCK:
        return _fall_back(kernel, chosen, f"lengths {q_len} x {k_len} are not multiples "
                          f"of its {SPLASH_BLOCK}-wide blocks")
    ways = _mesh_ways()
    if batch_heads is not None and ways is not None and any(
            n % w for n, w in zip(batch_heads, ways)):
        return _fall_back(kernel, chosen, f"(batch, heads) {tuple(batch_heads)} that the "
                          f"mesh does not split evenly {ways} (the parameter check says so)")
    return "splash"


def _cudnn_or_xla(kernel: str, *, q_len: int, k_len: int, bias: bool,
                  dtype: Optional[str], head_dim: Optional[int]) -> str:
    """"cudnn" where cuDNN's fused kernel takes this call (jax/_src/cudnn's checks), else
    "xla" with the reason logged."""
    if dtype is not None and dtype not in CUDNN_DTYPES:
        return _fall_back(kernel, "cudnn", f"{dtype} inputs (it takes bfloat16 or float16: "
                          f"TransformerConfig.dtype='bfloat16')")
    if head_dim is not None and (head_dim > 256 or head_dim % 8):
        return _fall_back(kernel, "cudnn", f"head_dim {head_dim} (at most 256, a multiple "
                          f"of 8)")
    if q_len == 1:
        return _fall_back(kernel, "cudnn", "one query at a time (a decoding step; the fused "
                          "kernel gains nothing there)")
    if bias and (q_len % 2 or k_len % 2):
        return _fall_back(kernel, "cudnn", f"odd lengths {q_len} x {k_len} with a bias")
    return "cudnn"


def _mesh_ways() -> Optional[tuple]:
    """(ways the batch is split, ways the heads are) on the current mesh, or None."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return None
    spec = nn.logical_to_mesh_axes(QKV_AXES)

    def ways(axes):
        axes = () if axes is None else (axes,) if isinstance(axes, str) else axes
        return math.prod(mesh.shape[a] for a in axes)

    return ways(spec[0]), ways(spec[2])


@functools.lru_cache(maxsize=None)
def _fall_back(kernel: str, chosen: str, reason: str) -> str:
    _log.info("attention_kernel=%r: %s cannot take %s; this attention runs on XLA",
              kernel, chosen, reason)
    return "xla"


def splash_attention(q: jax.Array, k: jax.Array, v: jax.Array,
                     mask: Optional[SegmentedMask], pattern=None) -> jax.Array:
    """softmax(q·kᵀ, masked)·v by the splash kernel: q [batch, q_len, heads, head_dim]
    (already scaled), k/v [batch, k_len, heads, head_dim] -> [batch, q_len, heads,
    head_dim]. `mask` gives causality and the segment ids (a query attends the keys of its
    own segment). `pattern`, in place of the full or causal mask: one splash mask [q_len,
    k_len] for every head (Longformer's band, t2t/nn/longformer.py) or a sequence of one per
    head (BigBird's blocks, t2t/nn/block_sparse.py); the kernel skips each 128 x 128 tile a
    head's mask leaves empty. Under a mesh the kernel runs per device in `jax.shard_map`,
    the batch and heads split as the logical-axis rules split them, each device with its
    heads' masks."""
    from jax.experimental.pallas.ops.tpu import splash_attention as splash
    causal = mask is not None and mask.causal
    q_seg = None if mask is None else mask.q_segments
    k_seg = None if mask is None else mask.k_segments
    if (q_seg is None) != (k_seg is None):     # one side packed: the other is one segment
        q_seg = jnp.ones(q.shape[:2], jnp.int32) if q_seg is None else q_seg
        k_seg = jnp.ones(k.shape[:2], jnp.int32) if k_seg is None else k_seg
    (_, q_len, heads, _), k_len = q.shape, k.shape[1]
    if pattern is None:
        pattern = (splash.CausalMask((q_len, k_len)) if causal
                   else splash.FullMask((q_len, k_len)))
    masks = list(pattern) if isinstance(pattern, (list, tuple)) else [pattern] * heads
    if len(masks) != heads:
        raise ValueError(f"splash attention got {len(masks)} head masks for {heads} heads")
    mesh = jax.sharding.get_abstract_mesh()
    spec = None if mesh.empty else P(*nn.logical_to_mesh_axes(QKV_AXES))
    kernel = splash.make_splash_mha(
        splash.MultiHeadMask(masks), head_shards=1 if spec is None else _mesh_ways()[1],
        q_seq_shards=1, interpret=target_platform() != "tpu")
    if spec is None:
        return _splash_rows(kernel, q, k, v, q_seg, k_seg)
    if spec[1] is not None:
        raise ValueError(f"splash attention cannot split the length over the mesh ({spec})")
    kernel_spec = kernel.manual_sharding_spec(jax.sharding.NamedSharding(mesh, P(spec[2], None)))
    seg_spec = None if q_seg is None else P(spec[0], None)
    return jax.shard_map(_splash_rows, in_specs=(kernel_spec, spec, spec, spec, seg_spec,
                                                 seg_spec),
                         out_specs=spec, check_vma=False)(kernel, q, k, v, q_seg, k_seg)


def _splash_rows(kernel, q, k, v, q_seg, k_seg):
    """One device's share: the kernel over its heads, vmapped over its rows."""
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    def row(q, k, v, qs, ks):          # [len, heads, head_dim] -> [heads, len, head_dim]
        segments = None if qs is None else splash.SegmentIds(qs, ks)
        out = kernel(q.swapaxes(0, 1), k.swapaxes(0, 1), v.swapaxes(0, 1),
                     segment_ids=segments)
        return out.swapaxes(0, 1)

    return jax.vmap(row)(q, k, v, q_seg, k_seg).astype(q.dtype)


def structured_mask(config, mask: Optional[jax.Array], q_segments: Optional[jax.Array],
                    k_segments: Optional[jax.Array], causal: bool = False):
    """`mask` (what `causal` and the segment ids [batch, len] make) as a SegmentedMask where
    `config.attention_kernel` resolves to splash on this platform, or to cuDNN with
    `config.attention_structure` (`cudnn_mask`), else `mask` itself."""
    if cudnn_structure(config):
        return cudnn_mask(mask, q_segments, k_segments, causal)
    if not wants_structure(config.attention_kernel):
        return mask
    return SegmentedMask(mask, q_segments, k_segments, causal)


def cudnn_mask(mask: Optional[jax.Array], q_segments: Optional[jax.Array],
               k_segments: Optional[jax.Array], causal: bool = False) -> SegmentedMask:
    """The SegmentedMask cuDNN's kernel reads: `causal`, and with segment ids the real
    tokens per row as lengths plus whether every row is right-padded (one segment, then
    padding), so that lengths and `causal` are exactly `mask`."""
    if q_segments is None and k_segments is None:
        return SegmentedMask(mask, causal=causal)
    q_real, q_ok = _real_tokens(q_segments)
    k_real, k_ok = _real_tokens(k_segments)
    # a row with real queries but no real key (an empty input under a target) is the
    # dense mask's fully masked row, which lengths cannot say
    ok = q_ok & k_ok & jnp.all((q_real > 0) == (k_real > 0))
    return SegmentedMask(mask, q_segments, k_segments, causal,
                         None if q_segments is None else jnp.maximum(q_real, 1),
                         None if k_segments is None else jnp.maximum(k_real, 1), ok)


def _real_tokens(segments: Optional[jax.Array]):
    """(real tokens per row [batch] int32, whether each row is 1...1 0...0): segment ids
    [batch, len], 0 for padding; None is one segment with no padding. (`cudnn_mask` gives
    the kernel lengths of at least 1: a row of padding alone then reads its first key,
    finite, and no real query reads that row.)"""
    if segments is None:
        return jnp.ones((), jnp.int32), jnp.asarray(True)
    real = segments > 0
    lengths = jnp.sum(real, axis=-1, dtype=jnp.int32)
    first = jnp.arange(segments.shape[-1], dtype=jnp.int32)[None, :] < lengths[:, None]
    ok = jnp.all((real == first) & (~real | (segments == segments[:, :1])))
    return lengths, ok

