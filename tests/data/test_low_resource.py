"""Low-resource downstream tasks: a fixed, class-balanced training sample, a validation set
of everything else labelled, and one-line errors (tiny datasets in the builders' format)."""
import collections
import json

import pytest

from t2t.data.catalog import builders, low_resource
from t2t.data.catalog.builders import BuildError
from t2t.data.tasks import registered_tasks

CLASSES = ("business", "sports", "tech")


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    """`bbc` with 3 classes: 40 training articles each (a few more for 'tech'), 15
    validation and 6 test articles."""
    splits = {"train": [c for c in CLASSES for _ in range(40)] + ["tech"] * 5,
              "validation": list(CLASSES) * 5, "test": list(CLASSES) * 2}
    out = tmp_path / "bbc"
    out.mkdir()
    counts = {s: builders.write_jsonl(
        [{"id": f"{s}/{i}", "category": c, "headline": f"h{i}", "text": f"{s} text {i}"}
         for i, c in enumerate(cats)], out / f"{s}.jsonl") for s, cats in splits.items()}
    (out / builders.MANIFEST).write_text(json.dumps({"name": "bbc", "counts": counts}))
    monkeypatch.setenv("T2T_DATA_DIR", str(tmp_path))
    low_resource._records.cache_clear()
    yield tmp_path
    low_resource._records.cache_clear()


def spec(n_train=30, n_validation=60, validation_as=None):
    return low_resource.LowResourceSplits("bbc", n_train, n_validation, lambda r: r["category"],
                                          validation_as)


def test_the_training_sample_is_balanced_fixed_and_the_validation_set_disjoint(data_dir):
    train = spec().records("train")
    assert collections.Counter(r["category"] for r in train) == {c: 10 for c in CLASSES}
    assert all(r["id"].startswith("train/") for r in train)
    low_resource._records.cache_clear()
    assert spec().records("train") == train                  # not the run's seed: fixed
    validation = spec().records("validation")
    assert len(validation) == 60
    assert not {r["id"] for r in train} & {r["id"] for r in validation}
    # drawn from the dataset's validation split and the unsampled training records
    origins = collections.Counter(r["id"].split("/")[0] for r in validation)
    assert set(origins) == {"train", "validation"}
    everything = spec(30, 10_000).records("validation")
    assert len(everything) == 15 + (125 - 30)                 # capped only by what exists
    assert [r["id"] for r in spec().records("test")] == [f"test/{i}" for i in range(6)]


def test_a_smaller_sample_is_a_subset_scored_on_the_larger_ones_validation_set(data_dir):
    small, large = spec(n_train=15, validation_as=30), spec(n_train=30)
    small_train = small.records("train")
    assert collections.Counter(r["category"] for r in small_train) == {c: 5 for c in CLASSES}
    assert {r["id"] for r in small_train} < {r["id"] for r in large.records("train")}
    assert small.records("validation") == large.records("validation")
    # without validation_as the 15 records the larger sample adds would be scored too
    alone = {r["id"] for r in spec(n_train=15, n_validation=10_000).records("validation")}
    added = {r["id"] for r in large.records("train")} - {r["id"] for r in small_train}
    assert added <= alone and not added & {r["id"] for r in small.records("validation")}
    with pytest.raises(ValueError, match="validation_as=10 is smaller than the 15-record"):
        spec(n_train=15, validation_as=10)


def test_hash_order_is_a_fixed_permutation():
    order = low_resource.hash_order(50)
    assert sorted(order) == list(range(50)) and order != list(range(50))
    assert order == low_resource.hash_order(50)
    assert low_resource.hash_order(50, "other") != order


def test_impossible_samples_and_unbuilt_datasets_are_one_line_errors(data_dir, tmp_path,
                                                                      monkeypatch):
    with pytest.raises(ValueError, match="do not split evenly over 3 classes"):
        spec(n_train=31).records("train")
    with pytest.raises(ValueError, match="class 'business' has 40 training records, fewer "
                                         "than 45"):
        spec(n_train=135).records("train")
    with pytest.raises(ValueError, match="split must be"):
        spec().records("dev")
    monkeypatch.setenv("T2T_DATA_DIR", str(tmp_path / "empty"))
    with pytest.raises(BuildError, match="run `t2t data build spam`"):
        low_resource.SPAM_100.records("train")


def test_the_micro_scale_registers_them_without_building_anything():
    for name in ("micro_bbc_topic_200", "micro_spam_100", "micro_gettext_en_de_2k",
                 "micro_bbc_topic_50", "micro_spam_50"):
        assert name in registered_tasks()
    sizes = {(s.dataset, s.n_train): (s.n_validation, s.validation_as) for s in
             (low_resource.BBC_200, low_resource.SPAM_100, low_resource.GETTEXT_DE_2K,
              low_resource.BBC_50, low_resource.SPAM_50)}
    assert sizes == {("bbc", 200): (1000, None), ("spam", 100): (1000, None),
                     ("gettext_de", 2000): (500, None), ("bbc", 50): (1000, 200),
                     ("spam", 50): (1000, 100)}
