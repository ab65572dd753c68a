"""Tasks over your own files: `from_files` (fine-tuning) and `text_files_tasks` (pretraining).

`from_files` reads labelled files (`t2t.data.user_files.RecordFiles`) into a `FinetuneTask`
of one kind, decided by the files and the fields named:

* text_to_text (input_field, target_field): T5 ``prefix input -> target``; bleu, chrf.
* classification (text_field, text_pair_field for pairs, label_field): T5 ``prefix text ->
  label``, BERT `SequenceClassifier`; accuracy, f1_macro.
* regression (as classification, every label a number and some not whole): T5 ``-> "3.8"``,
  BERT `Regressor`; pearson, spearman.
* span_qa (SQuAD-format .json): T5 ``question: .. context: .. -> answer``, BERT `SpanQA`;
  squad (EM, F1).
* tagging (CoNLL .conll/.iob/.bio): BERT `TokenTagger`; token accuracy and entity
  precision/recall/f1 (seqeval, conlleval's reading: `t2t.evaluation.metrics.entities`).

The label set is read from the training files (sorted) unless given. The gin builder
`t2t.run.user_data.files_task` (configs/experiments/finetune_*_from_files.gin) registers
one, saving its labels in MODEL_DIR/labels.json; `text_corpus` does the same for
pretraining files.
"""
from __future__ import annotations

import collections
import functools
import json
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from t2t.data import tasks as tasks_lib
from t2t.data import user_files, vocab_training
from t2t.data.finetune_tasks import (FinetuneTask, f1_with_invalid, macro_f1, squad_format,
                                     squad_postprocess, string_to_float, text,
                                     tokenize_text_to_text)
from t2t.data.preprocessors import SkipExample
from t2t.data.streaming import TextStream
from t2t.errors import ConfigError, InputFileError
from t2t.evaluation import metrics as metrics_lib

_log = logging.getLogger(__name__)

KINDS = ("text_to_text", "classification", "regression", "span_qa", "tagging")
DEFAULT_METRICS = {"text_to_text": ("bleu", "chrf"), "classification": ("accuracy", "f1_macro"),
                   "regression": ("pearson", "spearman"), "span_qa": ("squad",),
                   "tagging": ("accuracy", "f1")}
LABELS_FILE = "labels.json"


# ----------------------------------------------------------------------------- metrics


def chrf(targets: Sequence[str], predictions: Sequence[str]) -> dict[str, float]:
    """sacrebleu's corpus chrF (character 6-grams, beta 2), 0-100."""
    sacrebleu = metrics_lib.backend("sacrebleu")
    return {"chrf": float(sacrebleu.corpus_chrf(list(predictions), [list(targets)]).score)}


def exact_match(targets: Sequence[str], predictions: Sequence[str]) -> dict[str, float]:
    """Share of predictions equal to their target after stripping spaces, in percent."""
    same = [str(t).strip() == str(p).strip() for t, p in zip(targets, predictions)]
    return {"exact_match": 100.0 * float(np.mean(same)) if same else 0.0}


token_accuracy = metrics_lib.token_accuracy


def metric_fns(names: Sequence[str], kind: str, num_classes: int = 0) -> tuple:
    """The metric functions of ``names`` for a task of ``kind``; unknown names are a
    ConfigError listing the valid ones."""
    table: dict[str, Any] = {
        "bleu": metrics_lib.bleu, "chrf": chrf, "rouge": metrics_lib.rouge,
        "exact_match": exact_match, "squad": metrics_lib.squad,
        "accuracy": metrics_lib.accuracy, "matthews": metrics_lib.matthews_corrcoef,
        "f1_macro": functools.partial(macro_f1, num_classes=num_classes),
        "f1": f1_with_invalid, "pearson": metrics_lib.pearson,
        "spearman": metrics_lib.spearman}
    if kind == "tagging":
        table.update(accuracy=token_accuracy, f1=metrics_lib.entities)
    unknown = [n for n in names if n not in table]
    if unknown:
        raise ConfigError(f"METRICS: unknown metric {unknown[0]!r}; choose from "
                          f"{', '.join(sorted(table))}")
    return tuple(table[n] for n in names)


def metric_names(metrics: str | Sequence[str] | None, kind: str) -> tuple[str, ...]:
    """``METRICS`` as names: a list, a comma-separated string, or None (the kind's default)."""
    if metrics is None or metrics == "" or metrics == []:
        return DEFAULT_METRICS[kind]
    if isinstance(metrics, str):
        metrics = [m.strip() for m in metrics.split(",") if m.strip()]
    return tuple(metrics)


# ----------------------------------------------------------------------------- labels


def _label_value(value: Any) -> str | float:
    """A label as read: a number (JSON number or numeric string) as float, else a string."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(str(value).strip())
    except ValueError:
        return str(value).strip()


def label_name(value: Any) -> str:
    """A class label as a string: whole numbers without ``.0`` (``1.0`` and ``"1"`` -> "1")."""
    v = _label_value(value)
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


def is_regression(values: Sequence[Any]) -> bool:
    """Every label a number and some not whole (3.8): a regression target."""
    parsed = [_label_value(v) for v in values]
    return bool(parsed) and all(isinstance(v, float) for v in parsed) and any(
        not v.is_integer() for v in parsed)


def label_set(values: Sequence[Any]) -> tuple[str, ...]:
    """The distinct class names, numbers in numeric order, then strings sorted."""
    names = {label_name(v) for v in values}
    numeric = sorted((n for n in names if _is_number(n)), key=float)
    return tuple(numeric + sorted(n for n in names if not _is_number(n)))


def _is_number(name: str) -> bool:
    try:
        float(name)
        return True
    except ValueError:
        return False


def read_labels(model_dir: str | None) -> tuple[str, ...] | None:
    """MODEL_DIR/labels.json's label names (written by `save_labels`), or None."""
    path = os.path.join(model_dir or "", LABELS_FILE)
    if not model_dir or not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return tuple(json.load(f)["labels"])


def save_labels(model_dir: str, labels: Sequence[str], kind: str) -> None:
    """Writes the label set beside the model's checkpoints (process 0's job)."""
    from t2t import storage
    path = storage.path(model_dir) / LABELS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"kind": kind, "labels": list(labels)}, indent=1) + "\n")


# ----------------------------------------------------------------------------- formats


def text_pair_format(record: Mapping, *, input_field: str, target_field: str,
                     prefix: str) -> dict:
    """``prefix + record[input_field]`` -> ``record[target_field]``."""
    if record.get(input_field) is None or record.get(target_field) is None:
        raise SkipExample("missing_field")
    return {"inputs": prefix + text(record[input_field]),
            "targets": text(record[target_field])}


def classification_inputs(record: Mapping, text_field: str, pair_field: str | None,
                          prefix: str) -> str:
    """``prefix + text``, or ``prefix + "<text_field>: a <pair_field>: b"`` for pairs (T5)."""
    if pair_field is None:
        return prefix + text(record[text_field])
    return (f"{prefix}{text_field}: {text(record[text_field])} "
            f"{pair_field}: {text(record[pair_field])}")


def label_format(record: Mapping, *, text_field: str, pair_field: str | None,
                 label_field: str, prefix: str, labels: Sequence[str]) -> dict:
    """Classification as text: inputs -> the label's name; ``label``: its index (-1 if
    the label set lacks it)."""
    name = label_name(record[label_field])
    label = labels.index(name) if name in labels else -1
    return {"inputs": classification_inputs(record, text_field, pair_field, prefix),
            "targets": name, "label": label}


def regression_format(record: Mapping, *, text_field: str, pair_field: str | None,
                      label_field: str, prefix: str) -> dict:
    """Regression as text (T5's STS-B): inputs -> the number, e.g. "3.8"."""
    value = float(_label_value(record[label_field]))
    return {"inputs": classification_inputs(record, text_field, pair_field, prefix),
            "targets": f"{value:g}", "label": value}


def encoder_pair(record: Mapping, *, text_field: str, pair_field: str | None,
                 label_field: str, labels: Sequence[str] | None) -> tuple[str, str | None, Any]:
    """(text a, text b or None, label index | float) for BERT's classification_examples."""
    b = None if pair_field is None else text(record[pair_field])
    if labels is None:
        return text(record[text_field]), b, float(_label_value(record[label_field]))
    name = label_name(record[label_field])
    return text(record[text_field]), b, labels.index(name) if name in labels else -1


class _Splits:
    """Picklable ``split -> source`` over sources read already."""

    def __init__(self, sources: Mapping[str, Any]):
        self.sources = dict(sources)

    def __call__(self, split: str) -> Any:
        return self.sources[split]


# ----------------------------------------------------------------------------- from_files

SPLIT_MACROS = {"train": "TRAIN_FILES", "validation": "VALIDATION_FILES", "test": "TEST_FILES"}


def task_kind(file_kind: str, input_field: str | None, target_field: str | None,
              text_field: str | None, label_field: str | None) -> str:
    """The task kind of files of ``file_kind`` with these fields (before the labels decide
    classification or regression); a ConfigError when the fields name neither."""
    if file_kind == "squad":
        return "span_qa"
    if file_kind == "conll":
        return "tagging"
    if input_field and target_field:
        return "text_to_text"
    if text_field and label_field:
        return "classification"
    raise ConfigError("name the fields: INPUT_FIELD and TARGET_FIELD (text-to-text), or "
                      "TEXT_FIELD and LABEL_FIELD (classification)")


def bible_vocabulary() -> Any:
    """The bundled Bible's SentencePiece (`t2t.data.catalog.bible`), built on first use."""
    from t2t.data.catalog.bible import bible_sentencepiece
    return bible_sentencepiece()


def from_files(train_files: user_files.Patterns, validation_files: Any = None,
               test_files: Any = None, *, input_field: str | None = None,
               target_field: str | None = None, text_field: str | None = None,
               text_pair_field: str | None = None, label_field: str | None = None,
               task_prefix: str | None = None, metrics: Any = None,
               vocabulary: Any = None,
               labels: Sequence[str] | None = None, name: str | None = None) -> FinetuneTask:
    """A `FinetuneTask` over your labelled files (see the module docstring for the kinds).

    Files are globs, paths or directories of JSONL, TSV/CSV (a header row), SQuAD JSON or
    CoNLL; every split is read and checked now (bad lines counted in
    ``task.bad_lines[split]``; a missing file, an empty glob or a split without one good
    line is an InputFileError). ``task_prefix`` starts every input, a space after it.
    ``labels``: the class names (default: those of the training files). ``vocabulary``
    tokenizes for text-to-text models (object or factory; default the bundled Bible's
    SentencePiece, `bible_vocabulary`).
    """
    vocabulary = bible_vocabulary if vocabulary is None else vocabulary
    files = {"train": user_files.expand(train_files, "TRAIN_FILES")}
    for split, patterns in (("validation", validation_files), ("test", test_files)):
        if patterns:
            files[split] = user_files.expand(patterns, SPLIT_MACROS[split])
    kind = task_kind(user_files.RecordFiles.kind(files["train"][0]), input_field, target_field,
                     text_field, label_field)
    required = {"text_to_text": (input_field, target_field),
                "classification": (text_field, label_field)}.get(kind, ())
    optional = (text_pair_field,) if text_pair_field and kind == "classification" else ()
    if optional:
        required = required + optional
    sources = {split: user_files.RecordFiles(paths, required) for split, paths in files.items()}
    for split, source in sources.items():
        _check_split(split, files[split], source, required)
    if kind == "classification" and labels is None and is_regression(
            [r[label_field] for r in sources["train"].records]):
        kind = "regression"
    prefix = task_prefix.rstrip() + " " if task_prefix else ""   # "summarize:" + " " + text
    tok = tokenize_text_to_text
    common: dict[str, Any] = {}
    if kind == "text_to_text":
        steps = [functools.partial(text_pair_format, input_field=input_field,
                                   target_field=target_field, prefix=prefix), tok]
    elif kind in ("classification", "regression"):
        fields = dict(text_field=text_field, pair_field=text_pair_field, label_field=label_field)
        if kind == "classification":
            labels = _labels(labels, sources, label_field)
            steps = [functools.partial(label_format, prefix=prefix, labels=labels, **fields), tok]
            common = dict(label_names=labels)
        else:
            steps = [functools.partial(regression_format, prefix=prefix, **fields), tok]
            common = dict(postprocess_fn=string_to_float)
        common["encoder_pair_fn"] = functools.partial(encoder_pair, labels=labels, **fields)
    elif kind == "span_qa":
        steps, common = [squad_format, tok], dict(postprocess_fn=squad_postprocess)
    else:
        labels = labels or _tag_set(sources["train"])
        steps, common = [], dict(label_names=labels)
    names = metric_names(metrics, kind)
    task = FinetuneTask(
        name or f"from_files_{kind}", _Splits(sources), steps, vocabulary,
        metric_fns(names, kind, len(labels or ())), splits=tuple(sources),
        description=f"{kind} over {files['train'][0]}"
                    + (f" and {len(files['train']) - 1} more" if files["train"][1:] else ""),
        input_prefix=prefix or None, **common)
    task.kind, task.files, task.metric_names = kind, files, names
    task.bad_lines = {split: source.bad for split, source in sources.items()}
    task.raw_lines = {split: source.lines for split, source in sources.items()}
    task.fields = dict(input=input_field, target=target_field, text=text_field,
                       text_pair=text_pair_field, label=label_field)
    task.label_counts = _label_counts(task, sources["train"])
    return task


def _check_split(split: str, paths: Sequence[str], source: user_files.RecordFiles,
                 required: Sequence[str]) -> None:
    if len(source):
        return
    what = f"{SPLIT_MACROS[split]}: no usable line in {paths[0]}" + (
        f" and {len(paths) - 1} more" if paths[1:] else "")
    first = source.bad.first_any()
    if source.bad.counts.get("missing_field") and source.fields_seen:
        raise InputFileError(f"{what}: no line has field(s) {', '.join(map(repr, required))}; "
                             f"the first line has {', '.join(map(repr, source.fields_seen))}")
    raise InputFileError(f"{what} ({first or 'the files are empty'})")


def _labels(given: Sequence[str] | None, sources: Mapping[str, Any], field: str
            ) -> tuple[str, ...]:
    found = label_set([r[field] for r in sources["train"].records])
    if given is None:
        if len(found) < 2:
            raise InputFileError(f"TRAIN_FILES: every line has the label {found[0]!r}; "
                                 "a classifier needs at least two labels")
        return found
    unknown = [n for n in found if n not in given]
    if unknown:
        raise InputFileError(f"TRAIN_FILES: label {unknown[0]!r} is not among the model's "
                             f"labels {list(given)} (MODEL_DIR/{LABELS_FILE}); use a new "
                             "MODEL_DIR to train on another label set")
    return tuple(given)


def _tag_set(source: user_files.RecordFiles) -> tuple[str, ...]:
    tags = {t for r in source.records for t in r["tags"]}
    return tuple(["O"] * ("O" in tags) + sorted(tags - {"O"}))


def _label_counts(task: FinetuneTask, train: user_files.RecordFiles) -> dict | None:
    """Training labels' counts (classification, tagging) or mean (regression)."""
    field = task.fields["label"]
    if task.kind == "classification":
        return dict(collections.Counter(label_name(r[field]) for r in train.records))
    if task.kind == "regression":
        return {"mean": float(np.mean([_label_value(r[field]) for r in train.records]))}
    if task.kind == "tagging":
        return dict(collections.Counter(t for r in train.records for t in r["tags"]))
    return None


# ----------------------------------------------------------------------------- pretraining

TEXT_CORPUS = "text_files"
VOCAB_SAMPLE_CHARS = 10_000_000   # the vocabulary's sample of your text, whatever its size


def text_files_tasks(stream: TextStream, vocabulary: Any, corpus: str = TEXT_CORPUS
                     ) -> list[tasks_lib.Task]:
    """The pretraining tasks of `t2t.data.catalog.bible.bible_tasks` over your files, read
    as a stream (`t2t.data.streaming.TextStream`): ``<corpus>_span_corruption``, ``_lm``,
    ``_prefix_lm``, T5's objective variants, and BERT's ``_mlm_nsp``, ``_mlm``, ``_ltr``
    (a document's lines' sentences as BERT's; NSP's random B from another buffered
    document), all with ``vocabulary``."""
    paths = stream.paths
    source_fn = functools.partial(_same, stream)
    over = f"{paths[0]}" + (f" and {len(paths) - 1} more files" if paths[1:] else "")
    tasks = tasks_lib.t5_objective_tasks(corpus, source_fn, [tasks_lib.tokenize], vocabulary,
                                         over)
    bert = tasks_lib.BertPretraining(source_fn, sentences_key="sentences", streamed=True)
    tasks += [
        tasks_lib.Task(f"{corpus}_mlm_nsp", source_fn, [bert], vocabulary,
                       description=f"BERT MLM + NSP over {over}"),
        tasks_lib.Task(f"{corpus}_mlm", source_fn, [bert], vocabulary,
                       description=f"BERT MLM over {over}"),
        tasks_lib.Task(f"{corpus}_ltr", source_fn,
                       [functools.partial(tasks_lib.bert_ltr, sentences_key="sentences")],
                       vocabulary, description=f"BERT left-to-right LM over {over}")]
    for task in tasks:
        task.files = {"train": paths}
        task.bad_lines = {"train": user_files.BadLines()}   # met as the stream reads
        task.raw_lines = {"train": 0}
        task.kind = "pretraining"
    return tasks


def _same(source: Any) -> Any:
    return source


def text_vocabulary(stream: TextStream, kind: str, vocabulary: str | None = None,
                    vocab_size: int = 8000, sample_chars: int = VOCAB_SAMPLE_CHARS) -> Any:
    """``vocabulary`` (a .model or vocab.txt path) if given, else one of ``kind``
    ("wordpiece" or "sentencepiece") trained on a bounded, seeded sample of the stream
    (`TextStream.sample_texts`, ``sample_chars`` characters), cached by the files' paths,
    sizes and modification times, so its cost does not grow with the corpus."""
    if vocabulary:
        if not os.path.isfile(vocabulary):
            raise InputFileError(f"VOCABULARY: no such file {vocabulary!r} (a SentencePiece "
                                 ".model or a WordPiece vocab.txt)")
        return vocab_training.load(vocabulary)
    if kind not in ("wordpiece", "sentencepiece"):
        raise ValueError(f"vocabulary kind {kind!r}: 'wordpiece' or 'sentencepiece'")
    key = vocab_training.fingerprint_digest(stream.fingerprint(), kind, vocab_size,
                                            "sample", sample_chars, stream.field,
                                            stream.documents)
    texts = functools.partial(stream.sample_texts, sample_chars)
    if kind == "wordpiece":
        return vocab_training.wordpiece_for(stream.paths, texts, vocab_size, key=key)
    return vocab_training.sentencepiece_for(stream.paths, texts, vocab_size, key=key)
