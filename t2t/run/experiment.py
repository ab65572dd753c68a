"""gin-wired entry point of `t2t train`: builds model, data, optimizer and mesh from the
operative gin config and runs `trainer.fit`.

Macros the run configs use (as t5x): MODEL_DIR, TRAIN_STEPS, BATCH_SIZE, CORPUS, OBJECTIVE,
TASK_FEATURE_LENGTHS, MODEL_FAMILY (set by configs/models/*).
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Callable, Dict, Optional

import gin
import jax
import numpy as np

import t2t.data.catalog.paper  # noqa: F401  registers the C4 and benchmark tasks
from t2t import storage
from t2t.data import converters as conv
from t2t.data import data_report
from t2t.data.characters import ElmoConverter
from t2t.data.permutation_lm import PermutationLmConverter
from t2t.data import tasks as tasks_lib
from t2t.data.streaming import stream_of
from t2t.models import families
from t2t.nn.config import TransformerConfig
from t2t import precision
from t2t.run import configurables as configured
from t2t.run import elmo as elmo_run
from t2t.train import curves
from t2t.train.metrics_log import MetricsLogger
from t2t.train.trainer import TrainConfig, Trainer, TrainResult, fit
from t2t.run.configurables import configurable

_log = logging.getLogger(__name__)

CONVERTERS = {
    "encoder_decoder": conv.EncDecConverter,
    "lm": conv.LMConverter,
    "prefix_lm": conv.PrefixLMConverter,
    "encoder": conv.EncoderConverter,
    "elmo": ElmoConverter,
    "permutation_lm": PermutationLmConverter,
}
# Objective gin names (configs/objectives) -> the task suffix registered for each corpus.
OBJECTIVE_TASKS = {"span_3_15_u_u": "span_corruption", "causal_lm": "lm",
                   "bert_mlm_nsp": "mlm_nsp", "bert_mlm": "mlm", "bert_ltr": "ltr",
                   "roberta_full_sentences": "roberta", "albert_ngram_sop": "albert",
                   "spanbert_span_sbo": "spanbert", "electra_rtd": "electra",
                   "xlnet_plm": "xlnet", "xlnet_plm_k7": "xlnet_k7"}
NO_NSP_OBJECTIVES = ("bert_mlm", "bert_ltr", "roberta_full_sentences",  # BERT-family
                     "spanbert_span_sbo", "electra_rtd")                 # objectives, no NSP


def task_name(task: Optional[str], corpus: Optional[str], objective: Optional[str]) -> str:
    """An explicit task, or `<corpus>_<objective's task suffix>`."""
    if task:
        return task
    if not (corpus and objective):
        raise ValueError("bind experiment.task, or both experiment.corpus and experiment.objective")
    return f"{corpus}_{OBJECTIVE_TASKS.get(objective, objective)}"


@dataclasses.dataclass
class Experiment:
    """Everything a run needs, built from gin: the trainer and how to make its data."""

    trainer: Trainer
    task: object                       # a registered Task or Mixture
    converter: conv.FeatureConverter
    batch_size: int
    eval_task: Optional[object] = None

    def eval_data(self):
        """A fresh single pass over the eval task, unshuffled (every evaluation the same)."""
        return self.eval_task.get_pipeline(self.converter, self.batch_size,
                                           self.trainer.config.seed, shuffle=False, num_epochs=1)

    def data(self, process_index: Optional[int] = None, process_count: Optional[int] = None):
        """This process's resumable iterator over the task (seeded by TrainConfig.seed)."""
        return self.task.get_pipeline(self.converter, self.batch_size, self.trainer.config.seed,
                                      process_index=process_index, process_count=process_count)


@configurable
def experiment(feature_lengths: Dict[str, int] = gin.REQUIRED, batch_size: int = gin.REQUIRED,
               family: str = gin.REQUIRED, task: Optional[str] = None,
               corpus: Optional[str] = None, objective: Optional[str] = None,
               converter: Optional[str] = None, pack: bool = True,
               converter_options: Optional[Dict[str, object]] = None,
               eval_task: Optional[str] = None,
               trainer_fn: Optional[Callable[..., Trainer]] = None,
               vocab_size_from_task: bool = True) -> Experiment:
    """Model `family` (with the gin-bound TransformerConfig) on `task`, or on
    `<corpus>_<objective>`; `eval_task` is evaluated every TrainConfig.eval_every steps.
    Optimizer and schedule come from gin bindings of `make_optimizer` and `make_schedule`
    (see configs/runs/pretrain.gin). `trainer_fn(model, train_config, task, batch_size)`
    replaces `make_trainer` (fine-tuning sizes the run from the task). `converter_options`
    go to the feature converter (e.g. `{'loss_on_targets_only': False}` for prefix_lm).
    `vocab_size_from_task=False` keeps TransformerConfig.vocab_size, which must then cover
    the task vocabulary's ids, and never loads that vocabulary (`t2t compile` of a paper
    model whose vocabulary file is not on this machine)."""
    train_cfg = configured.TrainConfig()
    task_obj = tasks_lib.get_task(task_name(task, corpus, objective))
    first_task = task_obj.tasks[0][0] if isinstance(task_obj, tasks_lib.Mixture) else task_obj
    vocab = first_task.vocabulary if vocab_size_from_task else None
    fam = families.get(family)
    model_cfg = configured.model_config(family)
    if vocab is not None and model_cfg.vocab_size != vocab.padded_vocab_size:
        _log.info("vocab_size %d -> %d (the task's vocabulary, padded to 128)",
                  model_cfg.vocab_size, vocab.padded_vocab_size)
        model_cfg = model_cfg.replace(vocab_size=vocab.padded_vocab_size)
    teacher = None
    if fam.teacher:
        from t2t.run.finetune import distill_teacher   # finetune imports this module
        teacher = distill_teacher()
    model = families.make_model(family, model_cfg, configured.LossConfig(), teacher=teacher,
                                classes=configured.MODEL_CLASSES)

    if converter is not None and converter not in CONVERTERS:
        raise ValueError(f"unknown converter {converter!r}; choose one of {list(CONVERTERS)}")
    # the family's own (t5 encoder-decoder, bert encoder, xlnet permutation LM, gpt LM or
    # prefix LM for inputs->targets tasks) unless one is named
    converter_cls = CONVERTERS[converter] if converter else fam.default_converter(objective)
    kwargs = dict(converter_options or {})
    if issubclass(converter_cls, conv.EncDecConverter):
        # the decoder inputs start with the config's start id (T5 0, BART 2), as decoding does
        kwargs.setdefault("bos_id", model_cfg.decoder_start_id)
    if converter_cls is conv.EncoderConverter:
        kwargs["nsp"] = objective not in NO_NSP_OBJECTIVES
        pack = pack and not kwargs["nsp"]  # one NSP label per row: MLM+NSP rows hold one pair
    feature_converter = converter_cls(feature_lengths, pack=pack, **kwargs)

    trainer = (trainer_fn(model, train_cfg, task_obj, batch_size) if trainer_fn
               else make_trainer(model, train_cfg))
    if hasattr(first_task, "bad_lines"):   # your own files: say what the budget means
        data_report.announce(first_task, feature_converter, batch_size,
                             trainer.config.train_steps, model_dir=trainer.config.model_dir)
    return Experiment(trainer, task_obj, feature_converter, batch_size,
                      tasks_lib.get_task(eval_task) if eval_task else None)


def make_trainer(model, train_cfg: TrainConfig, trainer_cls: type = Trainer,
                 **schedule_overrides) -> Trainer:
    """A `trainer_cls` for `model` with the gin-bound schedule and optimizer on the
    gin-bound mesh; `schedule_overrides` (e.g. total_steps) beat the schedule's bindings."""
    lr = configured.make_schedule(**schedule_overrides)
    tx = configured.make_optimizer(learning_rate=lr)
    return trainer_cls(model, tx, configured.make_mesh(), train_cfg, schedule=lr)


def operative_config(exp: Experiment) -> str:
    """The operative gin config (every value the run uses, defaults included), noting a
    vocab size the task's vocabulary replaced."""
    config_str = gin.operative_config_str()
    model_cfg = exp.trainer.model.config
    bound = configured.model_config(exp.trainer.model.family)
    if model_cfg.vocab_size != bound.vocab_size:
        config_str += (f"\n# {type(bound).__name__}.vocab_size {bound.vocab_size} was replaced "
                       f"by {model_cfg.vocab_size}: the task vocabulary's padded size.\n")
    if _bound_dtype() == "auto" and isinstance(bound, TransformerConfig):
        config_str += (f"\n# TransformerConfig.dtype 'auto' resolved to {model_cfg.dtype!r} on "
                       f"this host: {precision.auto_choice().describe()}.\n")
    return config_str


def _bound_dtype() -> Optional[str]:
    """TransformerConfig.dtype as the gin config binds it (None: not bound)."""
    try:
        return gin.query_parameter("TransformerConfig.dtype")
    except ValueError:
        return None


def write_operative_config(exp: Experiment) -> str:
    """`operative_config(exp)`, written to MODEL_DIR/config.gin by process 0."""
    config_str = operative_config(exp)
    model_dir = exp.trainer.config.model_dir
    storage.check(model_dir)                       # gs:// without gcsfs: one line, now
    storage.path(model_dir).mkdir(parents=True, exist_ok=True)
    if jax.process_index() == 0:
        storage.write_text(os.path.join(model_dir, "config.gin"), config_str)
    return config_str


def run() -> TrainResult:
    """Build the gin-configured experiment, write its operative config (every value it
    used, defaults included) to MODEL_DIR/config.gin, and train (resuming if possible)."""
    _log.info("building the model, task, vocabulary and data pipeline from the config")
    exp = experiment()
    config_str = write_operative_config(exp)
    data = exp.data()
    result = fit(exp.trainer, data, config_str=config_str,
                 eval_data_fn=exp.eval_data if exp.eval_task is not None else None)
    reports = getattr(exp.task, "data_reports", None)   # your files, streamed: what was read
    row = reports and data_report.after_training(reports, data, exp.trainer.config.model_dir)
    if row:
        with MetricsLogger(exp.trainer.config.model_dir, initial_step=result.step,
                           progress_bar=False, tensorboard=False) as log:
            log.log(result.step, row, force=True)
    lines = elmo_run.after_pretraining(exp, result)   # ELMo: the downstream scalar mix
    if jax.process_index() == 0:
        print("\n".join([summary(exp, result), *lines]))
    return result


def run_metrics(model_dir: str) -> list:
    """MODEL_DIR/metrics.jsonl's rows (every step of the run, restarts included)."""
    from t2t.train.metrics_log import read_metrics
    path = os.path.join(model_dir, "metrics.jsonl")
    return read_metrics(path) if storage.path(path).exists() else []


def example_prediction(exp: Experiment, params, index: int = 0) -> Optional[Dict[str, str]]:
    """The model's greedy output for the first example made from source record `index`
    (e.g. a span-corrupted verse), decoded to text; None for families without decoding."""
    decodes = families.get(exp.trainer.model.family).decoding is not None
    if not decodes or isinstance(exp.task, tasks_lib.Mixture):
        return None
    seed = (exp.trainer.config.seed, 0, index)
    source = exp.task.source
    record = source.first() if stream_of(source) is not None else source[index]
    examples = exp.task.preprocess(record, seed, exp.converter.lengths)
    if not examples:
        return None
    single = type(exp.converter)(exp.converter.lengths, pack=False)
    batch = single([examples[0]], num_rows=1)
    tokens = exp.trainer.model.predict(params, batch,
                                       max_decode_length=exp.converter.lengths["targets"])
    vocab = exp.task.vocabulary
    text = lambda ids: vocab.decode([int(t) for t in ids])  # noqa: E731
    return {"inputs": text(examples[0].get("inputs", [])), "targets": text(examples[0]["targets"]),
            "prediction": text(np.asarray(tokens)[0])}


def summary(exp: Experiment, result: TrainResult) -> str:
    """The loss (and the family's accuracies) at step 1 and at the last step, from
    metrics.jsonl (so a resumed run still compares with step 1), the loss-curve PNG written
    beside it, and one decoded example."""
    model_dir = exp.trainer.config.model_dir
    rows = run_metrics(model_dir) or result.history
    lines = [f"stopped at step {result.step} ({result.stopped_by})"]
    line = curves.summary_line(rows)
    if line:
        lines.append(line)
        png = curves.plot_metrics(rows, os.path.join(model_dir, "loss.png"),
                                  title=os.path.basename(os.path.normpath(model_dir)))
        lines.append(f"loss curve: {png}" if png else
                     "loss curve: not plotted (pip install 't2t[plots]' for matplotlib)")
    reports = getattr(exp.task, "data_reports", None)   # your own files: what was skipped
    if reports:
        lines += data_report.end_lines(reports)
    example = example_prediction(exp, result.state.params)
    if example:
        lines += [f"{k:>10}: {v}" for k, v in example.items()]
    return "\n".join(lines)
