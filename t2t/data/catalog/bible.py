"""The bundled Bible as pretraining data: the ``bible_web_*`` tasks (T5 objectives over WEB
chapters, BERT's MLM/NSP/LTR over its books) less a held-out 5% of the chapters, which
their ``bible_web_*_validation`` twins read, and the vocabularies trained on it
(`bible_sentencepiece`, `bible_wordpiece`): the default 8,000-piece ones ship in
`t2t.data.bundled` (the same on every machine, nothing to train), other sizes are trained
once and cached. Registered at import.
"""
from __future__ import annotations

import collections
import functools
import os
from pathlib import Path
from typing import Any

from t2t.data import bundled
from t2t.data.sources import BundledSource, split_of
from t2t.data.tasks import (BertPretraining, Task, bert_ltr, register_task,
                            t5_objective_tasks, tokenize)
from t2t.platforms import cache_dir


def _web_texts() -> list[str]:
    return [r["text"] for r in BundledSource("web")]


def _web_rv1909_texts() -> list[str]:
    return _web_texts() + [r["text"] for r in BundledSource("rv1909")]


def sentencepiece_name(vocab_size: int) -> str:
    return f"bible_web_rv1909_spm_{vocab_size}.model"


def wordpiece_name(vocab_size: int) -> str:
    return f"bible_web_wordpiece_{vocab_size}.txt"


def train_sentencepiece(directory: Path, vocab_size: int) -> Path:
    """Trains the Bible SentencePiece of ``vocab_size`` pieces into ``directory`` (atomically;
    its recorded model_prefix is the file's name, so the bytes do not depend on where or by
    which process it was trained): the file's path."""
    from sentencepiece import sentencepiece_model_pb2

    from t2t.data.vocab import SentencePieceVocabulary
    path = directory / sentencepiece_name(vocab_size)
    prefix = directory / f"{path.stem}.tmp{os.getpid()}"
    trained = SentencePieceVocabulary.train(_web_rv1909_texts(), prefix, vocab_size)
    model = sentencepiece_model_pb2.ModelProto.FromString(trained.model_proto)
    model.trainer_spec.model_prefix = path.stem
    tmp = prefix.with_name(prefix.name + ".model")
    tmp.write_bytes(model.SerializeToString())
    tmp.replace(path)
    prefix.with_name(prefix.name + ".vocab").unlink(missing_ok=True)
    return path


def train_wordpiece(directory: Path, vocab_size: int) -> Path:
    """Trains the Bible WordPiece vocabulary of ``vocab_size`` into ``directory``: its path."""
    from t2t.data.vocab import WordPieceVocabulary
    path = directory / wordpiece_name(vocab_size)
    WordPieceVocabulary.train(_web_texts(), path, vocab_size)
    return path


@functools.cache
def bible_sentencepiece(vocab_size: int = 8000, extra_ids: int = 100) -> Any:
    """A unigram SentencePiece (T5 ids: pad 0, eos 1, unk 2) of WEB and the Spanish RV1909
    verses: as T5's vocabulary covered its translation languages (C4 with German, French and
    Romanian), so Bible EN->ES targets are not byte soup. The bundled one, or trained once
    and cached for another ``vocab_size``."""
    from t2t.data.vocab import SentencePieceVocabulary

    path = (bundled.vocabulary_path(sentencepiece_name(vocab_size))
            or cache_dir() / sentencepiece_name(vocab_size))
    if not path.exists():
        train_sentencepiece(cache_dir(), vocab_size)
    return SentencePieceVocabulary(str(path), extra_ids=extra_ids)


@functools.cache
def bible_wordpiece(vocab_size: int = 8000) -> Any:
    """An uncased WordPiece vocabulary of WEB (``tokenizers``): the bundled one, or trained
    once and cached for another ``vocab_size``."""
    from t2t.data.vocab import WordPieceVocabulary

    path = (bundled.vocabulary_path(wordpiece_name(vocab_size))
            or cache_dir() / wordpiece_name(vocab_size))
    if not path.exists():
        train_wordpiece(cache_dir(), vocab_size)
    return WordPieceVocabulary(str(path), lowercase=True)


# ----------------------------------------------------------------------------- tasks

HELDOUT_FRACTION = 0.05  # share of WEB chapters held out for the *_validation tasks
HELDOUT_SEED = "bible_web_pretraining"


def is_heldout(chapter_id: str, fraction: float = HELDOUT_FRACTION,
               seed: str = HELDOUT_SEED) -> bool:
    """Whether chapter ``chapter_id`` ("Gen.1") is held out, by `builders.split_of`'s
    seeded hash of the id: deterministic, decided per chapter, whatever the others are."""
    return split_of(chapter_id, seed, (1 - fraction, fraction)) == "validation"


class BibleSplit:
    """A bundled Bible's chapters of one split, at chapter or book level.

    ``split="validation"`` keeps the held-out chapters (`is_heldout`), ``"train"`` the rest,
    so the two are disjoint and together cover the corpus. At book level a record is a
    maximal run of consecutive chapters of one book within the split (a BERT document:
    NSP's "next" sentences never jump over a chapter of the other split); its id is the
    book's ("Gen") when the run is the whole book, else "Exod.14-25" or "Exod.13". Records
    are ``{"id", "book", "text", "verses"}`` as `BundledSource` gives them.

    WEB with the defaults: 1388 chapters -> 1318 train / 70 validation (1988 of 37457
    verses, 5.3%; 5.5% of the characters); at book level the 80 books become 144 train
    and 68 validation records.
    """

    def __init__(self, level: str = "chapter", split: str = "train", name: str = "web",
                 fraction: float = HELDOUT_FRACTION, seed: str = HELDOUT_SEED):
        if level not in ("chapter", "book"):
            raise ValueError(f"level must be chapter or book, not {level!r}")
        if split not in ("train", "validation"):
            raise ValueError(f"split must be train or validation, not {split!r}")
        self.level, self.split, self.name = level, split, name
        chapters = list(BundledSource(name, "chapter"))
        held = [is_heldout(c["id"], fraction, seed) for c in chapters]
        keep = [i for i, h in enumerate(held) if h == (split == "validation")]
        if level == "chapter":
            self._records = [chapters[i] for i in keep]
            return
        books = [c["id"].rsplit(".", 1)[0] for c in chapters]   # "Gen.1" -> "Gen"
        book_size = collections.Counter(books)
        runs: list[list[int]] = []
        for i in keep:  # consecutive chapters of one book form a run
            if runs and runs[-1][-1] == i - 1 and books[i - 1] == books[i]:
                runs[-1].append(i)
            else:
                runs.append([i])
        self._records = []
        for run in runs:
            first, last = chapters[run[0]]["id"], chapters[run[-1]]["id"]
            key = (books[run[0]] if len(run) == book_size[books[run[0]]] else
                   first if len(run) == 1 else f"{first}-{last.rsplit('.', 1)[1]}")
            verses = [v for i in run for v in chapters[i]["verses"]]
            self._records.append({"id": key, "book": chapters[run[0]]["book"],
                                  "text": " ".join(verses), "verses": verses})

    def __len__(self) -> int:
        return len(self._records)

    def __getitem__(self, index: int) -> dict:
        return self._records[index]

    def __repr__(self) -> str:
        return f"BibleSplit({self.name!r}, {self.level!r}, {self.split!r}, len={len(self)})"


def bible_tasks(split: str = "train", sentencepiece: Any = bible_sentencepiece,
                wordpiece: Any = bible_wordpiece, fraction: float = HELDOUT_FRACTION
                ) -> list[Task]:
    """The ``bible_web_*`` pretraining tasks over one `BibleSplit` (unregistered); the
    validation ones are named ``<name>_validation``."""
    chapters = functools.partial(BibleSplit, "chapter", split, fraction=fraction)
    books = functools.partial(BibleSplit, "book", split, fraction=fraction)
    suffix = "" if split == "train" else "_validation"
    where = "training" if split == "train" else "held-out"
    tasks = t5_objective_tasks("bible_web", chapters, [tokenize], sentencepiece,
                               "WEB chapters") + [
        Task("bible_web_mlm_nsp", books, [BertPretraining(books)], wordpiece,
             description="BERT MLM (whole word) + NSP; documents = books, sentences = verses"),
        Task("bible_web_mlm", books, [BertPretraining(books)], wordpiece,
             description="BERT MLM only (the 'No NSP' row): the same A/B pairs, no NSP loss "
                         "(train with EncoderConverter(nsp=False))"),
        Task("bible_web_ltr", books, [bert_ltr], wordpiece,
             description="BERT left-to-right LM (the 'LTR & No NSP' row): the same books and "
                         "verses, every next token a target (EncoderConverter(nsp=False), "
                         "TransformerConfig.encoder_causal)"),
    ]
    for task in tasks:
        task.name += suffix
        task.description += f" ({where} chapters)"
    return tasks


def register_bible_tasks(sentencepiece: Any = bible_sentencepiece,
                         wordpiece: Any = bible_wordpiece, overwrite: bool = False,
                         heldout_fraction: float = HELDOUT_FRACTION) -> list[str]:
    """Registers the ``bible_web_*`` pretraining tasks (vocabularies passed in or lazy) over
    the training chapters and, when ``heldout_fraction`` > 0, each one's
    ``<name>_validation`` twin over the held-out chapters (see `BibleSplit`)."""
    tasks = bible_tasks("train", sentencepiece, wordpiece, heldout_fraction)
    if heldout_fraction > 0:
        tasks += bible_tasks("validation", sentencepiece, wordpiece, heldout_fraction)
    for task in tasks:
        register_task(task, overwrite=overwrite)
    return [t.name for t in tasks]


register_bible_tasks()
