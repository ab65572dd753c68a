"""Norms, feed-forward variants, attention masks and the attention kernel."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.nn.dense import add_bias
from t2t.nn.attention import (causal_mask, dot_product_attention, prefix_lm_mask,
                              segment_mask)
from t2t.nn.mlp import GATED, MlpBlock
from t2t.nn.norms import LayerNorm, RMSNorm

from tests.nn.helpers import T5_TINY, init, max_diff


def test_layernorm_and_rmsnorm_match_formulas():
    x = jax.random.normal(jax.random.PRNGKey(0), (3, 5, 16)) * 3 + 1
    ln = LayerNorm(eps=1e-12)
    p = init(ln, x)
    xn = np.asarray(x, np.float64)
    want = (xn - xn.mean(-1, keepdims=True)) / np.sqrt(xn.var(-1, keepdims=True) + 1e-12)
    assert max_diff(ln.apply({"params": p}, x), want) < 1e-5
    rms = RMSNorm(eps=1e-6)
    p = init(rms, x)
    want = xn / np.sqrt((xn ** 2).mean(-1, keepdims=True) + 1e-6)
    assert max_diff(rms.apply({"params": p}, x), want) < 1e-5
    assert set(p) == {"scale"}  # T5's norm has no bias


@pytest.mark.parametrize("cls", [LayerNorm, RMSNorm])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_norm_backward_matches_autodiff(cls, dtype):
    """The hand-written VJP of `normalize` equals autodiff of the plain formula."""
    keys = jax.random.split(jax.random.PRNGKey(1), 4)
    x = (jax.random.normal(keys[0], (2, 7, 24)) * 2 + 0.5).astype(dtype)
    cotangent = jax.random.normal(keys[1], (2, 7, 24))
    eps = 1e-5
    norm = cls(eps=eps)
    params = {k: v + 0.1 * jax.random.normal(keys[2], v.shape) for k, v in init(norm, x).items()}

    def reference(params, x):
        x = x.astype(jnp.float32)
        if "bias" in params:
            x = x - jnp.mean(x, -1, keepdims=True)
        y = x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + eps) * params["scale"]
        return y + params["bias"] if "bias" in params else y

    def loss(fn):
        return lambda p, x: jnp.sum(fn(p, x).astype(jnp.float32) * cotangent)

    got = jax.grad(loss(lambda p, x: norm.apply({"params": p}, x)), argnums=(0, 1))(params, x)
    want = jax.grad(loss(reference), argnums=(0, 1))(params, x)
    assert got[1].dtype == dtype
    tol = 1e-5 if dtype == jnp.float32 else 1e-2
    for name in params:
        np.testing.assert_allclose(got[0][name], want[0][name], rtol=tol, atol=tol, err_msg=name)
    np.testing.assert_allclose(np.asarray(got[1], np.float32), np.asarray(want[1], np.float32),
                               rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_bias_gradient_matches_autodiff(dtype):
    """`add_bias`'s ones-product bias gradient equals autodiff's sum over the leading dims,
    for a multi-dim bias ([heads, head_dim]) too; the input gradient passes through."""
    keys = jax.random.split(jax.random.PRNGKey(2), 3)
    y = jax.random.normal(keys[0], (4, 6, 3, 5)).astype(dtype)
    bias = jax.random.normal(keys[1], (3, 5))
    cotangent = jax.random.normal(keys[2], (4, 6, 3, 5))

    def loss(add):
        return lambda y, b: jnp.sum(add(y, b).astype(jnp.float32) * cotangent)

    got = jax.grad(loss(add_bias), argnums=(0, 1))(y, bias)
    want = jax.grad(loss(lambda y, b: y + b.astype(y.dtype)), argnums=(0, 1))(y, bias)
    assert got[0].dtype == dtype and got[1].dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(got[0], np.float32), np.asarray(want[0], np.float32))
    # Exactly the float32 sum of the cotangent as it arrives (rounded to y's dtype).
    arriving = np.asarray(cotangent.astype(dtype), np.float64)
    np.testing.assert_allclose(got[1], arriving.sum((0, 1)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,acts", sorted(GATED.items()))
def test_gated_mlp_is_product_of_branches(name, acts):
    cfg = T5_TINY.replace(mlp_activations=acts)
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 3, 32))
    mlp = MlpBlock(cfg)
    p = init(mlp, x)
    assert set(p) == {"wi_0", "wi_1", "wo"}
    fns = {"sigmoid": jax.nn.sigmoid, "gelu_tanh": lambda v: jax.nn.gelu(v, approximate=True),
           "relu": jax.nn.relu, "silu": jax.nn.silu, "selu": jax.nn.selu, "linear": lambda v: v}
    h = fns[acts[0]](x @ p["wi_0"]["kernel"]) * fns[acts[1]](x @ p["wi_1"]["kernel"])
    assert max_diff(mlp.apply({"params": p}, x), h @ p["wo"]["kernel"]) < 1e-5


def test_exact_and_tanh_gelu_differ():
    cfg = T5_TINY.replace(mlp_activations=("gelu",))
    x = jax.random.normal(jax.random.PRNGKey(2), (1, 4, 32))
    p = init(MlpBlock(cfg), x)
    exact = MlpBlock(cfg).apply({"params": p}, x)
    tanh = MlpBlock(cfg.replace(mlp_activations=("gelu_tanh",))).apply({"params": p}, x)
    want = jax.nn.gelu(x @ p["wi"]["kernel"], approximate=False) @ p["wo"]["kernel"]
    assert max_diff(exact, want) < 1e-5
    assert 1e-7 < max_diff(exact, tanh) < 1e-2


def test_masks():
    seg = jnp.array([[1, 1, 2, 2, 0]])
    m = np.asarray(segment_mask(seg, seg))[0, 0]
    assert m[0, 1] and not m[1, 2] and m[3, 2] and not m[2, 4] and not m[4, 4]
    c = np.asarray(causal_mask(4))[0, 0]
    np.testing.assert_array_equal(c, np.tril(np.ones((4, 4), bool)))
    p = np.asarray(prefix_lm_mask(jnp.array([[1, 1, 0, 0]])))[0, 0]
    want = np.tril(np.ones((4, 4), bool))
    want[0, 1] = True   # prefix positions see each other bidirectionally
    np.testing.assert_array_equal(p, want)


def test_fused_attention_matches_plain():
    k1, k2, k3, k4 = jax.random.split(jax.random.PRNGKey(0), 4)
    q = jax.random.normal(k1, (2, 5, 4, 8))
    k = jax.random.normal(k2, (2, 7, 4, 8))
    v = jax.random.normal(k3, (2, 7, 4, 8))
    bias = jax.random.normal(k4, (1, 4, 5, 7))
    mask = segment_mask(jnp.array([[1, 1, 1, 2, 2], [1, 1, 1, 1, 1]]),
                        jnp.array([[1, 1, 1, 2, 2, 2, 0], [1, 1, 1, 1, 1, 0, 0]]))
    kw = dict(scale=8 ** -0.5, dropout_rate=0.0, dropout_rng=None, deterministic=True,
              dtype=jnp.float32)
    plain = dot_product_attention(q, k, v, mask, bias, **kw)
    fused = dot_product_attention(q, k, v, mask, bias, kernel="cudnn", **kw)
    assert max_diff(plain, fused) < 1e-5


def test_masked_keys_get_no_weight():
    """Changing a masked key/value leaves the output unchanged."""
    q = jax.random.normal(jax.random.PRNGKey(0), (1, 3, 2, 4))
    kv = jax.random.normal(jax.random.PRNGKey(1), (1, 4, 2, 4))
    mask = segment_mask(jnp.array([[1, 1, 1]]), jnp.array([[1, 1, 1, 0]]))
    kw = dict(scale=0.5, dropout_rate=0.0, dropout_rng=None, deterministic=True,
              dtype=jnp.float32)
    a = dot_product_attention(q, kv, kv, mask, None, **kw)
    kv2 = kv.at[:, 3].set(100.0)
    b = dot_product_attention(q, kv2, kv2, mask, None, **kw)
    assert max_diff(a, b) == 0.0
