"""T5 parity: HF T5ForConditionalGeneration (random weights) -> t2t.convert.hf -> EncoderDecoder.

v1.0 (relu, tied + scaled logits), v1.1 (gated-gelu, untied) and a tiny max_distance variant;
sequences are long enough (48 > max_exact) that the log-spaced relative buckets are used.
"""
import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import torch  # noqa: E402  (the test extra: never skipped)
import transformers  # noqa: E402  (the test extra: never skipped)

from t2t.convert import hf as convert  # noqa: E402
from t2t.nn.position import relative_position_bucket  # noqa: E402
from t2t.nn.stacks import EncoderDecoder  # noqa: E402
from tests.convert.helpers import perturb  # noqa: E402

TOL = 1e-5
VOCAB, B, IN_LEN, OUT_LEN = 100, 3, 48, 44

VARIANTS = {
    # name: T5Config overrides
    "v1_0": dict(feed_forward_proj="relu", tie_word_embeddings=True),
    # initializer_factor keeps the untied lm_head's logits O(1) (HF inits it with std 1 ·
    # factor, which with factor 1 gives |logits| ~ 20 and float32 ulps of 2e-6).
    "v1_1": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                 initializer_factor=0.5),
    "small_max_distance": dict(feed_forward_proj="relu", tie_word_embeddings=True,
                               relative_attention_num_buckets=16,
                               relative_attention_max_distance=20),
}


def _hf_config(**overrides):
    kw = dict(vocab_size=VOCAB, d_model=32, d_kv=8, num_heads=4, d_ff=64, num_layers=2,
              num_decoder_layers=2, relative_attention_num_buckets=32,
              relative_attention_max_distance=128, dropout_rate=0.0)
    kw.update(overrides)
    return transformers.T5Config(**kw)




@pytest.fixture(scope="module")
def hf_models(tmp_path_factory):
    """name -> (HF model in eval mode, directory it was saved to); built on first use."""
    cache = {}

    def get(name):
        if name not in cache:
            torch.manual_seed(0)
            model = transformers.T5ForConditionalGeneration(_hf_config(**VARIANTS[name])).eval()
            perturb(model)
            path = str(tmp_path_factory.mktemp(f"t5_{name}"))
            model.save_pretrained(path, safe_serialization=True)
            cache[name] = (model, path)
        return cache[name]
    return get


@pytest.fixture(scope="module")
def batch():
    rng = np.random.RandomState(0)
    ids = rng.randint(2, VOCAB, (B, IN_LEN)).astype(np.int32)
    mask = np.ones((B, IN_LEN), np.int32)
    mask[1, 30:] = 0          # encoder padding
    mask[2, 9:] = 0
    ids[mask == 0] = 0
    dec = rng.randint(2, VOCAB, (B, OUT_LEN)).astype(np.int32)
    dec[:, 0] = 0             # decoder start id
    return ids, mask, dec


def _hf_logits(model, ids, mask, dec):
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids, dtype=torch.long),
                     attention_mask=torch.tensor(mask, dtype=torch.long),
                     decoder_input_ids=torch.tensor(dec, dtype=torch.long)).logits.numpy()


@functools.lru_cache(maxsize=None)
def _forward(config):
    return jax.jit(lambda p, i, m, d: EncoderDecoder(config).apply({"params": p}, i, d, m))


def _t2t_logits(config, params, ids, mask, dec):
    return np.asarray(_forward(config)(params, ids, mask, dec))


@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (16, 20), (8, 12), (64, 256)])
def test_relative_position_bucket_matches_hf(num_buckets, max_distance):
    from transformers.models.t5.modeling_t5 import T5Attention
    rel = np.arange(-400, 401, dtype=np.int64)
    for bidirectional in (True, False):
        ref = T5Attention._relative_position_bucket(torch.tensor(rel), bidirectional,
                                                    num_buckets, max_distance).numpy()
        ours = np.asarray(relative_position_bucket(jnp.asarray(rel, jnp.int32), bidirectional,
                                                   num_buckets, max_distance))
        np.testing.assert_array_equal(ours, ref)


def test_config_mapping(hf_models):
    _, path = hf_models("v1_0")
    c10 = convert.t5_config(json.load(open(os.path.join(path, "config.json"))))
    assert c10.mlp_activations == ("relu",) and c10.tie_embeddings and c10.scale_tied_logits
    assert (c10.norm_type, c10.pre_norm, c10.use_bias, c10.attention_scale) == \
        ("rms", True, False, "folded")
    assert (c10.head_dim, c10.relative_buckets, c10.relative_max_distance) == (8, 32, 128)
    # HF's T5DenseActDense and T5Attention drop out at dropout_rate, as the residuals do
    rate = json.load(open(os.path.join(path, "config.json"))).get("dropout_rate", 0.1)
    assert (c10.dropout_rate, c10.mlp_dropout_rate, c10.attention_dropout_rate) == \
        (rate, rate, None)
    c11 = convert.t5_config(_hf_config(**VARIANTS["v1_1"]).to_dict())
    assert c11.mlp_activations == ("gelu_tanh", "linear")
    assert not c11.tie_embeddings and not c11.scale_tied_logits


@pytest.mark.parametrize("name,scan", [("v1_0", False), ("v1_1", True),
                                       ("small_max_distance", False)])
def test_logits_parity(hf_models, batch, name, scan):
    model, path = hf_models(name)
    config, params = convert.load_t5(path, scan_layers=scan)
    assert config.scan_layers == scan
    if scan:
        assert params["encoder"]["layers"]["layer"]["mlp"]["wo"]["kernel"].shape == (2, 64, 32)
    ids, mask, dec = batch
    ref = _hf_logits(model, ids, mask, dec)
    ours = _t2t_logits(config, params, ids, mask, dec)
    diff = np.abs(ours - ref).max()
    print(f"T5 {name} scan={scan}: max|logits diff| = {diff:.3g} (max|logit| {np.abs(ref).max():.3g})")
    assert diff < TOL


@pytest.mark.parametrize("name", ["v1_0", "v1_1"])
def test_cached_decoding_parity(hf_models, batch, name):
    """One token at a time through the KV cache == HF with past_key_values == t2t full pass."""
    model, path = hf_models(name)
    config, params = convert.load_t5(path)
    ids, mask, dec = batch
    steps = 24
    net = EncoderDecoder(config)
    encoded = jax.jit(lambda p, i, m: net.apply({"params": p}, i, m, method=net.encode))(
        params, ids, mask)
    # Size the cache with a full-length call, then feed one token per step.
    state = jax.jit(lambda p, enc, m: net.apply(
        {"params": p}, enc, jnp.zeros((B, steps), jnp.int32), m, method=net.decode,
        decode=True, mutable=["cache"])[1])(params, encoded, mask)

    @jax.jit
    def step(p, cache, enc, m, tok):
        return net.apply({"params": p, "cache": cache}, enc, tok, m, method=net.decode,
                         decode=True, mutable=["cache"])

    cache, ours = state["cache"], []
    for t in range(steps):
        logits, state = step(params, cache, encoded, mask, dec[:, t:t + 1])
        cache = state["cache"]
        ours.append(np.asarray(logits[:, 0]))
    ours = np.stack(ours, axis=1)

    hf_steps, past = [], None
    tmask = torch.tensor(mask, dtype=torch.long)
    with torch.no_grad():
        enc_out = model.get_encoder()(input_ids=torch.tensor(ids, dtype=torch.long),
                                      attention_mask=tmask)
        for t in range(steps):
            out = model(encoder_outputs=enc_out, attention_mask=tmask,
                        decoder_input_ids=torch.tensor(dec[:, t:t + 1], dtype=torch.long),
                        past_key_values=past, use_cache=True)
            past = out.past_key_values
            hf_steps.append(out.logits[:, 0].numpy())
    hf_steps = np.stack(hf_steps, axis=1)

    full = _t2t_logits(config, params, ids, mask, dec)[:, :steps]   # causal: a prefix
    d_hf, d_full = np.abs(ours - hf_steps).max(), np.abs(ours - full).max()
    print(f"T5 {name} cached decoding: vs HF cached {d_hf:.3g}, vs t2t full pass {d_full:.3g}")
    assert d_hf < TOL and d_full < TOL


@pytest.mark.parametrize("name", ["v1_0", "v1_1"])
def test_round_trip(hf_models, batch, tmp_path, name):
    model, path = hf_models(name)
    config, params = convert.load_t5(path)
    out = str(tmp_path / "export")
    convert.save_t5(config, params, out)
    config2, params2 = convert.load_t5(out)
    assert config2 == config
    jax.tree.map(np.testing.assert_array_equal, params2, params)
    # Stacked (scan) params export to the same checkpoint.
    scan_config, scan_params = convert.load_t5(path, scan_layers=True)
    convert.save_t5(scan_config, scan_params, str(tmp_path / "scan"))
    _, params3 = convert.load_t5(str(tmp_path / "scan"))
    jax.tree.map(np.testing.assert_array_equal, params3, params)
    # transformers loads the export and computes what the original computed.
    reloaded = transformers.T5ForConditionalGeneration.from_pretrained(out).eval()
    ids, mask, dec = batch
    np.testing.assert_array_equal(_hf_logits(reloaded, ids, mask, dec),
                                  _hf_logits(model, ids, mask, dec))


def test_mismatch_errors(hf_models):
    _, path = hf_models("v1_0")
    state = convert.read_safetensors(path)
    config = convert.t5_config(json.load(open(os.path.join(path, "config.json"))))
    name = "decoder.block.1.layer.1.EncDecAttention.k.weight"
    missing = {k: v for k, v in state.items() if k != name}
    with pytest.raises(convert.CheckpointMismatchError, match=r"k\.weight.*\(32, 32\)"):
        convert.t5_params_from_hf(missing, config)
    bad = dict(state, **{name: np.zeros((16, 32), np.float32)})
    with pytest.raises(convert.CheckpointMismatchError,
                       match=r"k\.weight.*\(16, 32\).*\(32, 32\)"):
        convert.t5_params_from_hf(bad, config)
