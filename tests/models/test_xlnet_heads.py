"""XLNet fine-tuning wrappers: BERT rows laid out as XLNet's (the [CLS] last, left padding),
a pretrained XLNet tree loaded under `transformer`, and the heads learning a signal."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from t2t.models.xlnet import XLNetPretrainingModel
from t2t.models.xlnet_heads import (SEG_ID_CLS, SEG_ID_PAD, XLNetClassifierHead,
                                    XLNetMultipleChoice, XLNetSequenceClassifier, xlnet_layout)
from t2t.nn.config import TransformerConfig

CLS, SEP, PAD = 2, 3, 0
CONFIG = TransformerConfig(vocab_size=40, d_model=16, num_heads=2, head_dim=8, d_ff=32,
                           num_encoder_layers=1, num_decoder_layers=0, norm_type="layer",
                           pre_norm=False, use_bias=True, position_embedding="none",
                           type_vocab_size=0, tie_embeddings=True, dropout_rate=0.0,
                           attention_dropout_rate=0.0, mlp_dropout_rate=0.0)


def _bert_rows(rows, length):
    """[CLS] a [SEP] (b [SEP]) right-padded: (tokens, segment ids, types) [n, length]."""
    tokens = np.full((len(rows), length), PAD, np.int32)
    segments, types = np.zeros_like(tokens), np.zeros_like(tokens)
    for i, (a, b) in enumerate(rows):
        ids = [CLS] + a + [SEP] + (b + [SEP] if b else [])
        tokens[i, :len(ids)], segments[i, :len(ids)] = ids, 1
        types[i, len(a) + 2:len(ids)] = 1
    return tokens, segments, types


def test_layout_moves_cls_last_and_pads_left():
    tokens, segments, types = _bert_rows([([11, 12], [21]), ([13], None),
                                          ([14, 15, 16, 17], [22, 23])], 9)
    out_tokens, mask, out_types = map(np.asarray, xlnet_layout(
        jnp.asarray(tokens), jnp.asarray(segments), jnp.asarray(types)))
    np.testing.assert_array_equal(out_tokens, [[PAD, PAD, PAD, 11, 12, SEP, 21, SEP, CLS],
                                               [PAD] * 6 + [13, SEP, CLS],
                                               [14, 15, 16, 17, SEP, 22, 23, SEP, CLS]])
    np.testing.assert_array_equal(mask, [[0, 0, 0, 1, 1, 1, 1, 1, 1],
                                         [0] * 6 + [1, 1, 1], [1] * 9])
    P, K = SEG_ID_PAD, SEG_ID_CLS
    np.testing.assert_array_equal(out_types, [[P, P, P, 0, 0, 0, 1, 1, K],
                                              [P] * 6 + [0, 0, K],
                                              [0, 0, 0, 0, 0, 1, 1, 1, K]])
    # a padding row (no token) stays padding
    empty = xlnet_layout(jnp.zeros((1, 4), jnp.int32), jnp.zeros((1, 4), jnp.int32),
                         jnp.zeros((1, 4), jnp.int32))
    assert np.asarray(empty[1]).sum() == 0


def test_classifier_runs_the_head_on_the_layout_and_ignores_padding_width():
    model = XLNetSequenceClassifier(CONFIG, 3)
    tokens, segments, types = _bert_rows([([11, 12], [21]), ([13], None)], 8)
    batch = {"encoder_input_tokens": tokens, "encoder_segment_ids": segments,
             "token_type_ids": types, "label": np.array([0, 2], np.int32)}
    params = nn.unbox(model.init(jax.random.PRNGKey(0), batch))
    assert set(params) == {"transformer", "sequence_summary", "logits_proj"}
    apply = jax.jit(model.apply)
    logits = apply(params, batch)
    by_hand = jax.jit(XLNetClassifierHead(CONFIG, 3).apply)({"params": params}, *xlnet_layout(
        jnp.asarray(tokens), jnp.asarray(segments), jnp.asarray(types)))
    np.testing.assert_allclose(logits, by_hand, rtol=0, atol=1e-6)
    wider = {k: np.pad(v, ((0, 0), (0, 4))) if v.ndim == 2 else v for k, v in batch.items()}
    np.testing.assert_allclose(apply(params, wider), logits, atol=2e-6)


def test_loads_a_pretraining_tree_under_transformer():
    tokens, segments, types = _bert_rows([([11, 12], [21])], 8)
    pretraining = XLNetPretrainingModel(CONFIG)
    pre_batch = {"encoder_input_tokens": tokens, "factorization_ranks": np.tile(
        np.arange(8, dtype=np.int32), (1, 1)), "masked_positions": np.array([[7]], np.int32),
        "masked_weights": np.ones((1, 1), np.float32), "masked_ids": np.array([[5]], np.int32)}
    pre = pretraining.init(jax.random.PRNGKey(1), pre_batch)
    model = XLNetMultipleChoice(CONFIG, 2)
    batch = {"encoder_input_tokens": np.stack([tokens, tokens], 1),
             "encoder_segment_ids": np.stack([segments, segments], 1),
             "token_type_ids": np.stack([types, types], 1), "label": np.zeros(1, np.int32)}
    params, report = model.init_from_pretrained(jax.random.PRNGKey(0), batch, pre,
                                                return_report=True)
    assert report.unused == ["transformer/lm_bias"]
    assert sorted({p.split("/")[0] for p in report.new}) == ["logits_proj", "sequence_summary"]
    copied, source = nn.unbox(params)["transformer"], nn.unbox(pre)
    jax.tree.map(np.testing.assert_array_equal, copied,
                 {k: v for k, v in source.items() if k != "lm_bias"})


@pytest.mark.slow   # ~12 s of training; CI: the heads' HF parity (test_xlnet_heads_parity.py)
def test_classifier_and_multiple_choice_learn_a_signal():
    """Label = whether token 30 appears (classification); the choice holding it (choice)."""
    rng = np.random.RandomState(0)
    rows, labels = [], []
    for _ in range(32):
        a = list(rng.randint(5, 29, 3))
        label = int(rng.randint(2))
        if label:
            a[rng.randint(3)] = 30
        rows.append((a, None))
        labels.append(label)
    tokens, segments, types = _bert_rows(rows, 8)
    batch = {"encoder_input_tokens": tokens, "encoder_segment_ids": segments,
             "token_type_ids": types, "label": np.asarray(labels, np.int32)}
    pairs = tokens.reshape(16, 2, 8)
    choice = {"encoder_input_tokens": pairs, "encoder_segment_ids": segments.reshape(16, 2, 8),
              "token_type_ids": types.reshape(16, 2, 8),
              "label": np.asarray(labels, np.int32).reshape(16, 2).argmax(1)}
    keep = np.asarray(labels).reshape(16, 2).sum(1) == 1          # exactly one holds it
    choice = {k: v[keep] for k, v in choice.items()}
    for model, data in ((XLNetSequenceClassifier(CONFIG, 2), batch),
                        (XLNetMultipleChoice(CONFIG, 2), choice)):
        params = nn.unbox(model.init(jax.random.PRNGKey(0), data))
        tx = optax.adam(3e-3)
        opt = tx.init(params)

        @jax.jit
        def step(params, opt):
            (loss, metrics), grads = jax.value_and_grad(model.loss_fn, has_aux=True)(params,
                                                                                    data)
            updates, opt = tx.update(grads, opt, params)
            return optax.apply_updates(params, updates), opt, metrics

        for _ in range(40):
            params, opt, metrics = step(params, opt)
        assert float(metrics["accuracy"]) == 1.0, type(model).__name__
        np.testing.assert_array_equal(model.predict(params, data), data["label"])
