"""Paper-scale tasks, tokenized with the T5 SentencePiece (`t5_vocabulary`, from a local
path that gin binds as ``t5_vocabulary.path``; T5's is
``gs://t5-data/vocabs/cc_all.32000/sentencepiece.model``: copy it, as nothing here
downloads). Registered at import, nothing read until used:

* ``c4_<objective>`` (the suffixes of ``bible_web_*``): the T5 objectives over TFDS
  ``c4/en``, and ``c4_<objective>_validation`` over its validation split;
* ``wikipedia_mlm_nsp``, ``wikipedia_mlm``, ``wikipedia_ltr`` (and ``_validation``: a
  seeded-hash 0.1% of articles held out): BERT's objectives over TFDS English Wikipedia,
  articles as documents and their sentences as sentences, with BERT's uncased WordPiece
  (`bert_vocabulary`, a local vocab.txt: ``bert_vocabulary.path``). BookCorpus, BERT's
  other half, is not in TFDS;
* the standard benchmark tasks of `t2t.data.catalog.downstream` (GLUE, SuperGLUE, SQuAD, WMT,
  CNN/DailyMail) by their names, ``glue_cola`` ...
"""
from __future__ import annotations

import functools
import re
from typing import Any, Callable, Dict, List

from t2t.data.catalog import builders
from t2t.data.catalog.downstream import register_benchmark_tasks
from t2t.data.sources import TfdsSource
from t2t.errors import ConfigError
from t2t.data.tasks import (BertPretraining, Task, bert_ltr, register_task, t5_objective_tasks,
                            tokenize)

C4 = "c4/en:3.1.0"   # TFDS's C4 en (T5's own tasks read 3.0.1, no longer in TFDS)


def t5_vocabulary(path: str | None = None, extra_ids: int = 100) -> Any:
    """The T5 SentencePiece (32k pieces + 100 sentinels) from a local `path`."""
    from t2t.data.vocab import SentencePieceVocabulary
    _require(path, "t5_vocabulary", "the T5 SentencePiece, e.g. a copy of "
             "gs://t5-data/vocabs/cc_all.32000/sentencepiece.model")
    return SentencePieceVocabulary(path, extra_ids=extra_ids)


def _require(path: str | None, name: str, what: str) -> None:
    if not path:
        raise ConfigError(f"the paper-scale tasks need {what}: bind {name}.path = "
                          f"'/local/path' (nothing here downloads)")


# The vocabularies the registered tasks call when first used. The run layer replaces them
# with versions whose `path` gin binds (t2t/run/configurables.py).
VOCABULARY_PROVIDERS: Dict[str, Callable[[], Any]] = {}


def provided_vocabulary(name: str) -> Any:
    """The vocabulary `name` ('t5' | 'bert') from `VOCABULARY_PROVIDERS`."""
    return VOCABULARY_PROVIDERS[name]()


T5_VOCABULARY = functools.partial(provided_vocabulary, "t5")
BERT_VOCABULARY = functools.partial(provided_vocabulary, "bert")


def as_text(record: Any) -> dict:
    """A C4 record (``text`` as bytes from ArrayRecord) -> ``{"text": str}``."""
    text = record["text"] if isinstance(record, dict) else record
    return {"text": text.decode("utf-8") if isinstance(text, bytes) else str(text)}


def c4_tasks(split: str = "train", vocabulary: Any = T5_VOCABULARY,
             data_dir: str | None = None) -> List[Task]:
    """``c4_span_corruption``, ``c4_lm``, ``c4_prefix_lm`` and ``c4_<variant>`` for the
    T5 objective tables, over one C4 split (unregistered)."""
    source = functools.partial(TfdsSource, C4, split, data_dir)
    suffix = "" if split == "train" else "_validation"
    tasks = t5_objective_tasks("c4", source, [as_text, tokenize], vocabulary, "C4")
    for task in tasks:
        task.name += suffix
    return tasks


def register_c4_tasks(vocabulary: Any = T5_VOCABULARY, data_dir: str | None = None,
                      overwrite: bool = False) -> List[str]:
    """Registers the C4 pretraining tasks (train and validation); returns their names."""
    tasks = c4_tasks("train", vocabulary, data_dir) + c4_tasks("validation", vocabulary, data_dir)
    for task in tasks:
        register_task(task, overwrite=overwrite)
    return [t.name for t in tasks]


WIKIPEDIA = "wikipedia/20230601.en"
WIKIPEDIA_HELDOUT = 0.001


def bert_vocabulary(path: str | None = None, lowercase: bool = True) -> Any:
    """BERT's WordPiece (bert-base-uncased: 30,522 entries) from a local vocab.txt."""
    from t2t.data.vocab import WordPieceVocabulary
    _require(path, "bert_vocabulary", "BERT's uncased WordPiece vocab.txt")
    return WordPieceVocabulary(path, lowercase=lowercase)


VOCABULARY_PROVIDERS.update(t5=t5_vocabulary, bert=bert_vocabulary)


def sentences(text: str) -> List[str]:
    """Paragraphs (lines) split after . ! ? and a space; blank lines dropped."""
    return [s for line in text.splitlines()
            for s in re.split(r"(?<=[.!?])\s+", line.strip()) if s]


class WikipediaDocuments:
    """TFDS Wikipedia articles of one split (train, or a seeded-hash held-out share as
    validation) as BERT documents: ``{"id": title, "index": i, "verses": sentences}``."""

    def __init__(self, split: str = "train", data_dir: str | None = None,
                 fraction: float | None = None):
        fraction = WIKIPEDIA_HELDOUT if fraction is None else fraction
        self.source = TfdsSource(WIKIPEDIA, "train", data_dir)
        held = [builders.split_of(str(i), "wikipedia_pretraining", (1 - fraction, fraction))
                == "validation" for i in range(len(self.source))]
        self._keep = [i for i, h in enumerate(held) if h == (split == "validation")]

    def __len__(self) -> int:
        return len(self._keep)

    def __getitem__(self, index: int) -> dict:
        record = self.source[self._keep[index]]
        title, text = (as_text({"text": record[k]})["text"] for k in ("title", "text"))
        return {"id": title, "index": int(index), "verses": sentences(text)}


def wikipedia_tasks(split: str = "train", vocabulary: Any = BERT_VOCABULARY,
                    data_dir: str | None = None) -> List[Task]:
    """BERT Table 5/6 pretraining tasks over one Wikipedia split (unregistered)."""
    documents = functools.partial(WikipediaDocuments, split, data_dir)
    suffix = "" if split == "train" else "_validation"
    tasks = [
        Task("wikipedia_mlm_nsp", documents, [BertPretraining(documents, lazy=True)],
             vocabulary, description="BERT MLM (whole word) + NSP over Wikipedia articles"),
        Task("wikipedia_mlm", documents, [BertPretraining(documents, lazy=True)], vocabulary,
             description="BERT MLM only (the 'No NSP' row) over Wikipedia articles"),
        Task("wikipedia_ltr", documents, [bert_ltr], vocabulary,
             description="BERT left-to-right LM (the 'LTR & No NSP' row) over Wikipedia"),
    ]
    for task in tasks:
        task.name += suffix
    return tasks


register_c4_tasks()
for _task in wikipedia_tasks("train") + wikipedia_tasks("validation"):
    register_task(_task)
register_benchmark_tasks(T5_VOCABULARY)
