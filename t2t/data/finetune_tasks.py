"""Fine-tuning tasks in T5's text-to-text form: the `FinetuneTask` class, the records'
formats (GLUE, SuperGLUE, SQuAD, translation, summarization), the tokenizing step, label
postprocessing, metric wrappers and ``classification_examples`` for BERT-style heads.

Examples are ``{"inputs", "targets"}`` token ids (EOS appended) plus the strings
(``inputs_pretokenized``, ``targets_pretokenized``) and what scoring needs (``label``,
``answers``, ``group``); the feature converters read only ``inputs``/``targets``. The
named tasks built from these live in the catalogue: `t2t.data.catalog.downstream` (the
papers' benchmarks over TFDS) and `t2t.data.catalog.offline` (data from package registries).
"""
from __future__ import annotations

import copy
import functools
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from t2t.data.converters import FeatureConverter
from t2t.data.hf_tokenizer import row_layout
from t2t.data.pipeline import BatchIterator, make_pipeline
from t2t.data.preprocessors import SkipExample
from t2t.data.sources import SPLITS, InvalidRecord, RandomAccessSource
from t2t.data.tasks import Task, TaskFn, get_task
from t2t.evaluation import metrics


# ----------------------------------------------------------------------------- the task


class FinetuneTask(Task):
    """A Task with named splits and what scoring needs.

    ``split_source_fn(split)`` makes a split's source (``.source`` is the first split, so
    mixtures train on it). ``postprocess_fn(text, example, is_target)`` maps a decoded
    string (or the example's target string) to what the metrics compare: by default the
    label id for tasks with ``label_names`` (-1 for an unknown string), else the text.
    ``encoder_pair_fn(record) -> (text_a, text_b | None, label)`` makes the task usable by
    BERT-style classifiers (``classification_examples``). ``input_prefix``: what the
    task's inputs start with when they are one text field (``"translate English to
    German: "``), so ``t2t infer`` can give a plain line the form the model was tuned on.
    """

    def __init__(self, name: str, split_source_fn: Callable[[str], RandomAccessSource],
                 preprocessors: Sequence[Callable], vocabulary: Any = None,
                 metric_fns: Sequence[Callable] = (), *, splits: Sequence[str] = SPLITS,
                 postprocess_fn: Callable | None = None,
                 label_names: Sequence[str] | None = None,
                 encoder_pair_fn: Callable | None = None, description: str = "",
                 input_prefix: str | None = None):
        self.splits = tuple(splits)
        self.input_prefix = input_prefix
        super().__init__(name, functools.partial(split_source_fn, self.splits[0]),
                         preprocessors, vocabulary, metric_fns, description)
        self.split_source_fn = split_source_fn
        self.label_names = None if label_names is None else tuple(label_names)
        if postprocess_fn is None and self.label_names is not None:
            postprocess_fn = functools.partial(label_to_id, label_names=self.label_names)
        self.postprocess_fn = postprocess_fn
        self.encoder_pair_fn = encoder_pair_fn
        self._sources: dict[str, RandomAccessSource] = {}

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_source": None, "_sources": {}}

    @property
    def source(self) -> RandomAccessSource:
        return self.get_source(self.splits[0])

    def get_source(self, split: str) -> RandomAccessSource:
        """The source of one split (made on first use)."""
        if split not in self.splits:
            raise ValueError(f"task {self.name!r} has splits {list(self.splits)}, not {split!r}")
        if split not in self._sources:
            self._sources[split] = self.split_source_fn(split)
        return self._sources[split]

    def with_vocabulary(self, vocabulary: Any) -> FinetuneTask:
        """A copy of this task that tokenizes with ``vocabulary``."""
        task = copy.copy(self)
        task._vocabulary, task._sources = vocabulary, dict(self._sources)
        return task

    def get_pipeline(self, converter: FeatureConverter, batch_size: int, seed: int,
                     split: str | None = None, **kwargs) -> BatchIterator:
        """``Task.get_pipeline`` over ``split`` (default: the first split, ``train``)."""
        self.vocabulary  # resolve once here, not in every worker
        source = self.get_source(split or self.splits[0])
        return make_pipeline(source, TaskFn(self, converter.lengths), converter, batch_size,
                             seed, **kwargs)

    def examples(self, split: str, max_examples: int | None = None) -> list[dict]:
        """The preprocessed examples of a split, in source order (for evaluation); with
        ``max_examples``, those of records evenly spread over the split (``spread``)."""
        source, out = self.get_source(split), []
        for i in spread(len(source), max_examples):
            record = source[i]
            if isinstance(record, InvalidRecord):
                continue
            try:
                out.extend(self.preprocess(record, (0, i)))
            except SkipExample:
                continue
            if max_examples is not None and len(out) >= max_examples:
                return out[:max_examples]
        return out

    def postprocess(self, text: Any, example: Mapping | None = None,
                    is_target: bool = False) -> Any:
        if self.postprocess_fn is None:
            return text
        return self.postprocess_fn(text, example, is_target)


# ----------------------------------------------------------------------------- shared steps


def text(value: Any) -> str:
    """A TFDS/JSON text value (str, bytes, 0-d numpy array) as ``str``."""
    if isinstance(value, np.ndarray):
        value = value.item()
    if isinstance(value, (bytes, np.bytes_)):
        return bytes(value).decode("utf-8")
    return str(value)


def texts(values: Any) -> list[str]:
    """A sequence feature of texts (list or numpy array) as ``list[str]``."""
    return [text(v) for v in np.asarray(values, dtype=object).reshape(-1)]


def tokenize_text_to_text(example: Mapping[str, Any], *, vocabulary: Any) -> dict:
    """``inputs``/``targets`` strings -> token ids + EOS; the strings stay as ``*_pretokenized``."""
    out = {k: v for k, v in example.items() if k not in ("inputs", "targets")}
    eos = [] if getattr(vocabulary, "eos_id", None) is None else [vocabulary.eos_id]
    for key in ("inputs", "targets"):
        out[f"{key}_pretokenized"] = example[key]
        out[key] = np.asarray(list(vocabulary.encode(example[key])) + eos, np.int32)
    return out


def label_to_id(text_: Any, example: Mapping | None = None, is_target: bool = False, *,
                label_names: Sequence[str]) -> int:
    """T5's ``string_label_to_class_id``: the label's index, -1 for any other string."""
    try:
        return list(label_names).index(str(text_).strip())
    except ValueError:
        return -1


def string_to_float(text_: Any, example: Mapping | None = None, is_target: bool = False, *,
                    default: float = -1.0) -> float:
    """STS-B: the predicted score, ``default`` if it is not a number."""
    try:
        return float(str(text_).strip())
    except ValueError:
        return default


def squad_postprocess(text_: str, example: Mapping, is_target: bool = False) -> Any:
    """Targets -> the example's list of gold answers; predictions as decoded."""
    return list(example["answers"]) if is_target else text_


def multirc_postprocess(text_: str, example: Mapping, is_target: bool = False, *,
                        label_names: Sequence[str] = ("False", "True")) -> dict:
    """``{"group": question, "value": label id}`` for the per-question metrics."""
    return {"group": example["group"], "value": label_to_id(text_, label_names=label_names)}


def record_postprocess(text_: str, example: Mapping, is_target: bool = False) -> dict:
    """``{"group": query, "value": gold answers | prediction}`` (deduplicated when scored)."""
    value = (list(example["answers"]) or [text_]) if is_target else text_
    return {"group": example["group"], "value": value}


def pair_fields(record: Mapping, *, fields: Sequence[str], label_type: type = int
                ) -> tuple[str, str | None, Any]:
    """``encoder_pair_fn`` for records with one or two text fields and a ``label``."""
    second = text(record[fields[1]]) if len(fields) > 1 else None
    return text(record[fields[0]]), second, label_type(record["label"])


# ----------------------------------------------------------------------------- metrics


def f1_with_invalid(targets: Sequence[int], predictions: Sequence[int]) -> dict[str, float]:
    """Binary F1 of label 1 where an invalid prediction (-1) counts as wrong (as T5)."""
    t = np.asarray(targets, int)
    p = np.asarray(predictions, int)
    p = np.where((p == 0) | (p == 1), p, 1 - t)
    return metrics.f1(t, p)


def macro_f1(targets: Sequence[int], predictions: Sequence[int], *,
             num_classes: int) -> dict[str, float]:
    """Mean of the per-class F1s (CB) over the classes ``0..num_classes-1`` that occur in
    targets or predictions; an invalid prediction (-1) is never right."""
    seen = set(targets) | set(predictions)
    labels = [c for c in range(num_classes) if c in seen]
    skm = metrics.backend("sklearn.metrics")
    score = skm.f1_score(list(targets), list(predictions), labels=labels, average="macro",
                         zero_division=0)
    return {"f1_macro": 100.0 * float(score)}


def multirc_f1a(targets: Sequence[dict], predictions: Sequence[dict]) -> dict[str, float]:
    """MultiRC F1a: binary F1 over all answer options."""
    return {"f1a": f1_with_invalid([t["value"] for t in targets],
                                   [p["value"] for p in predictions])["f1"]}


def multirc_em(targets: Sequence[dict], predictions: Sequence[dict]) -> dict[str, float]:
    """MultiRC EM: the fraction of questions whose every answer option is right."""
    right: dict[Any, bool] = {}
    for t, p in zip(targets, predictions):
        right[t["group"]] = right.get(t["group"], True) and t["value"] == p["value"]
    return {"em": 100.0 * float(np.mean(list(right.values()))) if right else 0.0}


def record_squad(targets: Sequence[dict], predictions: Sequence[dict]) -> dict[str, float]:
    """ReCoRD: SQuAD EM/F1 (max over gold answers), one prediction per query."""
    seen: dict[Any, tuple] = {}
    for t, p in zip(targets, predictions):
        seen.setdefault(t["group"], (t["value"], p["value"]))
    golds, preds = zip(*seen.values()) if seen else ((), ())
    return metrics.squad(list(golds), list(preds))


# ----------------------------------------------------------------------------- formats


def glue_format(record: Mapping, *, benchmark: str, feature_names: Sequence[str],
                label_names: Sequence[str]) -> dict:
    """T5's ``glue``: ``"<benchmark> <key>: <text> ..."`` -> the label's name (``<unk>`` if -1)."""
    fields = {k: text(record[k]) for k in feature_names}
    if benchmark == "multirc":  # T5 strips MultiRC's HTML markup
        fields["paragraph"] = re.sub(r"<(/)?b>", "", fields["paragraph"].replace("<br>", " "))
    parts = [benchmark]
    for key in feature_names:
        parts += [f"{key}:", fields[key]]
    label = int(record["label"])
    out = {"inputs": " ".join(parts), "targets": "<unk>" if label == -1 else label_names[label],
           "label": label}
    if benchmark == "multirc":
        idx = record["idx"]
        out["group"] = (int(idx["paragraph"]), int(idx["question"]))
    return out


def stsb_format(record: Mapping) -> dict:
    """T5's ``stsb``: the similarity score rounded to the nearest 0.2, as ``"3.8"``."""
    label = float(record["label"])
    inputs = f"stsb sentence1: {text(record['sentence1'])} sentence2: {text(record['sentence2'])}"
    return {"inputs": inputs, "targets": f"{np.round(label * 5) / 5:.1f}", "label": label}


def _mark_span(text_: str, span: str, index: int, mark: str) -> str:
    pattern = r"^((?:\S+\s){%d})(%s)" % (index, re.escape(span))
    return re.sub(pattern, lambda m: f"{m.group(1)}{mark} {m.group(2)} {mark}", text_, count=1)


def wsc_format(record: Mapping, *, label_names: Sequence[str] = ("False", "True")) -> dict:
    """T5's ``wsc``: the noun in ``*`` and the pronoun in ``#`` -> ``True``/``False``."""
    i1, i2 = int(record["span1_index"]), int(record["span2_index"])
    marked = _mark_span(text(record["text"]), text(record["span1_text"]), i1, "*")
    marked = _mark_span(marked, text(record["span2_text"]), i2 + 2 * (i1 < i2), "#")
    label = int(record["label"])
    return {"inputs": f"wsc text: {marked}",
            "targets": "<unk>" if label == -1 else label_names[label], "label": label}


def record_format(record: Mapping) -> list[dict]:
    """T5's ``record``: one example per gold answer (``<unk>`` if none), entities listed."""
    passage = re.sub(r"(\.|\?|\!|\"|\')\n@highlight\n", r"\1 ", text(record["passage"]))
    passage = re.sub(r"\n@highlight\n", ". ", passage)
    inputs = (f"record query: {text(record['query'])} entities: "
              f"{', '.join(texts(record['entities']))} passage: {passage}")
    answers = texts(record["answers"])
    idx = record["idx"]
    group = (int(idx["passage"]), int(idx["query"]))
    return [{"inputs": inputs, "targets": answer, "answers": answers, "group": group}
            for answer in (answers or ["<unk>"])]


def pad_punctuation(text_: str) -> str:
    """T5's ``_pad_punctuation``: spaces around every non-word character, then collapsed."""
    return re.sub(r"\s+", " ", re.sub(r"(\W)", r" \1 ", text_, flags=re.ASCII))


UNANSWERABLE = "unanswerable"


def squad_format(record: Mapping) -> dict:
    """T5's ``squad``: ``question: q context: c`` -> the first answer; every answer kept."""
    answers = [pad_punctuation(a) for a in texts(record["answers"]["text"])]
    if bool(record.get("is_impossible", False)) or not answers:
        answers = [UNANSWERABLE]
    inputs = " ".join(["question:", pad_punctuation(text(record["question"])), "context:",
                       pad_punctuation(text(record["context"]))])
    return {"inputs": inputs, "targets": answers[0], "answers": answers}


def translate_prefix(source: str, target: str) -> str:
    """``translate English to German: `` for ("en", "de")."""
    return f"translate {LANGUAGES[source]} to {LANGUAGES[target]}: "


def translate_format(record: Mapping, *, source: str, target: str) -> dict:
    """T5's ``translate``: ``translate English to German: <en>`` -> ``<de>``."""
    return {"inputs": translate_prefix(source, target) + text(record[source]),
            "targets": text(record[target])}


def summarize_format(record: Mapping, *, article_key: str = "article",
                     summary_key: str = "highlights", prefix: str = "summarize: ") -> dict:
    """T5's ``summarize``: ``summarize: <article>`` -> the summary."""
    return {"inputs": prefix + text(record[article_key]), "targets": text(record[summary_key])}


LANGUAGES = {"en": "English", "de": "German", "fr": "French", "ro": "Romanian",
             "es": "Spanish", "it": "Italian", "ru": "Russian", "ja": "Japanese",
             "zh": "Chinese", "pt": "Portuguese"}


# ----------------------------------------------------------------------------- BERT features


def truncate_pair(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
    """BERT's ``_truncate_seq_pair`` in closed form: trim the longer side (b on ties)."""
    if len_a + len_b <= budget:
        return len_a, len_b
    a = min(len_a, max(budget - len_b, (budget + 1) // 2))
    return a, min(len_b, budget - a)


def spread(n: int, k: int | None) -> Sequence[int]:
    """``k`` indices evenly spread over ``range(n)``, in order (all of them when ``k`` is
    None or >= n): a subset that keeps the label mix of a split stored sorted by label."""
    if k is None or k >= n:
        return range(n)
    return [i * n // k for i in range(k)]


def classification_examples(task: str | FinetuneTask, split: str, vocabulary: Any,
                            max_length: int, max_examples: int | None = None
                            ) -> dict[str, np.ndarray]:
    """A classification task's split as BERT encoder features (numpy).

    ``[CLS] a [SEP] (b [SEP])`` with a WordPiece ``vocabulary``, or whatever special tokens
    and token types its tokenizer puts around one text or two (``<s> a </s></s> b </s>``
    for RoBERTa's; `t2t.data.hf_tokenizer.row_layout`), longest-first truncation to
    ``max_length``: ``encoder_input_tokens``, ``encoder_segment_ids`` (1 on tokens),
    ``token_type_ids`` [n, max_length] int32 and ``label`` [n] int32 (``target`` [n]
    float32 for a regression task such as STS-B).
    """
    task = get_task(task) if isinstance(task, str) else task
    if getattr(task, "encoder_pair_fn", None) is None:
        raise ValueError(f"task {task.name!r} has no sentence-pair form for encoder models")
    source = task.get_source(split)
    pairs = [task.encoder_pair_fn(r) for r in (source[i] for i in spread(len(source), max_examples))
             if not isinstance(r, InvalidRecord)]
    a_ids = vocabulary.encode_batch([p[0] for p in pairs], add_special_tokens=False)
    b_ids = vocabulary.encode_batch([p[1] or "" for p in pairs], add_special_tokens=False)
    tokens = np.full((len(pairs), max_length), vocabulary.pad_id, np.int32)
    types_ = np.zeros((len(pairs), max_length), np.int32)
    segments = np.zeros((len(pairs), max_length), np.int32)
    layout = row_layout(vocabulary)     # the tokenizer's own special tokens and types
    for row, ((_, b, _), a_tok, b_tok) in enumerate(zip(pairs, a_ids, b_ids)):
        if b is None:
            ids, kinds = layout.build(a_tok[:max_length - layout.added()])
        else:
            la, lb = truncate_pair(len(a_tok), len(b_tok), max_length - layout.added(True))
            ids, kinds = layout.build(a_tok[:la], b_tok[:lb])
        tokens[row, :len(ids)] = ids
        segments[row, :len(ids)] = 1
        types_[row, :len(kinds)] = kinds
    labels = [p[2] for p in pairs]
    regression = any(isinstance(x, float) for x in labels)
    return {"encoder_input_tokens": tokens, "encoder_segment_ids": segments,
            "token_type_ids": types_, "target" if regression else "label":
            np.asarray(labels, np.float32 if regression else np.int32)}
