"""Greedy first-fit packing of variable-length examples into fixed-length rows.

An example is a dict of 1-D int arrays (``{"inputs": [n], "targets": [m]}``); all its
features go into the same row, each after the previous occupant, so a row holds several
examples. For each packed feature ``k`` the packer emits ``k`` [rows, length],
``k_segment_ids`` (1, 2, 3... per example in the row, 0 = padding) and ``k_positions``
(restarting at 0 per example). ``max_examples_per_row=1`` gives plain padding, so packed
and unpacked batches share one code path. Examples must already be trimmed to the lengths.

grain's ``experimental.FirstFitPackIterDataset`` packs the same way, but it emits rows one
by one from a window of bins (a batch may mix windows), so the pipeline could not put its
skip/truncation counters and the one-element resume position into one batch-aligned state;
this small packer runs inside ``pipeline.PackedBatches`` instead (in each worker process),
one batch = one window.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


class FirstFitPacker:
    """Packs examples into ``num_rows`` rows; ``add`` returns False when no row has room."""

    def __init__(self, lengths: Mapping[str, int], num_rows: int, *,
                 max_examples_per_row: int | None = None, scalar_keys: Sequence[str] = ()):
        self.lengths = dict(lengths)
        self.num_rows = num_rows
        self.max_examples_per_row = max_examples_per_row
        self.scalar_keys = tuple(scalar_keys)
        self._capacity = np.array(list(self.lengths.values()), dtype=np.int64)  # [features]
        self._fill = np.zeros((len(self.lengths), num_rows), dtype=np.int64)  # [features, rows]
        self._count = np.zeros(num_rows, dtype=np.int32)  # [rows]
        self._values = {k: np.zeros((num_rows, n), np.int32) for k, n in self.lengths.items()}
        self._segments = {k: np.zeros((num_rows, n), np.int32) for k, n in self.lengths.items()}
        self._positions = {k: np.zeros((num_rows, n), np.int32) for k, n in self.lengths.items()}
        self._scalars = {k: np.zeros(num_rows, np.int32) for k in self.scalar_keys}

    @property
    def num_examples(self) -> int:
        return int(self._count.sum())

    @property
    def is_empty(self) -> bool:
        return self.num_examples == 0

    def _sizes(self, example: Mapping[str, np.ndarray]) -> np.ndarray:
        sizes = np.array([len(example[k]) for k in self.lengths], dtype=np.int64)
        if np.any(sizes > self._capacity):
            too_long = {k: int(s) for k, s in zip(self.lengths, sizes) if s > self.lengths[k]}
            raise ValueError(f"example longer than the row ({too_long} > {self.lengths}); "
                             "trim before packing")
        return sizes

    def find_row(self, example: Mapping[str, np.ndarray]) -> int:
        """The first row with room for every feature of ``example``, or -1."""
        fits = np.all(self._fill + self._sizes(example)[:, None] <= self._capacity[:, None], axis=0)
        if self.max_examples_per_row is not None:
            fits &= self._count < self.max_examples_per_row
        return int(np.argmax(fits)) if fits.any() else -1

    def add(self, example: Mapping[str, np.ndarray]) -> bool:
        """Puts ``example`` into the first row that fits; False if none does."""
        row = self.find_row(example)
        if row < 0:
            return False
        self._count[row] += 1
        segment = self._count[row]
        for f, key in enumerate(self.lengths):
            value = example[key]
            start = int(self._fill[f, row])
            end = start + len(value)
            self._values[key][row, start:end] = value
            self._segments[key][row, start:end] = segment
            self._positions[key][row, start:end] = np.arange(len(value), dtype=np.int32)
            self._fill[f, row] = end
        for key in self.scalar_keys:
            self._scalars[key][row] = example[key]
        return True

    def rows(self, num_rows: int | None = None) -> dict[str, np.ndarray]:
        """The packed arrays [rows, length]; ``num_rows`` rows (None: the non-empty ones)."""
        n = int(np.count_nonzero(self._count)) if num_rows is None else num_rows
        out: dict[str, np.ndarray] = {}
        for key in self.lengths:
            out[key] = self._values[key][:n]
            out[f"{key}_segment_ids"] = self._segments[key][:n]
            out[f"{key}_positions"] = self._positions[key][:n]
        for key in self.scalar_keys:
            out[key] = self._scalars[key][:n]
        return out

    def token_counts(self) -> dict[str, tuple[int, int]]:
        """Per feature (non-pad tokens, total slots) over all rows."""
        return {k: (int(self._fill[f].sum()), self.num_rows * self.lengths[k])
                for f, k in enumerate(self.lengths)}


def pack_examples(examples: Sequence[Mapping[str, np.ndarray]], lengths: Mapping[str, int], *,
                  max_examples_per_row: int | None = None, scalar_keys: Sequence[str] = (),
                  num_rows: int | None = None) -> dict[str, np.ndarray]:
    """Packs a list of (trimmed) examples with first fit into as few rows as it needs."""
    packer = FirstFitPacker(lengths, max(len(examples), num_rows or 0, 1),
                            max_examples_per_row=max_examples_per_row, scalar_keys=scalar_keys)
    for example in examples:
        if not packer.add(example):  # cannot happen: there are as many rows as examples
            raise AssertionError("first-fit packing failed")
    if num_rows is not None and np.count_nonzero(packer._count) > num_rows:
        raise ValueError(f"{len(examples)} examples need more than {num_rows} rows")
    return packer.rows(num_rows)


def packing_efficiency(segment_ids: np.ndarray) -> float:
    """Fraction of non-padding slots in a [rows, length] segment-id array."""
    return float(np.count_nonzero(segment_ids)) / max(segment_ids.size, 1)
