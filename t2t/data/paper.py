"""Paper-scale tasks, tokenized with the T5 SentencePiece (`t5_vocabulary`, a gin-bound
local path; T5's is ``gs://t5-data/vocabs/cc_all.32000/sentencepiece.model``: copy it, as
nothing here downloads). Registered at import, nothing read until used:

* ``c4_<objective>`` (the suffixes of ``bible_web_*``): the T5 objectives over TFDS
  ``c4/en``, and ``c4_<objective>_validation`` over its validation split;
* the standard benchmark tasks of `t2t.data.benchmarks` (GLUE, SuperGLUE, SQuAD, WMT,
  CNN/DailyMail) by their names, ``glue_cola`` ...
"""
from __future__ import annotations

import functools
from typing import Any, Callable, List

import gin

from t2t.data.benchmarks import register_benchmark_tasks
from t2t.data.sources import TfdsSource
from t2t.data.tasks import (OBJECTIVE_VARIANTS, Task, denoise_objective, lm_chunks,
                            prefix_lm_chunks, register_task, span_corruption,
                            split_for_span_corruption, split_to_length, tokenize)

C4 = "c4/en:3.1.0"   # TFDS's C4 en (T5's own tasks read 3.0.1, no longer in TFDS)


@gin.configurable
def t5_vocabulary(path: str = gin.REQUIRED, extra_ids: int = 100) -> Any:
    """The T5 SentencePiece (32k pieces + 100 sentinels) from a local `path`."""
    from t2t.data.vocab import SentencePieceVocabulary
    return SentencePieceVocabulary(path, extra_ids=extra_ids)


def as_text(record: Any) -> dict:
    """A C4 record (``text`` as bytes from ArrayRecord) -> ``{"text": str}``."""
    text = record["text"] if isinstance(record, dict) else record
    return {"text": text.decode("utf-8") if isinstance(text, bytes) else str(text)}


def c4_tasks(split: str = "train", vocabulary: Any = t5_vocabulary,
             data_dir: str | None = None) -> List[Task]:
    """``c4_span_corruption``, ``c4_lm``, ``c4_prefix_lm`` and ``c4_<variant>`` for the
    T5 objective tables, over one C4 split (unregistered)."""
    source = functools.partial(TfdsSource, C4, split, data_dir)
    suffix = "" if split == "train" else "_validation"
    first = [as_text, tokenize]
    tasks = [
        Task("c4_span_corruption", source, first + [split_for_span_corruption, span_corruption],
             vocabulary, description="T5 span corruption (span_3_15_u_u) over C4"),
        Task("c4_lm", source, first + [lm_chunks], vocabulary, description="causal LM over C4"),
        Task("c4_prefix_lm", source, first + [prefix_lm_chunks], vocabulary,
             description="T5 prefix LM over C4"),
    ]
    for name in OBJECTIVE_VARIANTS:
        split_fn: Callable = split_to_length
        if name.startswith("span_"):
            split_fn = functools.partial(split_for_span_corruption,
                                         mean_noise_span_length=float(name.split("_")[1]))
        tasks.append(Task(f"c4_{name}", source,
                          first + [split_fn, functools.partial(denoise_objective, objective=name)],
                          vocabulary, description=f"T5 objective {name} over C4"))
    for task in tasks:
        task.name += suffix
    return tasks


def register_c4_tasks(vocabulary: Any = t5_vocabulary, data_dir: str | None = None,
                      overwrite: bool = False) -> List[str]:
    """Registers the C4 pretraining tasks (train and validation); returns their names."""
    tasks = c4_tasks("train", vocabulary, data_dir) + c4_tasks("validation", vocabulary, data_dir)
    for task in tasks:
        register_task(task, overwrite=overwrite)
    return [t.name for t in tasks]


register_c4_tasks()
register_benchmark_tasks(t5_vocabulary)
