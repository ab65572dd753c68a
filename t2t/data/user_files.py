"""Your own files as t2t data: globs, plain text, JSONL/TSV/CSV records, SQuAD JSON, CoNLL.

`RecordFiles` (fine-tuning) is a random-access source (``__len__``/``__getitem__``) with
``where(i)``, the file and line of record ``i``: the records of JSONL, TSV or CSV files (a
header row names the columns), SQuAD-format JSON or CoNLL tagging files, read once and
checked: a bad line is counted under its reason in ``bad`` (`BadLines`) and never reaches
training or evaluation. Text to pretrain on is read as a stream instead
(`t2t.data.corpus`, `t2t.data.streaming`), with the same `BadLines`, and `sentences` for
BERT.

Reasons: ``undecodable`` (not UTF-8, not JSON, a row with the wrong number of columns),
``missing_field``, ``empty`` (a blank line, an empty field); ``truncated`` is counted when
examples are cut to the feature lengths (`t2t.data.data_report`). A missing file or a glob
that matches nothing is an `InputFileError` naming it.
"""
from __future__ import annotations

import collections
import csv
import dataclasses
import glob
import io
import json
import os
import re
from collections.abc import Sequence
from typing import Any


from t2t.data.sources import check_not_gzip, read_gzip
from t2t.errors import InputFileError

BAD_REASONS = ("undecodable", "missing_field", "empty", "truncated")
Patterns = str | os.PathLike | Sequence[str | os.PathLike]


# ----------------------------------------------------------------------------- files


def expand(patterns: Patterns, what: str = "files") -> list[str]:
    """Files of globs, paths or directories (every file under them), in order, each once.
    ``what`` names the setting in errors ("TRAIN_FILES: 'data/*.jsonl' matches no file")."""
    if patterns is None or patterns == "" or patterns == []:
        raise InputFileError(f"{what} is not set: give a file, a glob or a directory")
    items = [patterns] if isinstance(patterns, (str, os.PathLike)) else list(patterns)
    out: list[str] = []
    for item in items:
        pattern = os.path.expanduser(str(item))
        if glob.has_magic(pattern):
            found = [p for p in sorted(glob.glob(pattern, recursive=True)) if os.path.isfile(p)]
            if not found:
                raise InputFileError(f"{what}: {pattern!r} matches no file")
        elif os.path.isdir(pattern):
            found = sorted(os.path.join(root, name) for root, dirs, names in os.walk(pattern)
                           for name in names if not name.startswith("."))
            if not found:
                raise InputFileError(f"{what}: directory {pattern!r} has no file")
        elif os.path.isfile(pattern):
            found = [pattern]
        else:
            raise InputFileError(f"{what}: no such file {pattern!r}")
        out += [p for p in found if p not in out]
    return out


def file_format(path: str) -> str:
    """"jsonl", "json", "tsv", "csv", "conll" or "text", by extension (``.gz`` ignored)."""
    name = path[:-3] if path.endswith(".gz") else path
    ext = os.path.splitext(name)[1].lower()
    return {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".tsv": "tsv",
            ".csv": "csv", ".conll": "conll", ".iob": "conll", ".bio": "conll"}.get(ext, "text")


def read_bytes(path: str) -> bytes:
    """A file's bytes, gunzipped when it ends in ``.gz``; a ``.gz`` file that is not gzip,
    or a gzip file named otherwise, is an InputFileError saying so."""
    if path.endswith(".gz"):
        return read_gzip(path)
    with open(path, "rb") as f:
        data = f.read()
    check_not_gzip(path, data)
    return data


def _lines(data: bytes) -> list[bytes]:
    """Lines without their ``\\n``/``\\r\\n``; no line after a final newline."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return [line[:-1] if line.endswith(b"\r") else line for line in lines]


@dataclasses.dataclass
class BadLines:
    """Bad lines by reason, with the first of each (``"file:line"``) for the messages."""

    counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    first: dict = dataclasses.field(default_factory=dict)       # reason -> "file:line: why"
    earliest: str | None = None                                 # the first one added

    def add(self, reason: str, where: str, why: str = "") -> None:
        self.counts[reason] += 1
        line = f"{where}: {why or reason.replace('_', ' ')}"
        self.first.setdefault(reason, line)
        self.earliest = self.earliest or line

    def merge(self, other: BadLines) -> None:
        self.counts.update(other.counts)
        for reason, where in other.first.items():
            self.first.setdefault(reason, where)
        self.earliest = self.earliest or other.earliest

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def first_any(self) -> str | None:
        """The first bad line read (file order), with why it is bad."""
        return self.earliest

    def as_dict(self) -> dict:
        """JSON form: ``counts`` by reason, the ``first`` of each, the ``earliest``."""
        return {"counts": dict(self.counts), "first": dict(self.first),
                "earliest": self.earliest}


# ----------------------------------------------------------------------------- pretraining text

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'“‘(\[]?[A-Z0-9À-ÖØ-Þ])")


def sentences(lines: Sequence[str]) -> list[str]:
    """The sentences of a document's lines: each line, split after ``.!?`` before a capital."""
    return [s for line in lines for s in _SENTENCE_END.split(line.strip()) if s]


# ----------------------------------------------------------------------------- labelled records


class RecordFiles:
    """The checked records of labelled files, in file order; bad lines counted in ``bad``.

    JSONL (one object per line), TSV and CSV (the first row names the columns; TSV is
    split on tabs, CSV quoted as Excel writes it), a JSON file holding a list of objects,
    SQuAD-format JSON (``{"data": [{"paragraphs": [{"context", "qas"}]}]}`` -> records
    ``{"id", "question", "context", "answers": {"text", "answer_start"}}``) and CoNLL
    (a token and its tag per line, the tag last; blank lines end sentences; records
    ``{"tokens", "tags"}``). ``required`` fields must be present and non-empty.
    """

    def __init__(self, paths: Sequence[str], required: Sequence[str] = (),
                 optional: Sequence[str] = ()):
        self.paths, self.required = list(paths), tuple(required)
        self.optional = tuple(optional)
        self.bad = BadLines()
        self.lines = 0                        # lines (or SQuAD questions) read
        self.fields_seen: list[str] = []      # the first record's fields, for messages
        self.records: list[dict] = []
        self.wheres: list[str] = []
        formats = {self.kind(p) for p in self.paths}
        if len(formats) > 1:
            raise InputFileError(f"{self.paths[0]} and the other files differ in format "
                                 f"({', '.join(sorted(formats))}); give files of one kind")
        self.format = formats.pop()
        for path in self.paths:
            self._read(path)

    @staticmethod
    def kind(path: str) -> str:
        """The file's format; a ``.json`` file is "squad" when it holds a ``data`` list."""
        fmt = file_format(path)
        if fmt == "json":
            head = read_bytes(path)[:4096].lstrip()
            if head.startswith(b"{") and b'"data"' in head:
                return "squad"
            if head.startswith(b"["):
                return "json"
            if not head.startswith(b"{"):
                what = "is empty" if not head else "does not start with { or ["
                raise InputFileError(f"{path} {what}: a .json file holds a list of records "
                                     "or SQuAD's {\"data\": [...]} (one object per line: "
                                     "name it .jsonl)")
            return "jsonl"
        return "jsonl" if fmt == "text" else fmt

    def _read(self, path: str) -> None:
        data = read_bytes(path)
        reader = {"jsonl": self._jsonl, "tsv": self._tsv, "csv": self._csv,
                  "json": self._json_list, "squad": self._squad, "conll": self._conll}
        reader[self.format](path, data)

    def _accept(self, record: Any, where: str) -> None:
        """Checks ``record``'s required fields; keeps it or counts why not."""
        self.lines += 1
        if not isinstance(record, dict):
            self.bad.add("undecodable", where, "not a JSON object")
            return
        if not self.fields_seen:
            self.fields_seen = list(record)
        for name in self.required + tuple(f for f in self.optional if f in record):
            value = record.get(name)
            if value is None:
                self.bad.add("missing_field", where, f"no field {name!r}")
                return
            if isinstance(value, str) and not value.strip():
                self.bad.add("empty", where, f"field {name!r} is empty")
                return
        self.records.append(record)
        self.wheres.append(where)

    def _jsonl(self, path: str, data: bytes) -> None:
        for n, raw in enumerate(_lines(data), 1):
            where = f"{path}:{n}"
            if not raw.strip():
                self.lines += 1
                self.bad.add("empty", where, "blank line")
                continue
            try:
                record = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError:
                self.lines += 1
                self.bad.add("undecodable", where, "not UTF-8")
                continue
            except ValueError as e:
                self.lines += 1
                self.bad.add("undecodable", where, f"not valid JSON ({e.msg})")
                continue
            self._accept(record, where)

    def _json_list(self, path: str, data: bytes) -> None:
        records = _load_json(path, data)
        if not isinstance(records, list):
            raise InputFileError(f"{path}: a .json file must hold a list of records or "
                                 "SQuAD's {\"data\": [...]}")
        for n, record in enumerate(records):
            self._accept(record, f"{path}: record {n}")

    def _table(self, path: str, rows: Sequence[tuple[int, list[str] | None]], sep: str
               ) -> None:
        header = None
        for n, row in rows:
            where = f"{path}:{n}"
            if row is None and header is None:
                raise InputFileError(f"{where}: the header row is not UTF-8 text (a binary "
                                     "file, or another encoding?); convert the file, e.g. "
                                     "iconv -f latin1 -t utf-8")
            if row is None:
                self.lines += 1
                self.bad.add("undecodable", where, "not UTF-8")
                continue
            if header is None:
                header = [h.strip() for h in row]
                continue
            if not any(cell.strip() for cell in row):
                self.lines += 1
                self.bad.add("empty", where, "blank line")
                continue
            if len(row) != len(header):
                self.lines += 1
                self.bad.add("undecodable", where, f"{len(row)} columns, the header has "
                             f"{len(header)}")
                continue
            self._accept(dict(zip(header, row)), where)
        if header is None:
            raise InputFileError(f"{path} is empty: a {sep.upper()} file starts with a header "
                                 "row naming its columns")

    def _tsv(self, path: str, data: bytes) -> None:
        rows = []
        for n, raw in enumerate(_lines(data), 1):
            try:
                rows.append((n, raw.decode("utf-8").split("\t")))
            except UnicodeDecodeError:
                rows.append((n, None))
        self._table(path, rows, "tsv")

    def _csv(self, path: str, data: bytes) -> None:
        text = data.decode("utf-8", errors="surrogateescape")
        reader = csv.reader(io.StringIO(text, newline=""))
        rows, start = [], 1
        try:
            for row in reader:
                undecodable = any(_has_surrogates(cell) for cell in row)
                rows.append((start, None if undecodable else row))
                start = reader.line_num + 1
        except csv.Error as e:    # a field over csv's limit: mostly a quote never closed
            raise InputFileError(f"{path}:{start}: cannot be read as CSV ({e}): a quote that "
                                 "is never closed, or a field of over 128 KB?") from None
        self._table(path, rows, "csv")

    def _squad(self, path: str, data: bytes) -> None:
        content = _load_json(path, data)
        articles = content.get("data") if isinstance(content, dict) else None
        if not isinstance(articles, list):
            raise InputFileError(f"{path}: SQuAD JSON needs a top-level \"data\" list")
        for a, article in enumerate(articles):
            for p, paragraph in enumerate((article or {}).get("paragraphs") or []):
                context = paragraph.get("context")
                for q, qa in enumerate(paragraph.get("qas") or []):
                    where = f"{path}: data[{a}].paragraphs[{p}].qas[{q}]"
                    if not isinstance(qa, dict):
                        self._accept(qa, where)
                        continue
                    answers = qa.get("answers") or []
                    record = {"id": qa.get("id", where), "question": qa.get("question"),
                              "context": context,
                              "answers": {"text": [x.get("text", "") for x in answers],
                                          "answer_start": [int(x.get("answer_start", -1))
                                                           for x in answers]},
                              "is_impossible": bool(qa.get("is_impossible", not answers))}
                    self._accept(record, where)

    def _conll(self, path: str, data: bytes) -> None:
        tokens: list[str] = []
        tags: list[str] = []
        start, broken = 0, None

        def flush():
            nonlocal tokens, tags, broken
            if broken:
                self.lines += 1
                self.bad.add(*broken)
            elif tokens:
                self._accept({"tokens": tokens, "tags": tags}, f"{path}:{start}")
            tokens, tags, broken = [], [], None

        for n, raw in enumerate(_lines(data) + [b""], 1):
            if not raw.strip():
                flush()
                continue
            if not tokens and broken is None:
                start = n
            try:
                columns = raw.decode("utf-8").split()
            except UnicodeDecodeError:
                broken = broken or ("undecodable", f"{path}:{n}", "not UTF-8")
                continue
            if columns[0] == "-DOCSTART-":
                continue
            if len(columns) < 2:
                broken = broken or ("missing_field", f"{path}:{n}", "a token without a tag")
                continue
            tokens.append(columns[0])
            tags.append(columns[-1])

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> dict:
        return self.records[index]

    def where(self, index: int) -> str:
        return self.wheres[index]

    def __repr__(self) -> str:
        return f"RecordFiles({len(self.paths)} {self.format} files, len={len(self)})"


def _has_surrogates(text: str) -> bool:
    return any("\udc80" <= c <= "\udcff" for c in text)


def _load_json(path: str, data: bytes) -> Any:
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise InputFileError(f"{path}:{line}: not UTF-8; convert the file, e.g. "
                             "iconv -f latin1 -t utf-8") from None
    except ValueError as e:
        raise InputFileError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
