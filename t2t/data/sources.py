"""Random-access data sources (grain's ``RandomAccessDataSource``: ``__len__``/``__getitem__``).

Sources never raise for a bad record: a line that is not UTF-8 (or not JSON) comes back as
an ``InvalidRecord`` that the pipeline counts and skips. ``ShardedSource`` gives each process
a contiguous, near-equal block of records, so no record is lost or read twice.
"""
from __future__ import annotations

import hashlib
import dataclasses
import gzip
import importlib
import importlib.util
import json
import mmap
import os
import zlib
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from t2t.errors import InputFileError


class RandomAccessSource(Protocol):
    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


@dataclasses.dataclass(frozen=True)
class InvalidRecord:
    """A record that could not be decoded; ``reason`` is the stats key ('undecodable')."""

    reason: str
    raw: bytes = b""


PathLike = str | os.PathLike
GZIP_MAGIC = b"\x1f\x8b"


def read_gzip(path: str) -> bytes:
    """A ``.gz`` file's decompressed bytes; a file that is not gzip, or whose gzip data is
    cut short or damaged, is an InputFileError naming it."""
    try:
        with gzip.open(path, "rb") as f:
            return f.read()
    except gzip.BadGzipFile:
        raise InputFileError(f"{path} is named .gz but is not gzip-compressed: rename it "
                             "without .gz, or compress it with gzip") from None
    except (EOFError, zlib.error) as e:
        raise InputFileError(f"{path}: the gzip data is cut short or damaged ({e}); copy or "
                             "compress the file again") from None


def check_not_gzip(path: str, head: bytes) -> None:
    """A file whose bytes (``head``: its first ones) are gzip's but whose name does not end
    in ``.gz`` would be read as binary lines: an InputFileError saying to rename it."""
    if bytes(head[:2]) == GZIP_MAGIC:
        raise InputFileError(f"{path} is gzip-compressed but not named .gz: rename it "
                             f"{os.path.basename(path)}.gz (t2t decompresses .gz files), or "
                             "gunzip it")


class _LineIndex:
    """Random access to the lines of plain or gzipped text files via newline offsets.

    Plain files are memory-mapped (opened lazily, so the index pickles to workers); ``.gz``
    files are decompressed into memory once.
    """

    def __init__(self, paths: PathLike | Sequence[PathLike]):
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        self.paths = [str(p) for p in paths]
        self._cache: dict[int, Any] = {}
        self._starts: list[np.ndarray] = []
        self._ends: list[np.ndarray] = []
        for i in range(len(self.paths)):
            data = self._data(i)
            newlines = (np.flatnonzero(np.frombuffer(data, np.uint8) == ord("\n")) if len(data)
                        else np.zeros(0, np.int64))
            starts = np.concatenate([[0], newlines + 1])
            ends = np.concatenate([newlines, [len(data)]])
            if len(data) == 0 or starts[-1] == len(data):  # no line after a final newline
                starts, ends = starts[:-1], ends[:-1]
            self._starts.append(starts.astype(np.int64))
            self._ends.append(ends.astype(np.int64))
        self._cumulative = np.cumsum([0] + [len(s) for s in self._starts])

    def _data(self, i: int):
        if i not in self._cache:
            path = self.paths[i]
            if path.endswith(".gz"):
                data: Any = read_gzip(path)
            else:
                with open(path, "rb") as f:
                    empty = os.path.getsize(path) == 0
                    data = b"" if empty else mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                check_not_gzip(path, data[:2])
            self._cache[i] = data
        return self._cache[i]

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_cache"] = {}
        return state

    def __len__(self) -> int:
        return int(self._cumulative[-1])

    def line(self, index: int) -> bytes:
        if not -len(self) <= index < len(self):
            raise IndexError(index)
        index %= len(self)
        f = int(np.searchsorted(self._cumulative, index, side="right") - 1)
        j = index - self._cumulative[f]
        raw = bytes(self._data(f)[self._starts[f][j]:self._ends[f][j]])
        return raw[:-1] if raw.endswith(b"\r") else raw


class TextLineSource:
    """One record per line of text files (plain or ``.gz``): a ``str``, or an InvalidRecord."""

    def __init__(self, paths: PathLike | Sequence[PathLike]):
        self._index = _LineIndex(paths)

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, index: int) -> str | InvalidRecord:
        raw = self._index.line(index)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return InvalidRecord("undecodable", raw)

    def __repr__(self) -> str:
        return f"TextLineSource({self._index.paths}, len={len(self)})"


class JsonlSource:
    """One JSON object per line (plain or ``.gz``); ``field`` selects one value of each."""

    def __init__(self, paths: PathLike | Sequence[PathLike], field: str | None = None):
        self._index = _LineIndex(paths)
        self.field = field

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, index: int) -> Any:
        raw = self._index.line(index)
        try:
            record = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return InvalidRecord("undecodable", raw)
        if self.field is None:
            return record
        if not isinstance(record, dict) or self.field not in record:
            return InvalidRecord("missing_field", raw)
        return record[self.field]

    def __repr__(self) -> str:
        return f"JsonlSource({self._index.paths}, field={self.field!r}, len={len(self)})"


class BundledSource:
    """A bundled Bible (``web``, ``kjv``, ``rv1909``) at verse, chapter or book level.

    Verses are the bundled dicts; chapters and books are ``{"id": "Gen.1" | "Gen", "book",
    "text", "verses": [str]}`` with the verse texts joined by spaces, in canonical order.
    """

    def __init__(self, name: str, level: str = "verse"):
        from t2t.data import bundled  # the corpus loader; imported lazily

        if level not in ("verse", "chapter", "book"):
            raise ValueError(f"level must be verse, chapter or book, not {level!r}")
        self.name, self.level = name, level
        verses = bundled.load(name)
        if level == "verse":
            self._records = verses
            return
        groups: dict[str, list[dict]] = {}
        for verse in verses:  # ids are OSIS "Book.chapter.verse"
            key = verse["id"].rsplit(".", 1)[0] if level == "chapter" else verse["id"].split(".")[0]
            groups.setdefault(key, []).append(verse)
        self._records = [{"id": key, "book": members[0]["book"],
                          "text": " ".join(v["text"] for v in members),
                          "verses": [v["text"] for v in members]}
                         for key, members in groups.items()]

    def __len__(self) -> int:
        return len(self._records)

    def __getitem__(self, index: int) -> dict:
        return self._records[index]

    def __repr__(self) -> str:
        return f"BundledSource({self.name!r}, level={self.level!r}, len={len(self)})"


# Builders that TFDS registers only when their legacy module is imported.
_TFDS_MODULES = {
    "c4": "tensorflow_datasets.text.c4",
    "glue": "tensorflow_datasets.text.glue",
    "super_glue": "tensorflow_datasets.text.super_glue",
    "wikipedia": "tensorflow_datasets.text.wikipedia",
    "squad": "tensorflow_datasets.question_answering.squad",
    "wmt14_translate": "tensorflow_datasets.translate.wmt14",
    "wmt16_translate": "tensorflow_datasets.translate.wmt16",
    "cnn_dailymail": "tensorflow_datasets.summarization.cnn_dailymail",
    "conll2003": "tensorflow_datasets.text.conll2003.conll2003",
    "hellaswag": "tensorflow_datasets.text.hellaswag",
}


def _has_tensorflow() -> bool:
    return importlib.util.find_spec("tensorflow") is not None


class TfdsSource:
    """A TFDS split as a random-access source.

    Uses ``tfds.data_source`` (ArrayRecord files, no TensorFlow). If the dataset was prepared
    in another format and TensorFlow is installed, falls back to ``tfds.load`` and holds the
    split in memory (fine for GLUE-sized sets; prepare large sets as ArrayRecord).
    Text features come back as ``bytes`` from ArrayRecord; ``field`` selects one feature.
    """

    def __init__(self, name: str, split: str, data_dir: PathLike | None = None,
                 field: str | None = None, download: bool = False):
        import tensorflow_datasets as tfds

        module = _TFDS_MODULES.get(name.split("/")[0].split(":")[0])
        if module:
            try:
                importlib.import_module(module)
            except ImportError:  # needs TensorFlow; tfds will raise a clear error below
                pass
        self.name, self.split, self.field = name, split, field
        data_dir = None if data_dir is None else str(data_dir)
        try:
            self._source: Any = tfds.data_source(name, split=split, data_dir=data_dir,
                                                 download=download)
            self.backend = "array_record"
        except Exception as error:  # not ArrayRecord (or not prepared): tfds.load needs TF
            if not _has_tensorflow():
                raise RuntimeError(
                    f"tfds.data_source({name!r}) failed ({error}); prepare the dataset with "
                    "file_format='array_record', or install the [tf] extra to read it with "
                    "tfds.load") from error
            dataset = tfds.load(name, split=split, data_dir=data_dir, download=download)
            self._source = list(tfds.as_numpy(dataset))
            self.backend = "tfds.load"

    def __len__(self) -> int:
        return len(self._source)

    def __getitem__(self, index: int) -> Any:
        record = self._source[index]
        return record if self.field is None else record[self.field]

    def __repr__(self) -> str:
        return f"TfdsSource({self.name!r}, split={self.split!r}, len={len(self)}, {self.backend})"


class ShardedSource:
    """This process's contiguous block of ``source``: records [n*i//c, n*(i+1)//c).

    Defaults to ``jax.process_index()`` / ``jax.process_count()``; blocks differ in size by at
    most one, and together cover every record exactly once.
    """

    def __init__(self, source: RandomAccessSource, process_index: int | None = None,
                 process_count: int | None = None):
        if process_index is None or process_count is None:
            import jax

            process_index = jax.process_index() if process_index is None else process_index
            process_count = jax.process_count() if process_count is None else process_count
        if not 0 <= process_index < process_count:
            raise ValueError(f"process_index {process_index} not in [0, {process_count})")
        self.source = source
        self.process_index, self.process_count = process_index, process_count
        n = len(source)
        self.start = n * process_index // process_count
        self.stop = n * (process_index + 1) // process_count

    def __len__(self) -> int:
        return self.stop - self.start

    def global_index(self, index: int) -> int:
        """The index in the unsharded source of this shard's record ``index``."""
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self.start + index

    def __getitem__(self, index: int) -> Any:
        return self.source[self.global_index(index)]

    def __repr__(self) -> str:
        return (f"ShardedSource({self.source!r}, {self.process_index}/{self.process_count}, "
                f"[{self.start}, {self.stop}))")


class ListSource:
    """An in-memory sequence as a source (tests, small corpora)."""

    def __init__(self, records: Sequence[Any]):
        self._records = list(records)

    def __len__(self) -> int:
        return len(self._records)

    def __getitem__(self, index: int) -> Any:
        return self._records[index]


# ----------------------------------------------------------------------------- splits

SPLITS = ("train", "validation", "test")


def split_of(key: str, seed: str, fractions: Sequence[float] = (0.8, 0.1, 0.1)) -> str:
    """Deterministic split of a record from a seeded hash of its stable key."""
    digest = hashlib.sha256(f"{seed}\x00{key}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2.0**64
    edge = 0.0
    for split, fraction in zip(SPLITS, fractions):
        edge += fraction
        if u < edge:
            return split
    return SPLITS[len(fractions) - 1]
