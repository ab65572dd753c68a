"""BigBird-ITC block-sparse attention (Zaheer et al. 2020).

The first and last key blocks are global (every query attends them; the first and last query
blocks attend every key); each middle query block attends its sliding window (itself +- 1)
and ``num_random_blocks`` random blocks chosen without replacement from the middle blocks
outside that window (what transformers' ``_bigbird_block_rand_mask`` draws, less its slip
that lets the last two query blocks draw their own window). t2t follows the paper in eval
mode too: transformers attends every "random" block to block 0 when not training; t2t
keeps the random plan, tested against dense attention under the explicit
`block_sparse_mask`. The plan depends on (seed, layer index, head) only, the same in
training and evaluation. Memory is O(length * block_size * blocks attended): key blocks are
gathered, no l x l matrix.

`encoder_attention` is what the encoder's self-attention calls with
``attention_pattern="block_sparse"`` for inputs long enough for the pattern
(`use_block_sparse`): the inputs padded to whole blocks (as transformers pads them) and
`block_sparse_attention`, or the splash kernel on a TPU (`splash_block_sparse_attention`).
Shorter inputs take the layer's own dense attention over the valid tokens
(t2t/nn/attention.py `MultiHeadAttention`), as transformers falls back to
``original_full``.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from t2t.errors import ConfigError
from t2t.nn import attention_kernels
from t2t.nn.sparse_attention import TokenMask, masked_softmax



def use_block_sparse(length: int, block_size: int, num_random_blocks: int) -> bool:
    """Whether block-sparse applies to ``length`` tokens: more than the (5 + 2r) blocks a
    query block attends, transformers' rule (else dense, as it falls back to full)."""
    return length > (5 + 2 * num_random_blocks) * block_size


def scored_pairs(length: int, block_size: int, num_random_blocks: int) -> int:
    """(query, key) scores one head of one `encoder_attention` layer computes for ``length``
    tokens (a FLOP count's attention term is 4 * head_dim * heads * this): length^2 when it
    attends densely, else, over the inputs padded to n whole blocks, the 2 global query
    blocks' n blocks each and the n - 2 others' 5 + r blocks each."""
    if not use_block_sparse(length, block_size, num_random_blocks):
        return length * length
    n = -(-length // block_size)
    blocks = 2 * n + (n - 2) * (5 + num_random_blocks)
    return blocks * block_size * block_size


def check_block_sparse_config(cfg) -> None:
    """ConfigError (one line) unless the BigBird fields of a TransformerConfig can work."""
    if cfg.sparse_block_size < 1:
        raise ConfigError(f"sparse_block_size must be >= 1 (tokens per BigBird block), got "
                          f"{cfg.sparse_block_size}")
    if cfg.num_random_blocks < 0:
        raise ConfigError(f"num_random_blocks must be >= 0, got {cfg.num_random_blocks}")
    if cfg.random_blocks_seed < 0:
        raise ConfigError(f"random_blocks_seed must be >= 0, got {cfg.random_blocks_seed}")


def random_block_plan(num_blocks: int, num_heads: int, num_random_blocks: int, seed: int,
                      layer_index: int) -> np.ndarray:
    """The random key blocks [heads, num_blocks, r] of each query block (rows 0, last unused)."""
    plan = np.zeros((num_heads, num_blocks, num_random_blocks), np.int32)
    for head in range(num_heads):
        rng = np.random.default_rng(np.random.SeedSequence([seed, layer_index, head]))
        for i in range(1, num_blocks - 1):
            allowed = [j for j in range(1, num_blocks - 1) if abs(j - i) > 1]
            plan[head, i] = rng.choice(allowed, num_random_blocks, replace=False)
    return plan


def _attended_blocks(plan: np.ndarray) -> np.ndarray:
    """Key blocks [heads, num_blocks - 2, 5 + r] attended by each middle query block."""
    heads, n, _ = plan.shape
    mid = np.arange(1, n - 1)
    fixed = np.stack([np.zeros_like(mid), np.full_like(mid, n - 1), mid - 1, mid, mid + 1], -1)
    fixed = np.broadcast_to(fixed, (heads, n - 2, 5))
    return np.concatenate([fixed, plan[:, 1:-1]], -1)


def block_pattern(length: int, block_size: int, plan: np.ndarray) -> np.ndarray:
    """The pattern as a numpy bool [heads, l, l] (l a multiple of ``block_size``): which
    keys each query of each head attends, before padding and packing."""
    heads, n, _ = plan.shape
    blocks = np.zeros((heads, n, n), bool)
    blocks[:, [0, -1], :] = True
    att = _attended_blocks(plan)
    for h in range(heads):
        for i in range(1, n - 1):
            blocks[h, i, att[h, i - 1]] = True
    return np.repeat(np.repeat(blocks, block_size, 1), block_size, 2)


def block_sparse_mask(length: int, block_size: int, plan: np.ndarray, valid: jax.Array,
                      segment_ids: Optional[jax.Array] = None) -> jax.Array:
    """The dense [b, h, l, l] bool mask the pattern equals (the tests' reference): the
    pattern's blocks, valid keys and (with packed ``segment_ids``) keys of the query's own
    example (`TokenMask.dense`)."""
    full = TokenMask(jnp.asarray(valid, bool), None, segment_ids).dense()
    return jnp.asarray(block_pattern(length, block_size, plan))[None] & full


def _softmax_attend(scores, mask, v_dims, v, dtype):
    return jnp.einsum(v_dims, masked_softmax(scores, mask, dtype), v)


def block_sparse_attention(q, k, v, valid, *, block_size: int, plan: np.ndarray,
                           scale: float, dtype,
                           segment_ids: Optional[jax.Array] = None) -> jax.Array:
    """BigBird-ITC attention: q, k, v [b, l, h, d], valid [b, l] -> [b, l, h, d]; l a
    multiple of ``block_size``, ``plan`` from `random_block_plan` for l / block_size blocks.
    Packed ``segment_ids`` [b, l] keep each query to its own example's keys (the global
    blocks are then the first and last example's). No attention dropout, as in the authors'
    code and transformers."""
    b, length, heads, d = q.shape
    n = length // block_size
    valid = jnp.asarray(valid, bool)
    if segment_ids is not None:
        segment_ids = jnp.asarray(segment_ids)
    q = q * jnp.asarray(scale, q.dtype)
    # global query blocks (first and last) attend every key
    gq = jnp.concatenate([q[:, :block_size], q[:, -block_size:]], 1)
    gs = jnp.einsum("bqhd,bkhd->bhqk", gq, k)
    gmask = valid[:, None, None, :]
    if segment_ids is not None:
        gseg = jnp.concatenate([segment_ids[:, :block_size], segment_ids[:, -block_size:]], 1)
        gmask = gmask & (gseg[:, None, :, None] == segment_ids[:, None, None, :])
    gout = _softmax_attend(gs, gmask, "bhqk,bkhd->bqhd", v, dtype)
    # middle query blocks gather their key blocks
    att = _attended_blocks(plan)  # [h, n-2, m], static indices
    kb = k.reshape(b, n, block_size, heads, d)
    vb = v.reshape(b, n, block_size, heads, d)
    validb = valid.reshape(b, n, block_size)
    head_ix = np.arange(heads)[:, None, None]
    kg = kb.transpose(0, 3, 1, 2, 4)[:, head_ix, att]  # [b, h, n-2, m, bs, d]
    vg = vb.transpose(0, 3, 1, 2, 4)[:, head_ix, att]
    # the window of blocks 1 and n-2 overlaps a global block: count that block once
    slot = np.ones(att.shape[1:], bool)
    slot[0, 2] = slot[-1, 4] = False
    mg = validb[:, att] & jnp.asarray(slot)[None, None, :, :, None]  # [b, h, n-2, m, bs]
    qm = q[:, block_size:-block_size].reshape(b, n - 2, block_size, heads, d)
    ms = jnp.einsum("bnqhd,bhnmkd->bhnqmk", qm, kg)
    ms = ms.reshape(b, heads, n - 2, block_size, -1)
    mmask = mg[:, :, :, None]                                     # [b, h, n-2, 1, m, bs]
    if segment_ids is not None:                                   # [b, h, n-2, bs, m, bs]
        segb = segment_ids.reshape(b, n, block_size)
        qseg = segb[:, None, 1:-1, :, None, None]
        mmask = mmask & (qseg == segb[:, att][:, :, :, None])
    mmask = mmask.reshape(mmask.shape[:4] + (-1,))
    vg = vg.reshape(b, heads, n - 2, -1, d)
    mout = _softmax_attend(ms, mmask, "bhnqk,bhnkd->bnqhd", vg, dtype)
    mout = mout.reshape(b, length - 2 * block_size, heads, d)
    return jnp.concatenate([gout[:, :block_size], mout, gout[:, block_size:]], 1).astype(dtype)


def splash_block_sparse_attention(q, k, v, segment_ids, *, block_size: int,
                                   plan: np.ndarray, scale: float) -> jax.Array:
    """BigBird-ITC by the TPU splash kernel (`attention_kernels.splash_attention`; Pallas'
    interpreter off a TPU): q, k, v [b, l, h, d], segment_ids [b, l] (0 = padding; packed
    examples numbered) -> [b, l, h, d]. The pattern is one `block_pattern` mask per head,
    from which the kernel skips every tile (128 x 128) the pattern leaves empty. The masks
    are built on the host when the step is traced: about 4 s and 0.2 GiB a layer for 12
    heads at 4,096 tokens."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
    masks = [sm.NumpyMask(m) for m in block_pattern(q.shape[1], block_size, plan)]
    segments = attention_kernels.SegmentedMask(None, segment_ids, segment_ids)
    return attention_kernels.splash_attention(q * jnp.asarray(scale, q.dtype), k, v,
                                              segments, pattern=masks)


def encoder_attention(cfg, q, k, v, valid, *, layer_index: int, scale: float, dtype,
                      segment_ids: Optional[jax.Array] = None) -> jax.Array:
    """The encoder's ``block_sparse`` self-attention: q, k, v [b, l, h, d] (projected),
    valid [b, l] bool (packed ``segment_ids`` [b, l]: each query sees its own example) ->
    [b, l, h, d], for l long enough for the pattern (`use_block_sparse`).

    The inputs are padded to whole blocks of ``cfg.sparse_block_size`` (invalid) and attend
    block-sparsely with layer ``layer_index``'s plan from ``cfg.random_blocks_seed``, by the
    splash kernel where ``cfg.attention_kernel`` resolves to it (a TPU, lengths of whole
    128-token tiles: `attention_kernels.choose`), else by `block_sparse_attention`. No
    attention dropout, as neither the authors' code nor transformers drops any here.
    """
    b, length, heads, _ = q.shape
    size, r = cfg.sparse_block_size, cfg.num_random_blocks
    if not use_block_sparse(length, size, r):
        raise ValueError(f"{length} tokens are too few for block-sparse attention with "
                         f"blocks of {size} and {r} random blocks: attend densely")
    valid = jnp.asarray(valid, bool)
    if segment_ids is not None:
        segment_ids = jnp.asarray(segment_ids)
    pad = -length % size
    if pad:
        q, k, v = (jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))) for x in (q, k, v))
        valid = jnp.pad(valid, ((0, 0), (0, pad)))
        if segment_ids is not None:
            segment_ids = jnp.pad(segment_ids, ((0, 0), (0, pad)))
    plan = random_block_plan((length + pad) // size, heads, r, cfg.random_blocks_seed,
                             layer_index)
    kernel = attention_kernels.choose(
        cfg.attention_kernel, q_len=length + pad, k_len=length + pad, bias=False,
        dropout=False, structured=True, batch_heads=(b, heads))
    if kernel == "splash":
        segments = (valid.astype(jnp.int32) if segment_ids is None
                    else jnp.where(valid, segment_ids, 0))
        out = splash_block_sparse_attention(q, k, v, segments, block_size=size, plan=plan,
                                            scale=scale).astype(dtype)
    else:
        out = block_sparse_attention(q, k, v, valid, block_size=size, plan=plan, scale=scale,
                                     dtype=dtype, segment_ids=segment_ids)
    return out[:, :length]
