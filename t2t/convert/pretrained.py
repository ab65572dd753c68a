"""One loader for every Hugging Face directory t2t converts: `load_pretrained` reads
config.json's `model_type`, `save_pretrained` writes a directory `transformers` loads.
Each model_type is one `HfFamily` of its family's converter module (`FORMS`), whose t2t
family lists it (`t2t.models.families.Family.hf_model_types`).

`PretrainedModel.logits(input_ids, attention_mask)` equals the HF class's output: MLM logits
[batch, length, vocab] for BERT, RoBERTa, ALBERT, DistilBERT and an ELECTRA generator,
replaced-token logits [batch, length] for an ELECTRA discriminator, LM logits for GPT-2,
OpenAI GPT (GPT-1) and XLNet (its content stream over the whole input; perm_mask,
target_mapping and mems through `t2t.models.xlnet.XLNet`); class logits [batch, labels] for
`XLNetForSequenceClassification` and [batch, choices] for `XLNetForMultipleChoice` (inputs
[batch, choices, length]), in XLNet's layout (left padding, the [CLS] last).
`PretrainedModel.hidden_states(input_ids, attention_mask)` equals the family's base class's
`last_hidden_state` (T5: the encoder's). config.json's `architectures` names the HF class;
`save_pretrained` writes that class back, and a class t2t does not read is one line.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Dict, Optional

import jax.numpy as jnp
import numpy as np

from t2t.convert import hf_bert, hf_encoders, hf_gpt1, hf_gpt2, hf_t5, hf_xlnet
from t2t.convert.hf_common import HfFamily, PretrainedError, check_class, class_to_read
from t2t.convert.hf_files import CONFIG_FILE, read_safetensors, write_directory
from t2t.convert.rules import tree
from t2t.models import families
from t2t.nn.config import TransformerConfig

__all__ = ["FORMS", "SUPPORTED", "PretrainedError", "PretrainedModel", "family_of",
           "from_t2t", "load_pretrained", "pretrained", "save_pretrained"]

# model_type -> its converter (config maps, rule tables, HF classes)
FORMS: Dict[str, HfFamily] = {form.model_type: form for form in (
    hf_bert.BERT, hf_encoders.ROBERTA, hf_encoders.ALBERT, hf_encoders.ELECTRA,
    hf_encoders.DISTILBERT, hf_gpt2.GPT2, hf_t5.T5, hf_xlnet.XLNET, hf_gpt1.GPT1)}
SUPPORTED = tuple(FORMS)


def _form(model_type: str) -> HfFamily:
    if model_type not in FORMS:
        raise PretrainedError(f"model_type {model_type!r} is not supported; t2t writes "
                              f"{list(SUPPORTED)}")
    return FORMS[model_type]


def family_of(model_type: str) -> str:
    """The t2t model family whose Hugging Face form `model_type` is."""
    _form(model_type)
    return next(f.name for f in families.registered() if model_type in f.hf_model_types)


@dataclasses.dataclass
class PretrainedModel:
    """A converted checkpoint: its HF `model_type` and `architecture`, t2t config and params."""

    model_type: str
    architecture: str
    config: TransformerConfig
    params: Any
    pad_token_id: int = 0
    options: Any = None     # settings outside TransformerConfig (XLNet: XLNetOptions)

    def logits(self, input_ids, attention_mask=None, token_type_ids=None) -> np.ndarray:
        """The HF class's logits for right- or left-padded [batch, length] ids (1 = token)."""
        return self._run(_form(self.model_type).logits, input_ids, attention_mask,
                         token_type_ids)

    def hidden_states(self, input_ids, attention_mask=None, token_type_ids=None) -> np.ndarray:
        """HF's `last_hidden_state` of the family's base class [batch, length, d_model]
        (T5: the encoder's, as `T5EncoderModel`'s) for [batch, length] ids (1 = token)."""
        return self._run(_form(self.model_type).hidden_states, input_ids, attention_mask,
                         token_type_ids)

    def _run(self, make_fn, input_ids, attention_mask, token_type_ids) -> np.ndarray:
        ids = jnp.asarray(input_ids, jnp.int32)
        mask = jnp.ones_like(ids) if attention_mask is None else jnp.asarray(attention_mask,
                                                                              jnp.int32)
        types = None if token_type_ids is None else jnp.asarray(token_type_ids, jnp.int32)
        return np.asarray(make_fn(self)(self.params, ids, mask, types))


# ----------------------------------------------------------------------- load / save
def _read_hf_config(directory: str) -> Dict[str, Any]:
    path = os.path.join(os.fspath(directory), CONFIG_FILE)
    if not os.path.isdir(directory):
        raise PretrainedError(f"{directory!r} is not a directory (expected a Hugging Face "
                              "model directory with config.json and model.safetensors)")
    if not os.path.exists(path):
        raise PretrainedError(f"{directory!r} has no config.json (a Hugging Face model "
                              "directory needs config.json and model.safetensors)")
    try:
        with open(path) as f:
            d = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PretrainedError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(d, dict) or "model_type" not in d:
        raise PretrainedError(f"{path} has no 'model_type'; t2t reads {list(SUPPORTED)}")
    if d["model_type"] not in SUPPORTED:
        raise PretrainedError(f"{path}: model_type {d['model_type']!r} is not supported; "
                              f"t2t reads {list(SUPPORTED)}")
    return d


def _config(form: HfFamily, d: Dict[str, Any]) -> TransformerConfig:
    try:
        return form.config_from_hf(d)
    except KeyError as e:
        raise PretrainedError(f"config.json of this {form.model_type} model has no "
                              f"{e.args[0]!r}, which t2t needs") from None
    except ValueError as e:
        raise PretrainedError(f"{form.model_type} config.json: {e}") from None


def load_pretrained(directory, **overrides) -> PretrainedModel:
    """HF directory (config.json + model.safetensors) -> PretrainedModel.

    `overrides` replace TransformerConfig fields (e.g. `dropout_rate=0.0`).
    """
    directory = os.fspath(directory)
    d = _read_hf_config(directory)
    form = FORMS[d["model_type"]]
    architecture = class_to_read(form, (d.get("architectures") or form.classes[:1])[0])
    config = _config(form, d)
    if overrides:
        config = config.replace(**overrides)
    try:
        state = read_safetensors(directory)
    except FileNotFoundError as e:
        raise PretrainedError(str(e)) from None
    if form.check is not None:
        try:
            form.check(d, architecture)
        except ValueError as e:
            raise PretrainedError(f"{form.model_type} config.json: {e}") from None
    params = form.params_from_hf(state, config, architecture)
    pad = d.get("pad_token_id")
    options = form.options_from_hf(d) if form.options_from_hf else None
    return PretrainedModel(form.model_type, architecture, config, params,
                           0 if pad is None else int(pad), options)


def save_pretrained(model: PretrainedModel, directory) -> None:
    """Write `model` as config.json + model.safetensors that `transformers` loads, as the
    HF class `model.architecture` (the one it was loaded from)."""
    form = _form(model.model_type)
    check_class(form, model.architecture)
    hf_config, state = form.to_hf(dataclasses.replace(model, params=tree(model.params)))
    write_directory(directory, hf_config, state)


def pretrained(model_type: str, config: TransformerConfig, params,
               architecture: Optional[str] = None, pad_token_id: Optional[int] = None,
               options=None) -> PretrainedModel:
    """Wrap t2t params (e.g. a trained checkpoint's) for `save_pretrained` (`options`: an
    XLNet's `XLNetOptions`)."""
    if model_type not in SUPPORTED:
        raise PretrainedError(f"model_type {model_type!r} is not supported; choose one of "
                              f"{list(SUPPORTED)}")
    form = FORMS[model_type]
    if architecture is not None:
        check_class(form, architecture)
    pad = form.pad_token_id if pad_token_id is None else pad_token_id
    return PretrainedModel(model_type, architecture or form.classes[0], config, tree(params),
                           pad, options)


def from_t2t(model_type: str, config: TransformerConfig, params,
             generator: Optional[TransformerConfig] = None) -> Dict[str, PretrainedModel]:
    """t2t training params -> {name: PretrainedModel} for `save_pretrained`.

    BertModel trees give one model ("model"; the parts its HF class holds); an ELECTRA
    pretraining tree (see `t2t.models.electra.ElectraPretraining`, with its `generator`
    config) gives "generator" (ElectraForMaskedLM) and "discriminator"
    (ElectraForPreTraining), each with the shared embeddings.
    """
    form = _form(model_type)
    p = tree(params)
    parts = (form.split(config, p, generator) if form.split is not None
             else {"model": (None, config, p)})
    return {name: pretrained(model_type, cfg, part, architecture)
            for name, (architecture, cfg, part) in parts.items()}
