"""The training loop in-process: mesh equivalence, NaN stop, SIGTERM, mismatched restore."""
import json
import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from t2t.models.families import make_model
from t2t.train import partitioning
from t2t.train.trainer import NonFiniteLossError, TrainConfig, Trainer, _grad_norm, fit

from tests.nn.helpers import T5_TINY
from tests.train.fakes import RandomCopyData

pytestmark = pytest.mark.all_devices   # meshes over the 8 fake devices (conftest)

CFG = T5_TINY.replace(vocab_size=64, num_heads=4, head_dim=8, d_ff=64)


def run(tmp_path, steps=4, mesh=None, model=None, data=None, **config):
    model = model or make_model("t5", CFG)
    mesh = mesh or partitioning.make_mesh(partitioning.MeshConfig(8, 1, 1))
    cfg = TrainConfig(model_dir=str(tmp_path), train_steps=steps, log_every=1,
                      checkpoint_every=config.pop("checkpoint_every", 100),
                      async_checkpoint=False, progress_bar=False, **config)
    trainer = Trainer(model, optax.adam(1e-2), mesh, cfg)
    return fit(trainer, data or RandomCopyData())


def losses(result):
    return [h["loss"] for h in result.history if "loss" in h]


def test_loss_falls_and_outputs_written(tmp_path):
    result = run(tmp_path, steps=12)
    ls = losses(result)
    assert len(ls) == 12 and ls[-1] < ls[0] - 0.5
    lines = [json.loads(l) for l in open(tmp_path / "metrics.jsonl")]
    assert [l["step"] for l in lines] == list(range(1, 13))
    assert {"loss", "accuracy", "grad_norm", "tokens_per_s", "step_time", "perplexity"} <= set(lines[0])
    assert os.listdir(tmp_path / "tensorboard")
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["12"]


def test_the_state_is_built_from_one_trace_of_the_models_init(monkeypatch):
    """`abstract_init` (the shardings) and `init_state` (the arrays) share one trace of the
    model's init (tests/train/test_partitioning.py: the same bits as jitting the init)."""
    model = make_model("t5", CFG)
    traces, init = [], type(model).init
    monkeypatch.setattr(type(model), "init",
                        lambda self, *a, **k: traces.append(1) or init(self, *a, **k))
    mesh = partitioning.make_mesh(partitioning.MeshConfig(8, 1, 1))   # as run(): cached
    trainer = Trainer(model, optax.adam(1e-2), mesh, TrainConfig(model_dir="unused"))
    batch = next(iter(RandomCopyData()))
    abstract = trainer.abstract_init(batch)
    state = trainer.init_state(batch, abstract=abstract)
    assert len(traces) == 1
    for got, want in zip(jax.tree.leaves(state.params), jax.tree.leaves(abstract.params),
                         strict=True):
        assert (got.shape, got.dtype, got.sharding) == (want.shape, want.dtype, want.sharding)


def test_any_mesh_gives_the_same_losses(tmp_path):
    one_device = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1, 1),
                                   partitioning.MESH_AXES,
                                   axis_types=(jax.sharding.AxisType.Auto,) * 3)
    ref = losses(run(tmp_path / "one", mesh=one_device))
    # data parallel, and fsdp with tensor parallel (tests/nn/test_sharding.py: all three at once)
    for shape in [(8, 1, 1), (1, 2, 4)]:
        mesh = partitioning.make_mesh(partitioning.MeshConfig(*shape))
        got = losses(run(tmp_path / "x".join(map(str, shape)), mesh=mesh))
        np.testing.assert_allclose(got, ref, rtol=2e-5, err_msg=str(shape))


def test_gradient_accumulation_matches_one_big_batch(tmp_path):
    a = run(tmp_path / "a", steps=3)
    b = run(tmp_path / "b", steps=3, num_microbatches=4)
    np.testing.assert_allclose(losses(a), losses(b), rtol=2e-5)
    for x, y in zip(jax.tree_util.tree_leaves(a.state.params),
                    jax.tree_util.tree_leaves(b.state.params)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-5)


class _PoisonedModel:
    """Delegates to a real model; its loss turns NaN from step `at` on."""

    def __init__(self, model, at):
        self._model, self._at = model, at

    def __getattr__(self, name):
        return getattr(self._model, name)

    def loss_fn(self, params, batch, rng=None):
        loss, metrics = self._model.loss_fn(params, batch, rng)
        poisoned = jnp.where(batch["poison"][0] > 0, jnp.nan, loss)
        return poisoned, {**metrics, "loss": poisoned}


class _PoisonData(RandomCopyData):
    def __init__(self, at):
        super().__init__()
        self.at = at

    def __next__(self):
        batch = super().__next__()
        batch["poison"] = np.full((self.batch_size,), int(self.index >= self.at), np.int32)
        return batch


def test_grad_norm_metric_is_the_global_gradient_norm(tmp_path):
    model = make_model("t5", CFG)                   # no dropout: the step's rng is moot
    mesh = partitioning.make_mesh(partitioning.MeshConfig(8, 1, 1))
    trainer = Trainer(model, optax.adam(1e-2), mesh,
                      TrainConfig(model_dir=str(tmp_path), progress_bar=False))
    batch = next(RandomCopyData())
    state = trainer.init_state(batch)
    grads = jax.jit(jax.grad(lambda p: model.loss_fn(p, batch, None)[0]))(state.params)
    want = float(optax.tree.norm(grads))
    _, metrics = trainer.train_step(state, batch)
    assert want > 0
    np.testing.assert_allclose(float(metrics["grad_norm"]), want, rtol=1e-5)
    # Reported as NaN for a non-finite loss (fit stops on that loss anyway).
    assert np.isnan(float(_grad_norm(grads, jnp.float32(jnp.inf))))
    assert float(_grad_norm(grads, jnp.float32(1.0))) == pytest.approx(want, rel=1e-6)


def test_grad_norm_joins_small_gradients_exactly():
    rng = np.random.default_rng(0)
    grads = {"big": jnp.asarray(rng.normal(size=(300, 300)), jnp.float32),     # 90,000
             "bias": jnp.asarray(rng.normal(size=(12, 64)), jnp.float32),
             "scale": jnp.asarray(rng.normal(size=(768,)), jnp.bfloat16),
             "scalar": jnp.float32(3.0)}
    want = np.sqrt(sum(float(np.sum(np.square(np.asarray(g, np.float64))))
                       for g in grads.values()))
    assert float(_grad_norm(grads, jnp.float32(1.0))) == pytest.approx(want, rel=1e-6)
    assert float(_grad_norm({"b": grads["bias"]}, jnp.float32(1.0))) == pytest.approx(
        float(np.linalg.norm(np.asarray(grads["bias"]))), rel=1e-6)


def test_nan_loss_stops_with_step_and_keeps_last_good_checkpoint(tmp_path):
    model = _PoisonedModel(make_model("t5", CFG), at=5)
    with pytest.raises(NonFiniteLossError, match="step 5"):
        run(tmp_path, steps=10, model=model, data=_PoisonData(at=5), checkpoint_every=2)
    assert sorted(int(s) for s in os.listdir(tmp_path / "checkpoints")) == [2, 4]


def test_sigterm_saves_and_exits(tmp_path, monkeypatch):
    calls = {"n": 0}
    original = Trainer.train_step

    def step_then_preempt(self, state, batch):
        calls["n"] += 1
        if calls["n"] == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, state, batch)

    monkeypatch.setattr(Trainer, "train_step", step_then_preempt)
    result = run(tmp_path, steps=10)
    assert result.stopped_by == "preempted" and result.step == 3
    assert os.listdir(tmp_path / "checkpoints") == ["3"]


def test_restoring_a_mismatched_checkpoint_names_the_parameter(tmp_path):
    run(tmp_path, steps=1)
    bigger = make_model("t5", CFG.replace(vocab_size=128))
    with pytest.raises(ValueError, match=r"token_embedder/embedding.*\(64, 32\).*\(128, 32\)"):
        run(tmp_path, steps=2, model=bigger, data=RandomCopyData(vocab=60))


def test_batch_not_divisible_by_mesh_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="batch size 4 is not divisible by the 8 ways"):
        run(tmp_path, steps=1, data=RandomCopyData(batch_size=4))


def test_evaluate_is_the_mean_of_each_batchs_metrics_up_to_steps(tmp_path):
    """`Trainer.evaluate` (which fetches each batch's metrics after dispatching the next):
    the per-batch means and summed token count of exactly the first `steps` batches."""
    trainer = Trainer(make_model("t5", CFG), optax.adam(1e-2),
                      partitioning.make_mesh(partitioning.MeshConfig(8, 1, 1)),
                      TrainConfig(model_dir=str(tmp_path)))
    batches = [batch for batch, _ in zip(RandomCopyData(), range(5))]
    params = trainer.init_state(batches[0]).params
    each = [jax.device_get(trainer.eval_step(params, b)) for b in batches]
    for steps, n in [(None, 5), (3, 3), (1, 1)]:
        got = trainer.evaluate(params, iter(batches), steps=steps)
        assert got["num_tokens"] == sum(float(m["num_tokens"]) for m in each[:n])
        assert got["loss"] == pytest.approx(np.mean([float(m["loss"]) for m in each[:n]]),
                                            rel=1e-12)
    assert trainer.evaluate(params, iter([]), steps=None) == {}
