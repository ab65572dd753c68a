"""ELMo from the command line: `t2t train` with experiments/elmo_tiny_bible.gin pretrains the
biLM a few steps and fits the scalar-mix classifier on its frozen layers."""
import json

import numpy as np
import pytest

from t2t.cli import main


@pytest.mark.slow    # ~13 s; the biLM and the scalar mix: tests/models/test_elmo.py
def test_elmo_experiment_trains_the_bilm_then_the_mix(tmp_path, capsys):
    model_dir = tmp_path / "elmo"
    code = main(["train", "--gin_file=experiments/elmo_tiny_bible.gin",
                 "--gin_file=models/elmo/test.gin", f"--gin.MODEL_DIR={model_dir}",
                 "--gin.TRAIN_STEPS=3", "--gin.BATCH_SIZE=8", "--gin.WARMUP_STEPS=1",
                 "--gin.TASK_FEATURE_LENGTHS={'tokens': 12, 'characters': 20}",
                 "--gin.TrainConfig.log_every=1", "--gin.TrainConfig.progress_bar=False",
                 "--gin.TrainConfig.eval_every=0",
                 "--gin.elmo_downstream.train_examples=48", "--gin.elmo_downstream.steps=4",
                 "--gin.elmo_downstream.eval_examples=16"])
    assert code == 0
    rows = [json.loads(line) for line in open(model_dir / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [1, 2, 3]
    first = rows[0]
    assert abs(first["loss"] - np.log(8192)) < 0.5                 # uniform over the words
    assert abs(first["perplexity"] - np.exp(first["loss"])) < 1e-2 * first["perplexity"]
    assert {"forward_loss", "backward_loss"} <= set(first)
    operative = (model_dir / "config.gin").read_text()
    assert "MODEL_FAMILY = 'elmo'" in operative and "ElmoConfig.cell_size = 16" in operative
    result = json.loads((model_dir / "elmo_downstream.json").read_text())
    assert result["task"] == "kjv_or_web" and result["train_examples"] == 48
    assert len(result["mix_weights"]) == 3 and abs(sum(result["mix_weights"]) - 1) < 1e-3
    assert 0.0 <= result["accuracy"] <= 1.0
    out = capsys.readouterr().out
    assert "scalar mix softmax(s) over [tokens, LSTM 1, LSTM 2]" in out
