"""Deterministic, resumable, per-process input pipeline on grain.

    source ─► ShardedSource (this process's block) ─► grain.MapDataset: shuffle(seed)/epoch
      ─► repeat(num_epochs) ─► map_with_index(preprocess + converter.prepare, in threads or
      worker processes) ─► BatchIterator (first-fit packing into batch rows, finalize)

Randomness of an example's objective comes from ``(seed, [task,] epoch, record index)``, so it
does not depend on worker order, thread timing or the number of processes, and masks are
fresh every epoch (dynamic masking). A batch is the first-fit packing of consecutive
examples; it is emitted when the next example fits in none of its rows. The iterator state
is the grain read position of the element holding that next example plus its position in
the element's list, and the running stats: a resumed iterator re-reads one element, never
the stream. Resuming with another process count is refused: each process consumes a
data-dependent number of records per batch (packing), so the union of consumed records is
not a prefix of any re-sharded order; restart the epoch instead (or keep the count).
Bad records (InvalidRecord, SkipExample from a preprocessor or converter, and, unless
``strict``, any other exception in a preprocessor) are counted under ``skipped`` and dropped.
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
from t2t.errors import ConfigError

PreprocessFn = Callable[[Any, tuple[int, ...]], Any]  # (record, seed) -> dict | [dict] | None
STATE_VERSION = 1
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
        stats: collections.Counter = collections.Counter(documents=1)
        examples: list = []
        try:
            if isinstance(record, InvalidRecord):
                raise SkipExample(record.reason)
            seed = (*self.seed_prefix, index // self.epoch_length, record_index)
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
                _log.warning("preprocessing record %d failed; skipped", record_index, exc_info=True)
            stats["skipped/error"] += 1
        return {"examples": examples, "stats": dict(stats)}


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


class BatchIterator:
    """Process-local numpy batches; ``get_state``/``set_state`` are JSON-serialisable."""

    def __init__(self, dataset: grain.MapDataset, converter: FeatureConverter, batch_rows: int, *,
                 worker_count: int = 0, read_threads: int = 2, prefetch: int = 32,
                 config: Mapping[str, Any] | None = None):
        self.converter, self.batch_rows = converter, batch_rows
        self.config = {**(config or {}), "worker_count": worker_count}
        iter_ds = dataset.to_iter_dataset(
            grain.ReadOptions(num_threads=read_threads, prefetch_buffer_size=prefetch))
        if worker_count > 0:
            _mark_flags_parsed()
            iter_ds = iter_ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=worker_count))
        self._parent = iter(iter_ds)
        self._stats: collections.Counter = collections.Counter()
        self._current: list | None = None  # examples of the element being consumed
        self._current_state: Any = None  # parent state just before that element
        self._position = 0
        self._resume_position = 0
        self._resume_counted = False

    def __iter__(self) -> BatchIterator:
        return self

    def _pull(self) -> bool:
        """Reads the next element; False at the end of the stream."""
        state = self._parent.get_state()
        try:
            element = next(self._parent)
        except StopIteration:
            self._current = None
            return False
        self._current, self._current_state = element["examples"], state
        self._position, self._resume_position = self._resume_position, 0
        if self._resume_counted:  # its stats are already in the restored counters
            self._resume_counted = False
        else:
            self._stats.update(element["stats"])
        return True

    def __next__(self) -> dict[str, np.ndarray]:
        packer = self.converter.new_packer(self.batch_rows)
        barren = 0                        # records in a row that gave no example
        while True:
            if self._current is None or self._position >= len(self._current):
                if not self._pull():
                    if packer.is_empty:
                        raise StopIteration
                    break
                barren = barren + 1 if not self._current else 0
                if barren == MAX_BARREN_RECORDS:
                    skipped = {k: v for k, v in self._stats.items() if k.startswith("skipped/")}
                    raise ConfigError(f"{barren} records in a row gave no example (counts so "
                                     f"far: {skipped}); do the feature lengths "
                                     f"{self.converter.lengths} fit this task?")
                continue
            packable, cut = self._current[self._position]
            if not packer.add(packable):
                break  # the batch is full: this example starts the next one
            self._position += 1
            self._stats["examples"] += 1
            if cut:
                self._stats["truncated"] += 1
                self._stats["truncated_tokens"] += cut
        self._stats["batches"] += 1
        for key, (tokens, slots) in packer.token_counts().items():
            self._stats[f"tokens/{key}"] += tokens
            self._stats[f"slots/{key}"] += slots
        return self.converter.finalize(packer.rows(self.batch_rows))

    def get_state(self) -> dict[str, Any]:
        """JSON-serialisable position; ``set_state`` of it resumes with the same batches."""
        if self._current is not None and self._position < len(self._current):
            parent, position, counted = self._current_state, self._position, True
        else:
            parent, position, counted = self._parent.get_state(), 0, False
        return {"version": STATE_VERSION, "parent": parent, "position": position,
                "counted": counted, "stats": dict(self._stats), "config": self.config}

    def set_state(self, state: Mapping[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"unsupported pipeline state version {state.get('version')}")
        saved = state.get("config", {})
        for key in ("seed", "process_count", "process_index", "batch_rows", "worker_count"):
            if key in saved and key in self.config and saved[key] != self.config[key]:
                why = ("packing makes per-process consumption data-dependent, so a state cannot "
                       "be re-sharded; keep the process count or start a fresh iterator"
                       if key == "process_count" else "the state belongs to another pipeline")
                raise ValueError(f"cannot resume: {key} was {saved[key]}, now "
                                 f"{self.config[key]} ({why})")
        self._parent.set_state(state["parent"])
        self._current = None
        self._resume_position = int(state["position"])
        self._resume_counted = bool(state["counted"])
        self._stats = collections.Counter(state["stats"])

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
        }


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
    dataset = processed_dataset(source, preprocess_fn, converter, seed, shuffle=shuffle,
                                num_epochs=num_epochs, process_index=process_index,
                                process_count=process_count, strict=strict)
    rows = _local_rows(batch_size, process_count)
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
