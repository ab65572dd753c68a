"""GPT-1 fine-tuning format from the command line (`t2t finetune` through `t2t.cli.main`):
experiments/gpt1_format_next_verse.gin from a tiny Hugging Face openai-gpt directory (its
token table grown by the three special tokens), two steps, scored into metrics.json; a
one-line error for a bad format. (The paraphrase experiment's real runs: docs/results.md.)"""
import json

import pytest

import torch  # noqa: F401  (the test extra: never skipped)
import transformers

from t2t import cli

FAST = ["--gin.TrainConfig.log_every=1", "--gin.TrainConfig.progress_bar=False",
        "--gin.TrainConfig.async_checkpoint=False", "--gin.TrainConfig.measure_peak=False",
        "--gin.TRAIN_STEPS=2", "--gin.MAX_LENGTH=24",
        "--gin.gpt_format_experiment.max_train_examples=16",
        "--gin.evaluate_experiment.max_examples=8", "--gin.evaluate_experiment.batch_size=8",
        "--gin.TransformerConfig.dtype='float32'"]


def _finetune(experiment, model_dir, checkpoint, *extra):
    return cli.main(["finetune", f"--gin_file=experiments/{experiment}.gin",
                     "--gin_file=models/gpt1/test.gin", f"--gin.MODEL_DIR='{model_dir}'",
                     f"--gin.INITIAL_CHECKPOINT={checkpoint}", *FAST, *extra])


@pytest.fixture(scope="module")
def hf_gpt1(tmp_path_factory):
    """A random openai-gpt as wide as the test preset, over the Bible SentencePiece ids."""
    path = tmp_path_factory.mktemp("openai_gpt")
    config = transformers.OpenAIGPTConfig(vocab_size=8192, n_positions=64, n_embd=32,
                                          n_layer=2, n_head=4)
    transformers.OpenAIGPTLMHeadModel(config).save_pretrained(str(path), safe_serialization=True)
    return str(path)


def test_multiple_choice_from_a_hugging_face_gpt1(hf_gpt1, tmp_path, capsys):
    assert _finetune("gpt1_format_next_verse", tmp_path, f"'{hf_gpt1}'",
                     "--gin.BATCH_SIZE=8") == 0
    scores = json.loads((tmp_path / "metrics.json").read_text())["bible_next_verse/validation"]
    assert set(scores) == {"accuracy"} and 0 <= scores["accuracy"] <= 100


def test_a_bad_format_is_one_line(tmp_path, capsys):
    assert _finetune("gpt1_format_paraphrase", tmp_path, "None",
                     "--gin.GPT_FORMAT='translation'") == 2
    err = capsys.readouterr().err
    assert "GPT input format 'translation'; choose one of" in err and err.count("\n") <= 2
