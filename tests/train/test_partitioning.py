"""Mesh construction, rules validation and sharded init on 8 fake CPU devices."""
import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from t2t.train import param_views
from t2t.train import partitioning as pt

pytestmark = pytest.mark.all_devices   # meshes over the 8 fake devices (conftest)


class ToyMlp(nn.Module):
    """Params use logical names like t2t.nn; the hidden activation is constrained."""
    d_model: int = 16
    d_ff: int = 32
    vocab: int = 64
    act_names: tuple = ("batch", "length", "embed")

    @nn.compact
    def __call__(self, tokens):  # tokens: [batch, length] int32
        init = nn.initializers.normal(0.02)
        emb = self.param("embedding", nn.with_logical_partitioning(init, ("vocab", "embed")),
                         (self.vocab, self.d_model))
        wi = self.param("wi", nn.with_logical_partitioning(init, ("embed", "mlp")),
                        (self.d_model, self.d_ff))
        wo = self.param("wo", nn.with_logical_partitioning(init, ("mlp", "embed")),
                        (self.d_ff, self.d_model))
        scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones,
                                                                 ("embed",)), (self.d_model,))
        x = emb[tokens]  # [batch, length, embed]
        x = nn.with_logical_constraint(x, self.act_names)
        h = jnp.einsum("bld,df->blf", x, wi)  # [batch, length, mlp]
        h = nn.with_logical_constraint(h, ("batch", "length", "mlp"))
        return jnp.einsum("blf,fd->bld", jax.nn.relu(h), wo) * scale


def _shape(mesh):
    return tuple(mesh.shape[a] for a in pt.MESH_AXES)


@pytest.mark.parametrize("cfg,expected", [
    (pt.MeshConfig(), (8, 1, 1)),
    (pt.MeshConfig(data=8), (8, 1, 1)),
    (pt.MeshConfig(data=2, fsdp=2, tensor=2), (2, 2, 2)),
    (pt.MeshConfig(data=1, fsdp=1, tensor=8), (1, 1, 8)),
    (pt.MeshConfig(data=2, fsdp=-1, tensor=2), (2, 2, 2)),
    (pt.MeshConfig(data=-1, fsdp=1, tensor=4), (2, 1, 4)),
    (pt.MeshConfig(data=2, fsdp=1, tensor=2, dcn_data=2), (4, 1, 2)),  # CPU: plain reshape
])
def test_make_mesh_shapes(cfg, expected):
    mesh = pt.make_mesh(cfg)
    assert mesh.axis_names == pt.MESH_AXES
    assert _shape(mesh) == expected
    assert all(t == AxisType.Auto for t in mesh.axis_types)
    assert sorted(d.id for d in mesh.devices.flat) == list(range(8))


def test_make_mesh_gin_binding():
    from t2t.run import configurables
    gin.parse_config("MeshConfig.data = 4\nMeshConfig.tensor = 2")
    try:
        assert _shape(configurables.make_mesh()) == (4, 1, 2)
        assert _shape(pt.make_mesh()) == (8, 1, 1)     # the library ignores gin
    finally:
        gin.clear_config()
    assert _shape(configurables.make_mesh()) == (8, 1, 1)


def test_make_mesh_subset_of_devices():
    mesh = pt.make_mesh(pt.MeshConfig(data=-1, tensor=2), devices=jax.devices()[:4])
    assert _shape(mesh) == (2, 1, 2)


@pytest.mark.parametrize("cfg,msg", [
    (pt.MeshConfig(data=3), "data=3 × fsdp=1 × tensor=1 needs 3 devices but 8"),
    (pt.MeshConfig(data=-1, tensor=3), "do not divide the 8 devices"),
    (pt.MeshConfig(data=-1, fsdp=-1), "only one mesh axis may be -1"),
    (pt.MeshConfig(data=0), "positive or -1"),
    (pt.MeshConfig(dcn_data=3), "3 slices"),
])
def test_make_mesh_errors(cfg, msg):
    with pytest.raises(ValueError, match=msg):
        pt.make_mesh(cfg)


def test_rules_validation():
    with pytest.raises(ValueError, match="conflicting rules for 'embed': 'fsdp' and 'tensor'"):
        pt.validate_rules(pt.DEFAULT_RULES + (("embed", "tensor"),))
    mesh = pt.make_mesh(pt.MeshConfig())
    with pytest.raises(ValueError, match="mesh axis 'model'"):
        pt.validate_rules((("mlp", "model"),), mesh)
    assert pt.validate_rules(pt.DEFAULT_RULES, mesh) == pt.DEFAULT_RULES
    assert {r[0] for r in pt.DEFAULT_RULES} == set(pt.LOGICAL_AXES)


def test_replicate_on_reuse_and_batch_sharding():
    mesh = pt.make_mesh(pt.MeshConfig(data=2, fsdp=2, tensor=2))
    act = pt.logical_sharding(mesh, ("batch", "length", "embed"))
    assert act.spec == P(("data", "fsdp"), None, None)  # embed lost fsdp to batch
    assert pt.logical_sharding(mesh, ("batch", "length", "mlp")).spec == P(
        ("data", "fsdp"), None, "tensor")
    assert pt.logical_sharding(mesh, ("embed", "mlp")).spec == P("fsdp", "tensor")
    # mlp and heads both want tensor: heads (later in the table) is replicated.
    assert pt.logical_sharding(mesh, ("mlp", "heads")).spec == P("tensor", None)
    assert pt.batch_sharding(mesh).spec == P(("data", "fsdp"))


def _abstract(model, batch=8, length=4):
    return jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((batch, length), jnp.int32))


def test_param_shardings_specs():
    mesh = pt.make_mesh(pt.MeshConfig(data=2, fsdp=2, tensor=2))
    sh = pt.param_shardings(_abstract(ToyMlp()), mesh)["params"]
    assert sh["embedding"].spec == P("tensor", "fsdp")
    assert sh["wi"].spec == P("fsdp", "tensor")
    assert sh["wo"].spec == P("tensor", "fsdp")
    assert sh["scale"].spec == P("fsdp")
    assert all(isinstance(s, NamedSharding) and s.mesh is mesh for s in sh.values())


def test_param_shardings_errors():
    mesh = pt.make_mesh(pt.MeshConfig(data=1, fsdp=1, tensor=8))
    with pytest.raises(ValueError, match=r"params/wi dim 1 \(mlp=36\) is not divisible by "
                                         r"mesh axis tensor=8"):
        pt.param_shardings(_abstract(ToyMlp(d_ff=36)), mesh)
    rules = tuple(r for r in pt.DEFAULT_RULES if r[0] != "vocab")
    with pytest.raises(ValueError, match=r"params/embedding uses logical axis 'vocab'.*known"):
        pt.param_shardings(_abstract(ToyMlp()), mesh, rules)


def test_init_sharded_places_params():
    mesh = pt.make_mesh(pt.MeshConfig(data=2, fsdp=2, tensor=2))
    model = ToyMlp()
    tokens = jnp.zeros((8, 4), jnp.int32)
    params, shardings = pt.init_sharded(model.init, jax.random.key(0), tokens, mesh=mesh)
    p = params["params"]
    assert not isinstance(p["wi"], nn.Partitioned)  # unboxed
    assert p["wi"].sharding.spec == P("fsdp", "tensor")
    assert p["embedding"].sharding.spec == P("tensor", "fsdp")
    # Each of the 8 shards of wi [16, 32] holds [8, 16]; 2 data replicas of each.
    assert p["wi"].addressable_shards[0].data.shape == (8, 16)
    assert jax.tree.structure(shardings) == jax.tree.structure(params)
    # Same values as a plain, unsharded init (eager vs jit may differ in the last ulp).
    plain = nn.meta.unbox(model.init(jax.random.key(0), tokens))
    np.testing.assert_allclose(np.asarray(p["wi"]), np.asarray(plain["params"]["wi"]), rtol=1e-6)

    # Activation constraints are live under the sharding context.
    def fwd(params, tokens):
        return model.apply(params, tokens)
    with pt.sharding_context(mesh):
        out = jax.jit(fwd, in_shardings=(shardings, pt.batch_sharding(mesh)))(params, tokens)
        hlo = jax.jit(fwd).lower(params, tokens).as_text()
    assert out.shape == (8, 4, 16)
    # [batch, length, embed] and [batch, length, mlp] constraints, embed replicated.
    assert '<@mesh, [{"data", "fsdp"}, {}, {}]>' in hlo
    assert '[{"data", "fsdp"}, {}, {"tensor"}]>' in hlo


def test_init_is_traced_once_and_is_the_jitted_init_bit_for_bit():
    """One trace gives the shapes, the shardings and the arrays: the same bits, in the same
    shardings, as jitting the init itself."""
    mesh = pt.make_mesh(pt.MeshConfig(data=2, fsdp=2, tensor=2))
    model, tokens, traces = ToyMlp(), jnp.zeros((8, 4), jnp.int32), []

    def init(rng, tokens):
        traces.append(1)
        return model.init(rng, tokens)

    params, shardings = pt.init_sharded(init, jax.random.key(0), tokens, mesh=mesh)
    assert len(traces) == 1
    with pt.sharding_context(mesh):
        want = jax.jit(lambda r, t: nn.meta.unbox(model.init(r, t)),
                       out_shardings=shardings)(jax.random.key(0), tokens)
    for got, ref in zip(jax.tree.leaves(params), jax.tree.leaves(want), strict=True):
        assert got.sharding == ref.sharding
        np.testing.assert_array_equal(np.asarray(got), np.asarray(ref))


def test_unknown_activation_name_raises():
    mesh = pt.make_mesh(pt.MeshConfig(data=2, fsdp=2, tensor=2))
    model = ToyMlp(act_names=("batch", "seq", "embed"))
    with pytest.raises(ValueError, match="activation uses logical axis 'seq'.*known names"):
        pt.init_sharded(model.init, jax.random.key(0), jnp.zeros((8, 4), jnp.int32),
                        mesh=mesh)


@pytest.mark.parametrize("make_tx", [
    lambda: optax.adamw(1e-3), lambda: optax.adafactor(1e-3, min_dim_size_to_factor=8),
    lambda: param_views.per_parameter(optax.adafactor(1e-3, min_dim_size_to_factor=64))])
def test_opt_state_shardings(make_tx):
    mesh = pt.make_mesh(pt.MeshConfig(data=2, fsdp=2, tensor=2))
    params, shardings = pt.init_sharded(ToyMlp().init, jax.random.key(0),
                                        jnp.zeros((8, 4), jnp.int32), mesh=mesh)
    tx = make_tx()
    sh = pt.opt_state_shardings(tx, params, shardings)
    state = jax.jit(tx.init, out_shardings=sh)(params)
    wi = params["params"]["wi"]
    specs = {(tuple(x.shape), x.sharding.spec) for x in jax.tree.leaves(state)}
    assert all(isinstance(x.sharding, NamedSharding) for x in jax.tree.leaves(state))
    if isinstance(state, dict):  # per parameter, unfactored (dims < 64): sharded as wi
        assert state["params"]["wi"][0].v.sharding == wi.sharding
    elif isinstance(state[0], optax.ScaleByAdamState):  # mu, nu shaped like wi: same sharding
        assert ((16, 32), P("fsdp", "tensor")) in specs
        assert state[0].mu["params"]["wi"].sharding == wi.sharding
    else:  # Adafactor: factored row/col statistics of wi are replicated
        assert ((16,), P()) in specs and ((32,), P()) in specs
    assert all(spec == P() for shape, spec in specs if shape == ())
