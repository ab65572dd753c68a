"""Your own files: globs, every reader, each kind of bad line counted with its file:line,
`from_files` kinds and labels, vocabularies cached by content, the data report. (Text to
pretrain on streams: tests/data/test_streaming.py.)"""
import collections
import csv
import gzip
import json

import numpy as np
import pytest

from t2t.data import data_report, user_files, vocab_training
from t2t.data.converters import EncDecConverter
from t2t.data.tasks import from_files
from t2t.errors import ConfigError, InputFileError


def _write(path, lines: list[bytes]) -> str:
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return str(path)


def _pairs(n: int) -> list[bytes]:
    return [json.dumps({"en": f"word {i} here", "fr": f"mot {i} ici"}).encode()
            for i in range(n)]


# ----------------------------------------------------------------------------- files


def test_expand_globs_directories_and_one_line_errors(tmp_path):
    for name in ("b.txt", "a.txt", "sub/c.txt"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("x\n")
    assert user_files.expand(str(tmp_path / "*.txt")) == [str(tmp_path / "a.txt"),
                                                         str(tmp_path / "b.txt")]
    assert user_files.expand(str(tmp_path))[-1] == str(tmp_path / "sub" / "c.txt")
    assert len(user_files.expand([str(tmp_path / "a.txt"), str(tmp_path / "*.txt")])) == 2
    with pytest.raises(InputFileError, match=r"^TRAIN_FILES: '.*\*\.csv' matches no file$"):
        user_files.expand(str(tmp_path / "*.csv"), "TRAIN_FILES")
    with pytest.raises(InputFileError, match=r"^TEST_FILES: no such file '.*nope.jsonl'$"):
        user_files.expand(str(tmp_path / "nope.jsonl"), "TEST_FILES")


def test_jsonl_each_kind_of_bad_line_is_counted_with_its_line(tmp_path):
    lines = _pairs(10)
    lines[1] = json.dumps({"en": "no target"}).encode()            # missing field
    lines[3] = b'{"en": "cut off'                                  # not JSON
    lines[4] = b""                                                 # blank
    lines[6] = '{"en": "caf\xe9", "fr": "x"}'.encode("latin-1")    # not UTF-8
    lines[8] = json.dumps({"en": "", "fr": "vide"}).encode()       # empty field
    path = str(tmp_path / "train.jsonl.gz")
    with gzip.open(path, "wb") as f:
        f.write(b"\n".join(lines) + b"\n")
    source = user_files.RecordFiles([path], required=("en", "fr"))
    assert len(source) == 5 and source.lines == 10
    assert source.bad.counts == collections.Counter(missing_field=1, undecodable=2, empty=2)
    assert source.bad.first_any() == f"{path}:2: no field 'fr'"
    assert source.bad.first["undecodable"].startswith(f"{path}:4: not valid JSON")
    assert source.bad.first["empty"] == f"{path}:5: blank line"
    assert [source.where(i) for i in range(5)] == [f"{path}:{n}" for n in (1, 3, 6, 8, 10)]


def test_tsv_csv_squad_and_conll(tmp_path):
    tsv = tmp_path / "a.tsv"
    tsv.write_text("text\tlabel\nfine day\tpos\ntoo\tmany\tcolumns\n\nbad day\tneg\n")
    source = user_files.RecordFiles([str(tsv)], required=("text", "label"))
    assert source.records == [{"text": "fine day", "label": "pos"},
                              {"text": "bad day", "label": "neg"}]
    assert source.bad.counts == {"undecodable": 1, "empty": 1}
    assert source.bad.first_any() == f"{tsv}:3: 3 columns, the header has 2"

    path = tmp_path / "a.csv"
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([["text", "label"], ["two\nlines, quoted", "pos"],
                                 ["x", "neg", "extra"], ["y", "neg"]])
    source = user_files.RecordFiles([str(path)], required=("text", "label"))
    assert [r["text"] for r in source.records] == ["two\nlines, quoted", "y"]
    assert source.where(1) == f"{path}:5" and source.bad.first_any() == f"{path}:4: " \
        "3 columns, the header has 2"

    squad = tmp_path / "dev.json"
    qas = [{"id": "q1", "question": "Where is Paris?",
            "answers": [{"text": "France", "answer_start": 12}]},
           {"id": "q2", "answers": []}]
    squad.write_text(json.dumps({"data": [{"paragraphs": [{"context": "Paris is in France.",
                                                           "qas": qas}]}]}))
    source = user_files.RecordFiles([str(squad)], required=("question", "context"))
    assert source.format == "squad" and len(source) == 1
    assert source[0]["answers"] == {"text": ["France"], "answer_start": [12]}
    assert source.bad.first_any() == f"{squad}: data[0].paragraphs[0].qas[1]: no field 'question'"

    conll = tmp_path / "ner.conll"
    conll.write_text("-DOCSTART- -X- O\n\nJohn NNP B-PER\nlives VBZ O\n\nParis\n\n"
                     "in IN O\nRome NNP B-LOC\n")
    source = user_files.RecordFiles([str(conll)])
    assert source.records == [{"tokens": ["John", "lives"], "tags": ["B-PER", "O"]},
                              {"tokens": ["in", "Rome"], "tags": ["O", "B-LOC"]}]
    assert source.bad.first_any() == f"{conll}:6: a token without a tag"


# ----------------------------------------------------------------------------- from_files


def test_from_files_text_to_text(tmp_path, spm):
    lines = _pairs(20)
    lines[2] = b"not json"
    train = _write(tmp_path / "train.jsonl", lines)
    test = _write(tmp_path / "test.jsonl", _pairs(3))
    task = from_files(train, test_files=test, input_field="en", target_field="fr",
                      task_prefix="translate:", vocabulary=spm)
    assert task.kind == "text_to_text" and task.splits == ("train", "test")
    assert task.metric_names == ("bleu", "chrf") and task.input_prefix == "translate: "
    assert task.bad_lines["train"].counts == {"undecodable": 1}
    [example] = task.examples("test", 1)
    assert example["inputs_pretokenized"] == "translate: word 0 here"
    assert example["targets_pretokenized"] == "mot 0 ici"
    assert example["targets"][-1] == 1                    # EOS
    with pytest.raises(InputFileError, match=r"no line has field\(s\) 'en', 'de'; the first "
                                             r"line has 'en', 'fr'"):
        from_files(train, input_field="en", target_field="de")
    with pytest.raises(ConfigError, match="METRICS: unknown metric 'blue'"):
        from_files(train, input_field="en", target_field="fr", metrics="blue")
    with pytest.raises(ConfigError, match="INPUT_FIELD and TARGET_FIELD"):
        from_files(train)


def test_from_files_classification_labels_and_regression(tmp_path):
    rows = [("good film", 1), ("bad film", 0), ("fine", 1.0), ("awful", "0"), ("ok", 2)]
    train = _write(tmp_path / "train.jsonl",
                   [json.dumps({"t": t, "y": y}).encode() for t, y in rows])
    task = from_files(train, text_field="t", label_field="y")
    assert task.kind == "classification" and task.label_names == ("0", "1", "2")
    assert task.metric_names == ("accuracy", "f1_macro")
    assert [task.encoder_pair_fn(task.get_source("train")[i])[2] for i in range(5)] == \
        [1, 0, 1, 0, 2]
    assert task.label_counts == {"1": 2, "0": 2, "2": 1}
    with pytest.raises(InputFileError, match=r"label '2' is not among the model's labels"):
        from_files(train, text_field="t", label_field="y", labels=("0", "1"))
    scores = _write(tmp_path / "sts.jsonl", [json.dumps({"t": "a", "y": v}).encode()
                                             for v in (0.5, 3.8, 2)])
    task = from_files(scores, text_field="t", label_field="y")
    assert task.kind == "regression" and task.metric_names == ("pearson", "spearman")
    assert task.encoder_pair_fn(task.get_source("train")[1]) == ("a", None, 3.8)


def test_conll_files_score_entities_with_seqeval(tmp_path):
    """A CoNLL files task's METRICS "accuracy,f1" are token accuracy and seqeval's entity
    scores (conlleval's reading), here on a case where strict IOB2 disagrees."""
    import seqeval.metrics
    from seqeval.scheme import IOB2

    conll = tmp_path / "train.conll"
    conll.write_text("John B-PER\nSmith I-PER\nin O\nRome B-LOC\n")
    task = from_files(str(conll))
    assert task.kind == "tagging" and task.metric_names == ("accuracy", "f1")
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["O", "B-ORG", "I-ORG"]]
    # a PER opened by I- (no entity to strict IOB2), a wrong ORG end
    predicted = [["I-PER", "I-PER", "O", "B-LOC"], ["O", "B-ORG", "O"]]
    scores = {}
    for fn in task.metric_fns:
        scores.update(fn(gold, predicted))
    # by hand: PER and LOC right of 3 found / 3 gold -> P = R = F1 = 2/3
    assert scores["precision"] == pytest.approx(200 / 3)
    assert scores["recall"] == scores["f1"] == pytest.approx(200 / 3)
    assert scores["f1"] == pytest.approx(100 * seqeval.metrics.f1_score(gold, predicted))
    strict = 100 * seqeval.metrics.f1_score(gold, predicted, mode="strict", scheme=IOB2)
    assert strict == pytest.approx(40.0) and scores["f1"] != pytest.approx(strict)
    assert scores["accuracy"] == pytest.approx(100 * 5 / 7)


# ----------------------------------------------------------------------------- vocabularies


@pytest.fixture(scope="module")
def spm(tmp_path_factory):
    """A small SentencePiece trained on the words of `_pairs` (in a temporary cache)."""
    tmp = tmp_path_factory.mktemp("spm")
    docs = [f"word {i} here mot {i} ici translate" for i in range(200)]
    path = _write(tmp / "corpus.txt", [d.encode() for d in docs])
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("T2T_CACHE_DIR", str(tmp / "cache"))
        return vocab_training.sentencepiece_for([path], lambda: docs, extra_ids=0)


def test_vocabulary_cached_by_content_and_byte_fallback(tmp_path, monkeypatch):
    monkeypatch.setenv("T2T_CACHE_DIR", str(tmp_path / "cache"))
    path = _write(tmp_path / "a.txt", [b"the cat sat on the mat"] * 50)
    calls = []

    def texts():
        calls.append(1)
        return ["the cat sat on the mat"] * 50

    first = vocab_training.sentencepiece_for([path], texts)    # too small for 8000: fewer
    again = vocab_training.sentencepiece_for([path], texts)
    assert len(calls) == 2 and first.model_file == again.model_file   # 1 retry, no retrain
    assert first.vocab_size < 8000 + 100
    _write(tmp_path / "a.txt", [b"the dog sat on the log"] * 50)
    assert vocab_training.sentencepiece_for([path], texts).model_file != first.model_file
    cov = vocab_training.coverage(first, ["the cat", "été à sa mat"])
    assert cov.kind == "byte pieces" and cov.high and cov.missing == ["é", "à"]
    assert cov.fallback == 6          # é, é and à: two UTF-8 bytes, two byte pieces each
    assert vocab_training.coverage(first, ["the cat sat"]).rate == 0


# ----------------------------------------------------------------------------- the report


def test_data_report_counts_budget_and_warnings(tmp_path, caplog, spm):
    lines = _pairs(40)
    lines[5] = b"{bad"
    lines[7] = json.dumps({"en": "long " * 30, "fr": "x"}).encode()
    train = _write(tmp_path / "train.jsonl", lines)
    task = from_files(train, input_field="en", target_field="fr",
                      vocabulary=spm)
    converter = EncDecConverter({"inputs": 32, "targets": 32})
    with caplog.at_level("INFO", logger="t2t.data.data_report"):
        reports = data_report.announce(task, converter, 8, 10, model_dir=str(tmp_path / "m"))
    r = reports["train"]
    assert (r.lines, r.examples, r.truncated) == (40, 39, 1)
    sizes = [converter.prepare(ex)[0] for ex in task.examples("train")]
    assert r.tokens == {k: sum(len(s[k]) for s in sizes) for k in ("inputs", "targets")}
    per_row = data_report.examples_per_row(converter, r, task, 8)
    assert per_row > 1                                     # short pairs share rows
    text = caplog.text
    assert f"10 steps x batch 8 = 80 rows ≈ {80 * per_row:,.0f} examples = " \
           f"{80 * per_row / 39:.2f} epochs of train" in text
    assert f"warning: 1 of the 40 lines of train (2.5%) are bad and skipped; the first: " \
           f"{train}:6: not valid JSON" in text
    assert "warning: 1 train examples (2.6%) are longer than the feature lengths" in text
    saved = json.load(open(tmp_path / "m" / "data.json"))["train"]
    assert {k: saved[k] for k in ("undecodable", "missing_field", "empty", "truncated")} == \
        {"undecodable": 1, "missing_field": 0, "empty": 0, "truncated": 1}
    assert np.isclose(per_row, data_report.examples_per_row(converter, r, task, 8))


def test_tag_features_first_pieces_and_words_back(tmp_path):
    from t2t.data import tagging
    from t2t.data.vocab import WordPieceVocabulary
    vocab = WordPieceVocabulary.train(["john lives in rome", "mary visits paris"] * 20,
                                      tmp_path / "vocab.txt", 100)
    records = [{"tokens": ["John", "lives", "in", "Rome"], "tags": ["B-PER", "O", "O", "B-LOC"]},
               {"tokens": ["Mary", "visits", "Paris", "today"],
                "tags": ["B-PER", "O", "B-LOC", "O"]}]
    names = ("O", "B-LOC", "B-PER")
    tags = tagging.tag_features(records, vocab, names, max_length=7)
    f = tags.features
    pieces = [vocab.encode(w, add_special_tokens=False) for w in records[0]["tokens"]]
    assert f["encoder_input_tokens"][0, :sum(map(len, pieces)) + 2].tolist() == \
        [vocab.cls_id, *sum(pieces, []), vocab.sep_id]
    assert [f["tag_labels"][0, p] for p in tags.first[0]] == [2, 0, 0, 1]
    assert (f["tag_labels"][0] >= 0).sum() == 4                 # first pieces only
    assert tags.truncated == (sum(len(vocab.encode(w, add_special_tokens=False))
                                  for w in records[1]["tokens"]) > 5)
    predicted = f["tag_labels"].clip(0)                          # a perfect tagger
    back = tagging.word_tags(predicted, tags, names)
    assert back[0] == records[0]["tags"]
    assert len(back[1]) == 4 and back[1][:len(tags.first[1])] == \
        records[1]["tags"][:len(tags.first[1])]
