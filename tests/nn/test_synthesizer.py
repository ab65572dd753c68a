"""Synthesizer attention (Tay et al. 2020) against its equations computed here in numpy."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.errors import ConfigError, UserError
from t2t.nn import Decoder
from t2t.nn.attention import MultiHeadAttention, causal_mask

from tests.nn.helpers import T5_TINY, init, max_diff, tokens
from tests.nn.test_stacks import decode_stepwise

VARIANTS = ["dense", "dense_plus", "dense_plus_alpha", "factorized", "random", "random_plus",
            "random_plus_alpha"]
LENGTH = 8


def _softmax(z):
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def _reference(variant, p, x, mask, bias, head_dim):
    """Y = softmax(logits) V Wo with the variant's logits (Tay et al. sec. 3), in float64."""
    x = np.asarray(x, np.float64)
    s = p["synthesizer"]
    n = x.shape[1]
    v = np.einsum("bld,dhk->blhk", x, p["value"]["kernel"])
    if variant.startswith("dense"):          # B_i = W2 ReLU(W1 X_i + b1) + b2 per head
        hidden = np.maximum(np.einsum("bld,dhk->blhk", x, s["dense_1"]["kernel"])
                            + s["dense_1"]["bias"], 0)
        synth = np.einsum("bqhk,hkl->bhql", hidden, s["dense_2"]) + s["dense_2_bias"][:, None]
        synth = synth[..., :n]
    elif variant.startswith("random"):       # B = R
        synth = np.broadcast_to(np.asarray(s["random"])[None, :, :n, :n], (x.shape[0],) +
                                np.asarray(s["random"])[:, :n, :n].shape)
    else:                                    # factorized random: R1 R2ᵀ
        r1, r2 = np.asarray(s["random_1"]), np.asarray(s["random_2"])
        synth = np.einsum("hqr,hkr->hqk", r1[:, :n], r2[:, :n])[None]
    logits = synth
    if "plus" in variant:                    # + dot product (and its position bias)
        q = np.einsum("bld,dhk->blhk", x, p["query"]["kernel"])
        k = np.einsum("bld,dhk->blhk", x, p["key"]["kernel"])
        dot = np.einsum("bqhk,blhk->bhql", q, k) / np.sqrt(head_dim) + bias
        if variant.endswith("alpha"):
            alpha = 1 / (1 + np.exp(-float(p["synthesizer_alpha"])))
            logits = alpha * synth + (1 - alpha) * dot
        else:
            logits = synth + dot
    logits = np.where(mask, logits, -1e10)
    y = np.einsum("bhql,blhk->bqhk", _softmax(logits), v)
    return np.einsum("bqhk,hkd->bqd", y, p["out"]["kernel"])


@pytest.mark.parametrize("variant", VARIANTS)
def test_attention_matches_the_papers_equation(variant):
    cfg = T5_TINY.replace(synthesizer=variant, synthesizer_length=LENGTH)
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 6, cfg.d_model))
    bias = 0.3 * jax.random.normal(jax.random.PRNGKey(1), (1, cfg.num_heads, 6, 6))
    mask = causal_mask(6)
    attn = MultiHeadAttention(cfg, synthetic=True)
    params = init(attn, x, x, mask, bias)
    if variant.endswith("alpha"):
        params = {**params, "synthesizer_alpha": jnp.asarray(0.7)}   # away from 1/2
    assert ("query" in params) == ("plus" in variant)                # plain: no q, k
    got = attn.apply({"params": params}, x, x, mask, bias)
    want = _reference(variant, jax.tree.map(np.asarray, params), x, np.asarray(mask),
                      np.asarray(bias), cfg.head_dim)
    assert max_diff(got, want) < 1e-5


@pytest.mark.parametrize("variant", ["dense", "factorized", "random_plus_alpha"])
def test_decoder_stays_causal_and_decodes_through_the_cache(variant):
    cfg = T5_TINY.replace(synthesizer=variant, synthesizer_length=LENGTH)
    dec = Decoder(cfg)
    toks = tokens(1, (2, 7))
    params = init(dec, toks)
    full = dec.apply({"params": params}, toks)
    changed = dec.apply({"params": params}, toks.at[:, 5:].set(3))
    assert max_diff(full[:, :5], changed[:, :5]) < 1e-6          # no position sees the future
    assert max_diff(full[:, 5:], changed[:, 5:]) > 1e-3
    assert max_diff(decode_stepwise(dec, params, toks), full) < 1e-4


def test_lengths_beyond_the_table_and_bad_options_are_one_line_errors():
    cfg = T5_TINY.replace(synthesizer="random", synthesizer_length=4)
    dec = Decoder(cfg)
    with pytest.raises(UserError, match="synthesizer_length is 4"):
        init(dec, tokens(1, (1, 5)))
    with pytest.raises(ConfigError, match="synthesizer='sparse'"):
        T5_TINY.replace(synthesizer="sparse")
    with pytest.raises(ConfigError, match="prefix_length=0"):
        T5_TINY.replace(synthesizer="dense", prefix_length=2)


def test_flops_drop_the_dot_product_where_the_variant_has_none():
    from t2t.train.flops import forward_flops_breakdown
    lengths = dict(input_length=8, target_length=4)
    base = forward_flops_breakdown(T5_TINY, "t5", **lengths)
    d, a, layers = T5_TINY.d_model, T5_TINY.num_heads * T5_TINY.head_dim, 2
    random = forward_flops_breakdown(T5_TINY.replace(synthesizer="random"), "t5", **lengths)
    # encoder (8 tokens, bidirectional) and decoder (4 tokens, causal half): no q, k, q·kᵀ
    assert base["dense"] - random["dense"] == layers * 4 * d * a * (8 + 4)
    assert base["attention"] - random["attention"] == layers * 2 * a * (8 * 8 + 0.5 * 4 * 4)
    plus = forward_flops_breakdown(T5_TINY.replace(synthesizer="random_plus"), "t5", **lengths)
    assert plus == base
    dense = forward_flops_breakdown(T5_TINY.replace(synthesizer="dense"), "t5", **lengths)
    assert dense["dense"] - random["dense"] == layers * 2 * d * a * (8 + 4)


@pytest.mark.parametrize("variant", ["dense", "dense_plus_alpha"])
def test_bfloat16_gradients_run_and_track_float32(variant):
    """The dense synthesizer's per-head 'bqhd,hdl->bhql' is a product XLA:CPU cannot run as
    a plain bf16 einsum ("Unsupported element type for DotThunk"); laid out, it runs, and
    its gradients stay within bf16 rounding of float32's."""
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 6, T5_TINY.d_model))
    mask = causal_mask(6)
    params, grads = None, {}
    for dtype in ("float32", "bfloat16"):
        cfg = T5_TINY.replace(synthesizer=variant, synthesizer_length=LENGTH, dtype=dtype)
        attn = MultiHeadAttention(cfg, synthetic=True)
        params = params or init(attn, x, x, mask, None)

        def loss(p, attn=attn):
            return jnp.sum(attn.apply({"params": p}, x, x, mask, None).astype(jnp.float32) ** 2)
        grads[dtype] = jax.jit(jax.grad(loss))(params)
    for want, got in zip(jax.tree.leaves(grads["float32"]), jax.tree.leaves(grads["bfloat16"])):
        assert got.dtype == jnp.float32
        scale = float(jnp.abs(want).max()) + 1e-6
        assert float(jnp.abs(got - want).max()) / scale < 0.05
