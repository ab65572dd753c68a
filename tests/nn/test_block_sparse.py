"""BigBird block-sparse attention against dense attention under its explicit mask."""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType

from t2t.errors import ConfigError
from t2t.nn.block_sparse import (
    block_sparse_attention,
    block_sparse_mask,
    encoder_attention,
    random_block_plan,
    scored_pairs,
    use_block_sparse,
)
from t2t.nn.attention import MultiHeadAttention
from t2t.nn.config import TransformerConfig
from t2t.nn.sparse_attention import TokenMask


@functools.partial(jax.jit, static_argnames="scale")   # one compile, not many eager ops
def _dense(q, k, v, mask, scale):
    s = jnp.einsum("bqhd,bkhd->bhqk", q * scale, k)
    s = jnp.where(mask, s, -1e9)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1), v)


def test_equals_dense_under_mask_on_padded_batch():
    bs, r, heads, d, length = 4, 1, 3, 8, 48
    assert use_block_sparse(length, bs, r)
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    q, k, v = (jax.random.normal(x, (2, length, heads, d)) for x in keys)
    valid = jnp.arange(length)[None] < jnp.array([[length], [37]])
    plan = random_block_plan(length // bs, heads, r, seed=3, layer_index=1)
    out = jax.jit(functools.partial(block_sparse_attention, block_size=bs, plan=plan,
                                    scale=d**-0.5, dtype=jnp.float32))(q, k, v, valid)
    ref = _dense(q, k, v, block_sparse_mask(length, bs, plan, valid), d**-0.5)
    np.testing.assert_allclose(out, ref, atol=1e-6)


def test_plan_reproducible_differs_and_obeys_exclusions():
    n, heads, r = 12, 4, 3
    a = random_block_plan(n, heads, r, seed=7, layer_index=0)
    np.testing.assert_array_equal(a, random_block_plan(n, heads, r, seed=7, layer_index=0))
    assert not np.array_equal(a, random_block_plan(n, heads, r, seed=7, layer_index=1))
    assert not np.array_equal(a[0], a[1])
    for h in range(heads):
        for i in range(1, n - 1):
            row = a[h, i]
            assert len(set(row)) == r
            assert all(1 <= j <= n - 2 and abs(j - i) > 1 for j in row)


def test_no_length_squared_intermediate():
    bs, r, heads, d, length = 4, 1, 2, 8, 64
    plan = random_block_plan(length // bs, heads, r, seed=0, layer_index=0)
    x = jnp.zeros((1, length, heads, d))
    valid = jnp.ones((1, length), bool)
    jaxpr = jax.make_jaxpr(lambda q, k, v, m: block_sparse_attention(
        q, k, v, m, block_size=bs, plan=plan, scale=1.0, dtype=jnp.float32))(x, x, x, valid)
    for eqn in jaxpr.jaxpr.eqns:
        for var in eqn.outvars:
            shape = getattr(var.aval, "shape", ())
            assert int(np.prod(shape)) < heads * length * length, (eqn.primitive, shape)


# ----------------------------------------------------------------------- encoder_attention
def _qkv(length, heads=2, d=8, batch=2, seed=0):
    keys = jax.random.split(jax.random.PRNGKey(seed), 3)
    return tuple(jax.random.normal(x, (batch, length, heads, d)) for x in keys)


def _bigbird_config(**fields):
    return TransformerConfig(**{"attention_pattern": "block_sparse", "dropout_rate": 0.0,
                                "position_embedding": "learned", "scan_layers": False,
                                **fields})


def _attention_layer(cfg, x, mask, rng=None):
    """MultiHeadAttention(cfg) self-attention over x [b, l, d_model] under `mask` (a
    TokenMask or a dense array), parameters from PRNGKey(0); attention dropout with `rng`."""
    layer = MultiHeadAttention(cfg, deterministic=rng is None)
    params = jax.jit(layer.init)(jax.random.PRNGKey(0), x, x, mask)
    return jax.jit(lambda x, m, r: layer.apply(params, x, x, m, rngs=r))(
        x, mask, None if rng is None else {"dropout": rng})


def test_short_inputs_take_the_layers_dense_attention_over_valid_tokens():
    """Inputs of at most (5 + 2 * num_random_blocks) blocks, padded and packed: the layer's
    output is the same layer's dense attention under the explicit mask (valid keys of the
    query's own example), attention dropout included (transformers' original_full)."""
    cfg = _bigbird_config(sparse_block_size=4, num_random_blocks=1, d_model=16, num_heads=2,
                          head_dim=8, attention_dropout_rate=0.3)
    length = 28                         # = (5 + 2) blocks: too short for the pattern
    assert not use_block_sparse(length, 4, 1)
    x = jax.random.normal(jax.random.PRNGKey(1), (2, length, 16))
    segments = np.zeros((2, length), np.int32)
    segments[0, :11], segments[0, 11:] = 1, 2
    segments[1, :19] = 1                                # then padding
    segments = jnp.asarray(segments)
    mask = TokenMask(segments > 0, None, segments)
    explicit = ((segments > 0)[:, None, None, :]
                & (segments[:, None, :, None] == segments[:, None, None, :]))
    np.testing.assert_array_equal(mask.dense(), explicit)
    dense = cfg.replace(attention_pattern="dense")
    rng = jax.random.PRNGKey(2)
    for key in (None, rng):
        np.testing.assert_array_equal(_attention_layer(cfg, x, mask, key),
                                      _attention_layer(dense, x, explicit, key))
    dropped = _attention_layer(cfg, x, mask, rng) - _attention_layer(cfg, x, mask)
    assert np.abs(np.asarray(dropped)).max() > 0.05       # something dropped


def test_encoder_attention_wants_inputs_long_enough_for_the_pattern():
    q, k, v = _qkv(28)
    with pytest.raises(ValueError, match="too few"):
        encoder_attention(_bigbird_config(sparse_block_size=4, num_random_blocks=1), q, k, v,
                          jnp.ones((2, 28), bool), layer_index=0, scale=0.5,
                          dtype=jnp.float32)


def test_encoder_attention_pads_to_whole_blocks_and_uses_the_layer_plan():
    cfg = _bigbird_config(sparse_block_size=4, num_random_blocks=2, random_blocks_seed=5)
    length, padded = 46, 48             # 12 blocks after padding, as transformers pads
    q, k, v = _qkv(length, heads=3)
    valid = jnp.arange(length)[None] < jnp.array([[length], [39]])
    for layer in (0, 3):
        out = jax.jit(functools.partial(encoder_attention, cfg, layer_index=layer, scale=0.4,
                                        dtype=jnp.float32))(q, k, v, valid)
        plan = random_block_plan(padded // 4, 3, 2, seed=5, layer_index=layer)
        mask = block_sparse_mask(padded, 4, plan, jnp.pad(valid, ((0, 0), (0, 2))))
        ref = _dense(q, k, v, mask[:, :, :length, :length], 0.4)
        np.testing.assert_allclose(out, ref, atol=1e-6)
    other = jax.jit(functools.partial(encoder_attention, cfg, layer_index=1, scale=0.4,
                                      dtype=jnp.float32))(q, k, v, valid)
    assert np.abs(np.asarray(other - out)).max() > 1e-3   # another layer, another plan


def test_the_block_sparse_path_drops_no_attention_weights():
    """Block-sparse inputs (10 blocks) attend without attention dropout, as neither the
    authors' code nor transformers drops any there: the layer under a dropout rng equals
    its deterministic output (short inputs drop: the test above)."""
    cfg = _bigbird_config(sparse_block_size=4, num_random_blocks=1, d_model=16, num_heads=2,
                          head_dim=8, attention_dropout_rate=0.3)
    x = jax.random.normal(jax.random.PRNGKey(1), (1, 40, 16))
    mask = TokenMask(jnp.ones((1, 40), bool))
    np.testing.assert_array_equal(_attention_layer(cfg, x, mask, jax.random.PRNGKey(2)),
                                  _attention_layer(cfg, x, mask))


@pytest.mark.parametrize("field, value", [("sparse_block_size", 0), ("num_random_blocks", -1),
                                          ("random_blocks_seed", -2)])
def test_bad_block_sparse_fields_are_one_line_config_errors(field, value):
    with pytest.raises(ConfigError, match=field):
        _bigbird_config(**{field: value})


def test_packed_examples_attend_only_within_themselves():
    cfg = _bigbird_config(sparse_block_size=4, num_random_blocks=1, random_blocks_seed=2)
    length = 50                                        # padded to 52 = 13 blocks
    q, k, v = _qkv(length)
    segments = np.zeros((2, length), np.int32)
    segments[0, :21], segments[0, 21:44], segments[0, 44:] = 1, 2, 3
    segments[1, :9], segments[1, 9:31] = 1, 2          # then padding
    segments = jnp.asarray(segments)
    valid = segments > 0
    out = jax.jit(functools.partial(encoder_attention, cfg, layer_index=2, scale=0.3,
                                    dtype=jnp.float32))(q, k, v, valid, segment_ids=segments)
    plan = random_block_plan(13, 2, 1, seed=2, layer_index=2)
    pad = ((0, 0), (0, 2))
    mask = block_sparse_mask(52, 4, plan, jnp.pad(valid, pad), jnp.pad(segments, pad))
    ref = _dense(q, k, v, mask[:, :, :length, :length], 0.3)
    np.testing.assert_allclose(np.asarray(out)[valid], np.asarray(ref)[valid], atol=1e-6)


def test_scored_pairs_count_the_score_matrices_computed():
    assert scored_pairs(28, 4, 1) == 28 * 28                       # dense fallback
    # 46 tokens -> 12 blocks of 4: 2 global blocks x 48 keys + 10 blocks x (5 + 2) blocks
    assert scored_pairs(46, 4, 2) == 2 * 4 * 48 + 10 * 4 * 7 * 4
    # the shapes of the score einsums in the traced attention sum to the same count
    q, k, v = _qkv(46, heads=1, batch=1)
    cfg = _bigbird_config(sparse_block_size=4, num_random_blocks=2)
    jaxpr = jax.make_jaxpr(lambda q, k, v: encoder_attention(
        cfg, q, k, v, jnp.ones((1, 46), bool), layer_index=0, scale=1.0,
        dtype=jnp.float32))(q, k, v)
    scores = [e.outvars[0].aval.size for e in jaxpr.jaxpr.eqns
              if e.primitive.name == "dot_general" and e.invars[1].aval.shape[-1] == 8
              and e.invars[0].aval.shape[-1] == 8]
    assert sum(scores) == scored_pairs(46, 4, 2)


def test_splash_kernel_equals_the_gathered_attention():
    """`attention_kernel='splash'` (Pallas' interpreter on the CPU): the pattern as per-head
    block-sparse masks, padding and packing as segment ids, gives the gathered path's
    output on every real token; 250 tokens pad to 256 = two 128-wide tiles."""
    cfg = _bigbird_config(sparse_block_size=16, num_random_blocks=1, random_blocks_seed=4)
    length = 250
    q, k, v = _qkv(length, heads=2)
    segments = np.zeros((2, length), np.int32)
    segments[0, :250] = 1
    segments[1, :100], segments[1, 100:201] = 1, 2
    segments = jnp.asarray(segments)
    valid = segments > 0
    kw = dict(layer_index=1, scale=0.3, dtype=jnp.float32)
    gathered = jax.jit(functools.partial(encoder_attention, cfg, **kw))(
        q, k, v, valid, segment_ids=segments)
    splash = jax.jit(functools.partial(encoder_attention, cfg.replace(attention_kernel="splash"),
                                       **kw))(q, k, v, valid, segment_ids=segments)
    diff = np.abs(np.asarray(splash) - np.asarray(gathered))[np.asarray(valid)].max()
    assert diff < 1e-5, diff


def test_splash_kernel_under_a_mesh_splits_the_batch():
    """On a 4 x 2 (fsdp x tensor) mesh of the CPU devices (t2t's Auto axes), batch on fsdp
    and heads on tensor: each device runs the kernel on its rows with every head's mask;
    the output is the gathered path's."""
    cfg = _bigbird_config(sparse_block_size=16, num_random_blocks=1)
    q, k, v = _qkv(256, heads=2, batch=4)
    valid = jnp.arange(256)[None] < jnp.array([[256], [200], [130], [256]])
    kw = dict(layer_index=0, scale=0.3, dtype=jnp.float32)
    gathered = jax.jit(functools.partial(encoder_attention, cfg, **kw))(q, k, v, valid)
    mesh = jax.make_mesh((4, 2), ("fsdp", "tensor"), axis_types=(AxisType.Auto,) * 2)
    with jax.set_mesh(mesh), nn.logical_axis_rules([("batch", "fsdp"), ("heads", "tensor")]):
        splash = jax.jit(lambda q, k, v, m: encoder_attention(
            cfg.replace(attention_kernel="splash"), q, k, v, m, **kw))(q, k, v, valid)
    diff = np.abs(np.asarray(splash) - np.asarray(gathered))[np.asarray(valid)].max()
    assert diff < 1e-5, diff
