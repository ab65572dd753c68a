"""Low-resource downstream tasks: few labelled examples, large validation sets (issue 22).

At CPU scale pretraining shows where labelled data is scarce: with BBC topic's 1,742
training articles a randomly initialised T5 reaches 88%, as well as any pretrained one.
Each task here trains on a fixed, class-balanced sample of an offline dataset's training
split and scores on a validation set large enough that one example is a small step:

* **train**: ``n_train`` records of the dataset's train split, the same number per class
  (classification), chosen by a seeded hash of their position, so the sample is fixed
  whatever the run's seed (the cells of a table differ only by what they pretrained);
* **validation**: the dataset's validation records *and* the training records not sampled
  (labelled, never trained on), in the same hash order, the first ``n_validation``;
* **test**: the dataset's own test split.

``register_low_resource_tasks(vocabulary, prefix)`` registers, with that vocabulary (the
pretrained model's: `micro` registers them with `micro_sentencepiece` as ``micro_*``):

* ``<prefix>bbc_topic_200``: BBC topic, 40 articles per class, 1,000 validation articles;
* ``<prefix>spam_100``: SpamAssassin, 50 ham + 50 spam, 1,000 validation e-mails (F1 of spam);
* ``<prefix>bbc_topic_50`` and ``<prefix>spam_50``: the low end, 10 articles per class and
  25 ham + 25 spam, a subset of the larger samples, scored on the *same* validation sets (so
  a score at 50 labels and one at 200 or 100 differ only by the labels);
* ``<prefix>gettext_en_de_2k``: 2,000 English -> German software messages, 500 validation
  messages (BLEU).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from t2t.data.catalog import offline
from t2t.data.finetune_tasks import (FinetuneTask, f1_with_invalid, macro_f1,
                                     tokenize_text_to_text, translate_format,
                                     translate_prefix)
from t2t.data.sources import ListSource
from t2t.data.tasks import register_task
from t2t.evaluation import metrics

SALT = "t2t-low-resource"


def hash_order(n: int, salt: str = SALT) -> list[int]:
    """0..n-1 in the order of a seeded hash of each position (fixed, not the run's seed)."""
    return sorted(range(n), key=lambda i: hashlib.sha256(f"{salt}\x00{i}".encode()).digest())


def balanced_sample(labels: Sequence[Any] | None, n: int, n_records: int,
                    salt: str = SALT) -> list[int]:
    """Positions of `n` records in hash order, `n / classes` of each label (all records'
    labels in `labels`; None: any records), sorted."""
    order = hash_order(n_records, salt)
    if labels is None:
        if n > n_records:
            raise ValueError(f"asked for {n} training records of {n_records}")
        return sorted(order[:n])
    classes = sorted(set(labels))
    if n % len(classes):
        raise ValueError(f"{n} training records do not split evenly over {len(classes)} "
                         f"classes {classes}")
    per_class = n // len(classes)
    picked = []
    for label in classes:
        of_label = [i for i in order if labels[i] == label][:per_class]
        if len(of_label) < per_class:
            raise ValueError(f"class {label!r} has {len(of_label)} training records, "
                             f"fewer than {per_class}")
        picked += of_label
    return sorted(picked)


@dataclasses.dataclass(frozen=True)
class LowResourceSplits:
    """A dataset's splits re-cut: a small balanced train sample, a large validation set."""

    dataset: str                          # `t2t data build` name
    n_train: int
    n_validation: int
    label_of: Callable[[Mapping], Any] | None = None   # None: not a classification task
    validation_as: int | None = None  # cut validation as for a sample of this size (≥ n_train)

    def __post_init__(self):
        if self.validation_as is not None and self.validation_as < self.n_train:
            raise ValueError(f"validation_as={self.validation_as} is smaller than the "
                             f"{self.n_train}-record training sample; give a larger sample")

    def records(self, split: str) -> list[dict]:
        if split not in ("train", "validation", "test"):
            raise ValueError(f"split must be train, validation or test, not {split!r}")
        return _records(self, split)

    def source(self, split: str) -> ListSource:
        return ListSource(self.records(split))


def _read_all(dataset: str, split: str) -> list[dict]:
    source = offline.built_source(dataset, split)  # one-line BuildError when not built
    return [source[i] for i in range(len(source))]


@functools.cache
def _records(spec: LowResourceSplits, split: str) -> list[dict]:
    if split == "test":
        return _read_all(spec.dataset, "test")
    train = _read_all(spec.dataset, "train")
    labels = None if spec.label_of is None else [spec.label_of(r) for r in train]
    if split == "train":
        return [train[i] for i in balanced_sample(labels, spec.n_train, len(train))]
    # a larger sample holds this one (the same hash order, the first of each class), so its
    # validation set is disjoint from this sample too
    chosen = set(balanced_sample(labels, spec.validation_as or spec.n_train, len(train)))
    pool = _read_all(spec.dataset, "validation") + [
        r for i, r in enumerate(train) if i not in chosen]
    return [pool[i] for i in hash_order(len(pool), SALT + "/validation")[:spec.n_validation]]


BBC_200 = LowResourceSplits("bbc", 200, 1000, lambda r: r["category"])
SPAM_100 = LowResourceSplits("spam", 100, 1000, lambda r: r["label"])
BBC_50 = dataclasses.replace(BBC_200, n_train=50, validation_as=200)
SPAM_50 = dataclasses.replace(SPAM_100, n_train=50, validation_as=100)
GETTEXT_DE_2K = LowResourceSplits("gettext_de", 2000, 500)


def low_resource_tasks(vocabulary: Any, prefix: str = "",
                       sources: Callable[[LowResourceSplits], Callable[[str], Any]] | None = None
                       ) -> list[FinetuneTask]:
    """The low-resource tasks (unregistered), tokenizing with `vocabulary`; `sources(spec)`
    gives a task's split sources where not `spec.source` (the built dataset): a bundle
    of the records (`t2t.data.bundle`) stands in for it on a machine that has not built it."""
    tok, p = tokenize_text_to_text, functools.partial
    source = sources or (lambda spec: spec.source)
    en_de = translate_prefix("en", "de")
    bbc = [FinetuneTask(f"{prefix}bbc_topic_{spec.n_train}", source(spec),
                        [offline.bbc_topic_format, tok], vocabulary,
                        (metrics.accuracy, p(macro_f1, num_classes=len(offline.BBC_CATEGORIES))),
                        label_names=offline.BBC_CATEGORIES, encoder_pair_fn=offline.bbc_pair,
                        description=f"BBC News topic from {spec.n_train} labelled articles "
                                    f"({spec.n_train // len(offline.BBC_CATEGORIES)} per "
                                    f"class); {spec.n_validation:,} validation articles",
                        input_prefix="topic: ") for spec in (BBC_200, BBC_50)]
    spam = [FinetuneTask(f"{prefix}spam_{spec.n_train}", source(spec),
                         [offline.spam_format, tok],
                         vocabulary, (f1_with_invalid, metrics.accuracy),
                         label_names=offline.SPAM_LABELS, encoder_pair_fn=offline.spam_pair,
                         description=f"SpamAssassin from {spec.n_train} labelled e-mails "
                                     f"({spec.n_train // 2} ham, {spec.n_train // 2} spam); "
                                     f"{spec.n_validation:,} validation e-mails, F1 of spam")
            for spec in (SPAM_100, SPAM_50)]
    return [
        *bbc, *spam,
        FinetuneTask(f"{prefix}gettext_en_de_2k", source(GETTEXT_DE_2K),
                     [p(translate_format, source="en", target="de"), tok], vocabulary,
                     (metrics.bleu,), description="software messages English -> German from "
                     "2,000 pairs; 500 validation messages, BLEU", input_prefix=en_de),
    ]


def register_low_resource_tasks(vocabulary: Any, prefix: str = "",
                                overwrite: bool = False) -> list[str]:
    """Registers `low_resource_tasks(vocabulary, prefix)`; returns their names."""
    tasks = low_resource_tasks(vocabulary, prefix)
    for task in tasks:
        register_task(task, overwrite=overwrite)
    return [t.name for t in tasks]
