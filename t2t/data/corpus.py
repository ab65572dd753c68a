"""A pretraining corpus on disk, read as a stream: its shards and each shard's documents.

`find_shards` turns globs, paths and directories into `Shard`s: plain text and JSONL
(``.gz`` and ``.zst`` too), Parquet, Arrow (a Hugging Face ``datasets`` folder written by
``save_to_disk``, or ``.arrow`` files) and ArrayRecord. `split_shards` cuts uncompressed
text and JSONL files into byte ranges at document boundaries when a corpus has fewer files
than hosts; other formats cannot be cut, and too few of them is an InputFileError that
says how many to write. `open_reader` reads one shard from a position, a document at a
time, never the whole file: ``{"id": "file:line", "text"}`` records (``"lines"`` for plain
text; `complete` adds BERT's sentences) with the bad lines met before each (`Bad`: not
UTF-8, not JSON, no field, empty), and ``position`` after it, from which a new reader
resumes exactly. Positions are decompressed byte offsets
(text, JSONL) or record numbers (Parquet, Arrow, ArrayRecord); resuming inside a ``.gz``
or ``.zst`` file decompresses up to the offset again (a shard's worth at most).

pyarrow (Parquet, Arrow) and zstandard (``.zst``) are the ``corpora`` extra; without them
those formats are an InputFileError naming the extra, and the rest still reads.
"""
from __future__ import annotations

import dataclasses
import gzip
import io
import json
import os
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

from t2t.data.sources import GZIP_MAGIC, check_not_gzip
from t2t.data.user_files import Patterns, expand, sentences
from t2t.errors import InputFileError

LINE_FORMATS = ("text", "jsonl")
RECORD_FORMATS = ("parquet", "arrow", "array_record")
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
EXTRA = "pip install 't2t[corpora]'"
_CHUNK = 1 << 20


@dataclasses.dataclass(frozen=True)
class Shard:
    """One file, or the byte range [start, stop) of an uncompressed text/JSONL file."""

    path: str
    format: str                # text | jsonl | parquet | arrow | array_record
    compression: str = ""      # "" | "gz" | "zst"
    size: int = 0
    mtime_ns: int = 0
    start: int = 0
    stop: int | None = None    # None: to the end

    @property
    def name(self) -> str:
        return self.path if self.stop is None and not self.start else (
            f"{self.path}[{self.start}:{self.stop}]")

    @property
    def splittable(self) -> bool:
        return self.format in LINE_FORMATS and not self.compression


@dataclasses.dataclass(frozen=True)
class Bad:
    """A bad line or record: `BadLines.add`'s arguments."""

    reason: str                # undecodable | missing_field | empty
    where: str                 # "file:line" or "file: record N"
    why: str


def file_format(path: str) -> tuple[str, str]:
    """(format, compression) of a corpus file by its name; TSV/CSV/CoNLL are an error."""
    name, compression = path, ""
    for ext in ("gz", "zst"):
        if name.endswith(f".{ext}"):
            name, compression = name[: -len(ext) - 1], ext
    base = os.path.basename(name).lower()
    ext = os.path.splitext(base)[1]
    if ".array_record" in base or ext == ".arrayrecord":
        fmt = "array_record"
    elif ext in (".jsonl", ".ndjson", ".json"):
        fmt = "jsonl"
    elif ext in (".parquet", ".arrow"):
        fmt = ext[1:]
    elif ext in (".tsv", ".csv", ".conll", ".iob", ".bio"):
        raise InputFileError(f"TEXT_FILES: pretraining reads plain text, JSONL, Parquet, Arrow "
                             f"or ArrayRecord files, not TSV/CSV/CoNLL ({path})")
    else:
        fmt = "text"
    if compression and fmt in RECORD_FORMATS:
        raise InputFileError(f"TEXT_FILES: {path}: {fmt} files compress themselves; give "
                             f"them without .{compression}")
    return fmt, compression


def _hf_data_files(directory: str) -> list[str] | None:
    """The .arrow files of a `datasets` ``save_to_disk`` folder, in order; None if it is not
    one. A DatasetDict's folder is an error naming its splits."""
    if os.path.isfile(os.path.join(directory, "dataset_dict.json")):
        with open(os.path.join(directory, "dataset_dict.json")) as f:
            splits = json.load(f).get("splits", [])
        raise InputFileError(f"TEXT_FILES: {directory} holds several splits ({', '.join(splits)});"
                             f" give one split's folder, e.g. {os.path.join(directory, 'train')}")
    state = os.path.join(directory, "state.json")
    if not os.path.isfile(state):
        return None
    with open(state) as f:
        files = [d["filename"] for d in json.load(f).get("_data_files", [])]
    return [os.path.join(directory, name) for name in files]


def find_shards(patterns: Patterns, what: str = "TEXT_FILES") -> list[Shard]:
    """The corpus files of globs, paths and directories, each a `Shard`, in order; all of
    one format (compressions may mix). Statting them is all this reads."""
    items = [patterns] if isinstance(patterns, (str, os.PathLike)) else list(patterns or [])
    paths: list[str] = []
    for item in items:
        pattern = os.path.expanduser(str(item))
        hf = _hf_data_files(pattern) if os.path.isdir(pattern) else None
        found = hf if hf is not None else expand(pattern, what)
        paths += [p for p in found if p not in paths]
    if not paths:
        expand(patterns, what)                           # the one-line error for nothing
    shards = []
    for path in paths:
        fmt, compression = file_format(path)
        stat = os.stat(path)
        shards.append(Shard(path, fmt, compression, stat.st_size, stat.st_mtime_ns))
    kinds = sorted({s.format for s in shards})
    if len(kinds) > 1:
        raise InputFileError(f"{what}: files of more than one format ({', '.join(kinds)}); give "
                             "one kind")
    return shards


def fingerprint(shards: Sequence[Shard]) -> list:
    """What identifies the corpus cheaply: each file's path, size and mtime."""
    return [(os.path.abspath(s.path), s.size, s.mtime_ns) for s in shards]


# ----------------------------------------------------------------------------- splitting


def split_shards(shards: Sequence[Shard], hosts: int, pieces: int, documents: str,
                 what: str = "TEXT_FILES") -> list[Shard]:
    """``shards`` as they are when there are at least ``hosts``; else uncompressed text and
    JSONL files cut into ``pieces`` byte ranges at document boundaries (each cut reads a
    few lines), and an InputFileError saying how many files to write for other formats."""
    if len(shards) >= hosts:
        return list(shards)
    if not all(s.splittable for s in shards) or documents == "files":
        why = ("each file is one document" if documents == "files" else
               "compressed or columnar files cannot be cut")
        raise InputFileError(f"{what}: {len(shards)} file(s) for {hosts} hosts ({why}): write the "
                             f"corpus as at least {hosts} files (a multiple of {hosts} balances "
                             "them best), each host reads its own")
    per_file = -(-pieces // len(shards))
    out: list[Shard] = []
    for shard in shards:
        cuts = sorted({_snap(shard, shard.size * k // per_file)
                       for k in range(1, per_file)} | {0, shard.size})
        out += [dataclasses.replace(shard, start=a, stop=b) for a, b in zip(cuts, cuts[1:])
                if a < b]
    if len(out) < hosts:
        raise InputFileError(f"{what}: the corpus has {len(out)} document range(s) for {hosts} "
                             f"hosts: write it as at least {hosts} files")
    return out


def _snap(shard: Shard, offset: int) -> int:
    """The first document start at or after ``offset``: a line start (JSONL) or a line
    after a blank one (text)."""
    if offset <= 0:
        return 0
    with open(shard.path, "rb") as f:
        f.seek(offset - 1)
        f.readline()                       # to the line boundary at or after offset
        if shard.format == "jsonl":
            return f.tell()
        blank = False
        while True:
            start = f.tell()
            line = f.readline()
            if not line:
                return shard.size
            if blank and line.strip():
                return start
            blank = not line.strip()


# ----------------------------------------------------------------------------- readers


def _missing(library: str, what: str) -> InputFileError:
    return InputFileError(f"TEXT_FILES: reading {what} needs {library}: {EXTRA}")


def open_reader(shard: Shard, position: Any = None, *, field: str = "text",
                documents: str = "paragraphs") -> "Reader":
    """A reader of ``shard`` from ``position`` (a reader's ``position``; None: the start)."""
    cls = {"text": TextReader, "jsonl": JsonlReader, "parquet": ParquetReader,
           "arrow": ArrowReader, "array_record": ArrayRecordReader}[shard.format]
    return cls(shard, position, field, documents)


class Reader:
    """Documents of one shard: ``next(reader)`` is ``(record | None, [Bad])``; None only
    at the end, carrying the last bad lines. ``position`` resumes after the last one."""

    def __init__(self, shard: Shard, position: Any, field: str, documents: str):
        self.shard, self.field, self.documents = shard, field, documents

    def __iter__(self) -> Reader:
        return self

    def __next__(self) -> tuple[dict | None, list[Bad]]:
        raise NotImplementedError

    @property
    def position(self) -> Any:
        raise NotImplementedError

    @property
    def key(self) -> int:
        """The last document's stable number within its file (offset or record index)."""
        raise NotImplementedError

    def progress(self) -> float:
        """The share of the shard's file read so far (0..1), for estimates."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class _Lines:
    """The lines of a text file (plain, .gz, .zst) from a decompressed offset, counted."""

    def __init__(self, shard: Shard, offset: int, line: int):
        self.shard, self.offset, self.line = shard, offset, line
        self.stop = shard.stop
        self._raw = open(shard.path, "rb")
        head = self._raw.read(4)
        self._raw.seek(0)
        if shard.compression == "gz":
            if head[:2] != GZIP_MAGIC and head:
                raise InputFileError(f"{shard.path} is named .gz but is not gzip-compressed: "
                                     "rename it without .gz, or compress it with gzip")
            self._f: Any = gzip.GzipFile(fileobj=self._raw, mode="rb")
        elif shard.compression == "zst":
            try:
                import zstandard
            except ImportError:
                raise _missing("zstandard", ".zst files") from None
            if head != ZSTD_MAGIC and head:
                raise InputFileError(f"{shard.path} is named .zst but is not zstd-compressed: "
                                     "rename it without .zst, or compress it with zstd")
            self._f = io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(self._raw),
                                        _CHUNK)
        else:
            if shard.start == 0 and offset == 0:
                check_not_gzip(shard.path, head)
            self._f = self._raw
        self._skip(offset)

    def _skip(self, offset: int) -> None:
        if not self.shard.compression:
            self._raw.seek(offset)
            return
        left = offset
        while left > 0:
            block = self._read(min(left, _CHUNK))
            if not block:
                break
            left -= len(block)

    def _read(self, n: int) -> bytes:
        try:
            return self._f.read(n)
        except (EOFError, zlib.error, gzip.BadGzipFile) as e:
            raise self._damaged(e) from None

    def _damaged(self, error: Exception) -> InputFileError:
        return InputFileError(f"{self.shard.path}: the {self.shard.compression} data is cut "
                              f"short or damaged ({error}); copy or compress the file again")

    def next_line(self) -> bytes | None:
        """The next line (without its newline), or None at the end of the range."""
        if self.stop is not None and self.offset >= self.stop:
            return None
        try:
            raw = self._f.readline()
        except (EOFError, zlib.error, gzip.BadGzipFile) as e:
            raise self._damaged(e) from None
        except Exception as e:  # noqa: BLE001  zstd's own error class
            if type(e).__name__ == "ZstdError":
                raise self._damaged(e) from None
            raise
        if not raw:
            return None
        self.offset += len(raw)
        self.line += 1
        raw = raw[:-1] if raw.endswith(b"\n") else raw
        return raw[:-1] if raw.endswith(b"\r") else raw

    def where(self) -> str:
        return f"{self.shard.path}:{self.line}"

    def progress(self) -> float:
        return min(self._raw.tell() / max(self.shard.size, 1), 1.0)

    def close(self) -> None:
        self._raw.close()


def _line_base(shard: Shard) -> int:
    """Lines before a byte range's start (counted in blocks, without keeping them)."""
    lines, left = 0, shard.start
    with open(shard.path, "rb") as f:
        while left > 0:
            block = f.read(min(left, _CHUNK))
            if not block:
                break
            lines += block.count(b"\n")
            left -= len(block)
    return lines


class _LineReader(Reader):
    """Shared by text and JSONL: position ``[offset, line]`` of the decompressed file."""

    def __init__(self, shard: Shard, position: Any, field: str, documents: str):
        super().__init__(shard, position, field, documents)
        offset, line = position if position is not None else (shard.start, None)
        if line is None:
            line = _line_base(shard) if shard.start else 0
        self.lines = _Lines(shard, offset, line)
        self._key = 0

    @property
    def position(self) -> list[int]:
        return [self.lines.offset, self.lines.line]

    @property
    def key(self) -> int:
        return self._key

    def progress(self) -> float:
        return self.lines.progress()

    def close(self) -> None:
        self.lines.close()


class TextReader(_LineReader):
    """Plain text: a document per run of non-blank lines (``documents="files"``: per file),
    its ``text`` the lines joined by spaces; a line that is not UTF-8 is left out and
    counted."""

    def __next__(self) -> tuple[dict | None, list[Bad]]:
        lines: list[str] = []
        bad: list[Bad] = []
        first = 0
        while True:
            start = self.lines.offset
            raw = self.lines.next_line()
            if raw is None:
                break
            if not raw.strip():
                if lines and self.documents != "files":
                    break
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                bad.append(Bad("undecodable", self.lines.where(), "not UTF-8"))
                continue
            if not lines:
                first, self._key = self.lines.line, start
            lines.append(line)
        if not lines:
            if bad:
                return None, bad
            raise StopIteration
        return {"id": f"{self.shard.path}:{first}", "lines": lines}, bad


class JsonlReader(_LineReader):
    """JSONL: a document per line, its ``field``."""

    def __next__(self) -> tuple[dict | None, list[Bad]]:
        bad: list[Bad] = []
        while True:
            start = self.lines.offset
            raw = self.lines.next_line()
            if raw is None:
                if bad:
                    return None, bad
                raise StopIteration
            where = self.lines.where()
            if not raw.strip():
                bad.append(Bad("empty", where, "blank line"))
                continue
            try:
                record = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError:
                bad.append(Bad("undecodable", where, "not UTF-8"))
                continue
            except ValueError as e:
                bad.append(Bad("undecodable", where, f"not valid JSON ({e.msg})"))
                continue
            text = record.get(self.field) if isinstance(record, dict) else None
            if text is None:
                bad.append(Bad("missing_field", where, f"no field {self.field!r}"))
                continue
            text = str(text)
            if not text.strip():
                bad.append(Bad("empty", where, f"field {self.field!r} is empty"))
                continue
            self._key = start
            return {"id": where, "text": text}, bad


def _text_record(value: Any, field: str, where: str) -> tuple[dict | None, Bad | None]:
    """A record of a columnar value (str, bytes or None)."""
    if value is None:
        return None, Bad("missing_field", where, f"no value in column {field!r}")
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            return None, Bad("undecodable", where, "not UTF-8")
    text = str(value)
    if not text.strip():
        return None, Bad("empty", where, f"column {field!r} is empty")
    return {"id": where, "text": text}, None


class _RecordReader(Reader):
    """Record formats: position = the next record's index; batches of ``_BATCH`` values."""

    _BATCH = 256

    def __init__(self, shard: Shard, position: Any, field: str, documents: str):
        super().__init__(shard, position, field, documents)
        self.index = int(position or 0)
        self._values: list = []
        self._next = self.index      # index of self._values[0]
        self._key = 0

    def _fill(self) -> bool:
        """Loads the values from ``self.index`` on; False at the end."""
        raise NotImplementedError

    @property
    def position(self) -> int:
        return self.index

    @property
    def key(self) -> int:
        return self._key

    def __next__(self) -> tuple[dict | None, list[Bad]]:
        bad: list[Bad] = []
        while True:
            if self.index - self._next >= len(self._values):
                self._next, self._values = self.index, []
                if not self._fill():
                    if bad:
                        return None, bad
                    raise StopIteration
            value = self._values[self.index - self._next]
            where = f"{self.shard.path}: record {self.index}"
            self._key, self.index = self.index, self.index + 1
            record, problem = self._record(value, where)
            if record is not None:
                return record, bad
            bad.append(problem)

    def _record(self, value: Any, where: str) -> tuple[dict | None, Bad | None]:
        return _text_record(value, self.field, where)


def _pyarrow(what: str):
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise _missing("pyarrow", what) from None
    return pyarrow


def _column(schema: Any, path: str, field: str) -> None:
    if field not in schema.names:
        raise InputFileError(f"TEXT_FILES: {path} has no column {field!r} (it has "
                             f"{', '.join(schema.names[:10])}): set TEXT_FIELD")


class ParquetReader(_RecordReader):
    """Parquet: the ``field`` column, a row group at a time."""

    def __init__(self, shard: Shard, position: Any, field: str, documents: str):
        super().__init__(shard, position, field, documents)
        pa = _pyarrow("Parquet files")
        try:
            self._file = pa.parquet.ParquetFile(shard.path)
        except pa.ArrowException as e:
            raise InputFileError(f"TEXT_FILES: {shard.path} cannot be read as Parquet ({e})"
                                 ) from None
        _column(self._file.schema_arrow, shard.path, field)
        meta = self._file.metadata
        self._starts = [0]
        for g in range(meta.num_row_groups):
            self._starts.append(self._starts[-1] + meta.row_group(g).num_rows)

    def _fill(self) -> bool:
        group = next((g for g in range(len(self._starts) - 1)
                      if self._starts[g] <= self.index < self._starts[g + 1]), None)
        if group is None:
            return False
        values = self._file.read_row_group(group, columns=[self.field]).column(0).to_pylist()
        self._next, self._values = self._starts[group], values
        return True

    def progress(self) -> float:
        return self.index / max(self._starts[-1], 1)

    def close(self) -> None:
        self._file.close()


class ArrowReader(_RecordReader):
    """Arrow IPC files (stream or file format, as `datasets` writes them): the ``field``
    column, a record batch at a time."""

    def __init__(self, shard: Shard, position: Any, field: str, documents: str):
        super().__init__(shard, position, field, documents)
        pa = _pyarrow("Arrow files")
        self._source = pa.OSFile(shard.path)
        try:
            self._batches: Any = pa.ipc.open_stream(self._source)
        except pa.ArrowInvalid:
            self._source.seek(0)
            try:
                ipc = pa.ipc.open_file(self._source)
            except pa.ArrowInvalid as e:
                raise InputFileError(f"TEXT_FILES: {shard.path} cannot be read as Arrow ({e})"
                                     ) from None
            self._batches = (ipc.get_batch(i) for i in range(ipc.num_record_batches))
            self._schema = ipc.schema
        else:
            self._schema = self._batches.schema
        _column(self._schema, shard.path, field)
        self._read = 0                # rows of the batches read so far

    def _fill(self) -> bool:
        for batch in self._batches:
            start, self._read = self._read, self._read + batch.num_rows
            if self._read > self.index:
                self._next = start
                self._values = batch.column(self._schema.names.index(self.field)).to_pylist()
                return True
        return False

    def progress(self) -> float:
        return min(self._source.tell() / max(self.shard.size, 1), 1.0)

    def close(self) -> None:
        self._source.close()


class ArrayRecordReader(_RecordReader):
    """ArrayRecord: each record is the document's UTF-8 text, or a JSON object whose
    ``field`` is."""

    def __init__(self, shard: Shard, position: Any, field: str, documents: str):
        super().__init__(shard, position, field, documents)
        try:
            from array_record.python.array_record_module import ArrayRecordReader as Native
        except ImportError:
            raise _missing("array_record", "ArrayRecord files") from None
        try:
            self._file = Native(shard.path)
        except (RuntimeError, ValueError) as e:
            raise InputFileError(f"TEXT_FILES: {shard.path} cannot be read as ArrayRecord "
                                 f"({e})") from None
        self._count = self._file.num_records()

    def _fill(self) -> bool:
        if self.index >= self._count:
            return False
        stop = min(self.index + self._BATCH, self._count)
        self._values = self._file.read(list(range(self.index, stop)))
        return True

    def _record(self, value: Any, where: str) -> tuple[dict | None, Bad | None]:
        if value.lstrip()[:1] == b"{":
            try:
                record = json.loads(value.decode("utf-8"))
            except (UnicodeDecodeError, ValueError):
                record = None
            if isinstance(record, dict):
                if record.get(self.field) is None:
                    return None, Bad("missing_field", where, f"no field {self.field!r}")
                value = str(record[self.field])
        return _text_record(value, self.field, where)

    def progress(self) -> float:
        return self.index / max(self._count, 1)

    def close(self) -> None:
        self._file.close()


def complete(record: dict) -> dict:
    """A reader's record as tasks see it: ``{"id", "text", "sentences"}`` (BERT's sentences:
    a plain text document's lines, split after ``.!?``). Readers keep a text document's
    lines apart and leave the sentences to this, so a buffered document is held once."""
    lines = record.get("lines")
    if lines is not None:
        return {"id": record["id"], "text": " ".join(s.strip() for s in lines),
                "sentences": sentences(lines)}
    return {**record, "sentences": sentences(record["text"].splitlines())}


def documents(shard: Shard, **options: Any) -> Iterator[tuple[dict | None, list[Bad]]]:
    """Every (record, bad lines) of ``shard`` in order (closing the file at the end)."""
    reader = open_reader(shard, **options)
    try:
        yield from reader
    finally:
        reader.close()
