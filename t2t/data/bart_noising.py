"""BART's document noising (Lewis et al. 2020, sec. 2.2 and Table 1) as t2t objectives.

Each objective corrupts a document's token ids; the targets are always the original
document (the encoder-decoder reconstructs it), EOS appended to both as the T5 objectives:

- **token masking**: ``ceil(mask_ratio * n)`` tokens chosen uniformly without replacement
  each become the mask token (BERT's [MASK], no random or kept tokens);
- **token deletion**: the same number of tokens deleted; the model must find where;
- **text infilling**: span lengths drawn from Poisson(λ) until they cover
  ``ceil(mask_ratio * n)`` tokens (the last length cut to fit), each span, length 0
  included, replaced by ONE mask token (a 0-length span inserts one); the spans (a random
  order of the lengths) are laid uniformly among the unmasked tokens, so they never
  overlap and exactly ``ceil(mask_ratio * n)`` tokens are masked by exactly as many mask
  tokens as spans were drawn;
- **sentence permutation**: the document split after each run of sentence-end tokens
  (full stops and their like, `sentence_end_ids`), the sentences shuffled;
- **document rotation**: a token chosen uniformly, the document rotated to begin there;
- **text infilling + sentence permutation**: sentences shuffled, then infilled (bart-large).

Defaults are the paper's: 30% of tokens masked, λ = 3 (fairseq's ``--mask 0.3
--mask-length span-poisson --replace-length 1 --poisson-lambda 3``). Where fairseq's
``DenoisingDataset`` differs from the paper's description we follow the paper: spans start
at uniformly laid positions and never overlap (fairseq picks span starts independently, so
overlapping spans merge under one mask and mask fewer than 30%), and every mask is [MASK]
(the bart-large command in fairseq issue 1899 also uses λ = 3.5 and 10% random tokens).
Spans count words when `word_starts` is given (fairseq's whole-word spans), else tokens.
Every function is deterministic in its ``seed`` (see `t2t.data.preprocessors.make_rng`).
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from t2t.data.preprocessors import Seed, append_eos, make_rng
from t2t.errors import ConfigError

MASK_RATIO = 0.3
POISSON_LAMBDA = 3.0
SENTENCE_END_CHARACTERS = (".", "!", "?")
_CLOSING = "\"'”’)]»"  # closing quotes and brackets after a full stop


def _as_tokens(tokens: Any) -> np.ndarray:
    return np.asarray(tokens, dtype=np.int32).reshape(-1)


def _check_ratio(mask_ratio: float) -> None:
    if not 0.0 <= mask_ratio <= 1.0:
        raise ConfigError(f"mask_ratio {mask_ratio} is not a fraction: give one in [0, 1] "
                          f"(BART masks {MASK_RATIO})")


def num_to_mask(num_units: int, mask_ratio: float = MASK_RATIO) -> int:
    """How many tokens (or words) a document of ``num_units`` loses: ``ceil(ratio * n)``."""
    _check_ratio(mask_ratio)
    return min(num_units, math.ceil(num_units * mask_ratio - 1e-9))


# ----------------------------------------------------------------------------- token level


def mask_tokens(tokens: Any, rng: np.random.Generator, *, mask_id: int,
                mask_ratio: float = MASK_RATIO) -> np.ndarray:
    """Token masking: ``num_to_mask(n)`` uniformly chosen tokens become ``mask_id``."""
    tokens = _as_tokens(tokens).copy()
    chosen = rng.choice(len(tokens), size=num_to_mask(len(tokens), mask_ratio), replace=False)
    tokens[chosen] = mask_id
    return tokens


def delete_tokens(tokens: Any, rng: np.random.Generator, *,
                  mask_ratio: float = MASK_RATIO) -> np.ndarray:
    """Token deletion: ``num_to_mask(n)`` uniformly chosen tokens removed."""
    tokens = _as_tokens(tokens)
    chosen = rng.choice(len(tokens), size=num_to_mask(len(tokens), mask_ratio), replace=False)
    return np.delete(tokens, chosen)


def rotate_document(tokens: Any, rng: np.random.Generator) -> np.ndarray:
    """Document rotation: starts at a uniformly chosen token (the first one included)."""
    tokens = _as_tokens(tokens)
    if len(tokens) == 0:
        return tokens
    start = int(rng.integers(len(tokens)))
    return np.concatenate([tokens[start:], tokens[:start]])


# ----------------------------------------------------------------------------- sentences


def sentence_bounds(tokens: Any, sentence_end_ids: Sequence[int]) -> np.ndarray:
    """Sentence start offsets and the end, ``[0, ..., n]``: a sentence ends after a run of
    sentence-end tokens (``?"`` ends one sentence); text after the last end is a sentence."""
    tokens = _as_tokens(tokens)
    is_end = np.isin(tokens, np.asarray(list(sentence_end_ids), dtype=np.int32))
    next_is_end = np.append(is_end[1:], False)
    cuts = np.flatnonzero(is_end & ~next_is_end) + 1
    cuts = cuts[cuts < len(tokens)]
    return np.concatenate([[0], cuts, [len(tokens)]]).astype(np.int64)


def split_sentences(tokens: Any, sentence_end_ids: Sequence[int]) -> list[np.ndarray]:
    """The document's sentences (see `sentence_bounds`); none for an empty document."""
    tokens = _as_tokens(tokens)
    bounds = sentence_bounds(tokens, sentence_end_ids)
    return [tokens[a:b] for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def permute_sentences(tokens: Any, rng: np.random.Generator, *,
                      sentence_end_ids: Sequence[int]) -> np.ndarray:
    """Sentence permutation: the document's sentences in a uniformly random order."""
    sentences = split_sentences(tokens, sentence_end_ids)
    if len(sentences) < 2:
        return _as_tokens(tokens)
    return np.concatenate([sentences[i] for i in rng.permutation(len(sentences))])


# ----------------------------------------------------------------------------- text infilling


def poisson_span_lengths(rng: np.random.Generator, budget: int,
                         poisson_lambda: float = POISSON_LAMBDA) -> np.ndarray:
    """Span lengths from Poisson(λ), drawn until they sum to at least ``budget``; the last is
    cut so they sum to exactly ``budget`` (it stays >= 1). Zeros are kept: each is a span
    that inserts a mask token. Empty for a budget of 0."""
    if poisson_lambda <= 0:
        raise ConfigError(f"poisson_lambda {poisson_lambda} must be positive "
                          f"(BART's span lengths use λ = {POISSON_LAMBDA})")
    drawn = np.zeros(0, dtype=np.int64)
    while drawn.sum() < budget:
        drawn = np.concatenate([drawn, rng.poisson(poisson_lambda, size=max(budget, 1))])
    if budget == 0:
        return drawn[:0]
    total = np.cumsum(drawn)
    last = int(np.argmax(total >= budget))
    lengths = drawn[:last + 1].copy()
    lengths[last] = budget - (total[last - 1] if last else 0)
    return lengths


def sample_infilling_spans(num_units: int, rng: np.random.Generator, *,
                           mask_ratio: float = MASK_RATIO,
                           poisson_lambda: float = POISSON_LAMBDA
                           ) -> tuple[np.ndarray, np.ndarray]:
    """Text infilling's spans over ``num_units`` tokens (or words): ``(starts, lengths)``,
    sorted by start, lengths summing to ``num_to_mask(num_units)``; a 0-length span at
    ``start`` inserts its mask before unit ``start`` (``num_units``: at the end).

    The spans, in a random order, are laid uniformly among the unmasked units: which of
    the ``unmasked + spans`` slots hold a span is a uniform choice, so spans never overlap
    (two may touch: each keeps its own mask).
    """
    lengths = rng.permutation(poisson_span_lengths(rng, num_to_mask(num_units, mask_ratio),
                                                   poisson_lambda))
    unmasked = num_units - int(lengths.sum())
    slots = np.sort(rng.choice(unmasked + len(lengths), size=len(lengths), replace=False))
    # before the j-th span's slot lie (slot - j) unmasked units and the spans before it
    starts = slots - np.arange(len(lengths)) + np.concatenate([[0], np.cumsum(lengths)[:-1]])
    return starts.astype(np.int64), lengths.astype(np.int64)


def _unit_of_token(num_tokens: int, word_starts: Any) -> tuple[np.ndarray, int]:
    """Each token's unit (word) index and the number of units; a token is its own unit
    when ``word_starts`` is None. The first token always starts a word."""
    if word_starts is None:
        return np.arange(num_tokens), num_tokens
    starts = np.asarray(word_starts, dtype=bool).reshape(-1)
    if len(starts) != num_tokens:
        raise ValueError(f"word_starts has {len(starts)} entries for {num_tokens} tokens")
    starts = starts.copy()
    starts[:1] = True
    units = np.cumsum(starts) - 1
    return units, int(units[-1]) + 1 if num_tokens else 0


def infill_spans(tokens: Any, starts: Any, lengths: Any, *, mask_id: int,
                 word_starts: Any = None) -> np.ndarray:
    """Replaces each span (``starts``/``lengths`` in units: tokens, or words with
    ``word_starts``) by one ``mask_id``; a 0-length span inserts one before its start."""
    tokens = _as_tokens(tokens)
    starts, lengths = np.asarray(starts, np.int64), np.asarray(lengths, np.int64)
    unit, num_units = _unit_of_token(len(tokens), word_starts)
    masked_unit = np.zeros(num_units + 1, dtype=bool)
    covered = np.repeat(starts, lengths) + (np.arange(lengths.sum())
                                            - np.repeat(np.cumsum(lengths) - lengths, lengths))
    masked_unit[covered] = True
    kept = ~masked_unit[unit]
    # order: a span's mask sorts just before the first unit it covers (key 2u vs 2u + 1)
    keys = np.concatenate([2 * unit[kept] + 1, 2 * starts])
    values = np.concatenate([tokens[kept], np.full(len(starts), mask_id, np.int32)])
    return values[np.argsort(keys, kind="stable")].astype(np.int32)


def infill_text(tokens: Any, rng: np.random.Generator, *, mask_id: int,
                mask_ratio: float = MASK_RATIO, poisson_lambda: float = POISSON_LAMBDA,
                word_starts: Any = None) -> np.ndarray:
    """Text infilling: `sample_infilling_spans` then `infill_spans`."""
    tokens = _as_tokens(tokens)
    _, num_units = _unit_of_token(len(tokens), word_starts)
    starts, lengths = sample_infilling_spans(num_units, rng, mask_ratio=mask_ratio,
                                             poisson_lambda=poisson_lambda)
    return infill_spans(tokens, starts, lengths, mask_id=mask_id, word_starts=word_starts)


# ----------------------------------------------------------------------------- objectives

Noiser = Callable[[np.ndarray, np.random.Generator], np.ndarray]


def corrupt(tokens: Any, seed: Seed, noisers: Sequence[Noiser], *,
            eos_id: int | None = 1) -> dict[str, np.ndarray]:
    """``inputs`` = the noisers applied in order (one generator), ``targets`` = the original
    document; EOS appended to both."""
    tokens = _as_tokens(tokens)
    rng = make_rng(seed)
    inputs = tokens
    for noise in noisers:
        inputs = noise(inputs, rng)
    return {"inputs": append_eos(inputs, eos_id), "targets": append_eos(tokens, eos_id)}


def token_masking(tokens: Any, *, seed: Seed, mask_id: int, mask_ratio: float = MASK_RATIO,
                  eos_id: int | None = 1) -> dict[str, np.ndarray]:
    """BART token masking (Table 1): 30% of tokens -> [MASK]; targets the document."""
    return corrupt(tokens, seed, [functools.partial(mask_tokens, mask_id=mask_id,
                                                    mask_ratio=mask_ratio)], eos_id=eos_id)


def token_deletion(tokens: Any, *, seed: Seed, mask_ratio: float = MASK_RATIO,
                   eos_id: int | None = 1) -> dict[str, np.ndarray]:
    """BART token deletion: 30% of tokens deleted; targets the document."""
    return corrupt(tokens, seed, [functools.partial(delete_tokens, mask_ratio=mask_ratio)],
                   eos_id=eos_id)


def text_infilling(tokens: Any, *, seed: Seed, mask_id: int, mask_ratio: float = MASK_RATIO,
                   poisson_lambda: float = POISSON_LAMBDA, word_starts: Any = None,
                   eos_id: int | None = 1) -> dict[str, np.ndarray]:
    """BART text infilling: Poisson(3) spans over 30% of tokens, one [MASK] per span."""
    return corrupt(tokens, seed, [functools.partial(
        infill_text, mask_id=mask_id, mask_ratio=mask_ratio, poisson_lambda=poisson_lambda,
        word_starts=word_starts)], eos_id=eos_id)


def sentence_permutation(tokens: Any, *, seed: Seed, sentence_end_ids: Sequence[int],
                         eos_id: int | None = 1) -> dict[str, np.ndarray]:
    """BART sentence permutation: the sentences shuffled; targets the document."""
    return corrupt(tokens, seed, [functools.partial(permute_sentences,
                                                    sentence_end_ids=sentence_end_ids)],
                   eos_id=eos_id)


def document_rotation(tokens: Any, *, seed: Seed, eos_id: int | None = 1
                      ) -> dict[str, np.ndarray]:
    """BART document rotation: rotated to start at a uniform token; targets the document."""
    return corrupt(tokens, seed, [rotate_document], eos_id=eos_id)


def text_infilling_sentence_permutation(tokens: Any, *, seed: Seed, mask_id: int,
                                        sentence_end_ids: Sequence[int],
                                        mask_ratio: float = MASK_RATIO,
                                        poisson_lambda: float = POISSON_LAMBDA,
                                        eos_id: int | None = 1) -> dict[str, np.ndarray]:
    """bart-large's pretraining (sec. 5.1): sentences shuffled, then text infilling."""
    return corrupt(tokens, seed, [
        functools.partial(permute_sentences, sentence_end_ids=sentence_end_ids),
        functools.partial(infill_text, mask_id=mask_id, mask_ratio=mask_ratio,
                          poisson_lambda=poisson_lambda)], eos_id=eos_id)


# Objective gin names (configs/objectives/bart_*.gin) -> the function.
OBJECTIVES: dict[str, Callable[..., dict[str, np.ndarray]]] = {
    "bart_token_masking": token_masking,
    "bart_token_deletion": token_deletion,
    "bart_text_infilling": text_infilling,
    "bart_sentence_permutation": sentence_permutation,
    "bart_document_rotation": document_rotation,
    "bart_infilling_permutation": text_infilling_sentence_permutation,
}
_NEEDS = {"mask_id": ("bart_token_masking", "bart_text_infilling",
                      "bart_infilling_permutation"),
          "sentence_end_ids": ("bart_sentence_permutation", "bart_infilling_permutation")}


def objective(name: str, *, mask_id: int | None = None,
              sentence_end_ids: Sequence[int] = (), eos_id: int | None = 1
              ) -> Callable[[Any, Seed], dict[str, np.ndarray]]:
    """A BART objective ``fn(tokens, seed)`` by its gin name (`OBJECTIVES`), with the mask
    id and sentence-end ids it needs bound."""
    if name not in OBJECTIVES:
        raise ConfigError(f"unknown BART objective {name!r}: use one of {sorted(OBJECTIVES)}")
    kwargs: dict[str, Any] = {"eos_id": eos_id}
    if name in _NEEDS["mask_id"]:
        if mask_id is None:
            raise ConfigError(f"{name} replaces tokens with a mask token: give mask_id")
        kwargs["mask_id"] = int(mask_id)
    if name in _NEEDS["sentence_end_ids"]:
        if len(sentence_end_ids) == 0:
            raise ConfigError(f"{name} splits sentences after full stops, but no sentence-end "
                              "ids were given (no token of the vocabulary ends in '.', '!' "
                              "or '?'): give sentence_end_ids")
        kwargs["sentence_end_ids"] = tuple(int(i) for i in sentence_end_ids)
    return functools.partial(_seeded, OBJECTIVES[name], **kwargs)


def _seeded(fn, tokens, seed, **kwargs):
    return fn(tokens, seed=seed, **kwargs)


@functools.lru_cache(maxsize=8)
def sentence_end_ids(vocabulary: Any) -> tuple[int, ...]:
    """The ids whose text ends a sentence: ends with ``.``, ``!`` or ``?``, closing quotes
    and brackets after it allowed (``."`` and ``?)`` too). Computed once per vocabulary."""
    texts = vocabulary.decode_batch([[i] for i in range(vocabulary.vocab_size)])
    return tuple(i for i, text in enumerate(texts)
                 if text.strip().rstrip(_CLOSING).endswith(SENTENCE_END_CHARACTERS))
