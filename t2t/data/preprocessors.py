"""Pretraining objectives as pure numpy functions.

Every function is deterministic given its ``seed`` (an int, a tuple of ints such as
``(seed, epoch, index)``, or a ``np.random.Generator``), so results never depend on
worker order. The T5 denoising family follows ``t5/data/preprocessors.py``
(``denoise`` = noise mask + inputs encoding + targets encoding, named after the T5
objective gins ``<noise>_<density>_<inputs>_<targets>``); MLM and NSP follow BERT's
``create_pretraining_data.py``; span masking follows SpanBERT.
"""
from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Union

import numpy as np

Seed = Union[int, Sequence[int], np.random.SeedSequence, np.random.Generator]
NoiseMaskFn = Callable[[int, np.random.Generator], np.ndarray]  # (length, rng) -> bool[length]
EncodeFn = Callable[[np.ndarray, np.ndarray, np.random.Generator], np.ndarray]


class SkipExample(Exception):
    """Raised by a preprocessor for bad input; the pipeline counts ``reason`` and moves on."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def make_rng(seed: Seed) -> np.random.Generator:
    """A numpy Generator from an int, a tuple of ints or an existing Generator."""
    if isinstance(seed, np.random.Generator):
        return seed
    return np.random.default_rng(seed)


def _tokens(tokens: Any) -> np.ndarray:
    return np.asarray(tokens, dtype=np.int32).reshape(-1)


def append_eos(tokens: Any, eos_id: int | None) -> np.ndarray:
    tokens = _tokens(tokens)
    return tokens if eos_id is None else np.append(tokens, np.int32(eos_id))


def split_tokens(tokens: Any, max_length: int) -> list[np.ndarray]:
    """Chunks of at most ``max_length`` tokens (T5 ``split_tokens``); the last may be shorter."""
    tokens = _tokens(tokens)
    return [tokens[i:i + max_length] for i in range(0, len(tokens), max_length)]


def decode_text(value: Any) -> str:
    """Text from str/bytes; raises SkipExample('undecodable'|'empty')."""
    if isinstance(value, (bytes, bytearray, np.bytes_)):
        try:
            value = bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise SkipExample("undecodable") from None
    if not isinstance(value, str):
        raise SkipExample("undecodable")
    value = value.strip()
    if not value:
        raise SkipExample("empty")
    return value


# ----------------------------------------------------------------------------- noise masks


def iid_noise_mask(length: int, rng: np.random.Generator, *, noise_density: float) -> np.ndarray:
    """Each token is noise independently with probability ``noise_density``."""
    return rng.random(length) < noise_density


def _random_segmentation(num_items: int, num_segments: int, rng: np.random.Generator) -> np.ndarray:
    """Random partition of ``num_items`` into ``num_segments`` non-empty segments (T5)."""
    first_in_segment = np.zeros(num_items, dtype=np.int64)
    first_in_segment[1:] = rng.permutation(np.arange(num_items - 1) < num_segments - 1)
    segment_id = np.cumsum(first_in_segment)  # [num_items]
    return np.bincount(segment_id, minlength=num_segments)  # [num_segments]


def random_spans_noise_mask(length: int, rng: np.random.Generator, *, noise_density: float,
                            mean_noise_span_length: float = 3.0) -> np.ndarray:
    """T5's ``random_spans_noise_mask``: alternating non-noise/noise spans, ending with noise.

    ``num_noise = round(L * density)`` clamped to [1, L-1] and
    ``num_spans = max(1, round(num_noise / mean_span))``; rounding in float32, half to even,
    exactly as ``tf.round`` does in T5.
    """
    if noise_density == 0.0:
        return np.zeros(length, dtype=bool)
    orig_length, length = length, max(length, 2)
    num_noise = int(np.round(np.float32(length) * np.float32(noise_density)))
    num_noise = min(max(num_noise, 1), length - 1)
    num_spans = max(int(np.round(np.float32(num_noise) / np.float32(mean_noise_span_length))), 1)
    noise_lengths = _random_segmentation(num_noise, num_spans, rng)
    nonnoise_lengths = _random_segmentation(length - num_noise, num_spans, rng)
    interleaved = np.stack([nonnoise_lengths, noise_lengths], axis=1).reshape(-1)  # [2*spans]
    mask = np.repeat(np.tile([False, True], num_spans), interleaved)
    return mask[:orig_length]


def random_prefix_noise_mask(length: int, rng: np.random.Generator, *,
                             noise_density: float = 0.5) -> np.ndarray:
    """The first k tokens are 'noise', k uniform in [min, L-1] (T5's prefix LM mask)."""
    if noise_density > 0.5:
        raise ValueError("noise_density must not exceed 0.5 for random_prefix_noise_mask")
    max_inputs = length - 1
    rounded = int(np.round(np.float32((1 - 2 * noise_density) * max_inputs)))
    min_inputs = min(max_inputs, max(1, rounded))
    num_inputs = int(rng.integers(min_inputs, max_inputs + 1)) if max_inputs > 0 else 0
    return np.arange(length) < num_inputs


# ----------------------------------------------------------------------------- encodings


def _prev(mask: np.ndarray) -> np.ndarray:
    return np.concatenate([[False], mask[:-1]])


def noise_token_to_sentinel(tokens, noise_mask, rng=None, *, sentinel_id: int) -> np.ndarray:
    """m: every noise token becomes the same sentinel (mask) token."""
    return np.where(noise_mask, np.int32(sentinel_id), tokens).astype(np.int32)


def noise_span_to_sentinel(tokens, noise_mask, rng=None, *, sentinel_id: int) -> np.ndarray:
    """s: every run of noise tokens becomes one (shared) sentinel."""
    tokens = noise_token_to_sentinel(tokens, noise_mask, sentinel_id=sentinel_id)
    return tokens[~(noise_mask & _prev(noise_mask))]


def nonnoise_span_to_sentinel(tokens, noise_mask, rng=None, *, sentinel_id: int) -> np.ndarray:
    return noise_span_to_sentinel(tokens, ~noise_mask, sentinel_id=sentinel_id)


def noise_span_to_unique_sentinel(tokens, noise_mask, rng=None, *, sentinel_id: int) -> np.ndarray:
    """u: the k-th noise span becomes ``sentinel_id - k`` (sentinels count down)."""
    prev = _prev(noise_mask)
    first = noise_mask & ~prev
    sentinels = sentinel_id + 1 - np.cumsum(first)
    tokens = np.where(first, sentinels, tokens).astype(np.int32)
    return tokens[~(noise_mask & prev)]


def nonnoise_span_to_unique_sentinel(tokens, noise_mask, rng=None, *, sentinel_id: int
                                     ) -> np.ndarray:
    return noise_span_to_unique_sentinel(tokens, ~noise_mask, sentinel_id=sentinel_id)


def drop_noise_tokens(tokens, noise_mask, rng=None) -> np.ndarray:
    """d (inputs): remove noise tokens."""
    return _tokens(tokens)[~noise_mask]


def drop_nonnoise_tokens(tokens, noise_mask, rng=None) -> np.ndarray:
    """d (targets): keep only noise tokens."""
    return _tokens(tokens)[noise_mask]


def permute_noise_tokens(tokens, noise_mask, rng) -> np.ndarray:
    """p: shuffle the noise tokens among the noise positions."""
    out = _tokens(tokens).copy()
    out[noise_mask] = rng.permutation(out[noise_mask])
    return out


def noise_token_to_gathered_token(tokens, noise_mask, rng) -> np.ndarray:
    """g: each noise token becomes a random token of the same sequence."""
    tokens = _tokens(tokens)
    gathered = tokens[rng.integers(0, max(len(tokens), 1), size=len(tokens))]
    return np.where(noise_mask, gathered, tokens).astype(np.int32)


def _random_ids(rng: np.random.Generator, n: int, vocab_size: int,
                excluded: Iterable[int] = ()) -> np.ndarray:
    """n ids uniform over [0, vocab_size) minus ``excluded``."""
    excluded = np.unique([e for e in excluded if 0 <= e < vocab_size])
    ids = rng.integers(0, vocab_size - len(excluded), size=n)
    for e in excluded:  # map the k-th allowed id onto the vocabulary, skipping excluded ids
        ids = ids + (ids >= e)
    return ids.astype(np.int32)


def noise_token_to_random_token(tokens, noise_mask, rng, *, vocab_size: int,
                                num_reserved_tokens: int = 3) -> np.ndarray:
    """r: each noise token becomes a random id in [num_reserved_tokens, vocab_size)."""
    rand = rng.integers(num_reserved_tokens, vocab_size, size=len(noise_mask))
    return np.where(noise_mask, rand, tokens).astype(np.int32)


def noise_token_to_random_token_or_sentinel(tokens, noise_mask, rng, *, vocab_size: int,
                                            sentinel_id: int, random_prob: float = 0.1,
                                            num_reserved_tokens: int = 3) -> np.ndarray:
    """r10s90: random token with probability ``random_prob``, else the sentinel."""
    use_random = rng.random(len(noise_mask)) < random_prob
    rand = noise_token_to_random_token(tokens, noise_mask, rng, vocab_size=vocab_size,
                                       num_reserved_tokens=num_reserved_tokens)
    return np.where(use_random, rand,
                    noise_token_to_sentinel(tokens, noise_mask, sentinel_id=sentinel_id))


def noise_token_to_mask_random_or_keep(tokens, noise_mask, rng, *, vocab_size: int, mask_id: int,
                                       special_ids: Sequence[int] = (),
                                       probs: tuple[float, float, float] = (0.8, 0.1, 0.1)
                                       ) -> np.ndarray:
    """b (BERT): noise token -> mask 80%, random non-special token 10%, unchanged 10%."""
    tokens = _tokens(tokens)
    u = rng.random(len(tokens))
    rand = _random_ids(rng, len(tokens), vocab_size, special_ids)
    out = np.where(u < probs[0], np.int32(mask_id), np.where(u < probs[0] + probs[1], rand, tokens))
    return np.where(noise_mask, out, tokens).astype(np.int32)


# ----------------------------------------------------------------------------- denoise


def denoise(tokens: Any, seed: Seed, noise_mask_fn: NoiseMaskFn, inputs_fn: EncodeFn,
            targets_fn: EncodeFn | None = None, *, eos_id: int | None = None
            ) -> dict[str, np.ndarray]:
    """T5's generic denoising: noise mask -> inputs encoding, targets encoding (None = full text).

    One generator is drawn from in that order (T5 splits six seeds; spawning streams here
    would cost a third of the objective's time for no statistical gain).
    """
    tokens = _tokens(tokens)
    rng = make_rng(seed)
    noise_mask = noise_mask_fn(len(tokens), rng)
    inputs = inputs_fn(tokens, noise_mask, rng)
    targets = tokens if targets_fn is None else targets_fn(tokens, noise_mask, rng)
    return {"inputs": append_eos(inputs, eos_id), "targets": append_eos(targets, eos_id)}


def span_corruption(tokens: Any, *, seed: Seed, sentinel_id: int, noise_density: float = 0.15,
                    mean_noise_span_length: float = 3.0, eos_id: int | None = 1
                    ) -> dict[str, np.ndarray]:
    """T5's final objective (span_3_15_u_u): random spans -> unique sentinels, EOS on both."""
    return denoise(
        tokens, seed,
        functools.partial(random_spans_noise_mask, noise_density=noise_density,
                          mean_noise_span_length=mean_noise_span_length),
        functools.partial(noise_span_to_unique_sentinel, sentinel_id=sentinel_id),
        functools.partial(nonnoise_span_to_unique_sentinel, sentinel_id=sentinel_id),
        eos_id=eos_id)


def span_corruption_lengths(inputs_length: int, noise_density: float = 0.15,
                            mean_noise_span_length: float = 3.0,
                            extra_tokens_per_span_inputs: int = 1,
                            extra_tokens_per_span_targets: int = 1) -> tuple[int, int]:
    """T5's ``random_spans_helper``: (raw tokens per example, targets length), EOS included.

    The raw length is the largest whose corrupted inputs (+EOS) fit ``inputs_length``.
    """
    def lengths(tokens_length: int) -> tuple[int, int]:
        num_noise = int(round(tokens_length * noise_density))
        num_spans = int(round(num_noise / mean_noise_span_length))
        return (tokens_length - num_noise + num_spans * extra_tokens_per_span_inputs + 1,
                num_noise + num_spans * extra_tokens_per_span_targets + 1)

    tokens_length = inputs_length - 1
    while lengths(tokens_length + 1)[0] <= inputs_length:
        tokens_length += 1
    _, targets_length = lengths(tokens_length)
    if noise_density == 0.5 and targets_length > inputs_length:  # T5's round-number hack
        tokens_length -= 1
        targets_length -= 1
    return tokens_length, targets_length


def iid_denoising(tokens: Any, *, seed: Seed, sentinel_id: int, noise_density: float = 0.15,
                  eos_id: int | None = 1) -> dict[str, np.ndarray]:
    """iid_15_u_u: i.i.d. noise, runs of noise -> unique sentinels (T5 ``iid_denoising``)."""
    return denoise(tokens, seed, functools.partial(iid_noise_mask, noise_density=noise_density),
                   functools.partial(noise_span_to_unique_sentinel, sentinel_id=sentinel_id),
                   functools.partial(nonnoise_span_to_unique_sentinel, sentinel_id=sentinel_id),
                   eos_id=eos_id)


# The paper's "replace corrupted spans" row is i.i.d. noise with unique span sentinels.
replace_corrupted_spans = iid_denoising


def bert_style_corruption(tokens: Any, *, seed: Seed, vocab_size: int, mask_id: int,
                          special_ids: Sequence[int] = (), noise_density: float = 0.15,
                          eos_id: int | None = 1) -> dict[str, np.ndarray]:
    """T5 paper "BERT-style": 15% i.i.d.; 80% mask, 10% random, 10% kept; targets = full text."""
    return denoise(tokens, seed, functools.partial(iid_noise_mask, noise_density=noise_density),
                   functools.partial(noise_token_to_mask_random_or_keep, vocab_size=vocab_size,
                                     mask_id=mask_id, special_ids=special_ids),
                   None, eos_id=eos_id)


def mass_style_corruption(tokens: Any, *, seed: Seed, mask_id: int, noise_density: float = 0.15,
                          eos_id: int | None = 1) -> dict[str, np.ndarray]:
    """T5 paper "MASS-style" (iid_15_m_f): noise -> mask token, targets = full text."""
    return denoise(tokens, seed, functools.partial(iid_noise_mask, noise_density=noise_density),
                   functools.partial(noise_token_to_sentinel, sentinel_id=mask_id), None,
                   eos_id=eos_id)


def drop_corrupted_tokens(tokens: Any, *, seed: Seed, noise_density: float = 0.15,
                          eos_id: int | None = 1) -> dict[str, np.ndarray]:
    """iid_15_d_d: noise dropped from the inputs; targets = the dropped tokens."""
    return denoise(tokens, seed, functools.partial(iid_noise_mask, noise_density=noise_density),
                   drop_noise_tokens, drop_nonnoise_tokens, eos_id=eos_id)


def deshuffle(tokens: Any, *, seed: Seed, eos_id: int | None = 1) -> dict[str, np.ndarray]:
    """Deshuffling (T5 all_permute): inputs = shuffled tokens, targets = original."""
    return denoise(tokens, seed, lambda n, rng: np.ones(n, dtype=bool), permute_noise_tokens,
                   None, eos_id=eos_id)


def prefix_lm_split(tokens: Any, seed: Seed, *, noise_density: float = 0.5,
                    eos_id: int | None = 1) -> dict[str, np.ndarray]:
    """T5 ``prefix_lm``: random split point; inputs = prefix, targets = the rest."""
    return denoise(tokens, seed,
                   functools.partial(random_prefix_noise_mask, noise_density=noise_density),
                   drop_nonnoise_tokens, drop_noise_tokens, eos_id=eos_id)


def full_lm(tokens: Any, seed: Seed | None = None, *, eos_id: int | None = 1
            ) -> dict[str, np.ndarray]:
    """Plain LM: targets = all tokens (+EOS), no inputs."""
    return {"targets": append_eos(tokens, eos_id)}


_INPUT_CODES = {
    "m": lambda v: functools.partial(noise_token_to_sentinel, sentinel_id=v["sentinel_id"]),
    "s": lambda v: functools.partial(noise_span_to_sentinel, sentinel_id=v["sentinel_id"]),
    "u": lambda v: functools.partial(noise_span_to_unique_sentinel, sentinel_id=v["sentinel_id"]),
    "d": lambda v: drop_noise_tokens,
    "p": lambda v: permute_noise_tokens,
    "g": lambda v: noise_token_to_gathered_token,
    "r": lambda v: functools.partial(noise_token_to_random_token, vocab_size=v["vocab_size"]),
    "b": lambda v: functools.partial(noise_token_to_mask_random_or_keep, vocab_size=v["vocab_size"],
                                     mask_id=v["sentinel_id"], special_ids=v["special_ids"]),
}
_TARGET_CODES = {
    "f": lambda v: None,
    "d": lambda v: drop_nonnoise_tokens,
    "s": lambda v: functools.partial(nonnoise_span_to_sentinel, sentinel_id=v["sentinel_id"]),
    "u": lambda v: functools.partial(nonnoise_span_to_unique_sentinel,
                                     sentinel_id=v["sentinel_id"]),
}
_NAME = re.compile(r"^(iid|span_(?P<span>[\d.]+))_(?P<density>\d+)"
                   r"_(?P<inputs>r\d+s\d+|[a-z])_(?P<targets>[a-z])$")


def objective(name: str, *, sentinel_id: int | None = None, vocab_size: int | None = None,
              eos_id: int | None = 1, special_ids: Sequence[int] = ()
              ) -> Callable[[Any, Seed], dict[str, np.ndarray]]:
    """An objective ``fn(tokens, seed)`` from a T5 gin name.

    ``<iid|span_N>_<density%>_<inputs>_<targets>`` (inputs m,s,u,d,p,g,r,r10s90 and our 'b' =
    BERT 80/10/10; targets f,d,s,u), plus ``all_permute``, ``prefix_lm`` and ``lm``.
    E.g. ``span_3_15_u_u`` (T5), ``iid_15_b_f`` (BERT-style), ``iid_15_m_f`` (MASS-style).
    """
    if name == "lm":
        return functools.partial(full_lm, eos_id=eos_id)
    if name == "prefix_lm":
        return functools.partial(prefix_lm_split, eos_id=eos_id)
    if name == "all_permute":
        return functools.partial(_seeded, deshuffle, eos_id=eos_id)
    match = _NAME.match(name)
    if not (match and (match["inputs"] in _INPUT_CODES or match["inputs"].startswith("r"))
            and match["targets"] in _TARGET_CODES):
        raise ValueError(f"unknown objective {name!r}: expected <iid|span_N>_<density>_<in>_<tgt>, "
                         "'all_permute', 'prefix_lm' or 'lm'")
    density = int(match["density"]) / 100
    if match["span"]:
        noise = functools.partial(random_spans_noise_mask, noise_density=density,
                                  mean_noise_span_length=float(match["span"]))
    else:
        noise = functools.partial(iid_noise_mask, noise_density=density)
    values = {"sentinel_id": sentinel_id, "vocab_size": vocab_size, "special_ids": special_ids}
    code = match["inputs"]
    if code.startswith("r") and len(code) > 1:
        random_pct = int(re.match(r"r(\d+)s", code)[1])
        inputs = functools.partial(noise_token_to_random_token_or_sentinel, vocab_size=vocab_size,
                                   sentinel_id=sentinel_id, random_prob=random_pct / 100)
    else:
        inputs = _INPUT_CODES[code](values)
    targets = _TARGET_CODES[match["targets"]](values)
    return functools.partial(_denoise_seeded, noise_mask_fn=noise, inputs_fn=inputs,
                             targets_fn=targets, eos_id=eos_id)


def _seeded(fn, tokens, seed, **kwargs):
    return fn(tokens, seed=seed, **kwargs)


def _denoise_seeded(tokens, seed, **kwargs):
    return denoise(tokens, seed, **kwargs)


# ----------------------------------------------------------------------------- BERT MLM


def _word_groups(candidates: np.ndarray, word_starts: np.ndarray | None) -> list[np.ndarray]:
    """Candidate positions grouped into words (a special token or a word start begins a group)."""
    if len(candidates) == 0:
        return []
    starts = np.ones(len(candidates), dtype=bool)
    if word_starts is not None:
        contiguous = np.diff(candidates, prepend=-2) == 1
        starts = ~contiguous | np.asarray(word_starts, dtype=bool)[candidates]
    return np.split(candidates, np.flatnonzero(starts)[1:])


def span_lengths(rng: np.random.Generator, n: int, p: float = 0.2, max_length: int = 10
                 ) -> np.ndarray:
    """SpanBERT span lengths (words): Geometric(p) truncated to [1, max_length], renormalised.

    SpanBERT's ``len_distrib``; the mean is 3.78 for p=0.2, max 10 (plain clipping gives 4.46).
    """
    probs = p * (1 - p) ** np.arange(max_length)
    return rng.choice(np.arange(1, max_length + 1), size=n, p=probs / probs.sum())


def _choose_spans(groups: list[np.ndarray], budget: int, rng: np.random.Generator
                  ) -> list[list[int]]:
    """SpanBERT: anchor a random unmasked word, extend right by a sampled number of words."""
    masked = np.zeros(len(groups), dtype=bool)
    sizes = np.array([len(g) for g in groups])
    spans, count, attempts = [], 0, 0
    while count < budget and attempts < 20 * budget + 100 and not masked.all():
        attempts += 1
        length = int(span_lengths(rng, 1)[0])
        g = int(rng.integers(len(groups)))
        if masked[g] or count + sizes[g] > budget:
            continue
        span = []
        while (g < len(groups) and len(span) < length and not masked[g]
               and count + sizes[g] <= budget
               and (not span or groups[g][0] == groups[span[-1]][-1] + 1)):
            span.append(g)
            masked[g] = True
            count += sizes[g]
            g += 1
        spans.append(span)
    return spans


def mlm_mask(tokens: Any, seed: Seed, vocab_size: int, mask_id: int, special_ids: Sequence[int],
             mask_rate: float = 0.15, max_predictions: int = 20, whole_word: bool = False,
             word_starts: Any = None, span: bool = False) -> dict[str, np.ndarray]:
    """BERT ``create_masked_lm_predictions`` (+ whole-word and SpanBERT span masking).

    Chooses ``min(max_predictions, max(1, round(mask_rate * #non-special)))`` positions; each
    becomes [MASK] 80% / a random non-special id 10% / itself 10% (per span with ``span``).
    Returns ``inputs`` [L] and ``masked_positions``/``masked_ids``/``masked_weights``
    [max_predictions], sorted by position and zero-padded.
    """
    tokens = _tokens(tokens)
    rng = make_rng(seed)
    candidates = np.flatnonzero(~np.isin(tokens, np.asarray(special_ids, dtype=np.int32)))
    num_to_predict = 0
    if len(candidates):
        num_to_predict = min(max_predictions, max(1, int(round(len(candidates) * mask_rate))))
    if whole_word and word_starts is None:
        raise ValueError("whole_word masking needs word_starts")
    if span:
        groups = _word_groups(candidates, word_starts)
        spans = _choose_spans(groups, num_to_predict, rng)
        chosen = [np.concatenate([groups[g] for g in s]) for s in spans if s]
        u_span = rng.random(len(chosen))
        positions = np.concatenate(chosen) if chosen else np.zeros(0, np.int64)
        u = np.repeat(u_span, [len(c) for c in chosen])
    elif whole_word:
        groups = _word_groups(candidates, word_starts)
        chosen, count = [], 0
        for g in rng.permutation(len(groups)):
            if count + len(groups[g]) > num_to_predict:
                continue
            chosen.append(groups[g])
            count += len(groups[g])
            if count == num_to_predict:
                break
        positions = np.concatenate(chosen) if chosen else np.zeros(0, np.int64)
        u = rng.random(len(positions))
    else:
        positions = rng.choice(candidates, size=num_to_predict, replace=False)
        u = rng.random(len(positions))
    order = np.argsort(positions, kind="stable")
    positions, u = positions[order], u[order]
    rand = _random_ids(rng, len(positions), vocab_size, special_ids)
    original = tokens[positions]
    replacement = np.where(u < 0.8, np.int32(mask_id), np.where(u < 0.9, original, rand))
    inputs = tokens.copy()
    inputs[positions] = replacement
    n = len(positions)
    pad = max_predictions - n
    return {
        "inputs": inputs,
        "masked_positions": np.pad(positions.astype(np.int32), (0, pad)),
        "masked_ids": np.pad(original.astype(np.int32), (0, pad)),
        "masked_weights": np.pad(np.ones(n, np.float32), (0, pad)),
    }


# ----------------------------------------------------------------------------- BERT NSP


def truncate_seq_pair(tokens_a: list[int], tokens_b: list[int], max_num_tokens: int,
                      rng: np.random.Generator) -> None:
    """BERT: trim the longer sequence, from the front or the back at random, in place."""
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        trunc = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        if rng.random() < 0.5:
            del trunc[0]
        else:
            trunc.pop()


def _pair_instance(tokens_a, tokens_b, cls_id: int, sep_id: int, label: int) -> dict:
    """[CLS] A [SEP] B [SEP] from (token, starts-a-word) lists, with A/B type ids and the
    pair's label (NSP: B is random; SOP: the segments are swapped)."""
    pairs = [(cls_id, True), *tokens_a, (sep_id, True), *tokens_b, (sep_id, True)]
    types = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
    return {"tokens": np.array([t for t, _ in pairs], np.int32),
            "token_type_ids": np.array(types, np.int32),
            "word_starts": np.array([w for _, w in pairs], bool),
            "next_sentence_label": np.int32(label)}


def create_instances_from_document(documents: Sequence[Sequence[Sequence[int]]],
                                   document_index: int, rng: np.random.Generator,
                                   max_length: int, cls_id: int, sep_id: int,
                                   short_seq_prob: float = 0.1,
                                   word_starts: Sequence[Sequence[Sequence[bool]]] | None = None
                                   ) -> list[dict]:
    """BERT's ``create_instances_from_document`` for one document (a list of sentences).

    ``word_starts`` (same nesting as ``documents``) travels with the tokens through the
    truncation, for whole-word masking afterwards.
    """
    def sentence(d: int, s: int) -> list[tuple[int, bool]]:
        starts = word_starts[d][s] if word_starts is not None else [True] * len(documents[d][s])
        return list(zip(documents[d][s], starts))

    document = documents[document_index]
    max_num_tokens = max_length - 3
    target_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_length = int(rng.integers(2, max_num_tokens + 1))
    instances, chunk, chunk_length, i = [], [], 0, 0
    while i < len(document):
        chunk.append(sentence(document_index, i))
        chunk_length += len(document[i])
        if i == len(document) - 1 or chunk_length >= target_length:
            if chunk:
                a_end = int(rng.integers(1, len(chunk))) if len(chunk) >= 2 else 1
                tokens_a = [t for s in chunk[:a_end] for t in s]
                tokens_b: list[tuple[int, bool]] = []
                if len(chunk) == 1 or rng.random() < 0.5:
                    is_random_next = 1
                    target_b_length = target_length - len(tokens_a)
                    random_index = document_index
                    for _ in range(10):
                        random_index = int(rng.integers(0, len(documents)))
                        if random_index != document_index:
                            break
                    random_document = documents[random_index]
                    if len(random_document):
                        start = int(rng.integers(0, len(random_document)))
                        for j in range(start, len(random_document)):
                            tokens_b.extend(sentence(random_index, j))
                            if len(tokens_b) >= target_b_length:
                                break
                    i -= len(chunk) - a_end  # put the unused segments back
                else:
                    is_random_next = 0
                    tokens_b = [t for s in chunk[a_end:] for t in s]
                truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
                if tokens_a and tokens_b:
                    instances.append(_pair_instance(tokens_a, tokens_b, cls_id, sep_id,
                                                    is_random_next))
            chunk, chunk_length = [], 0
        i += 1
    return instances


def nsp_examples(documents: Sequence[Sequence[Sequence[int]]], seed: Seed, max_length: int,
                 cls_id: int, sep_id: int, short_seq_prob: float = 0.1,
                 document_indices: Iterable[int] | None = None,
                 word_starts: Sequence[Sequence[Sequence[bool]]] | None = None) -> list[dict]:
    """NSP pairs ``[CLS] A [SEP] B [SEP]`` from documents of tokenised sentences.

    Label 0 = B is the actual next segment, 1 = B is random (from another document).
    Each instance: ``tokens``, ``token_type_ids``, ``word_starts`` [n] and ``next_sentence_label``.
    """
    rng = make_rng(seed)
    indices = range(len(documents)) if document_indices is None else document_indices
    return [inst for d in indices
            for inst in create_instances_from_document(documents, d, rng, max_length, cls_id,
                                                       sep_id, short_seq_prob, word_starts)]


# ----------------------------------------------------------------------------- BERT's successors
# ALBERT's n-gram masking and sentence-order prediction, RoBERTa's FULL-SENTENCES rows
# (SpanBERT's single segments are the same rows within one document).


def ngram_lengths(rng: np.random.Generator, n: int, max_ngram: int = 3) -> np.ndarray:
    """ALBERT n-gram lengths (words): p(k) ∝ 1/k for k = 1..max_ngram (6/11, 3/11, 2/11)."""
    k = np.arange(1, max_ngram + 1)
    return rng.choice(k, size=n, p=(1 / k) / np.sum(1 / k))


def choose_ngrams(sizes: Sequence[int], budget: int, rng: np.random.Generator,
                  max_ngram: int = 3) -> list[list[int]]:
    """ALBERT: visit the words in random order; from each uncovered one draw k ~ p(k) ∝ 1/k
    and cover k words to its right (k shrinks to fit the budget, the sequence's end and
    words covered before). ``sizes`` [words] in tokens; returns the chosen n-grams (word
    indices), their tokens summing to at most ``budget``."""
    covered = np.zeros(len(sizes), dtype=bool)
    grams, count = [], 0
    for start in rng.permutation(len(sizes)):
        if count >= budget:
            break
        k = int(ngram_lengths(rng, 1, max_ngram)[0])
        while k > 0:
            words = list(range(start, min(start + k, len(sizes))))
            if (len(words) == k and not covered[words].any()
                    and count + sum(sizes[w] for w in words) <= budget):
                break
            k -= 1
        if k == 0:
            continue
        covered[words] = True
        count += sum(sizes[w] for w in words)
        grams.append(words)
    return grams


def _mask_groups(tokens: np.ndarray, groups: list[np.ndarray], rng: np.random.Generator,
                 vocab_size: int, mask_id: int, special_ids: Sequence[int],
                 max_predictions: int) -> dict[str, np.ndarray]:
    """Each group (an n-gram's positions) -> [MASK] 80% / random ids 10% / kept 10%,
    decided once per group; BERT's MLM features, sorted by position and zero-padded."""
    u = rng.random(len(groups))
    positions = np.concatenate(groups) if groups else np.zeros(0, np.int64)
    u = np.repeat(u, [len(g) for g in groups])
    order = np.argsort(positions, kind="stable")
    positions, u = positions[order], u[order]
    rand = _random_ids(rng, len(positions), vocab_size, special_ids)
    original = tokens[positions]
    inputs = tokens.copy()
    inputs[positions] = np.where(u < 0.8, np.int32(mask_id), np.where(u < 0.9, rand, original))
    pad = max_predictions - len(positions)
    return {"inputs": inputs,
            "masked_positions": np.pad(positions.astype(np.int32), (0, pad)),
            "masked_ids": np.pad(original.astype(np.int32), (0, pad)),
            "masked_weights": np.pad(np.ones(len(positions), np.float32), (0, pad))}


def ngram_mask(tokens: Any, seed: Seed, vocab_size: int, mask_id: int, special_ids: Sequence[int],
               word_starts: Any, mask_rate: float = 0.15, max_predictions: int = 20,
               max_ngram: int = 3) -> dict[str, np.ndarray]:
    """ALBERT's n-gram MLM: whole-word n-grams (`choose_ngrams`) up to the budget of
    ``min(max_predictions, max(1, round(mask_rate * #non-special)))`` tokens."""
    tokens = _tokens(tokens)
    rng = make_rng(seed)
    candidates = np.flatnonzero(~np.isin(tokens, np.asarray(special_ids, dtype=np.int32)))
    budget = min(max_predictions, max(1, int(round(len(candidates) * mask_rate))))
    words = _word_groups(candidates, word_starts)
    grams = choose_ngrams([len(w) for w in words], budget if len(candidates) else 0, rng,
                          max_ngram)
    groups = [np.concatenate([words[w] for w in g]) for g in grams]
    return _mask_groups(tokens, groups, rng, vocab_size, mask_id, special_ids, max_predictions)


def sop_instances(document: Sequence[Sequence[int]], rng: np.random.Generator, max_length: int,
                  cls_id: int, sep_id: int, short_seq_prob: float = 0.1,
                  word_starts: Sequence[Sequence[bool]] | None = None) -> list[dict]:
    """ALBERT's sentence-order prediction pairs ``[CLS] A [SEP] B [SEP]`` from one document.

    A and B are consecutive chunks of whole sentences (BERT's chunking up to the target
    length); with probability 1/2 they are swapped, label 1 ("swapped"), else label 0. A
    chunk of a single sentence gives no pair. Keys as `create_instances_from_document`'s,
    the label under ``next_sentence_label``.
    """
    def sentence(s: int) -> list[tuple[int, bool]]:
        starts = word_starts[s] if word_starts is not None else [True] * len(document[s])
        return list(zip(document[s], starts))

    max_num_tokens = max_length - 3
    target = max_num_tokens
    if rng.random() < short_seq_prob:
        target = int(rng.integers(2, max_num_tokens + 1))
    instances, chunk, size = [], [], 0
    for i in range(len(document)):
        chunk.append(i)
        size += len(document[i])
        if i < len(document) - 1 and size < target:
            continue
        if len(chunk) >= 2:
            a_end = int(rng.integers(1, len(chunk)))
            tokens_a = [t for s in chunk[:a_end] for t in sentence(s)]
            tokens_b = [t for s in chunk[a_end:] for t in sentence(s)]
            swapped = int(rng.random() < 0.5)
            if swapped:
                tokens_a, tokens_b = tokens_b, tokens_a
            truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
            if tokens_a and tokens_b:
                instances.append(_pair_instance(tokens_a, tokens_b, cls_id, sep_id, swapped))
        chunk, size = [], 0
    return instances


def full_sentences_rows(documents: Sequence[Sequence[Sequence[int]]], max_tokens: int,
                        cross_documents: bool = True, doc_separator: int | None = None
                        ) -> list[tuple[int, list[tuple[int, bool]]]]:
    """RoBERTa's FULL-SENTENCES: whole sentences packed contiguously into rows of at most
    ``max_tokens`` tokens, crossing into the next document after ``doc_separator`` when
    ``cross_documents`` (else each document's rows end with it: SpanBERT's single
    segments). A sentence longer than a row is cut. Sentences are lists of
    ``(token, word_start)``; returns ``(document the row starts in, row)`` pairs, every
    token of the corpus in exactly one row, in order."""
    rows: list[tuple[int, list[tuple[int, bool]]]] = []
    row: list[tuple[int, bool]] = []
    start_doc = 0

    def flush():
        nonlocal row
        if row:
            rows.append((start_doc, row))
        row = []

    for d, document in enumerate(documents):
        if not cross_documents:
            flush()
        # Between documents inside a row: the separator, written with the next sentence
        # that fits (a row never ends with it).
        pending = bool(row) and doc_separator is not None
        for sentence in document:
            sentence = list(sentence)
            extra = 1 if pending and row else 0
            if row and len(row) + extra + len(sentence) > max_tokens:
                flush()
                extra = 0
            while len(sentence) > max_tokens:      # the row is empty here
                rows.append((d, sentence[:max_tokens]))
                sentence = sentence[max_tokens:]
            if not row:
                start_doc = d
            if extra:
                row.append((doc_separator, True))
            row.extend(sentence)
            pending = False
    flush()
    return rows
