"""Checkpointer: bit-exact round trip, restore onto other meshes, data state, keep-N, errors."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P, SingleDeviceSharding

from t2t.train import checkpoints as ck
from t2t.train import partitioning as pt

pytestmark = pytest.mark.all_devices   # meshes over the 8 fake devices (conftest)

SPECS_8 = {"token_embedder": {"embedding": P("data", None)},
           "dense": {"kernel": P("data", None), "bias": P()}}
SPECS_222 = {"token_embedder": {"embedding": P("tensor", "fsdp")},
             "dense": {"kernel": P(("data", "tensor"), "fsdp"), "bias": P("tensor")}}


def _state(mesh, specs):
    """params + AdamW state + step, all created sharded by jit (no host-local constants)."""
    rng = np.random.default_rng(0)
    params = {"token_embedder": {"embedding": rng.normal(size=(16, 8)).astype(np.float32)},
              "dense": {"kernel": rng.normal(size=(8, 4)).astype(np.float32),
                        "bias": rng.normal(size=(4,)).astype(np.float32)}}
    p_sh = jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                        is_leaf=lambda x: isinstance(x, P))
    params = jax.device_put(params, p_sh)
    tx = optax.adamw(1e-3)
    opt_shapes = jax.eval_shape(tx.init, params)
    opt_sh = optax.tree_map_params(tx, lambda _, s: s, opt_shapes, p_sh,
                                   transform_non_params=lambda _: NamedSharding(mesh, P()))
    grads = jax.tree.map(lambda x: x * 0.5, params)

    def init(p):
        s = tx.init(p)
        _, s = tx.update(grads, s, p)  # non-zero moments
        return {"params": p, "opt_state": s, "step": jnp.int32(7)}

    out_sh = {"params": p_sh, "opt_state": opt_sh, "step": NamedSharding(mesh, P())}
    return jax.jit(init, out_shardings=out_sh)(params), out_sh


def _assert_bit_exact(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("ckpt"))
    mesh = pt.make_mesh(pt.MeshConfig(data=8))
    state, shardings = _state(mesh, SPECS_8)
    data = {"epoch": 1, "position": 123, "shards": {"files": ["a", "b"], "offset": [3, 4]}}
    with ck.Checkpointer(directory, keep=3) as c:
        assert c.save(10, state, data_state=data, config_str="TransformerConfig.d_model = 8")
        assert c.save(20, state)  # no data / config
    return directory, state, shardings, data


def test_round_trip_bit_exact(saved):
    directory, state, shardings, data = saved
    with ck.Checkpointer(directory) as c:
        assert c.latest_step() == 20 and c.all_steps() == [10, 20]
        restored, data_state = c.restore(10, ck.abstract_state(state, shardings))
        assert data_state == data
        assert c.config_str(10) == "TransformerConfig.d_model = 8"
        _assert_bit_exact(restored, state)
        assert restored["params"]["token_embedder"]["embedding"].sharding == \
            shardings["params"]["token_embedder"]["embedding"]
        # A step saved without data/config.
        latest, no_data = c.restore(None, state)  # arrays work as targets too
        assert no_data is None and c.config_str() is None
        _assert_bit_exact(latest, state)


def test_each_process_saves_its_own_data_state(saved, tmp_path):
    """One file per process (here the one process of one): on a pod each host resumes its
    own position in its own shards; a checkpoint of another number of processes is one line."""
    import os
    import shutil
    from t2t.errors import CheckpointMismatchError
    directory, state, shardings, data = saved
    folder = os.path.join(directory, "10", ck.DATA_STATE)
    assert [n for n in os.listdir(folder) if n.endswith(".json")] == ["process_0-of-1.json"]
    copy = tmp_path / "two_hosts"
    shutil.copytree(directory, copy)
    os.rename(copy / "10" / ck.DATA_STATE / "process_0-of-1.json",
              copy / "10" / ck.DATA_STATE / "process_0-of-2.json")
    with ck.Checkpointer(str(copy)) as c:
        with pytest.raises(CheckpointMismatchError, match=r"written by 2 process\(es\), this "
                           r"run has 1: .* resume with the same number of processes"):
            c.restore(10, ck.abstract_state(state, shardings))


def test_a_step_saved_before_per_process_data_states_still_restores(tmp_path):
    """Steps written before data_state hold process 0's state as orbax's JSON item "data"."""
    import orbax.checkpoint as ocp
    mesh = pt.make_mesh(pt.MeshConfig(data=8))
    state, shardings = _state(mesh, SPECS_8)
    with ocp.CheckpointManager(str(tmp_path), item_handlers={
            "state": ocp.StandardCheckpointHandler(), "data": ocp.JsonCheckpointHandler()}) as old:
        old.save(5, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                            data=ocp.args.JsonSave({"position": 9})))
        old.wait_until_finished()
    with ck.Checkpointer(str(tmp_path)) as c:
        restored, data_state = c.restore(5, ck.abstract_state(state, shardings))
    assert data_state == {"position": 9}
    _assert_bit_exact(restored, state)


def test_restore_onto_2x2x2_mesh_and_one_device(saved):
    directory, state, _, _ = saved
    mesh = pt.make_mesh(pt.MeshConfig(data=2, fsdp=2, tensor=2))
    _, sh222 = _state(mesh, SPECS_222)
    with ck.Checkpointer(directory) as c:
        restored, _ = c.restore(10, ck.abstract_state(state, sh222))
        _assert_bit_exact(restored, state)
        emb = restored["params"]["token_embedder"]["embedding"]
        assert emb.sharding.mesh.shape == mesh.shape and emb.sharding.spec == P("tensor", "fsdp")
        assert emb.addressable_shards[0].data.shape == (8, 4)
        mu = restored["opt_state"][0].mu["dense"]["kernel"]
        assert mu.sharding.spec == P(("data", "tensor"), "fsdp")

        one = SingleDeviceSharding(jax.devices()[3])
        restored1, _ = c.restore(10, ck.abstract_state(state, jax.tree.map(lambda _: one, state)))
        _assert_bit_exact(restored1, state)
        assert all(x.sharding == one for x in jax.tree.leaves(restored1))


def test_mismatch_error_names_paths_and_shapes(saved):
    directory, state, shardings, _ = saved
    target = ck.abstract_state(state, shardings)
    emb = target["params"]["token_embedder"]["embedding"]
    target["params"]["token_embedder"]["embedding"] = jax.ShapeDtypeStruct(
        (15, 8), emb.dtype, sharding=emb.sharding)
    del target["params"]["dense"]["bias"]
    target["params"]["extra"] = jax.ShapeDtypeStruct((2,), jnp.float32,
                                                     sharding=target["step"].sharding)
    with ck.Checkpointer(directory) as c, pytest.raises(ValueError) as e:
        c.restore(10, target)
    msg = str(e.value)
    assert ("params/token_embedder/embedding: checkpoint (16, 8) vs model (15, 8) — vocab "
            "size differs?") in msg
    assert "params/dense/bias: in the checkpoint (4,) but not in the model" in msg
    assert "params/extra: in the model (2,) but not in the checkpoint" in msg


def test_an_optimizer_mismatch_is_named_as_one(saved):
    """The parameters fit but the optimizer state does not (an AdamW checkpoint resumed with
    Adafactor): the line says so, not 'different model size'."""
    directory, state, shardings, _ = saved
    target = ck.abstract_state(state, shardings)
    replicated = target["step"].sharding
    target["opt_state"] = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated),
        jax.eval_shape(optax.adafactor(1e-3).init, state["params"]))
    with ck.Checkpointer(directory) as c, pytest.raises(ValueError) as e:
        c.restore(10, target)
    line = str(e.value).splitlines()[0]
    assert "the model's parameters fit, its optimizer state does not" in line
    assert "opt_state/" in line and "model size" not in line


def test_dtype_mismatch_and_cast(saved):
    directory, state, shardings, _ = saved
    target = ck.abstract_state(state, shardings)
    k = target["params"]["dense"]["kernel"]
    target["params"]["dense"]["kernel"] = jax.ShapeDtypeStruct(k.shape, jnp.bfloat16,
                                                               sharding=k.sharding)
    with ck.Checkpointer(directory) as c:
        with pytest.raises(ValueError, match="params/dense/kernel: checkpoint dtype float32 vs "
                                             "model bfloat16"):
            c.restore(10, target)
        restored, _ = c.restore(10, target, allow_dtype_cast=True)
    assert restored["params"]["dense"]["kernel"].dtype == jnp.bfloat16


def test_keep_n_interval_and_errors(tmp_path):
    mesh = pt.make_mesh(pt.MeshConfig(data=8))
    state = {"w": jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("data")))}
    with ck.Checkpointer(str(tmp_path), keep=2, save_interval_steps=2) as c:
        with pytest.raises(FileNotFoundError, match="no checkpoint"):
            c.restore(None, state)
        saved = [c.save(s, {"w": state["w"] + s}) for s in (2, 3, 4, 6)]
        assert saved == [True, False, True, True]
        assert c.save(7, {"w": state["w"] + 7}, force=True)
        c.wait()
        assert c.all_steps() == [6, 7]
        restored, _ = c.restore(6, state)
        np.testing.assert_array_equal(np.asarray(restored["w"]), np.arange(8.0) + 6)
        with pytest.raises(FileNotFoundError, match=r"step 2 .* have \[6, 7\]"):
            c.restore(2, state)
        with pytest.raises(ValueError, match="must be a jax.ShapeDtypeStruct with a sharding"):
            c.restore(6, {"w": jax.ShapeDtypeStruct((8,), jnp.float32)})


def test_one_process_writes_replicated_shards_whole(tmp_path, monkeypatch, caplog):
    """A [16, 8] array replicated on 8 devices is written from one replica, without orbax's
    eager per-device slices (they only spread the writing over hosts), and restores bit for
    bit."""
    mesh = pt.make_mesh(pt.MeshConfig(data=8))
    shardings = {"w": NamedSharding(mesh, P()), "rows": NamedSharding(mesh, P("data"))}
    values = np.arange(128, dtype=np.float32).reshape(16, 8)
    state = jax.device_put({"w": values, "rows": values}, shardings)
    slices = []
    original = jax.lax.slice_in_dim
    monkeypatch.setattr(jax.lax, "slice_in_dim",
                        lambda *a, **k: slices.append(1) or original(*a, **k))
    ck._write_whole_shards_in_one_process.cache_clear()
    with ck.Checkpointer(str(tmp_path), async_save=False) as c:
        c.save(1, state)
        restored, _ = c.restore(1, ck.abstract_state(state, shardings))
    assert slices == []
    assert "overriding" not in caplog.text            # no orbax warning on every run
    _assert_bit_exact(restored, state)
