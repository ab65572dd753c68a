"""Every pretraining experiment in configs/experiments runs a few steps, and the CLI
rejects bad configs before compiling anything."""
import json
import os

import pytest

from t2t.run import gin_utils
from t2t.cli import main
from t2t.run import experiment

from tests.tiers import sweep

TEST_MODEL = {"t5": "models/t5/1_1/test.gin", "bert": "models/bert/test.gin",
              "gpt": "models/gpt2/test.gin", "xlnet": "models/xlnet/test.gin"}


EXPERIMENTS = [
    ("t5_tiny_bible", "t5", "{'inputs': 32, 'targets': 8}"),
    ("bert_tiny_bible", "bert", "{'inputs': 32, 'max_predictions': 5}"),
    ("gpt_tiny_bible", "gpt", "{'targets': 32}"),
    ("xlnet_tiny_bible", "xlnet", "{'inputs': 32, 'memory': 16, 'max_predictions': 6}"),
]


# GPT's in CI; T5's runs from the command line in the resume and multi-host tests
@pytest.mark.parametrize("name,family,lengths",
                         sweep(EXPERIMENTS, ci=[e for e in EXPERIMENTS if e[1] == "gpt"]))
def test_experiment_runs_and_writes_operative_config(tmp_path, name, family, lengths):
    gin_utils.parse([f"experiments/{name}.gin", TEST_MODEL[family]], [
        f"MODEL_DIR = '{tmp_path}'", "TRAIN_STEPS = 3", "BATCH_SIZE = 8",
        f"TASK_FEATURE_LENGTHS = {lengths}", "WARMUP_STEPS = 1", "TrainConfig.log_every = 1",
        "TrainConfig.progress_bar = False", "TrainConfig.async_checkpoint = False"])
    result = experiment.run()
    assert result.step == 3 and result.stopped_by == "done"
    records = [json.loads(l) for l in open(tmp_path / "metrics.jsonl")]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["loss"] > 0 for r in records)
    operative = (tmp_path / "config.gin").read_text()
    assert f"MODEL_FAMILY = '{family}'" in operative and "TrainConfig.train_steps" in operative
    assert os.listdir(tmp_path / "checkpoints") == ["3"]


def test_typo_fails_before_compiling_with_file_line_and_suggestion(tmp_path, capsys):
    bad = tmp_path / "bad.gin"
    bad.write_text("include 'experiments/t5_tiny_bible.gin'\nTrainConfig.log_evry = 5\n")
    assert main(["train", f"--gin_file={bad}", f"--gin.MODEL_DIR={tmp_path / 'run'}"]) == 2
    message = capsys.readouterr().err
    assert f'"{bad}", line 2' in message and "Did you mean: log_every" in message
    assert len(message.strip().splitlines()) == 1 and "Traceback" not in message
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="Did you mean: log_every"):   # --verbose: raised
        main(["train", f"--gin_file={bad}", f"--gin.MODEL_DIR={tmp_path / 'run'}", "--verbose"])


def test_unknown_configurable_lists_nearest_names():
    with pytest.raises(ValueError, match=r"(?s)TrainConfg.*Did you mean: TrainConfig"):
        gin_utils.parse([], ["TrainConfg.train_steps = 3"])


def test_unknown_task_lists_registered_ones(tmp_path):
    gin_utils.parse(["experiments/t5_tiny_bible.gin"], [
        f"MODEL_DIR = '{tmp_path}'", "experiment.task = 'bible_web_span_corruptoin'"])
    with pytest.raises(KeyError, match="bible_web_span_corruption"):
        experiment.run()


def test_string_flags_need_no_quotes():
    assert gin_utils.macro_binding("MODEL_DIR", "/tmp/run") == "MODEL_DIR = '/tmp/run'"
    assert gin_utils.macro_binding("TRAIN_STEPS", "100") == "TRAIN_STEPS = 100"
    assert gin_utils.macro_binding("X", "'quoted'") == "X = 'quoted'"
    assert gin_utils.macro_binding("L", "{'inputs': 8}") == "L = {'inputs': 8}"
    assert gin_utils.macro_binding("F", "@make_schedule()") == "F = @make_schedule()"


def test_periodic_evaluation_on_an_eval_task(tmp_path):
    gin_utils.parse(["experiments/t5_tiny_bible.gin", TEST_MODEL["t5"]], [
        f"MODEL_DIR = '{tmp_path}'", "TRAIN_STEPS = 2", "BATCH_SIZE = 8",
        "TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 8}",
        "experiment.eval_task = 'bible_web_iid_15_u_u'", "TrainConfig.eval_every = 2",
        "TrainConfig.eval_steps = 2", "TrainConfig.progress_bar = False"])
    result = experiment.run()
    evals = [h for h in result.history if "eval/loss" in h]
    assert len(evals) == 1 and evals[0]["step"] == 2 and evals[0]["eval/loss"] > 0


def test_a_runs_directory_on_the_python_path_does_not_break_includes(tmp_path, monkeypatch):
    """`runs/` (a MODEL_DIR parent) importable as a namespace package once crashed gin's
    lookup of `include 'runs/finetune.gin'`."""
    import importlib
    (tmp_path / "runs").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    gin_utils.parse(["experiments/finetune_t5_tiny_bible_en_es.gin"],
                    ["MODEL_DIR = '/tmp/x'", "INITIAL_CHECKPOINT = None"])
    assert gin_utils.query_macro("MIXTURE_OR_TASK_NAME") == "bible_translate_en_es"
