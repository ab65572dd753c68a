"""The offline suite: Bible tasks on the real bundled data (fixed hashed splits, a balanced
paraphrase set), built datasets from tiny fixtures in the builders' format, the error for an
unbuilt one, and the BERT encoder features."""
import collections

import numpy as np
import pytest

from t2t.data import bundled
from t2t.data.catalog import builders, offline
from t2t.data.finetune_tasks import spread
from t2t.data.converters import EncDecConverter
from t2t.data.tasks import get_task, registered_tasks
from t2t.data.catalog.bible import bible_sentencepiece
from t2t.train.evaluator import compute_metrics
from tests.data.helpers import write_offline_datasets

SIZES = {  # as documented in t2t.data.catalog.offline
    "bible_translate_en_es": (27850, 1678, 1549),
    "bible_paraphrase_kjv_web": (55730, 3360, 3100),
    "bible_style_kjv_to_web": (27865, 1680, 1550),
}






@pytest.fixture
def tasks(spm):
    return {t.name: t for t in offline.offline_tasks(spm)}


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    """A ``$T2T_DATA_DIR`` holding tiny bbc, spam and gettext_de in the builders' format."""
    write_offline_datasets(tmp_path)
    monkeypatch.setenv("T2T_DATA_DIR", str(tmp_path))
    return tmp_path


def test_registered_at_import_without_building_anything():
    for name in ("bible_translate_en_es", "bible_paraphrase_kjv_web", "bible_style_kjv_to_web",
                 "bbc_topic", "bbc_headline", "spam", "gettext_en_de"):
        assert name in registered_tasks()
    assert get_task("spam")._vocabulary is bible_sentencepiece  # lazy: not trained yet


def test_bible_splits_are_fixed_disjoint_and_complete(tasks):
    for name, sizes in SIZES.items():
        assert tuple(len(tasks[name].get_source(s)) for s in builders.SPLITS) == sizes, name
    ids = {s: {r["id"] for r in offline.bible_pairs("web", "rv1909", s)}
           for s in builders.SPLITS}
    assert not (ids["train"] & ids["validation"] or ids["train"] & ids["test"]
                or ids["validation"] & ids["test"])
    assert sum(map(len, ids.values())) == len(bundled.aligned("web", "rv1909"))
    for verse_id in ("Gen.1.1", "John.3.16", "Rev.22.21"):
        split = builders.split_of(verse_id, *offline.BIBLE_SPLIT)
        assert verse_id in ids[split]


def test_paraphrase_pairs_are_balanced_and_split_local():
    source = offline.paraphrase_pairs("validation")
    records = [source[i] for i in range(len(source))]
    assert collections.Counter(r["label"] for r in records) == {1: 1680, 0: 1680}
    split_ids = {r["id"] for r in records}
    kjv_web = {k["id"]: w["text"] for k, w in bundled.aligned("kjv", "web")}
    for positive, negative in zip(records[::2], records[1::2]):
        assert (positive["label"], negative["label"]) == (1, 0)
        assert positive["id"] == positive["pair_id"] == negative["id"]
        assert positive["sentence1"] == negative["sentence1"]
        assert positive["sentence2"] == kjv_web[positive["id"]]
        assert negative["sentence2"] == kjv_web[negative["pair_id"]] != positive["sentence2"]
        assert negative["pair_id"] in split_ids  # no text crosses splits
    same_book = sum(n["id"].split(".")[0] == n["pair_id"].split(".")[0] for n in records[1::2])
    assert same_book / 1680 > 0.9  # a nearby verse, not a random one


@pytest.mark.parametrize("name,prefix", [
    ("bible_translate_en_es", "translate English to Spanish: "),
    ("bible_paraphrase_kjv_web", "paraphrase sentence1: "),
    ("bible_style_kjv_to_web", "modernize: ")])
def test_bible_tasks_end_to_end(name, prefix, tasks, spm):
    task = tasks[name]
    examples = task.examples("test", max_examples=24)
    assert len(examples) == 24
    for ex in examples:
        assert ex["inputs_pretokenized"].startswith(prefix)
        assert spm.decode(ex["inputs"]) == ex["inputs_pretokenized"]
    batch = EncDecConverter({"inputs": 64, "targets": 32}, pack=False)(examples[:4])
    assert batch["encoder_input_tokens"].shape == (4, 64)
    scores = compute_metrics(task, examples, [ex["targets_pretokenized"] for ex in examples])
    assert scores and all(v == pytest.approx(100.0) for v in scores.values()), scores
    pipeline = task.get_pipeline(EncDecConverter({"inputs": 64, "targets": 32}), batch_size=2,
                                 seed=0, split="validation", num_epochs=1, process_index=0,
                                 process_count=1)
    assert next(pipeline)["decoder_target_tokens"].shape == (2, 32)


def test_built_datasets(tasks, data_dir, spm):
    topic = tasks["bbc_topic"].examples("validation")
    assert [ex["targets_pretokenized"] for ex in topic] == ["tech", "politics",
                                                             "entertainment", "sports"]
    assert topic[0]["inputs_pretokenized"] == "topic: New phone A phone was launched. It is fast."
    assert [ex["label"] for ex in topic] == [4, 2, 1, 3]
    headline = tasks["bbc_headline"].examples("test")
    assert (headline[0]["inputs_pretokenized"], headline[0]["targets_pretokenized"]) == \
        ("headline: A bank failed.", "Bank fails")
    german = tasks["gettext_en_de"].examples("validation")
    assert german[1]["inputs_pretokenized"] == ("translate English to German: "
                                                "Could not open the input file")
    assert spm.decode(german[1]["targets"]) == "Eingabedatei konnte nicht geöffnet werden"
    for name in ("bbc_topic", "bbc_headline", "spam", "gettext_en_de"):
        examples = tasks[name].examples("validation")
        scores = compute_metrics(tasks[name], examples,
                                 [ex["targets_pretokenized"] for ex in examples])
        assert all(v == pytest.approx(100.0) for v in scores.values()), (name, scores)
    spam = tasks["spam"].examples("validation")
    assert spam[3]["inputs_pretokenized"] == "spam subject: Cheap pills text: Buy now."
    # Always "spam": 1 of 4 right; precision 1/4, recall 1 -> F1 = 2 * 0.25 / 1.25 = 40.
    assert compute_metrics(tasks["spam"], spam, ["spam"] * 4) == \
        pytest.approx({"f1": 40.0, "accuracy": 25.0})


def test_unbuilt_dataset_says_how_to_build_it(tasks, tmp_path, monkeypatch):
    monkeypatch.setenv("T2T_DATA_DIR", str(tmp_path))
    for name, dataset in (("bbc_topic", "bbc"), ("spam", "spam"),
                          ("gettext_en_de", "gettext_de")):
        with pytest.raises(builders.BuildError) as error:
            tasks[name].examples("validation")
        assert str(error.value) == (f"dataset '{dataset}' is not built: "
                                    f"run `t2t data build {dataset}`")


def test_classification_examples(tasks, data_dir, wordpiece):
    pairs = offline.classification_examples("bible_paraphrase_kjv_web", "test",  # registered
                                            wordpiece, 24, max_examples=6)
    assert set(pairs) == {"encoder_input_tokens", "encoder_segment_ids", "token_type_ids",
                          "label"}
    assert pairs["encoder_input_tokens"].shape == (6, 24)
    test = get_task("bible_paraphrase_kjv_web").get_source("test")   # alternates 1, 0
    picked = spread(len(test), 6)                                   # evenly spread records
    np.testing.assert_array_equal(pairs["label"], [1 - i % 2 for i in picked])
    assert (pairs["encoder_segment_ids"].sum(1) == 24).all()  # verse pairs fill 24 tokens
    types = pairs["token_type_ids"]
    assert ((types[:, 1:] - types[:, :-1]) >= 0).all() and types[:, -1].all()  # A... then B...
    bbc = offline.classification_examples(tasks["bbc_topic"], "validation", wordpiece, 32)
    np.testing.assert_array_equal(bbc["label"], [4, 2, 1, 3])
    assert not bbc["token_type_ids"].any()
    row = bbc["encoder_input_tokens"][1]
    assert wordpiece.decode(row) == "vote held people voted."
    spam = offline.classification_examples(tasks["spam"], "validation", wordpiece, 8)
    np.testing.assert_array_equal(spam["label"], [0, 0, 0, 1])
    with pytest.raises(ValueError, match="no sentence-pair form"):
        offline.classification_examples(tasks["bbc_headline"], "test", wordpiece, 8)
