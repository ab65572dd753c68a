"""`t2t finetune` of an XLNet classifier through gin (experiments/finetune_xlnet_paraphrase.gin
on the test-sized XLNet): the XLNet head is built, trains, and is scored."""
import pytest

from t2t.errors import ConfigError
from t2t.models.xlnet_heads import XLNetSequenceClassifier
from t2t.run import finetune, gin_utils

BINDINGS = ["TrainConfig.log_every = 1", "TrainConfig.progress_bar = False",
            "TrainConfig.async_checkpoint = False", "TrainConfig.measure_peak = False",
            "INITIAL_CHECKPOINT = None", "TRAIN_STEPS = 2", "BATCH_SIZE = 8", "MAX_LENGTH = 24",
            "classifier_experiment.max_train_examples = 16",
            "evaluate_experiment.max_examples = 8", "evaluate_experiment.batch_size = 8"]
GIN = ["experiments/finetune_xlnet_paraphrase.gin", "models/xlnet/test.gin"]


def _experiment(model_dir, *extra):
    gin_utils.parse(GIN, BINDINGS + [f"MODEL_DIR = '{model_dir}'", *extra])
    return finetune.finetune_experiment()


def test_the_config_builds_an_xlnet_classifier(tmp_path):
    exp = _experiment(tmp_path)
    model = exp.trainer.model
    assert isinstance(model, XLNetSequenceClassifier) and model.num_classes == 2
    assert model.config.vocab_size == exp.vocabulary.padded_vocab_size
    assert isinstance(exp.trainer, finetune.FinetuneTrainer)


@pytest.mark.slow
def test_xlnet_classifier_fine_tunes_and_scores(tmp_path):
    exp = _experiment(tmp_path)
    out = finetune.run(splits=("validation",), exp=exp)
    scores = out["metrics"]["bible_paraphrase_kjv_web/validation"]
    assert set(scores) == {"accuracy", "f1"} and 0.0 <= scores["accuracy"] <= 100.0


def test_xlnet_head_options_are_one_line_errors(tmp_path):
    with pytest.raises(ConfigError, match="classifies from its last position") as e:
        _experiment(tmp_path, "classifier_experiment.pooling = 'last'")
    assert "\n" not in e.value.summary
