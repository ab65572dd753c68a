"""T5's Adafactor sees each parameter as Mesh TF stored it (t2t.train.param_views)."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from t2t.models import peft
from t2t.models.families import make_model
from t2t.train import optimizers, param_views, partitioning
from t2t.train.trainer import TrainConfig, Trainer
from tests.nn.helpers import T5_TINY
from tests.train.fakes import RandomCopyData

pytestmark = pytest.mark.all_devices   # meshes over the 8 fake devices (conftest)

K = jax.tree_util.DictKey
RNG = np.random.default_rng(0)


def _normal(*shape):
    return jnp.asarray(RNG.normal(size=shape), jnp.float32)


def _t5_adafactor():   # what adafactor_t5 wraps, applied to one 2-D kernel per layer
    return optax.adafactor(1e-2, min_dim_size_to_factor=128, decay_rate=0.8,
                           multiply_by_parameter_scale=True, clipping_threshold=1.0, eps=1e-30)


@pytest.mark.parametrize("names, view", [
    (("embed", "heads", "kv"), param_views.View((), 1)),
    (("layers", "heads", "kv", "embed"), param_views.View((0,), 1)),
    (("embed", "mlp"), None), (("layers", "embed"), param_views.View((0,), None))])
def test_views_follow_the_logical_axes(names, view):
    assert param_views.view_of(names) == view


def test_a_view_round_trips():
    x = _normal(3, 5, 2, 4)
    view = param_views.View((1,), 2)                  # dim 1 stacked, dims 2-3 joined
    y = view.to(x)
    assert y.shape == (5, 3, 8)
    np.testing.assert_array_equal(y[1], x[:, 1].reshape(3, 8))
    np.testing.assert_array_equal(view.back(y, x.shape), x)


def test_scanned_attention_kernels_update_as_t5s_per_layer_matrices():
    """A [layers, d_model, heads, head_dim] query and a [layers, heads, head_dim, d_model]
    output kernel update as optax's Adafactor updates each layer's 2-D [256, 256] matrix;
    the layers' gradients differ in scale, so one RMS over the stack would not match."""
    axes = {(K("q"),): ("layers", "embed", "heads", "kv"),
            (K("o"),): ("layers", "heads", "kv", "embed")}
    tx = param_views.bind_param_axes(optimizers.make_optimizer("adafactor_t5", 1e-2), axes)
    params = {"q": _normal(2, 256, 4, 64), "o": _normal(2, 4, 64, 256)}
    scale = jnp.array([1.0, 30.0])[:, None, None, None]
    grads = {k: _normal(*v.shape) * scale for k, v in params.items()}
    state = tx.init(params)
    assert not any(x.shape[-3:] == (256, 4, 64) for x in jax.tree.leaves(state))  # factored
    for _ in range(2):
        updates, state = jax.jit(tx.update)(grads, state, params)
    for name, matrix in (("q", (256, 256)), ("o", (256, 256))):
        for layer in range(2):
            p, g = params[name][layer].reshape(matrix), grads[name][layer].reshape(matrix)
            ref, ref_state = _t5_adafactor(), None
            ref_state = ref.init(p)
            for _ in range(2):
                want, ref_state = ref.update(g, ref_state, p)
            np.testing.assert_allclose(updates[name][layer].reshape(matrix), want,
                                       rtol=1e-5, atol=1e-7)


def test_unbound_it_is_optax_adafactor_on_the_stored_shapes():
    params = {"w": _normal(256, 128), "b": _normal(16)}
    grads = jax.tree.map(lambda x: 0.5 * x, params)
    ours, ref = optimizers.make_optimizer("adafactor_t5", 1e-2), _t5_adafactor()
    got, _ = ours.update(grads, ours.init(params), params)
    want, _ = ref.update(grads, ref.init(params), params)
    for k in params:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6)


def _t5_trainer(tmp_path, tx):
    cfg = T5_TINY.replace(d_model=128, num_heads=2, head_dim=64, d_ff=256, vocab_size=64,
                          scan_layers=True)
    mesh = partitioning.make_mesh(partitioning.MeshConfig(8, 1, 1))
    return Trainer(make_model("t5", cfg), tx, mesh,
                   TrainConfig(model_dir=str(tmp_path), progress_bar=False))


def _attention_state(state):
    encoder = state["encoder"]["layers"]["layer"]
    return jax.tree.leaves(encoder["self_attention"]["query"]["kernel"])


@pytest.mark.parametrize("frozen", [False, True])
def test_the_trainer_binds_the_model_axes(tmp_path, frozen):
    """A scanned T5's query kernel [layers, 128, 2, 64] gets per-layer factored statistics
    ([layers, 128] rows, [layers, 128] columns), also through peft.freeze."""
    tx = optimizers.make_optimizer("adafactor_t5", 1e-2)
    if frozen:
        tx = peft.freeze(tx, ("token_embedder",))
    trainer = _t5_trainer(tmp_path, tx)
    batch = next(RandomCopyData())
    state = trainer.init_state(batch)
    shapes = {x.shape for x in _attention_state(state.opt_state)}
    layers = T5_TINY.num_encoder_layers
    assert (layers, 128) in shapes and (layers, 128, 2, 64) not in shapes
    state, metrics = trainer.train_step(state, batch)
    assert np.isfinite(float(metrics["loss"]))


def test_a_stored_shape_state_carries_over_exactly():
    """Second moments depend on the gradients alone: fed the same gradients, optax's
    Adafactor on the stored shapes and T5's views keep the same averages, so the carried
    state equals the views' own. Covers a full moment becoming a factored one (attention,
    scanned and not), factored statistics carried per layer (scanned MLP) and as stored."""
    axes = {(K("q"),): ("layers", "embed", "heads", "kv"), (K("o"),): ("heads", "kv", "embed"),
            (K("wi"),): ("layers", "embed", "mlp"), (K("emb"),): ("vocab", "embed"),
            (K("scale"),): ("embed",)}
    tx = param_views.bind_param_axes(optimizers.make_optimizer("adafactor_t5", 1e-2), axes)
    stored_tx = param_views.stored_shapes_tx(tx)
    params = {"q": _normal(2, 256, 4, 64), "o": _normal(4, 64, 256), "wi": _normal(2, 256, 512),
              "emb": _normal(512, 256), "scale": _normal(256)}
    ours, stored = tx.init(params), stored_tx.init(params)
    for step in range(3):
        grads = {k: _normal(*v.shape) * (step + 1) for k, v in params.items()}
        ours = tx.update(grads, ours, params)[1]
        stored = stored_tx.update(grads, stored, params)[1]
    carried = param_views.from_stored_shapes(tx, stored, params)
    assert jax.tree.structure(carried) == jax.tree.structure(ours)
    for got, want in zip(jax.tree.leaves(carried), jax.tree.leaves(ours)):
        np.testing.assert_allclose(got, want, rtol=1e-5)
    assert ours["q"][0].v_row.shape == (2, 256)        # per layer, factored: it was full


def test_resuming_a_checkpoint_from_before_the_views(tmp_path):
    """`t2t train` resumes a scanned T5 checkpointed with Adafactor on the stored shapes:
    step and parameters as saved, the statistics carried over, and training goes on."""
    from t2t.train.checkpoints import Checkpointer
    from t2t.train.trainer import restore
    batch = next(RandomCopyData())
    views_tx = optimizers.make_optimizer("adafactor_t5", 1e-2)
    old = _t5_trainer(tmp_path, param_views.stored_shapes_tx(views_tx))
    state = old.train_step(old.init_state(batch), batch)[0]
    with Checkpointer(str(tmp_path / "ckpt"), async_save=False) as ckpt:
        ckpt.save(1, state)
    new = _t5_trainer(tmp_path, views_tx)
    with Checkpointer(str(tmp_path / "ckpt"), async_save=False) as ckpt:
        resumed, _ = restore(ckpt, 1, new, new.init_state(batch))
    assert int(resumed.step) == 1
    for got, want in zip(jax.tree.leaves(resumed.params), jax.tree.leaves(state.params)):
        np.testing.assert_array_equal(got, want)
    want = param_views.from_stored_shapes(new.tx, state.opt_state, state.params)
    for got, w in zip(jax.tree.leaves(resumed.opt_state), jax.tree.leaves(want)):
        np.testing.assert_array_equal(got, w)
    assert np.isfinite(float(new.train_step(resumed, batch)[1]["loss"]))
