"""`TransformerConfig.loss_chunk_tokens`: the output projection and cross entropy a chunk of
positions at a time (`losses.chunked_cross_entropy`, t2t/models/chunked_loss.py) give the
unchunked loss, metrics and gradients, and the largest buffer of the step shrinks."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.errors import ConfigError
from t2t.models import losses
from t2t.models.base import LossConfig
from t2t.models.families import make_model
from t2t.nn.config import TransformerConfig
from tests.nn.helpers import BERT_TINY, GPT_TINY, T5_TINY

B, L, D, V = 3, 10, 16, 50


def _problem(seed=0):
    r = jax.random.split(jax.random.PRNGKey(seed), 3)
    hidden = jax.random.normal(r[0], (B, L, D))
    kernel = jax.random.normal(r[1], (D, V)) * 0.5
    targets = jax.random.randint(r[2], (B, L), 0, V)
    weights = jnp.asarray((np.arange(L)[None] < np.array([[10], [7], [0]])), jnp.float32)
    return hidden, kernel, targets, weights


def _unchunked(hidden, kernel, targets, weights, **options):
    logits = hidden @ kernel
    loss, z, weight_sum = losses.cross_entropy_with_logits(logits, targets, weights, **options)
    return loss, z, weight_sum, losses.accuracy(logits, targets, weights)


def _chunked(chunk_tokens):
    def fn(hidden, kernel, targets, weights, **options):
        return losses.chunked_cross_entropy(lambda h: h @ kernel, hidden, targets, weights,
                                            chunk_tokens=chunk_tokens, **options)
    return fn


@pytest.mark.parametrize("chunk_tokens", [1, 7, 12, 10_000])
@pytest.mark.parametrize("options", [
    dict(z_loss=1e-3, label_smoothing=0.1),
    dict(z_loss=0.0, loss_normalizing_factor=17.0),
], ids=["z_loss+smoothing", "fixed_factor"])
def test_chunks_give_the_loss_metrics_and_gradients(chunk_tokens, options):
    """Chunks of 1 position, of 7 // 3 = 2 (10 positions padded to 10), of 4 (padded to 12)
    and one chunk; a row of weight 0 and a partly weighted one."""
    args = _problem()

    def value_and_grads(fn):
        out = fn(*args, **options)
        grads = jax.grad(lambda h, k: fn(h, k, *args[2:], **options)[0], (0, 1))(*args[:2])
        return out, grads

    want, want_grads = value_and_grads(_unchunked)
    got, got_grads = value_and_grads(_chunked(chunk_tokens))
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-6, atol=1e-6)
    for a, b in zip(want_grads, got_grads):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def test_the_largest_buffer_shrinks():
    """The gradient step of a 4 x 256-token loss over 8,192 classes: unchunked it holds
    [4, 256, 8192] logits and probabilities (32 MB each in float32); in chunks of 128
    tokens the chunk's few [4, 32, 8192] buffers (XLA:CPU: 101 MB -> 13 MB)."""
    r = jax.random.split(jax.random.PRNGKey(1), 3)
    hidden = jax.random.normal(r[0], (4, 256, 32))
    kernel = jax.random.normal(r[1], (32, 8192)) * 0.1
    targets = jax.random.randint(r[2], (4, 256), 0, 8192)
    weights = jnp.ones((4, 256), jnp.float32)

    def temp_bytes(fn):
        step = jax.jit(jax.grad(lambda h, k: fn(h, k, targets, weights)[0], (0, 1)))
        return step.lower(hidden, kernel).compile().memory_analysis().temp_size_in_bytes

    whole, chunked = temp_bytes(_unchunked), temp_bytes(_chunked(128))
    logits_bytes = 4 * 256 * 8192 * 4
    assert whole >= 2 * logits_bytes, whole            # logits and probabilities at least
    assert chunked < logits_bytes / 2 and chunked < whole / 4, (chunked, whole)


ONE_LAYER = dict(num_encoder_layers=1, num_decoder_layers=1)   # the layers do not matter
CASES = {"t5": T5_TINY.replace(tie_embeddings=False, **ONE_LAYER),  # T5.1.1's logits_dense
         "gpt": GPT_TINY.replace(num_decoder_layers=1),
         "bert": BERT_TINY.replace(num_encoder_layers=1)}


def _batch(family):
    rng = np.random.default_rng(0)
    if family == "bert":
        return {"encoder_input_tokens": rng.integers(1, 64, (2, 12)).astype(np.int32),
                "token_type_ids": np.zeros((2, 12), np.int32),
                "masked_positions": np.array([[1, 4, 6, 9], [0, 2, 3, 11]], np.int32),
                "masked_ids": rng.integers(1, 64, (2, 4)).astype(np.int32),
                "masked_weights": np.array([[1, 1, 1, 0], [1, 1, 1, 1]], np.float32),
                "next_sentence_labels": np.array([0, 1], np.int32)}
    batch = {"decoder_input_tokens": rng.integers(1, 64, (2, 9)).astype(np.int32),
             "decoder_target_tokens": rng.integers(1, 64, (2, 9)).astype(np.int32),
             "decoder_loss_weights": np.array([[1] * 9, [1] * 5 + [0] * 4], np.float32)}
    if family == "t5":
        batch["encoder_input_tokens"] = rng.integers(1, 64, (2, 7)).astype(np.int32)
    return batch


@pytest.mark.parametrize("family", ["t5", "gpt", "bert"])
def test_a_model_with_chunks_has_the_same_loss_metrics_and_gradients(family):
    """T5 (untied logits_dense), GPT (the tied table) and BERT's MLM head, with z-loss and
    label smoothing, 5 target tokens a chunk (9 positions of 2 rows -> chunks of 2)."""
    loss = LossConfig(z_loss=1e-3, label_smoothing=0.1)
    batch = _batch(family)
    plain = make_model(family, CASES[family], loss)
    chunked = make_model(family, CASES[family].replace(loss_chunk_tokens=5), loss)
    params = nn.unbox(plain.init(jax.random.PRNGKey(0), batch))

    def run(model):
        return jax.jit(jax.value_and_grad(lambda p: model.loss_fn(p, batch), has_aux=True))(
            params)

    (want, want_metrics), want_grads = run(plain)
    (got, got_metrics), got_grads = run(chunked)
    assert set(got_metrics) == set(want_metrics)
    for name in want_metrics:
        np.testing.assert_allclose(got_metrics[name], want_metrics[name], rtol=1e-5,
                                   err_msg=name)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    flat_want = jax.tree_util.tree_leaves_with_path(want_grads)
    for (path, a), b in zip(flat_want, jax.tree_util.tree_leaves(got_grads)):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6,
                                   err_msg=jax.tree_util.keystr(path))


def test_chunks_with_a_loss_they_would_miss_are_a_config_error():
    with pytest.raises(ConfigError, match="loss_chunk_tokens chunks a plain softmax"):
        TransformerConfig(loss_chunk_tokens=64, output_layer="mixture_of_softmaxes")
    with pytest.raises(ConfigError, match="loss_chunk_tokens must be >= 0"):
        TransformerConfig(loss_chunk_tokens=-1)
