"""Shared by the tests of an HF classifier directory scored by `t2t eval` and continued by
`t2t finetune`."""
import json

import numpy as np
import pytest
import torch

from t2t.cli import main


def check_eval_and_finetune(flags, tmp_path, labels, test_labels, test_logits, train_labels,
                            train_logits):
    """`t2t eval` of MODEL_DIR without checkpoints scores the HF directory named by `flags`'
    INITIAL_CHECKPOINT: its test predictions are transformers' argmax of `test_logits` and
    its accuracy theirs against `test_labels`; `t2t finetune`'s first logged loss is
    transformers' cross entropy of `train_logits` against `train_labels` (rel. 1e-5).
    Returns the test argmax."""
    scored = tmp_path / "scored"            # no checkpoints: the HF directory is scored
    assert main(["eval", *flags, f"--gin.MODEL_DIR={scored}"]) == 0
    assert json.loads((scored / "labels.json").read_text())["labels"] == labels
    predictions = [json.loads(line) for line in open(scored / "predictions.jsonl")]
    argmax = test_logits.argmax(-1).tolist()
    assert [p["prediction"] for p in predictions if p["split"] == "test"] == \
        [labels[i] for i in argmax]
    accuracy = 100 * np.mean([labels[i] == y for i, y in zip(argmax, test_labels)])
    metrics = json.loads((scored / "metrics.json").read_text())
    assert metrics["from_files/test"]["accuracy"] == pytest.approx(accuracy)

    tuned = tmp_path / "tuned"
    assert main(["finetune", *flags, f"--gin.MODEL_DIR={tuned}"]) == 0
    first = json.loads(open(tuned / "metrics.jsonl").readline())
    loss = torch.nn.functional.cross_entropy(
        train_logits, torch.tensor([labels.index(y) for y in train_labels]))
    assert first["step"] == 1
    assert first["loss"] == pytest.approx(float(loss), rel=1e-5)
    return argmax
