"""Funnel-Transformer encoder (Dai et al. 2020): stride-2 mean pooling between blocks, the
first layer of a pooled block attending from pooled queries to unpooled keys, and the
decoder cross-attending to the pooled states."""
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.errors import ConfigError
from t2t.nn import EncoderDecoder
from t2t.nn.blocks import TransformerLayer
from t2t.nn.funnel import FunnelStack, pool_sequence, pool_segments_to
from t2t.nn.position import RelativePositionBias

from tests.nn.helpers import T5_TINY, decode_encoder_decoder_stepwise, init, tokens

CFG = T5_TINY.replace(num_encoder_layers=3, funnel_blocks=(1, 2))


def test_pooling_averages_pairs_within_one_segment_and_keeps_padding_out():
    x = np.random.default_rng(0).normal(size=(1, 7, 4)).astype(np.float32)
    pooled, _ = pool_sequence(jnp.asarray(x), None)
    ref = np.stack([(x[0, 0] + x[0, 1]) / 2, (x[0, 2] + x[0, 3]) / 2,
                    (x[0, 4] + x[0, 5]) / 2, x[0, 6]])[None]           # odd tail alone
    np.testing.assert_allclose(pooled, ref, rtol=1e-6, atol=1e-6)
    seg = jnp.array([[1, 1, 1, 2, 2, 0, 0]])
    pooled, pooled_seg = pool_sequence(jnp.asarray(x), seg)
    np.testing.assert_array_equal(pooled_seg, [[1, 1, 2, 0]])
    ref = np.stack([(x[0, 0] + x[0, 1]) / 2, x[0, 2], x[0, 4], np.zeros(4)])[None]
    np.testing.assert_allclose(pooled, ref, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(pool_segments_to(seg, 2), [[1, 2]])


def test_funnel_stack_is_its_layers_with_pooling_and_strided_relative_positions():
    x = np.random.default_rng(1).normal(size=(2, 7, 32)).astype(np.float32)
    stack = FunnelStack(CFG, TransformerLayer)
    params = init(stack, jnp.asarray(x))
    out = stack.apply({"params": params}, jnp.asarray(x))
    assert out.shape == (2, 4, 32)

    def bias(q, k):
        return RelativePositionBias(CFG, bidirectional=True).apply(
            {"params": params["relpos"]}, jnp.arange(q) * (2 if q == 4 else 1),
            jnp.arange(k) * (2 if k == 4 else 1))

    def layer(i, h, b, kv=None):
        return TransformerLayer(CFG).apply({"params": params[f"layer_{i}"]}, h, None, None, b,
                                           self_kv=kv)

    h = layer(0, jnp.asarray(x), bias(7, 7))
    padded = np.concatenate([np.asarray(h), np.asarray(h)[:, -1:]], axis=1)
    pooled = padded.reshape(2, 4, 2, 32).mean(2)
    h1 = layer(1, jnp.asarray(pooled), bias(4, 7), kv=h)          # pooled q, unpooled k/v
    h2 = layer(2, h1, bias(4, 4))
    np.testing.assert_allclose(out, h2, rtol=1e-5, atol=1e-5)


def test_decoder_reads_the_pooled_memory_and_padding_stays_invisible():
    model = EncoderDecoder(CFG)
    enc, dec = tokens(0, (2, 7)), tokens(1, (2, 5))
    seg = jnp.array([[1] * 7, [1] * 5 + [0] * 2])
    params = init(model, enc, dec, seg)
    encoded = model.apply({"params": params}, enc, seg, method=EncoderDecoder.encode)
    assert encoded.shape == (2, 4, 32)
    out = model.apply({"params": params}, enc, dec, seg)
    other = enc.at[1, 5:].set(3)                                    # other padding tokens
    np.testing.assert_allclose(model.apply({"params": params}, other, dec, seg)[1], out[1],
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(decode_encoder_decoder_stepwise(model, params, enc, dec, seg), out,
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("changes,match", [
    ({"funnel_blocks": (1, 1)}, "summing to num_encoder_layers"),
    ({"scan_layers": True}, "scan_layers"),
    ({"position_embedding": "rotary"}, "rotary"),
])
def test_bad_funnel_options_are_one_line_config_errors(changes, match):
    with pytest.raises(ConfigError, match=match):
        CFG.replace(**changes)
