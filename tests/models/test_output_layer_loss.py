"""The adaptive softmax and the mixture of softmaxes through the ordinary loss path: the
decoder's normalised log-probabilities go into `losses.cross_entropy_with_logits` as
logits, so the loss is the paper's negative log-likelihood (computed here in numpy from
the decoder's last hidden state) and the z-loss is 0."""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.models.gpt import DecoderOnlyModel
from t2t.models.t5 import EncoderDecoderModel
from t2t.nn import Decoder

from tests.nn.helpers import GPT_TINY, T5_TINY, tokens


def _np_log_softmax(x):
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def _dense(p, x):
    """x · kernel + bias (GPT_TINY's dense layers have biases), any kernel rank."""
    kernel = np.asarray(p["kernel"], np.float64)
    return np.tensordot(x, kernel, axes=1) + np.asarray(p["bias"], np.float64)


def _adaptive_reference(p, h):
    head = _np_log_softmax(_dense(p["head"], h))
    out = [head[..., :10]]
    for i in (1, 2):
        x = _dense(p[f"tail_{i}_projection"], h)
        out.append(head[..., 9 + i, None] + _np_log_softmax(_dense(p[f"tail_{i}"], x)))
    return np.concatenate(out, -1)


def _mos_reference(p, h):
    prior = _np_log_softmax(_dense(p["prior"], h))
    ctx = np.tanh(_dense(p["contexts"], h))                               # [b, l, K, d]
    comp = _np_log_softmax(np.tensordot(ctx, np.asarray(p["logits_dense"]["kernel"]), axes=1))
    a = prior[..., None] + comp
    m = a.max(-2)
    return m + np.log(np.exp(a - m[..., None, :]).sum(-2))


@pytest.mark.parametrize("layer,reference", [
    ("adaptive_softmax", _adaptive_reference), ("mixture_of_softmaxes", _mos_reference)])
def test_loss_is_the_negative_log_likelihood_of_the_output_layer(layer, reference):
    cfg = GPT_TINY.replace(output_layer=layer, adaptive_cutoffs=(10, 30), tie_embeddings=False,
                           mos_num_softmaxes=3)
    model = DecoderOnlyModel(cfg)
    inputs, targets = tokens(0, (2, 6)), tokens(1, (2, 6))
    weights = jnp.array([[1.0] * 6, [1.0] * 4 + [0.0] * 2])
    batch = {"decoder_input_tokens": inputs, "decoder_target_tokens": targets,
             "decoder_loss_weights": weights}
    # jitted: one compile each, not many eager ops
    params = nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), batch))
    loss, metrics = jax.jit(model.loss_fn)(params, batch)
    hidden_fn = jax.jit(functools.partial(Decoder(cfg).apply, return_hidden=True))
    hidden = np.asarray(hidden_fn({"params": params}, inputs), np.float64)
    log_p = reference(params[layer], hidden)                       # [b, l, V]
    token_lp = np.take_along_axis(log_p, np.asarray(targets)[..., None], -1)[..., 0]
    w = np.asarray(weights)
    np.testing.assert_allclose(float(loss), -(token_lp * w).sum() / w.sum(), rtol=1e-5)
    assert abs(float(metrics["z_loss"])) < 1e-8                    # log Z = 0: normalised
    np.testing.assert_allclose(jax.jit(model.score)(params, batch), (token_lp * w).sum(-1),
                               rtol=1e-5)
    grads = jax.jit(jax.grad(lambda p: model.loss_fn(p, batch)[0]))(params)
    assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree_util.tree_leaves(grads))


@pytest.mark.parametrize("changes", [
    {"transparent_attention": True},
    {"num_encoder_layers": 3, "funnel_blocks": (1, 2)},
    {"output_layer": "adaptive_softmax", "adaptive_cutoffs": (10, 30), "tie_embeddings": False,
     "adaptive_input": True},
    {"share_layers": True, "num_decoder_layers": 3},
    {"share_layers": True, "share_layers_in": "decoder", "transparent_attention": True},
], ids=["transparent", "funnel", "adaptive", "block_sharing", "shared_decoder_transparent"])
def test_greedy_decoding_equals_the_argmax_of_a_full_pass(changes):
    """predict's cached decoding feeds back its own argmax: a full teacher-forced pass over
    the predicted tokens must choose the same tokens."""
    model = EncoderDecoderModel(T5_TINY.replace(**changes))
    batch = {"encoder_input_tokens": tokens(0, (2, 7)),
             "decoder_input_tokens": jnp.zeros((2, 4), jnp.int32)}
    params = model.init(jax.random.PRNGKey(0), batch)
    predicted = model.predict(params, batch, max_decode_length=4, eos_id=None)
    shifted = jnp.concatenate([jnp.zeros((2, 1), jnp.int32), predicted[:, :-1]], axis=1)
    logits = model.apply(params, {**batch, "decoder_input_tokens": shifted})
    np.testing.assert_array_equal(predicted, jnp.argmax(logits, -1))
