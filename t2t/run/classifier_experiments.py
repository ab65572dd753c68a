"""The classifier experiments of fine-tuning: BERT-style heads over BERT-style rows.

`classifier_experiment` (a `SequenceClassifier`, or a `Regressor` for a regression task),
`span_qa_experiment` (SQuAD v1.1 / v2.0), `tagging_experiment` (CoNLL NER),
`multiple_choice_experiment` (SWAG) and `bert_files_experiment` (whichever of these a task
over your files needs) are gin configurables; each builds a `ClassifierExperiment` (or its
subclass, which scores its own splits) whose trainer `t2t.run.finetune.finetune_experiment`
supplies. The trunk's config and vocabulary come from a Hugging Face directory of BERT or
a successor (its own tokenizer) or the TransformerConfig bindings and a vocab.txt
(`bert_trunk`); the head is the family's (`family_head`, `t2t.models.families`).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Dict, List, Optional

import gin
import jax
import numpy as np

from t2t.data import tasks as tasks_lib
from t2t.data.finetune_tasks import classification_examples, spread
from t2t.errors import ConfigError
from t2t.models import families
from t2t.run import configurables as configured
from t2t.run import experiment as experiment_lib
from t2t.run.array_batches import ArrayBatches
from t2t.run.configurables import configurable
from t2t.run.model_dir import hf_family
from t2t.run.vocabularies import hf_vocabulary, wordpiece_vocabulary
from t2t.train import evaluator
from t2t.train.trainer import Trainer

Params = Any


def train_size(task: Any) -> int:
    """Number of training records of a task (its first split)."""
    return len(task.source)


def family_head(family: str, kind: str, pretrained: Optional[str]) -> Callable[..., Any]:
    """The `family`'s fine-tuning head for a task `kind`; from a Hugging Face directory,
    with the pooler style of that directory's family (the layout of its HF heads)."""
    head = families.head(family, kind)
    source = hf_family(pretrained)
    if source is None:
        return head
    return functools.partial(head, style=families.head_style(source, kind))


@dataclasses.dataclass
class ClassifierExperiment(experiment_lib.Experiment):
    """A BERT-style `SequenceClassifier` experiment: features from `classification_examples`."""

    vocabulary: Any = None
    max_length: int = 128
    max_train_examples: Optional[int] = None

    def train_features(self) -> Dict[str, np.ndarray]:
        """The training split as model features (and labels), with those the model makes
        from them (`derived_features`: BART's decoder inputs)."""
        return self.trainer.model.derived_features(classification_examples(
            self.task, self.task.splits[0], self.vocabulary, self.max_length,
            self.max_train_examples))

    def data(self, process_index: Optional[int] = None, process_count: Optional[int] = None):
        return ArrayBatches(self.train_features(), self.batch_size, self.trainer.config.seed,
                            process_index=jax.process_index() if process_index is None
                            else process_index,
                            process_count=jax.process_count() if process_count is None
                            else process_count)


def reads_bert_rows(family: str) -> bool:
    """Whether the family reads BERT's encoder features, the rows these experiments build:
    its classification head reads them all (BERT, RoBERTa, ALBERT, SpanBERT, BART's
    `EosClassifier`; not XLNet's, which rearranges them), or, without one, its encoder
    does (ELECTRA, DistilBERT)."""
    from t2t.data.converters import EncoderConverter
    from t2t.models.classifiers import ENCODER_FEATURES
    fam = families.get(family)
    head = fam.heads.get("classification")
    if head is not None:
        return set(ENCODER_FEATURES) <= set(head.input_features)
    return issubclass(fam.converter, EncoderConverter)


def bert_trunk(pretrained: Optional[str], vocabulary: Optional[str], lowercase: bool,
               family: str = "bert") -> tuple[Any, Any]:
    """(TransformerConfig, vocabulary) of a fine-tuning over BERT-style rows: from the
    Hugging Face directory `pretrained` (any family whose encoder reads them: BERT,
    RoBERTa, ALBERT, ELECTRA, DistilBERT) its config and its own tokenizer
    (`t2t.run.vocabularies.hf_vocabulary`: ids as transformers' AutoTokenizer's, rows with
    its special tokens), else the TransformerConfig bindings and `vocabulary` (a vocab.txt;
    `t2t.run.vocabularies.wordpiece_vocabulary`). A head `family` whose rows are its own
    (XLNet's) reads only t2t MODEL_DIRs."""
    from t2t.convert import pretrained as hf_pretrained
    source = hf_family(pretrained)
    if source is not None:
        for name in (family, source):
            if not reads_bert_rows(name):
                title, given = families.get(name).title, families.get(source).title
                raise ConfigError(f"{pretrained!r} is a Hugging Face {given} directory: "
                                  f"{title} fine-tuning starts from a t2t {title} MODEL_DIR")
        return (hf_pretrained.read_config(pretrained)[1],
                hf_vocabulary(pretrained, vocabulary))
    model_cfg = configured.TransformerConfig()
    wordpiece = wordpiece_vocabulary(vocabulary, lowercase)
    if model_cfg.vocab_size != wordpiece.padded_vocab_size:
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
