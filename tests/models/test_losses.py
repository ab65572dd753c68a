"""Cross entropy, z-loss, label smoothing, MLM/NSP helpers against numpy references."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from t2t.models import losses


def _np_log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    lz = m + np.log(np.exp(x - m).sum(-1, keepdims=True))
    return x - lz, lz[..., 0]


def _reference(logits, targets, weights, z_loss, smoothing):
    """Per-token t5x cross entropy with soft targets, numpy float64."""
    v = logits.shape[-1]
    logp, log_z = _np_log_softmax(logits)
    conf = 1.0 - smoothing
    low = smoothing / (v - 1)
    soft = np.full(logits.shape, low)
    np.put_along_axis(soft, targets[..., None], conf, axis=-1)
    const = 0.0 if smoothing == 0 else -(conf * np.log(conf) + (v - 1) * low * np.log(low))
    per_tok = -(soft * logp).sum(-1) - const + z_loss * log_z ** 2
    return (per_tok * weights).sum(), (z_loss * log_z ** 2 * weights).sum(), weights.sum()


@pytest.fixture
def case():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 5, 11)).astype(np.float32) * 3
    targets = rng.integers(0, 11, size=(2, 5))
    weights = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.float32)
    return logits, targets, weights


@pytest.mark.parametrize("z_loss,smoothing", [(0.0, 0.0), (1e-4, 0.0), (0.1, 0.1)])
def test_matches_numpy_reference(case, z_loss, smoothing):
    logits, targets, weights = case
    loss, z, wsum = losses.cross_entropy_with_logits(
        jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(weights),
        z_loss=z_loss, label_smoothing=smoothing)
    ref_total, ref_z, ref_w = _reference(logits, targets, weights, z_loss, smoothing)
    assert float(wsum) == ref_w == 8
    np.testing.assert_allclose(float(loss), ref_total / ref_w, rtol=1e-5)
    np.testing.assert_allclose(float(z), ref_z / ref_w, rtol=1e-5, atol=1e-9)


def test_plain_cross_entropy_by_hand():
    # logits (0, log 3) → p(target=1) = 3/4; z = log 4.
    logits = jnp.array([[[0.0, np.log(3.0)]]])
    loss, z, _ = losses.cross_entropy_with_logits(logits, jnp.array([[1]]), z_loss=0.5)
    np.testing.assert_allclose(float(z), 0.5 * np.log(4.0) ** 2, rtol=1e-6)
    np.testing.assert_allclose(float(loss), -np.log(0.75) + 0.5 * np.log(4.0) ** 2, rtol=1e-6)


def test_loss_normalizing_factor_and_padding(case):
    logits, targets, weights = case
    a, _, _ = losses.cross_entropy_with_logits(logits, targets, weights, z_loss=0.0)
    b, _, _ = losses.cross_entropy_with_logits(logits, targets, weights, z_loss=0.0,
                                               loss_normalizing_factor=4.0)
    np.testing.assert_allclose(float(b), float(a) * 8 / 4, rtol=1e-6)
    # Changing logits at padded positions changes nothing.
    logits2 = logits.copy()
    logits2[0, 3:] = 100.0
    c, _, _ = losses.cross_entropy_with_logits(logits2, targets, weights, z_loss=0.0)
    assert float(c) == pytest.approx(float(a), rel=1e-6)
    # All-padding batch: 0, not NaN.
    d, _, w = losses.cross_entropy_with_logits(logits, targets, np.zeros_like(weights))
    assert float(d) == 0.0 and float(w) == 0.0


def test_label_smoothing_minimum_is_zero():
    v, eps = 7, 0.1
    soft = np.full((1, 1, v), eps / (v - 1))
    soft[0, 0, 2] = 1 - eps
    loss, _, _ = losses.cross_entropy_with_logits(
        jnp.log(jnp.asarray(soft, jnp.float32)), jnp.array([[2]]), z_loss=0.0,
        label_smoothing=eps)
    assert abs(float(loss)) < 1e-5
    # Any other distribution costs more.
    worse, _, _ = losses.cross_entropy_with_logits(
        jnp.zeros((1, 1, v)), jnp.array([[2]]), z_loss=0.0, label_smoothing=eps)
    assert float(worse) > 0.5


def test_bf16_logits_computed_in_float32(case):
    logits, targets, weights = case
    bf = jnp.asarray(logits, jnp.bfloat16)
    loss, _, _ = losses.cross_entropy_with_logits(bf, targets, weights)
    ref, _, w = _reference(np.asarray(bf.astype(jnp.float32)), targets, weights, 1e-4, 0.0)
    assert loss.dtype == jnp.float32
    np.testing.assert_allclose(float(loss), ref / w, rtol=1e-5)
    g = jax.grad(lambda x: losses.cross_entropy_with_logits(x, targets, weights)[0])(bf)
    assert g.dtype == jnp.bfloat16


@pytest.mark.parametrize("z_loss,smoothing", [(0.0, 0.0), (0.05, 0.2)])
def test_custom_vjp_gradients(case, z_loss, smoothing):
    logits, targets, weights = case

    def f(x):
        loss, z, _ = losses.cross_entropy_with_logits(x, targets, weights, z_loss=z_loss,
                                                      label_smoothing=smoothing)
        return loss + 3.0 * z  # exercise both cotangents

    check_grads(f, (jnp.asarray(logits),), order=1, modes=["rev"], atol=2e-2, rtol=2e-2)

    def autodiff(x):  # the same quantity with plain jnp autodiff
        v = x.shape[-1]
        logp = jax.nn.log_softmax(x)
        log_z = jax.nn.logsumexp(x, -1)
        conf, low = 1 - smoothing, smoothing / (v - 1)
        soft = low + (conf - low) * jax.nn.one_hot(targets, v)
        per = -(soft * logp).sum(-1) + 4.0 * z_loss * log_z ** 2
        return (per * weights).sum() / weights.sum()

    np.testing.assert_allclose(np.asarray(jax.grad(f)(jnp.asarray(logits))),
                               np.asarray(jax.grad(autodiff)(jnp.asarray(logits))),
                               rtol=1e-5, atol=1e-7)


def test_gather_and_mlm_loss(case):
    logits, targets, weights = case
    hidden = jnp.arange(2 * 6 * 3, dtype=jnp.float32).reshape(2, 6, 3)
    pos = jnp.array([[5, 0], [2, 2]])
    g = losses.gather_positions(hidden, pos)
    assert g.shape == (2, 2, 3)
    np.testing.assert_array_equal(np.asarray(g[0, 0]), np.asarray(hidden[0, 5]))
    np.testing.assert_array_equal(np.asarray(g[1, 1]), np.asarray(hidden[1, 2]))

    positions = jnp.array([[4, 1, 0], [3, 0, 0]])
    ids = jnp.array([[3, 4, 0], [5, 0, 0]])
    mw = jnp.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    full, w = losses.mlm_loss(jnp.asarray(logits), ids, mw, masked_positions=positions)
    picked, _ = losses.mlm_loss(losses.gather_positions(jnp.asarray(logits), positions), ids, mw)
    logp, _ = _np_log_softmax(logits)
    ref = -(logp[0, 4, 3] + logp[0, 1, 4] + logp[1, 3, 5]) / 3
    assert float(w) == 3
    np.testing.assert_allclose([float(full), float(picked)], [ref, ref], rtol=1e-5)


def test_accuracy_matches_argmax_with_ties():
    # Integer logits in bf16 over a small range: most rows tie at their maximum, and argmax
    # takes the first index; accuracy must count exactly the targets argmax picks.
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.integers(0, 3, (4, 16, 50)), jnp.bfloat16)
    argmax = np.asarray(jnp.argmax(logits, -1))
    for targets in (argmax, rng.integers(0, 50, (4, 16)),
                    np.where(rng.random((4, 16)) < 0.5, argmax, argmax + 1) % 50):
        weights = rng.random((4, 16)).astype(np.float32)
        want = float(((argmax == targets) * weights).sum() / weights.sum())
        got = float(losses.accuracy(logits, jnp.asarray(targets), jnp.asarray(weights)))
        assert got == pytest.approx(want, rel=1e-6)
    # Rows that tie: a later tied index is wrong, the first one right.
    tied = jnp.array([[1.0, 3.0, 3.0, 0.0]])
    assert float(losses.accuracy(tied, jnp.array([2]))) == 0.0
    assert float(losses.accuracy(tied, jnp.array([1]))) == 1.0


def test_nsp_loss_and_accuracy():
    logits = jnp.array([[2.0, 0.0], [0.0, 1.0], [3.0, -1.0]])
    labels = jnp.array([0, 0, 0])
    logp, _ = _np_log_softmax(np.asarray(logits))
    np.testing.assert_allclose(float(losses.nsp_loss(logits, labels)),
                               -logp[:, 0].mean(), rtol=1e-6)
    assert float(losses.accuracy(logits, labels)) == pytest.approx(2 / 3)
    assert float(losses.accuracy(logits, labels, jnp.array([0.0, 1.0, 1.0]))) == 0.5
