"""`TransformerConfig.remat_policy` with `scan_layers` (how the accelerator benchmarks run):
every policy gives the unrematerialised gradients for T5, BERT and GPT-2 shapes, and the
named policies keep exactly the projections they name between the forward and backward
passes."""
import flax.linen as nn
import jax
import numpy as np
import pytest

from t2t.models.families import make_model
from t2t.nn.config import REMAT_POLICIES
from tests.nn.helpers import BERT_TINY, GPT_TINY, T5_TINY

CONFIGS = {"t5": T5_TINY, "bert": BERT_TINY, "gpt": GPT_TINY}
_PARAMS, _REFERENCE = {}, {}


def _batch(family):
    rng = np.random.default_rng(0)
    if family == "bert":
        return {"encoder_input_tokens": rng.integers(1, 64, (2, 8)).astype(np.int32),
                "token_type_ids": np.zeros((2, 8), np.int32),
                "masked_positions": np.array([[1, 3], [2, 5]], np.int32),
                "masked_ids": rng.integers(1, 64, (2, 2)).astype(np.int32),
                "masked_weights": np.ones((2, 2), np.float32),
                "next_sentence_labels": np.array([0, 1], np.int32)}
    batch = {"decoder_input_tokens": rng.integers(1, 64, (2, 8)).astype(np.int32),
             "decoder_target_tokens": rng.integers(1, 64, (2, 8)).astype(np.int32),
             "decoder_loss_weights": np.ones((2, 8), np.float32)}
    if family == "t5":
        batch["encoder_input_tokens"] = rng.integers(1, 64, (2, 8)).astype(np.int32)
    return batch


def _model(family, policy):
    return make_model(family, CONFIGS[family].replace(scan_layers=True, remat_policy=policy))


def _loss_and_grads(family, policy):
    model, batch = _model(family, policy), _batch(family)
    if family not in _PARAMS:
        _PARAMS[family] = nn.unbox(model.init(jax.random.PRNGKey(0), batch))
    return jax.jit(jax.value_and_grad(lambda p: model.loss_fn(p, batch)[0]))(_PARAMS[family])


@pytest.mark.parametrize("family, policy", [
    ("t5", "save_qkv_out_proj"), ("t5", "dots_with_no_batch_dims"), ("bert", "save_qkv_proj"),
    ("bert", "full"), ("gpt", "dots"), ("gpt", "save_qkv_out_proj")])
def test_a_policy_gives_the_same_gradients(family, policy):
    if family not in _REFERENCE:
        _REFERENCE[family] = _loss_and_grads(family, "none")
    want, want_grads = _REFERENCE[family]
    got, got_grads = _loss_and_grads(family, policy)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    for a, b in zip(jax.tree_util.tree_leaves(want_grads), jax.tree_util.tree_leaves(got_grads)):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("policy, projections, layer_states", [
    ("full", 0, 1), ("save_qkv_proj", 3, 1), ("save_qkv_out_proj", 3, 2)])
def test_named_policies_save_the_named_projections(capsys, policy, projections, layer_states):
    """GPT (2 layers scanned, batch 2 x 8, 4 heads of 8, d_model 32): what the scan keeps
    for the backward pass is the layers' inputs [2, 2, 8, 32], plus q, k, v [2, 2, 8, 4, 8]
    under save_qkv_proj, plus the attention's output projection [2, 2, 8, 32] under
    save_qkv_out_proj."""
    assert policy in REMAT_POLICIES
    model, batch = _model("gpt", policy), _batch("gpt")
    params = nn.unbox(model.init(jax.random.PRNGKey(0), batch))
    jax.ad_checkpoint.print_saved_residuals(lambda p: model.loss_fn(p, batch)[0], params)
    scanned = [line for line in capsys.readouterr().out.splitlines()
               if "output of scan" in line]
    assert sum(line.startswith("f32[2,2,8,4,8]") for line in scanned) == projections
    assert sum(line.startswith("f32[2,2,8,32]") for line in scanned) == layer_states
    assert len(scanned) == projections + layer_states
