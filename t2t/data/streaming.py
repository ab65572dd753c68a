"""Your corpus as a resumable stream: shards to hosts and workers, epochs, a shuffle buffer.

    TextStream (the files, `t2t.data.corpus`) ─► split_shards (byte ranges when files <
      hosts) ─► host_shards (a seeded rule: host h of H reads its own shards) ─► worker
      slice (grain's mp_prefetch: worker w of W reads shards w, w+W, ...) ─► _Documents
      (per epoch a seeded order of the shards, ``cycle_length`` of them open and read in
      turn) ─► shuffle buffer (``buffer_size`` documents; the n-th emitted is a seeded
      choice among them) ─► (epoch, key, record, bad lines) elements

Nothing reads the whole corpus: a host opens its shards one after another and holds at
most the buffer's documents. The state (`get_state`, JSON) is the shard order's position,
each open shard's position (`corpus.Reader.position`), and for the buffer the position
before its oldest document and which documents it holds: `set_state` reads forward from
there again and keeps those, so a resumed stream emits exactly what an uninterrupted one
would, at the cost of re-reading the buffer's span (thousands of documents, not the corpus).
Bad lines are counted as they are met: each travels with the document read after it.
"""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import grain
import numpy as np

from t2t.data import corpus
from t2t.data.corpus import Bad, Shard
from t2t.data.user_files import BadLines, Patterns
from t2t.errors import InputFileError

SHUFFLE_BUFFER = 1024     # documents
CYCLE_LENGTH = 4          # shards open at once per reader
STATE_VERSION = 1
_MASK = (1 << 64) - 1


def mix(*values: int) -> int:
    """A 64-bit hash of integers (splitmix64 steps): the buffer's seeded choices."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (int(v) & _MASK)) * 0xBF58476D1CE4E5B9 & _MASK
        h = (h ^ (h >> 31)) * 0x94D049BB133111EB & _MASK
        h ^= h >> 29
    return h


def host_shards(shards: Sequence[Shard], seed: int, process_index: int, process_count: int
                ) -> list[int]:
    """The indices of ``shards`` host ``process_index`` of ``process_count`` reads: a seeded
    permutation dealt round-robin, so the hosts' sets are disjoint and cover every shard."""
    order = np.random.default_rng([int(seed) % 2**32, len(shards), 0x5EED]).permutation(
        len(shards))
    return sorted(int(i) for i in order[process_index::process_count])


def _bad_lines(bad: Sequence[Bad]) -> BadLines:
    lines = BadLines()
    for b in bad:
        lines.add(b.reason, b.where, b.why)
    return lines


class _Documents:
    """A worker's shards epoch after epoch, ``cycle`` open at a time and read in turn.

    Items are ``(epoch, file index, key, record | None, [Bad])``; the state is the epoch,
    the next shard of the epoch's order to open and the open shards' positions."""

    def __init__(self, shards: Sequence[tuple[int, Shard]], *, seed: int, shuffle: bool,
                 num_epochs: int | None, cycle: int, options: dict, solo: bool):
        self.shards, self.seed, self.shuffle = list(shards), int(seed), shuffle
        self.num_epochs, self.cycle, self.options, self.solo = num_epochs, cycle, options, solo
        self.epoch, self.next, self.slot, self.docs = 0, 0, 0, 0
        self.open: list[list] = []          # [position in the order, reader position]
        self.readers: dict[int, corpus.Reader] = {}
        self.bad_seen: str | None = None
        self._order = self._order_of(0)

    def _order_of(self, epoch: int) -> list[int]:
        n = len(self.shards)
        if not self.shuffle:
            return list(range(n))
        return [int(i) for i in np.random.default_rng(
            [self.seed % 2**32, epoch, 0x0D0C]).permutation(n)]

    def get_state(self) -> dict:
        return {"epoch": self.epoch, "next": self.next, "slot": self.slot, "docs": self.docs,
                "open": [list(o) for o in self.open]}

    def set_state(self, state: dict) -> None:
        self.close()
        self.epoch, self.next, self.slot = state["epoch"], state["next"], state["slot"]
        self.docs = state["docs"]
        self.open = [list(o) for o in state["open"]]
        self._order = self._order_of(self.epoch)

    def close(self) -> None:
        for reader in self.readers.values():
            reader.close()
        self.readers = {}

    def _reader(self, order_pos: int, position: Any) -> corpus.Reader:
        if order_pos not in self.readers:
            _, shard = self.shards[self._order[order_pos]]
            self.readers[order_pos] = corpus.open_reader(shard, position, **self.options)
        return self.readers[order_pos]

    def _end_epoch(self) -> None:
        if self.docs == 0:
            if self.solo and self.shards:
                names = [s.name for _, s in self.shards]
                raise InputFileError(f"TEXT_FILES: no usable text in {names[0]}"
                                     + (f" and {len(names) - 1} more" if names[1:] else "")
                                     + f" ({self.bad_seen or 'the files are empty'})")
            raise StopIteration      # a worker whose shards hold nothing: the others go on
        self.epoch, self.next, self.docs = self.epoch + 1, 0, 0
        self._order = self._order_of(self.epoch)

    def __next__(self) -> tuple:
        while True:
            if self.num_epochs is not None and self.epoch >= self.num_epochs:
                raise StopIteration
            if not self.shards:
                raise StopIteration
            while len(self.open) < self.cycle and self.next < len(self._order):
                self.open.append([self.next, None])
                self.next += 1
            if not self.open:
                self._end_epoch()
                continue
            self.slot %= len(self.open)
            order_pos, position = self.open[self.slot]
            reader = self._reader(order_pos, position)
            try:
                record, bad = next(reader)
            except StopIteration:
                reader.close()
                del self.readers[order_pos], self.open[self.slot]
                continue
            self.open[self.slot][1] = reader.position
            self.slot = (self.slot + 1) % len(self.open)
            if record is not None:
                self.docs += 1
            if bad and self.bad_seen is None:
                self.bad_seen = f"{bad[0].where}: {bad[0].why}"
            file_index, _ = self.shards[self._order[order_pos]]
            return self.epoch, file_index, reader.key, record, bad


class StreamIterator(grain.DatasetIterator):
    """`_Documents` through a seeded shuffle buffer of ``buffer_size`` documents (0: in the
    order read). Elements: ``(epoch, [file index, key], record, bad lines as a dict | None)``,
    the bad lines those read just before the record; a record carries ``other_sentences``,
    another buffered document's (BERT's NSP). Bad lines after a finite stream's last
    document come in a last element without a record."""

    def __init__(self, documents: _Documents, *, seed: int, buffer_size: int):
        super().__init__()
        self.documents, self.seed, self.size = documents, int(seed), int(buffer_size)
        self.buffer: list[tuple] = []       # (j, documents' state before it, item, [Bad])
        self.slots: list[int] = []          # the buffer's j's (get_state runs per element)
        self.j = 0                          # items read so far
        self.n = 0                          # elements emitted so far
        self.filled = False
        self.exhausted = False
        self.trailing: list[Bad] = []       # bad lines with no document after them

    def _read(self) -> tuple | None:
        """The next document with the bad lines read before it: ``(j, state, item, bad)``."""
        state = self.documents.get_state() if self.size else None
        j, bad = self.j, []
        while not self.exhausted:
            try:
                item = next(self.documents)
            except StopIteration:
                self.exhausted = True
                break
            self.j += 1
            bad += item[4]
            if item[3] is not None:
                return j, state, item, bad
        self.trailing += bad
        return None

    def __next__(self) -> tuple:
        if self.size and not self.filled:
            while len(self.buffer) < self.size:
                entry = self._read()
                if entry is None:
                    break
                self.buffer.append(entry)
                self.slots.append(entry[0])
            self.filled = True
        if not self.size:
            entry = self._read()
        elif self.buffer:
            i = mix(self.seed, self.n) % len(self.buffer)
            entry = self.buffer[i]
            new = self._read()
            if new is not None:
                self.buffer[i], self.slots[i] = new, new[0]
            else:
                self.buffer[i], self.slots[i] = self.buffer[-1], self.slots[-1]
                self.buffer.pop()
                self.slots.pop()
        else:
            entry = None
        if entry is None:
            if not self.trailing:
                raise StopIteration
            element: tuple = (0, [0, 0], None, _bad_lines(self.trailing).as_dict())
            self.trailing = []
        else:
            epoch, file_index, key, record, _ = entry[2]
            record = corpus.complete(record)
            if self.buffer:
                other = self.buffer[mix(self.seed, self.n, 1) % len(self.buffer)][2][3]
                record["other_sentences"] = corpus.complete(other)["sentences"]
            element = (epoch, [file_index, key], record,
                       _bad_lines(entry[3]).as_dict() if entry[3] else None)
        self.n += 1
        return element

    def get_state(self) -> dict:
        state = {"version": STATE_VERSION, "n": self.n, "j": self.j, "filled": self.filled,
                 "exhausted": self.exhausted,
                 "trailing": [dataclasses.astuple(b) for b in self.trailing]}
        if self.buffer:
            oldest = self.buffer[self.slots.index(min(self.slots))]
            state.update(anchor=oldest[1], anchor_j=oldest[0], slots=list(self.slots))
        else:
            state["documents"] = self.documents.get_state()
        return state

    def set_state(self, state: dict) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"unsupported stream state version {state.get('version')}")
        self.n, self.filled = state["n"], state["filled"]
        self.buffer, self.slots, self.exhausted = [], [], False
        if "anchor" not in state:
            self.documents.set_state(state["documents"])
            self.j = state["j"]
        else:                               # read the buffer's span again, keep its documents
            self.documents.set_state(state["anchor"])
            self.j = state["anchor_j"]
            slots = {j: k for k, j in enumerate(state["slots"])}
            entries: list = [None] * len(slots)
            while self.j < state["j"]:
                entry = self._read()
                if entry is None:
                    break
                if entry[0] in slots:
                    entries[slots[entry[0]]] = entry
            self.buffer = entries
            self.slots = list(state["slots"])
        self.exhausted = state["exhausted"]
        self.trailing = [Bad(*b) for b in state["trailing"]]

    def close(self) -> None:
        self.documents.close()


class StreamDataset(grain.IterDataset):
    """This host's shards as a grain IterDataset; ``set_slice`` is how grain's mp_prefetch
    gives each worker process its own shards."""

    def __init__(self, shards: Sequence[tuple[int, Shard]], *, seed: int, shuffle: bool,
                 num_epochs: int | None, buffer_size: int, cycle: int, options: dict):
        super().__init__()
        self.shards, self.seed, self.shuffle = list(shards), int(seed), shuffle
        self.num_epochs, self.buffer_size, self.cycle = num_epochs, buffer_size, cycle
        self.options, self.solo = dict(options), True

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        self.shards, self.solo = self.shards[sl], False

    def __iter__(self) -> StreamIterator:
        documents = _Documents(self.shards, seed=self.seed, shuffle=self.shuffle,
                               num_epochs=self.num_epochs, cycle=self.cycle,
                               options=self.options, solo=self.solo)
        return StreamIterator(documents, seed=self.seed,
                              buffer_size=self.buffer_size if self.shuffle else 0)

    def __str__(self) -> str:
        return f"StreamDataset({len(self.shards)} shards)"


class TextStream:
    """Your text files as a pretraining source that streams (`t2t.data.corpus` formats).

    ``dataset(...)`` is one host's stream; ``head(n)`` the first documents in file order
    (what a run reports before it starts); ``sample_texts`` the vocabulary's bounded, seeded
    sample; ``first()`` the first document. ``fingerprint`` names the files by path, size
    and modification time (nothing is hashed)."""

    def __init__(self, patterns: Patterns, field: str = "text", documents: str = "paragraphs",
                 *, shuffle_buffer: int = SHUFFLE_BUFFER, cycle_length: int = CYCLE_LENGTH):
        if documents not in ("paragraphs", "files"):
            raise ValueError(f"documents must be 'paragraphs' or 'files', not {documents!r}")
        self.shards = corpus.find_shards(patterns)
        self.field, self.documents = field or "text", documents
        self.shuffle_buffer, self.cycle_length = int(shuffle_buffer), int(cycle_length)

    @property
    def paths(self) -> list[str]:
        return [s.path for s in self.shards]

    @property
    def options(self) -> dict:
        return {"field": self.field, "documents": self.documents}

    def fingerprint(self) -> list:
        return corpus.fingerprint(self.shards)

    def host_shards(self, seed: int, process_index: int, process_count: int,
                    worker_count: int = 0) -> list[tuple[int, Shard]]:
        """(file index, shard) pairs host ``process_index`` reads."""
        index = {s.path: i for i, s in enumerate(self.shards)}
        pieces = corpus.split_shards(self.shards, process_count,
                                     process_count * max(worker_count, 1), self.documents)
        mine = host_shards(pieces, seed, process_index, process_count)
        return [(index[pieces[i].path], pieces[i]) for i in mine]

    def dataset(self, seed: int, *, shuffle: bool = True, num_epochs: int | None = None,
                process_index: int = 0, process_count: int = 1, worker_count: int = 0
                ) -> StreamDataset:
        shards = self.host_shards(seed, process_index, process_count, worker_count)
        return StreamDataset(shards, seed=seed, shuffle=shuffle, num_epochs=num_epochs,
                             buffer_size=self.shuffle_buffer, cycle=self.cycle_length,
                             options=self.options)

    def head(self, limit: int, max_chars: int | None = None) -> Head:
        """Up to ``limit`` documents (and about ``max_chars`` characters) from the start,
        files in order."""
        return Head(self, limit, max_chars)

    def first(self) -> dict:
        """The first document; an InputFileError when the files hold none (reading them
        all, only then)."""
        head = self.head(1)
        for record, _ in head:
            return record
        names = self.paths[0] + (f" and {len(self.paths) - 1} more" if self.paths[1:] else "")
        if head.bad.total:
            raise InputFileError(f"TEXT_FILES: no usable text in {names} "
                                 f"({head.bad.first_any()})")
        raise InputFileError(f"TEXT_FILES: {names} hold no text")

    def sample_texts(self, max_chars: int, seed: int = 0, max_files: int = 32) -> list[str]:
        """Documents' texts up to ``max_chars`` characters from the start of up to
        ``max_files`` files chosen by ``seed`` (each its share): the vocabulary's sample,
        whatever the corpus's size."""
        chosen = np.random.default_rng([int(seed), 0x70CA]).permutation(len(self.shards))
        chosen = [int(i) for i in chosen[:max_files]]
        share, texts, total = max_chars // len(chosen) + 1, [], 0
        for i in sorted(chosen):
            got = 0
            for record, _ in corpus.documents(self.shards[i], **self.options):
                if record is None:
                    continue
                text = corpus.complete(record)["text"]
                texts.append(text)
                got += len(text)
                if got >= share:
                    break
            total += got
            if total >= max_chars:
                break
        return texts

    def __repr__(self) -> str:
        return f"TextStream({len(self.shards)} files, {self.shards[0].format})"


class Head:
    """The first documents of a stream in file order, counting bad lines; after iterating,
    ``fraction`` is the share of the corpus's bytes (records) read, for estimates."""

    def __init__(self, stream: TextStream, limit: int, max_chars: int | None = None):
        self.stream, self.limit, self.max_chars = stream, limit, max_chars
        self.bad, self.documents, self.fraction = BadLines(), 0, 0.0

    def __iter__(self) -> Iterator[tuple[dict, str]]:
        sizes = [max(s.size, 1) for s in self.stream.shards]
        total, done, chars = float(sum(sizes)), 0.0, 0
        for shard, size in zip(self.stream.shards, sizes):
            reader = corpus.open_reader(shard, **self.stream.options)
            try:
                for record, bad in reader:
                    for b in bad:
                        self.bad.add(b.reason, b.where, b.why)
                    if record is None:
                        continue
                    if self.documents == self.limit or (self.max_chars and
                                                        chars >= self.max_chars):
                        self.fraction = (done + size * reader.progress()) / total
                        return
                    self.documents += 1
                    record = corpus.complete(record)
                    chars += len(record["text"])
                    yield record, record["id"]
            finally:
                reader.close()
            done += size
            self.fraction = done / total
        self.fraction = 1.0


def stream_of(source: Any) -> TextStream | None:
    """``source`` if it streams, else None (a random-access source)."""
    return source if isinstance(source, TextStream) else None


def iterate(dataset: grain.IterDataset, n: int) -> list:
    """The first ``n`` elements (tests and tools)."""
    return list(itertools.islice(iter(dataset), n))
