"""Longformer sliding-window + global attention (t2t/nn/longformer.py) against a dense
reference with an explicit l x l mask, the Encoder's plumbing, and the config checks."""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.errors import ConfigError
from t2t.nn import longformer
from t2t.nn.config import TransformerConfig
from t2t.nn.sparse_attention import TokenMask
from t2t.nn.stacks import Encoder


def dense_reference(q, k, v, gq, gk, gv, valid, global_tokens, seg, window, max_global,
                    scale):
    """The pattern as an explicit [b, l, l] mask, written out from the paper's rules."""
    q, k, v, gq, gk, gv = (np.asarray(x, np.float64) for x in (q, k, v, gq, gk, gv))
    b, l, h, d = q.shape
    out = np.zeros_like(q)
    for r in range(b):
        slots = np.flatnonzero(global_tokens[r] & valid[r])[:max_global]
        is_slot = np.zeros(l, bool)
        is_slot[slots] = True
        for i in range(l):
            same = valid[r] & (seg[r] == seg[r, i])
            if is_slot[i]:
                allowed, qi, keys, values = same, gq[r, i], gk[r], gv[r]
            else:
                near = np.abs(np.arange(l) - i) <= window // 2
                allowed, qi, keys, values = same & (near | is_slot), q[r, i], k[r], v[r]
            logits = np.einsum("hd,khd->hk", qi, keys) * scale
            logits = np.where(allowed[None], logits, -np.inf)
            with np.errstate(invalid="ignore"):      # padding rows: nothing allowed
                p = np.exp(logits - logits.max(-1, keepdims=True))
                p /= p.sum(-1, keepdims=True)
            out[r, i] = np.einsum("hk,khd->hd", p, values)
    return out


def _inputs(b=2, l=13, h=2, d=4, seed=0):
    keys = jax.random.split(jax.random.PRNGKey(seed), 6)
    return [jax.random.normal(key, (b, l, h, d), jnp.float32) for key in keys]


def _check(valid, global_tokens, seg, window, max_global, with_global_qkv=True):
    q, k, v, gq, gk, gv = _inputs(*valid.shape[:1], valid.shape[1])
    mask = TokenMask(jnp.asarray(valid), jnp.asarray(global_tokens),
                     None if seg is None else jnp.asarray(seg))
    slots = longformer.global_slots(mask.global_tokens & mask.valid, max_global,
                                    valid.shape[1], valid.shape[0])
    global_qkv = (longformer.gather(gq, slots), gk, gv) if with_global_qkv else None
    attend = jax.jit(functools.partial(longformer.sliding_window_attention, window=window,
                                       scale=0.5))      # one compile, not many eager ops
    out = attend(q, k, v, mask, slots=slots, global_qkv=global_qkv)
    if not with_global_qkv:
        gq, gk, gv = q, k, v
    ref = dense_reference(q, k, v, gq, gk, gv, valid, global_tokens,
                          np.zeros(valid.shape, int) if seg is None else seg, window,
                          max_global, 0.5)
    diff = np.abs(np.asarray(out) - ref)[valid].max()
    assert diff < 1e-5, diff


def test_window_and_global_tokens_match_the_dense_reference():
    """Length 13 (not a multiple of w/2 = 2), padding, global tokens inside and outside
    each other's windows, separate global projections: equal to the explicit mask."""
    valid = np.ones((2, 13), bool)
    valid[1, 10:] = False
    glob = np.zeros((2, 13), bool)
    glob[0, [0, 7]] = True
    glob[1, [0, 2, 11]] = True          # 11 is padding: never global
    _check(valid, glob, None, window=4, max_global=4)
    _check(valid, glob, None, window=6, max_global=4, with_global_qkv=False)


def test_no_global_tokens_and_a_window_wider_than_the_input():
    valid = np.ones((2, 9), bool)
    valid[0, 7:] = False
    none = np.zeros((2, 9), bool)
    _check(valid, none, None, window=4, max_global=0)
    _check(valid, none, None, window=40, max_global=2)


def test_packed_rows_and_global_tokens_past_the_bound():
    """Two packed examples per row attend only themselves; a row's third global token
    (max_global_tokens=2) attends and is attended locally."""
    seg = np.array([[1] * 6 + [2] * 5 + [0] * 2, [1] * 4 + [2] * 9])
    valid = seg > 0
    glob = np.zeros(seg.shape, bool)
    glob[0, [0, 6, 8]] = True
    glob[1, [4, 5]] = True
    _check(valid, glob, seg, window=4, max_global=2)


def test_memory_is_linear_in_length():
    """No intermediate of the traced computation holds l x l values (l = 1024, w = 8)."""
    l = 1024
    q = jnp.zeros((1, l, 2, 4))
    mask = TokenMask(jnp.ones((1, l), bool), jnp.zeros((1, l), bool).at[0, 0].set(True))
    slots = longformer.global_slots(mask.global_tokens, 4, l, 1)

    def f(q):
        return longformer.sliding_window_attention(q, q, q, mask, window=8, slots=slots,
                                                   scale=1.0)
    sizes = [int(np.prod(var.aval.shape)) for eqn in jax.make_jaxpr(f)(q).jaxpr.eqns
             for var in eqn.outvars]
    assert max(sizes) < l * l // 8, max(sizes)       # band: 2 heads x l x 2 x 6 + globals


def _cfg(**kw):
    base = dict(vocab_size=50, d_model=16, num_heads=2, head_dim=8, d_ff=32,
                num_encoder_layers=2, num_decoder_layers=0, position_embedding="learned",
                max_length=32, dropout_rate=0.0, pre_norm=False)
    return TransformerConfig(**{**base, **kw})


def test_encoder_with_a_window_covering_the_input_is_the_dense_encoder():
    """The plumbing: a window wider than the input and no global tokens attends like the
    dense encoder (same params; the global projections unused), padding included."""
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 11), 1, 50)
    seg = jnp.ones((2, 11), jnp.int32).at[1, 8:].set(0)
    sparse = Encoder(_cfg(attention_pattern="sliding_window", attention_window=(24,)))
    params = jax.jit(sparse.init)(jax.random.PRNGKey(0), tokens, seg)
    assert "query_global" in params["params"]["layers"]["layer_1"]["self_attention"]
    dense = Encoder(_cfg())
    out = jax.jit(sparse.apply)(params, tokens, seg)
    ref = jax.jit(dense.apply)(params, tokens, seg)
    np.testing.assert_allclose(np.asarray(out)[seg > 0], np.asarray(ref)[seg > 0], atol=1e-5)


def test_encoder_windows_per_layer_and_global_tokens_change_the_output():
    tokens = jax.random.randint(jax.random.PRNGKey(1), (1, 12), 1, 50)
    narrow = Encoder(_cfg(attention_pattern="sliding_window", attention_window=(2, 4)))
    params = jax.jit(narrow.init)(jax.random.PRNGKey(0), tokens)   # jitted: one compile,
    wide = Encoder(_cfg(attention_pattern="sliding_window", attention_window=(2, 8)))
    a, b = jax.jit(narrow.apply)(params, tokens), jax.jit(wide.apply)(params, tokens)
    assert not np.allclose(a, b)                                  # not hundreds of eager ones
    first = jnp.zeros((1, 12), jnp.int32).at[0, 0].set(1)
    c = jax.jit(narrow.apply)(params, tokens, global_tokens=first)
    assert not np.allclose(a, c)
    grads = jax.jit(jax.grad(lambda p: narrow.apply(p, tokens, global_tokens=first).sum()))(
        params)
    assert all(np.isfinite(x).all() for x in jax.tree_util.tree_leaves(grads))


@pytest.mark.parametrize("changes, words", [
    (dict(attention_window=(3,)), "positive and even"),
    (dict(attention_window=(4, 4, 4)), "one per encoder layer"),
    (dict(attention_window=(4, 6), scan_layers=True), "scan_layers=False"),
    (dict(position_embedding="relative"), "relative position bias"),
    (dict(linformer_k=4), "linformer_k"),
    (dict(max_global_tokens=-1), "max_global_tokens"),
])
def test_config_errors_say_what_to_change(changes, words):
    with pytest.raises(ConfigError, match=words):
        _cfg(attention_pattern="sliding_window", **changes)


def test_global_tokens_need_the_sliding_window():
    tokens = jnp.ones((1, 4), jnp.int32)
    with pytest.raises(ConfigError, match="sliding_window"):
        Encoder(_cfg()).init(jax.random.PRNGKey(0), tokens, global_tokens=tokens)


def test_an_int_window_is_one_window_for_every_layer():
    cfg = _cfg(attention_pattern="sliding_window", attention_window=6)
    assert cfg.attention_window == (6,)
    assert longformer.layer_window(cfg, 1) == 6
    assert longformer.layer_window(_cfg(attention_pattern="sliding_window",
                                        attention_window=[2, 4]), 1) == 4


@pytest.mark.parametrize("gradients", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_the_splash_kernel_path_matches_the_xla_path(gradients):
    """The TPU path (splash's banded mask over [global slots, tokens], in Pallas'
    interpreter here): the same outputs (and gradients, ~8 s) as the XLA path on packed and
    padded rows of 256 tokens with global tokens."""
    b, l = 2, 256
    q, k, v, gq, gk, gv = _inputs(b, l, h=2, d=8, seed=3)
    seg = np.array([[1] * 100 + [2] * 156, [1] * 200 + [0] * 56])
    glob = np.zeros((b, l), bool)
    glob[0, [0, 100, 150]] = True
    glob[1, [0, 5]] = True
    mask = TokenMask(jnp.asarray(seg > 0), jnp.asarray(glob), jnp.asarray(seg))
    slots = longformer.global_slots(mask.global_tokens, 4, l, b)

    def run(kernel, q, k, v):
        global_qkv = (longformer.gather(gq, slots), gk, gv)
        return longformer.sliding_window_attention(q, k, v, mask, window=32, slots=slots,
                                                   scale=0.3, global_qkv=global_qkv,
                                                   kernel=kernel)
    real = seg > 0
    xla, splash = run("xla", q, k, v), run("splash", q, k, v)
    assert float(jnp.abs(xla - splash)[real].max()) < 1e-5
    if not gradients:
        return
    weights = jnp.asarray(real, jnp.float32)[:, :, None, None]
    grads = [jax.grad(lambda *x: jnp.sum(run(kernel, *x) * weights * x[0]),
                      argnums=(0, 1, 2))(q, k, v) for kernel in ("xla", "splash")]
    for a, s in zip(*grads):
        assert float(jnp.abs(a - s).max()) < 1e-4


def test_one_window_for_every_layer_scans_the_layers():
    """scan_layers=True (the TPU hardware configs'): the same outputs as the layer loop."""
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 12), 1, 50)
    seg = jnp.ones((2, 12), jnp.int32).at[1, 9:].set(0)
    first = jnp.zeros((2, 12), jnp.int32).at[:, 0].set(1)
    loop = Encoder(_cfg(attention_pattern="sliding_window", attention_window=(4,)))
    params = nn.unbox(jax.jit(loop.init)(jax.random.PRNGKey(0), tokens, seg))["params"]
    layers = params["layers"]
    stacked = {**params, "layers": {"layer": jax.tree.map(
        lambda *x: jnp.stack(x), layers["layer_0"], layers["layer_1"])}}
    scan = Encoder(_cfg(attention_pattern="sliding_window", attention_window=(4,),
                        scan_layers=True))
    out = jax.jit(scan.apply)({"params": stacked}, tokens, seg, global_tokens=first)
    ref = jax.jit(loop.apply)({"params": params}, tokens, seg, global_tokens=first)
    np.testing.assert_allclose(np.asarray(out)[seg > 0], np.asarray(ref)[seg > 0], atol=1e-5)
