"""The `micro` pretraining corpus: every public text t2t can build offline, in one place.

`t2t data build micro_corpus` builds (if missing) each source of `MICRO_SOURCES`
(`t2t.data.catalog.corpora`, plus ``sotu``) and writes ``micro_corpus/{train,validation}.jsonl``
records ``{"id": "SOURCE/ID", "source", "text"}`` with the three bundled Bibles' chapters
(WEB, KJV, Reina-Valera 1909) first. A document's split is `corpora.MICRO_SPLIT`'s seeded
hash of its id (95% / 5%): deterministic, by document, disjoint. The manifest counts
documents and words per source and split.

Registered at import, read only when used (an unbuilt corpus is a one-line error naming
``t2t data build micro_corpus``):

* ``micro_span_corruption``, ``micro_lm``, ``micro_prefix_lm`` and ``micro_<variant>`` (the T5
  objective-table variants, `tasks.OBJECTIVE_VARIANTS`) with `micro_sentencepiece`, a
  unigram SentencePiece trained once on the training split and cached;
* ``micro_mlm_nsp``, ``micro_mlm`` (BERT MLM, whole word; documents = records, sentences
  split at ". ") and ``micro_ltr``, with `micro_wordpiece`;
* each one's ``<name>_validation`` twin over the held-out documents;
* the low-resource downstream tasks ``micro_bbc_topic_200``, ``micro_spam_100``, their
  50-label subsets ``micro_bbc_topic_50`` and ``micro_spam_50``, and
  ``micro_gettext_en_de_2k`` (`low_resource`) with `micro_sentencepiece`;
* ``micro_bible_genre_180``, the in-domain one (`bible_genre`): a WEB verse's genre, scored
  on verses of chapters this corpus holds out.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Iterator

from t2t.data import vocab_training
from t2t.data.catalog import bible_genre, builders, corpora, low_resource
from t2t.data.catalog.builders import Builder, BuildError
from t2t.data.catalog.paper import sentences
from t2t.data.sources import BundledSource, JsonlSource
from t2t.data.tasks import (BertPretraining, Task, bert_ltr, register_task,
                            t5_objective_tasks, tokenize)

NAME = "micro_corpus"
BIBLES = ("web", "kjv", "rv1909")
MICRO_SOURCES = ("sotu", *(b.name for b in corpora.CORPUS_BUILDERS))
corpora.MICRO_LICENSES.update(bible="public domain", sotu="public domain")


def bible_documents() -> Iterator[dict]:
    """The bundled Bibles' chapters: ``{"id": "web/Gen.1", "text"}`` (verses joined)."""
    for name in BIBLES:
        for chapter in BundledSource(name, "chapter"):
            yield {"id": f"{name}/{chapter['id']}", "text": chapter["text"]}


def built_documents(name: str, root: Path) -> Iterator[dict]:
    """Every record of a built dataset (all its split files, in split order)."""
    for split in builders.SPLITS:
        path = builders.dataset_dir(name, root) / f"{split}.jsonl"
        if path.is_file():
            with open(path, encoding="utf-8") as f:
                for line in f:
                    yield json.loads(line)


def _build_micro_corpus(out: Path, work: Path, progress: bool) -> dict:
    root = out.parent
    for name in MICRO_SOURCES:
        if not builders.is_built(name, root):
            try:
                builders.build(name, root, progress=progress)
            except BuildError as e:
                raise BuildError(f"source {name!r} failed ({e}); fix it and run "
                                 f"`t2t data build {name}`") from e
    files = {s: open(out / f"{s}.jsonl", "w", encoding="utf-8") for s in ("train", "validation")}
    counts = {s: 0 for s in files}
    per_source: dict[str, dict] = {}
    try:
        streams = [("bible", bible_documents())] + [
            (name, built_documents(name, root)) for name in MICRO_SOURCES]
        for source, docs in streams:
            stats = per_source.setdefault(source, {"documents": dict.fromkeys(files, 0),
                                                   "words": dict.fromkeys(files, 0)})
            for doc in builders.progress_bar(docs, progress, f"{NAME} {source}"):
                if not doc["text"].strip():
                    continue
                split = corpora.split_name(source, doc["id"])
                record = {"id": corpora.micro_key(source, doc["id"]), "source": source,
                          "text": doc["text"]}
                files[split].write(json.dumps(record, ensure_ascii=False) + "\n")
                counts[split] += 1
                stats["documents"][split] += 1
                stats["words"][split] += corpora.word_count(doc["text"])
    finally:
        for f in files.values():
            f.close()
    versions = {name: builders.manifest(name, root).get("source") for name in MICRO_SOURCES}
    return {"counts": counts, "sources": per_source, "source": {"bundled": list(BIBLES),
                                                                **versions},
            "license": {s: corpora.MICRO_LICENSES[s] for s in per_source}}


builders.BUILDERS[NAME] = Builder(
    NAME, "the micro pretraining corpus: Bibles + every text builder above, 95/5 by document",
    (), _build_micro_corpus)


# ----------------------------------------------------------------------------- source


def micro_source(split: str = "train") -> JsonlSource:
    """``micro_corpus/SPLIT.jsonl``; BuildError naming `t2t data build micro_corpus` if absent."""
    if split not in ("train", "validation"):
        raise ValueError(f"split must be train or validation, not {split!r}")
    builders.manifest(NAME)  # dataset 'micro_corpus' is not built: run `t2t data build ...`
    return JsonlSource(builders.dataset_dir(NAME) / f"{split}.jsonl")


class MicroDocuments:
    """A split of the corpus as BERT documents: ``{"id", "index", "verses": sentences}``."""

    def __init__(self, split: str = "train"):
        self.source = micro_source(split)

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> dict:
        record = self.source[index]
        return {"id": record["id"], "index": int(index), "verses": sentences(record["text"])}


# ----------------------------------------------------------------------------- vocabularies


def _train_texts() -> Iterator[str]:
    source = micro_source("train")
    for i in range(len(source)):
        yield source[i]["text"]


def _train_file() -> list[str]:
    micro_source("train")  # BuildError if not built
    return [str(builders.dataset_dir(NAME) / "train.jsonl")]


@functools.cache
def micro_sentencepiece(vocab_size: int = 16000, extra_ids: int = 100) -> Any:
    """A unigram SentencePiece (T5 ids: pad 0, eos 1, unk 2, byte fallback) trained once on
    the training split (`vocab_training.sentencepiece_for`: a seeded sample of 1M of its
    paragraphs), cached by the split's content, so a rebuilt corpus trains a new one."""
    return vocab_training.sentencepiece_for(_train_file(), _train_texts, vocab_size, extra_ids)


@functools.cache
def micro_wordpiece(vocab_size: int = 16000) -> Any:
    """An uncased WordPiece trained once on the training split, cached by its content."""
    return vocab_training.wordpiece_for(_train_file(), _train_texts, vocab_size)


# ----------------------------------------------------------------------------- tasks


def micro_tasks(split: str = "train", sentencepiece: Any = micro_sentencepiece,
                wordpiece: Any = micro_wordpiece) -> list[Task]:
    """The ``micro_*`` pretraining tasks over one split (unregistered); the validation ones
    are named ``<name>_validation``."""
    source = functools.partial(micro_source, split)
    documents = functools.partial(MicroDocuments, split)
    suffix = "" if split == "train" else "_validation"
    where = "training" if split == "train" else "held-out"
    tasks = t5_objective_tasks("micro", source, [tokenize], sentencepiece,
                               "the micro corpus") + [
        Task("micro_mlm_nsp", documents, [BertPretraining(documents, lazy=True)], wordpiece,
             description="BERT MLM (whole word) + NSP over the micro corpus"),
        Task("micro_mlm", documents, [BertPretraining(documents, lazy=True)], wordpiece,
             description="BERT MLM only (train with EncoderConverter(nsp=False)) over the "
                         "micro corpus"),
        Task("micro_ltr", documents, [bert_ltr], wordpiece,
             description="BERT left-to-right LM over the micro corpus"),
    ]
    for task in tasks:
        task.name += suffix
        task.description += f" ({where} documents)"
    return tasks


def register_micro_tasks(sentencepiece: Any = micro_sentencepiece,
                         wordpiece: Any = micro_wordpiece, overwrite: bool = False
                         ) -> list[str]:
    """Registers ``micro_tasks`` for the train and validation splits; their names."""
    tasks = micro_tasks("train", sentencepiece, wordpiece)
    tasks += micro_tasks("validation", sentencepiece, wordpiece)
    for task in tasks:
        register_task(task, overwrite=overwrite)
    return [t.name for t in tasks]


register_micro_tasks()
low_resource.register_low_resource_tasks(micro_sentencepiece, prefix="micro_")
register_task(bible_genre.bible_genre_task(micro_sentencepiece, prefix="micro_"))
