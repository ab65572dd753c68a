"""Each stack gives the same loss and gradients sharded on 8 devices as unsharded."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.models.bert import BertModel
from t2t.nn import Decoder, EncoderDecoder
from t2t.train import partitioning

from tests.nn.helpers import BERT_TINY, GPT_TINY, T5_TINY, max_diff, tokens
from tests.tiers import sweep

pytestmark = pytest.mark.all_devices   # meshes over the 8 fake devices (conftest)

WIDE = dict(num_heads=8, head_dim=4, d_ff=64, vocab_size=64)  # divisible by 8 devices
BATCH = 8

CASES = {
    "bert": (BertModel(BERT_TINY.replace(**WIDE)),
             lambda: dict(encoder_input_tokens=tokens(1, (BATCH, 12)),
                          masked_positions=tokens(2, (BATCH, 3), vocab=12, low=0)),
             lambda out: jnp.mean(out["mlm_logits"] ** 2) + jnp.mean(out["nsp_logits"] ** 2)),
    "gpt": (Decoder(GPT_TINY.replace(**WIDE)),
            lambda: dict(decoder_input_tokens=tokens(3, (BATCH, 12))),
            lambda out: jnp.mean(jax.nn.log_softmax(out) ** 2)),
    "t5_scan": (EncoderDecoder(T5_TINY.replace(scan_layers=True, **WIDE)),
                lambda: dict(encoder_input_tokens=tokens(4, (BATCH, 12)),
                             decoder_input_tokens=tokens(5, (BATCH, 6))),
                lambda out: jnp.mean(jax.nn.log_softmax(out) ** 2)),
}


def loss_and_grads(module, inputs, reduce, params):
    def loss(p):
        return reduce(module.apply({"params": p}, **inputs))
    return jax.value_and_grad(loss)(params)


MESHES = ["2x2x2", "8x1x1", "1x1x8"]   # data x fsdp x tensor
# CI: GPT on every mesh, T5 (scanned layers, the costliest compile) on the mesh that uses
# all three axes at once; the rest under -m slow.
CI = {("gpt", mesh) for mesh in MESHES} | {("t5_scan", "2x2x2")}


@pytest.fixture(scope="module")
def reference():
    """family -> (inputs, unsharded params, loss, grads), computed once per family."""
    cache = {}

    def get(family):
        if family not in cache:
            module, make_inputs, reduce = CASES[family]
            inputs = make_inputs()
            params = nn.unbox(module.init(jax.random.PRNGKey(0), **inputs)["params"])
            loss, grads = jax.jit(lambda p: loss_and_grads(module, inputs, reduce, p))(params)
            cache[family] = inputs, loss, grads
        return cache[family]
    return get


@pytest.mark.parametrize("family,shape", sweep([(f, m) for f in sorted(CASES) for m in MESHES],
                                               ci=CI))
def test_sharded_forward_backward_matches_unsharded(family, shape, reference):
    module, _, reduce = CASES[family]
    inputs, ref_loss, ref_grads = reference(family)
    mesh = partitioning.make_mesh(partitioning.MeshConfig(*map(int, shape.split("x"))))
    sharded, shardings = partitioning.init_sharded(
        lambda r: module.init(r, **inputs)["params"], jax.random.PRNGKey(0), mesh=mesh)
    batch_sharding = partitioning.batch_sharding(mesh)
    sharded_inputs = {k: jax.device_put(v, batch_sharding) for k, v in inputs.items()}
    with partitioning.sharding_context(mesh):
        step = jax.jit(lambda p, x: loss_and_grads(module, x, reduce, p),
                       out_shardings=(None, shardings))
        loss, grads = step(sharded, sharded_inputs)
    # The mesh really shards something (not all replicated).
    specs = {s.spec for s in jax.tree_util.tree_leaves(shardings)}
    assert any(any(ax is not None for ax in spec) for spec in specs), shape
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6, atol=0)
    for a, b in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(ref_grads)):
        scale = np.max(np.abs(np.asarray(b)))      # on the host, as max_diff is
        assert max_diff(a, b) <= 1e-5 * max(scale, 1.0)


def test_undivisible_dimension_is_a_clear_error():
    module = Decoder(GPT_TINY.replace(num_heads=4, head_dim=8))  # 4 heads on tensor=8
    mesh = partitioning.make_mesh(partitioning.MeshConfig(1, 1, 8))
    with pytest.raises(ValueError, match=r"heads=4.*tensor=8"):
        partitioning.init_sharded(
            lambda r: module.init(r, decoder_input_tokens=tokens(1, (8, 4)))["params"],
            jax.random.PRNGKey(0), mesh=mesh)
