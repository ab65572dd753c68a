"""The unigram baseline against a hand count, and through the ablation report."""
import math

import numpy as np
import pytest

from t2t.evaluation import unigram


def batch(ids, weights):
    return {"masked_ids": np.array(ids), "masked_weights": np.array(weights, np.float32)}


def test_counts_and_loss_match_a_hand_computation():
    train = [batch([[1, 1, 2, 0]], [[1, 1, 1, 0]]), batch([[3, 1, 0, 0]], [[1, 1, 0, 0]])]
    counts = unigram.count_targets(iter(train), vocab_size=5)
    np.testing.assert_array_equal(counts, [0, 3, 1, 1, 0])     # padding (weight 0) not counted
    held = [{"decoder_target_tokens": np.array([[1, 4, 9]]) % 5,
             "decoder_loss_weights": np.array([[1.0, 1.0, 0.0]])}]
    # p = (count + 1) / (5 + 5): p(1) = 0.4, p(4) = 0.1
    expected = -(math.log(0.4) + math.log(0.1)) / 2
    assert unigram.unigram_loss(counts, held) == pytest.approx(expected, rel=1e-12)
    assert unigram.count_targets(iter(train), 5, max_batches=1).sum() == 3


def test_batches_without_targets_are_named():
    with pytest.raises(ValueError, match="masked_ids"):
        unigram.targets({"inputs": np.zeros(3)})
    with pytest.raises(ValueError, match="no targets"):
        unigram.unigram_loss(np.ones(3), [batch([[0]], [[0.0]])])


def test_the_report_prints_the_floor_beside_the_held_out_perplexity():
    from t2t.ablations import grid as grid_lib, report
    grid = grid_lib.ablation(
        name="g", title="t", axes={"A": {"a": []}},
        scales={"tiny": {"pretrain": [], "finetune": [], "tasks": {"t": "accuracy"},
                         "heldout": ["h", "mlm_loss"]}})
    held = {"metric": "mlm_loss", "mlm_loss": 5.0,
            "unigram": {"loss": math.log(800.0), "train_targets": 64000}}
    results = {"a": [{"seed": 0, "pretrain": {"heldout": held}, "finetune": {}}]}
    line = report.unigram_line(grid, results)
    assert "**800.0**" in line and "64,000 training targets" in line
    assert report.unigram_line(grid, {"a": []}) == ""
