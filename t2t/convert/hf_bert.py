"""Hugging Face BERT (`BertModel`, `BertForPreTraining`, `BertForMaskedLM`) <-> t2t
`t2t.models.bert.BertModel` params (the pooler and heads only when present), its task-head
classes <-> t2t's fine-tuning heads (`t2t.convert.hf_heads`), and the MLM logits BERT's
successors share. Post-LN layers whose table `bert_layer_rules` writes for
RoBERTa, ALBERT, ELECTRA and DistilBERT too (`t2t.convert.hf_encoders`)."""
from __future__ import annotations

import functools
from typing import Callable, Dict, List, Mapping, Optional, Tuple

import jax
import numpy as np

from t2t.convert.hf_common import (T2T_TO_HF_ACTIVATION, HfFamily, PretrainedError,
                                   activation, common_checks, require)
from t2t.convert.hf_files import load_directory, write_directory
from t2t.convert.hf_heads import TaskHeads, with_heads
from t2t.convert.rules import (CheckpointMismatchError, Params, Rule, StateDict, copy,
                               export_params, import_params, layer_norm, linear, reshape, tree)
from t2t.nn.config import TransformerConfig


def bert_config(d: Mapping) -> TransformerConfig:
    """HF `BertConfig` dict -> TransformerConfig (post-LN, learned positions, biases)."""
    if d.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"BERT position_embedding_type={d['position_embedding_type']!r} is "
                         "not supported (only 'absolute')")
    hidden, heads = d["hidden_size"], d["num_attention_heads"]
    return TransformerConfig(
        vocab_size=d["vocab_size"], d_model=hidden, num_heads=heads, head_dim=hidden // heads,
        d_ff=d["intermediate_size"], num_encoder_layers=d["num_hidden_layers"],
        num_decoder_layers=0,
        mlp_activations=(activation(d.get("hidden_act", "gelu"), "BERT"),),
        norm_type="layer", norm_eps=d.get("layer_norm_eps", 1e-12), pre_norm=False,
        use_bias=True, position_embedding="learned",
        max_length=d.get("max_position_embeddings", 512),
        type_vocab_size=d.get("type_vocab_size", 2), embedding_norm=True,
        tie_embeddings=True, attention_scale="sqrt",
        dropout_rate=d.get("hidden_dropout_prob", 0.1),
        attention_dropout_rate=d.get("attention_probs_dropout_prob", 0.1),
        kernel_init="normal", initializer_range=d.get("initializer_range", 0.02))


def bert_hf_config(config: TransformerConfig, architecture: str = "BertModel") -> dict:
    """TransformerConfig -> HF `BertConfig` dict (checks the config is a BERT)."""
    c = config
    require(c.norm_type == "layer" and not c.pre_norm and c.use_bias, "BERT",
            "needs norm_type='layer', pre_norm=False, use_bias=True")
    require(c.position_embedding == "learned" and c.embedding_norm and c.type_vocab_size > 0,
            "BERT", "needs learned positions, embedding_norm and type_vocab_size > 0")
    require(len(c.mlp_activations) == 1 and c.mlp_activations[0] in T2T_TO_HF_ACTIVATION,
            "BERT", f"mlp_activations={c.mlp_activations} is not one HF activation")
    common_checks(c, "BERT")
    return {"architectures": [architecture], "model_type": "bert",
            "vocab_size": c.vocab_size, "hidden_size": c.d_model,
            "num_hidden_layers": c.num_encoder_layers, "num_attention_heads": c.num_heads,
            "intermediate_size": c.d_ff,
            "hidden_act": T2T_TO_HF_ACTIVATION[c.mlp_activations[0]],
            "hidden_dropout_prob": c.dropout_rate,
            "attention_probs_dropout_prob": c.attn_dropout_rate,
            "max_position_embeddings": c.max_length, "type_vocab_size": c.type_vocab_size,
            "initializer_range": c.initializer_range, "layer_norm_eps": c.norm_eps,
            "position_embedding_type": "absolute", "pad_token_id": 0}


# ----------------------------------------------------------------------- rule tables
def bert_layer_rules(hf: str, t: str, c: TransformerConfig,
                     names: Optional[Mapping[str, str]] = None) -> List[Rule]:
    """One post-LN layer: HF `hf` (BERT's submodule names, or `names` overriding them:
    ALBERT's, DistilBERT's) <-> t2t `t`."""
    d, h, k, f = c.d_model, c.num_heads, c.head_dim, c.d_ff
    n = {"query": "attention.self.query", "key": "attention.self.key",
         "value": "attention.self.value", "out": "attention.output.dense",
         "attention_norm": "attention.output.LayerNorm", "wi": "intermediate.dense",
         "wo": "output.dense", "mlp_norm": "output.LayerNorm", **(names or {})}
    rules = []
    for name in ("query", "key", "value"):
        rules += [linear(f"{hf}.{n[name]}.weight", f"{t}/self_attention/{name}/kernel",
                         (d, h, k)),
                  reshape(f"{hf}.{n[name]}.bias", f"{t}/self_attention/{name}/bias",
                          (h * k,), (h, k))]
    return rules + [
        linear(f"{hf}.{n['out']}.weight", f"{t}/self_attention/out/kernel", (h, k, d), n_in=2),
        copy(f"{hf}.{n['out']}.bias", f"{t}/self_attention/out/bias", (d,)),
        *layer_norm(f"{hf}.{n['attention_norm']}", f"{t}/self_attention_norm", d),
        linear(f"{hf}.{n['wi']}.weight", f"{t}/mlp/wi/kernel", (d, f)),
        copy(f"{hf}.{n['wi']}.bias", f"{t}/mlp/wi/bias", (f,)),
        linear(f"{hf}.{n['wo']}.weight", f"{t}/mlp/wo/kernel", (f, d)),
        copy(f"{hf}.{n['wo']}.bias", f"{t}/mlp/wo/bias", (d,)),
        *layer_norm(f"{hf}.{n['mlp_norm']}", f"{t}/mlp_norm", d),
    ]


def bert_rules(c: TransformerConfig, root: str, pooler: bool, mlm: bool,
               nsp: bool) -> List[Rule]:
    """BERT's table: embeddings and layers under `root` ("bert." with heads), the pooler,
    the MLM head (`cls.predictions`) and the NSP head (`cls.seq_relationship`) as asked."""
    d = c.d_model
    e = f"{root}embeddings"
    rules = [
        copy(f"{e}.word_embeddings.weight", "token_embedder/embedding", (c.vocab_size, d)),
        copy(f"{e}.position_embeddings.weight", "encoder/embedder/position_embedder/embedding",
             (c.max_length, d)),
        copy(f"{e}.token_type_embeddings.weight", "encoder/embedder/type_embedder/embedding",
             (c.type_vocab_size, d)),
        *layer_norm(f"{e}.LayerNorm", "encoder/embedder/embedding_norm", d),
    ]
    for i in range(c.num_encoder_layers):
        rules += bert_layer_rules(f"{root}encoder.layer.{i}", f"encoder/layers/layer_{i}", c)
    if pooler:
        rules += [linear(f"{root}pooler.dense.weight", "pooler/dense/kernel", (d, d)),
                  copy(f"{root}pooler.dense.bias", "pooler/dense/bias", (d,))]
    if mlm:
        p = "cls.predictions"
        rules += [linear(f"{p}.transform.dense.weight", "mlm_head/transform/kernel", (d, d)),
                  copy(f"{p}.transform.dense.bias", "mlm_head/transform/bias", (d,)),
                  *layer_norm(f"{p}.transform.LayerNorm", "mlm_head/transform_norm", d),
                  copy(f"{p}.bias", "mlm_head/bias", (c.vocab_size,),
                       aliases=(f"{p}.decoder.bias",))]
    if nsp:
        rules += [linear("cls.seq_relationship.weight", "nsp_head/dense/kernel", (d, 2)),
                  copy("cls.seq_relationship.bias", "nsp_head/dense/bias", (2,))]
    return rules


# ----------------------------------------------------------------------- state dicts
def require_tied_decoder(state: StateDict, root: str) -> None:
    """CheckpointMismatchError unless a BERT-shaped state dict's MLM decoder (if any) is its
    word embeddings: t2t's MLM head is always tied."""
    decoder = state.get("cls.predictions.decoder.weight")
    words = state.get(f"{root}embeddings.word_embeddings.weight")
    if decoder is not None and words is not None and not np.array_equal(decoder, words):
        raise CheckpointMismatchError("cls.predictions.decoder.weight differs from the word "
                                      "embeddings; t2t's MLM head is always tied")


def bert_params_from_hf(state_dict: StateDict, config: TransformerConfig,
                        scan: Optional[bool] = None) -> Params:
    """HF BERT state dict (numpy) -> BertModel params.

    Works with and without the `bert.` prefix; the pooler, MLM head (`cls.predictions.*`)
    and NSP head (`cls.seq_relationship.*`) are converted when present.
    `scan` (default: `config.scan_layers`) stacks the layers for `nn.scan`.
    """
    root = "bert." if any(k.startswith("bert.embeddings.") for k in state_dict) else ""
    mlm = "cls.predictions.transform.dense.weight" in state_dict
    require_tied_decoder(state_dict, root)
    rules = bert_rules(config, root, pooler=f"{root}pooler.dense.weight" in state_dict,
                       mlm=mlm, nsp="cls.seq_relationship.weight" in state_dict)
    return import_params(state_dict, rules, config, scan)


def bert_params_to_hf(config: TransformerConfig, params: Params) -> Dict[str, np.ndarray]:
    """BertModel params -> HF state dict (`bert.`-prefixed when there is a head)."""
    p = tree(params)
    mlm, nsp = "mlm_head" in p, "nsp_head" in p
    root = "bert." if (mlm or nsp) else ""
    # Like HF's own files: the tied `cls.predictions.decoder.weight` is left out.
    return export_params(p, bert_rules(config, root, "pooler" in p, mlm, nsp))


def bert_architecture(params: Params) -> str:
    """The HF class of a BertModel tree: BertForPreTraining (MLM and NSP heads),
    BertForMaskedLM (MLM) or BertModel."""
    p = tree(params)
    return ("BertForPreTraining" if "mlm_head" in p and "nsp_head" in p
            else "BertForMaskedLM" if "mlm_head" in p else "BertModel")


# ----------------------------------------------------------------------- directories
def load_bert(path, **overrides) -> Tuple[TransformerConfig, Params]:
    """HF BERT directory (config.json + model.safetensors) -> (config, BertModel params).

    `overrides` replace config fields, e.g. `scan_layers=True`, `dropout_rate=0.0`.
    """
    return load_directory(path, bert_config, bert_params_from_hf, overrides)


def save_bert(config: TransformerConfig, params: Params, path) -> None:
    """Write config.json + model.safetensors that `transformers` loads (BertModel, or
    BertForPreTraining / BertForMaskedLM when the params have heads)."""
    p = tree(params)
    write_directory(path, bert_hf_config(config, bert_architecture(p)),
                    bert_params_to_hf(config, p))


# ----------------------------------------------------------------------- logits
def mlm_logits(model, mlm_activation: Optional[str] = None,
               positions: Optional[Callable] = None) -> Callable:
    """`HfFamily.logits` of BERT and its successors: the MLM head's logits [batch, length,
    vocab], with the head's own activation (`mlm_activation`; default the layers') and
    position ids `positions(ids, pad_token_id)` where HF computes them from the ids
    (RoBERTa)."""
    if "mlm_head" not in model.params:
        raise PretrainedError(f"this {model.architecture} checkpoint has no MLM head, so "
                              "it has no logits; use t2t.models.bert.hidden_states")
    return _mlm_fn(model.config, mlm_activation or model.config.mlp_activations[0], positions,
                   model.pad_token_id)


@functools.lru_cache(maxsize=None)
def _mlm_fn(config: TransformerConfig, mlm_activation: str, positions: Optional[Callable],
            pad_token_id: int):
    from t2t.models.bert import BertModel

    def fn(params, ids, mask, types):
        position_ids = None    # HF's from the ids, less the offset the Encoder adds
        if positions is not None:
            position_ids = positions(ids, pad_token_id) - config.position_offset
        return BertModel(config, mlm_activation).apply(
            {"params": params}, ids, mask, types, position_ids, method=BertModel.mlm_logits)
    return jax.jit(fn)


def encoder_hidden_states(model, positions: Optional[Callable] = None) -> Callable:
    """`HfFamily.hidden_states` of BERT and its successors: the encoder's last hidden state
    [batch, length, d_model] of any tree with `token_embedder` and `encoder` (heads or
    none), with HF's position ids `positions(ids, pad_token_id)` where it computes them."""
    return _hidden_fn(model.config, positions, model.pad_token_id)


@functools.lru_cache(maxsize=None)
def _hidden_fn(config: TransformerConfig, positions: Optional[Callable], pad_token_id: int):
    from t2t.models.bert import BertModel

    def fn(params, ids, mask, types):
        position_ids = None
        if positions is not None:
            position_ids = positions(ids, pad_token_id) - config.position_offset
        return BertModel(config).apply({"params": params}, ids, mask, types, position_ids,
                                       method=BertModel.encode)
    return jax.jit(fn)


def _params_from_hf(state: StateDict, config: TransformerConfig, architecture: str) -> Params:
    return bert_params_from_hf(state, config)


def _to_hf(model) -> Tuple[dict, Dict[str, np.ndarray]]:
    return (bert_hf_config(model.config, bert_architecture(model.params)),
            bert_params_to_hf(model.config, model.params))


_POOLED = ("bert.pooler.dense", "classifier")
BERT_HEADS = TaskHeads("Bert", lambda c: bert_rules(c, "bert.", False, False, False),
                       {"SequenceClassification": _POOLED, "MultipleChoice": _POOLED})
BERT = with_heads(
    HfFamily("bert", ("BertForPreTraining", "BertForMaskedLM", "BertModel"), bert_config,
             _params_from_hf, _to_hf, mlm_logits, hidden_states=encoder_hidden_states,
             read_as={"BertForNextSentencePrediction": "BertModel"}),
    BERT_HEADS, lambda model: bert_hf_config(model.config, model.architecture))
