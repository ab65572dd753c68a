"""Hugging Face task-head classes of BERT and its successors <-> the parameters of t2t's own
fine-tuning heads (`t2t.models.classifiers`), so the tree a checkpoint gives is the one
`t2t finetune` trains and a tree `t2t finetune` trained is one `save_pretrained` writes:

  ...ForSequenceClassification -> `PooledHead` (`pooler`, `classifier`): [batch, labels]
  ...ForMultipleChoice         -> `ChoiceHead` (`pooler`, `classifier` of one output):
                                  inputs [batch, choices, length] -> [batch, choices]
  ...ForTokenClassification    -> `TokenHead` (`tagger`): [batch, length, labels]
  ...ForQuestionAnswering      -> `SpanHead` (`qa_outputs`): [batch, length, 2] = start, end

Each family names its head tensors its own way (`TaskHeads`: BERT's and ALBERT's pooler
sits in the backbone, RoBERTa's and ELECTRA's classification dense in the head, DistilBERT's
is `pre_classifier`), and reads its first token the way its entry in `t2t.models.families`
says (`Family.head_styles`: tanh, gelu or relu, dropout first or not). `with_heads` adds a
family's head classes to its `HfFamily`. The label count is the checkpoint's (its output
tensor's rows); config.json's labels (`HEAD_CONFIG_KEYS`) are written back as they were read.
A checkpoint without its head tensors (a base model saved under a head class) raises
`MissingHeadError`; read again with config.json's label count (`config_labels`: id2label,
num_labels, else transformers' 2), the head it lacks is initialised and named in one log
line, as transformers initialises it.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from t2t.convert.hf_common import HfFamily, registry_family
from t2t.convert.rules import (CheckpointMismatchError, Params, Rule, StateDict, dense,
                               export_params, import_params, initialise, merge, tree)
from t2t.models import classifiers, families
from t2t.nn.config import TransformerConfig

# HF class suffix -> t2t's task kind (`Family.heads`, `Family.head_styles`)
KINDS = {"SequenceClassification": "classification", "MultipleChoice": "multiple_choice",
         "TokenClassification": "tagging", "QuestionAnswering": "span_qa"}
# HF class suffix -> the t2t module holding its output dense
OUTPUT = {"SequenceClassification": "classifier", "MultipleChoice": "classifier",
          "TokenClassification": "tagger", "QuestionAnswering": "qa_outputs"}
# config.json keys of a head class that t2t carries through (`PretrainedModel.head_config`)
HEAD_CONFIG_KEYS = ("id2label", "label2id", "problem_type")
# outputs of the heads whose count is not the labels'; transformers' label count where
# config.json names none
FIXED_OUTPUTS = {"MultipleChoice": 1, "QuestionAnswering": 2}
DEFAULT_LABELS = 2


@dataclasses.dataclass(frozen=True)
class TaskHeads:
    """One family's HF task-head classes (`prefix` + "For" + a `KINDS` suffix).

    `trunk(config)`: the backbone's table under its root ("bert.", ...) without a pooler;
    `pooled`: for SequenceClassification and MultipleChoice, the HF names of the dense
    before the output (t2t's `pooler/dense`) and of the output (`classifier/dense`);
    token classification reads `classifier` and question answering `qa_outputs`.
    `suffixes`: the classes mapped (all four by default).
    """

    prefix: str
    trunk: Callable[[TransformerConfig], List[Rule]]
    pooled: Mapping[str, Tuple[str, str]]
    suffixes: Tuple[str, ...] = tuple(KINDS)

    @property
    def classes(self) -> Tuple[str, ...]:
        return tuple(f"{self.prefix}For{suffix}" for suffix in self.suffixes)

    def suffix(self, architecture: str) -> Optional[str]:
        """"SequenceClassification", ... of a head class of this family; else None."""
        for suffix in self.suffixes:
            if architecture == f"{self.prefix}For{suffix}":
                return suffix
        return None

    def output_name(self, suffix: str) -> str:
        if suffix in self.pooled:
            return self.pooled[suffix][1]
        return "classifier" if suffix == "TokenClassification" else "qa_outputs"

    def rules(self, architecture: str, c: TransformerConfig, outputs: int) -> List[Rule]:
        """The table of `architecture` with `outputs` labels (choices: 1; spans: 2)."""
        suffix = self.suffix(architecture)
        d, out = c.d_model, OUTPUT[suffix]
        rules = list(self.trunk(c))
        if suffix in self.pooled:
            rules += dense(self.pooled[suffix][0], "pooler/dense", d, d)
        return rules + dense(self.output_name(suffix), f"{out}/dense", d, outputs)


def num_outputs(params: Params, architecture: str, heads: TaskHeads) -> int:
    """The output count of a head tree (its output kernel's columns)."""
    return int(tree(params)[OUTPUT[heads.suffix(architecture)]]["dense"]["kernel"].shape[-1])


class MissingHeadError(CheckpointMismatchError):
    """A head class's checkpoint without its output tensor: read it again with the label
    count (`config_labels`) and the head is initialised."""


def config_labels(hf_config: Mapping[str, Any]) -> Tuple[int, str]:
    """(label count, where it comes from) of a head class's config.json: its `id2label`,
    else `num_labels`, else transformers' default (2, which it leaves out of config.json)."""
    if hf_config.get("id2label"):
        return len(hf_config["id2label"]), "config.json's id2label"
    if hf_config.get("num_labels"):
        return int(hf_config["num_labels"]), "config.json's num_labels"
    return DEFAULT_LABELS, "transformers' default"


def import_head(heads: TaskHeads, state: StateDict, c: TransformerConfig, architecture: str,
                scan: Optional[bool] = None,
                labels: Optional[Tuple[int, str]] = None) -> Params:
    """A head class's state dict -> t2t's fine-tuning tree (labels as the checkpoint has).
    Without its output tensor: MissingHeadError, or, given `labels` (`config_labels`), the
    head tensors it lacks initialised (`t2t.convert.rules.initialise`, one log line)."""
    suffix = heads.suffix(architecture)
    name = f"{heads.output_name(suffix)}.weight"
    if name in state:
        return import_params(state, heads.rules(architecture, c, int(np.shape(state[name])[0])),
                             c, scan)
    if labels is None:
        raise MissingHeadError(f"this {architecture} checkpoint has no {name!r}")
    outputs = FIXED_OUTPUTS.get(suffix, labels[0])
    rules = heads.rules(architecture, c, outputs)
    head = rules[len(heads.trunk(c)):]
    missing = [r for r in head if not any(n in state for n in (r.hf, *r.aliases))]
    kept = [r for r in rules if all(r is not m for m in missing)]
    counted = "" if suffix in FIXED_OUTPUTS else f", {outputs} labels from {labels[1]}"
    return merge(import_params(state, kept, c, scan),
                 initialise(missing, c, f"{architecture} head ({name}{counted})"))


def export_head(heads: TaskHeads, params: Params, c: TransformerConfig,
                architecture: str) -> Dict[str, np.ndarray]:
    """t2t's fine-tuning tree -> the head class's state dict."""
    return export_params(params, heads.rules(architecture, c,
                                             num_outputs(params, architecture, heads)))


def head_config(model, outputs: int) -> Dict[str, Any]:
    """config.json's label keys of a head class: as read (`model.head_config`), else
    `outputs` generic labels (LABEL_0, ...), as transformers names them."""
    kept = dict(getattr(model, "head_config", None) or {})
    if len(kept.get("id2label", ())) != outputs:
        labels = {str(i): f"LABEL_{i}" for i in range(outputs)}
        kept.update(id2label=labels, label2id={v: int(k) for k, v in labels.items()})
    return kept


def head_logits(model, heads: TaskHeads, positions: Optional[Callable] = None) -> Callable:
    """jitted (params, input_ids, attention_mask, token_type_ids) -> the head class's
    logits, through t2t's fine-tuning module with the family's pooler style; position ids
    `positions(ids, pad_token_id)` where HF computes them from the ids (RoBERTa)."""
    suffix = heads.suffix(model.architecture)
    style = families.head_style(registry_family(model.model_type).name, KINDS[suffix])
    return _head_fn(model.config, suffix, num_outputs(model.params, model.architecture, heads),
                    style, positions, model.pad_token_id)


@functools.lru_cache(maxsize=None)
def _head_fn(config: TransformerConfig, suffix: str, outputs: int, style, positions,
             pad_token_id: int):
    module = {"SequenceClassification": lambda: classifiers.PooledHead(config, outputs,
                                                                       style=style),
              "MultipleChoice": lambda: classifiers.ChoiceHead(config, style=style),
              "TokenClassification": lambda: classifiers.TokenHead(config, outputs),
              "QuestionAnswering": lambda: classifiers.SpanHead(config)}[suffix]()

    def fn(params, ids, mask, types):
        position_ids = None    # HF's from the ids, less the offset the Encoder adds
        if positions is not None:
            flat = ids.reshape(-1, ids.shape[-1])
            position_ids = (positions(flat, pad_token_id)
                            - config.position_offset).reshape(ids.shape)
        out = module.apply({"params": params}, ids, mask, types, position_ids)
        if isinstance(out, dict):                       # SpanHead
            return jnp.stack([out["start_logits"], out["end_logits"]], axis=-1)
        return out
    return jax.jit(fn)


def with_heads(form: HfFamily, heads: TaskHeads, hf_config: Callable[[Any], dict],
               positions: Optional[Callable] = None,
               after_import: Callable[[Params], Params] = lambda p: p,
               before_export: Callable[[Params], Params] = lambda p: p,
               scan: Optional[bool] = None) -> HfFamily:
    """`form` reading and writing `heads`' classes too: `hf_config(model)` is the family's
    config.json of `model.architecture`; `after_import` / `before_export` adjust the tree
    (ALBERT's shared layer); `scan` as `import_params`'."""
    def params_from_hf(state, config, architecture, labels=None):
        if architecture not in heads.classes:
            return form.params_from_hf(state, config, architecture)
        return after_import(import_head(heads, state, config, architecture, scan, labels))

    def to_hf(model):
        if model.architecture not in heads.classes:
            return form.to_hf(model)
        outputs = num_outputs(model.params, model.architecture, heads)
        return ({**hf_config(model), **head_config(model, outputs)},
                export_head(heads, before_export(model.params), model.config,
                            model.architecture))

    def logits(model):
        if model.architecture not in heads.classes:
            return form.logits(model)
        return head_logits(model, heads, positions)

    return dataclasses.replace(form, classes=form.classes + heads.classes,
                               params_from_hf=params_from_hf, to_hf=to_hf, logits=logits,
                               read_as={k: v for k, v in form.read_as.items()
                                        if k not in heads.classes})
