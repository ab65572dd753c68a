"""GPT-2 parity: HF GPT2LMHeadModel (random weights) -> t2t.convert.hf -> Decoder."""
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
from t2t.nn.stacks import Decoder  # noqa: E402
from tests.convert.helpers import perturb  # noqa: E402

TOL = 1e-5
VOCAB, B, LEN, N_POS = 100, 3, 40, 64




@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
    torch.manual_seed(0)
    # initializer_range 0.2 puts the gelu inputs at O(1), where tanh and exact gelu differ.
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=N_POS, n_embd=32, n_layer=2,
                                     n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                     initializer_range=0.2)
    model = transformers.GPT2LMHeadModel(config).eval()
    perturb(model)
    path = str(tmp_path_factory.mktemp("gpt2"))
    model.save_pretrained(path, safe_serialization=True)
    return model, path


@pytest.fixture(scope="module")
def tokens():
    ids = np.random.RandomState(0).randint(0, VOCAB, (B, LEN)).astype(np.int32)
    mask = np.ones((B, LEN), np.int32)
    mask[1, 25:] = 0      # right padding: real positions are unaffected by a causal model
    mask[2, 7:] = 0
    return ids, mask


def _hf_logits(model, ids, mask=None):
    with torch.no_grad():
        kw = {} if mask is None else {"attention_mask": torch.tensor(mask, dtype=torch.long)}
        return model(input_ids=torch.tensor(ids, dtype=torch.long), **kw).logits.numpy()


@functools.lru_cache(maxsize=None)
def _forward(config):
    return jax.jit(lambda p, i, m: Decoder(config).apply({"params": p}, i, decoder_segment_ids=m))


def _t2t_logits(config, params, ids, mask=None):
    """Full pass; no mask is an all-ones mask (one compiled function per config)."""
    return np.asarray(_forward(config)(params, ids, np.ones_like(ids) if mask is None else mask))


def test_config_mapping(hf_model):
    _, path = hf_model
    c = convert.gpt2_config(json.load(open(os.path.join(path, "config.json"))))
    assert (c.norm_type, c.norm_eps, c.pre_norm, c.use_bias) == ("layer", 1e-5, True, True)
    assert (c.position_embedding, c.max_length, c.mlp_activations) == \
        ("learned", N_POS, ("gelu_tanh",))
    assert (c.d_ff, c.num_decoder_layers, c.tie_embeddings, c.attention_scale) == \
        (128, 2, True, "sqrt")


@pytest.mark.parametrize("scan", [False, True])
def test_logits_parity(hf_model, tokens, scan):
    model, path = hf_model
    config, params = convert.load_gpt2(path, scan_layers=scan)
    ids, mask = tokens
    ref = _hf_logits(model, ids)
    diff = np.abs(_t2t_logits(config, params, ids) - ref).max()
    ref_m = _hf_logits(model, ids, mask)
    real = mask.astype(bool)
    diff_m = np.abs(_t2t_logits(config, params, ids, mask) - ref_m)[real].max()
    print(f"GPT-2 scan={scan}: max|logits diff| = {diff:.3g}, with padding mask {diff_m:.3g} "
          f"(max|logit| {np.abs(ref).max():.3g})")
    assert diff < TOL and diff_m < TOL


@pytest.mark.parametrize("scan", [False, True])
def test_cached_decoding_parity(hf_model, tokens, scan):
    """A 5-token prefill, then one token per step through the cache == HF past_key_values
    == t2t's full recomputation."""
    model, path = hf_model
    config, params = convert.load_gpt2(path, scan_layers=scan)
    ids = tokens[0]
    prompt, total = 5, 24
    net = Decoder(config)
    cache = jax.jit(lambda p: net.apply({"params": p}, jnp.zeros((B, total), jnp.int32),
                                        decode=True, mutable=["cache"])[1]["cache"])(params)

    @jax.jit
    def step(p, cache, tok):
        logits, state = net.apply({"params": p, "cache": cache}, tok, decode=True,
                                  mutable=["cache"])
        return logits, state["cache"]

    logits, cache = step(params, cache, ids[:, :prompt])
    ours = [np.asarray(logits)]
    for t in range(prompt, total):
        logits, cache = step(params, cache, ids[:, t:t + 1])
        ours.append(np.asarray(logits))
    ours = np.concatenate(ours, axis=1)

    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids[:, :prompt], dtype=torch.long), use_cache=True)
        past, ref = out.past_key_values, [out.logits.numpy()]
        for t in range(prompt, total):
            out = model(input_ids=torch.tensor(ids[:, t:t + 1], dtype=torch.long),
                        past_key_values=past, use_cache=True)
            past = out.past_key_values
            ref.append(out.logits.numpy())
    ref = np.concatenate(ref, axis=1)
    full = _t2t_logits(config, params, ids)[:, :total]   # causal: a prefix
    d_hf, d_full = np.abs(ours - ref).max(), np.abs(ours - full).max()
    print(f"GPT-2 scan={scan} cached decoding: vs HF cached {d_hf:.3g}, "
          f"vs t2t full pass {d_full:.3g}")
    assert d_hf < TOL and d_full < TOL


def test_round_trip(hf_model, tokens, tmp_path):
    model, path = hf_model
    config, params = convert.load_gpt2(path)
    out = str(tmp_path / "export")
    convert.save_gpt2(config, params, out)
    config2, params2 = convert.load_gpt2(out)
    assert config2 == config
    jax.tree.map(np.testing.assert_array_equal, params2, params)
    scan_config, scan_params = convert.load_gpt2(path, scan_layers=True)
    convert.save_gpt2(scan_config, scan_params, str(tmp_path / "scan"))
    jax.tree.map(np.testing.assert_array_equal, convert.load_gpt2(str(tmp_path / "scan"))[1],
                 params)
    reloaded = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
    ids = tokens[0]
    np.testing.assert_array_equal(_hf_logits(reloaded, ids), _hf_logits(model, ids))


def test_unprefixed_state_dict_and_errors(hf_model):
    """GPT2Model-style names (no `transformer.` prefix) load; bad tensors are named."""
    _, path = hf_model
    state = convert.read_safetensors(path)
    config = convert.gpt2_config(json.load(open(os.path.join(path, "config.json"))))
    bare = {k[len("transformer."):]: v for k, v in state.items() if k.startswith("transformer.")}
    jax.tree.map(np.testing.assert_array_equal, convert.gpt2_params_from_hf(bare, config),
                 convert.gpt2_params_from_hf(state, config))
    name = "transformer.h.1.attn.c_attn.weight"
    with pytest.raises(convert.CheckpointMismatchError, match=r"c_attn\.weight.*\(32, 96\)"):
        convert.gpt2_params_from_hf({k: v for k, v in state.items() if k != name}, config)
    with pytest.raises(convert.CheckpointMismatchError,
                       match=r"c_attn\.weight.*\(96, 32\).*\(32, 96\)"):
        convert.gpt2_params_from_hf(dict(state, **{name: state[name].T}), config)
