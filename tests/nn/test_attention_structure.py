"""`TransformerConfig.attention_structure`: cuDNN's kernel told causality (`is_causal`) and
right padding (sequence lengths) instead of a dense [batch, 1, q, k] mask, T5's relative
bias kept [1, heads, q, k]. On this CPU the "cudnn" kernel is JAX's XLA version of the same
function, so the structured path must give the dense-mask path's losses and gradients.
"""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.models.families import make_model
from t2t.nn import attention
from t2t.nn import attention_kernels as ak
from t2t.nn.attention import causal_mask, combine_masks, dot_product_attention, segment_mask
from tests.nn.helpers import BERT_TINY, GPT_TINY, T5_TINY

LENGTH, TARGETS = 8, 6
PACKED = np.array([[1, 1, 1, 2, 2, 2, 0, 0], [1] * 8, [1, 1, 1, 1, 0, 0, 0, 0]], np.int32)
# scanned layers: one layer body to compile (the bias is still shared by two layers)
BERT, GPT, T5 = (c.replace(scan_layers=True) for c in (BERT_TINY, GPT_TINY, T5_TINY))


def _segments(lengths, width):
    """Right-padded rows: 1 on the first `length` tokens, 0 after."""
    return (np.arange(width)[None, :] < np.asarray(lengths)[:, None]).astype(np.int32)


def _tokens(seed, segments, vocab=64):
    rng = np.random.default_rng(seed)
    return (rng.integers(2, vocab, segments.shape) * (segments > 0)).astype(np.int32)


def _batch(family, enc_segments=None, dec_segments=None):
    if family == "bert":
        b = enc_segments.shape[0]
        return {"encoder_input_tokens": _tokens(0, enc_segments),
                "encoder_segment_ids": enc_segments,
                "token_type_ids": np.zeros_like(enc_segments),
                "masked_positions": np.tile(np.array([[0, 1]], np.int32), (b, 1)),
                "masked_ids": _tokens(1, np.ones((b, 2), np.int32)),
                "masked_weights": np.ones((b, 2), np.float32),
                "next_sentence_labels": np.arange(b, dtype=np.int32) % 2}
    batch = {"decoder_input_tokens": _tokens(2, dec_segments),
             "decoder_target_tokens": _tokens(3, dec_segments),
             "decoder_loss_weights": (dec_segments > 0).astype(np.float32),
             "decoder_segment_ids": dec_segments}
    if family == "t5":
        batch.update(encoder_input_tokens=_tokens(4, enc_segments),
                     encoder_segment_ids=enc_segments)
    return batch


_PARAMS, _STEPS = {}, {}   # per family / per (family, config): built once for the file


def _loss_and_grads(family, config, batch):
    """(loss, gradients) of the family's loss_fn, its jitted function shared by batches of
    one shape (structure or not, the parameters are the same: one init per family)."""
    if (family, config) not in _STEPS:
        model = make_model(family, config)
        _STEPS[family, config] = jax.jit(jax.value_and_grad(
            lambda p, b: model.loss_fn(p, b)[0]))
        if family not in _PARAMS:
            _PARAMS[family] = nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), batch))
    loss, grads = _STEPS[family, config](_PARAMS[family], batch)
    return float(loss), grads


def _assert_same(family, config, batch, calls):
    """Dense masks (attention_structure off) and structure give the same loss and
    gradients; `calls` collects what reached jax.nn.dot_product_attention with it on
    (traced once per batch shape: a test's shapes are traced in it alone)."""
    dense = config.replace(attention_kernel="cudnn")
    want, want_grads = _loss_and_grads(family, dense, batch)
    calls.clear()
    got, got_grads = _loss_and_grads(family, dense.replace(attention_structure=True), batch)
    assert abs(got - want) < 1e-5 * max(1.0, abs(want)), (got, want)
    diffs = jax.tree_util.tree_map(   # numpy: no eager jnp op per leaf
        lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b)))), want_grads, got_grads)
    assert max(jax.tree_util.tree_leaves(diffs)) < 1e-5, diffs


@pytest.fixture
def calls(monkeypatch):
    """Each call of `attention._jax_attention` (the jax.nn.dot_product_attention call) as
    (mask shape or None, bias shape or None, causal, has lengths)."""
    seen = []
    real = attention._jax_attention

    def spy(q, k, v, mask, bias, scale, **structure):
        lengths = structure.get("lengths", (None, None))
        seen.append((None if mask is None else mask.shape, None if bias is None else bias.shape,
                     structure.get("causal", False), lengths[1] is not None))
        return real(q, k, v, mask, bias, scale, **structure)

    monkeypatch.setattr(attention, "_jax_attention", spy)
    return seen


def test_bert_padding_as_lengths(calls):
    """BERT-style right padding (a full row, two padded ones): lengths, no mask. (The
    outputs at padding positions differ, which no loss reads: the masked positions are
    real tokens.)"""
    seg = _segments([8, 5, 2], LENGTH)
    _assert_same("bert", BERT, _batch("bert", seg), calls)
    assert (None, None, False, True) in calls            # the lengths branch
    assert ((3, 1, LENGTH, LENGTH), None, False, False) in calls   # the packed fallback


@pytest.mark.parametrize("lengths", [None, [8, 3, 0]], ids=["unpadded", "padded"])
def test_gpt_causal_as_is_causal(calls, lengths):
    """A causal LM: no mask array at all without segment ids; with right padding (and a row
    of padding alone) is_causal plus lengths."""
    seg = _segments([LENGTH] * 3 if lengths is None else lengths, LENGTH)
    batch = _batch("gpt", dec_segments=seg)
    if lengths is None:
        del batch["decoder_segment_ids"]
    _assert_same("gpt", GPT, batch, calls)
    assert (None, None, True, lengths is not None) in calls
    if lengths is None:
        assert all(mask is None for mask, *_ in calls)
    else:   # two examples in a row: lengths cannot say that, the dense mask is taken
        _assert_same("gpt", GPT, _batch("gpt", dec_segments=PACKED), calls)


def test_t5_causal_decoder_padding_and_an_unbroadcast_bias(calls):
    """T5: encoder padding as lengths with the relative bias [1, heads, q, k] (not [batch,
    ...]), the decoder causal plus lengths with its bias, cross-attention lengths."""
    enc, dec = _segments([8, 6, 3], LENGTH), _segments([6, 2, 4], TARGETS)
    _assert_same("t5", T5, _batch("t5", enc, dec), calls)
    heads = T5_TINY.num_heads
    assert (None, (1, heads, LENGTH, LENGTH), False, True) in calls       # encoder
    assert (None, (1, heads, TARGETS, TARGETS), True, True) in calls      # decoder
    assert (None, None, False, True) in calls                             # cross
    assert all(bias is None or bias[0] == 1 for _, bias, *_ in calls)
    # packed rows: lengths cannot say them, so the device takes the dense masks instead
    _assert_same("t5", T5, _batch("t5", PACKED, PACKED[:, :TARGETS]), calls)


def test_t5_without_segment_ids_is_causal_and_bias_only(calls):
    """The benchmark's T5 batch (no segment ids): is_causal in the decoder, no mask."""
    batch = _batch("t5", _segments([8] * 2, LENGTH), _segments([6] * 2, TARGETS))
    del batch["encoder_segment_ids"], batch["decoder_segment_ids"]
    _assert_same("t5", T5, batch, calls)
    assert all(mask is None and not has_lengths for mask, _, _, has_lengths in calls)
    assert any(causal for _, _, causal, _ in calls)


def test_the_lengths_flag_is_false_for_packed_or_left_padded_rows():
    def exact(q_seg, k_seg):
        return bool(ak.cudnn_mask(None, jnp.asarray(q_seg), jnp.asarray(k_seg)).lengths_exact)

    right = [[1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]]
    assert exact(right, right)
    assert not exact([[1, 1, 2, 2]], [[1, 1, 2, 2]])          # packed
    assert not exact([[0, 1, 1, 1]], [[0, 1, 1, 1]])          # left-padded
    assert not exact([[1, 1, 0, 0]], [[0, 0, 0, 0]])          # real queries, no real key
    mask = ak.cudnn_mask(None, jnp.asarray(right), jnp.asarray(right))
    np.testing.assert_array_equal(mask.q_lengths, [3, 4, 1])  # a padding row reads key 0


def test_on_a_gpu_the_structure_reaches_cudnn(monkeypatch):
    """With a (faked) GPU and bf16 inputs, jax.nn.dot_product_attention gets is_causal and
    the lengths, no mask, and the bias unbroadcast; the packed fallback gets the mask."""
    seen = []

    def fake(q, k, v, *, bias, mask, scale, implementation, **structure):
        seen.append(dict(bias=bias, mask=mask, implementation=implementation, **structure))
        return q

    monkeypatch.setattr(ak, "target_platform", lambda: "gpu")
    monkeypatch.setattr(jax.nn, "dot_product_attention", fake)
    r = jax.random.split(jax.random.PRNGKey(0), 3)
    q, k, v = (jax.random.normal(key, (2, 8, 4, 64), jnp.bfloat16) for key in r)
    seg = jnp.asarray(_segments([8, 5], 8))
    dense = combine_masks(causal_mask(8), segment_mask(seg, seg))
    bias = jnp.zeros((1, 4, 8, 8), jnp.float32)
    dot_product_attention(q, k, v, ak.cudnn_mask(dense, seg, seg, causal=True), bias,
                          scale=1.0, kernel="cudnn", dropout_rate=0.0, dropout_rng=None,
                          deterministic=True, dtype=jnp.bfloat16)
    by_lengths, by_mask = seen
    assert by_lengths["implementation"] == "cudnn" and by_lengths["mask"] is None
    assert by_lengths["is_causal"] and by_lengths["bias"].shape == (1, 4, 8, 8)
    assert by_lengths["query_seq_lengths"].dtype == jnp.int32
    assert by_mask["mask"].shape == (2, 1, 8, 8) and "is_causal" not in by_mask
