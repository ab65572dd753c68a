"""Narang et al. 2021 sharing rows: block sharing per stack, factorized (and shared)
embeddings, tied/untied encoder/decoder input and decoder output embeddings: parameter
counts against the closed form, and which table each stack reads."""
import jax
import numpy as np
import pytest

from t2t.errors import ConfigError
from t2t.nn import EncoderDecoder

from tests.nn.helpers import T5_TINY, init, tokens

CFG = T5_TINY.replace(num_encoder_layers=3, num_decoder_layers=3)


def _count(cfg):
    model = EncoderDecoder(cfg)
    params = init(model, tokens(0, (2, 7)), tokens(1, (2, 5)))
    return sum(x.size for x in jax.tree_util.tree_leaves(params)), params


def _expected(cfg, enc_layers, dec_layers, tables, projections=0, output_dense=False):
    """T5_TINY's closed form: RMSNorm (d), no biases, gated MLP, relative bias per stack."""
    d, v, e = cfg.d_model, cfg.vocab_size, cfg.embedding_dim or cfg.d_model
    attn = 4 * d * cfg.num_heads * cfg.head_dim
    mlp = 3 * d * cfg.d_ff                                      # wi_0, wi_1, wo
    enc_layer = attn + mlp + 2 * d
    dec_layer = 2 * attn + mlp + 3 * d
    per_stack = cfg.num_heads * cfg.relative_buckets + d       # relpos + final norm
    return (enc_layers * enc_layer + dec_layers * dec_layer + 2 * per_stack
            + tables * v * e + projections * e * d + (d * v if output_dense else 0))


@pytest.mark.parametrize("changes,layers,tables,projections,output_dense", [
    # Narang et al. 2021 sec. 2.4-2.5: the vanilla model ties all three embeddings; the
    # block-sharing rows untie the decoder's softmax ("Shared embeddings" ties it again);
    # factorized rows share the encoder/decoder input table, each stack projecting E ->
    # d_model (and a tied output d_model -> E).
    ({}, (3, 3), 1, 0, False),                                             # vanilla
    ({"share_layers": True, "tie_embeddings": False}, (1, 1), 1, 0, True),  # block sharing
    ({"share_layers": True, "tie_embeddings": False, "embedding_dim": 8},
     (1, 1), 1, 2, True),                                               # + factorized
    ({"share_layers": True, "embedding_dim": 8}, (1, 1), 1, 3, False),   # + fact. & shared
    ({"share_layers": True, "share_layers_in": "encoder", "tie_embeddings": False},
     (1, 3), 1, 0, True),
    ({"share_layers": True, "share_layers_in": "decoder", "tie_embeddings": False},
     (3, 1), 1, 0, True),
    ({"embedding_dim": 8, "tie_embeddings": False}, (3, 3), 1, 2, True),   # factorized
    ({"embedding_dim": 8}, (3, 3), 1, 3, False),                         # fact. & shared
    ({"tie_embeddings": False}, (3, 3), 1, 0, True),       # tied encoder/decoder input
    ({"share_input_embeddings": False}, (3, 3), 2, 0, False),  # tied decoder input/output
    ({"share_input_embeddings": False, "tie_embeddings": False}, (3, 3), 2, 0, True),
], ids=["vanilla", "block_sharing", "sharing_factorized", "sharing_factorized_shared",
        "encoder_only", "decoder_only", "factorized", "factorized_shared",
        "tied_enc_dec_input", "tied_dec_input_output", "untied"])
def test_parameter_counts_follow_the_closed_form(changes, layers, tables, projections,
                                                 output_dense):
    cfg = CFG.replace(**changes)
    shapes = jax.eval_shape(lambda: EncoderDecoder(cfg).init(
        jax.random.PRNGKey(0), tokens(0, (2, 7)), tokens(1, (2, 5))))
    count = sum(x.size for x in jax.tree_util.tree_leaves(shapes))
    assert count == _expected(cfg, *layers, tables, projections, output_dense)


def test_encoder_only_sharing_names_one_encoder_layer_and_distinct_decoder_layers():
    _, params = _count(CFG.replace(share_layers=True, share_layers_in="encoder"))
    assert "layer" in params["encoder"]["layers"]
    assert sorted(params["decoder"]["layers"]) == ["layer_0", "layer_1", "layer_2"]


def test_untied_input_embeddings_are_two_tables_each_stack_reading_its_own():
    cfg = CFG.replace(share_input_embeddings=False)
    model = EncoderDecoder(cfg)
    enc, dec = tokens(0, (2, 7)), tokens(1, (2, 5))
    _, params = _count(cfg)
    out = model.apply({"params": params}, enc, dec)
    moved = dict(params, encoder_token_embedder={
        "embedding": params["encoder_token_embedder"]["embedding"] + 1.0})
    # The encoder's table changes the output; the decoder's output layer is the other table.
    assert not np.allclose(model.apply({"params": moved}, enc, dec), out)
    dec_table = params["token_embedder"]["embedding"]
    hidden = model.apply({"params": params}, enc, dec, method=lambda m, e, d: m.decoder(
        d, m.encoder(e), return_hidden=True))
    np.testing.assert_allclose(out, np.asarray(hidden) @ np.asarray(dec_table).T,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("changes,match", [
    ({"share_layers_in": "stacks"}, "share_layers_in"),
    ({"share_encoder_decoder": True, "share_layers_in": "encoder"}, "share_layers_in='both'"),
])
def test_bad_sharing_options_are_one_line_config_errors(changes, match):
    with pytest.raises(ConfigError, match=match):
        CFG.replace(**changes)
