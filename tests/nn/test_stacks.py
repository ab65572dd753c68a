"""Encoder, Decoder and EncoderDecoder: caching, scan, packing, prefix LM, sharing, dtypes."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from t2t.nn import Decoder, Encoder, EncoderDecoder
from t2t.nn.config import TransformerConfig

from tests.nn.helpers import (BERT_TINY, GPT_TINY, T5_TINY, decode_encoder_decoder_stepwise,
                              feed_one_token_at_a_time, init, max_diff, tokens)

LOGICAL_NAMES = {"batch", "length", "embed", "mlp", "heads", "kv", "joined_kv", "vocab",
                 "relpos_buckets", "layers", None}


def decode_stepwise(module, params, toks, **kwargs):
    """Feed tokens one at a time through the KV cache; return stacked logits."""
    cache = jax.jit(lambda: module.init(jax.random.PRNGKey(0), toks, decode=True,
                                        **kwargs)["cache"])()
    return feed_one_token_at_a_time(lambda cache, token: module.apply(
        {"params": params, "cache": cache}, token, decode=True, mutable=["cache"], **kwargs),
        cache, toks)


@pytest.mark.parametrize("cfg", [
    GPT_TINY,
    GPT_TINY.replace(position_embedding="rotary"),
    T5_TINY,
    T5_TINY.replace(scan_layers=True),
], ids=["gpt_learned", "rotary", "t5_relative", "t5_scan"])
def test_cached_decoding_equals_full_recomputation(cfg):
    dec = Decoder(cfg)
    toks = tokens(1, (2, 9))
    params = init(dec, toks)
    full = dec.apply({"params": params}, toks)
    assert max_diff(decode_stepwise(dec, params, toks), full) < 1e-4


@pytest.mark.parametrize("scan", [False, True])
def test_encoder_decoder_cached_decoding(scan):
    """Step by step through the cache == the full pass, scanned or not; the cache is sized
    from other inputs and other parameters (only its shapes may matter)."""
    model = EncoderDecoder(T5_TINY.replace(scan_layers=scan))
    enc, dec = tokens(1, (2, 11)), tokens(2, (2, 6))
    enc_seg = jnp.array([[1] * 11, [1] * 8 + [0] * 3])
    params = init(model, enc, dec, enc_seg)
    full = model.apply({"params": params}, enc, dec, enc_seg)
    assert max_diff(decode_encoder_decoder_stepwise(model, params, enc, dec, enc_seg), full) < 1e-4


def _stack_layers(params, n):
    """Loop-layout params (layer_0..n-1) -> scan layout (layer, leading axis)."""
    layers = params["layers"]
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *[layers[f"layer_{i}"]
                                                                  for i in range(n)])
    return {**params, "layers": {"layer": stacked}}


@pytest.mark.parametrize("remat", ["none", "full", "dots"])
def test_scan_equals_loop(remat):
    cfg = GPT_TINY.replace(num_decoder_layers=3)
    toks = tokens(3, (2, 7))
    loop = Decoder(cfg)
    params = init(loop, toks)
    scan = Decoder(cfg.replace(scan_layers=True, remat_policy=remat))
    scan_params = _stack_layers(params, 3)
    assert jax.tree_util.tree_structure(scan_params) == jax.tree_util.tree_structure(
        init(scan, toks))
    assert max_diff(loop.apply({"params": params}, toks),
                    scan.apply({"params": scan_params}, toks)) < 1e-5
    loss = lambda m, p: jnp.sum(m.apply({"params": p}, toks) ** 2)  # noqa: E731
    g_loop = _stack_layers(jax.grad(lambda p: loss(loop, p))(params), 3)
    g_scan = jax.grad(lambda p: loss(scan, p))(scan_params)
    for a, b in zip(jax.tree_util.tree_leaves(g_loop), jax.tree_util.tree_leaves(g_scan)):
        assert max_diff(a, b) < 1e-4 * (1 + float(jnp.max(jnp.abs(a))))


@pytest.mark.parametrize("cfg", [BERT_TINY, T5_TINY], ids=["learned", "relative"])
def test_packed_encoder_equals_separate_examples(cfg):
    a, b = tokens(4, (1, 5)), tokens(5, (1, 3))
    packed = jnp.concatenate([a, b, jnp.zeros((1, 2), jnp.int32)], axis=1)
    seg = jnp.array([[1] * 5 + [2] * 3 + [0] * 2])
    pos = jnp.array([[0, 1, 2, 3, 4, 0, 1, 2, 0, 0]])
    enc = Encoder(cfg)
    params = init(enc, packed, seg, pos)
    out = enc.apply({"params": params}, packed, seg, pos)
    alone_a = enc.apply({"params": params}, a)
    alone_b = enc.apply({"params": params}, b)
    assert max_diff(out[:, :5], alone_a) < 1e-5
    assert max_diff(out[:, 5:8], alone_b) < 1e-5


def test_packed_decoder_equals_separate_examples():
    a, b = tokens(6, (1, 4)), tokens(7, (1, 4))
    packed = jnp.concatenate([a, b], axis=1)
    seg = jnp.array([[1] * 4 + [2] * 4])
    pos = jnp.array([[0, 1, 2, 3] * 2])
    dec = Decoder(GPT_TINY)
    params = init(dec, packed)
    out = dec.apply({"params": params}, packed, decoder_segment_ids=seg, decoder_positions=pos)
    assert max_diff(out[:, 4:], dec.apply({"params": params}, b)) < 1e-5


def test_prefix_lm_attention():
    """Prefix positions see the whole prefix; nothing sees the future beyond the prefix."""
    dec = Decoder(GPT_TINY)
    toks = tokens(8, (1, 8))
    prefix = jnp.array([[1, 1, 1, 0, 0, 0, 0, 0]])
    params = init(dec, toks)
    run = lambda t: dec.apply({"params": params}, t, decoder_causal_attention=prefix)  # noqa
    base = run(toks)
    changed_prefix = run(toks.at[0, 2].set((toks[0, 2] + 1) % 64))
    assert max_diff(base[:, 0], changed_prefix[:, 0]) > 1e-4   # bidirectional in the prefix
    changed_target = run(toks.at[0, 5].set((toks[0, 5] + 1) % 64))
    assert max_diff(base[:, :5], changed_target[:, :5]) == 0.0  # causal after it
    causal = dec.apply({"params": params}, toks)
    assert max_diff(causal[:, 0], base[:, 0]) > 1e-4
    # fully_visible_prefix=False (T5 Table 2's "Language model"): the flags change nothing.
    closed = Decoder(GPT_TINY.replace(fully_visible_prefix=False))
    flagged = closed.apply({"params": params}, toks, decoder_causal_attention=prefix)
    assert max_diff(flagged, causal) == 0.0


@pytest.mark.parametrize("cfg", [BERT_TINY, T5_TINY], ids=["learned", "relative"])
def test_causal_encoder(cfg):
    """encoder_causal: a later token cannot change earlier positions (it does when
    bidirectional); the causal mask still respects packing."""
    toks = tokens(9, (2, 8))
    changed = toks.at[:, 5].set((toks[:, 5] + 1) % 64)
    for causal in (False, True):
        enc = Encoder(cfg.replace(encoder_causal=causal))
        params = init(enc, toks)
        base, after = enc.apply({"params": params}, toks), enc.apply({"params": params}, changed)
        earlier = max_diff(base[:, :5], after[:, :5])
        assert (earlier == 0.0) if causal else (earlier > 1e-4), (causal, earlier)
        assert max_diff(base[:, 5:], after[:, 5:]) > 1e-4
    a, b = toks[:1, :5], toks[1:, :3]
    packed = jnp.concatenate([a, b, jnp.zeros((1, 2), jnp.int32)], axis=1)
    seg = jnp.array([[1] * 5 + [2] * 3 + [0] * 2])
    pos = jnp.array([[0, 1, 2, 3, 4, 0, 1, 2, 0, 0]])
    out = enc.apply({"params": params}, packed, seg, pos)
    assert max_diff(out[:, :5], enc.apply({"params": params}, a)) < 1e-5
    assert max_diff(out[:, 5:8], enc.apply({"params": params}, b)) < 1e-5


def test_albert_sharing_and_factorized_embeddings():
    cfg = BERT_TINY.replace(num_encoder_layers=4, share_layers=True, embedding_dim=8)
    toks = tokens(9, (2, 6))
    params = init(Encoder(cfg), toks)
    assert set(params["layers"]) == {"layer"}                      # one shared layer
    assert params["token_embedder"]["embedding"].shape == (64, 8)  # V x E
    assert params["embedder"]["embedding_projection"]["kernel"].shape == (8, 32)
    unshared = init(Encoder(cfg.replace(share_layers=False, embedding_dim=None)), toks)
    n = lambda p: sum(x.size for x in jax.tree_util.tree_leaves(p))  # noqa: E731
    assert n(params) < n(unshared) / 2


def test_shared_encoder_decoder_parameters():
    enc, dec = tokens(1, (2, 6)), tokens(2, (2, 4))
    shared = init(EncoderDecoder(T5_TINY.replace(share_encoder_decoder=True)), enc, dec)
    separate = init(EncoderDecoder(T5_TINY), enc, dec)
    assert "shared_layers" in shared and "layers" not in shared["encoder"]
    n = lambda p: sum(x.size for x in jax.tree_util.tree_leaves(p))  # noqa: E731
    per_layer_self_mlp = n(separate["encoder"]["layers"])
    assert n(separate) - n(shared) == per_layer_self_mlp


def test_scaled_tied_logits():
    toks, dec_toks = tokens(1, (1, 5)), tokens(2, (1, 3))
    model = EncoderDecoder(T5_TINY)
    params = init(model, toks, dec_toks)
    plain = model.apply({"params": params}, toks, dec_toks)
    scaled = EncoderDecoder(T5_TINY.replace(scale_tied_logits=True)).apply(
        {"params": params}, toks, dec_toks)
    assert max_diff(scaled, plain * 32 ** -0.5) < 1e-5
    untied = init(EncoderDecoder(T5_TINY.replace(tie_embeddings=False)), toks, dec_toks)
    assert untied["decoder"]["logits_dense"]["kernel"].shape == (32, 64)


@pytest.mark.parametrize("module,args", [
    (Encoder(BERT_TINY), (tokens(1, (2, 5)),)),
    (Decoder(T5_TINY.replace(scan_layers=True)), (tokens(1, (2, 5)),)),
    (EncoderDecoder(T5_TINY), (tokens(1, (2, 5)), tokens(2, (2, 3)))),
], ids=["encoder", "decoder_scan", "encdec"])
def test_every_parameter_has_logical_axes(module, args):
    boxed = module.init(jax.random.PRNGKey(0), *args)["params"]
    leaves = jax.tree_util.tree_leaves(boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))
    for leaf in leaves:
        assert isinstance(leaf, nn.LogicallyPartitioned), leaf
        assert len(leaf.names) == leaf.value.ndim
        assert set(leaf.names) <= LOGICAL_NAMES, leaf.names


def test_bfloat16_compute_float32_params():
    cfg = T5_TINY.replace(dtype="bfloat16")
    toks, dec = tokens(1, (2, 6)), tokens(2, (2, 4))
    model = EncoderDecoder(cfg)
    params = init(model, toks, dec)
    assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(params))
    out16 = model.apply({"params": params}, toks, dec)
    out32 = EncoderDecoder(T5_TINY).apply({"params": params}, toks, dec)
    assert out16.dtype == jnp.bfloat16
    assert max_diff(out16, out32) < 0.05 * float(jnp.max(jnp.abs(out32)))


def test_config_validation():
    with pytest.raises(ValueError, match="norm_type"):
        TransformerConfig(norm_type="batch")
    with pytest.raises(ValueError, match="share_encoder_decoder"):
        TransformerConfig(share_encoder_decoder=True, scan_layers=True)
