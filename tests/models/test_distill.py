"""DistilBERT distillation: soft targets at temperature T (scaled by T²), the student from
every other teacher layer, and the student == teacher fixed point."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from t2t.models.bert import BertModel
from t2t.models.distill import (DistillationModel, cosine_loss, soft_cross_entropy,
                                student_from_teacher)
from t2t.nn.config import TransformerConfig

CFG = TransformerConfig(
    vocab_size=64, d_model=32, num_heads=4, head_dim=8, d_ff=64, num_encoder_layers=4,
    num_decoder_layers=0, mlp_activations=("gelu",), norm_type="layer", pre_norm=False,
    use_bias=True, position_embedding="learned", max_length=16, type_vocab_size=2,
    embedding_norm=True, dropout_rate=0.0, kernel_init="normal", initializer_range=0.2)


def _batch():
    tokens = np.random.RandomState(0).randint(5, 64, (2, 10)).astype(np.int32)
    seg = np.ones_like(tokens)
    seg[1, 7:] = 0
    return {"encoder_input_tokens": tokens, "encoder_segment_ids": seg,
            "masked_positions": np.array([[1, 3], [2, 0]], np.int32),
            "masked_ids": np.array([[7, 8], [9, 0]], np.int32),
            "masked_weights": np.array([[1, 1], [1, 0]], np.float32)}


def _teacher():
    batch = _batch()
    params = BertModel(CFG).init(jax.random.PRNGKey(0), batch["encoder_input_tokens"],
                                 masked_positions=batch["masked_positions"])["params"]
    return nn.unbox(params)


def test_soft_targets_equal_teacher_entropy_with_zero_gradient():
    t = jax.random.normal(jax.random.PRNGKey(0), (3, 5, 11)) * 3
    w = jnp.ones((3, 5))
    for temperature in (1.0, 2.0):
        p = jax.nn.softmax(t / temperature)
        entropy = -jnp.mean(jnp.sum(p * jnp.log(p), -1))
        np.testing.assert_allclose(soft_cross_entropy(t, t, w, temperature),
                                   temperature ** 2 * entropy, rtol=1e-5)
        grad = jax.grad(soft_cross_entropy)(t, t, w, temperature)
        assert float(jnp.abs(grad).max()) < 1e-7
    np.testing.assert_allclose(soft_cross_entropy(t + 1.0, t, w, 2.0),
                               soft_cross_entropy(t, t, w, 2.0), rtol=1e-5)
    assert float(soft_cross_entropy(t * 2.0, t, w, 2.0)) > float(soft_cross_entropy(t, t, w, 2.0))


def test_student_takes_every_other_layer():
    params = _teacher()
    config, student = student_from_teacher(CFG, params)
    assert config.num_encoder_layers == 2
    for new, old in ((0, 0), (1, 2)):
        jax.tree.map(np.testing.assert_array_equal, student["encoder"]["layers"][f"layer_{new}"],
                     params["encoder"]["layers"][f"layer_{old}"])
    np.testing.assert_array_equal(student["token_embedder"]["embedding"],
                                  params["token_embedder"]["embedding"])


def test_student_equal_to_teacher_is_a_fixed_point_of_the_soft_and_cosine_losses():
    teacher = _teacher()
    model = DistillationModel((CFG, teacher), every=1)           # keeps every layer
    batch = _batch()
    params = nn.unbox(model.init(jax.random.PRNGKey(5), batch))
    jax.tree.map(np.testing.assert_array_equal, {k: params[k] for k in teacher}, teacher)
    loss, m = jax.jit(model.loss_fn)(params, batch)
    hidden, logits = model._outputs(CFG, teacher, batch)
    p = jax.nn.softmax(logits / 2.0)
    real = batch["encoder_segment_ids"].astype(bool)
    entropy = -np.sum(np.asarray(p * jnp.log(p)), -1)[real].mean()
    np.testing.assert_allclose(m["soft_ce"], 4.0 * entropy, rtol=1e-5)
    assert abs(float(m["cosine_loss"])) < 1e-6
    np.testing.assert_allclose(loss, 5 * m["soft_ce"] + 2 * m["mlm_loss"] + m["cosine_loss"],
                               rtol=1e-6)
    grads = jax.jit(jax.grad(lambda q: model.loss_fn(q, batch)[1]["soft_ce"]))(params)
    assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads)) < 1e-6


def test_cosine_loss():
    a = jnp.array([[[1.0, 0.0], [0.0, 2.0]]])
    np.testing.assert_allclose(cosine_loss(a, jnp.array([[[2.0, 0.0], [1.0, 0.0]]]),
                                           jnp.ones((1, 2))), 0.5)
