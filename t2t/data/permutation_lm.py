"""XLNet's permutation language modelling, data side (Yang et al. 2019).

For a segment x of n tokens, sample a factorization order z uniformly from the n!
permutations (§2.2, eq. 3) and predict only the last n/K of z (partial prediction, §2.3,
eq. 5: with cut point c, the targets are z_{>c}, K ≈ n / (n - c)); each target is
predicted from the tokens before it in z. The tokens stay in their natural positions; the
order only decides the attention masks, which the model builds from each position's rank
in z (`t2t.nn.two_stream`). Targets are listed by position.

Segments are consecutive windows of a document's token stream; each example also carries
the window before it as `memory_tokens` (Transformer-XL segment recurrence, §2.4), so the
first window of a document serves only as memory. The window is split at a random point
into segment A (type 0) and segment B (type 1) for the relative segment encoding (§2.5);
B always continues A (XLNet drops next-sentence prediction, §3.3 ablation).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from t2t.data import preprocessors as prep
from t2t.data.converters import FeatureConverter, trim
from t2t.data.preprocessors import SkipExample
from t2t.data.vocab import word_pieces

MEMORY_KEY = "memory_tokens"


def ranks_of(order: np.ndarray) -> np.ndarray:
    """Factorization order (positions, first predicted first) -> each position's rank."""
    order = np.asarray(order)
    ranks = np.empty_like(order)
    ranks[order] = np.arange(len(order), dtype=order.dtype)
    return ranks


def num_predictions(length: int, k: float) -> int:
    """n - c for K = n / (n - c), rounded, at least 1 and leaving at least 1 token of
    context (a target first in z would see nothing)."""
    if k <= 1:
        raise ValueError(f"partial prediction needs K > 1 (K = {k})")
    if length < 2:
        raise ValueError(f"a segment of {length} token(s) has nothing to predict from")
    return int(min(max(round(length / k), 1), length - 1))


def permutation_targets(tokens: Sequence[int], rng: np.random.Generator, k: float
                        ) -> dict[str, np.ndarray]:
    """One sampled order over `tokens`: `factorization_ranks` [n] (rank of each position in
    z), `masked_positions` [p] (the last p = n/K positions of z, ascending) and their
    `masked_ids`. The full order is `np.argsort(factorization_ranks)`."""
    tokens = np.asarray(tokens, np.int32)
    n = len(tokens)
    order = rng.permutation(n).astype(np.int32)
    targets = np.sort(order[n - num_predictions(n, k):])
    return {"factorization_ranks": ranks_of(order), "masked_positions": targets,
            "masked_ids": tokens[targets]}


def windows(tokens: Sequence[int], length: int, memory_length: int
            ) -> list[tuple[np.ndarray, np.ndarray]]:
    """(memory, window) pairs over a token stream: windows of `length` tokens (the last one
    may be shorter), each with the `memory_length` tokens right before it; the first window
    has no memory and is not returned."""
    tokens = np.asarray(tokens, np.int32)
    if not 0 < memory_length <= length:
        raise ValueError(f"memory length must be in 1..{length} (the window), "
                         f"got {memory_length}")
    starts = range(length, len(tokens), length)
    return [(tokens[s - memory_length:s], tokens[s:s + length]) for s in starts
            if len(tokens) - s >= 2]


def permutation_lm_example(memory: np.ndarray, window: np.ndarray, rng: np.random.Generator,
                           k: float) -> dict[str, np.ndarray]:
    """A window -> its features: `inputs`, `token_type_ids` (A = 0 up to a random cut in
    1..n-1, B = 1 after), `memory_tokens` and `permutation_targets`."""
    n = len(window)
    cut = int(rng.integers(1, n))
    types = (np.arange(n) >= cut).astype(np.int32)
    return {"inputs": np.asarray(window, np.int32), "token_type_ids": types,
            MEMORY_KEY: np.asarray(memory, np.int32), **permutation_targets(window, rng, k)}


class PermutationLm:
    """A task preprocessor: a record of sentences -> permutation-LM examples.

    The record's `sentences_key` sentences are tokenized (`vocabulary.tokenize_words`,
    WordPiece without [CLS]/[SEP]) into one stream, cut into windows of
    `sequence_length["inputs"]` tokens with `sequence_length["memory"]` tokens of memory,
    and each window gets a fresh order from `seed` (a new one every epoch).
    """

    def __init__(self, k: float = 6.0, sentences_key: str = "verses"):
        self.k, self.sentences_key = k, sentences_key

    def __call__(self, record: dict, *, seed, vocabulary: Any, sequence_length: dict[str, int]
                 ) -> list[dict]:
        stream = [t for ids, _ in word_pieces(vocabulary, record[self.sentences_key])
                  for t in ids]
        rng = prep.make_rng(seed)
        return [permutation_lm_example(memory, window, rng, self.k)
                for memory, window in windows(stream, sequence_length["inputs"],
                                              sequence_length["memory"])]


class PermutationLmConverter(FeatureConverter):
    """Permutation-LM examples -> `XLNetPretrainingModel` features; lengths
    ``{"inputs": L, "memory": M, "max_predictions": P}``, one example per row (no packing:
    a row is one window of a document with the window before it as memory).

    Features [batch, L]: `encoder_input_tokens`, `token_type_ids`, `encoder_segment_ids`
    (1 = token, 0 = padding), `factorization_ranks` (padding ranks after every token);
    [batch, M] `memory_tokens`; [batch, P] `masked_positions`, `masked_ids`,
    `masked_weights` (float).
    """

    def __init__(self, lengths, pack: bool = False):
        if pack:
            raise ValueError("PermutationLmConverter does not pack (a row is one window "
                             "with its memory); pass pack=False")
        super().__init__(lengths, pack=False)
        length = self.lengths["inputs"]
        self.packed_lengths = {"inputs": length, "token_type_ids": length,
                               "factorization_ranks": length,
                               MEMORY_KEY: self.lengths["memory"],
                               "masked_positions": self.lengths["max_predictions"],
                               "masked_ids": self.lengths["max_predictions"]}

    def prepare(self, example):
        length, memory = self.lengths["inputs"], self.lengths["memory"]
        tokens = np.asarray(example["inputs"], np.int32)
        if len(tokens) > length or len(example[MEMORY_KEY]) != memory:
            raise SkipExample(f"window of {len(tokens)} tokens / memory of "
                              f"{len(example[MEMORY_KEY])}; the lengths are {length} / {memory}")
        positions, cut = trim(example["masked_positions"], self.lengths["max_predictions"])
        out = {"inputs": tokens, "token_type_ids": np.asarray(example["token_type_ids"], np.int32),
               "factorization_ranks": np.asarray(example["factorization_ranks"], np.int32),
               MEMORY_KEY: np.asarray(example[MEMORY_KEY], np.int32),
               "masked_positions": positions,
               "masked_ids": np.asarray(example["masked_ids"], np.int32)[:len(positions)]}
        return out, cut

    def finalize(self, rows):
        seg = rows["inputs_segment_ids"]
        length = seg.shape[1]
        ranks = np.where(seg > 0, rows["factorization_ranks"], length + np.arange(length))
        real = rows["masked_positions_segment_ids"] > 0
        return {"encoder_input_tokens": rows["inputs"], "token_type_ids": rows["token_type_ids"],
                "encoder_segment_ids": seg, "factorization_ranks": ranks.astype(np.int32),
                MEMORY_KEY: rows[MEMORY_KEY],
                "masked_positions": np.where(real, rows["masked_positions"], 0).astype(np.int32),
                "masked_ids": np.where(real, rows["masked_ids"], 0).astype(np.int32),
                "masked_weights": real.astype(np.float32)}

