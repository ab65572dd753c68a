"""Lightweight and dynamic convolutions (Wu et al. 2019) against a numpy loop over the
paper's definition: GLU input, depthwise softmax-normalised kernels shared by H channel
groups (a kernel per position for the dynamic one), centred or causal, output projection."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.errors import ConfigError
from t2t.nn import Decoder, EncoderDecoder
from t2t.nn.lightweight_conv import ConvolutionBlock

from tests.nn.helpers import (GPT_TINY, T5_TINY, decode_encoder_decoder_stepwise, init,
                              max_diff, tokens)
from tests.nn.test_stacks import decode_stepwise

CFG = T5_TINY.replace(conv_kernel_size=3)


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _reference(params, x, kind, causal, valid=None):
    """x [b, l, d] -> [b, l, d]; valid [b, l, l] (True where query i may read key j)."""
    w_in = np.asarray(params["input"]["kernel"], np.float64)                 # [d, 2, d]
    gates = np.einsum("bld,dge->blge", x, w_in)
    u = gates[..., 0, :] / (1 + np.exp(-gates[..., 1, :]))                   # GLU
    b, l, d = u.shape
    h, k = CFG.num_heads, CFG.conv_kernel_size
    if kind == "dynamic":
        kernels = _softmax(np.einsum("blc,chk->blhk", u,
                                     np.asarray(params["kernel_proj"]["kernel"])))
    else:
        kernels = np.broadcast_to(_softmax(np.asarray(params["kernel"], np.float64)),
                                  (b, l, h, k))
    left = k - 1 if causal else (k - 1) // 2
    out = np.zeros_like(u)
    for bi, i, c, j in np.ndindex(b, l, d, k):
        src = i - left + j
        if 0 <= src < l and (valid is None or valid[bi, i, src]):
            out[bi, i, c] += kernels[bi, i, c // (d // h), j] * u[bi, src, c]
    return out @ np.asarray(params["out"]["kernel"], np.float64)


@pytest.mark.parametrize("kind", ["lightweight", "dynamic"])
@pytest.mark.parametrize("causal", [False, True])
def test_block_is_glu_then_normalised_depthwise_conv_then_projection(kind, causal):
    cfg = CFG.replace(convolution=kind)
    block = ConvolutionBlock(cfg, causal=causal)
    x = np.random.default_rng(0).normal(size=(2, 6, 32)).astype(np.float32)
    params = init(block, jnp.asarray(x))
    assert ("kernel" in params) == (kind == "lightweight")
    out = block.apply({"params": params}, jnp.asarray(x))
    np.testing.assert_allclose(out, _reference(params, x, kind, causal), rtol=1e-4, atol=1e-5)
    # The attention mask (here: packed segments and padding) zeroes taps across segments.
    seg = np.array([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 1, 1]])
    valid = (seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] > 0)
    masked = block.apply({"params": params}, jnp.asarray(x), None,
                         jnp.asarray(valid)[:, None])
    np.testing.assert_allclose(masked, _reference(params, x, kind, causal, valid),
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["lightweight", "dynamic"])
def test_per_channel_kernels_and_the_pointwise_map_make_a_separable_convolution(kind):
    """conv_groups = d (a kernel per channel) and conv_pointwise (d -> d + bias after the
    taps): Narang et al.'s block, GLU -> separable convolution -> projection."""
    cfg = CFG.replace(convolution=kind, conv_groups=32, conv_pointwise=True)
    block = ConvolutionBlock(cfg, causal=True)
    x = np.random.default_rng(2).normal(size=(2, 5, 32)).astype(np.float32)
    params = init(block, jnp.asarray(x))
    p = {k: {n: np.asarray(w, np.float64) for n, w in v.items()} if isinstance(v, dict)
         else np.asarray(v, np.float64) for k, v in params.items()}
    gates = np.einsum("bld,dge->blge", x, p["input"]["kernel"])
    u = gates[..., 0, :] / (1 + np.exp(-gates[..., 1, :]))                   # [b, l, d]
    if kind == "dynamic":                                                    # [b, l, d, k]
        kernels = _softmax(np.einsum("blc,chk->blhk", u, p["kernel_proj"]["kernel"]))
    else:
        kernels = np.broadcast_to(_softmax(p["kernel"]), (2, 5, 32, 3))
    taps = np.zeros_like(u)
    for i, j in np.ndindex(5, 3):                                            # causal: i-2+j
        if i - 2 + j >= 0:
            taps[:, i] += kernels[:, i, :, j] * u[:, i - 2 + j]
    ref = (taps @ p["pointwise"]["kernel"] + p["pointwise"]["bias"]) @ p["out"]["kernel"]
    np.testing.assert_allclose(block.apply({"params": params}, jnp.asarray(x)), ref,
                               rtol=1e-4, atol=1e-5)
    with pytest.raises(ConfigError, match="channel groups"):
        CFG.replace(convolution=kind, conv_groups=5)


def test_weight_dropout_drops_normalised_kernel_taps_in_training_only():
    cfg = CFG.replace(convolution="lightweight", attention_dropout_rate=0.5)
    x = jnp.asarray(np.random.default_rng(1).normal(size=(2, 6, 32)), jnp.float32)
    params = init(ConvolutionBlock(cfg), x)
    plain = ConvolutionBlock(cfg).apply({"params": params}, x)
    train = ConvolutionBlock(cfg, deterministic=False).apply(
        {"params": params}, x, rngs={"dropout": jax.random.PRNGKey(3)})
    assert max_diff(train, plain) > 1e-3
    no_rate = ConvolutionBlock(cfg.replace(attention_dropout_rate=0.0), deterministic=False)
    assert max_diff(no_rate.apply({"params": params}, x,
                                  rngs={"dropout": jax.random.PRNGKey(3)}), plain) == 0.0


@pytest.mark.parametrize("kind", ["lightweight", "dynamic"])
def test_decoder_convolutions_are_causal_and_decode_through_the_cache(kind):
    gpt = Decoder(GPT_TINY.replace(convolution=kind, conv_kernel_size=3))
    toks = tokens(2, (2, 9))
    params = init(gpt, toks)
    full = gpt.apply({"params": params}, toks)
    later = gpt.apply({"params": params}, toks.at[:, 5:].set(7))
    assert max_diff(full[:, :5], later[:, :5]) < 1e-6                     # no look-ahead
    assert max_diff(decode_stepwise(gpt, params, toks), full) < 1e-4
    model = EncoderDecoder(CFG.replace(convolution=kind))
    enc, dec = tokens(0, (2, 7)), tokens(1, (2, 5))
    seg = jnp.array([[1] * 7, [1] * 5 + [0] * 2])
    params = init(model, enc, dec, seg)
    assert "kernel" in str(jax.tree_util.tree_structure(params["encoder"]["layers"]["layer_0"]))
    full = model.apply({"params": params}, enc, dec, seg)
    assert max_diff(decode_encoder_decoder_stepwise(model, params, enc, dec, seg), full) < 1e-4


@pytest.mark.parametrize("changes,match", [
    ({"convolution": "depthwise"}, "convolution"),
    ({"convolution": "dynamic", "conv_kernel_size": 0}, "conv_kernel_size"),
    ({"convolution": "lightweight", "share_encoder_decoder": True}, "share_encoder_decoder"),
])
def test_bad_convolution_options_are_one_line_config_errors(changes, match):
    with pytest.raises(ConfigError, match=match):
        CFG.replace(**changes)
