"""Hugging Face Longformer <-> t2t, and the "long" conversion of a RoBERTa.

Longformer is RoBERTa-shaped (positions from pad_token_id + 1, byte BPE, exact-gelu MLM
head), so its tables are RoBERTa's (`t2t.convert.hf_encoders.roberta_rules`) under the root
"longformer." plus each layer's `query_global`/`key_global`/`value_global`; its config is
RoBERTa's with `attention_pattern="sliding_window"` and HF's per-layer `attention_window`.
Classes: `LongformerForMaskedLM` (written by default), `LongformerModel` and the task heads
(`...ForSequenceClassification` and the others, `t2t.convert.hf_heads`).

`logits(ids, mask, global_attention_mask=...)` equals transformers' on the real positions
(HF pads the input to a multiple of the window; t2t pads inside,
t2t/nn/longformer.py). Without `global_attention_mask` the classes' own defaults apply, as
transformers': the [CLS] for sequence classification, the tokens before the first </s>
for question answering, the tokens after the question's </s></s> for multiple choice,
none otherwise. The t2t config is sized to the batch's global tokens
(`max_global_tokens`), so any number of them is exact.

`long_roberta(model, length)`: the paper's recipe (sec. 5) for a Longformer from a RoBERTa
checkpoint: the 512 learned positions copied over and over to `length`, the global
projections copied from the local ones.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Dict, List, Mapping, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from t2t.convert.hf_common import HfFamily, PretrainedError, require
from t2t.convert.hf_encoders import (ROBERTA, ROBERTA_MLM_ACTIVATION, roberta_config,
                                     roberta_hf_config, roberta_positions, roberta_rules)
from t2t.convert.hf_heads import KINDS, TaskHeads, num_outputs, with_heads
from t2t.convert.rules import (Params, Rule, StateDict, export_params, import_params, linear,
                               reshape)
from t2t.models import classifiers, families
from t2t.models.bert import BertModel
from t2t.models.longformer import global_attention
from t2t.nn.config import TransformerConfig

GLOBAL = ("query_global", "key_global", "value_global")
DEFAULT_SEP = 2       # HF LongformerConfig's sep_token_id
ATTENTION_MODE = "longformer"   # HF's attention_mode t2t reads and writes (its own kernel's)


@dataclasses.dataclass(frozen=True)
class LongformerOptions:
    """config.json settings outside TransformerConfig: the </s> id the task classes'
    default global attention looks for."""

    sep_token_id: int = DEFAULT_SEP


# ----------------------------------------------------------------------- configs
def longformer_config(d: Mapping) -> TransformerConfig:
    """HF `LongformerConfig` -> TransformerConfig (RoBERTa's, sliding-window attention)."""
    window = d.get("attention_window", 512)
    return roberta_config(d).replace(
        attention_pattern="sliding_window", global_projections=True,
        attention_window=(window,) if isinstance(window, int) else tuple(window))


def longformer_hf_config(c: TransformerConfig, pad_token_id: int = 1,
                         architecture: str = "LongformerForMaskedLM",
                         options: Optional[LongformerOptions] = None) -> dict:
    require(c.attention_pattern == "sliding_window" and c.global_projections, "Longformer",
            "needs attention_pattern='sliding_window' and global_projections=True")
    windows = list(c.attention_window)
    if len(windows) == 1:
        windows = windows * c.num_encoder_layers
    return {**roberta_hf_config(c, pad_token_id, architecture), "model_type": "longformer",
            "attention_window": windows, "attention_mode": ATTENTION_MODE,
            "sep_token_id": (options or LongformerOptions()).sep_token_id}


def _check(d: Mapping, architecture: str) -> None:
    if d.get("attention_mode", ATTENTION_MODE) != ATTENTION_MODE:
        raise ValueError(f"attention_mode={d['attention_mode']!r}: t2t reads "
                         f"{ATTENTION_MODE!r}")


# ----------------------------------------------------------------------- rule tables
def longformer_rules(c: TransformerConfig, root: str = "longformer.", pooler: bool = False,
                     mlm: bool = True) -> List[Rule]:
    """RoBERTa's table under `root` and each layer's global projections."""
    h, k = c.num_heads, c.head_dim
    rules = roberta_rules(c, root, pooler=pooler, mlm=mlm)
    for i in range(c.num_encoder_layers):
        hf, t = f"{root}encoder.layer.{i}.attention.self", f"encoder/layers/layer_{i}"
        for name in GLOBAL:
            rules += [linear(f"{hf}.{name}.weight", f"{t}/self_attention/{name}/kernel",
                             (c.d_model, h, k)),
                      reshape(f"{hf}.{name}.bias", f"{t}/self_attention/{name}/bias",
                              (h * k,), (h, k))]
    return rules


TABLES: Dict[str, Callable[[TransformerConfig, bool], List[Rule]]] = {
    "LongformerForMaskedLM": lambda c, pooler: longformer_rules(c),
    "LongformerModel": lambda c, pooler: longformer_rules(c, "", pooler=pooler, mlm=False)}
HEADS = TaskHeads(
    "Longformer", lambda c: longformer_rules(c, pooler=False, mlm=False),
    {"SequenceClassification": ("classifier.dense", "classifier.out_proj"),
     "MultipleChoice": ("longformer.pooler.dense", "classifier")})


def _params(state: StateDict, c: TransformerConfig, architecture: str) -> Params:
    return import_params(state, TABLES[architecture](c, "pooler.dense.weight" in state), c,
                         None)


def _to_hf(model) -> Tuple[dict, Dict[str, np.ndarray]]:
    rules = TABLES[model.architecture](model.config, "pooler" in model.params)
    return (longformer_hf_config(model.config, model.pad_token_id, model.architecture,
                                 model.options),
            export_params(model.params, rules))


# ----------------------------------------------------------------------- logits
def default_global_tokens(architecture: str, ids: np.ndarray, sep_token_id: int
                          ) -> Optional[np.ndarray]:
    """transformers' global attention of a task class given none: [..., length] or None."""
    suffix = HEADS.suffix(architecture)
    at = np.arange(ids.shape[-1])
    if suffix == "SequenceClassification":
        return np.broadcast_to(at == 0, ids.shape)
    if suffix in ("QuestionAnswering", "MultipleChoice"):
        question_end = np.argmax(ids == sep_token_id, axis=-1)[..., None]    # first </s>
        if suffix == "QuestionAnswering":
            return at < question_end
        return at > question_end + 1
    return None


def _logits(model) -> Callable:
    """(params, ids, mask, types, global_attention_mask=None) -> the class's logits."""
    suffix = HEADS.suffix(model.architecture)
    if suffix is None and "mlm_head" not in model.params:
        raise PretrainedError(f"this {model.architecture} checkpoint has no MLM head, so it "
                              "has no logits; use PretrainedModel.hidden_states")
    outputs = num_outputs(model.params, model.architecture, HEADS) if suffix else 0
    style = families.head_style("longformer", KINDS[suffix]) if suffix else None
    sep = (model.options or LongformerOptions()).sep_token_id

    def run(params, ids, mask, types, global_attention_mask=None):
        if global_attention_mask is None:
            default = default_global_tokens(model.architecture, np.asarray(ids), sep)
            global_attention_mask = None if default is None else jnp.asarray(default)
        glob = (jnp.zeros(ids.shape, jnp.int32) if global_attention_mask is None
                else jnp.asarray(global_attention_mask, jnp.int32) * mask)
        most = int(np.asarray(glob).reshape(-1, ids.shape[-1]).sum(-1).max(initial=0))
        config = model.config.replace(max_global_tokens=most)
        return _logits_fn(config, suffix, outputs, style, model.pad_token_id)(
            params, ids, mask, types, glob)
    return run


def _hidden_states(model) -> Callable:
    def run(params, ids, mask, types):
        return _logits_fn(model.config.replace(max_global_tokens=0), "hidden", 0, None,
                          model.pad_token_id)(params, ids, mask, types, jnp.zeros_like(ids))
    return run


@functools.lru_cache(maxsize=None)
def _logits_fn(config: TransformerConfig, suffix: Optional[str], outputs: int, style,
               pad_token_id: int):
    heads = {"SequenceClassification": lambda: classifiers.PooledHead(config, outputs,
                                                                      style=style),
             "MultipleChoice": lambda: classifiers.ChoiceHead(config, style=style),
             "TokenClassification": lambda: classifiers.TokenHead(config, outputs),
             "QuestionAnswering": lambda: classifiers.SpanHead(config)}

    def fn(params, ids, mask, types, glob):
        flat = ids.reshape(-1, ids.shape[-1])
        positions = (roberta_positions(flat, pad_token_id)
                     - config.position_offset).reshape(ids.shape)
        with global_attention(glob):
            if suffix in heads:
                out = heads[suffix]().apply({"params": params}, ids, mask, types, positions)
                if isinstance(out, dict):                       # SpanHead
                    return jnp.stack([out["start_logits"], out["end_logits"]], axis=-1)
                return out
            model = BertModel(config, ROBERTA_MLM_ACTIVATION)
            method = BertModel.encode if suffix == "hidden" else BertModel.mlm_logits
            return model.apply({"params": params}, ids, mask, types, positions, method=method)
    return jax.jit(fn)


# ----------------------------------------------------------------------- the long conversion
def long_positions(table: np.ndarray, length: int, offset: int) -> np.ndarray:
    """A learned position table [offset + n, d] -> [offset + length, d]: the first `offset`
    rows (RoBERTa's, never used) kept, the n learned rows copied over and over (the paper's
    sec. 5 initialisation)."""
    learned = table[offset:]
    reps = -(-length // learned.shape[0])
    return np.concatenate([table[:offset], np.tile(learned, (reps, 1))[:length]], axis=0)


def long_roberta(model, length: int = 4096, window: int = 512):
    """A RoBERTa `PretrainedModel` -> a Longformer one of `length` positions and the full
    `window` (every layer): positions copied (`long_positions`), each layer's global
    projections copied from its query, key and value; `save_pretrained` writes it as the
    matching Longformer class (RobertaForMaskedLM -> LongformerForMaskedLM, ...)."""
    from t2t.convert.pretrained import PretrainedModel

    if model.architecture not in ROBERTA.classes:
        raise PretrainedError(f"the long conversion reads a RoBERTa checkpoint, not "
                              f"{model.model_type!r}")
    c = model.config
    config = c.replace(max_length=length + c.position_offset, attention_pattern="sliding_window",
                       attention_window=(window,), global_projections=True)
    params = jax.tree_util.tree_map(np.asarray, model.params)
    encoder = dict(params["encoder"])
    embedder = dict(encoder["embedder"])
    embedder["position_embedder"] = {"embedding": long_positions(
        embedder["position_embedder"]["embedding"], length, c.position_offset)}
    encoder["embedder"] = embedder
    layers = {}
    for name, layer in encoder["layers"].items():
        attention = dict(layer["self_attention"])
        for local, copied in zip(("query", "key", "value"), GLOBAL):
            attention[copied] = dict(attention[local])
        layers[name] = {**layer, "self_attention": attention}
    encoder["layers"] = layers
    architecture = model.architecture.replace("Roberta", "Longformer", 1)
    return PretrainedModel("longformer", architecture, config, {**params, "encoder": encoder},
                           model.pad_token_id, LongformerOptions(), dict(model.head_config))


LONGFORMER = dataclasses.replace(
    with_heads(HfFamily("longformer", tuple(TABLES), longformer_config, _params, _to_hf,
                        _logits, pad_token_id=1, check=_check,
                        options_from_hf=lambda d: LongformerOptions(
                            int(d.get("sep_token_id", DEFAULT_SEP))),
                        hidden_states=_hidden_states,
                        logits_inputs=("global_attention_mask",)),
               HEADS, lambda model: longformer_hf_config(model.config, model.pad_token_id,
                                                         model.architecture, model.options)),
    logits=_logits)
