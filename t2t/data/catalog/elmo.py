"""ELMo's data on the bundled Bibles: the biLM pretraining tasks and a downstream task.

- `bible_web_elmo` (`_validation`): WEB verses of the training (held-out) chapters of
  `tasks.BibleSplit`, one sentence per example, as `characters.text_example`s for the
  `characters.ElmoConverter` (feature lengths {"tokens": L, "characters": C});
- `bible_words(size)`: the softmax's word vocabulary, the `size` - 4 most frequent words
  of the training verses (cased);
- `kjv_or_web(split, n)`: a two-class downstream task from the offline suite's verse
  split (`offline.BIBLE_SPLIT`): is a verse from the King James Version (label 1) or the
  World English Bible (label 0)? Each verse id gives one example, its translation picked
  by a seeded hash of the id, so both labels occur and no verse's two texts are split apart.
"""
from __future__ import annotations

import functools
import hashlib
from typing import Any, Dict, List, Mapping, Sequence, Tuple

from t2t.data import characters
from t2t.data.catalog import offline
from t2t.data.sources import ListSource
from t2t.data.tasks import Task, register_task
from t2t.data.catalog.bible import BibleSplit
from t2t.data.vocab import round_up

DEFAULT_WORDS = 8192


class BibleWords(characters.WordVocabulary):
    """A `WordVocabulary` with the sizes the run layer reads (`padded_vocab_size`)."""

    @property
    def vocab_size(self) -> int:
        return len(self)

    @property
    def padded_vocab_size(self) -> int:
        return round_up(len(self))


def _verses(split: str) -> ListSource:
    """The WEB verses of one `BibleSplit` (chapter level), {"id", "text"}."""
    return ListSource([{"id": f"{c['id']}.{i + 1}", "text": v}
                       for c in BibleSplit("chapter", split) for i, v in enumerate(c["verses"])
                       if v])


@functools.cache
def bible_words(size: int = DEFAULT_WORDS) -> BibleWords:
    """The `size` - 4 most frequent words of the training verses, after the specials."""
    words = BibleWords.from_texts((r["text"] for r in _verses("train")), size)
    return BibleWords(words.words)


def verse_example(record: Mapping[str, Any], vocabulary: characters.WordVocabulary,
                  sequence_length: Mapping[str, int]) -> Dict[str, Any]:
    """One verse -> the biLM's example (`characters.text_example`)."""
    return characters.text_example(
        characters.tokenize(record["text"]), vocabulary, sequence_length["tokens"],
        sequence_length.get("characters", characters.MAX_CHARS))


def elmo_tasks(size: int = DEFAULT_WORDS) -> List[Task]:
    """`bible_web_elmo` and `bible_web_elmo_validation` (unregistered)."""
    vocab = functools.partial(bible_words, size)
    return [Task("bible_web_elmo" + suffix, functools.partial(_verses, split),
                 [verse_example], vocab,
                 description=f"ELMo biLM: forward and backward word LMs over WEB verses "
                             f"({split} chapters)")
            for split, suffix in (("train", ""), ("validation", "_validation"))]


def _pick(verse_id: str) -> int:
    return hashlib.sha256(f"kjv_or_web:{verse_id}".encode()).digest()[0] % 2


def kjv_or_web(split: str, limit: int | None = None) -> Tuple[List[str], List[int]]:
    """(verse texts, labels: 1 KJV, 0 WEB) of the offline suite's `split` (train /
    validation / test), the first `limit` of them."""
    pairs = offline.bible_pairs("kjv", "web", split)
    texts, labels = [], []
    for i in range(len(pairs) if limit is None else min(limit, len(pairs))):
        record = pairs[i]
        label = _pick(record["id"])
        texts.append(record["kjv"] if label else record["web"])
        labels.append(label)
    return texts, labels


def register_elmo_tasks(size: int = DEFAULT_WORDS, overwrite: bool = False) -> List[str]:
    tasks = elmo_tasks(size)
    for task in tasks:
        register_task(task, overwrite=overwrite)
    return [t.name for t in tasks]


def features(texts: Sequence[str], vocabulary: characters.WordVocabulary,
             max_length: int, max_chars: int = characters.MAX_CHARS) -> Dict[str, Any]:
    """Raw texts -> the biLM's batch (`characters.sentence_features`)."""
    return characters.sentence_features([characters.tokenize(t) for t in texts], vocabulary,
                                        max_length, max_chars)


register_elmo_tasks()
