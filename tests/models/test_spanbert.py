"""SpanBERT: span boundaries and offsets for the SBO, and the loss MLM + SBO."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from t2t.models.spanbert import SpanBertPretrainingModel, span_boundaries
from t2t.nn.config import TransformerConfig


def test_span_boundaries():
    # Row 0: spans 2-4 and 7; row 1: span 1-2 and a padding prediction (weight 0).
    positions = jnp.array([[2, 3, 4, 7], [1, 2, 0, 0]])
    weights = jnp.array([[1, 1, 1, 1], [1, 1, 0, 0]], jnp.float32)
    left, right, offset = span_boundaries(positions, weights, 10)
    np.testing.assert_array_equal(left[0], [1, 1, 1, 6])
    np.testing.assert_array_equal(right[0], [5, 5, 5, 8])
    np.testing.assert_array_equal(offset[0], [0, 1, 2, 0])
    np.testing.assert_array_equal(left[1, :2], [0, 0])
    np.testing.assert_array_equal(right[1, :2], [3, 3])
    np.testing.assert_array_equal(offset[1, :2], [0, 1])


def test_loss_is_mlm_plus_sbo_and_sbo_reads_only_boundaries():
    cfg = TransformerConfig(
        vocab_size=64, d_model=32, num_heads=4, head_dim=8, d_ff=64, num_encoder_layers=1,
        num_decoder_layers=0, mlp_activations=("gelu",), norm_type="layer", pre_norm=False,
        use_bias=True, position_embedding="learned", max_length=16, type_vocab_size=2,
        embedding_norm=True, dropout_rate=0.0, kernel_init="normal", initializer_range=0.2)
    model = SpanBertPretrainingModel(cfg)
    tokens = np.arange(5, 17, dtype=np.int32)[None].repeat(2, 0)
    batch = {"encoder_input_tokens": tokens, "encoder_segment_ids": np.ones_like(tokens),
             "masked_positions": np.array([[3, 4, 5], [6, 0, 0]], np.int32),
             "masked_ids": np.array([[8, 9, 10], [11, 0, 0]], np.int32),
             "masked_weights": np.array([[1, 1, 1], [1, 0, 0]], np.float32)}
    params = nn.unbox(model.init(jax.random.PRNGKey(0), batch))
    assert set(params["sbo_head"]) >= {"dense_0", "dense_1", "norm_0", "norm_1",
                                       "offset_embedder", "bias"}
    assert params["sbo_head"]["dense_0"]["kernel"].shape == (3 * 32, 32)
    loss, m = jax.jit(model.loss_fn)(params, batch)
    np.testing.assert_allclose(loss, m["mlm_loss"] + m["sbo_loss"], rtol=1e-6)

    def sbo_of_hidden(hidden):
        return model.module.apply({"params": params}, hidden,
                                  jnp.asarray(batch["masked_positions"]),
                                  jnp.asarray(batch["masked_weights"]),
                                  method=lambda mod, h, p, w: mod.sbo_head(h, p, w,
                                                                           mod.token_embedder))
    hidden = jax.random.normal(jax.random.PRNGKey(1), (2, 12, 32))
    g = jax.grad(lambda h: sbo_of_hidden(h)[0, 1].sum())(hidden)   # token 4 of span 3-5
    touched = np.flatnonzero(np.abs(np.asarray(g[0])).sum(-1) > 0)
    np.testing.assert_array_equal(touched, [2, 6])                  # x_{s-1}, x_{e+1} only
