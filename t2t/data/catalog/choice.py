"""SWAG-style multiple-choice tasks (a context, N endings, the right one's index), read by
`t2t.data.multiple_choice` for BERT's multiple-choice head (Devlin et al. 2019, sec. 4.4).

    bible_next_verse  bundled WEB: a verse -> the verse after it, or one of 3 other verses
                      of its book; 4 choices; 32,549 / 1,710 / 1,810 records
    hellaswag         TFDS ``hellaswag`` (SWAG's successor, same form; not downloadable
                      here); 4 choices; TFDS splits

bible_next_verse keeps each verse in the split `split_of` gives its id (90/5/5, seeded
hash), and draws the distractors from the same book and split with a seed per verse, so a
record never changes; the right ending's position is drawn the same way.
"""
from __future__ import annotations

import functools
import zlib

import numpy as np

from t2t.data import bundled
from t2t.data.catalog.downstream import tfds_source
from t2t.data.finetune_tasks import FinetuneTask
from t2t.data.sources import ListSource, split_of
from t2t.data.tasks import register_task
from t2t.evaluation import metrics

NEXT_VERSE_SPLIT = ("bible_next_verse", (0.9, 0.05, 0.05))
NUM_CHOICES = 4


@functools.cache
def _next_verse_records() -> dict[str, tuple[dict, ...]]:
    verses = bundled.load("web")
    books: dict[str, tuple[int, int]] = {}             # book -> [first, last] verse index
    for i, v in enumerate(verses):
        books[v["book"]] = (books.get(v["book"], (i, i))[0], i)
    parts: dict[str, list[dict]] = {"train": [], "validation": [], "test": []}
    for i, v in enumerate(verses[:-1]):
        after = verses[i + 1]
        if after["book"] != v["book"] or after["chapter"] != v["chapter"]:
            continue                                   # the last verse of a chapter
        split = split_of(v["id"], *NEXT_VERSE_SPLIT)
        rng = np.random.default_rng(zlib.crc32(v["id"].encode()))
        first, last = books[v["book"]]
        wrong: list[str] = []
        for j in rng.permutation(np.arange(first, last + 1)):     # other verses of the book
            text = verses[j]["text"]
            if abs(int(j) - i) > 1 and text != after["text"] and text not in wrong:
                wrong.append(text)
            if len(wrong) == NUM_CHOICES - 1:
                break
        if len(wrong) < NUM_CHOICES - 1:
            continue
        label = int(rng.integers(0, NUM_CHOICES))
        endings = wrong[:label] + [after["text"]] + wrong[label:]
        parts[split].append({"id": v["id"], "context": v["text"], "endings": endings,
                             "label": label})
    return {s: tuple(r) for s, r in parts.items()}


def next_verse_source(split: str) -> ListSource:
    """bible_next_verse's records of one split: ``{"id", "context", "endings", "label"}``."""
    return ListSource(list(_next_verse_records()[split]))


def choice_accuracy(targets, predictions) -> dict[str, float]:
    """Share of records whose chosen ending is the right one, in percent."""
    return metrics.accuracy(targets, predictions)


def choice_tasks(data_dir: str | None = None) -> list[FinetuneTask]:
    return [
        FinetuneTask("bible_next_verse", next_verse_source, [], None, (choice_accuracy,),
                     description="which of 4 verses of the book follows this verse? "
                                 "(bundled WEB)"),
        FinetuneTask("hellaswag", functools.partial(tfds_source, "hellaswag",
                                                    data_dir=data_dir),
                     [], None, (choice_accuracy,),
                     description="HellaSwag (TFDS): the ending of a video/how-to context"),
    ]


for _task in choice_tasks():
    register_task(_task)
