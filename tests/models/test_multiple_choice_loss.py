"""BERT's multiple-choice head (Devlin et al. 2019, sec. 4.4): one score per (context,
ending) row from its [CLS] vector, and the loss is the cross-entropy of the softmax over a
record's choices, computed here by hand from the per-row scores."""
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.models import classifiers as C

from tests.models.test_classifiers import BERT, CLS, SEP, bert_batch, fresh, jit


def _batch(seed=0, n=3, c=4, length=7):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(SEP + 3, 64, (n, c, length)).astype(np.int32)
    tokens[..., 0] = CLS
    batch = bert_batch(tokens, label=rng.integers(0, c, n).astype(np.int32))
    segments = np.ones((n, c, length), np.int32)
    segments[-1] = 0                                   # a padding record: no loss weight
    batch["encoder_segment_ids"] = jnp.asarray(segments)
    return batch


def test_loss_is_the_cross_entropy_over_the_choices_scores():
    batch = _batch()
    model = C.MultipleChoice(BERT, num_choices=4)
    params = fresh(model, batch, seed=1)
    scores = np.asarray(jit(model.apply, params, batch), np.float64)       # [n, c]
    loss, metrics = jit(model.loss_fn, params, batch)
    # each row's score alone: the [CLS] pooler of that (context, ending) pair -> dense
    one = {k: v[:, 2] for k, v in batch.items() if k != "label"}
    alone = np.asarray(jit(C.PooledHead(BERT, 1).apply, {"params": params},
                           one["encoder_input_tokens"], one["encoder_segment_ids"],
                           one["token_type_ids"]))[:, 0]
    np.testing.assert_allclose(scores[:, 2], alone, rtol=1e-5, atol=1e-6)
    label = np.asarray(batch["label"])
    m = scores.max(axis=1, keepdims=True)
    log_softmax = scores - m - np.log(np.exp(scores - m).sum(axis=1, keepdims=True))
    by_hand = -log_softmax[np.arange(2), label[:2]].mean()      # the padding record excluded
    assert float(loss) == pytest.approx(by_hand, rel=1e-5)
    assert float(metrics["num_tokens"]) == 2
    np.testing.assert_array_equal(np.asarray(jit(model.predict, params, batch)),
                                  scores.argmax(axis=1))


def test_choices_are_scored_independently():
    """Reordering a record's endings reorders its scores and nothing else."""
    batch = _batch(seed=3)
    model = C.MultipleChoice(BERT, num_choices=4)
    params = fresh(model, batch, seed=2)
    order = np.array([2, 0, 3, 1])
    shuffled = {k: (v[:, order] if v.ndim == 3 else v) for k, v in batch.items()}
    a = np.asarray(jit(model.apply, params, batch))
    b = np.asarray(jit(model.apply, params, shuffled))
    np.testing.assert_allclose(b, a[:, order], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="batch has 4 choices, the model 5"):
        C.MultipleChoice(BERT, num_choices=5).loss_fn(params, batch)
