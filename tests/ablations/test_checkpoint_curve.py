"""`python -m t2t.ablations.checkpoint_curve`'s content-token weighting (the run end to end is
in test_runner.py, on its pretrained grid)."""
import types

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
