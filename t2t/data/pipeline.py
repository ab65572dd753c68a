"""Deterministic, resumable, per-process input pipeline on grain.

    source ─► ShardedSource (this process's block) ─► grain.MapDataset: shuffle(seed)/epoch
      ─► repeat(num_epochs) ─► map_with_index(preprocess + converter.prepare, in threads)
      ─► PackedBatches (first-fit packing into batch rows, finalize) ─► [mp_prefetch:
      each worker process packs whole batches from its slice] ─► BatchIterator (counters)

Randomness of an example's objective comes from ``(seed, [task,] epoch, record index)``, so it
does not depend on worker order, thread timing or the number of processes, and masks are
fresh every epoch (dynamic masking). A batch is the first-fit packing of consecutive
examples (of one worker's slice); it is emitted when the next example fits in none of its
rows. Packing runs where preprocessing runs, so with worker processes the main process
receives finished batches (one message a batch) and only adds up their counters. The
iterator state is grain's: for each packer, the read position of the element holding that
next example plus its position in the element's list; and the running stats: a resumed
iterator re-reads one element per packer, never the stream. The batches depend on the
seed and the process and worker counts (0 and 1 workers give the same ones), so a state
resumes only with the same counts. Resuming with another process count is refused: each
process consumes a data-dependent number of records per batch (packing), so the union of
consumed records is not a prefix of any re-sharded order; restart the epoch instead.
Bad records (InvalidRecord, SkipExample from a preprocessor or converter, and, unless
``strict``, any other exception in a preprocessor) are counted under ``skipped`` and dropped.

A streaming source (your files, `t2t.data.streaming.TextStream`) takes the place of the
first three stages: its own per-host shards, shuffle buffer and state, then the same
preprocessing, packing and iterator state; its bad lines are counted under ``bad_lines``.
"""
from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import grain
import numpy as np

from t2t.data.converters import FeatureConverter
from t2t.data.preprocessors import SkipExample
from t2t.data.sources import InvalidRecord, RandomAccessSource, ShardedSource
from t2t.data.streaming import stream_of
from t2t.errors import ConfigError

PreprocessFn = Callable[[Any, tuple[int, ...]], Any]  # (record, seed) -> dict | [dict] | None
STATE_VERSION = 2  # 1: packed in the main process (resumable with 0 workers)
_log = logging.getLogger(__name__)


class _Indexed:
    """A shard whose items are ``(global record index, record)``."""

    def __init__(self, shard: ShardedSource):
        self.shard = shard

    def __len__(self) -> int:
        return len(self.shard)

    def __getitem__(self, index: int) -> tuple[int, Any]:
        return self.shard.global_index(index), self.shard[index]


class _Preprocess:
    """Top-level (picklable) map: record -> {"examples": [(packable, cut)], "stats": {...}}."""

    def __init__(self, preprocess_fn: PreprocessFn, converter: FeatureConverter,
                 seed_prefix: tuple[int, ...], epoch_length: int, strict: bool):
        self.preprocess_fn, self.converter = preprocess_fn, converter
        self.seed_prefix, self.epoch_length, self.strict = seed_prefix, epoch_length, strict

    def __call__(self, index: int, item: tuple[int, Any]) -> dict:
        record_index, record = item
        return self.process(record, (*self.seed_prefix, index // self.epoch_length,
                                     record_index), record_index)

    def process(self, record: Any, seed: tuple[int, ...], name: Any) -> dict:
        stats: collections.Counter = collections.Counter(documents=1)
        examples: list = []
        try:
            if isinstance(record, InvalidRecord):
                raise SkipExample(record.reason)
            outputs = self.preprocess_fn(record, seed)
            if outputs is None:
                outputs = []
            elif isinstance(outputs, Mapping):
                outputs = [outputs]
            for example in outputs:
                try:
                    examples.append(self.converter.prepare(example))
                except SkipExample as skip:
                    stats[f"skipped/{skip.reason}"] += 1
        except SkipExample as skip:
            stats[f"skipped/{skip.reason}"] += 1
        except Exception:  # noqa: BLE001 - a bad record must not kill a worker
            if self.strict:
                raise
            if stats["skipped/error"] == 0:
                _log.warning("preprocessing record %s failed; skipped", name, exc_info=True)
            stats["skipped/error"] += 1
        return {"examples": examples, "stats": dict(stats)}


class _StreamPreprocess(_Preprocess):
    """The same map over a stream's elements ``(epoch, [file, key], record, bad lines)``:
    the seed is ``(*seed_prefix, epoch, file, key)``, and the bad lines read before the
    record travel with it (``bad/<reason>`` counts, the first of each in ``"bad"``)."""

    def __init__(self, preprocess_fn: PreprocessFn, converter: FeatureConverter,
                 seed_prefix: tuple[int, ...], strict: bool):
        super().__init__(preprocess_fn, converter, seed_prefix, 1, strict)

    def __call__(self, element: tuple) -> dict:
        epoch, key, record, bad = element
        if record is None:
            out: dict = {"examples": [], "stats": {}}
        else:
            out = self.process(record, (*self.seed_prefix, epoch, *key), record.get("id"))
        if bad:
            out["stats"].update({f"bad/{k}": v for k, v in bad["counts"].items()})
            out["bad"] = {"first": bad["first"], "earliest": bad["earliest"]}
        return out


def no_bad_lines() -> dict:
    """The first bad line of each reason, and the earliest, of none met yet (a stream's bad
    lines' counts travel in the stats as ``bad/<reason>``; these, for the messages)."""
    return {"first": {}, "earliest": None}


def merge_first_bad_lines(into: dict, other: Mapping) -> dict:
    """Adds ``other``'s first bad lines to ``into`` where it has none of a reason, as
    `BadLines.merge` does: ``into``."""
    for reason, where in other["first"].items():
        into["first"].setdefault(reason, where)
    into["earliest"] = into["earliest"] or other["earliest"]
    return into


MAX_BARREN_RECORDS = 10_000  # then every record is being skipped: fail, do not spin


def processed_dataset(source: RandomAccessSource, preprocess_fn: PreprocessFn,
                      converter: FeatureConverter, seed: int, *, shuffle: bool = True,
                      num_epochs: int | None = None, process_index: int | None = None,
                      process_count: int | None = None, seed_prefix: tuple[int, ...] | None = None,
                      strict: bool = False) -> grain.MapDataset:
    """This process's shard, shuffled per epoch, repeated and preprocessed (lazily)."""
    shard = source if isinstance(source, ShardedSource) else ShardedSource(
        source, process_index, process_count)
    if len(shard) == 0:
        raise ValueError(f"empty shard {shard!r}: fewer records than processes?")
    ds = grain.MapDataset.source(_Indexed(shard))
    if shuffle:
        ds = ds.shuffle(seed=int(seed) % 2**32)
    ds = ds.repeat(num_epochs)
    prefix = (int(seed),) if seed_prefix is None else tuple(seed_prefix)
    return ds.map_with_index(_Preprocess(preprocess_fn, converter, prefix, len(shard), strict))


def _mark_flags_parsed() -> None:
    """grain worker processes read absl flags; scripts without absl.app must mark them parsed."""
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


class PackedBatches(grain.IterDataset):
    """Preprocessed elements ``{"examples", "stats"[, "bad"]}`` packed first-fit into whole
    batches: elements ``{"batch": finalized arrays, "stats": what the batch's elements
    added to the counters[, "bad": their first bad lines]}``. It runs where its parent runs
    (in each worker process under ``mp_prefetch``), so the main process only receives
    finished batches, one IPC message each, not one per document."""

    def __init__(self, parent: grain.IterDataset, converter: FeatureConverter, batch_rows: int):
        super().__init__(parent)
        self.converter, self.batch_rows = converter, batch_rows

    def __iter__(self) -> _PackIterator:
        return _PackIterator(self._parent.__iter__(), self.converter, self.batch_rows)

    def __str__(self) -> str:
        return f"PackedBatches(rows={self.batch_rows})"


class _PackIterator(grain.DatasetIterator):
    """A batch is the first-fit packing of consecutive examples, emitted when the next
    example fits in none of its rows. The state is the parent's state just before the
    element holding that next example, its position in the element's list, and whether
    the element's counts already went out (with an earlier batch)."""

    def __init__(self, parent: grain.DatasetIterator, converter: FeatureConverter,
                 batch_rows: int):
        super().__init__(parent)
        self.converter, self.batch_rows = converter, batch_rows
        self._current: list | None = None  # examples of the element being consumed
        self._current_state: Any = None  # parent state just before that element
        self._position = 0
        self._resume_position = 0
        self._resume_counted = False

    def _pull(self, stats: collections.Counter, bad: dict) -> bool:
        """Reads the next element; False at the end of the stream."""
        state = self._parent.get_state()
        try:
            element = next(self._parent)
        except StopIteration:
            self._current = None
            return False
        self._current, self._current_state = element["examples"], state
        self._position, self._resume_position = self._resume_position, 0
        if self._resume_counted:  # its counts went out with an earlier batch
            self._resume_counted = False
        else:
            stats.update(element["stats"])
            if "bad" in element:
                merge_first_bad_lines(bad, element["bad"])
        return True

    def __next__(self) -> dict[str, Any]:
        packer = self.converter.new_packer(self.batch_rows)
        stats: collections.Counter = collections.Counter()
        bad = no_bad_lines()
        barren = 0                        # records in a row that gave no example
        while True:
            if self._current is None or self._position >= len(self._current):
                if not self._pull(stats, bad):
                    if packer.is_empty:
                        raise StopIteration
                    break
                barren = barren + 1 if not self._current else 0
                if barren == MAX_BARREN_RECORDS:
                    skipped = {k: v for k, v in stats.items() if k.startswith("skipped/")}
                    raise ConfigError(f"{barren} records in a row gave no example (counts so "
                                      f"far: {skipped}); do the feature lengths "
                                      f"{self.converter.lengths} fit this task?")
                continue
            packable, cut = self._current[self._position]
            if not packer.add(packable):
                break  # the batch is full: this example starts the next one
            self._position += 1
            stats["examples"] += 1
            if cut:
                stats["truncated"] += 1
                stats["truncated_tokens"] += cut
        stats["batches"] += 1
        for key, (tokens, slots) in packer.token_counts().items():
            stats[f"tokens/{key}"] += tokens
            stats[f"slots/{key}"] += slots
        out = {"batch": self.converter.finalize(packer.rows(self.batch_rows)),
               "stats": dict(stats)}
        if bad["first"] or bad["earliest"]:
            out["bad"] = bad
        return out

    def get_state(self) -> dict[str, Any]:
        if self._current is not None and self._position < len(self._current):
            return {"parent": self._current_state, "position": self._position,
                    "counted": True}
        return {"parent": self._parent.get_state(), "position": 0, "counted": False}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self._parent.set_state(state["parent"])
        self._current = None
        self._resume_position = int(state["position"])
        self._resume_counted = bool(state["counted"])

    def __str__(self) -> str:
        return f"PackIterator(rows={self.batch_rows})"


WORKER_BUFFER = 2  # finished batches each worker process may hold ready


class BatchIterator:
    """Process-local numpy batches; ``get_state``/``set_state`` are JSON-serialisable.

    Packing and ``finalize`` run in `PackedBatches`: in this process when ``worker_count``
    is 0, else in each of ``worker_count`` grain worker processes over its own slice of
    the elements (worker ``w`` of ``W`` takes elements, or a stream's shards, ``w, w+W,
    ...``), the finished batches taken from the workers in turn. The batches depend on
    ``(seed, process count, worker count)`` and on nothing else; 0 and 1 workers give the
    same batches. The state is grain's (each worker's packing position) plus the running
    counters."""

    def __init__(self, dataset: grain.MapDataset | grain.IterDataset,
                 converter: FeatureConverter, batch_rows: int, *, worker_count: int = 0,
                 read_threads: int = 2, prefetch: int = 32, worker_buffer: int = WORKER_BUFFER,
                 config: Mapping[str, Any] | None = None):
        self.converter, self.batch_rows = converter, batch_rows
        self.config = {**(config or {}), "worker_count": worker_count}
        iter_ds = dataset if isinstance(dataset, grain.IterDataset) else dataset.to_iter_dataset(
            grain.ReadOptions(num_threads=read_threads, prefetch_buffer_size=prefetch))
        batches: grain.IterDataset = PackedBatches(iter_ds, converter, batch_rows)
        if worker_count > 0:
            _mark_flags_parsed()
            batches = batches.mp_prefetch(grain.MultiprocessingOptions(
                num_workers=worker_count, per_worker_buffer_size=worker_buffer))
        self._parent = iter(batches)
        self._stats: collections.Counter = collections.Counter()
        self._bad_first = no_bad_lines()      # a stream's first bad lines

    def __iter__(self) -> BatchIterator:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        element = next(self._parent)
        self._stats.update(element["stats"])
        if "bad" in element:
            merge_first_bad_lines(self._bad_first, element["bad"])
        return element["batch"]

    def get_state(self) -> dict[str, Any]:
        """JSON-serialisable position; ``set_state`` of it resumes with the same batches."""
        return {"version": STATE_VERSION, "parent": self._parent.get_state(),
                "stats": dict(self._stats), "config": self.config,
                "bad_first": merge_first_bad_lines(no_bad_lines(), self._bad_first)}

    def set_state(self, state: Mapping[str, Any]) -> None:
        version = state.get("version")
        if version not in (1, STATE_VERSION):
            raise ValueError(f"unsupported pipeline state version {version}")
        saved = state.get("config", {})
        for key in ("seed", "process_count", "process_index", "batch_rows", "worker_count"):
            if key in saved and key in self.config and saved[key] != self.config[key]:
                why = ("packing makes per-process consumption data-dependent, so a state cannot "
                       "be re-sharded; keep the process count or start a fresh iterator"
                       if key == "process_count" else "the state belongs to another pipeline")
                raise ValueError(f"cannot resume: {key} was {saved[key]}, now "
                                 f"{self.config[key]} ({why})")
        parent = state["parent"]
        if version == 1:  # packed in this process: the same position, one level up
            if self.config["worker_count"]:
                raise ValueError("cannot resume a data state saved before the workers packed "
                                 "batches (state version 1) with worker processes: resume "
                                 "with worker_count=0, or start a fresh iterator")
            parent = {"parent": parent, "position": state["position"],
                      "counted": state["counted"]}
        self._parent.set_state(parent)
        self._stats = collections.Counter(state["stats"])
        self._bad_first = merge_first_bad_lines(no_bad_lines(),
                                                state.get("bad_first") or no_bad_lines())

    @property
    def stats(self) -> dict[str, Any]:
        """Documents read, examples emitted, skipped by reason, truncations, packing efficiency."""
        s = self._stats
        efficiency = {key.split("/", 1)[1]: s[key] / max(s[f"slots/{key.split('/', 1)[1]}"], 1)
                      for key in s if key.startswith("tokens/")}
        return {
            "documents": s["documents"],
            "examples": s["examples"],
            "skipped": {k.split("/", 1)[1]: v for k, v in s.items() if k.startswith("skipped/")},
            "truncated": s["truncated"],
            "truncated_tokens": s["truncated_tokens"],
            "batches": s["batches"],
            "packing_efficiency": efficiency,
            "bad_lines": {k.split("/", 1)[1]: v for k, v in s.items() if k.startswith("bad/")},
        }

    def bad_lines(self) -> dict[str, Any]:
        """A stream's bad lines met so far: ``counts`` by reason, the ``first`` of each
        (``"file:line: why"``) and the ``earliest``; empty for random-access sources."""
        return {"counts": self.stats["bad_lines"], **self._bad_first}


def _local_rows(batch_size: int, process_count: int) -> int:
    """This process's rows of a global batch (both checked: a batch of 0 rows would train
    on nothing, with a loss of 0)."""
    if batch_size < 1:
        raise ConfigError(f"the batch size must be at least 1 row, got {batch_size}: set "
                          "BATCH_SIZE (--gin.BATCH_SIZE=16)")
    if batch_size % process_count:
        raise ConfigError(f"global batch_size {batch_size} not divisible by {process_count} "
                          "processes: make BATCH_SIZE a multiple of it")
    return batch_size // process_count


def _process(process_index: int | None, process_count: int | None) -> tuple[int, int]:
    if process_index is None or process_count is None:
        import jax

        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
    return process_index, process_count


def make_pipeline(source: RandomAccessSource, preprocess_fn: PreprocessFn,
                  converter: FeatureConverter, batch_size: int, seed: int, shuffle: bool = True,
                  num_epochs: int | None = None, process_index: int | None = None,
                  process_count: int | None = None, worker_count: int = 0, *,
                  read_threads: int = 2, prefetch: int = 32, strict: bool = False
                  ) -> BatchIterator:
    """Batches of ``batch_size // process_count`` rows (this process's slice of the global batch).

    ``preprocess_fn(record, seed)`` returns an example dict, a list of them, or None;
    ``seed`` is ``(seed, epoch, record index)``. ``num_epochs=None`` repeats forever.
    """
    process_index, process_count = _process(process_index, process_count)
    rows = _local_rows(batch_size, process_count)
    if stream_of(source) is not None:
        dataset = stream_of(source).dataset(
            seed, shuffle=shuffle, num_epochs=num_epochs, process_index=process_index,
            process_count=process_count, worker_count=worker_count
        ).map(_StreamPreprocess(preprocess_fn, converter, (int(seed),), strict))
    else:
        dataset = processed_dataset(source, preprocess_fn, converter, seed, shuffle=shuffle,
                                    num_epochs=num_epochs, process_index=process_index,
                                    process_count=process_count, strict=strict)
    config = {"seed": int(seed), "process_index": process_index, "process_count": process_count,
              "batch_rows": rows}
    return BatchIterator(dataset, converter, rows, worker_count=worker_count,
                         read_threads=read_threads, prefetch=prefetch, config=config)


def make_mixture_pipeline(components: Sequence[tuple[RandomAccessSource, PreprocessFn, float]],
                          converter: FeatureConverter, batch_size: int, seed: int, *,
                          shuffle: bool = True, process_index: int | None = None,
                          process_count: int | None = None, worker_count: int = 0,
                          read_threads: int = 2, prefetch: int = 32, strict: bool = False
                          ) -> BatchIterator:
    """Like ``make_pipeline`` over several (source, preprocess, rate) components, each repeated
    forever and interleaved deterministically in proportion to its rate (grain ``mix``)."""
    process_index, process_count = _process(process_index, process_count)
    if any(stream_of(src) is not None for src, _, _ in components):
        raise ConfigError("a mixture reads random-access sources; your files (TEXT_FILES) "
                          "stream: train on their task alone")
    datasets = [processed_dataset(src, fn, converter, seed + 7919 * i, shuffle=shuffle,
                                  process_index=process_index, process_count=process_count,
                                  seed_prefix=(int(seed), i), strict=strict)
                for i, (src, fn, _) in enumerate(components)]
    mixed = grain.MapDataset.mix(datasets, [rate for _, _, rate in components])
    rows = _local_rows(batch_size, process_count)
    config = {"seed": int(seed), "process_index": process_index, "process_count": process_count,
              "batch_rows": rows, "rates": [float(r) for _, _, r in components]}
    return BatchIterator(mixed, converter, rows, worker_count=worker_count,
                         read_threads=read_threads, prefetch=prefetch, config=config)


def take(iterator: Iterable[dict], n: int) -> list[dict]:
    """The next ``n`` batches (fewer at the end of a finite stream)."""
    out = []
    for batch in iterator:
        out.append(batch)
        if len(out) == n:
            break
    return out
