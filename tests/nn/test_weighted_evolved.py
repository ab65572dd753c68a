"""The Weighted Transformer's branched attention (Ahmed et al. 2017, eq. 3) and the Evolved
Transformer's cells (So et al. 2019, Figure 3) against numpy transcriptions of the papers'
definitions at tiny sizes, plus causal cached decoding of whole models."""
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.errors import ConfigError
from t2t.nn import EncoderDecoder
from t2t.nn.evolved import EvolvedLayer
from t2t.nn.weighted import BranchedAttention

from tests.nn.helpers import (T5_TINY, decode_encoder_decoder_stepwise, init, max_diff,
                              tokens)

CFG = T5_TINY.replace(norm_type="layer", mlp_activations=("relu",), d_model=16, num_heads=2,
                      head_dim=4, d_ff=24)
RNG = np.random.default_rng(0)


def _np(tree):
    return {k: _np(v) if isinstance(v, dict) else np.asarray(v, np.float64)
            for k, v in tree.items()}


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _heads(p, q_in, kv_in, valid=None):
    """Per-head attention outputs [b, q, H, dv] (softmax(q·kᵀ / sqrt(dv)) v)."""
    q = np.einsum("bld,dhk->blhk", q_in, p["query"]["kernel"])
    k = np.einsum("bld,dhk->blhk", kv_in, p["key"]["kernel"])
    v = np.einsum("bld,dhk->blhk", kv_in, p["value"]["kernel"])
    logits = np.einsum("bqhk,bthk->bhqt", q, k) / np.sqrt(q.shape[-1])
    if valid is not None:
        logits = np.where(valid[:, None], logits, -1e10)
    return np.einsum("bhqt,bthk->bqhk", _softmax(logits), v)


def _mha(p, q_in, kv_in, valid=None):
    return np.einsum("bqhk,hkd->bqd", _heads(p, q_in, kv_in, valid), p["out"]["kernel"])


def _ln(p, x, eps=CFG.norm_eps):
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def _ffn(p, x, act=lambda z: np.maximum(z, 0)):
    return act(x @ p["wi"]["kernel"]) @ p["wo"]["kernel"]


def _on_simplex(z):
    z = np.maximum(z, 0)
    return z / np.sum(z + 1e-4)


def _conv(x, kernel, left, separable, bias=None, pointwise=None):
    """Zero-padded convolution, tap j of position i reading i - left + j: a full kernel
    [k, c, o], or (separable) a depthwise [k, c] then pointwise [c, o] + bias."""
    b, l, c = x.shape
    k = kernel.shape[0]
    out = np.zeros((b, l, kernel.shape[-1] if not separable else c))
    for i, j in np.ndindex(l, k):
        src = i - left + j
        if 0 <= src < l:
            out[:, i] += x[:, src] @ kernel[j] if not separable else x[:, src] * kernel[j]
    return out @ pointwise + bias if separable else out


def _pad(x, width):
    return np.pad(x, [(0, 0), (0, 0), (0, width - x.shape[-1])])


# --------------------------------------------------------------------- Weighted Transformer

def test_branched_attention_is_the_kappa_alpha_weighted_sum_of_branch_ffns():
    x = RNG.normal(size=(2, 5, 16))
    m = RNG.normal(size=(2, 3, 16))
    block = BranchedAttention(CFG)
    params = init(block, jnp.asarray(x, jnp.float32), jnp.asarray(m, jnp.float32))
    p = _np(params)
    kappa, alpha = _on_simplex(p["kappa"]), _on_simplex(p["alpha"])
    assert abs(kappa.sum() - 1) < 1e-3 and abs(alpha.sum() - 1) < 1e-3 and kappa.min() >= 0
    valid = RNG.random((2, 5, 3)) > 0.3
    valid[..., 0] = True
    heads = _heads(p, x, m, valid)                                     # [b, q, H, dv]
    ref = sum(alpha[i] * _ffn(p["mlp"], kappa[i] * heads[:, :, i] @ p["out"][i])
              for i in range(CFG.num_heads))
    out = block.apply({"params": params}, jnp.asarray(x, jnp.float32),
                      jnp.asarray(m, jnp.float32), jnp.asarray(valid)[:, None])
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)


def test_weighted_layer_replaces_attention_and_ffn_and_decodes_through_the_cache():
    cfg = CFG.replace(layer_type="weighted", num_encoder_layers=1, num_decoder_layers=1)
    model = EncoderDecoder(cfg)
    enc, dec = tokens(0, (2, 5)), tokens(1, (2, 6))
    params = init(model, enc, dec)
    enc_layer, dec_layer = (params[s]["layers"]["layer_0"] for s in ("encoder", "decoder"))
    assert sorted(enc_layer) == ["self_attention", "self_attention_norm"]
    assert "mlp" in dec_layer["cross_attention"] and "mlp" not in dec_layer
    full = model.apply({"params": params}, enc, dec)
    assert max_diff(full, decode_encoder_decoder_stepwise(model, params, enc, dec)) < 1e-4


# --------------------------------------------------------------------- Evolved Transformer

def test_evolved_encoder_cell_matches_figure_3():
    x = RNG.normal(size=(2, 6, 16))
    layer = EvolvedLayer(CFG)
    params = init(layer, jnp.asarray(x, jnp.float32))
    p = _np(params)
    g = np.einsum("bld,dge->blge", _ln(p["glu_norm"], x), p["glu"]["kernel"])
    h = x + g[..., 0, :] * _sigmoid(g[..., 1, :])                          # 1. GLU
    n = _ln(p["conv_norm"], h)
    left = np.maximum(n @ p["conv1x1"]["kernel"], 0)                       # 2. d -> 4d
    right = np.maximum(_conv(n, p["conv3x1"]["kernel"], 1, False), 0)      # 3x1, d/2
    mid = _ln(p["conv_mid_norm"], left + _pad(right, 64))
    sep = p["sep_conv9x1"]
    h = h + _pad(_conv(mid, sep["depthwise"], 4, True, sep["pointwise"]["bias"],
                       sep["pointwise"]["kernel"]), 16)                     # Sep 9x1, d/2
    n = _ln(p["self_attention_norm"], h)
    h = h + _mha(p["self_attention"], n, n)                                # 3.
    ref = h + _ffn(p["mlp"], _ln(p["mlp_norm"], h))                        # 4. ReLU FFN
    out = layer.apply({"params": params}, jnp.asarray(x, jnp.float32))
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_evolved_decoder_cell_matches_figure_3():
    x, m = RNG.normal(size=(2, 6, 16)), RNG.normal(size=(2, 4, 16))
    causal = np.tril(np.ones((6, 6), bool))[None].repeat(2, 0)
    layer = EvolvedLayer(CFG, causal=True)
    args = (jnp.asarray(x, jnp.float32), jnp.asarray(m, jnp.float32),
            jnp.asarray(causal)[:, None])
    params = init(layer, *args)
    p = _np(params)
    n = _ln(p["branch_attention_norm"], x)
    assert p["wide_self_attention"]["query"]["kernel"].shape[1] == 2 * CFG.num_heads
    h = x + _mha(p["wide_self_attention"], n, n, causal) + _mha(
        p["branch_cross_attention"], n, m)                                 # 1.
    n = _ln(p["conv_norm"], h)
    s11, s7a, s7b = p["sep_conv11x1"], p["sep_conv7x1_1"], p["sep_conv7x1_2"]
    left = np.maximum(_conv(n, s11["depthwise"], 10, True, s11["pointwise"]["bias"],
                            s11["pointwise"]["kernel"]), 0)                # Sep 11x1, 2d
    right = _conv(n, s7a["depthwise"], 6, True, s7a["pointwise"]["bias"],
                  s7a["pointwise"]["kernel"])                              # Sep 7x1, d/2
    mid = _ln(p["conv_mid_norm"], left + _pad(right, 32))
    h = h + _conv(mid, s7b["depthwise"], 6, True, s7b["pointwise"]["bias"],
                  s7b["pointwise"]["kernel"])                               # 2. Sep 7x1, d
    n = _ln(p["self_attention_norm"], h)
    h = h + _mha(p["self_attention"], n, n, causal)                        # 3.
    h = h + _mha(p["cross_attention"], _ln(p["cross_attention_norm"], h), m)  # 4.
    ref = h + _ffn(p["mlp"], _ln(p["mlp_norm"], h), lambda z: z * _sigmoid(z))  # 5. Swish
    out = layer.apply({"params": params}, *args)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_evolved_model_is_causal_and_decodes_through_the_cache():
    cfg = CFG.replace(layer_type="evolved", num_encoder_layers=1, num_decoder_layers=1)
    model = EncoderDecoder(cfg)
    enc, dec = tokens(2, (2, 5)), tokens(3, (2, 13))   # longer than the 11-wide kernel
    params = init(model, enc, dec)
    full = model.apply({"params": params}, enc, dec)
    changed = model.apply({"params": params}, enc, dec.at[:, 9].set(5))
    assert max_diff(full[:, :9], changed[:, :9]) == 0.0 and max_diff(full, changed) > 0
    assert max_diff(full, decode_encoder_decoder_stepwise(model, params, enc, dec)) < 1e-4


@pytest.mark.parametrize("layer_type", ["weighted", "evolved"])
def test_options_that_change_the_replaced_layer_are_refused(layer_type):
    with pytest.raises(ConfigError, match="replaces the whole layer"):
        CFG.replace(layer_type=layer_type, moe_num_experts=4)
    with pytest.raises(ConfigError, match="layer_type"):
        CFG.replace(layer_type="branched")
