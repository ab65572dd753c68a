"""Mixture-of-experts layers: routing and losses against their definitions, Hugging Face's
Switch layer, expert parallelism on an 8-device mesh, training, parameter counts."""
import functools
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.models.families import count_params, make_model
from t2t.nn import moe
from t2t.nn.config import TransformerConfig
from t2t.train import partitioning

from tests.nn.helpers import T5_TINY, tokens

SWITCH = T5_TINY.replace(num_heads=8, head_dim=4, d_ff=64, moe_num_experts=8, moe_every=1,
                         mlp_activations=("relu",), num_encoder_layers=1, num_decoder_layers=1)


# ----------------------------------------------------------------------------- routing


def numpy_route(logits, k, capacity):
    """The definition, token by token: slots to every first choice in token order, then to
    every second choice; top-2 gates renormalised (GShard), a top-1 gate is its probability."""
    g, s, e = logits.shape
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    dispatch = np.zeros((g, s, e, capacity))
    combine = np.zeros((g, s, e, capacity))
    for gi in range(g):
        order = np.argsort(-probs[gi], axis=-1)[:, :k]                 # [s, k]
        gates = np.take_along_axis(probs[gi], order, -1)
        if k > 1:
            gates = gates / gates.sum(-1, keepdims=True)
        used = np.zeros(e, int)
        for rank in range(k):
            for t in range(s):
                expert = order[t, rank]
                if used[expert] < capacity:
                    dispatch[gi, t, expert, used[expert]] = 1
                    combine[gi, t, expert, used[expert]] = gates[t, rank]
                    used[expert] += 1
    return dispatch, combine, probs


@pytest.mark.parametrize("k", [1, 2])
def test_route_matches_the_definition(k):
    logits = np.asarray(jax.random.normal(jax.random.PRNGKey(k), (3, 16, 4))) * 2
    capacity = moe.expert_capacity(16, 4, k, 1.0, 1)                   # 4 (k=1), 8 (k=2)
    r = jax.jit(functools.partial(moe.route, top_k=k, capacity=capacity))(jnp.asarray(logits))
    dispatch, combine, probs = numpy_route(logits, k, capacity)
    np.testing.assert_array_equal(np.asarray(r.dispatch), dispatch)
    np.testing.assert_allclose(np.asarray(r.combine), combine, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(r.probs), probs, rtol=1e-6)
    assert dispatch.sum() < 3 * 16 * k                     # some choices were dropped
    assert (dispatch.sum((1, 3)) <= capacity).all()        # no expert over its slots
    if k == 2:   # kept tokens with both choices: gates sum to 1
        both = dispatch.sum((2, 3)) == 2
        np.testing.assert_allclose(combine.sum((2, 3))[both], 1.0, rtol=1e-6)


def test_capacity():
    assert moe.expert_capacity(512, 8, 1, 1.25, 4) == 80
    assert moe.expert_capacity(512, 8, 2, 1.0, 4) == 128
    assert moe.expert_capacity(8, 64, 1, 1.25, 4) == 4     # the floor
    assert moe.expert_capacity(1, 8, 2, 2.0, 4) == 1       # one token (a decoding step)


def test_aux_losses_equal_their_formulas():
    logits = np.asarray(jax.random.normal(jax.random.PRNGKey(3), (2, 10, 4)), np.float64)
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    f = np.stack([np.bincount(p.argmax(-1), minlength=4) / 10 for p in probs])   # [g, e]
    lb = 4 * np.mean(np.sum(f * probs.mean(1), -1))                    # Switch eq. 4 per group
    z = np.mean(np.log(np.exp(logits).sum(-1)) ** 2)
    r = jax.jit(functools.partial(moe.route, top_k=1, capacity=4))(
        jnp.asarray(logits, jnp.float32))                  # one compile, not many eager ops
    np.testing.assert_allclose(jax.jit(moe.load_balancing_loss)(r.probs, r.top1), lb, rtol=1e-5)
    np.testing.assert_allclose(jax.jit(moe.router_z_loss)(jnp.asarray(logits, jnp.float32)), z,
                               rtol=1e-5)
    uniform = jax.jit(functools.partial(moe.route, top_k=1, capacity=2))(jnp.zeros((1, 8, 4)))
    assert float(jax.jit(moe.load_balancing_loss)(uniform.probs,
                                                  jnp.arange(8)[None] % 4)) == 1.0  # minimum 1


# ----------------------------------------------------------------------------- the layer


def test_switch_layer_matches_hugging_face():
    """Top-1 MoeBlock == transformers' SwitchTransformersSparseMLP with the same weights,
    capacity and dropped tokens (zeros) included."""
    import torch
    from transformers import SwitchTransformersConfig
    from transformers.models.switch_transformers import modeling_switch_transformers as hf

    cfg = SWITCH.replace(moe_num_experts=4, moe_min_capacity=1, moe_eval_capacity_factor=1.0)
    x = jax.random.normal(jax.random.PRNGKey(0), (3, 16, cfg.d_model))
    block = moe.MoeBlock(cfg)
    params = nn.unbox(jax.jit(block.init)(jax.random.PRNGKey(1), x)["params"])
    y, sown = jax.jit(functools.partial(block.apply, mutable=[moe.MOE_COLLECTION]))(
        {"params": params}, x)

    ref = hf.SwitchTransformersSparseMLP(SwitchTransformersConfig(
        d_model=cfg.d_model, d_ff=cfg.d_ff, num_experts=4, expert_capacity=4,
        dense_act_fn="relu", dropout_rate=0.0)).eval()
    t = lambda a: torch.tensor(np.asarray(a))  # noqa: E731
    with torch.no_grad():
        ref.router.classifier.weight.copy_(t(params["router"]["kernel"]).T)
        for i in range(4):
            ref.experts[f"expert_{i}"].wi.weight.copy_(t(params["wi"]["kernel"][i]).T)
            ref.experts[f"expert_{i}"].wo.weight.copy_(t(params["wo"]["kernel"][i]).T)
        out, _ = ref(t(x))
    np.testing.assert_allclose(np.asarray(y), out.numpy(), rtol=1e-5, atol=1e-6)
    assert 0 < float(sown[moe.MOE_COLLECTION]["dropped_fraction"][0]) < 1


def test_top2_layer_is_the_gated_sum_of_its_experts():
    cfg = SWITCH.replace(moe_num_experts=4, moe_top_k=2, mlp_activations=("gelu_tanh", "linear"),
                         moe_eval_capacity_factor=0.25, moe_min_capacity=1)
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 12, cfg.d_model))
    block = moe.MoeBlock(cfg)
    p = nn.unbox(jax.jit(block.init)(jax.random.PRNGKey(1), x)["params"])
    y = np.asarray(jax.jit(block.apply)({"params": p}, x))
    logits = np.asarray(x) @ np.asarray(p["router"]["kernel"])
    capacity = moe.expert_capacity(12, 4, 2, 0.25, 1)
    _, combine, _ = numpy_route(logits, 2, capacity)
    gate = combine.sum(-1)                                              # [g, s, e]
    h = jax.nn.gelu(jnp.einsum("gsm,emf->gsef", x, p["wi_0"]["kernel"]), approximate=True)
    h = h * jnp.einsum("gsm,emf->gsef", x, p["wi_1"]["kernel"])
    experts = np.asarray(jnp.einsum("gsef,efm->gsem", h, p["wo"]["kernel"]))
    np.testing.assert_allclose(y, np.einsum("gse,gsem->gsm", gate, experts), rtol=2e-5, atol=2e-6)
    dropped = gate.sum(-1) == 0
    assert dropped.any() and (y[dropped] == 0).all()   # the residual carries them alone


def test_router_is_float32_under_bfloat16():
    cfg = SWITCH.replace(dtype="bfloat16")
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 8, cfg.d_model), jnp.bfloat16)
    logits = jax.jit(moe.Router(cfg).init_with_output)(jax.random.PRNGKey(1), x)[0]
    assert logits.dtype == jnp.float32
    y = jax.jit(moe.MoeBlock(cfg).init_with_output)(jax.random.PRNGKey(1), x)[0]
    assert y.dtype == jnp.bfloat16


@pytest.mark.parametrize("top_k", [1, 2])
def test_bfloat16_gradients_run_and_track_float32(top_k):
    """In a bf16 model the block's input is bf16, and autodiff's backward of the dispatch
    'gsec,gsm->egcm' (the group index second) is a product XLA:CPU cannot run in bf16
    ("Unsupported element type for DotThunk"); the mixed products run, and every gradient
    (the input's too) stays within a few bf16 roundings of float32's (relative norm)."""
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 8, SWITCH.d_model)).astype(jnp.bfloat16)
    params, grads = None, {}
    for dtype in ("float32", "bfloat16"):
        block = moe.MoeBlock(SWITCH.replace(dtype=dtype, moe_top_k=top_k, moe_num_experts=4))
        params = params or nn.unbox(jax.jit(block.init)(jax.random.PRNGKey(1), x)["params"])

        def loss(p, x, block=block):
            return jnp.sum(block.apply({"params": p}, x).astype(jnp.float32) ** 2)
        grads[dtype] = jax.jit(jax.grad(loss, argnums=(0, 1)))(params, x.astype(dtype))
    for want, got in zip(jax.tree.leaves(grads["float32"]), jax.tree.leaves(grads["bfloat16"])):
        got, want = np.asarray(got, np.float32), np.asarray(want)          # on the host
        error = float(np.linalg.norm(got - want) / np.linalg.norm(want))
        assert error < 0.05                                   # measured: <= 0.02 (ReLU flips)


@pytest.mark.parametrize("change, says", [
    (dict(moe_top_k=3, moe_num_experts=2), "moe_top_k=3 must be between 1 and"),
    (dict(moe_capacity_factor=0.0), "must be positive"),
    (dict(moe_every=2, scan_layers=True), "moe_every=2 needs distinct layers"),
    (dict(moe_num_experts=-1), "moe_num_experts must be >= 0"),
])
def test_bad_options_are_one_line(change, says):
    with pytest.raises(ValueError) as e:
        SWITCH.replace(**change)
    assert says in str(e.value).splitlines()[0]      # gin appends its call site below


def test_other_families_refuse_experts():
    with pytest.raises(ValueError, match="router losses"):
        make_model("bert", SWITCH.replace(num_decoder_layers=0))


# ----------------------------------------------------------------------------- models


def _batch(rows=8):
    return dict(encoder_input_tokens=tokens(1, (rows, 12)),
                decoder_input_tokens=tokens(2, (rows, 6)),
                decoder_target_tokens=tokens(3, (rows, 6)),
                decoder_loss_weights=jnp.ones((rows, 6), jnp.float32))


@pytest.mark.parametrize("scan", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_loss_adds_router_losses_of_every_layer(scan):
    model = make_model("t5", SWITCH.replace(scan_layers=scan))
    batch = _batch()
    params = nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), batch))   # jitted: one
    loss, metrics = jax.jit(model.loss_fn)(params, batch)         # compile, not eager ops
    ce, _ = jax.jit(model.token_loss)(jax.jit(model.apply)(params, batch),
                                      batch["decoder_target_tokens"], batch["decoder_loss_weights"])
    layers = 2                                            # every layer of both stacks
    extra = layers * (0.01 * metrics["moe_load_balancing_loss"]
                      + 0.001 * metrics["moe_router_z_loss"])
    np.testing.assert_allclose(loss, ce + extra, rtol=1e-6)
    assert metrics["loss"] == loss and metrics["moe_load_balancing_loss"] >= 1.0


@pytest.mark.all_devices
@pytest.mark.parametrize("shape", [pytest.param(dict(expert=8), marks=pytest.mark.slow),
                                   dict(expert=4, data=2)])
def test_experts_over_8_devices_match_one_device(shape):
    """Loss, metrics and gradients with the experts spread over the mesh equal one
    device's (float32, rtol 1e-5); the compiled step exchanges tokens with all-to-all."""
    model = make_model("t5", SWITCH)
    batch = _batch()
    rng = jax.random.PRNGKey(0)
    grad_fn = jax.jit(jax.value_and_grad(model.loss_fn, has_aux=True))
    params = nn.unbox(jax.jit(model.init)(rng, batch))
    (ref_loss, ref_metrics), ref_grads = grad_fn(params, batch)

    mesh = partitioning.make_mesh(partitioning.MeshConfig(data=shape.get("data", 1),
                                                          expert=shape["expert"]))
    assert mesh.shape["expert"] == shape["expert"]
    sharded, shardings = partitioning.init_sharded(model.init, rng, batch, mesh=mesh)
    wi = shardings["encoder"]["layers"]["layer_0"]["mlp"]["wi"]["kernel"]
    assert wi.spec[0] == "expert"
    inputs = {k: jax.device_put(v, partitioning.batch_sharding(mesh)) for k, v in batch.items()}
    with partitioning.sharding_context(mesh):
        step = jax.jit(jax.value_and_grad(model.loss_fn, has_aux=True),
                       out_shardings=((None, None), shardings))
        (loss, metrics), grads = step(sharded, inputs)
        assert "all-to-all" in step.lower(sharded, inputs).compile().as_text()
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    for k in ref_metrics:
        np.testing.assert_allclose(metrics[k], ref_metrics[k], rtol=1e-5, err_msg=k)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
        b = np.asarray(b)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.max(np.abs(b)))


@pytest.mark.all_devices
def test_switch_t5_trains_on_an_expert_mesh(tmp_path):
    """The Trainer on a data=2 x expert=4 mesh: the loss falls and the router metrics
    reach metrics.jsonl."""
    from tests.train.test_trainer import losses, run
    cfg = TransformerConfig(vocab_size=64, d_model=32, num_heads=4, head_dim=8, d_ff=64,
                            num_encoder_layers=1, num_decoder_layers=1, dropout_rate=0.0,
                            moe_num_experts=4, moe_every=1)
    mesh = partitioning.make_mesh(partitioning.MeshConfig(data=2, expert=4))
    result = run(tmp_path, steps=8, mesh=mesh, model=make_model("t5", cfg))
    ls = losses(result)
    assert ls[-1] < ls[0] - 0.5, ls
    line = json.loads(open(tmp_path / "metrics.jsonl").readline())
    assert {"moe_load_balancing_loss", "moe_router_z_loss", "moe_dropped_fraction"} <= set(line)


def test_params_count_the_experts(capsys):
    """switch_base_8.gin: 619,339,008, the count of transformers' SwitchTransformers with
    google/switch-base-8's sizes; each expert adds one feed-forward and each MoE layer a
    router."""
    dense = TransformerConfig(vocab_size=64, d_model=32, num_heads=4, head_dim=8, d_ff=64,
                              num_encoder_layers=4, num_decoder_layers=2)
    switch = dense.replace(moe_num_experts=8)          # layers 1, 3 (encoder) and 1 (decoder)
    ffn = 3 * 32 * 64                                   # gated: wi_0, wi_1, wo
    assert count_params("t5", switch) - count_params("t5", dense) == 3 * (7 * ffn + 32 * 8)
    from t2t import cli
    assert cli.main(["params", "--gin_file=models/t5/1_1/switch_base_8.gin"]) in (0, None)
    assert "619,339,008" in capsys.readouterr().out


@pytest.mark.slow
def test_switch_t5_compiles_for_a_tpu_slice_with_experts_over_chips():
    """`t2t compile` of the tiny-Bible T5 with Switch layers on v5e-8 (expert=4 x fsdp=2):
    the TPU executable exists, fits, and trades tokens by all-to-all."""
    pytest.importorskip("libtpu")
    from tests.train.test_compile import _compile
    report = _compile("t5", "tpu_v5e_8", "models/t5/1_1/switch_test.gin",
                      "--gin.MeshConfig.expert=4", "--gin.TransformerConfig.scan_layers=False")
    assert report.mesh == {"data": 1, "expert": 4, "fsdp": 2, "tensor": 1}
    assert report.fits
    assert "all-to-all" in report.compiled.as_text()
