"""gin-wired fine-tuning, evaluation and inference (`t2t finetune | eval | infer`).

A fine-tuning run is an `Experiment` (text-to-text: `experiment.experiment`; BERT-style
classification: `classifier_experiment`) whose trainer starts from INITIAL_CHECKPOINT:

* a t2t MODEL_DIR (or its `checkpoints/`): the latest step's *parameters* only (no
  optimizer or data state), restored onto the new model's shardings; a shape mismatch
  names every differing parameter;
* a Hugging Face directory (config.json + model.safetensors, any class
  `t2t.convert.pretrained.load_pretrained` reads: a fine-tuned `...ForSequenceClassification`
  gives its head too, continued when its label count is the task's, else initialised fresh
  with one log line), or any t2t checkpoint, for models with `init_from_pretrained` (new
  heads stay freshly initialised).

`t2t eval` (and `t2t infer`) of a MODEL_DIR without checkpoints whose INITIAL_CHECKPOINT is
a Hugging Face directory holding this task's head score that directory as it is.

If MODEL_DIR already has checkpoints the run resumes from them, exactly as pretraining
(`trainer.fit`). With `EPOCHS` the run lasts ceil(epochs x train examples / batch) steps
(for packed text-to-text batches an epoch is then an upper bound), and `warmup_fraction`
sizes the schedule's warmup. Afterwards the task's `validation` and `test` splits are scored
(`t2t.train.evaluator`) into MODEL_DIR/metrics.json and results.md.

The run layer's other fine-tuning modules: `t2t.run.classifier_experiments` (the BERT-style
classifier, span QA, tagging and multiple-choice experiments), `t2t.run.vocabularies` (their
WordPiece and the gin configurables that name vocabularies), `t2t.run.array_batches` (their
batch iterator) and `t2t.run.model_dir` (what INITIAL_CHECKPOINT names: a Hugging Face
directory or a t2t checkpoint, whose parameters `t2t.train.checkpoints.restore_params`
reads).
"""
from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import os
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import gin
import jax
import numpy as np

import t2t.data.catalog.offline  # noqa: F401  registers the offline fine-tuning tasks
import t2t.run.user_data  # noqa: F401  files_task, text_corpus: your own files
import t2t.run.vocabularies  # noqa: F401  registers the vocabularies' configurables
from t2t.errors import ConfigError
from t2t.data import converters as conv
from t2t.models import lightweight, peft
from t2t.run import configurables as configured
from t2t.train import evaluator, optimizers
from t2t.run import experiment as experiment_lib
from t2t.run import gin_utils
from t2t.run.classifier_experiments import (ChoiceExperiment, ClassifierExperiment,
                                            SpanQAExperiment, TaggingExperiment, train_size)
from t2t.run.model_dir import is_hf_dir, pretrained_params
from t2t.train.checkpoints import latest_step, restore_params
from t2t.train.trainer import TrainConfig, Trainer, TrainResult, TrainState, fit
from t2t.run.configurables import configurable

_log = logging.getLogger(__name__)

Params = Any


# ----------------------------------------------------------------------------- initial parameters
def hf_head_params(exp: experiment_lib.Experiment, path: str) -> Params:
    """The experiment's model's parameters, all of them from the Hugging Face directory
    `path` (a classifier fine-tuned elsewhere, scored as it is); a directory without this
    task's head is one line."""
    model = exp.trainer.model
    batch = {k: np.zeros(v.shape, v.dtype) for k, v in next(exp.data()).items()}
    params, report = model.init_from_pretrained(jax.random.PRNGKey(0), batch,
                                                pretrained_params(path), return_report=True)
    if report.new:
        fresh = sorted({name.split("/")[0] for name in report.new})
        raise ConfigError(f"MODEL_DIR has no checkpoints, and the Hugging Face directory "
                          f"{path!r} has no head for this task ({', '.join(fresh)} would be "
                          "new): run `t2t finetune` first")
    import flax.linen as nn
    return nn.unbox(params)


@configurable
def distill_teacher(path: str = gin.REQUIRED):
    """The teacher for `t2t train` with MODEL_FAMILY 'distill' (TEACHER = path), as
    (TransformerConfig, params): a t2t BERT MODEL_DIR (its latest checkpoint; the bound
    TransformerConfig is its architecture, the vocabulary size read from its token table) or
    a Hugging Face BERT directory with an MLM head."""
    from t2t.errors import UserError
    if is_hf_dir(path):
        from t2t.convert.hf import load_bert
        config, params = load_bert(path)
    else:
        params = restore_params(path)
        config = configured.TransformerConfig()
        config = config.replace(vocab_size=params["token_embedder"]["embedding"].shape[0])
    if "mlm_head" not in params:
        raise UserError(f"teacher {path!r} has no MLM head: distillation needs the teacher's "
                        "MLM logits (train one with experiments/bert_tiny_bible.gin)")
    return config, params


def initial_params(path: str, trainer: Trainer, state: TrainState,
                   example_batch: Mapping[str, np.ndarray]) -> Params:
    """`state.params` replaced by INITIAL_CHECKPOINT's, on the same shardings."""
    model, shardings = trainer.model, trainer.state_shardings.params
    if hasattr(model, "init_from_pretrained"):   # a head model: copy the shared trunk
        rng = jax.random.PRNGKey(trainer.config.seed)
        batch = {k: np.zeros(v.shape, v.dtype) for k, v in example_batch.items()}
        merged = model.init_from_pretrained(rng, batch, pretrained_params(path))
        import flax.linen as nn
        return jax.device_put(nn.unbox(merged), shardings)
    if is_hf_dir(path):
        raise ValueError(f"{path!r} is a Hugging Face directory; only models with "
                         "init_from_pretrained (classifier_experiment) load those")
    return restore_params(path, trainer.abstract_state(state).params)


class FinetuneTrainer(Trainer):
    """A Trainer whose fresh state starts from `initial_checkpoint`'s parameters, unless
    the run's own MODEL_DIR has checkpoints (then `fit` resumes from those)."""

    initial_checkpoint: Optional[str] = None

    def init_state(self, example_batch: Dict[str, np.ndarray], *,
                   abstract: Optional[TrainState] = None) -> TrainState:
        state = super().init_state(example_batch, abstract=abstract)
        own = latest_step(os.path.join(self.config.model_dir, "checkpoints"))
        if self.initial_checkpoint is None or own is not None:
            return state
        _log.info("initial parameters from %s", self.initial_checkpoint)
        return state.replace(params=initial_params(self.initial_checkpoint, self, state,
                                                   example_batch))


# ----------------------------------------------------------------------------- the run
def epochs_to_steps(epochs: float, size: int, batch_size: int) -> int:
    """ceil(epochs x size / batch_size)."""
    return max(1, math.ceil(epochs * size / batch_size))


def schedule_overrides(steps: int, warmup_fraction: Optional[float]) -> Dict[str, int]:
    """`total_steps` (and `warmup_steps` = fraction x steps) for a schedule that takes them."""
    name = gin.query_parameter("make_schedule.name")
    params = inspect.signature(optimizers.SCHEDULES[name]).parameters
    out = {}
    if "total_steps" in params:
        out["total_steps"] = steps
    if warmup_fraction is not None and "warmup_steps" in params:
        out["warmup_steps"] = int(round(warmup_fraction * steps))
    return out


@configurable
def finetune_experiment(initial_checkpoint: Optional[str] = gin.REQUIRED,
                        epochs: Optional[float] = None,
                        warmup_fraction: Optional[float] = None,
                        experiment_fn: Callable[..., experiment_lib.Experiment] = (
                            experiment_lib.experiment)) -> experiment_lib.Experiment:
    """`experiment_fn()` with a `FinetuneTrainer` that starts from `initial_checkpoint`,
    run for `epochs` over the training split if given (else TrainConfig.train_steps)."""
    def trainer_fn(model, train_cfg: TrainConfig, task, batch_size: int,
                   train_examples: Optional[int] = None) -> Trainer:
        steps = train_cfg.train_steps
        if epochs is not None:
            steps = epochs_to_steps(epochs, train_examples or train_size(task), batch_size)
            train_cfg = dataclasses.replace(train_cfg, train_steps=steps)
        model = configured.wrap(model)           # lightweight fine-tuning (gin: wrap.method)
        trainer = experiment_lib.make_trainer(model, train_cfg, FinetuneTrainer,
                                              **schedule_overrides(steps, warmup_fraction))
        if isinstance(model, lightweight.Lightweight):   # frozen leaves: no update, no state
            trainer.tx = peft.freeze(trainer.tx, model.is_frozen)
        trainer.initial_checkpoint = initial_checkpoint
        return trainer

    return experiment_fn(trainer_fn=trainer_fn)


def _is_classifier(exp: experiment_lib.Experiment) -> bool:
    return isinstance(exp, ClassifierExperiment)


@configurable
def evaluate_experiment(exp: experiment_lib.Experiment, params: Params,
                        splits: Sequence[str] = ("validation", "test"), batch_size: int = 32,
                        max_examples: Optional[int] = None,
                        details: Optional[Dict[str, dict]] = None, **decode_options
                        ) -> Dict[str, Dict[str, float]]:
    """`{"<task>/<split>": metrics}` of the experiment's model on its task's splits (the
    `max_examples` of each, evenly spread); `decode_options` go to `model.predict`.
    `details` (a dict) receives each split's predictions and trivial baseline
    (`evaluator.evaluate`). A task over your files scores only the splits it has files for."""
    model, results = exp.trainer.model, {}
    if hasattr(exp.task, "bad_lines"):
        missing = [s for s in splits if s not in exp.task.splits]
        if missing:
            _log.info("no %s files: %s not scored", " or ".join(
                {"validation": "VALIDATION_FILES", "test": "TEST_FILES"}.get(s, s)
                for s in missing), ", ".join(missing))
        splits = [s for s in splits if s in exp.task.splits]
    if _is_classifier(exp):
        kwargs = {"vocabulary": exp.vocabulary, "max_length": exp.max_length}
    else:
        kwargs = {"sequence_length": exp.converter.lengths,
                  "prefix_lm": isinstance(exp.converter, conv.PrefixLMConverter)}
    for split in splits:
        start = time.perf_counter()
        more = {} if details is None else {"details": details.setdefault(split, {})}
        if isinstance(exp, (SpanQAExperiment, TaggingExperiment, ChoiceExperiment)):
            scores = exp.evaluate(params, split, batch_size, max_examples, **more)
        else:
            scores = evaluator.evaluate(model, params, exp.task, split, batch_size=batch_size,
                                        max_examples=max_examples, **kwargs, **more,
                                        **decode_options)
        results[f"{exp.task.name}/{split}"] = scores
        _log.info("evaluated %s/%s in %.1f s: %s", exp.task.name, split,
                  time.perf_counter() - start, results[f"{exp.task.name}/{split}"])
    return results


def run(splits: Optional[Sequence[str]] = None,
        exp: Optional[experiment_lib.Experiment] = None) -> Dict[str, Any]:
    """Fine-tune the gin-configured experiment (or `exp`, built from it already), resuming
    if MODEL_DIR has checkpoints, then score `splits` (default: evaluate_experiment's) into
    MODEL_DIR/metrics.json and results.md (not when preempted). Returns {"result":
    TrainResult, "metrics": ..., "train_seconds": ..., "eval_seconds": ...}."""
    exp = exp or finetune_experiment()
    config_str = experiment_lib.write_operative_config(exp)
    start = time.perf_counter()
    result: TrainResult = fit(exp.trainer, exp.data(), config_str=config_str)
    train_seconds = time.perf_counter() - start
    if result.stopped_by != "done":   # preempted: the resumed run evaluates
        return {"result": result, "metrics": None, "train_seconds": train_seconds}
    start = time.perf_counter()
    kwargs = {} if splits is None else {"splits": tuple(splits)}
    details: Dict[str, dict] = {}
    metrics = evaluate_experiment(exp, result.state.params, details=details, **kwargs)
    eval_seconds = time.perf_counter() - start
    if jax.process_index() == 0:
        print(f"trained to step {result.step} in {train_seconds:.0f} s; evaluated in "
              f"{eval_seconds:.0f} s")
        write_readable_results(exp, metrics, details, exp.trainer.config.model_dir)
    return {"result": result, "metrics": metrics, "train_seconds": train_seconds,
            "eval_seconds": eval_seconds}


def restore_experiment(step: Optional[int] = None) -> tuple[experiment_lib.Experiment, Params]:
    """The gin-configured fine-tuning experiment and MODEL_DIR's parameters (latest step);
    of a MODEL_DIR without checkpoints whose INITIAL_CHECKPOINT is a Hugging Face directory,
    that directory's (`hf_head_params`). Else a MODEL_DIR without a checkpoint is one line
    before the task reads any data."""
    model_dir = gin_utils.query_macro("MODEL_DIR")
    hf_dir = _hf_initial_checkpoint()
    if isinstance(model_dir, str) and model_dir and _binds_initial_checkpoint() \
            and hf_dir is None:
        _check_has_checkpoints(model_dir)     # (not a fine-tuning config: gin says so below)
    exp = finetune_experiment()
    model_dir = exp.trainer.config.model_dir
    if hf_dir is not None and step is None and hasattr(exp.trainer.model, "init_from_pretrained") \
            and latest_step(os.path.join(model_dir, "checkpoints")) is None:
        _log.info("MODEL_DIR has no checkpoints: scoring the Hugging Face directory %s", hf_dir)
        return exp, hf_head_params(exp, hf_dir)
    _check_has_checkpoints(model_dir)
    return exp, restore_params(model_dir, abstract_params(exp), step, what="MODEL_DIR")


def _binds_initial_checkpoint() -> bool:
    try:
        gin.query_parameter("finetune_experiment.initial_checkpoint")
        return True
    except ValueError:
        return False


def _hf_initial_checkpoint() -> Optional[str]:
    """INITIAL_CHECKPOINT when it is the path of a Hugging Face directory."""
    path = gin_utils.query_macro("INITIAL_CHECKPOINT")
    if not isinstance(path, str):                 # bound without the macro
        try:
            path = gin.query_parameter("finetune_experiment.initial_checkpoint")
        except ValueError:
            return None
    return path if isinstance(path, str) and path and is_hf_dir(path) else None


def _check_has_checkpoints(model_dir: str) -> None:
    if latest_step(os.path.join(model_dir, "checkpoints")) is None:
        raise FileNotFoundError(f"MODEL_DIR {model_dir!r} has no checkpoints; run "
                                "`t2t finetune` (or `t2t train`) first")


def abstract_params(exp: experiment_lib.Experiment) -> Params:
    """The model's parameters as ShapeDtypeStructs with their mesh shardings (nothing is
    initialised or compiled): a restore target."""
    from t2t.train import partitioning
    trainer, batch = exp.trainer, next(exp.data())
    return partitioning.abstract_sharded(trainer.model.init, jax.random.PRNGKey(0), batch,
                                         mesh=trainer.mesh, rules=trainer.rules)[0]


def evaluate_run(splits: Optional[Sequence[str]] = None,
                 output_dir: Optional[str] = None) -> Dict[str, Dict[str, float]]:
    """`t2t eval`: score MODEL_DIR's latest checkpoint; writes metrics.json + results.md to
    `output_dir` (default MODEL_DIR)."""
    exp, params = restore_experiment()
    kwargs = {} if not splits else {"splits": tuple(splits)}
    details: Dict[str, dict] = {}
    metrics = evaluate_experiment(exp, params, details=details, **kwargs)
    if jax.process_index() == 0:
        write_readable_results(exp, metrics, details, output_dir or exp.trainer.config.model_dir)
    return metrics


def write_readable_results(exp: experiment_lib.Experiment, metrics: Dict[str, Dict[str, float]],
                           details: Dict[str, dict], out_dir: str) -> None:
    """metrics.json and results.md, predictions.jsonl, and printed: the table and, for a
    task over your files, each split's trivial baseline beside the model's scores (a
    warning where the model does not beat it) and the data's counts (metrics.json's
    "data" and "baselines")."""
    results, baselines, warnings = dict(metrics), {}, []
    own = hasattr(exp.task, "bad_lines")
    for split, found in details.items():
        key = f"{exp.task.name}/{split}"
        if not own or "baseline" not in found or key not in metrics:
            continue
        name, scores = found["baseline"]
        results[f"{key} (baseline: {name})"] = scores
        first = next((m for m in metrics[key] if m in scores), None)
        beaten = first is None or metrics[key][first] > scores[first]
        baselines[split] = {"baseline": name, "scores": scores, "beaten": beaten}
        if not beaten:
            warnings.append(f"warning: on {split} the model does not beat the trivial baseline "
                            f"({name}): {first} {metrics[key][first]:.2f} vs "
                            f"{scores[first]:.2f}; train longer, or start from a model "
                            "pretrained on text like yours")
    extra: Dict[str, Any] = {"baselines": baselines} if baselines else {}
    reports = getattr(exp.task, "data_reports", None)
    if reports:
        from t2t.data import data_report
        extra["data"] = data_report.as_dict(reports)
        warnings = data_report.end_lines(reports) + warnings
    evaluator.write_results(results, out_dir, extra)
    rows = {split: found["rows"] for split, found in details.items() if "rows" in found}
    if rows:
        path = evaluator.write_predictions(rows, out_dir)
        warnings.insert(0, f"predictions (input, target, prediction): {path}")
    print(evaluator.results_table(results), end="")
    for line in warnings:
        print(line)


def _classify_lines(exp: ClassifierExperiment, params: Params, lines: Sequence[str],
                    batch_size: int) -> List[str]:
    vocab, length = exp.vocabulary, exp.max_length
    ids = vocab.encode_batch(list(lines), add_special_tokens=False)
    tokens = np.full((len(lines), length), vocab.pad_id, np.int32)
    segments = np.zeros((len(lines), length), np.int32)
    for row, toks in enumerate(ids):
        row_ids = [vocab.cls_id] + list(toks[:length - 2]) + [vocab.sep_id]
        tokens[row, :len(row_ids)], segments[row, :len(row_ids)] = row_ids, 1
    features = {"encoder_input_tokens": tokens, "encoder_segment_ids": segments,
                "token_type_ids": np.zeros_like(tokens)}
    labels = evaluator.predict_labels(exp.trainer.model, params, features,
                                      batch_size=batch_size)
    if not getattr(exp.task, "label_names", None):     # a regressor
        return [f"{float(v):g}" for v in labels]
    return [exp.task.label_names[int(i)] for i in labels]


def infer_lines(exp: experiment_lib.Experiment, params: Params, lines: Sequence[str], *,
                batch_size: int = 32, max_decode_length: Optional[int] = None,
                prefix: Optional[str] = None, **decode_options) -> List[str]:
    """One output per input line: decoded text (text-to-text / decoder-only models), or a
    label name (classifiers). `prefix` (a task's `input_prefix`, e.g. "translate English
    to Spanish: ") starts every line that does not already start with it; without it
    lines are model inputs as they are."""
    if not lines:
        return []
    if prefix:
        lines = [line if line.startswith(prefix) else prefix + line for line in lines]
    if isinstance(exp, SpanQAExperiment):
        raise ValueError("span QA answers a question about a context, not one line: score "
                         "a split with `t2t eval` instead")
    if isinstance(exp, ChoiceExperiment):
        raise ValueError("multiple choice picks one of several endings, not one line: score "
                         "a split with `t2t eval` instead")
    if isinstance(exp, TaggingExperiment):
        from t2t.data import tagging
        words = [line.split() for line in lines]
        tags = tagging.tag_features([{"tokens": w, "tags": ["O"] * len(w)} for w in words],
                                    exp.vocabulary, exp.task.label_names, exp.max_length)
        found = exp.predict_tags(params, tags, batch_size)
        return [" ".join(f"{w}/{t}" for w, t in zip(ws, ts)) for ws, ts in zip(words, found)]
    if _is_classifier(exp):
        return _classify_lines(exp, params, lines, batch_size)
    vocab = exp.task.vocabulary
    eos = [] if getattr(vocab, "eos_id", None) is None else [vocab.eos_id]
    examples = [{"inputs": np.asarray(list(vocab.encode(line)) + eos, np.int32),
                 "targets": np.asarray(eos or [1], np.int32)} for line in lines]
    return evaluator.predict_texts(
        exp.trainer.model, params, examples, vocab, batch_size=batch_size,
        max_decode_length=max_decode_length, sequence_length=exp.converter.lengths,
        prefix_lm=isinstance(exp.converter, conv.PrefixLMConverter), **decode_options)
