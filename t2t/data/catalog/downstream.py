"""The papers' downstream tasks, named after their TFDS builders (``glue/cola`` ->
``glue_cola``) and read with ``TfdsSource`` (ArrayRecord, no TensorFlow needed); the task
class, formats and metrics are `t2t.data.finetune_tasks`'s:

* GLUE: cola (MCC), sst2, mrpc and qqp (F1 + accuracy), stsb (Pearson + Spearman), mnli
  (all TFDS splits) with ``glue_mnli_matched`` / ``glue_mnli_mismatched`` (``validation``
  and ``test`` mapped to the matched / mismatched sets), qnli, rte, wnli, and ax (MNLI
  format, test split only, unlabelled: no metric, as in T5).
* SuperGLUE: boolq, cb (accuracy + macro F1), copa, multirc (F1 over answers + exact match
  per question), record (max-over-answers EM/F1, one example per answer), rte, wic, wsc
  (``wsc.fixed``, spans marked with ``*``/``#``).
* SQuAD v1.1 / v2.0 (``question: ... context: ...``, punctuation padded as T5; v2.0's
  unanswerable questions target ``unanswerable``), EM/F1.
* WMT14 en-de / en-fr, WMT16 en-ro (``translate English to German: ...``), BLEU (intl).
* CNN/DailyMail (``summarize: ...``), ROUGE.

T5's 32k vocabulary cannot be downloaded here: `t2t.data.catalog.paper` registers these
with a lazy vocabulary (``t5_vocabulary.path``); ``register_benchmark_tasks(vocabulary)``
registers them with another.
"""
from __future__ import annotations

import functools
import importlib.util
import types
from collections.abc import Mapping
from typing import Any

import numpy as np

from t2t.data.finetune_tasks import (SPLITS, FinetuneTask, f1_with_invalid, glue_format,
                                     macro_f1, multirc_em, multirc_f1a, multirc_postprocess,
                                     pair_fields, record_format, record_postprocess,
                                     record_squad, squad_format, squad_postprocess,
                                     string_to_float, stsb_format, summarize_format,
                                     tokenize_text_to_text, translate_format,
                                     translate_prefix, wsc_format)
from t2t.data.sources import TfdsSource
from t2t.data.tasks import register_task
from t2t.evaluation import metrics


# ----------------------------------------------------------------------------- TFDS sources


def _super_glue_without_tensorflow() -> None:
    """TFDS's ``SuperGlue._info`` names ``tf.int32`` (its only TensorFlow use); without
    TensorFlow that lazy import fails, so the module gets numpy's identical dtype."""
    if importlib.util.find_spec("tensorflow") is not None:
        return
    from tensorflow_datasets.text import super_glue

    if not isinstance(getattr(super_glue, "tf", None), types.SimpleNamespace):
        super_glue.tf = types.SimpleNamespace(int32=np.int32)


def tfds_source(name: str, split: str, *, data_dir: str | None = None,
                split_map: Mapping[str, str] | None = None) -> TfdsSource:
    """``TfdsSource(name, split)`` with task splits renamed by ``split_map``."""
    if name.startswith("super_glue"):
        _super_glue_without_tensorflow()
    return TfdsSource(name, (split_map or {}).get(split, split), data_dir=data_dir)


# ----------------------------------------------------------------------------- the tables

MNLI_LABELS = ("entailment", "neutral", "contradiction")
_accuracy = metrics.accuracy
_F1_ACC = (f1_with_invalid, metrics.accuracy)

# name: (T5 feature order, BERT sentence A/B fields, label names (TFDS order), metrics)
GLUE: dict[str, tuple] = {
    "cola": (("sentence",), ("sentence",), ("unacceptable", "acceptable"),
             (metrics.matthews_corrcoef,)),
    "sst2": (("sentence",), ("sentence",), ("negative", "positive"), (_accuracy,)),
    "mrpc": (("sentence1", "sentence2"), ("sentence1", "sentence2"),
             ("not_equivalent", "equivalent"), _F1_ACC),
    "qqp": (("question1", "question2"), ("question1", "question2"),
            ("not_duplicate", "duplicate"), _F1_ACC),
    "mnli": (("hypothesis", "premise"), ("premise", "hypothesis"), MNLI_LABELS, (_accuracy,)),
    "qnli": (("question", "sentence"), ("question", "sentence"),
             ("entailment", "not_entailment"), (_accuracy,)),
    "rte": (("sentence1", "sentence2"), ("sentence1", "sentence2"),
            ("entailment", "not_entailment"), (_accuracy,)),
    "wnli": (("sentence1", "sentence2"), ("sentence1", "sentence2"),
             ("not_entailment", "entailment"), (_accuracy,)),
    "ax": (("hypothesis", "premise"), ("premise", "hypothesis"), MNLI_LABELS, ()),
}
_MNLI_SPLITS = ("train", "validation_matched", "validation_mismatched", "test_matched",
                "test_mismatched")

SUPER_GLUE: dict[str, tuple] = {
    "boolq": (("passage", "question"), ("question", "passage"), ("False", "True"),
              (_accuracy,)),
    "cb": (("hypothesis", "premise"), ("premise", "hypothesis"),
           ("entailment", "contradiction", "neutral"),
           (_accuracy, functools.partial(macro_f1, num_classes=3))),
    "copa": (("choice1", "choice2", "premise", "question"), None, ("choice1", "choice2"),
             (_accuracy,)),
    "multirc": (("question", "answer", "paragraph"), None, ("False", "True"),
                (multirc_f1a, multirc_em)),
    "rte": (("hypothesis", "premise"), ("premise", "hypothesis"),
            ("entailment", "not_entailment"), (_accuracy,)),
    "wic": (("sentence1", "sentence2", "word"), None, ("False", "True"), (_accuracy,)),
}

# task name: (TFDS name, source language, target language)
TRANSLATION = {"wmt14_ende": ("wmt14_translate/de-en", "en", "de"),
               "wmt14_enfr": ("wmt14_translate/fr-en", "en", "fr"),
               "wmt16_enro": ("wmt16_translate/ro-en", "en", "ro")}


def benchmark_tasks(vocabulary: Any, data_dir: str | None = None) -> list[FinetuneTask]:
    """Every standard benchmark task, tokenizing with ``vocabulary`` (object or factory)."""
    tok = tokenize_text_to_text
    source = functools.partial(functools.partial, tfds_source, data_dir=data_dir)
    tasks = []
    for name, (features, pair, labels, metric_fns) in GLUE.items():
        benchmark = "mnli" if name == "ax" else name
        fmt = functools.partial(glue_format, benchmark=benchmark, feature_names=features,
                                label_names=labels)
        variants = {f"glue_{name}": (source(f"glue/{name}"),
                                     ("test",) if name == "ax" else SPLITS)}
        if name == "mnli":
            variants = {"glue_mnli": (source("glue/mnli"), _MNLI_SPLITS)}
            for kind in ("matched", "mismatched"):
                split_map = {"validation": f"validation_{kind}", "test": f"test_{kind}"}
                variants[f"glue_mnli_{kind}"] = (
                    functools.partial(tfds_source, "glue/mnli", data_dir=data_dir,
                                      split_map=split_map), ("validation", "test"))
        for task_name, (source_fn, splits) in variants.items():
            tasks.append(FinetuneTask(
                task_name, source_fn, [fmt, tok], vocabulary, metric_fns, splits=splits,
                label_names=labels,
                encoder_pair_fn=functools.partial(pair_fields, fields=pair),
                description=f"GLUE {name} (T5 format)"))
    tasks.append(FinetuneTask(
        "glue_stsb", source("glue/stsb"), [stsb_format, tok], vocabulary,
        (metrics.pearson, metrics.spearman), postprocess_fn=string_to_float,
        encoder_pair_fn=functools.partial(pair_fields, fields=("sentence1", "sentence2"),
                                          label_type=float),
        description="GLUE STS-B: the score rounded to 0.2, as text"))

    for name, (features, pair, labels, metric_fns) in SUPER_GLUE.items():
        fmt = functools.partial(glue_format, benchmark=name, feature_names=features,
                                label_names=labels)
        post = (functools.partial(multirc_postprocess, label_names=labels)
                if name == "multirc" else None)
        tasks.append(FinetuneTask(
            f"super_glue_{name}", source(f"super_glue/{name}"), [fmt, tok], vocabulary,
            metric_fns, label_names=labels, postprocess_fn=post,
            encoder_pair_fn=None if pair is None else functools.partial(pair_fields,
                                                                         fields=pair),
            description=f"SuperGLUE {name} (T5 format)"))
    tasks.append(FinetuneTask(
        "super_glue_record", source("super_glue/record"), [record_format, tok], vocabulary,
        (record_squad,), postprocess_fn=record_postprocess,
        description="SuperGLUE ReCoRD: one example per answer; EM/F1 once per query"))
    tasks.append(FinetuneTask(
        "super_glue_wsc", source("super_glue/wsc.fixed"), [wsc_format, tok], vocabulary,
        (_accuracy,), label_names=("False", "True"),
        description="SuperGLUE WSC (wsc.fixed), spans marked as T5"))

    for version in ("v1.1", "v2.0"):
        tasks.append(FinetuneTask(
            f"squad_{version.replace('.', '_')}", source(f"squad/{version}"),
            [squad_format, tok], vocabulary, (metrics.squad,), splits=("train", "validation"),
            postprocess_fn=squad_postprocess,
            description=f"SQuAD {version}: question: ... context: ... -> answer"))
    for name, (tfds_name, src, tgt) in TRANSLATION.items():
        tasks.append(FinetuneTask(
            name, source(tfds_name),
            [functools.partial(translate_format, source=src, target=tgt), tok], vocabulary,
            (metrics.bleu,), description=f"{tfds_name} {src}->{tgt}, BLEU (intl)",
            input_prefix=translate_prefix(src, tgt)))
    tasks.append(FinetuneTask(
        "cnn_dailymail", source("cnn_dailymail"), [summarize_format, tok], vocabulary,
        (metrics.rouge,), description="CNN/DailyMail summarize: article -> highlights, ROUGE",
        input_prefix="summarize: "))
    return tasks


def register_benchmark_tasks(vocabulary: Any, data_dir: str | None = None,
                             overwrite: bool = False) -> list[str]:
    """Registers ``benchmark_tasks(vocabulary, data_dir)``; returns their names."""
    tasks = benchmark_tasks(vocabulary, data_dir)
    for task in tasks:
        register_task(task, overwrite=overwrite)
    return [t.name for t in tasks]
