"""One loader for every Hugging Face directory t2t converts: `load_pretrained` reads
config.json's `model_type`, `save_pretrained` writes a directory `transformers` loads.

`PretrainedModel.logits(input_ids, attention_mask)` equals the HF class's output: MLM logits
[batch, length, vocab] for BERT, RoBERTa, ALBERT, DistilBERT and an ELECTRA generator,
replaced-token logits [batch, length] for an ELECTRA discriminator, LM logits for GPT-2,
OpenAI GPT (GPT-1) and XLNet (its content stream over the whole input; perm_mask,
target_mapping and mems through `t2t.models.xlnet.XLNet`); class logits [batch, labels] for
`XLNetForSequenceClassification` and [batch, choices] for `XLNetForMultipleChoice` (inputs
[batch, choices, length]), in XLNet's layout (left padding, the [CLS] last).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any, Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np

from t2t.convert import hf, hf_encoders, hf_gpt1, hf_xlnet
from t2t.errors import UserError
from t2t.nn.config import TransformerConfig

# model_type -> the architecture written by default (and read when config.json names none).
ARCHITECTURES = {"bert": "BertForPreTraining", "roberta": "RobertaForMaskedLM",
                 "albert": "AlbertForPreTraining", "electra": "ElectraForPreTraining",
                 "distilbert": "DistilBertForMaskedLM", "gpt2": "GPT2LMHeadModel",
                 "t5": "T5ForConditionalGeneration", "xlnet": hf_xlnet.ARCHITECTURE,
                 hf_gpt1.MODEL_TYPE: hf_gpt1.ARCHITECTURE}
SUPPORTED = tuple(ARCHITECTURES)


class PretrainedError(UserError, ValueError):
    """A directory t2t cannot load or a model it cannot save (one readable line)."""


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
        ids = jnp.asarray(input_ids, jnp.int32)
        mask = jnp.ones_like(ids) if attention_mask is None else jnp.asarray(attention_mask,
                                                                              jnp.int32)
        types = None if token_type_ids is None else jnp.asarray(token_type_ids, jnp.int32)
        kind = self._module_kind()
        outputs = hf_xlnet.num_outputs(self.params) if kind == "xlnet_head" else 0
        fn = _logits_fn(self.model_type, kind, self.config, self.pad_token_id, self.options,
                        outputs)
        return np.asarray(fn(self.params, ids, mask, types))

    def _module_kind(self) -> str:
        if self.model_type == "xlnet" and self.architecture in hf_xlnet.HEADS:
            return "xlnet_head"
        if self.model_type == "t5":
            raise PretrainedError("a T5 directory has no logits(input_ids, attention_mask): "
                                  "use t2t.nn.stacks.EncoderDecoder with decoder inputs")
        if self.model_type == "electra" and "rtd_head" in self.params:
            return "discriminator"
        if self.model_type in ("gpt2", "xlnet", hf_gpt1.MODEL_TYPE):
            return "lm"
        if "mlm_head" not in self.params:
            raise PretrainedError(f"this {self.architecture} checkpoint has no MLM head, so "
                                  "it has no logits; use t2t.models.bert.hidden_states")
        return "mlm"


def roberta_positions(input_ids: jax.Array, pad_token_id: int) -> jax.Array:
    """RoBERTa's (fairseq's) position ids: pad_token_id + 1 + index among non-pad tokens;
    pad tokens get pad_token_id.  [batch, length] -> [batch, length]."""
    real = (input_ids != pad_token_id).astype(jnp.int32)
    return jnp.cumsum(real, axis=1) * real + pad_token_id


@functools.lru_cache(maxsize=None)
def _logits_fn(model_type: str, kind: str, config: TransformerConfig, pad_token_id: int,
               options=None, outputs: int = 0):
    from t2t.models.bert import BertModel
    from t2t.models.electra import ElectraDiscriminator
    from t2t.models.xlnet import XLNet
    from t2t.models.xlnet_heads import XLNetClassifierHead
    from t2t.nn.stacks import Decoder

    if kind == "xlnet_head":
        def fn(params, ids, mask, types):
            return XLNetClassifierHead(config, outputs, options).apply({"params": params}, ids,
                                                                       mask, types)
        return jax.jit(fn)
    if model_type == "xlnet":
        def fn(params, ids, mask, types):
            return XLNet(config, options).apply({"params": params}, ids, mask, types)[0]
        return jax.jit(fn)
    if kind == "lm":
        def fn(params, ids, mask, types):
            return Decoder(config).apply({"params": params}, ids, decoder_segment_ids=mask)
        return jax.jit(fn)
    if kind == "discriminator":
        def fn(params, ids, mask, types):
            return ElectraDiscriminator(config).apply({"params": params}, ids, mask, types)
        return jax.jit(fn)
    activation = {"roberta": hf_encoders.ROBERTA_MLM_ACTIVATION,
                  "electra": hf_encoders.ELECTRA_GENERATOR_ACTIVATION}.get(
                      model_type, config.mlp_activations[0])

    def fn(params, ids, mask, types):
        positions = None     # HF's from the ids, less the offset the Encoder adds
        if model_type == "roberta":
            positions = roberta_positions(ids, pad_token_id) - config.position_offset
        return BertModel(config, activation).apply({"params": params}, ids, mask, types,
                                                   positions, method=BertModel.mlm_logits)
    return jax.jit(fn)


# ----------------------------------------------------------------------- load / save
def _read_hf_config(directory: str) -> Dict[str, Any]:
    path = os.path.join(os.fspath(directory), hf.CONFIG_FILE)
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


def _config(model_type: str, d: Dict[str, Any]) -> TransformerConfig:
    fns = {"bert": hf.bert_config, "gpt2": hf.gpt2_config, "t5": hf.t5_config,
           "xlnet": hf_xlnet.xlnet_config, hf_gpt1.MODEL_TYPE: hf_gpt1.openai_gpt_config}
    fn = fns.get(model_type) or functools.partial(hf_encoders.config_from_hf, model_type)
    try:
        return fn(d)
    except KeyError as e:
        raise PretrainedError(f"config.json of this {model_type} model has no {e.args[0]!r}, "
                              "which t2t needs") from None
    except ValueError as e:
        raise PretrainedError(f"{model_type} config.json: {e}") from None


def load_pretrained(directory, **overrides) -> PretrainedModel:
    """HF directory (config.json + model.safetensors) -> PretrainedModel.

    `overrides` replace TransformerConfig fields (e.g. `dropout_rate=0.0`).
    """
    directory = os.fspath(directory)
    d = _read_hf_config(directory)
    model_type = d["model_type"]
    architecture = (d.get("architectures") or [ARCHITECTURES[model_type]])[0]
    config = _config(model_type, d)
    if overrides:
        config = config.replace(**overrides)
    try:
        state = hf.read_safetensors(directory)
    except FileNotFoundError as e:
        raise PretrainedError(str(e)) from None
    if model_type == "bert":
        params = hf.bert_params_from_hf(state, config)
    elif model_type == "gpt2":
        params = hf.gpt2_params_from_hf(state, config)
    elif model_type == "t5":
        params = hf.t5_params_from_hf(state, config)
    elif model_type == "xlnet":
        if architecture in hf_xlnet.HEADS:
            try:
                hf_xlnet.check_summary(d)
            except ValueError as e:
                raise PretrainedError(f"xlnet config.json: {e}") from None
        params = hf_xlnet.params_from_hf(state, config, architecture)
    elif model_type == hf_gpt1.MODEL_TYPE:
        params = hf_gpt1.params_from_hf(state, config)
    else:
        params = hf_encoders.params_from_hf(model_type, state, config, architecture)
    pad = d.get("pad_token_id")
    options = hf_xlnet.xlnet_options(d) if model_type == "xlnet" else None
    return PretrainedModel(model_type, architecture, config, params,
                           0 if pad is None else int(pad), options)


def save_pretrained(model: PretrainedModel, directory) -> None:
    """Write `model` as config.json + model.safetensors that `transformers` loads."""
    c, p, t = model.config, hf._tree(model.params), model.model_type
    if t == "bert":
        hf.save_bert(c, p, directory)
        return
    if t == "gpt2":
        hf.save_gpt2(c, p, directory)
        return
    if t == "t5":
        hf.save_t5(c, p, directory)
        return
    if t == hf_gpt1.MODEL_TYPE:
        hf._save(directory, hf_gpt1.openai_gpt_hf_config(c), hf_gpt1.params_to_hf(c, p))
        return
    if t == "xlnet":
        outputs = hf_xlnet.num_outputs(p)
        architecture = hf_xlnet.ARCHITECTURE if outputs is None else (
            "XLNetForMultipleChoice" if model.architecture == "XLNetForMultipleChoice"
            else "XLNetForSequenceClassification")
        hf._save(directory, hf_xlnet.xlnet_hf_config(c, model.options, model.pad_token_id,
                                                     architecture, outputs or 2),
                 hf_xlnet.params_to_hf(c, p))
        return
    if t not in SUPPORTED:
        raise PretrainedError(f"model_type {t!r} is not supported; t2t writes {list(SUPPORTED)}")
    architecture = model.architecture
    if t == "electra":
        architecture = "ElectraForPreTraining" if "rtd_head" in p else "ElectraForMaskedLM"
    hf_config = hf_encoders.hf_config(t, c, architecture, model.pad_token_id)
    hf._save(directory, hf_config, hf_encoders.params_to_hf(t, c, p))


def pretrained(model_type: str, config: TransformerConfig, params,
               architecture: Optional[str] = None, pad_token_id: Optional[int] = None,
               options=None) -> PretrainedModel:
    """Wrap t2t params (e.g. a trained checkpoint's) for `save_pretrained` (`options`: an
    XLNet's `XLNetOptions`)."""
    if model_type not in SUPPORTED:
        raise PretrainedError(f"model_type {model_type!r} is not supported; choose one of "
                              f"{list(SUPPORTED)}")
    default_pad = {"roberta": 1, "xlnet": 5}.get(model_type, 0)
    pad = default_pad if pad_token_id is None else pad_token_id
    return PretrainedModel(model_type, architecture or ARCHITECTURES[model_type], config,
                           hf._tree(params), pad, options)


# What each HF class holds of a t2t BertModel tree (the rest, e.g. an unused NSP head, is
# dropped on export).
_KEEP = {"roberta": ("token_embedder", "encoder", "mlm_head"),
         "distilbert": ("token_embedder", "encoder", "mlm_head")}


def from_t2t(model_type: str, config: TransformerConfig, params,
             generator: Optional[TransformerConfig] = None) -> Dict[str, PretrainedModel]:
    """t2t training params -> {name: PretrainedModel} for `save_pretrained`.

    BertModel trees give one model ("model"); an ELECTRA pretraining tree (see
    `t2t.models.electra.ElectraPretraining`, with its `generator` config) gives
    "generator" (ElectraForMaskedLM) and "discriminator" (ElectraForPreTraining), each
    with the shared embeddings.
    """
    p = hf._tree(params)
    if model_type == "electra" and "generator" in p:
        if generator is None:
            raise PretrainedError("an ELECTRA pretraining tree needs the generator's config")
        e = config.embedding_dim or config.d_model
        shared = {"token_embedder": p["token_embedder"]}

        def encoder(stack):
            return {"embedder": p["embedder"], **p[stack]}
        disc = {**shared, "encoder": encoder("discriminator"), "rtd_head": p["rtd_head"]}
        gen = {**shared, "encoder": encoder("generator"), "mlm_head": p["generator_head"]}
        d_cfg = config.replace(embedding_dim=e, project_summed_embeddings=True)
        return {"generator": pretrained("electra", generator, gen, "ElectraForMaskedLM"),
                "discriminator": pretrained("electra", d_cfg, disc, "ElectraForPreTraining")}
    if model_type in _KEEP:
        p = {k: v for k, v in p.items() if k in _KEEP[model_type]}
    return {"model": pretrained(model_type, config, p)}
