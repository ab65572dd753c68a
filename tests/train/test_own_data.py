"""Your own data end to end through the command line, on files written here: pretrain a
test-size T5 on a folder of text (its SentencePiece trained and saved), fine-tune it on a
JSONL of pairs with every kind of bad line, score it with `t2t eval` (predictions.jsonl,
the copy-the-input baseline, the data counts), and a BERT classifier on CSV files."""
import csv
import json
import os

import pytest

from t2t.cli import main
from t2t.data.vocab import WordPieceVocabulary

FAST = ["TrainConfig.log_every = 1", "TrainConfig.progress_bar = False",
        "TrainConfig.async_checkpoint = False", "TrainConfig.measure_peak = False"]
T5 = ["--gin_file=models/t5/1_1/test.gin", "--gin.BATCH_SIZE=8",
      "--gin.TASK_FEATURE_LENGTHS={'inputs': 24, 'targets': 8}", *[f"--gin={b}" for b in FAST]]
WORDS = ("river stone light water green field house bread salt wind cloud seed door road "
         "hill tree").split()


def _sentence(i: int, n: int = 4) -> str:
    return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(n))


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("T2T_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, cache):
    """`t2t train` of the test T5 for 1 step on a folder of text files."""
    root = tmp_path_factory.mktemp("own")
    (root / "text").mkdir()
    for f in range(3):
        paragraphs = ["\n".join(_sentence(10 * f + 3 * p + k, 6).capitalize() + "."
                                for k in range(3)) for p in range(4)]
        (root / "text" / f"part{f}.txt").write_text("\n\n".join(paragraphs) + "\n")
    model_dir = root / "pretrained"
    main(["train", "--gin_file=experiments/t5_tiny_bible.gin", *T5, "--gin.TRAIN_STEPS=1",
          f"--gin.TEXT_FILES={root / 'text' / '*.txt'}", f"--gin.MODEL_DIR={model_dir}"])
    return root, model_dir


def _pairs(n: int, start: int = 0) -> list[bytes]:
    return [json.dumps({"en": _sentence(i), "de": _sentence(i + 1, 2)}).encode()
            for i in range(start, start + n)]


def test_pretraining_on_your_text(pretrained, capsys):
    root, model_dir = pretrained
    assert (model_dir / "vocabulary.model").is_file()           # trained, saved for fine-tuning
    config = (model_dir / "config.gin").read_text()
    assert f"TEXT_FILES = '{root / 'text' / '*.txt'}'" in config
    data = json.loads((model_dir / "data.json").read_text())["train"]
    assert (data["documents"], data["file_count"], data["undecodable"]) == (12, 3, 0)


def test_finetune_and_eval_on_your_pairs(pretrained, capsys):
    root, pre_dir = pretrained
    train = _pairs(24)
    train[3] = json.dumps({"en": "no target"}).encode()           # missing field
    train[5] = b'{"en": "cut'                                      # not JSON
    train[7] = b""                                                 # blank
    train[9] = b'{"en": "caf\xe9", "de": "x"}'                     # not UTF-8
    train[11] = json.dumps({"en": _sentence(0, 40), "de": "lang"}).encode()  # cut to 24
    (root / "train.jsonl").write_bytes(b"\n".join(train) + b"\n")
    (root / "dev.jsonl").write_bytes(b"\n".join(_pairs(4, 30) + [b'{"en": "no de"}']) + b"\n")
    (root / "test.jsonl").write_bytes(b"\n".join(_pairs(4, 40)) + b"\n")
    model_dir = root / "finetuned"
    flags = ["--gin_file=experiments/finetune_t5_from_files.gin", *T5,
             f"--gin.TRAIN_FILES={root / 'train.jsonl'}",
             f"--gin.VALIDATION_FILES={root / 'dev.jsonl'}",
             f"--gin.TEST_FILES={root / 'test.jsonl'}", "--gin.INPUT_FIELD=en",
             "--gin.TARGET_FIELD=de", "--gin.TASK_PREFIX=reverse:", f"--gin.MODEL_DIR={model_dir}",
             f"--gin.INITIAL_CHECKPOINT={pre_dir}"]
    capsys.readouterr()
    assert main(["finetune", *flags, "--gin.TRAIN_STEPS=2"]) == 0
    out = capsys.readouterr().out
    assert "from_files/test (baseline: copy the input)" in out
    assert "predictions (input, target, prediction):" in out
    metrics = json.loads((model_dir / "metrics.json").read_text())
    counts = {k: metrics["data"]["train"][k] for k in
              ("lines", "examples", "undecodable", "missing_field", "empty", "truncated")}
    assert counts == {"lines": 24, "examples": 20, "undecodable": 2, "missing_field": 1,
                      "empty": 1, "truncated": 1}
    assert metrics["data"]["train"]["first_bad_line"] == \
        f"{root / 'train.jsonl'}:4: no field 'de'"
    assert metrics["data"]["validation"]["missing_field"] == 1
    assert set(metrics["baselines"]) == {"validation", "test"}
    assert {"bleu", "chrf"} <= set(metrics["from_files/test"])

    (model_dir / "predictions.jsonl").unlink()
    assert main(["eval", *flags]) == 0                     # the bad dev line: no KeyError
    rows = [json.loads(line) for line in open(model_dir / "predictions.jsonl")]
    assert [r["split"] for r in rows] == ["validation"] * 4 + ["test"] * 4
    assert rows[4]["input"] == "reverse: " + _sentence(40)
    assert rows[4]["target"] == _sentence(41, 2) and isinstance(rows[4]["prediction"], str)
    copy = json.loads((model_dir / "metrics.json").read_text())["baselines"]["test"]
    assert copy["baseline"] == "copy the input"
    assert copy["beaten"] == (metrics["from_files/test"]["bleu"] > copy["scores"]["bleu"])


def test_bert_classifier_on_your_csv(tmp_path, cache, capsys):
    rows = [(_sentence(i, 5), "calm" if i % 3 else "storm") for i in range(30)]
    for name, part in (("train", rows[:20]), ("dev", rows[20:25]), ("test", rows[25:])):
        with open(tmp_path / f"{name}.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["text", "label"])
            writer.writerows(part + ([("one", "two", "three")] if name == "train" else []))
    vocab = WordPieceVocabulary.train([r[0] for r in rows], tmp_path / "vocab.txt", 200)
    model_dir = tmp_path / "classifier"
    assert main(["finetune", "--gin_file=experiments/finetune_bert_from_files.gin",
                 "--gin_file=models/bert/test.gin", f"--gin.TRAIN_FILES={tmp_path}/train.csv",
                 f"--gin.VALIDATION_FILES={tmp_path}/dev.csv",
                 f"--gin.TEST_FILES={tmp_path}/test.csv", "--gin.TEXT_FIELD=text",
                 "--gin.LABEL_FIELD=label", f"--gin.MODEL_DIR={model_dir}",
                 "--gin.INITIAL_CHECKPOINT=None", "--gin.EPOCHS=None", "--gin.TRAIN_STEPS=2",
                 "--gin.MAX_LENGTH=16", "--gin.BATCH_SIZE=8",
                 f"--gin=classifier_experiment.vocabulary='{vocab.vocab_file}'",
                 *[f"--gin={b}" for b in FAST]]) == 0
    assert json.loads((model_dir / "labels.json").read_text())["labels"] == ["calm", "storm"]
    metrics = json.loads((model_dir / "metrics.json").read_text())
    assert metrics["data"]["train"]["undecodable"] == 1          # the 3-column row
    majority = metrics["baselines"]["test"]
    assert majority["baseline"] == "majority class 'calm'"
    test_labels = [r[1] for r in rows[25:]]
    assert majority["scores"]["accuracy"] == pytest.approx(
        100 * test_labels.count("calm") / len(test_labels))
    predictions = [json.loads(line) for line in open(model_dir / "predictions.jsonl")]
    assert [p["target"] for p in predictions if p["split"] == "test"] == test_labels
    assert {p["prediction"] for p in predictions} <= {"calm", "storm"}
    assert os.path.isfile(model_dir / "data.json")


@pytest.mark.slow
def test_bert_tagger_on_your_conll(tmp_path, cache):
    names = ["ann", "bob", "cy"]
    places = ["rome", "oslo", "lima"]
    sentences = [[(names[i % 3], "B-PER"), ("went", "O"), ("to", "O"), (places[i % 3], "B-LOC")]
                 for i in range(12)]
    for name, part in (("train", sentences[:8]), ("test", sentences[8:])):
        text = "\n\n".join("\n".join(f"{w} {t}" for w, t in s) for s in part)
        tail = "\n\nbroken\n" if name == "train" else "\n"       # a token without a tag
        (tmp_path / f"{name}.conll").write_text(text + tail)
    vocab = WordPieceVocabulary.train([" ".join(w for w, _ in s) for s in sentences],
                                      tmp_path / "vocab.txt", 100)
    model_dir = tmp_path / "tagger"
    assert main(["finetune", "--gin_file=experiments/finetune_bert_from_files.gin",
                 "--gin_file=models/bert/test.gin", f"--gin.TRAIN_FILES={tmp_path}/train.conll",
                 f"--gin.TEST_FILES={tmp_path}/test.conll", f"--gin.MODEL_DIR={model_dir}",
                 "--gin.INITIAL_CHECKPOINT=None", "--gin.EPOCHS=None", "--gin.TRAIN_STEPS=2",
                 "--gin.MAX_LENGTH=16", "--gin.BATCH_SIZE=8",
                 f"--gin=tagging_experiment.vocabulary='{vocab.vocab_file}'",
                 *[f"--gin={b}" for b in FAST]]) == 0
    metrics = json.loads((model_dir / "metrics.json").read_text())
    assert metrics["data"]["train"]["missing_field"] == 1          # the tagless line
    assert {"accuracy", "f1"} <= set(metrics["from_files/test"])
    assert metrics["baselines"]["test"]["scores"]["accuracy"] == 50.0   # all "O"
    rows = [json.loads(line) for line in open(model_dir / "predictions.jsonl")]
    assert rows[0]["input"] == "cy went to lima" and len(rows[0]["prediction"]) == 4


def test_missing_files_and_fields_are_one_line_before_compiling(tmp_path, capsys):
    (tmp_path / "train.jsonl").write_bytes(b"\n".join(_pairs(3)) + b"\n")
    flags = ["finetune", "--gin_file=experiments/finetune_t5_from_files.gin",
             f"--gin.MODEL_DIR={tmp_path / 'run'}", "--gin.INITIAL_CHECKPOINT=None",
             "--gin.INPUT_FIELD=en"]
    assert main([*flags, f"--gin.TRAIN_FILES={tmp_path}/*.tsv", "--gin.TARGET_FIELD=de"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"TRAIN_FILES: '{tmp_path}/*.tsv' matches no file" in err[0]
    assert main([*flags, f"--gin.TRAIN_FILES={tmp_path}/train.jsonl",
                 "--gin.TARGET_FIELD=fr"]) == 2
    assert "no line has field(s) 'en', 'fr'; the first line has 'en', 'de'" in \
        capsys.readouterr().err
    assert not (tmp_path / "run" / "checkpoints").exists()
