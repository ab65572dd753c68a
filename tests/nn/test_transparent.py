"""Transparent attention (Bapna et al. 2018): the decoder's cross-attention reads a learned
softmax-weighted mix of every encoder layer's output, the embedding output included."""
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.errors import ConfigError
from t2t.nn import Encoder, EncoderDecoder
from t2t.nn.transparent import TransparentMix

from tests.nn.helpers import T5_TINY, decode_encoder_decoder_stepwise, init, tokens

CFG = T5_TINY.replace(num_encoder_layers=3, num_decoder_layers=2, transparent_attention=True)


def test_mix_is_a_softmax_over_encoder_layers_per_decoder_layer():
    states = np.random.default_rng(0).normal(size=(2, 4, 5, 32)).astype(np.float32)
    mix = TransparentMix(CFG, 2)
    w = np.random.default_rng(1).normal(size=(4, 2)).astype(np.float32)
    out = np.asarray(mix.apply({"params": {"mix_logits": jnp.asarray(w)}}, jnp.asarray(states)))
    p = np.exp(w) / np.exp(w).sum(0, keepdims=True)                # softmax over layers
    ref = np.stack([sum(p[s, j] * states[:, s] for s in range(4)) for j in range(2)], axis=1)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    # Initialised at 0: every decoder layer starts from the plain average.
    params = init(mix, jnp.asarray(states))
    np.testing.assert_array_equal(params["mix_logits"], np.zeros((4, 2)))


def test_encoder_hands_over_every_layer_through_the_final_norm():
    enc = tokens(0, (2, 7))
    plain = Encoder(CFG)
    params = init(plain, enc)
    states = Encoder(CFG, all_layers=True).apply({"params": params}, enc)
    assert states.shape == (2, 4, 7, 32)                           # embeddings + 3 layers
    np.testing.assert_allclose(states[:, -1], plain.apply({"params": params}, enc),
                               rtol=1e-6, atol=1e-6)
    # The first state is the embedding output, normed.
    table = np.asarray(params["token_embedder"]["embedding"])[np.asarray(enc)]
    rms = np.sqrt((table ** 2).mean(-1, keepdims=True) + CFG.norm_eps)
    np.testing.assert_allclose(states[:, 0], table / rms * np.asarray(params["final_norm"]["scale"]),
                               rtol=1e-5, atol=1e-5)


def test_a_mix_on_the_last_layer_is_the_vanilla_model_and_each_decoder_layer_has_its_own():
    enc, dec = tokens(0, (2, 7)), tokens(1, (2, 5))
    model = EncoderDecoder(CFG)
    params = init(model, enc, dec)
    assert params["decoder"]["transparent_mix"]["mix_logits"].shape == (4, 2)
    vanilla = EncoderDecoder(CFG.replace(transparent_attention=False))
    plain_params = {k: v for k, v in params.items()}
    plain_params["decoder"] = {k: v for k, v in params["decoder"].items()
                               if k != "transparent_mix"}
    last = np.full((4, 2), -1e4, np.float32)
    last[-1] = 0.0
    params["decoder"]["transparent_mix"]["mix_logits"] = jnp.asarray(last)
    np.testing.assert_allclose(model.apply({"params": params}, enc, dec),
                               vanilla.apply({"params": plain_params}, enc, dec),
                               rtol=1e-5, atol=1e-5)
    # Decoder layer 1 reading the embeddings instead changes the output.
    moved = last.copy()
    moved[:, 1] = [0.0, -1e4, -1e4, -1e4]
    params["decoder"]["transparent_mix"]["mix_logits"] = jnp.asarray(moved)
    assert not np.allclose(model.apply({"params": params}, enc, dec),
                           vanilla.apply({"params": plain_params}, enc, dec), atol=1e-3)


def test_cached_decoding_reads_the_mix():
    enc, dec = tokens(0, (2, 7)), tokens(1, (2, 5))
    model = EncoderDecoder(CFG)
    params = init(model, enc, dec)
    full = model.apply({"params": params}, enc, dec)
    np.testing.assert_allclose(decode_encoder_decoder_stepwise(model, params, enc, dec), full,
                               rtol=1e-4, atol=1e-4)


def test_transparent_attention_with_scanned_layers_is_a_config_error():
    with pytest.raises(ConfigError, match="scan_layers=False"):
        CFG.replace(scan_layers=True)
