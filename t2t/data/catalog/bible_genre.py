"""An in-domain low-resource task for the `micro` scale: the genre of a World English Bible
verse, from 180 labelled verses.

BBC topic and spam are news and e-mail, far from most of the micro corpus; this one is inside
it (the three bundled Bibles are about a tenth of its tokens), so it asks whether what a
short pretraining learns of a domain helps there. Six genres by book (`GENRE_BOOKS`; the
deuterocanon placed with its kind, Revelation with prophecy), verses of at least 8 words:

* **validation**: 1,000 verses of the WEB chapters the micro corpus holds out of pretraining
  (`corpora.split_name`, the corpus's own split of ``bible/web/<chapter>``), in
  `low_resource.hash_order`; the same chapter in KJV or Reina-Valera may be pretrained on,
  which can only favour pretraining;
* **train**: 30 verses a genre from the other chapters (`low_resource.balanced_sample`: fixed,
  not the run's seed).

Registered by `micro` as ``micro_bible_genre_180`` (accuracy, macro F1).
"""
from __future__ import annotations

import functools
from typing import Any

from t2t.data.catalog import corpora, low_resource
from t2t.data.finetune_tasks import FinetuneTask, macro_f1, tokenize_text_to_text
from t2t.data.sources import BundledSource, ListSource
from t2t.evaluation import metrics

GENRE_BOOKS = {
    "law": "Gen Exod Lev Num Deut",
    "history": "Josh Judg Ruth 1Sam 2Sam 1Kgs 2Kgs 1Chr 2Chr Ezra Neh Esth Tob Jdt EsthGr "
               "1Macc 2Macc 1Esd 3Macc 4Macc",
    "wisdom": "Job Ps Prov Eccl Song Wis Sir PrMan AddPs",
    "prophecy": "Isa Jer Lam Ezek Dan Hos Joel Amos Obad Jonah Mic Nah Hab Zeph Hag Zech Mal "
                "Bar 2Esd Rev",
    "gospel": "Matt Mark Luke John Acts",
    "letter": "Rom 1Cor 2Cor Gal Eph Phil Col 1Thess 2Thess 1Tim 2Tim Titus Phlm Heb Jas 1Pet "
              "2Pet 1John 2John 3John Jude",
}
GENRES = tuple(GENRE_BOOKS)
GENRE_OF = {book: genre for genre, books in GENRE_BOOKS.items() for book in books.split()}
N_TRAIN, N_VALIDATION, MIN_WORDS = 180, 1000, 8


def held_out(verse_id: str) -> bool:
    """Whether the micro corpus keeps this WEB verse's chapter ("Gen.1.1" -> Gen.1) out of
    pretraining."""
    chapter = verse_id.rsplit(".", 1)[0]
    return corpora.split_name("bible", f"web/{chapter}") == "validation"


@functools.cache
def _pools() -> dict[str, list[dict]]:
    """Every WEB verse of `MIN_WORDS` or more as ``{"id", "text", "genre"}``, by whether its
    chapter was pretrained on ("train") or held out ("validation")."""
    pools: dict[str, list[dict]] = {"train": [], "validation": []}
    for v in BundledSource("web", "verse"):
        if len(v["text"].split()) >= MIN_WORDS:
            pools["validation" if held_out(v["id"]) else "train"].append(
                {"id": v["id"], "text": v["text"], "genre": GENRE_OF[v["id"].split(".")[0]]})
    return pools


@functools.cache
def records(split: str) -> tuple[dict, ...]:
    """``{"id", "text", "genre"}`` verses of `split` (train or validation)."""
    if split not in ("train", "validation"):
        raise ValueError(f"split must be train or validation, not {split!r}")
    pool = _pools()[split]
    if split == "validation":
        return tuple(pool[i] for i in low_resource.hash_order(len(pool))[:N_VALIDATION])
    picked = low_resource.balanced_sample([v["genre"] for v in pool], N_TRAIN, len(pool))
    return tuple(pool[i] for i in picked)


def genre_format(record: dict) -> dict:
    label = GENRES.index(record["genre"])
    return {"inputs": f"genre: {record['text']}", "targets": GENRES[label], "label": label}


def bible_genre_task(vocabulary: Any, prefix: str = "") -> FinetuneTask:
    """The task (unregistered), tokenizing with `vocabulary`."""
    return FinetuneTask(
        f"{prefix}bible_genre_{N_TRAIN}", lambda split: ListSource(list(records(split))),
        [genre_format, tokenize_text_to_text], vocabulary,
        (metrics.accuracy, functools.partial(macro_f1, num_classes=len(GENRES))),
        label_names=GENRES, encoder_pair_fn=lambda r: (r["text"], None,
                                                       GENRES.index(r["genre"])),
        description=f"genre of a WEB verse ({', '.join(GENRES)}) from {N_TRAIN} labelled "
                    f"verses; {N_VALIDATION:,} validation verses of chapters held out of "
                    "the micro corpus", input_prefix="genre: ")
