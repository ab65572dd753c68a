"""gin wiring of GPT-1 fine-tuning (Radford et al. 2018, sec. 3.2-3.3): `gpt_format_experiment`.

A task's records become the paper's token rows (`t2t.data.gpt_format`: start, delimiter
and extract tokens appended to the vocabulary), a `GptFormatClassifier` reads the extract
token's final state and trains on L2 + lm_weight * L1 (`t2t.models.gpt_format`). Built
like `multiple_choice_experiment`, and scored the same way (the task's metrics of the
predicted class or choice); `finetune_experiment` supplies the trainer.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Dict, Optional

import gin
import numpy as np

from t2t.data import gpt_format
from t2t.data import tasks as tasks_lib
from t2t.errors import UserError
from t2t.models import families
from t2t.run import configurables as configured
from t2t.run import experiment as experiment_lib
from t2t.run import classifier_experiments
from t2t.run.configurables import configurable
from t2t.run.model_dir import is_hf_dir
from t2t.train.checkpoints import restore_params
from t2t.train.trainer import Trainer

# The head each input format uses: one score per row (softmax over the rows) for multiple
# choice; the rows' extract states summed into one classifier otherwise.
COMBINE = {"classification": "sum", "entailment": "sum", "similarity": "sum",
           "multiple_choice": "choice"}


@dataclasses.dataclass
class GptFormatExperiment(classifier_experiments.ChoiceExperiment):
    """Features in GPT-1's input format; evaluation as `ChoiceExperiment` (the task's
    metrics of the argmax over classes or choices)."""

    task_format: str = "classification"
    special: Optional[gpt_format.SpecialTokens] = None

    def choice_features(self, split: str, max_examples: Optional[int] = None
                        ) -> Dict[str, np.ndarray]:
        examples = gpt_format.task_examples(self.task, split, self.vocabulary, self.task_format,
                                            max_examples)
        pad = getattr(self.vocabulary, "pad_id", None) or 0
        return gpt_format.format_features(self.task_format, examples, self.special,
                                          self.max_length, pad)


def gpt_vocabulary(pretrained: Optional[str], vocabulary: Optional[str]) -> Any:
    """The SentencePiece a t2t GPT pretraining saved in `pretrained`, else the .model file
    `vocabulary`, else the bundled Bible's (what experiments/gpt_tiny_bible.gin trains on)."""
    from t2t.data import vocab_training
    from t2t.data.catalog.bible import bible_sentencepiece
    saved = vocab_training.saved(pretrained) if pretrained else None
    if saved is not None:
        return saved
    if vocabulary is not None:
        if not os.path.isfile(vocabulary):
            raise UserError(f"vocabulary {vocabulary!r}: no such file (a SentencePiece .model)")
        from t2t.data.vocab import load_vocabulary
        return load_vocabulary("sentencepiece", vocabulary)
    return bible_sentencepiece()


def gpt_trunk(pretrained: Optional[str], vocab: Any) -> tuple[Any, Any]:
    """(TransformerConfig of the pretrained trunk, its params or None): a Hugging Face GPT-2
    or openai-gpt directory, a t2t GPT MODEL_DIR (config from the TransformerConfig
    bindings, vocabulary size from `vocab` as pretraining set it), or None (no
    pretraining: the bindings, fresh weights)."""
    if pretrained is not None and is_hf_dir(pretrained):
        from t2t.convert import pretrained as hf_pretrained
        loaded = hf_pretrained.load_pretrained(pretrained)
        if "gpt_format" not in families.get(hf_pretrained.family_of(loaded.model_type)).heads:
            forms = [t for f in families.registered() if "gpt_format" in f.heads
                     for t in f.hf_model_types]
            raise UserError(f"{pretrained!r} is a {loaded.model_type} directory; the GPT "
                            f"fine-tuning format needs a {' or '.join(forms)} one")
        return loaded.config, loaded.params
    config = configured.TransformerConfig()
    if config.vocab_size != vocab.padded_vocab_size:
        config = config.replace(vocab_size=vocab.padded_vocab_size)
    params = None if pretrained is None else restore_params(pretrained)
    return config, params


@configurable
def gpt_format_experiment(task: str = gin.REQUIRED, batch_size: int = gin.REQUIRED,
                          task_format: str = gin.REQUIRED, max_length: int = 128,
                          lm_weight: float = 0.5, classifier_dropout: float = 0.1,
                          num_choices: int = 4, pretrained: Optional[str] = None,
                          vocabulary: Optional[str] = None,
                          max_train_examples: Optional[int] = None,
                          trainer_fn: Optional[Callable[..., Trainer]] = None
                          ) -> GptFormatExperiment:
    """A `GptFormatClassifier` on `task` in `task_format` ("classification", "entailment",
    "similarity" or "multiple_choice" with `num_choices` answers), rows cut to `max_length`;
    `lm_weight` is lambda of L3 = L2 + lambda * L1 (0.5 in the paper, 0 = no auxiliary LM).
    `pretrained`: a t2t GPT MODEL_DIR (its saved or the Bible SentencePiece) or a Hugging
    Face gpt2 / openai-gpt directory (then `vocabulary`, a SentencePiece .model, must be its
    tokenizer's equal); None trains from scratch (the paper's "no pre-training" row)."""
    from t2t.models.gpt_format import NUM_SPECIAL_TOKENS, GptFormatClassifier
    gpt_format.check_format(task_format)
    task_obj = tasks_lib.get_task(task)
    vocab = gpt_vocabulary(pretrained, vocabulary)
    trunk_cfg, trunk_params = gpt_trunk(pretrained, vocab)
    special = gpt_format.SpecialTokens.after(trunk_cfg.vocab_size)
    model_cfg = trunk_cfg.replace(vocab_size=trunk_cfg.vocab_size + NUM_SPECIAL_TOKENS)
    combine = COMBINE[task_format]
    if combine == "sum" and not getattr(task_obj, "label_names", None):
        raise UserError(f"task {task!r} has no label names: not a classification task")
    outputs = num_choices if combine == "choice" else len(task_obj.label_names)
    model = GptFormatClassifier(model_cfg, outputs, combine, lm_weight, classifier_dropout,
                                pretrained=trunk_params)
    size = min(classifier_experiments.train_size(task_obj),
               max_train_examples or classifier_experiments.train_size(task_obj))
    train_cfg = configured.TrainConfig()
    trainer = (trainer_fn(model, train_cfg, task_obj, batch_size, size) if trainer_fn
               else experiment_lib.make_trainer(model, train_cfg))
    if trunk_params is not None:     # weights come from `pretrained` via the model's init
        trainer.initial_checkpoint = None
    return GptFormatExperiment(trainer, task_obj, None, batch_size, None, vocab, max_length,
                               max_train_examples, task_format, special)
