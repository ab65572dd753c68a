"""SWAG-style multiple choice through gin (`multiple_choice_experiment`,
experiments/swag_bible_next_verse_bert.gin) on the test BERT: trains, scores accuracy of
the chosen endings, and refuses line-by-line inference."""
import pytest

from t2t.run import finetune, gin_utils

from tests.train.test_finetune import FAST


def test_multiple_choice_fine_tunes_and_scores_accuracy(tmp_path):
    gin_utils.parse(["experiments/swag_bible_next_verse_bert.gin", "models/bert/test.gin"],
                    FAST + [f"MODEL_DIR = '{tmp_path}'", "TRAIN_STEPS = 2", "BATCH_SIZE = 8",
                            "MAX_LENGTH = 24", "multiple_choice_experiment.max_train_examples = 16",
                            "evaluate_experiment.max_examples = 8",
                            "evaluate_experiment.batch_size = 8",
                            "evaluate_experiment.splits = ('validation',)"])
    exp = finetune.finetune_experiment()
    batch = next(exp.data())
    assert batch["encoder_input_tokens"].shape == (8, 4, 24) and batch["label"].shape == (8,)
    out = finetune.run()
    scores = out["metrics"]["bible_next_verse/validation"]
    assert set(scores) == {"accuracy"} and 0.0 <= scores["accuracy"] <= 100.0
    assert scores["accuracy"] * 8 / 100 == pytest.approx(round(scores["accuracy"] * 8 / 100))
    with pytest.raises(ValueError, match="multiple choice picks one"):
        finetune.infer_lines(exp, out["result"].state.params, ["a line"])
