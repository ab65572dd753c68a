"""The unigram baseline of a held-out loss: what a model that knows only how often each
token is a target would score.

A pretraining's held-out perplexity means little without a floor: BERT Table 6 at CPU scale
reports masked-LM perplexities in the hundreds, which is learning only if the token
frequencies alone score worse. The baseline counts the targets (BERT: ``masked_ids``;
T5/GPT: ``decoder_target_tokens``, where their weights are non-zero) in training batches,
smooths them by adding one to every vocabulary entry, and scores the held-out batches'
targets with those frequencies: loss = mean over targets of -log p(token).
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping

import numpy as np

# (target ids, their weights) per batch format
TARGET_KEYS = (("masked_ids", "masked_weights"),
               ("decoder_target_tokens", "decoder_loss_weights"))
# training batches whose targets set an experiment's floor (`training_counts`)
TRAIN_BATCHES = 200


def targets(batch: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The batch's target ids and weights, flattened."""
    for ids, weights in TARGET_KEYS:
        if ids in batch:
            return np.asarray(batch[ids]).ravel(), np.asarray(batch[weights]).ravel()
    raise ValueError(f"a batch with none of {[k for k, _ in TARGET_KEYS]}: {sorted(batch)}")


def count_targets(batches: Iterable[Mapping[str, np.ndarray]], vocab_size: int,
                  max_batches: int | None = None) -> np.ndarray:
    """Counts [vocab_size] of the weighted target ids in up to `max_batches` batches."""
    counts = np.zeros(vocab_size, np.float64)
    for batch in itertools.islice(batches, max_batches):
        ids, weights = targets(batch)
        np.add.at(counts, ids, weights)
    return counts


def training_counts(exp) -> np.ndarray:
    """Counts [vocab_size] of the targets in the first TRAIN_BATCHES training batches of
    `exp` (a `t2t.run.experiment.Experiment`)."""
    return count_targets(exp.data(), exp.trainer.model.config.vocab_size, TRAIN_BATCHES)


def unigram_loss(counts: np.ndarray, batches: Iterable[Mapping[str, np.ndarray]]) -> float:
    """Mean -log p(target) over the batches' weighted targets, p = (count + 1) / (N + V)."""
    log_p = np.log(counts + 1.0) - math.log(counts.sum() + counts.size)
    total = weight = 0.0
    for batch in batches:
        ids, weights = targets(batch)
        total -= float(np.dot(log_p[ids], weights))
        weight += float(weights.sum())
    if not weight:
        raise ValueError("the held-out batches have no targets")
    return total / weight
