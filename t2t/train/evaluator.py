"""Task evaluation: predictions of a model on a task's split, scored by the task's metrics.

Text-to-text (families that decode, `Family.decoding`: ``t5`` and ``gpt``): the split's
examples are batched unpacked, ``model.predict`` decodes (greedy unless told otherwise), the
tokens are detokenized, and targets and predictions go through the task's ``postprocess``
(a label string -> its id, -1 when unknown) before its ``metric_fns``. Classifiers of the
other families (BERT's and XLNet's heads, whose ``predict`` returns label ids [batch], or
values for a regressor) get ``classification_examples`` features and their outputs are
compared directly.
``write_results`` saves ``metrics.json`` and a markdown table ``results.md``;
``write_predictions`` each example's input, target and prediction (``predictions.jsonl``).
A trivial baseline (`trivial_baseline`: copy the input for text-to-text, the training set's
majority class for tasks that know their label counts) is scored on the same examples.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from etils import epath

from t2t import storage
from t2t.data.finetune_tasks import FinetuneTask, classification_examples, spread
from t2t.data.converters import EncDecConverter
from t2t.data.sources import InvalidRecord
from t2t.data.tasks import get_task
from t2t.models import families
from t2t.models.classifiers import FineTuningModel


def apply_metrics(task: FinetuneTask, targets: Sequence[Any], predictions: Sequence[Any]
                  ) -> dict[str, float]:
    """Every metric fn of the task on (postprocessed) targets and predictions, merged."""
    scores: dict[str, float] = {}
    for fn in task.metric_fns:
        scores.update({k: float(v) for k, v in fn(list(targets), list(predictions)).items()})
    return scores


def compute_metrics(task: FinetuneTask, examples: Sequence[Mapping],
                    predictions: Sequence[str]) -> dict[str, float]:
    """The task's metrics of decoded ``predictions`` against the examples' targets, both
    through ``task.postprocess`` (a label string -> its id, -1 when unknown)."""
    if len(examples) != len(predictions):
        raise ValueError(f"{len(examples)} examples but {len(predictions)} predictions")
    targets = [task.postprocess(ex["targets_pretokenized"], ex, is_target=True)
               for ex in examples]
    predictions = [task.postprocess(p, ex) for p, ex in zip(predictions, examples)]
    return apply_metrics(task, targets, predictions)


def _batches(n: int, batch_size: int):
    for start in range(0, n, batch_size):
        yield start, min(start + batch_size, n)


def _pad_rows(array: np.ndarray, rows: int) -> np.ndarray:
    """[n, ...] -> [rows, ...] with zero rows appended (one compiled shape for every batch)."""
    pad = [(0, rows - len(array))] + [(0, 0)] * (array.ndim - 1)
    return np.pad(array, pad)


def _continues_prompt(model) -> bool:
    """Whether `model` decodes by continuing a prompt (a decoder-only family's)."""
    how = families.get(getattr(model, "family", "t5")).decoding
    return how is not None and how.continues_prompt


def _gpt_prompts(examples: Sequence[Mapping], width: int, rows: int, prefix_lm: bool
                 ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Decoder-only prompts ``[0, inputs...]`` as in training: attended bidirectionally
    (``decoder_causal_attention``) for a prefix LM, else given as ``prompt_lengths``."""
    tokens = np.zeros((rows, width), np.int32)
    lengths = np.ones(rows, np.int32)  # padding rows: a 1-token prompt
    for row, ex in enumerate(examples):
        prompt = np.concatenate([[0], np.asarray(ex["inputs"], np.int32)])[:width]
        tokens[row, :len(prompt)] = prompt
        lengths[row] = len(prompt)
    if prefix_lm:
        causal = (np.arange(width)[None, :] < lengths[:, None]).astype(np.int32)
        return {"decoder_input_tokens": tokens, "decoder_causal_attention": causal}, {}
    return {"decoder_input_tokens": tokens}, {"prompt_lengths": lengths}


def predict_texts(model, params, examples: Sequence[Mapping], vocabulary: Any, *,
                  batch_size: int, max_decode_length: int | None = None,
                  sequence_length: Mapping[str, int] | None = None, prefix_lm: bool = True,
                  **decode_options) -> list[str]:
    """Decoded predictions of a ``t5`` or ``gpt`` model for tokenized examples.

    Inputs are cut to ``sequence_length["inputs"]`` (default: the longest); decoding runs
    ``max_decode_length`` steps (default: ``sequence_length["targets"]``, else the longest
    target). Every batch has ``batch_size`` rows, so one compiled shape serves them all.
    A ``gpt`` model continues ``[0, inputs...]``, seen bidirectionally if ``prefix_lm``.
    """
    if not examples:
        return []
    lengths = dict(sequence_length or {})
    inputs_length = lengths.get("inputs") or max(len(ex["inputs"]) for ex in examples)
    targets_length = lengths.get("targets") or max(len(ex["targets"]) for ex in examples)
    max_decode_length = max_decode_length or targets_length
    prompted = _continues_prompt(model)
    converter = EncDecConverter({"inputs": inputs_length, "targets": targets_length},
                                pack=False)
    out: list[str] = []
    for start, stop in _batches(len(examples), batch_size):
        chunk = examples[start:stop]
        extra: dict[str, Any] = {}
        if prompted:
            batch, extra = _gpt_prompts(chunk, inputs_length + 1, batch_size, prefix_lm)
        else:
            batch = converter(chunk, num_rows=batch_size)
        tokens = np.asarray(model.predict(params, batch, max_decode_length=max_decode_length,
                                          **extra, **decode_options))
        out.extend(vocabulary.decode(row) for row in tokens[:len(chunk)])
    return out


def predict_labels(model, params, features: Mapping[str, np.ndarray], *,
                   batch_size: int) -> np.ndarray:
    """Predictions [n] (label ids, or values for a regressor) of a classifier over its
    features (``classification_examples``'s for an encoder; any with a leading [n] axis)."""
    import jax
    inputs = {k: v for k, v in features.items() if k not in ("label", "target")}
    n = len(next(iter(inputs.values())))
    predict, out = jax.jit(model.predict), []    # one compile: every batch is padded alike
    for start, stop in _batches(n, batch_size):
        batch = {k: _pad_rows(v[start:stop], batch_size) for k, v in inputs.items()}
        out.append(np.asarray(predict(params, batch)).reshape(-1)[:stop - start])
    return np.concatenate(out) if out else np.zeros(0)


def predict_spans(model, params, features: Mapping[str, np.ndarray], *, batch_size: int,
                  max_answer_length: int = 30) -> dict[str, np.ndarray]:
    """A `SpanQA` model's best span per window of `t2t.data.span_qa` features: "start",
    "end" [n] token positions, "span_score" [n] (never "no answer": SQuAD 2.0 compares it
    with "null_score" [n], the [CLS] start + end score, per question)."""
    import jax
    inputs = {k: v for k, v in features.items() if k not in ("start_positions", "end_positions")}
    best = jax.jit(lambda p, b: model.best_spans(p, b, max_answer_length=max_answer_length,
                                                 null_threshold=float("inf")))
    n = len(inputs["encoder_input_tokens"])
    out: dict[str, list] = {"start": [], "end": [], "span_score": [], "null_score": []}
    for start, stop in _batches(n, batch_size):
        spans = best(params, {k: _pad_rows(v[start:stop], batch_size) for k, v in inputs.items()})
        for key in out:
            out[key].append(np.asarray(spans[key])[:stop - start])
    return {k: np.concatenate(v) if v else np.zeros(0) for k, v in out.items()}


def trivial_baseline(task: FinetuneTask) -> tuple[str, Any] | None:
    """(name, what it predicts) of the trivial baseline of a task: the majority class of
    the training labels (tasks with ``label_counts``: label name), or copying the input
    without the task's prefix (text-to-text tasks without labels: None); None for others."""
    if getattr(task, "label_names", None):
        counts = getattr(task, "label_counts", None)
        if not counts:
            return None
        name = max(counts, key=lambda k: (counts[k], -list(task.label_names).index(k)))
        return f"majority class {name!r}", name
    if task.postprocess_fn is None:
        return "copy the input", None
    return None


def _copy_input(task: FinetuneTask, text: str) -> str:
    prefix = getattr(task, "input_prefix", None)
    return text[len(prefix):] if prefix and text.startswith(prefix) else text


def _encoder_rows(task: FinetuneTask, split: str, max_examples: int | None) -> list[dict]:
    """Input texts and target of the records `classification_examples` reads, in order."""
    source = task.get_source(split)
    out = []
    for i in spread(len(source), max_examples):
        record = source[i]
        if isinstance(record, InvalidRecord):
            continue
        a, b, label = task.encoder_pair_fn(record)
        out.append({"input": a if b is None else [a, b], "target": _label_text(task, label)})
    return out


def _label_text(task: FinetuneTask, label: Any) -> Any:
    names = getattr(task, "label_names", None)
    if names and isinstance(label, (int, np.integer)) and 0 <= int(label) < len(names):
        return names[int(label)]
    return float(label) if isinstance(label, (float, np.floating)) else label


def evaluate(model, params, task: str | FinetuneTask, split: str = "validation", *,
             vocabulary: Any = None, batch_size: int = 32,
             max_decode_length: int | None = None, max_examples: int | None = None,
             sequence_length: Mapping[str, int] | None = None, max_length: int = 512,
             prefix_lm: bool = True, details: dict | None = None,
             **decode_options) -> dict[str, float]:
    """Scores of ``model`` on ``task``'s ``split`` (``max_examples`` evenly spread
    over it, as ``benchmarks.spread``).

    ``vocabulary``: for text-to-text models the one inputs are encoded and predictions
    decoded with (default: the task's); for ``bert`` classifiers the WordPiece vocabulary
    (required), with inputs cut to ``max_length``. ``prefix_lm``: whether a ``gpt`` model
    sees its prompt bidirectionally (as T5's prefix LM) or causally. ``decode_options`` go
    to ``model.predict`` (``strategy="beam"``, ``beam_size=4``, ...). ``details``, if
    given, receives ``"rows"`` (``{"input", "target", "prediction"}`` per example) and,
    when the task has one, ``"baseline"``: (name, scores) of `trivial_baseline`.
    """
    task = get_task(task) if isinstance(task, str) else task
    baseline = trivial_baseline(task) if details is not None else None
    if not task.metric_fns:
        raise ValueError(f"task {task.name!r} has no metrics (an unlabelled split?)")
    if _continues_prompt(model) and hasattr(model, "num_classes"):
        raise ValueError("decoder-only classifiers (LastTokenClassifier) are not supported; "
                         "evaluate a bert classifier or a text-to-text model")
    if (isinstance(model, FineTuningModel)     # a classifier (BART's: of a family that decodes)
            or families.get(getattr(model, "family", "t5")).decoding is None):
        if vocabulary is None:
            raise ValueError("a bert classifier needs its WordPiece `vocabulary`")
        features = classification_examples(task, split, vocabulary, max_length, max_examples)
        targets = features["label"] if "label" in features else features["target"]
        predictions = predict_labels(model, params, features, batch_size=batch_size)
        if details is not None:
            rows = _encoder_rows(task, split, max_examples)
            for row, p in zip(rows, predictions.tolist()):
                row["prediction"] = _label_text(task, p)
            details["rows"] = rows
            if baseline is not None:
                guess = list(task.label_names).index(baseline[1])
                details["baseline"] = (baseline[0], apply_metrics(
                    task, targets.tolist(), [guess] * len(targets)))
        return apply_metrics(task, targets.tolist(), predictions.tolist())
    if vocabulary is not None and vocabulary is not task._vocabulary:
        task = task.with_vocabulary(vocabulary)
    examples = task.examples(split, max_examples)
    predictions = predict_texts(model, params, examples, task.vocabulary,
                                batch_size=batch_size, max_decode_length=max_decode_length,
                                sequence_length=sequence_length, prefix_lm=prefix_lm,
                                **decode_options)
    if details is not None:
        details["rows"] = [{"input": ex.get("inputs_pretokenized"),
                            "target": ex.get("targets_pretokenized"), "prediction": p}
                           for ex, p in zip(examples, predictions)]
        if baseline is not None:
            guesses = [baseline[1] if baseline[1] is not None else
                       _copy_input(task, str(ex.get("inputs_pretokenized", "")))
                       for ex in examples]
            details["baseline"] = (baseline[0], compute_metrics(task, examples, guesses))
    return compute_metrics(task, examples, predictions)


def results_table(results: Mapping[str, Mapping[str, float]]) -> str:
    """A markdown table: one row per task, one column per metric (first-seen order)."""
    columns: list[str] = []
    for scores in results.values():
        columns += [k for k in scores if k not in columns]
    lines = ["| task | " + " | ".join(columns) + " |",
             "|---|" + "---:|" * len(columns)]
    for name, scores in results.items():
        cells = [f"{scores[c]:.2f}" if c in scores else "-" for c in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_results(results: Mapping[str, Mapping[str, float]],
                  out_dir: str | os.PathLike, extra: Mapping[str, Any] | None = None
                  ) -> tuple[epath.Path, epath.Path]:
    """Writes ``metrics.json`` (all digits; ``extra`` entries too, such as your data's
    counts under "data") and ``results.md`` (the table of ``results``) into ``out_dir``
    (local or gs://); their paths."""
    out = storage.path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "metrics.json", out / "results.md"
    json_path.write_text(json.dumps({**results, **(extra or {})}, indent=2, sort_keys=True)
                         + "\n")
    md_path.write_text(results_table(results))
    return json_path, md_path


def write_predictions(rows: Mapping[str, Sequence[Mapping[str, Any]]],
                      out_dir: str | os.PathLike) -> epath.Path:
    """``predictions.jsonl`` in ``out_dir``: ``{"split", "input", "target", "prediction"}``
    per example."""
    path = storage.path(out_dir) / "predictions.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"split": split, **row}, ensure_ascii=False,
                                       default=_plain) + "\n"
                            for split, split_rows in rows.items() for row in split_rows))
    return path


def _plain(value: Any) -> Any:
    return value.tolist() if hasattr(value, "tolist") else str(value)
