"""t2t's dropout masks are jax.random.bernoulli's, bit for bit, and its Dropout is flax's."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.random import threefry2x32_p
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from t2t.nn import dropout


def test_threefry_is_jaxs_hash():
    rng = np.random.default_rng(0)
    k1, k2 = (jnp.uint32(v) for v in rng.integers(0, 2 ** 32, 2, dtype=np.uint64))
    x1, x2 = (jnp.asarray(rng.integers(0, 2 ** 32, (6, 7), dtype=np.uint64), jnp.uint32)
              for _ in range(2))
    ours = dropout.threefry2x32(k1, k2, x1, x2)
    jaxs = threefry2x32_p.bind(k1, k2, x1, x2)
    for a, b in zip(ours, jaxs):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("shape", [(1,), (3, 5), (2, 3, 4, 7), (8, 4, 64, 64)])
@pytest.mark.parametrize("keep_prob", [0.9, 0.5, 0.123, 0.999])
def test_keep_mask_equals_bernoulli(shape, keep_prob):
    for key in (jax.random.key(3), jax.random.PRNGKey(11),
                jax.random.fold_in(jax.random.key(0), 5)):
        want = jax.random.bernoulli(key, keep_prob, shape)
        got = jax.jit(dropout.keep_mask, static_argnums=(1, 2))(key, keep_prob, shape)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert abs(float(got.mean()) - keep_prob) < 5 / np.sqrt(got.size) + 1e-9


def test_other_prng_implementations_fall_back_to_jax():
    key = jax.random.key(0, impl="rbg")
    np.testing.assert_array_equal(np.asarray(dropout.keep_mask(key, 0.9, (4, 9))),
                                  np.asarray(jax.random.bernoulli(key, 0.9, (4, 9))))


@pytest.mark.parametrize("broadcast_dims", [(), (0,), (-1,), (1, 2)])
def test_dropout_module_equals_flax(broadcast_dims):
    x = jax.random.normal(jax.random.key(1), (4, 6, 5, 8))
    rngs = {"dropout": jax.random.key(7)}
    ours = dropout.Dropout(0.1, broadcast_dims=broadcast_dims, deterministic=False)
    flax = nn.Dropout(0.1, broadcast_dims=broadcast_dims, deterministic=False)
    got = ours.apply({}, x, rngs=rngs)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(flax.apply({}, x, rngs=rngs)))
    assert (np.asarray(got) == 0).any()
    evaluation = dropout.Dropout(0.1, broadcast_dims=broadcast_dims)
    np.testing.assert_array_equal(np.asarray(evaluation.apply({}, x, deterministic=True)),
                                  np.asarray(x))


def test_mask_is_the_same_when_the_batch_is_sharded():
    mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
    key = jax.random.key(2)
    x = jax.device_put(jnp.ones((8, 16, 32)), NamedSharding(mesh, P("data")))
    run = jax.jit(lambda x: jnp.where(dropout.keep_mask(key, 0.9, x.shape), x, 0.0))
    np.testing.assert_array_equal(np.asarray(run(x)),
                                  np.asarray(jax.random.bernoulli(key, 0.9, x.shape), np.float32))


def _post_norm_loss(w, x, keys):
    """Two residual blocks with dropout and a LayerNorm after the sum (BERT, BART): each
    mask is read by the forward select, the backward one and the norm's reductions."""
    for i in range(2):
        h = x @ w
        keep = dropout.keep_mask(keys[i], 0.9, h.shape)
        x = x + jnp.where(keep, h / 0.9, 0.0)
        x = (x - x.mean(-1, keepdims=True)) * jax.lax.rsqrt(x.var(-1, keepdims=True) + 1e-6)
    return jnp.sum(x ** 2)


def test_each_mask_is_hashed_once_in_a_compiled_train_step():
    """XLA:CPU copies cheap elementwise chains into every fusion that reads them: unchecked,
    each of these two masks' 20 Threefry rounds were compiled 12 times over."""
    args = (jnp.eye(16) * 0.5, jnp.ones((4, 8, 16)), jax.random.split(jax.random.key(0)))
    hlo = jax.jit(jax.grad(_post_norm_loss)).lower(*args).compile().as_text()
    assert hlo.count("shift-left(") == 2 * 20
