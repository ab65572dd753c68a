"""ELECTRA: the replaced-token labels, the stop-gradient between generator and
discriminator, the shared embeddings and λ = 50."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.models.electra import ElectraPretrainingModel, generator_config, replace_tokens, rtd_loss
from t2t.nn.config import TransformerConfig

CFG = TransformerConfig(
    vocab_size=64, d_model=32, num_heads=4, head_dim=8, d_ff=64, num_encoder_layers=2,
    num_decoder_layers=0, mlp_activations=("gelu",), norm_type="layer", norm_eps=1e-12,
    pre_norm=False, use_bias=True, position_embedding="learned", max_length=16,
    type_vocab_size=2, embedding_norm=True, embedding_dim=16, project_summed_embeddings=True,
    dropout_rate=0.0, kernel_init="normal", initializer_range=0.2)


def test_labels_replaced_exactly_where_sample_differs():
    inputs = jnp.array([[5, 3, 3, 9, 3, 7], [4, 3, 8, 8, 3, 0]])        # 3 = [MASK]
    positions = jnp.array([[1, 2, 4], [1, 4, 0]])
    original = jnp.array([[11, 12, 13], [21, 22, 0]])
    weights = jnp.array([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])            # a padding prediction
    sampled = jnp.array([[11, 40, 13], [50, 22, 60]])                   # equal, differs, equal
    corrupted, labels = replace_tokens(inputs, positions, original, weights, sampled)
    np.testing.assert_array_equal(corrupted, [[5, 11, 40, 9, 13, 7], [4, 50, 8, 8, 22, 0]])
    np.testing.assert_array_equal(labels, [[0, 0, 1, 0, 0, 0], [0, 1, 0, 0, 0, 0]])


def test_rtd_loss_is_binary_cross_entropy():
    logits, labels = jnp.array([[2.0, -1.0, 0.5]]), jnp.array([[1.0, 0.0, 0.0]])
    weights = jnp.array([[1.0, 1.0, 0.0]])
    loss, accuracy = rtd_loss(logits, labels, weights)
    p = jax.nn.sigmoid(logits[0])
    expected = -(np.log(p[0]) + np.log(1 - p[1])) / 2
    np.testing.assert_allclose(loss, expected, rtol=1e-6)
    assert accuracy == 1.0


def _batch():
    rng = np.random.RandomState(0)
    tokens = rng.randint(5, 64, (2, 12)).astype(np.int32)
    positions = np.array([[1, 4, 7], [2, 3, 0]], np.int32)
    ids = np.take_along_axis(tokens, positions, 1)
    weights = np.array([[1, 1, 1], [1, 1, 0]], np.float32)
    masked = tokens.copy()
    np.put_along_axis(masked, positions[:, :2], 3, 1)
    return {"encoder_input_tokens": masked, "encoder_segment_ids": np.ones_like(tokens),
            "token_type_ids": np.zeros_like(tokens), "masked_positions": positions,
            "masked_ids": ids, "masked_weights": weights}


def test_generator_shares_embeddings_and_has_a_quarter_width():
    model = ElectraPretrainingModel(CFG, generator_size=0.25)
    params = nn.unbox(model.init(jax.random.PRNGKey(0), _batch()))
    assert set(params) == {"token_embedder", "embedder", "generator", "generator_head",
                           "discriminator", "rtd_head"}
    assert params["token_embedder"]["embedding"].shape == (64, 16)
    assert "position_embedder" in params["embedder"] and "embedder" not in params["generator"]
    assert params["generator"]["embedding_projection"]["kernel"].shape == (16, 8)
    assert params["discriminator"]["embedding_projection"]["kernel"].shape == (16, 32)
    g = generator_config(CFG, 0.25)
    assert (g.d_model, g.d_ff, g.num_heads, g.embedding_dim) == (8, 16, 1, 16)


def test_loss_is_mlm_plus_50_rtd_and_no_rtd_gradient_reaches_the_generator():
    model = ElectraPretrainingModel(CFG, generator_size=0.25)
    batch = _batch()
    params = nn.unbox(model.init(jax.random.PRNGKey(0), batch))
    rng = jax.random.PRNGKey(3)
    loss, metrics = jax.jit(model.loss_fn)(params, batch, rng)
    np.testing.assert_allclose(loss, metrics["mlm_loss"] + 50 * metrics["rtd_loss"], rtol=1e-6)
    assert 0 < metrics["rtd_loss"] and 0 <= metrics["replaced_fraction"] <= 5 / 24

    def rtd_only(p):
        return model.loss_fn(p, batch, rng)[1]["rtd_loss"]

    grads = jax.jit(jax.grad(rtd_only))(params)
    for name in ("generator", "generator_head"):
        assert all(float(jnp.abs(x).max()) == 0.0 for x in jax.tree.leaves(grads[name])), name
    assert float(jnp.abs(grads["discriminator"]["layers"]["layer_0"]["mlp"]["wi"]["kernel"]
                         ).max()) > 0
    # The shared table learns from both losses.
    assert float(jnp.abs(grads["token_embedder"]["embedding"]).max()) > 0


@pytest.mark.parametrize("size, counts", [("small", 13_549_057), ("base", 109_483_009)])
def test_published_sizes(size, counts):
    from t2t.run import gin_utils
    from t2t.models.families import count_params
    gin_utils.parse([f"models/electra/{size}.gin"])
    from t2t.run.configurables import TransformerConfig as configured_config
    assert count_params("electra", configured_config()) == counts   # paper: 14M, 110M


@pytest.mark.parametrize("d, heads, d_ff, size, want", [
    (128, 2, 512, 0.25, (32, 1, 32, 128)),          # tiny: one head as wide as the model
    (256, 4, 1024, 0.25, (64, 1, 64, 256)),         # small (Clark et al. Table 6: 1/4)
    (768, 12, 3072, 1 / 3, (256, 4, 64, 1024)),     # base (1/3)
    (1024, 16, 4096, 0.25, (256, 4, 64, 1024)),     # large (1/4)
])
def test_generator_heads_split_its_width(d, heads, d_ff, size, want):
    """As the authors' get_generator_config (and HF's ElectraConfig): heads x head_dim is
    the generator's hidden size."""
    g = generator_config(CFG.replace(d_model=d, num_heads=heads, head_dim=64, d_ff=d_ff), size)
    assert (g.d_model, g.num_heads, g.head_dim, g.d_ff) == want
