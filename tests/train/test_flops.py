"""FLOP formula against numbers worked out by hand for a tiny config."""
import json
import os
import types

import pytest

from t2t.nn.config import TransformerConfig
from t2t.train import flops

# d=8, A = 2 heads × 4 = 8, F=16, gated (g=2), V=100, 2 encoder / 3 decoder layers.
CFG = TransformerConfig(vocab_size=100, d_model=8, num_heads=2, head_dim=4, d_ff=16,
                        num_encoder_layers=2, num_decoder_layers=3,
                        mlp_activations=("gelu_tanh", "linear"))
# Matmul params per layer: q,k,v,o 4·8·8 = 256; MLP wi_0, wi_1, wo 3·8·16 = 384 → N = 640.
PER_TOKEN_LAYER_FWD = 2 * 640  # 1280


def test_decoder_only_by_hand():
    parts = flops.forward_flops_breakdown(CFG, "gpt", target_length=10)
    assert parts["dense"] == 3 * 10 * 1280            # 38400
    assert parts["attention"] == 3 * 4 * 10 * 10 * 8 / 2  # 4800, causal half
    assert parts["logits"] == 2 * 8 * 100 * 10        # 16000
    assert flops.step_flops(CFG, "decoder", 4, target_length=10) == 3 * 4 * 59200
    full = flops.forward_flops_breakdown(CFG, "decoder", target_length=10, causal=False)
    assert full["attention"] == 2 * parts["attention"]
    assert full["dense"] == parts["dense"] and full["logits"] == parts["logits"]
    # 6N per token for the dense part (2 fwd + 4 bwd).
    per_tok = flops.train_flops_per_token(CFG, "decoder", target_length=10)
    assert per_tok == pytest.approx(6 * 640 * 3 + 3 * (4800 + 16000) / 10)


def test_encoder_mlm_logits_only_at_masked_positions():
    parts = flops.forward_flops_breakdown(CFG, "bert", input_length=6, num_masked=2)
    assert parts == {"dense": 2 * 6 * 1280,               # 15360
                     "attention": 2 * 4 * 6 * 6 * 8,       # 2304, bidirectional
                     "logits": 2 * 8 * 100 * 2}            # 3200
    every = flops.forward_flops_breakdown(CFG, "encoder", input_length=6)
    assert every["logits"] == 2 * 8 * 100 * 6
    # causal= is about decoder self-attention: the encoder ignores it.
    assert flops.forward_flops_breakdown(CFG, "encoder", input_length=6,
                                         causal=True)["attention"] == 2304


def test_encoder_decoder_by_hand():
    parts = flops.forward_flops_breakdown(CFG, "t5", input_length=6, target_length=4)
    enc_dense, dec_dense = 2 * 6 * 1280, 3 * 4 * 1280
    cross_dense = 3 * (2 * 2 * 8 * 8 * 4 + 2 * 2 * 8 * 8 * 6)  # q,o over T; k,v over S
    assert parts["dense"] == enc_dense + dec_dense + cross_dense == 38400
    enc_attn = 2 * 4 * 6 * 6 * 8                  # 2304
    dec_attn = 3 * 4 * 4 * 4 * 8 / 2              # 768 (causal)
    cross_attn = 3 * 4 * 4 * 6 * 8                # 2304 (never causal)
    assert parts["attention"] == enc_attn + dec_attn + cross_attn == 5376
    assert parts["logits"] == 2 * 8 * 100 * 4
    assert flops.tokens_per_example("t5", 6, 4) == 10
    assert flops.train_flops_per_token(CFG, "t5", input_length=6, target_length=4) == \
        pytest.approx(3 * (38400 + 5376 + 6400) / 10)
    bidir = flops.forward_flops_breakdown(CFG, "t5", input_length=6, target_length=4,
                                          causal=False)
    assert bidir["attention"] - parts["attention"] == 768


def test_albert_factorised_embedding_and_plain_mlp():
    cfg = CFG.replace(embedding_dim=4, mlp_activations=("gelu",))
    parts = flops.forward_flops_breakdown(cfg, "encoder", input_length=6)
    per_layer = 2 * (4 * 8 * 8 + 2 * 8 * 16)       # plain MLP: wi, wo
    assert parts["dense"] == 2 * 6 * per_layer + 2 * 4 * 8 * 6
    assert parts["logits"] == 2 * 4 * 100 * 6 + 2 * 8 * 4 * 6


def test_errors_mfu_and_peaks():
    with pytest.raises(ValueError, match="needs input_length and target_length"):
        flops.step_flops(CFG, "t5", 1, input_length=6)
    with pytest.raises(ValueError, match="unknown family 'lstm'"):
        flops.step_flops(CFG, "lstm", 1, input_length=6)
    assert flops.mfu(1e12, 2.0, 1e12) == 0.5
    with pytest.raises(ValueError):
        flops.mfu(1.0, 0.0, 1.0)
    dev = lambda kind: types.SimpleNamespace(device_kind=kind)  # noqa: E731
    assert flops.peak_flops_per_device(dev("TPU v5 lite")) == 197e12
    assert flops.peak_flops_per_device(dev("TPU v5p")) == 459e12
    assert flops.peak_flops_per_device(dev("NVIDIA H100 80GB HBM3")) == 989e12
    assert flops.peak_flops_per_device(dev("cpu")) is None


def test_measured_peak_is_a_plausible_rate():
    from t2t.train.flops import measure_peak_flops
    peak = measure_peak_flops("float32", size=256, repeats=2)
    assert 1e8 < peak < 1e14


def test_the_host_peak_is_measured_once_and_read_back(tmp_path, monkeypatch):
    """The first run on a host measures; later runs (and other processes) read the file; a
    dtype, or a damaged or unwritable file, costs one more measurement and nothing else."""
    measured = []

    def measure(dtype):
        measured.append(dtype)
        return 1e11 * len(measured)

    monkeypatch.setattr(flops, "measure_peak_flops", measure)
    cache = tmp_path / "t2t" / "peak_flops.json"
    first, source = flops.host_peak_flops("float32", str(cache))
    assert (first, measured) == (1e11, ["float32"]) and "measured now" in source
    again, source = flops.host_peak_flops("float32", str(cache))
    assert (again, measured) == (1e11, ["float32"]) and "earlier on this host" in source
    assert flops.host_peak_flops("bfloat16", str(cache))[0] == 2e11
    stored = json.loads(cache.read_text())
    assert stored == {flops.peak_cache_key("float32"): 1e11,
                      flops.peak_cache_key("bfloat16"): 2e11}
    key = flops.peak_cache_key("float32")
    assert "jax " in key and f"{os.cpu_count()} cores" in key   # a new JAX or VM size: again
    cache.write_text('{"cut short')
    assert flops.host_peak_flops("float32", str(cache))[0] == 3e11
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert flops.host_peak_flops("float32", str(blocked / "peak.json"))[0] == 4e11


def test_elmo_counts_each_matmul_parameter_twice_per_token():
    """ELMo's dense FLOPs per token: 2 x every LSTMP, highway and projection kernel entry
    (read off the real parameter tree) plus the character convolutions at each offset."""
    import jax
    from flax import traverse_util

    from t2t.models import elmo
    cfg = elmo.ElmoConfig(vocab_size=50, max_chars=8, char_embed_dim=4,
                          filters=((1, 3), (2, 5)), num_highway=2, projection_dim=6,
                          cell_size=10)
    shapes = traverse_util.flatten_dict(jax.eval_shape(
        lambda: elmo.BiLM(cfg).init(jax.random.PRNGKey(0), jax.numpy.ones((1, 3), "int32"),
                                    jax.numpy.ones((1, 3, 8), "int32")))["params"])
    kernels = sum(v.size for k, v in shapes.items()
                  if k[-1] in ("kernel", "recurrent", "projection") and "conv" not in k[-2]
                  and k[0] != "softmax")
    convs = 2 * (1 * 4 * 3 * 8 + 2 * 4 * 5 * 7)
    parts = flops.forward_flops_breakdown(cfg, "elmo", target_length=7)
    assert parts["dense"] == 7 * (2 * kernels + convs)
    assert parts["logits"] == 7 * 2 * 2 * 6 * 50 and parts["attention"] == 0
    assert flops.tokens_per_example("elmo", target_length=7) == 7
    with pytest.raises(ValueError, match="target_length"):
        flops.forward_flops_breakdown(cfg, "elmo")
