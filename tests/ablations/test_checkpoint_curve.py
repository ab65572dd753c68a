"""`python -m t2t.ablations.checkpoint_curve`'s content-token weighting (the run end to end is
in test_runner.py, on its pretrained grid)."""
import types

import jax.numpy as jnp
import numpy as np

from t2t.ablations import checkpoint_curve

VOCAB = types.SimpleNamespace(eos_id=1, vocab_size=10, extra_ids=3)   # sentinels 7, 8, 9


def test_sentinels_and_eos_are_weighted_zero_and_nothing_else_changes():
    batch = {"decoder_target_tokens": np.array([[9, 4, 5, 8, 6, 1, 0]]),
             "decoder_loss_weights": np.array([[1, 1, 1, 1, 1, 1, 0]], np.float32),
             "decoder_input_tokens": np.array([[0, 9, 4, 5, 8, 6, 1]])}
    out = checkpoint_curve.content_only(batch, VOCAB)
    np.testing.assert_array_equal(out["decoder_loss_weights"], [[0, 1, 1, 0, 1, 0, 0]])
    np.testing.assert_array_equal(out["decoder_target_tokens"], batch["decoder_target_tokens"])
    np.testing.assert_array_equal(batch["decoder_loss_weights"], [[1, 1, 1, 1, 1, 1, 0]])


def test_the_table_reads_how_far_content_tokens_sit_below_their_floor():
    rows = [{"run": "r", "step": 500, "loss": 3.7, "unigram_loss": 5.786,
             "content_loss": 7.054, "content_unigram_loss": 7.662}]
    assert checkpoint_curve.table(rows).splitlines()[-1] == \
        "| r | 500 | 3.700 | 5.786 | 7.054 | 7.662 | 0.608 |"
    rows[0].update(probe_accuracy=33.5, mean_cosine=0.9131)
    assert checkpoint_curve.table(rows).splitlines()[-1].endswith("| 0.608 | 33.5 | 0.913 |")


def test_nearest_centroid_reads_class_structure_and_cosine_reads_collapse():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(3, 16)) * 5
    y = np.repeat(np.arange(3), 20)
    x = centres[y] + rng.normal(size=(60, 16))
    assert checkpoint_curve.nearest_centroid_accuracy(x[::2], y[::2], x[1::2], y[1::2]) == 100.0
    wrong = (y[1::2] + 1) % 3
    assert checkpoint_curve.nearest_centroid_accuracy(x[::2], y[::2], x[1::2], wrong) == 0.0
    same = np.tile(rng.normal(size=(1, 16)), (5, 1))
    assert abs(checkpoint_curve.mean_pairwise_cosine(same) - 1.0) < 1e-9
    assert abs(checkpoint_curve.mean_pairwise_cosine(np.eye(4))) < 1e-12


def test_a_bert_run_is_scored_by_its_masked_lm_loss_on_every_masked_token():
    """WordPiece has no sentinels: every masked token is content; an MLM + NSP model's
    held-out score is its masked-LM loss, not the sum with NSP's."""
    from t2t.train import partitioning
    wordpiece = types.SimpleNamespace(vocab_size=16000)
    batch = {"masked_ids": np.array([[5, 7, 0]]), "masked_weights": np.array([[1.0, 1, 0]])}
    assert checkpoint_curve.content_only(batch, wordpiece) is batch

    def loss_fn(params, batch, rng):                 # mean masked "loss" = params * weight
        mlm = (params * batch["masked_weights"]).sum() / batch["masked_weights"].sum()
        return mlm + 0.7, {"loss": mlm + 0.7, "mlm_loss": mlm}

    mesh = partitioning.make_mesh()
    trainer = types.SimpleNamespace(model=types.SimpleNamespace(loss_fn=loss_fn), mesh=mesh,
                                    rules=partitioning.DEFAULT_RULES,
                                    global_batch=lambda b: b)
    scorer = checkpoint_curve.HeldoutScorer(trainer, [batch], [batch])
    assert scorer.score(jnp.float32(2.0)) == (2.0, 2.0)
