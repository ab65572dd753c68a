"""One loader for every Hugging Face directory t2t converts: `load_pretrained` reads
config.json's `model_type`, `save_pretrained` writes a directory `transformers` loads.
Each model_type is one `HfFamily` of its family's converter module (`FORMS`), whose t2t
family lists it (`t2t.models.families.Family.hf_model_types`).

`PretrainedModel.logits(input_ids, attention_mask, token_type_ids, **inputs)` equals the HF
class's `.logits`: MLM logits [batch, length, vocab] for BERT, RoBERTa, ALBERT, DistilBERT
and an ELECTRA generator, replaced-token logits [batch, length] for an ELECTRA
discriminator, LM logits for GPT-2, OpenAI GPT (GPT-1) and XLNet (its content stream over
the whole input; perm_mask, target_mapping and mems through `t2t.models.xlnet.XLNet`);
`T5ForConditionalGeneration`'s and `BartForConditionalGeneration`'s [batch, target, vocab]
with `decoder_input_ids=` (and `decoder_attention_mask=`); Longformer's with
`global_attention_mask=` (HF's meaning and its task classes' defaults without it,
`t2t.convert.hf_longformer`); and a task head's:

  ...ForSequenceClassification  [batch, labels]          (BERT, RoBERTa, ALBERT, ELECTRA,
  ...ForTokenClassification     [batch, length, labels]   DistilBERT; GPT-2's sequence and
  ...ForQuestionAnswering       [batch, length, 2] = start, end      token classification)
  ...ForMultipleChoice          [batch, choices] from inputs [batch, choices, length]
  XLNetForSequenceClassification / XLNetForMultipleChoice, in XLNet's layout (left
  padding, the [CLS] last)
  BartForSequenceClassification [batch, labels], from the decoder's state at each row's
  last </s>

A task head's tree is the parameters of t2t's own fine-tuning head
(`t2t.convert.hf_heads`, `t2t.models.classifiers`), so `t2t finetune` continues from it.
`PretrainedModel.hidden_states(input_ids, attention_mask)` equals the family's base class's
`last_hidden_state` (T5: the encoder's; BART: the decoder's over the ids shifted right, as
`BartModel` without decoder inputs). `PretrainedModel.vocabulary` is the directory's
tokenizer as a t2t vocabulary (`t2t.data.hf_tokenizer.load`, read when first asked for;
None, said in one log line, where the directory has no tokenizer file). config.json's
`architectures` names the HF class; `save_pretrained` writes that class back (a head with
its labels). A class t2t does not read is one line; one whose own head t2t does not map
(GPT2DoubleHeadsModel, BertForNextSentencePrediction) is read as the class
`HfFamily.read_as` names, said in one line (tensors no rule reads are named in one line
too); a missing head (AlbertForMaskedLM's pooler and SOP head; a task head class's head,
its labels from config.json as transformers counts them) is initialised and named in one
line; a checkpoint without the tensors its class needs is one line (`PretrainedError`).
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
from typing import Any, Dict, Optional, Tuple

import jax.numpy as jnp
import numpy as np

from t2t.convert import (hf_bart, hf_bert, hf_bigbird, hf_encoders, hf_gpt1, hf_gpt2,
                         hf_longformer, hf_t5, hf_xlnet)
from t2t.convert.hf_common import (HfFamily, PretrainedError, check_class, class_to_read,
                                   registry_family)
from t2t.convert.hf_files import CONFIG_FILE, read_json, read_safetensors, write_directory
from t2t.convert.hf_heads import HEAD_CONFIG_KEYS, MissingHeadError, config_labels
from t2t.convert.rules import CheckpointMismatchError, tree
from t2t.data import hf_tokenizer
from t2t.errors import InputFileError
from t2t.nn.config import TransformerConfig

_log = logging.getLogger(__name__)

__all__ = ["FORMS", "SUPPORTED", "PretrainedError", "PretrainedModel", "family_of",
           "from_t2t", "has_tokenizer_files", "load_pretrained", "pretrained", "read_config",
           "save_pretrained"]

# model_type -> its converter (config maps, rule tables, HF classes)
FORMS: Dict[str, HfFamily] = {form.model_type: form for form in (
    hf_bert.BERT, hf_encoders.ROBERTA, hf_encoders.ALBERT, hf_encoders.ELECTRA,
    hf_encoders.DISTILBERT, hf_gpt2.GPT2, hf_t5.T5, hf_xlnet.XLNET, hf_gpt1.GPT1,
    hf_bart.BART, hf_bigbird.BIGBIRD, hf_longformer.LONGFORMER)}
SUPPORTED = tuple(FORMS)


def _form(model_type: str) -> HfFamily:
    if model_type not in FORMS:
        raise PretrainedError(f"model_type {model_type!r} is not supported; t2t writes "
                              f"{list(SUPPORTED)}")
    return FORMS[model_type]


def family_of(model_type: str) -> str:
    """The t2t model family whose Hugging Face form `model_type` is."""
    _form(model_type)
    return registry_family(model_type).name


@dataclasses.dataclass
class PretrainedModel:
    """A converted checkpoint: its HF `model_type` and `architecture`, t2t config and params."""

    model_type: str
    architecture: str
    config: TransformerConfig
    params: Any
    pad_token_id: int = 0
    options: Any = None     # settings outside TransformerConfig (XLNet: XLNetOptions)
    # a task head's config.json labels (id2label, label2id, problem_type), written back
    head_config: Dict[str, Any] = dataclasses.field(default_factory=dict)
    directory: Optional[str] = None     # the HF directory it was loaded from, if any

    @functools.cached_property
    def vocabulary(self):
        """The checkpoint's tokenizer as a t2t vocabulary (`t2t.data.hf_tokenizer.load`:
        ids equal to transformers' `AutoTokenizer`), read once when first asked for; None
        (said in one log line) for a model not loaded from a directory, or a directory
        without tokenizer files. Tokenizer files t2t cannot read are an InputFileError."""
        if self.directory is None:
            return None
        if not has_tokenizer_files(self.directory):
            _log.info("%s has no tokenizer files (%s): PretrainedModel.vocabulary is None",
                      self.directory, ", ".join(hf_tokenizer.TOKENIZER_FILES))
            return None
        return hf_tokenizer.load(self.directory)

    def logits(self, input_ids, attention_mask=None, token_type_ids=None,
               **inputs) -> np.ndarray:
        """The HF class's logits for right- or left-padded [batch, length] ids (1 = token);
        multiple choice: [batch, choices, length]; `inputs`: what else the class reads
        (T5ForConditionalGeneration: `decoder_input_ids` [batch, target], optionally
        `decoder_attention_mask`)."""
        form = _form(self.model_type)
        unknown = sorted(set(inputs) - set(form.logits_inputs))
        if unknown:
            raise PretrainedError(f"{self.architecture}.logits takes no {', '.join(unknown)}"
                                  + (f" (it takes {', '.join(form.logits_inputs)})"
                                     if form.logits_inputs else ""))
        return self._run(form.logits, input_ids, attention_mask, token_type_ids, **inputs)

    def hidden_states(self, input_ids, attention_mask=None, token_type_ids=None) -> np.ndarray:
        """HF's `last_hidden_state` of the family's base class [batch, length, d_model]
        (T5: the encoder's, as `T5EncoderModel`'s) for [batch, length] ids (1 = token)."""
        return self._run(_form(self.model_type).hidden_states, input_ids, attention_mask,
                         token_type_ids)

    def _run(self, make_fn, input_ids, attention_mask, token_type_ids, **inputs
             ) -> np.ndarray:
        ids = jnp.asarray(input_ids, jnp.int32)
        mask = jnp.ones_like(ids) if attention_mask is None else jnp.asarray(attention_mask,
                                                                              jnp.int32)
        types = None if token_type_ids is None else jnp.asarray(token_type_ids, jnp.int32)
        more = {k: jnp.asarray(v, jnp.int32) for k, v in inputs.items() if v is not None}
        return np.asarray(make_fn(self)(self.params, ids, mask, types, **more))


# ----------------------------------------------------------------------- load / save
def has_tokenizer_files(directory) -> bool:
    """Whether the HF directory holds a tokenizer file `t2t.data.hf_tokenizer.load` reads
    (one of its `TOKENIZER_FILES`)."""
    return any(all(os.path.isfile(os.path.join(directory, name)) for name in files.split(" + "))
               for files in hf_tokenizer.TOKENIZER_FILES)


def _read_hf_config(directory: str) -> Dict[str, Any]:
    path = os.path.join(os.fspath(directory), CONFIG_FILE)
    if not os.path.isdir(directory):
        raise PretrainedError(f"{directory!r} is not a directory (expected a Hugging Face "
                              "model directory with config.json and model.safetensors)")
    if not os.path.exists(path):
        raise PretrainedError(f"{directory!r} has no config.json (a Hugging Face model "
                              "directory needs config.json and model.safetensors)")
    try:
        d = read_json(path)      # not UTF-8 or not JSON: the file and the place, one line
    except InputFileError as e:
        raise PretrainedError(e.summary) from None
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


def read_config(directory) -> Tuple[str, TransformerConfig]:
    """(model_type, t2t config) of an HF directory, without reading its weights."""
    d = _read_hf_config(os.fspath(directory))
    return d["model_type"], _config(FORMS[d["model_type"]], d)


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
    try:
        try:
            params = form.params_from_hf(state, config, architecture)
        except MissingHeadError:    # a head class's form: its head initialised
            params = form.params_from_hf(state, config, architecture, config_labels(d))
    except CheckpointMismatchError as e:
        raise PretrainedError(f"{directory} is not a {architecture} t2t can read: {e}") from None
    pad = d.get("pad_token_id")
    options = form.options_from_hf(d) if form.options_from_hf else None
    return PretrainedModel(form.model_type, architecture, config, params,
                           0 if pad is None else int(pad), options,
                           {k: d[k] for k in HEAD_CONFIG_KEYS if k in d}, directory)


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
