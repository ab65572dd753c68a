"""`t2t finetune | eval | infer` on tiny models: params restored from a pretraining
checkpoint, shape mismatches named, resume, scoring, and line-by-line decoding."""
import io
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from t2t.run import gin_utils
from t2t.cli import main
from t2t.run import finetune
from t2t.run.array_batches import ArrayBatches
from t2t.train.checkpoints import latest_step, restore_params
from t2t.train.trainer import fit

T5_TEST = "models/t5/1_1/test.gin"
FAST = ["TrainConfig.log_every = 1", "TrainConfig.progress_bar = False",
        "TrainConfig.async_checkpoint = False", "TrainConfig.measure_peak = False"]
FT_BINDINGS = FAST + ["TASK_FEATURE_LENGTHS = {'inputs': 24, 'targets': 8}",
                      "BATCH_SIZE = 8", "evaluate_experiment.max_examples = 8",
                      "evaluate_experiment.batch_size = 8"]
FT_GIN = ["experiments/finetune_t5_tiny_bible_en_es.gin", T5_TEST]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A t2t MODEL_DIR of a 1-step run of the test T5 from scratch (same shapes and step
    function as the fine-tuning below, so its compilation is shared)."""
    model_dir = tmp_path_factory.mktemp("pretrain")
    _parse_ft(model_dir, None, "TRAIN_STEPS = 1")
    exp = finetune.finetune_experiment()
    fit(exp.trainer, exp.data())
    return str(model_dir)


@pytest.fixture(scope="module")
def finetuned(pretrained, tmp_path_factory):
    """`t2t finetune` of the pretrained run for 2 steps on bible_translate_en_es."""
    model_dir = tmp_path_factory.mktemp("finetune")
    main(["finetune", *[f"--gin_file={f}" for f in FT_GIN], f"--gin.MODEL_DIR={model_dir}",
          f"--gin.INITIAL_CHECKPOINT={pretrained}", "--gin.TRAIN_STEPS=2",
          *[f"--gin={b}" for b in FT_BINDINGS]])
    return str(model_dir)


def _parse_ft(model_dir, initial, *extra):
    initial = "None" if initial is None else repr(str(initial))
    gin_utils.parse(FT_GIN, FT_BINDINGS + [f"MODEL_DIR = '{model_dir}'",
                                           f"INITIAL_CHECKPOINT = {initial}",
                                           "TRAIN_STEPS = 2", *extra])


def test_initial_params_are_the_checkpoints(pretrained, tmp_path):
    _parse_ft(tmp_path / "ft", pretrained)
    exp = finetune.finetune_experiment()
    assert isinstance(exp.trainer, finetune.FinetuneTrainer)
    state = exp.trainer.init_state(next(exp.data()))
    stored = restore_params(pretrained)            # numpy, the stored tree
    assert int(state.step) == 0
    got, want = jax.tree.leaves(jax.device_get(state.params)), jax.tree.leaves(stored)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    # the optimizer state is fresh (step count 0), not the pretraining run's
    assert all(int(x) == 0 for x in jax.tree.leaves(state.opt_state)
               if np.ndim(x) == 0 and np.issubdtype(np.asarray(x).dtype, np.integer))


def test_finetune_trains_evaluates_and_resumes(finetuned, pretrained):
    metrics = json.load(open(os.path.join(finetuned, "metrics.json")))
    assert set(metrics) == {"bible_translate_en_es/validation", "bible_translate_en_es/test"}
    assert "bleu" in metrics["bible_translate_en_es/test"]
    assert (open(os.path.join(finetuned, "results.md")).read()
            .startswith("| task | bleu |"))
    records = [json.loads(line) for line in open(os.path.join(finetuned, "metrics.jsonl"))]
    assert [r["step"] for r in records if "loss" in r] == [1, 2]
    # a longer run resumes from the fine-tuning checkpoint (not the initial one)
    _parse_ft(finetuned, pretrained, "TRAIN_STEPS = 3")
    out = finetune.run(splits=["validation"])
    assert out["result"].step == 3
    records = [json.loads(line) for line in open(os.path.join(finetuned, "metrics.jsonl"))]
    assert [r["step"] for r in records if "loss" in r][-1] == 3


def test_shape_mismatch_fails_clearly(pretrained, tmp_path):
    import flax.linen as nn
    from jax.sharding import NamedSharding, PartitionSpec as P
    _parse_ft(tmp_path / "ft", pretrained, "TransformerConfig.d_ff = 48")
    exp = finetune.finetune_experiment()
    batch = next(exp.data())
    abstract = jax.eval_shape(lambda: nn.unbox(exp.trainer.model.init(jax.random.PRNGKey(0),
                                                                      batch)))
    replicated = NamedSharding(exp.trainer.mesh, P())
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated),
                          abstract)
    with pytest.raises(ValueError, match=r"(?s)initial checkpoint .*step 1.*encoder/layers/"
                                         r"layer_0/mlp/wi_0/kernel: checkpoint \(32, 64\) vs "
                                         r"model \(32, 48\)"):
        restore_params(pretrained, target)


def test_missing_initial_checkpoint_fails_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="no t2t checkpoint"):
        restore_params(str(tmp_path))


def test_eval_cli_writes_json_and_markdown(finetuned, tmp_path, capsys):
    main(["eval", *[f"--gin_file={f}" for f in FT_GIN], f"--gin.MODEL_DIR={finetuned}",
          "--gin.INITIAL_CHECKPOINT=unused", "--split", "test", f"--output_dir={tmp_path}",
          *[f"--gin={b}" for b in FT_BINDINGS]])
    metrics = json.load(open(tmp_path / "metrics.json"))
    assert list(metrics) == ["bible_translate_en_es/test"]
    assert "| bible_translate_en_es/test |" in capsys.readouterr().out
    assert (tmp_path / "results.md").exists()


@pytest.mark.parametrize("strategy", [[], ["--strategy", "beam", "--beam_size", "2"]])
def test_infer_cli_prints_one_line_per_input(finetuned, monkeypatch, capsys, strategy):
    lines = ["translate English to Spanish: In the beginning God created the heavens.",
             "translate English to Spanish: Jesus wept.", ""]
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(lines) + "\n"))
    main(["infer", *[f"--gin_file={f}" for f in FT_GIN], f"--gin.MODEL_DIR={finetuned}",
          "--gin.INITIAL_CHECKPOINT=unused", *strategy,
          *[f"--gin={b}" for b in FT_BINDINGS]])
    said = capsys.readouterr()
    out = said.out.split("\n")
    assert len(out) == len(lines) + 1 and out[-2:] == ["", ""]   # trailing newline
    assert "1 blank input line(s): blank output line(s)" in said.err    # not decoded


@pytest.mark.parametrize("raw", [False, True])
def test_infer_gives_plain_lines_the_tasks_prefix(finetuned, monkeypatch, capsys, raw):
    """`t2t infer` adds the task's input_prefix to lines that lack it (`--raw`: not)."""
    seen = []

    def fake_predict(model, params, examples, vocabulary, **_):
        seen.extend(vocabulary.decode(ex["inputs"][:-1]) for ex in examples)
        return ["" for _ in examples]

    monkeypatch.setattr(finetune.evaluator, "predict_texts", fake_predict)
    prefix = "translate English to Spanish: "
    monkeypatch.setattr("sys.stdin", io.StringIO(f"Jesus wept.\n{prefix}Amen.\n"))
    main(["infer", *[f"--gin_file={f}" for f in FT_GIN], f"--gin.MODEL_DIR={finetuned}",
          "--gin.INITIAL_CHECKPOINT=unused", *(["--raw"] if raw else []),
          *[f"--gin={b}" for b in FT_BINDINGS]])
    assert seen == (["Jesus wept.", f"{prefix}Amen."] if raw
                    else [f"{prefix}Jesus wept.", f"{prefix}Amen."])
    assert ("(--raw: as given)" in capsys.readouterr().err) != raw


def test_eval_without_checkpoints_fails_clearly(tmp_path, capsys):
    assert main(["eval", *[f"--gin_file={f}" for f in FT_GIN], f"--gin.MODEL_DIR={tmp_path}",
                 "--gin.INITIAL_CHECKPOINT=unused", *[f"--gin={b}" for b in FT_BINDINGS]]) == 2
    err = capsys.readouterr().err
    assert "has no checkpoints" in err and "Traceback" not in err


def test_epochs_to_steps_and_schedule_overrides():
    assert finetune.epochs_to_steps(3, 1742, 32) == 164
    assert finetune.epochs_to_steps(0.5, 10, 4) == 2
    gin_utils.parse(["runs/finetune_bert.gin"], [])
    assert finetune.schedule_overrides(164, 0.1) == {"total_steps": 164, "warmup_steps": 16}
    gin_utils.parse(["runs/finetune.gin"], [])
    assert finetune.schedule_overrides(100, None) == {}


def test_array_batches_cover_epochs_and_resume():
    features = {"x": np.arange(10), "y": np.arange(10) * 2}
    it = ArrayBatches(features, 4, seed=0)
    first = [next(it)["x"] for _ in range(5)]                # 20 rows = 2 epochs
    assert sorted(np.concatenate(first[:2]).tolist() + first[2][:2].tolist()) == list(range(10))
    it.set_state({"position": 8})
    np.testing.assert_array_equal(next(it)["x"], first[2])
    assert np.all(next(ArrayBatches(features, 4, 0))["y"]
                  == 2 * next(ArrayBatches(features, 4, 0))["x"])


def _tiny_hf_bert_paraphrase(tmp_path, extra_gin=()):
    """A tiny random BERT saved as a Hugging Face directory, and the gin of a 2-step
    classifier fine-tuning of it on the bundled paraphrase task (+ `extra_gin` files);
    returns the saved parameters."""
    import flax.linen as nn
    from t2t.convert import hf
    from t2t.data.catalog.bible import bible_wordpiece
    from t2t.models.families import make_module
    from t2t.run.configurables import TransformerConfig
    gin_utils.parse(["models/bert/test.gin"], [])
    vocab = bible_wordpiece()
    config = TransformerConfig().replace(vocab_size=vocab.vocab_size)
    inputs = {"encoder_input_tokens": np.ones((1, 8), np.int32)}
    params = nn.unbox(make_module("bert", config).init(jax.random.PRNGKey(1), **inputs)["params"])
    hf_dir = tmp_path / "hf"
    hf.save_bert(config, params, hf_dir)
    (hf_dir / "vocab.txt").write_text(open(vocab.vocab_file).read())
    gin_utils.parse(["runs/finetune_bert.gin", *extra_gin], FAST + [
        f"MODEL_DIR = '{tmp_path / 'ft'}'", f"INITIAL_CHECKPOINT = '{hf_dir}'",
        "MIXTURE_OR_TASK_NAME = 'bible_paraphrase_kjv_web'", "MAX_LENGTH = 32",
        "EPOCHS = None", "TRAIN_STEPS = 2", "BATCH_SIZE = 8",
        "classifier_experiment.max_train_examples = 32",
        "evaluate_experiment.max_examples = 16", "evaluate_experiment.batch_size = 8"])
    return params


@pytest.mark.slow   # ~20 s; CI fine-tunes the same HF directory in the LoRA test below
def test_bert_classifier_from_hugging_face_dir(tmp_path):
    """A tiny random BERT saved as a Hugging Face directory, fine-tuned as a classifier on
    the bundled paraphrase task: the trunk is the saved one, the head new."""
    params = _tiny_hf_bert_paraphrase(tmp_path)
    exp = finetune.finetune_experiment()
    state = exp.trainer.init_state(next(exp.data()))
    got = jax.device_get(state.params)
    np.testing.assert_array_equal(got["token_embedder"]["embedding"],
                                  params["token_embedder"]["embedding"])
    out = finetune.run(splits=["test"])
    assert out["result"].step == 2
    assert set(out["metrics"]["bible_paraphrase_kjv_web/test"]) >= {"accuracy"}


def test_lora_finetune_saves_its_frozen_run(tmp_path):
    """`t2t finetune` with runs/peft_lora.gin trains, checkpoints (the frozen leaves hold
    no optimizer state) and scores; the trunk it saves is the pretrained one, untouched."""
    params = _tiny_hf_bert_paraphrase(tmp_path, ["runs/peft_lora.gin"])
    out = finetune.run(splits=["test"])
    assert out["result"].step == 2 and os.listdir(tmp_path / "ft" / "checkpoints") == ["2"]
    assert set(out["metrics"]["bible_paraphrase_kjv_web/test"]) >= {"accuracy"}
    saved = jax.device_get(out["result"].state.params)
    np.testing.assert_array_equal(saved["token_embedder"]["embedding"],
                                  params["token_embedder"]["embedding"])


def test_classifier_experiment_ltr_heads_from_gin(tmp_path):
    """BERT Table 5's LTR fine-tuning through gin: a causal trunk with 'last' pooling and
    a BiLSTM head (nothing is trained here)."""
    from t2t.data.catalog.bible import bible_wordpiece
    gin_utils.parse(["runs/finetune_bert.gin", "models/bert/test.gin"], FAST + [
        f"MODEL_DIR = '{tmp_path}'", "INITIAL_CHECKPOINT = None",
        "MIXTURE_OR_TASK_NAME = 'bible_paraphrase_kjv_web'", "EPOCHS = None",
        f"classifier_experiment.vocabulary = '{bible_wordpiece().vocab_file}'",
        "classifier_experiment.pooling = 'last'", "classifier_experiment.bilstm_units = 16",
        "TransformerConfig.encoder_causal = True"])
    model = finetune.finetune_experiment().trainer.model
    assert model.config.encoder_causal
    assert (model.module.pooling, model.module.bilstm_units) == ("last", 16)


def test_operative_config_does_not_depend_on_what_was_imported_before(tmp_path):
    """A fresh process builds the same fine-tuning twice: both operative configs are equal
    (a configurable called at import, after the first parse, used to enter only the first;
    `t2t ablate` fingerprints stages by this config)."""
    code = f"""
from t2t.run import gin_utils
from t2t.run import experiment, finetune

def config():
    gin_utils.parse(["runs/finetune_bert.gin", "hardware/cpu.gin",
                     "ablations/scales/bert_tiny_model.gin"],
                    ["classifier_experiment.vocabulary = @bible_wordpiece_path()",
                     "MODEL_DIR = {str(tmp_path)!r}", "INITIAL_CHECKPOINT = None",
                     "MIXTURE_OR_TASK_NAME = 'bible_paraphrase_kjv_web'"])
    return experiment.operative_config(finetune.finetune_experiment())

first, second = config(), config()
assert first == second, "operative configs differ"
"""
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.fixture(scope="module")
def squad_task():
    """A SQuAD-shaped task over bundled verses (tests/data/helpers.squad_records)."""
    from t2t.data.finetune_tasks import FinetuneTask
    from t2t.data.tasks import register_task
    from tests.data.helpers import squad_records
    records = {"train": squad_records(40), "validation": squad_records(12, seed=1)}
    task = FinetuneTask("test_squad_verses", lambda split: records[split], [],
                        splits=("train", "validation"))
    register_task(task, overwrite=True)
    return task


def _parse_squad(model_dir, *extra):
    gin_utils.parse(["runs/finetune_bert.gin", "runs/squad_bert.gin", "models/bert/test.gin"],
                    FAST + [f"MODEL_DIR = '{model_dir}'", "INITIAL_CHECKPOINT = None",
                            "MIXTURE_OR_TASK_NAME = 'test_squad_verses'", "MAX_LENGTH = 48",
                            "span_qa_experiment.doc_stride = 16",
                            "span_qa_experiment.vocabulary = @bible_wordpiece_path()",
                            "BATCH_SIZE = 8", "evaluate_experiment.batch_size = 8", *extra])


def test_span_qa_fine_tunes_with_a_bilstm_and_scores_squad_f1(squad_task, tmp_path):
    """BERT on SQuAD through gin (runs/squad_bert.gin): the schedule counts windows, a
    BiLSTM under the span head (BERT Table 5), EM/F1 on the validation split."""
    _parse_squad(tmp_path, "EPOCHS = 0.25", "span_qa_experiment.bilstm_units = 16")
    exp = finetune.finetune_experiment()
    windows = len(exp.train_windows().example_index)
    assert windows > 40 and exp.trainer.config.train_steps == -(-windows // 32)
    assert exp.trainer.model.module.bilstm_units == 16
    out = finetune.run()
    scores = out["metrics"]["test_squad_verses/validation"]
    assert set(scores) == {"em", "f1"} and 0.0 <= scores["em"] <= scores["f1"] <= 100.0
    assert (tmp_path / "predictions.jsonl").read_text().count("\n") >= 1
    with pytest.raises(ValueError, match="span QA answers a question"):
        finetune.infer_lines(exp, out["result"].state.params, ["a line"])


def test_span_qa_scoring_maps_gold_spans_back_to_the_answers(squad_task, tmp_path,
                                                             monkeypatch):
    """An oracle that points at the gold tokens scores EM 100 on every question whose
    answer fits a window: token positions -> offsets -> context text -> SQuAD metric."""
    _parse_squad(tmp_path)
    exp = finetune.finetune_experiment()
    spans = exp.span_features("validation")
    answerable = {int(q) for q in spans.example_index[spans.features["start_positions"] > 0]}
    assert len(answerable) >= 10

    def oracle(model, params, features, **_):
        gold = features["start_positions"] > 0
        return {"start": features["start_positions"], "end": features["end_positions"],
                "span_score": np.where(gold, 1.0, -np.inf)}

    monkeypatch.setattr(finetune.evaluator, "predict_spans", oracle)
    details = {}
    scores = exp.evaluate(None, "validation", batch_size=8, details=details)
    assert scores["em"] == pytest.approx(100.0 * len(answerable) / 12)
    rows = details["rows"]                     # predictions.jsonl: question, gold, answer
    assert len(rows) == 12 and all(r["input"].strip() for r in rows)
    assert all(rows[q]["prediction"] in rows[q]["target"] for q in answerable)


def test_unbuilt_dataset_is_one_line(tmp_path, monkeypatch, capsys):
    """A task whose dataset is not built: exit 2 and one line naming the build command."""
    monkeypatch.setenv("T2T_DATA_DIR", str(tmp_path / "empty"))
    code = main(["finetune", *[f"--gin_file={f}" for f in FT_GIN],
                 f"--gin.MODEL_DIR={tmp_path / 'ft'}", "--gin.INITIAL_CHECKPOINT=None",
                 "--gin.MIXTURE_OR_TASK_NAME='bbc_topic'", "--gin.TRAIN_STEPS=1",
                 *[f"--gin={b}" for b in FT_BINDINGS]])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(
        "t2t finetune: error: dataset 'bbc' is not built: run `t2t data build bbc` (details:")


# --- the run's own operative config (MODEL_DIR/config.gin) when no --gin_file is given ---
def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    said = [line for line in err.splitlines() if ": error: " in line]
    assert len(said) == 1 and err.splitlines()[-1] == said[0] and "Traceback" not in err, err
    return said[0]


def test_eval_reads_the_runs_own_config(finetuned, tmp_path, capsys):
    """`t2t eval --gin.MODEL_DIR=...` alone: no flag of the fine-tuning repeated."""
    assert main(["eval", f"--gin.MODEL_DIR={finetuned}", "--split", "test",
                 f"--output_dir={tmp_path}", "--gin=evaluate_experiment.max_examples = 8",
                 "--gin=evaluate_experiment.batch_size = 8"]) == 0
    assert list(json.load(open(tmp_path / "metrics.json"))) == ["bible_translate_en_es/test"]
    assert "| bible_translate_en_es/test |" in capsys.readouterr().out


def test_infer_reads_the_runs_own_config(finetuned, monkeypatch, capsys):
    seen = []

    def fake_predict(model, params, examples, vocabulary, **_):
        seen.extend(vocabulary.decode(ex["inputs"][:-1]) for ex in examples)
        return ["salida" for _ in examples]

    monkeypatch.setattr(finetune.evaluator, "predict_texts", fake_predict)
    monkeypatch.setattr("sys.stdin", io.StringIO("Jesus wept.\n"))
    assert main(["infer", f"--gin.MODEL_DIR={finetuned}"]) == 0
    assert capsys.readouterr().out == "salida\n"
    assert seen == ["translate English to Spanish: Jesus wept."]


def test_a_flag_that_does_not_fit_the_checkpoint_is_one_line(finetuned, tmp_path, capsys):
    """A command-line binding overrides the run's config; one the checkpoint cannot take
    is one line (CheckpointMismatchError), not a traceback."""
    assert main(["eval", f"--gin.MODEL_DIR={finetuned}", f"--output_dir={tmp_path}",
                 "--gin=TransformerConfig.d_ff = 48"]) == 2
    err = _error_line(capsys)
    assert "does not fit the model" in err and "(32, 64) vs model (32, 48)" in err
    assert not (tmp_path / "metrics.json").exists()


def test_a_misspelt_macro_on_the_runs_config_is_one_line(finetuned, capsys):
    assert main(["eval", f"--gin.MODEL_DIR={finetuned}", "--gin.TRAIN_STEPZ=3"]) == 2
    assert "--gin.TRAIN_STEPZ is not used by this config" in _error_line(capsys)


def test_eval_without_checkpoints_says_so_before_reading_data(finetuned, tmp_path,
                                                               monkeypatch, capsys):
    """The run's config is there (the run stopped before its first save), no checkpoint:
    one line, and neither the task nor its data is built."""
    config = open(os.path.join(finetuned, "config.gin")).read()
    (tmp_path / "config.gin").write_text(config)

    def no_data(*args, **kwargs):
        raise AssertionError("the experiment (task, data) was built")

    monkeypatch.setattr(finetune, "finetune_experiment", no_data)
    assert main(["eval", f"--gin.MODEL_DIR={tmp_path}"]) == 2
    assert f"MODEL_DIR '{tmp_path}' has no checkpoints" in _error_line(capsys)
    assert main(["eval", *[f"--gin_file={f}" for f in FT_GIN], f"--gin.MODEL_DIR={tmp_path}",
                 "--gin.INITIAL_CHECKPOINT=unused"]) == 2    # with --gin_file too
    assert "has no checkpoints" in _error_line(capsys)


@pytest.mark.parametrize("flags, said", [
    ([], "t2t eval needs --gin_file=..., or --gin.MODEL_DIR=<a run's directory>"),
    (["--gin.MODEL_DIR={tmp}/nowhere"], "MODEL_DIR '{tmp}/nowhere' does not exist"),
    (["--gin.MODEL_DIR={tmp}"], "MODEL_DIR '{tmp}' has no config.gin"),
])
def test_eval_without_a_config_says_what_to_give(tmp_path, capsys, flags, said):
    assert main(["eval", *[f.format(tmp=tmp_path) for f in flags]]) == 2
    assert said.format(tmp=tmp_path) in _error_line(capsys)


def test_a_resumed_run_reads_its_own_config(finetuned, capsys):
    """`t2t finetune --gin.MODEL_DIR=...` alone resumes the run as it was configured (a
    command-line binding on top: one more step)."""
    step = latest_step(os.path.join(finetuned, "checkpoints"))
    assert main(["finetune", f"--gin.MODEL_DIR={finetuned}", f"--gin.TRAIN_STEPS={step + 1}",
                 "--split", "test", "--gin=evaluate_experiment.max_examples = 8",
                 "--gin=evaluate_experiment.batch_size = 8"]) == 0
    said = capsys.readouterr()
    assert f"resumed from step {step}" in said.err
    assert f"trained to step {step + 1}" in said.out
    assert "| bible_translate_en_es/test |" in said.out
    assert f"TRAIN_STEPS = {step + 1}" in open(os.path.join(finetuned, "config.gin")).read()
