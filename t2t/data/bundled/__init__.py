"""Small public-domain corpora shipped with t2t: verse-aligned Bible translations.

`web` (World English Bible), `kjv` (King James Version) and `rv1909` (Spanish Reina-Valera
1909), one record per verse: {"id": "Gen.1.1", "book", "chapter", "verse", "text"}; and
the two default vocabularies trained on them (`t2t.data.catalog.bible`), so every machine
tokenizes the bundled data alike without training. See README.md here for provenance and
`build_bible.py` for how they were made.
"""
from __future__ import annotations

import functools
import gzip
import json
from pathlib import Path

_DIR = Path(__file__).resolve().parent


def names() -> list[str]:
    """Names of the bundled corpora, e.g. ["kjv", "rv1909", "web"]."""
    return sorted(p.name[: -len(".jsonl.gz")] for p in _DIR.glob("*.jsonl.gz"))


def path(name: str) -> Path:
    """Path of a bundled corpus file (`NAME.jsonl.gz`)."""
    p = _DIR / f"{name}.jsonl.gz"
    if not p.is_file():
        raise KeyError(f"no bundled corpus {name!r}; have {names()}")
    return p


def vocabulary_path(name: str) -> Path | None:
    """Path of a bundled vocabulary file, or None if t2t ships none of that name."""
    p = _DIR / name
    return p if p.is_file() else None


@functools.lru_cache(maxsize=None)
def _load(name: str) -> tuple[dict, ...]:
    with gzip.open(path(name), "rt", encoding="utf-8") as f:
        return tuple(json.loads(line) for line in f)


def load(name: str) -> list[dict]:
    """All verse records of a corpus, in canonical order.

    Parsed once and cached; the dicts are shared between calls, so copy one to change it.
    """
    return list(_load(name))


def aligned(a: str, b: str) -> list[tuple[dict, dict]]:
    """Verse pairs (record in `a`, record in `b`) sharing an id, in `a`'s order.

    Verses missing or empty in either translation are skipped.
    """
    other = {r["id"]: r for r in _load(b) if r["text"]}
    return [(r, other[r["id"]]) for r in _load(a) if r["text"] and r["id"] in other]
