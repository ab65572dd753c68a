"""GPT-1's task-specific input transformations (Radford et al. 2018, sec. 3.3, Figure 1).

Fine-tuning feeds the pretrained decoder one contiguous token sequence per input, built
with three tokens that pretraining never saw: start ``[s]``, delimiter ``[$]`` and extract
``[e]`` (new learned embeddings appended after the vocabulary, `SpecialTokens.after`):

    classification    [s] text [e]                                  1 row
    entailment        [s] premise [$] hypothesis [e]                1 row
    similarity        [s] a [$] b [e]  and  [s] b [$] a [e]         2 rows (both orders)
    multiple_choice   [s] context [$] answer_k [e]  for each k      K rows

The model reads the final hidden state at each row's extract token
(`t2t.models.gpt_format`). Truncation: when a row is longer than ``max_length``, its texts
are cut longest-first (the longer text loses its last token, repeatedly; the second on
ties, as BERT's ``_truncate_seq_pair``), so the special tokens always survive;
``max_length`` must hold the specials plus one token of each text, else a `UserError`.

Features (numpy): ``decoder_input_tokens`` and ``decoder_segment_ids`` (1 on tokens, 0 on
padding) [n, rows, max_length] int32, ``extract_positions`` [n, rows] int32 (index of
``[e]``) and ``label`` [n] int32.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Optional, Union

import numpy as np

from t2t.data.finetune_tasks import spread, truncate_pair
from t2t.data.sources import InvalidRecord
from t2t.errors import UserError

FORMATS = ("classification", "entailment", "similarity", "multiple_choice")

Ids = Sequence[int]
# (first text's ids, second's: one text, K texts for multiple choice, or None; label)
Example = tuple[Ids, Union[Ids, Sequence[Ids], None], int]


@dataclasses.dataclass(frozen=True)
class SpecialTokens:
    """Ids of the start, delimiter and extract tokens."""

    start: int
    delimiter: int
    extract: int

    @classmethod
    def after(cls, vocab_size: int) -> "SpecialTokens":
        """The three tokens appended to a vocabulary of `vocab_size` ids (sec. 3.3: new
        embeddings; the model's table then has `vocab_size + 3` rows)."""
        return cls(vocab_size, vocab_size + 1, vocab_size + 2)


def check_format(task_format: str) -> None:
    if task_format not in FORMATS:
        raise UserError(f"GPT input format {task_format!r}; choose one of {list(FORMATS)}")


def num_rows(task_format: str, num_choices: int = 0) -> int:
    """Rows (decoder passes) per example: 2 for similarity, K for multiple choice, else 1."""
    check_format(task_format)
    return {"similarity": 2, "multiple_choice": num_choices}.get(task_format, 1)


def row(first: Ids, second: Optional[Ids], special: SpecialTokens, max_length: int) -> list[int]:
    """``[s] first [e]``, or ``[s] first [$] second [e]`` (a pair), cut longest-first to
    `max_length` (see the module docstring)."""
    first = list(first)
    if second is None:
        if max_length < 3:
            raise UserError(f"max_length {max_length} cannot hold [s], [e] and a token of "
                            "text; raise MAX_LENGTH")
        return [special.start] + first[:max_length - 2] + [special.extract]
    if max_length < 5:
        raise UserError(f"max_length {max_length} cannot hold [s], [$], [e] and a token of "
                        "each text; raise MAX_LENGTH")
    la, lb = truncate_pair(len(first), len(second), max_length - 3)
    return ([special.start] + first[:la] + [special.delimiter] + list(second)[:lb]
            + [special.extract])


def example_rows(task_format: str, first: Ids, second, special: SpecialTokens,
                 max_length: int) -> list[list[int]]:
    """One example's rows in `task_format` (Figure 1): see the module docstring."""
    check_format(task_format)
    if task_format == "classification":
        if second is not None:
            raise UserError("the classification format takes one text; use 'entailment' or "
                            "'similarity' for pairs")
        return [row(first, None, special, max_length)]
    if second is None:
        raise UserError(f"the {task_format} format needs a second text for every example")
    if task_format == "entailment":
        return [row(first, second, special, max_length)]
    if task_format == "similarity":
        return [row(first, second, special, max_length), row(second, first, special, max_length)]
    return [row(first, answer, special, max_length) for answer in second]


def format_features(task_format: str, examples: Sequence[Example], special: SpecialTokens,
                    max_length: int, pad_id: int = 0) -> dict[str, np.ndarray]:
    """Examples (ids, not text) -> the features of the module docstring. Multiple-choice
    examples must all have the same number of answers."""
    rows = [example_rows(task_format, a, b, special, max_length) for a, b, _ in examples]
    counts = {len(r) for r in rows}
    if len(counts) > 1:
        raise UserError(f"{task_format}: examples have {sorted(counts)} answers; every "
                        "example needs the same number")
    n, r = len(rows), counts.pop() if counts else num_rows(task_format, 1)
    tokens = np.full((n, r, max_length), pad_id, np.int32)
    segments = np.zeros((n, r, max_length), np.int32)
    extract = np.zeros((n, r), np.int32)
    for i, example in enumerate(rows):
        for j, ids in enumerate(example):
            tokens[i, j, :len(ids)] = ids
            segments[i, j, :len(ids)] = 1
            extract[i, j] = len(ids) - 1
    return {"decoder_input_tokens": tokens, "decoder_segment_ids": segments,
            "extract_positions": extract,
            "label": np.asarray([label for _, _, label in examples], np.int32).reshape(n)}


def task_examples(task: Any, split: str, vocabulary: Any, task_format: str,
                  max_examples: Optional[int] = None) -> list[Example]:
    """A task's split as token-id examples: multiple choice reads ``{"context", "endings",
    "label"}`` records (`t2t.data.multiple_choice`), the other formats the task's
    ``encoder_pair_fn`` (text a, text b or None, label)."""
    from t2t.data.multiple_choice import choice_record
    check_format(task_format)
    source = task.get_source(split)
    records = [source[i] for i in spread(len(source), max_examples)]
    records = [r for r in records if not isinstance(r, InvalidRecord)]
    if task_format == "multiple_choice":
        parsed = [choice_record(r) for r in records]
        contexts = vocabulary.encode_batch([p[0] for p in parsed])
        answers = vocabulary.encode_batch([e for p in parsed for e in p[1]])
        out, k = [], 0
        for (_, endings, label), context in zip(parsed, contexts):
            out.append((context, answers[k:k + len(endings)], label))
            k += len(endings)
        return out
    if getattr(task, "encoder_pair_fn", None) is None:
        raise UserError(f"task {task.name!r} has no text-pair form (encoder_pair_fn); the "
                        f"{task_format} format needs one")
    pairs = [task.encoder_pair_fn(r) for r in records]
    a_ids = vocabulary.encode_batch([p[0] for p in pairs])
    b_ids = vocabulary.encode_batch([p[1] or "" for p in pairs])
    return [(a, None if p[1] is None else b, int(p[2])) for p, a, b in zip(pairs, a_ids, b_ids)]
