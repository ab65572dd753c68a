"""SQuAD as BERT span features (Devlin et al. 2019, sec. 4.2; the reference run_squad.py).

Each question becomes ``[CLS] question [SEP] context window [SEP]`` rows (a Hugging Face
tokenizer's own special tokens and types, `t2t.data.hf_tokenizer.row_layout`: ``<s>
question </s></s> window </s>`` for RoBERTa's): the question cut
to ``max_query_length`` WordPiece tokens, the context split into windows that start every
``doc_stride`` tokens (as the reference's doc spans). The answer is the (start, end) token
pair covering its characters, or (0, 0) -- the [CLS] -- in a window that does not hold it
whole. Predictions go back to the context's own characters through the WordPiece offsets,
and each question is answered by its best-scoring window.

SQuAD 2.0 (sec. 4.3): an unanswerable question trains every window towards the [CLS], and
at prediction a question is answered "" when its null score (the smallest [CLS] start + end
score over its windows) exceeds its best span's score by more than a threshold
(`null_score_diffs`, `answers_at`; the threshold is chosen on the dev set by
`t2t.evaluation.metrics.find_best_thresh`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from t2t.data.finetune_tasks import text, texts
from t2t.data.hf_tokenizer import row_layout

NO_SPAN = (-1, -1)   # the character span of a token outside the context


@dataclasses.dataclass
class SpanFeatures:
    """Windows of a split: model features [windows, ...] and what maps them back."""

    features: dict[str, np.ndarray]   # encoder_input_tokens, encoder_segment_ids,
                                      # token_type_ids [w, length]; start/end_positions [w]
    example_index: np.ndarray         # [w] the question each window belongs to
    offsets: np.ndarray               # [w, length, 2] context characters per token, or -1
    contexts: list[str]               # per question
    answers: list[list[str]]          # per question: every gold answer text


@dataclasses.dataclass(frozen=True)
class SquadRecord:
    question: str
    context: str
    answers: list[str]
    answer_starts: list[int]
    is_impossible: bool = False


def squad_record(record: Mapping[str, Any]) -> SquadRecord:
    """A TFDS / JSON SQuAD record (``answers: {text, answer_start}``) as plain strings; a
    v2.0 question is unanswerable when ``is_impossible`` or it has no answer."""
    answers = record.get("answers") or {}
    golds = texts(answers.get("text", []))
    impossible = bool(np.asarray(record.get("is_impossible", False))) or not golds
    return SquadRecord(text(record["question"]), text(record["context"]),
                       [] if impossible else golds,
                       [] if impossible else [int(s) for s in
                                              np.asarray(answers.get("answer_start", []))],
                       impossible)


def answer_chars(rec: SquadRecord) -> tuple[int, int] | None:
    """The first answer's [start, end) characters in the context: at its ``answer_start``,
    else its first occurrence; None when the context does not contain it."""
    if not rec.answers:
        return None
    answer = rec.answers[0]
    start = rec.answer_starts[0] if rec.answer_starts else -1
    if not (0 <= start and rec.context[start:start + len(answer)] == answer):
        start = rec.context.find(answer)
    return None if start < 0 or not answer else (start, start + len(answer))


def _token_span(offsets: Sequence[tuple[int, int]], chars: tuple[int, int]
                ) -> tuple[int, int] | None:
    """First and last context tokens overlapping the characters [start, end)."""
    inside = [i for i, (s, e) in enumerate(offsets) if s < chars[1] and e > chars[0]]
    return (inside[0], inside[-1]) if inside else None


def window_starts(num_tokens: int, window: int, doc_stride: int) -> list[int]:
    """The reference's doc spans: a window every ``doc_stride`` tokens until one reaches
    the end (one window for a short or empty context)."""
    starts, start = [], 0
    while True:
        starts.append(start)
        if start + window >= num_tokens:
            return starts
        start += min(window, doc_stride)


def span_features(records: Iterable[Mapping[str, Any]], vocabulary: Any, *,
                  max_length: int = 384, doc_stride: int = 128, max_query_length: int = 64,
                  training: bool = False, with_negatives: bool = False) -> SpanFeatures:
    """Every window of every record. ``training`` drops questions whose answer is not in
    their context (as the reference), and unanswerable ones unless ``with_negatives``
    (SQuAD 2.0: their windows all point at the [CLS]); otherwise every question is kept."""
    rows: dict[str, list] = {k: [] for k in ("tokens", "types", "start", "end", "offsets")}
    layout = row_layout(vocabulary)     # the tokenizer's own special tokens and types
    example_index, contexts, answers = [], [], []
    for rec in map(squad_record, records):
        chars = answer_chars(rec)
        if training and chars is None and not (with_negatives and rec.is_impossible):
            continue
        question = vocabulary.encode(rec.question, add_special_tokens=False)[:max_query_length]
        ids, offsets = vocabulary.encode_with_offsets(rec.context)
        answer = None if chars is None else _token_span(offsets, chars)
        room = max_length - len(question) - layout.added(True)
        if room <= 0:
            raise ValueError(f"max_length {max_length} leaves no room for the context after "
                             f"a {len(question)}-token question")
        head = layout.start_of_b(len(question))     # where the window begins in a row
        for start in window_starts(len(ids), room, doc_stride):
            stop = min(start + room, len(ids))
            tokens, types = layout.build(question, ids[start:stop])
            spans = ([NO_SPAN] * head + offsets[start:stop]
                     + [NO_SPAN] * (len(tokens) - head - (stop - start)))
            s = e = 0
            if answer is not None and start <= answer[0] and answer[1] < stop:
                s, e = (answer[0] - start + head, answer[1] - start + head)
            pad = max_length - len(tokens)
            rows["tokens"].append(tokens + [vocabulary.pad_id] * pad)
            rows["types"].append(types + [0] * pad)
            rows["offsets"].append(spans + [NO_SPAN] * pad)
            rows["start"].append(s)
            rows["end"].append(e)
            example_index.append(len(contexts))
        contexts.append(rec.context)
        answers.append(rec.answers)
    tokens = np.asarray(rows["tokens"], np.int32).reshape(-1, max_length)
    features = {"encoder_input_tokens": tokens,
                "encoder_segment_ids": (tokens != vocabulary.pad_id).astype(np.int32),
                "token_type_ids": np.asarray(rows["types"], np.int32).reshape(-1, max_length),
                "start_positions": np.asarray(rows["start"], np.int32),
                "end_positions": np.asarray(rows["end"], np.int32)}
    return SpanFeatures(features, np.asarray(example_index, np.int64),
                        np.asarray(rows["offsets"], np.int64).reshape(-1, max_length, 2),
                        contexts, answers)


def best_answers(spans: SpanFeatures, start: np.ndarray, end: np.ndarray,
                 score: np.ndarray) -> list[str]:
    """Per question, the context text of its best-scoring window's span (start/end token
    positions [w], score [w]); "" where no window pointed into the context."""
    best: dict[int, tuple[float, str]] = {}
    for w, q in enumerate(spans.example_index.tolist()):
        (s_char, _), (_, e_char) = spans.offsets[w, start[w]], spans.offsets[w, end[w]]
        if s_char < 0 or e_char < 0 or e_char < s_char:
            continue
        if q not in best or score[w] > best[q][0]:
            best[q] = (float(score[w]), spans.contexts[q][s_char:e_char])
    return [best.get(q, (0.0, ""))[1] for q in range(len(spans.contexts))]


def null_score_diffs(spans: SpanFeatures, start: np.ndarray, end: np.ndarray,
                     span_score: np.ndarray, null_score: np.ndarray
                     ) -> tuple[list[str], np.ndarray]:
    """SQuAD 2.0 (the reference run_squad.py): per question, the text of its best non-null
    span over all windows (as `best_answers`) and score_null - best span score [questions],
    where score_null is the smallest [CLS] score over its windows (+inf without a span)."""
    answers = best_answers(spans, start, end, span_score)
    n = len(spans.contexts)
    null = np.full(n, np.inf)
    best = np.full(n, -np.inf)
    for w, q in enumerate(spans.example_index.tolist()):
        null[q] = min(null[q], float(null_score[w]))
        (s_char, _), (_, e_char) = spans.offsets[w, start[w]], spans.offsets[w, end[w]]
        if s_char >= 0 and e_char >= s_char:
            best[q] = max(best[q], float(span_score[w]))
    diffs = np.where(np.isfinite(best), null - best, np.inf)
    return answers, diffs


def answers_at(answers: Sequence[str], diffs: np.ndarray, threshold: float) -> list[str]:
    """The predictions at a null threshold: "" where score_null - best span > threshold."""
    return ["" if d > threshold else a for a, d in zip(answers, np.asarray(diffs).tolist())]
