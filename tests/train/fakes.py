"""A small resumable, shardable data iterator for trainer tests (no tokenizer needed)."""
import numpy as np

from t2t.data.converters import EncDecConverter


class RandomCopyData:
    """Batches of an enc-dec 'copy the inputs' task, deterministic in (seed, batch index).

    Process p of n gets rows [p*B/n, (p+1)*B/n) of each global batch, so any process count
    sees the same global batches.
    """

    def __init__(self, batch_size=8, length=12, vocab=60, seed=0, process_index=0,
                 process_count=1):
        self.batch_size, self.length, self.vocab, self.seed = batch_size, length, vocab, seed
        self.rows = slice(process_index * batch_size // process_count,
                          (process_index + 1) * batch_size // process_count)
        self.converter = EncDecConverter({"inputs": length, "targets": length}, pack=False)
        self.index = 0

    def global_batch(self, index):
        rng = np.random.default_rng([self.seed, index])
        examples = []
        for _ in range(self.batch_size):
            n = int(rng.integers(3, self.length))
            tokens = rng.integers(2, self.vocab, n).astype(np.int32)
            examples.append({"inputs": tokens, "targets": tokens})
        return self.converter(examples, num_rows=self.batch_size)

    def __iter__(self):
        return self

    def __next__(self):
        batch = self.global_batch(self.index)
        self.index += 1
        return {k: v[self.rows] for k, v in batch.items()}

    def get_state(self):
        return {"index": self.index}

    def set_state(self, state):
        self.index = int(state["index"])
