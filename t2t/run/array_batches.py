"""`ArrayBatches`: endless, seeded-shuffled batches over in-memory feature arrays (the
fine-tuning input of the classifier experiments, `t2t.run.classifier_experiments`), whose
position `get_state`/`set_state` save and resume exactly."""
from __future__ import annotations

from typing import Dict, Mapping

import numpy as np


class ArrayBatches:
    """Endless seeded-shuffled batches over in-memory feature arrays (one permutation per
    epoch, batches run across epoch ends); `get_state`/`set_state` resume exactly."""

    def __init__(self, features: Mapping[str, np.ndarray], batch_size: int, seed: int,
                 shuffle: bool = True, process_index: int = 0, process_count: int = 1):
        self.features, self.seed, self.shuffle = dict(features), seed, shuffle
        self.size = len(next(iter(self.features.values())))
        rows = batch_size // process_count
        self.rows = slice(process_index * rows, (process_index + 1) * rows)
        self.batch_size, self.position = batch_size, 0

    def _order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.size)
        return np.random.default_rng((self.seed, epoch)).permutation(self.size)

    def __iter__(self):
        return self

    def __next__(self) -> Dict[str, np.ndarray]:
        positions = np.arange(self.position, self.position + self.batch_size)[self.rows]
        self.position += self.batch_size
        epochs, offsets = np.divmod(positions, self.size)
        index = np.array([self._order(e)[o] for e, o in zip(epochs, offsets)])
        return {k: v[index] for k, v in self.features.items()}

    def get_state(self) -> Dict[str, int]:
        return {"position": int(self.position), "seed": self.seed}

    def set_state(self, state: Mapping[str, int]) -> None:
        self.position = int(state["position"])

