"""SWAG-style multiple-choice features ([CLS] context [SEP] ending [SEP] per ending), the
bible_next_verse and hellaswag (TFDS mock data) tasks, and the NER catalogue: the
hironsan_ner builder's IOB2 parsing and TFDS conll2003 on mock data."""
import json
import logging

import numpy as np
import pytest

from t2t.data import bundled, multiple_choice
from t2t.data.catalog import builders, choice, ner
from t2t.errors import UserError

logging.getLogger("absl").setLevel(logging.ERROR)


def test_choice_features_pair_the_context_with_each_ending(wordpiece):
    records = [{"context": "God saw the light", "endings": ["and it was good", "no",
                                                            "the earth was formless"],
                "label": 2},
               {"context": b"In the beginning", "endings": [b"God created", b"x", b"y"],
                "label": 0}]
    f = multiple_choice.choice_features(records, wordpiece, max_length=12)
    assert f["encoder_input_tokens"].shape == (2, 3, 12) and f["label"].tolist() == [2, 0]
    a = wordpiece.encode("God saw the light", add_special_tokens=False)
    for k, ending in enumerate(records[0]["endings"]):
        b = wordpiece.encode(ending, add_special_tokens=False)
        la, lb = multiple_choice.truncate_pair(len(a), len(b), 9)
        ids = [wordpiece.cls_id] + a[:la] + [wordpiece.sep_id] + b[:lb] + [wordpiece.sep_id]
        row = f["encoder_input_tokens"][0, k]
        assert row[:len(ids)].tolist() == ids and (row[len(ids):] == wordpiece.pad_id).all()
        assert f["encoder_segment_ids"][0, k].sum() == len(ids)
        assert f["token_type_ids"][0, k].tolist() == [0] * (la + 2) + [1] * (lb + 1) + [0] * (
            12 - len(ids))
    with pytest.raises(UserError, match="every record needs the same number"):
        multiple_choice.choice_features(records + [{"context": "a", "endings": ["b"],
                                                    "label": 0}], wordpiece, 12)


def test_bible_next_verse_records():
    verses = {v["id"]: (i, v) for i, v in enumerate(bundled.load("web"))}
    ids = {}
    for split in ("train", "validation", "test"):
        source = choice.next_verse_source(split)
        ids[split] = {r["id"] for r in (source[i] for i in range(len(source)))}
        for r in (source[i] for i in range(0, len(source), max(1, len(source) // 50))):
            i, v = verses[r["id"]]
            nxt = bundled.load("web")[i + 1]
            assert r["context"] == v["text"] and len(r["endings"]) == 4
            assert r["endings"][r["label"]] == nxt["text"]
            assert r["endings"].count(nxt["text"]) == 1
    assert not (ids["train"] & ids["validation"]) and not (ids["train"] & ids["test"])
    assert len(ids["validation"]) > 1000
    labels = [r["label"] for r in choice.next_verse_source("validation")]
    assert np.bincount(labels, minlength=4).min() > 0.2 * len(labels)   # positions spread


def test_hellaswag_on_mock_data(wordpiece):
    """TFDS hellaswag's records (bytes, as ArrayRecord gives them) through the task's split
    and the features; the split asked of TFDS is the task's."""
    import tensorflow_datasets as tfds
    seen = []

    def records(builder, split, *args, **kwargs):
        seen.append((builder.name, split))
        return [{"context": b"A man is sitting on a roof. He", "activity_label": b"Roof",
                 "endings": [b"is using wrap to wrap a pair of skis.", b"starts pulling up",
                             b"is ripping level tiles off.", b"holds a rubik's cube."],
                 "label": 3, "source_id": b"activitynet~v_-JhWjGDPHMY",
                 "split_type": b"indomain"}] * 5

    task = [t for t in choice.choice_tasks() if t.name == "hellaswag"][0]
    with tfds.testing.mock_data(as_data_source_fn=records):
        source = task.get_source("validation")
        f = multiple_choice.choice_features([source[i] for i in range(len(source))],
                                            wordpiece, max_length=16)
    assert seen == [("hellaswag", "validation")]
    assert f["encoder_input_tokens"].shape == (5, 4, 16) and f["label"].tolist() == [3] * 5
    assert (f["encoder_input_tokens"][..., 0] == wordpiece.cls_id).all()


def test_iob_parsing_of_the_hironsan_corpus_format():
    raw = ("2005\tZDIGIT\t名詞\tB-DAT\n年\tOTHER\t名詞\tI-DAT\n、\tOTHER\t記号\tO\n\n"
           "ノルウェー\tKATAK\t名詞\tB-LOC\n\n\n")
    assert builders.parse_iob_sentences(raw) == [
        {"tokens": ["2005", "年", "、"], "tags": ["B-DAT", "I-DAT", "O"]},
        {"tokens": ["ノルウェー"], "tags": ["B-LOC"]}]


def test_hironsan_task_reads_a_built_dataset_and_scores_entities(tmp_path, monkeypatch):
    monkeypatch.setenv("T2T_DATA_DIR", str(tmp_path))
    out = tmp_path / "hironsan_ner"
    out.mkdir()
    records = [{"id": "a", "tokens": ["南", "アフリカ", "で"], "tags": ["B-LOC", "I-LOC", "O"]}]
    for split in ("train", "validation", "test"):
        builders.write_jsonl(records, out / f"{split}.jsonl")
    (out / builders.MANIFEST).write_text(json.dumps({"name": "hironsan_ner"}))
    task = [t for t in ner.ner_tasks() if t.name == "hironsan_ner"][0]
    assert task.get_source("validation")[0]["tags"] == ["B-LOC", "I-LOC", "O"]
    assert set(task.label_names) >= {"B-LOC", "I-LOC", "O"}
    from t2t.train.evaluator import apply_metrics
    scores = apply_metrics(task, [["B-LOC", "I-LOC", "O"]], [["I-LOC", "I-LOC", "O"]])
    assert scores["accuracy"] == pytest.approx(200 / 3)
    assert scores["f1"] == 100.0 and scores["f1_strict"] == 0.0   # lone I- in strict IOB2


def test_conll2003_on_mock_data():
    """TFDS conll2003's records (token bytes, `ner` class ids) as IOB2 tag names; the
    task's validation split is TFDS's "dev"."""
    import tensorflow_datasets as tfds
    seen = []

    def records(builder, split, *args, **kwargs):
        seen.append((builder.name, split))
        return [{"tokens": [b"EU", b"rejects", b"German", b"call"], "pos": [22, 42, 16, 21],
                 "chunks": [11, 21, 11, 12], "ner": [3, 0, 7, 0]}]

    task = [t for t in ner.ner_tasks() if t.name == "conll2003_ner"][0]
    with tfds.testing.mock_data(as_data_source_fn=records):
        record = task.get_source("validation")[0]
    assert seen == [("conll2003", "dev")]
    assert record == {"tokens": ["EU", "rejects", "German", "call"],
                      "tags": ["B-ORG", "O", "B-MISC", "O"]}
    from tensorflow_datasets.core.dataset_builders.conll import conll_dataset_builder_utils
    assert ner.CONLL2003_TAGS == conll_dataset_builder_utils.NER_TAGS
