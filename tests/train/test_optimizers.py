"""Schedules, weight-decay mask, Adafactor and gradient accumulation."""
import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from t2t.models import losses
from t2t.train import optimizers as opt


def test_linear_warmup_linear_decay():
    s = opt.linear_warmup_linear_decay(1e-4, warmup_steps=10, total_steps=110)
    got = [float(s(t)) for t in (0, 5, 10, 60, 110, 200)]
    np.testing.assert_allclose(got, [0.0, 5e-5, 1e-4, 5e-5, 0.0, 0.0], atol=1e-12)
    with pytest.raises(ValueError, match="warmup_steps"):
        opt.linear_warmup_linear_decay(1.0, 20, 10)


def test_rsqrt_t5():
    s = opt.rsqrt(warmup_steps=10_000)
    got = [float(s(t)) for t in (0, 1, 5_000, 10_000, 40_000, 1_000_000)]
    np.testing.assert_allclose(got, [0.01, 0.01, 0.01, 0.01, 0.005, 0.001], rtol=1e-6)
    assert float(opt.rsqrt(2.0, warmup_steps=0)(0)) == 2.0  # no division by zero
    assert float(opt.rsqrt(2.0, warmup_steps=0)(4)) == 1.0


def test_cosine_and_constant():
    s = opt.cosine(1.0, warmup_steps=10, total_steps=110, end=0.1)
    got = [float(s(t)) for t in (0, 5, 10, 60, 110)]
    np.testing.assert_allclose(got, [0.0, 0.5, 1.0, 0.55, 0.1], rtol=1e-5, atol=1e-7)
    assert float(opt.constant(3e-4)(12345)) == pytest.approx(3e-4)


def test_make_schedule_and_optimizer_factories():
    s = opt.make_schedule("rsqrt", base_learning_rate=1.0, warmup_steps=100)
    assert float(s(400)) == pytest.approx(0.05)
    with pytest.raises(ValueError, match="unknown schedule 'nope'"):
        opt.make_schedule("nope")
    with pytest.raises(ValueError, match="unknown optimizer 'sgdx'.*adafactor_t5"):
        opt.make_optimizer("sgdx", 0.1)
    from t2t.run import configurables   # registers make_optimizer and make_schedule with gin
    gin.parse_config("""
        make_optimizer.name = 'adamw_bert'
        make_optimizer.learning_rate = @make_schedule()
        make_optimizer.weight_decay = 0.5
        make_schedule.name = 'constant'
        make_schedule.learning_rate = 0.1
    """)
    try:
        tx = configurables.make_optimizer()
    finally:
        gin.clear_config()
    p = {"w": jnp.ones(3)}
    upd, _ = tx.update({"w": jnp.zeros(3)}, tx.init(p), p)
    np.testing.assert_allclose(np.asarray(upd["w"]), -0.1 * 0.5 * np.ones(3), rtol=1e-6)


PARAMS = {
    "encoder": {
        "layers_0": {
            "attention": {"query": {"kernel": jnp.ones((4, 4)), "bias": jnp.ones(4)}},
            "pre_attention_norm": {"scale": jnp.ones(4)},
            "mlp": {"wi": {"kernel": jnp.ones((4, 8))}},
        },
        "LayerNorm_0": {"weight": jnp.ones(4)},
    },
    "embedding_norm": {"bias": jnp.ones(4), "scale": jnp.ones(4)},
    "token_embedder": {"embedding": jnp.ones((10, 4))},
}


def test_decay_mask():
    m = opt.decay_mask(PARAMS)
    assert m["encoder"]["layers_0"]["attention"]["query"]["kernel"] is True
    assert m["encoder"]["layers_0"]["attention"]["query"]["bias"] is False
    assert m["encoder"]["layers_0"]["pre_attention_norm"]["scale"] is False
    assert m["encoder"]["layers_0"]["mlp"]["wi"]["kernel"] is True
    assert m["encoder"]["LayerNorm_0"]["weight"] is False  # under a norm module
    assert m["embedding_norm"]["bias"] is False and m["embedding_norm"]["scale"] is False
    assert m["token_embedder"]["embedding"] is True


def test_adamw_bert_decays_only_masked_in():
    tx = opt.adamw_bert(0.1, weight_decay=0.5)
    zeros = jax.tree.map(jnp.zeros_like, PARAMS)
    upd, _ = jax.jit(tx.update)(zeros, tx.init(PARAMS), PARAMS)  # Adam part: 0 for 0 grads
    m = opt.decay_mask(PARAMS)
    for u, keep in zip(jax.tree.leaves(upd), jax.tree.leaves(m)):
        np.testing.assert_allclose(np.asarray(u), -0.05 if keep else 0.0, rtol=1e-6)


def test_adamw_bert_clips_global_norm():
    tx = opt.adamw_bert(1.0, weight_decay=0.0, clip=1.0)
    p = {"a": jnp.zeros(4)}
    g = {"a": jnp.array([30.0, 40.0, 0.0, 0.0])}
    st = tx.init(p)
    clipped = optax.clip_by_global_norm(1.0).update(g, optax.EmptyState())[0]
    np.testing.assert_allclose(np.asarray(clipped["a"]), [0.6, 0.8, 0, 0], rtol=1e-6)
    # With clipping, Adam's second moment sees the clipped gradient.
    _, st = tx.update(g, st, p)
    nu = st[1][0].nu["a"]
    np.testing.assert_allclose(np.asarray(nu), 0.001 * np.array([0.36, 0.64, 0, 0]), rtol=1e-5)


def test_adafactor_t5_factored_and_decreases_quadratic():
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.normal(size=(256, 128)), jnp.float32),
              "b": jnp.asarray(rng.normal(size=(16,)), jnp.float32)}
    target = jax.tree.map(lambda x: 0.3 * x, params)

    def loss(p):
        return sum(jnp.sum((p[k] - target[k]) ** 2) for k in p)

    tx = opt.make_optimizer("adafactor_t5", opt.rsqrt(1.0, warmup_steps=4))
    state = tx.init(params)
    # Factored: no full [256, 128] second-moment accumulator in the state.
    shapes = {tuple(x.shape) for x in jax.tree.leaves(state)}
    assert (256,) in shapes and (128,) in shapes and (256, 128) not in shapes

    @jax.jit
    def step(p, s):
        g = jax.grad(loss)(p)
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    start = float(loss(params))
    for _ in range(30):
        params, state = step(params, state)
    assert float(loss(params)) < 0.5 * start


# ----------------------------------------------------------------------------- accumulation


def _toy():
    rng = np.random.default_rng(1)
    params = {"dense": {"kernel": jnp.asarray(rng.normal(size=(4, 7)), jnp.float32),
                        "bias": jnp.zeros(7)},
              "norm": {"scale": jnp.ones(4)}}
    batch = {"x": jnp.asarray(rng.normal(size=(8, 3, 4)), jnp.float32),
             "targets": jnp.asarray(rng.integers(0, 7, size=(8, 3))),
             # unequal token counts per microbatch of 2 examples: 6, 1, 4, 3
             "weights": jnp.asarray([[1, 1, 1], [1, 1, 1], [1, 0, 0], [0, 0, 0],
                                     [1, 1, 0], [1, 1, 0], [1, 1, 1], [0, 0, 0]],
                                    jnp.float32)}
    return params, batch


def _loss_fn(lnf=None):
    def loss_fn(params, batch, rng):
        del rng
        h = batch["x"] * params["norm"]["scale"]
        logits = h @ params["dense"]["kernel"] + params["dense"]["bias"]  # [b, l, 7]
        loss, _, wsum = losses.cross_entropy_with_logits(
            logits, batch["targets"], batch["weights"], z_loss=1e-3,
            loss_normalizing_factor=lnf)
        return loss, {"weight_sum": wsum}
    return loss_fn


@jax.jit
def _one_update(params, grads):
    tx = opt.adamw_bert(1e-2)
    upd, _ = tx.update(grads, tx.init(params), params)
    return optax.apply_updates(params, upd)


def test_accumulation_equals_whole_batch_token_weighted():
    params, batch = _toy()
    lg = jax.value_and_grad(_loss_fn(), has_aux=True)
    (ref_loss, _), ref_g = jax.jit(lg)(params, batch, None)
    acc = jax.jit(lambda p, b, r: opt.accumulate_gradients(
        lg, p, b, r, 4, weight_fn=lambda mb: mb["weights"].sum()))
    (loss, aux), g = acc(params, batch, jax.random.key(0))
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(aux["weight_sum"]), [6, 1, 4, 3])
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(ref_g)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
    for a, b in zip(jax.tree.leaves(_one_update(params, g)),
                    jax.tree.leaves(_one_update(params, ref_g))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)

    # Equal weighting is a *different* (mean-of-means) gradient here: the test has teeth.
    (_, _), g_eq = jax.jit(lambda p, b, r: opt.accumulate_gradients(lg, p, b, r, 4))(
        params, batch, jax.random.key(0))
    diff = max(float(jnp.abs(a - b).max())
               for a, b in zip(jax.tree.leaves(g_eq), jax.tree.leaves(ref_g)))
    assert diff > 1e-3


def test_accumulation_equal_weights_and_sum_reduction():
    params, batch = _toy()
    batch["weights"] = jnp.ones_like(batch["weights"])
    lg = jax.value_and_grad(_loss_fn(), has_aux=True)
    (ref_loss, _), ref_g = jax.jit(lg)(params, batch, None)
    (loss, _), g = opt.accumulate_gradients(lg, params, batch, jax.random.key(0), 4)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(ref_g)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)

    # Constant loss normaliser (t5x): microbatch losses are partial sums; grads add up.
    params, batch = _toy()
    lg = jax.value_and_grad(_loss_fn(lnf=5.0), has_aux=True)
    (ref_loss, _), ref_g = jax.jit(lg)(params, batch, None)
    (loss, _), g = opt.accumulate_gradients(lg, params, batch, jax.random.key(0), 4,
                                            reduction="sum")
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(ref_g)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


def test_accumulation_errors_and_single_microbatch():
    params, batch = _toy()
    lg = jax.value_and_grad(_loss_fn(), has_aux=True)
    with pytest.raises(ValueError, match="batch dimension 8 is not divisible by "
                                         "num_microbatches=3"):
        opt.accumulate_gradients(lg, params, batch, jax.random.key(0), 3)
    with pytest.raises(ValueError, match="reduction"):
        opt.accumulate_gradients(lg, params, batch, jax.random.key(0), 2, reduction="max")
    (_, aux), _ = jax.jit(lambda p, b, r: opt.accumulate_gradients(lg, p, b, r, 1))(
        params, batch, jax.random.key(0))
    assert aux["weight_sum"].shape == (1,)
