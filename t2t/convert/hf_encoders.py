"""Hugging Face RoBERTa, ALBERT, ELECTRA and DistilBERT <-> t2t (BERT's successors).

All four are BERT-shaped post-LN encoders; each is a config map and a rule table on the
engine of `t2t.convert.rules`, with BERT's layer table (`t2t.convert.hf_bert`). The t2t
trees:

  RoBERTa, ALBERT, DistilBERT, ELECTRA generator -> `BertModel` params (`mlm_head`;
      ALBERT also `pooler` and its SOP head as `nsp_head`)
  ELECTRA discriminator -> `t2t.models.electra.ElectraDiscriminator` params (`rtd_head`)

Each family reads and writes its base model too (`RobertaModel`, `AlbertModel`,
`ElectraModel`, `DistilBertModel`: no prefix, no head) and ALBERT its `AlbertForMaskedLM`;
`*_TABLES` give each HF class's table. Their task-head classes (`*_HEADS`) map onto t2t's
fine-tuning heads (`t2t.convert.hf_heads`).

ALBERT and ELECTRA sum their embeddings in width E and project to d_model
(`project_summed_embeddings`); ALBERT's one shared layer is `encoder/layers/layer`.
"""
from __future__ import annotations

import functools
from typing import Callable, Dict, List, Mapping, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from t2t.convert.hf_bert import (bert_config, bert_layer_rules, encoder_hidden_states,
                                  mlm_logits)
from t2t.convert.hf_common import (T2T_TO_HF_ACTIVATION, HfFamily, PretrainedError,
                                   activation, require)
from t2t.convert.hf_heads import TaskHeads, with_heads
from t2t.convert.rules import (CheckpointMismatchError, Params, Rule, StateDict, copy,
                               export_params, flat_params, import_params, initialise,
                               layer_norm, linear, merge)
from t2t.nn.config import TransformerConfig


# Which MLM-head activation each HF class uses (BertModel.mlm_activation).
ROBERTA_MLM_ACTIVATION = "gelu"          # RobertaLMHead: exact gelu whatever hidden_act
ELECTRA_GENERATOR_ACTIVATION = "gelu"    # ElectraGeneratorPredictions: exact gelu


# ----------------------------------------------------------------------- configs
def roberta_config(d: Mapping) -> TransformerConfig:
    """HF `RobertaConfig` -> TransformerConfig (BERT's, with 1 token type and positions
    from pad_token_id + 1: max_position_embeddings = max length + pad_token_id + 1 rows)."""
    return bert_config(d).replace(position_offset=d.get("pad_token_id", 1) + 1)


def albert_config(d: Mapping) -> TransformerConfig:
    """HF `AlbertConfig` -> TransformerConfig (factorized embeddings, one shared layer)."""
    groups, inner = d.get("num_hidden_groups", 1), d.get("inner_group_num", 1)
    if groups != 1 or inner != 1:
        raise ValueError(f"ALBERT num_hidden_groups={groups}, inner_group_num={inner}: t2t "
                         "shares one layer across all layers (both must be 1, as released)")
    c = bert_config(dict(d, hidden_act=d.get("hidden_act", "gelu_new")))
    return c.replace(embedding_dim=d.get("embedding_size", 128), project_summed_embeddings=True,
                     share_layers=True, dropout_rate=d.get("hidden_dropout_prob", 0.0),
                     attention_dropout_rate=d.get("attention_probs_dropout_prob", 0.0))


def electra_config(d: Mapping) -> TransformerConfig:
    """HF `ElectraConfig` -> TransformerConfig (embeddings of width embedding_size)."""
    c = bert_config(d)
    e = d.get("embedding_size", c.d_model)
    return c.replace(embedding_dim=e, project_summed_embeddings=True)


def distilbert_config(d: Mapping) -> TransformerConfig:
    """HF `DistilBertConfig` -> TransformerConfig (BERT without token types, eps 1e-12)."""
    dim, heads = d["dim"], d["n_heads"]
    return TransformerConfig(
        vocab_size=d["vocab_size"], d_model=dim, num_heads=heads, head_dim=dim // heads,
        d_ff=d["hidden_dim"], num_encoder_layers=d["n_layers"], num_decoder_layers=0,
        mlp_activations=(activation(d.get("activation", "gelu"), "DistilBERT"),),
        norm_type="layer", norm_eps=1e-12, pre_norm=False, use_bias=True,
        position_embedding="learned", max_length=d.get("max_position_embeddings", 512),
        type_vocab_size=0, embedding_norm=True, tie_embeddings=True, attention_scale="sqrt",
        dropout_rate=d.get("dropout", 0.1), attention_dropout_rate=d.get("attention_dropout", 0.1),
        kernel_init="normal", initializer_range=d.get("initializer_range", 0.02))


def _encoder_checks(c: TransformerConfig, family: str, factorized: bool,
                    position_offset: int = 0) -> None:
    require(c.norm_type == "layer" and not c.pre_norm and c.use_bias and c.embedding_norm,
            family, "needs post-LN LayerNorm, biases and embedding_norm")
    require(c.position_embedding == "learned" and c.attention_scale == "sqrt", family,
            "needs learned positions and attention_scale='sqrt'")
    require(c.num_heads * c.head_dim == c.d_model, family, "needs num_heads*head_dim == d_model")
    require(len(c.mlp_activations) == 1 and c.mlp_activations[0] in T2T_TO_HF_ACTIVATION, family,
            f"mlp_activations={c.mlp_activations} is not one HF activation")
    require(not c.scale_embeddings and c.num_decoder_layers == 0, family,
            "needs an encoder only, unscaled embeddings")
    if not position_offset:
        require(c.position_offset == 0, family, "has no position_offset (RoBERTa's)")
    if factorized:
        require(c.embedding_dim is None or c.project_summed_embeddings, family,
                "needs project_summed_embeddings=True with embedding_dim")
    else:
        require(c.embedding_dim in (None, c.d_model) and not c.share_layers, family,
                "has no factorized embeddings or shared layers")


def _common_hf(c: TransformerConfig) -> dict:
    return {"vocab_size": c.vocab_size, "hidden_size": c.d_model,
            "num_hidden_layers": c.num_encoder_layers, "num_attention_heads": c.num_heads,
            "intermediate_size": c.d_ff, "hidden_act": T2T_TO_HF_ACTIVATION[c.mlp_activations[0]],
            "hidden_dropout_prob": c.dropout_rate,
            "attention_probs_dropout_prob": c.attn_dropout_rate,
            "max_position_embeddings": c.max_length, "type_vocab_size": c.type_vocab_size,
            "initializer_range": c.initializer_range, "layer_norm_eps": c.norm_eps}


def roberta_hf_config(c: TransformerConfig, pad_token_id: int = 1,
                      architecture: str = "RobertaForMaskedLM") -> dict:
    _encoder_checks(c, "RoBERTa", factorized=False, position_offset=pad_token_id + 1)
    require(c.position_offset == pad_token_id + 1, "RoBERTa",
            f"needs position_offset = pad_token_id + 1 = {pad_token_id + 1}")
    return {**_common_hf(c), "architectures": [architecture], "model_type": "roberta",
            "position_embedding_type": "absolute", "pad_token_id": pad_token_id,
            "bos_token_id": 0, "eos_token_id": 2}


def albert_hf_config(c: TransformerConfig, architecture: str = "AlbertForPreTraining") -> dict:
    _encoder_checks(c, "ALBERT", factorized=True)
    require(c.share_layers, "ALBERT", "needs share_layers=True")
    return {**_common_hf(c), "architectures": [architecture], "model_type": "albert",
            "embedding_size": c.embedding_dim or c.d_model, "num_hidden_groups": 1,
            "inner_group_num": 1, "classifier_dropout_prob": c.dropout_rate,
            "position_embedding_type": "absolute", "pad_token_id": 0, "bos_token_id": 2,
            "eos_token_id": 3}


def electra_hf_config(c: TransformerConfig, architecture: str) -> dict:
    _encoder_checks(c, "ELECTRA", factorized=True)
    require(not c.share_layers, "ELECTRA", "has no shared layers")
    return {**_common_hf(c), "architectures": [architecture], "model_type": "electra",
            "embedding_size": c.embedding_dim or c.d_model,
            "position_embedding_type": "absolute", "pad_token_id": 0}


def distilbert_hf_config(c: TransformerConfig,
                         architecture: str = "DistilBertForMaskedLM") -> dict:
    _encoder_checks(c, "DistilBERT", factorized=False)
    require(c.type_vocab_size == 0 and c.norm_eps == 1e-12, "DistilBERT",
            "needs type_vocab_size=0 and norm_eps=1e-12")
    return {"architectures": [architecture], "model_type": "distilbert",
            "vocab_size": c.vocab_size, "dim": c.d_model, "n_layers": c.num_encoder_layers,
            "n_heads": c.num_heads, "hidden_dim": c.d_ff,
            "activation": T2T_TO_HF_ACTIVATION[c.mlp_activations[0]], "dropout": c.dropout_rate,
            "attention_dropout": c.attn_dropout_rate, "max_position_embeddings": c.max_length,
            "initializer_range": c.initializer_range, "sinusoidal_pos_embds": False,
            "tie_weights_": True, "pad_token_id": 0}


# ----------------------------------------------------------------------- rule tables
def _embedding_rules(e: str, c: TransformerConfig) -> List[Rule]:
    """word / position / type tables and their LayerNorm, all of width E (or d_model)."""
    w = c.embedding_dim if c.project_summed_embeddings and c.embedding_dim else c.d_model
    rules = [
        copy(f"{e}.word_embeddings.weight", "token_embedder/embedding", (c.vocab_size, w)),
        copy(f"{e}.position_embeddings.weight", "encoder/embedder/position_embedder/embedding",
             (c.max_length, w)),
        *layer_norm(f"{e}.LayerNorm", "encoder/embedder/embedding_norm", w)]
    if c.type_vocab_size:
        rules.append(copy(f"{e}.token_type_embeddings.weight",
                          "encoder/embedder/type_embedder/embedding", (c.type_vocab_size, w)))
    return rules


def _mlm_head_rules(dense: str, norm: str, bias: str, c: TransformerConfig) -> List[Rule]:
    w = c.embedding_dim or c.d_model
    return [linear(f"{dense}.weight", "mlm_head/transform/kernel", (c.d_model, w)),
            copy(f"{dense}.bias", "mlm_head/transform/bias", (w,)),
            *layer_norm(norm, "mlm_head/transform_norm", w),
            copy(bias, "mlm_head/bias", (c.vocab_size,))]


def _projection_rules(hf_name: str, c: TransformerConfig) -> List[Rule]:
    e = c.embedding_dim
    if not (c.project_summed_embeddings and e and e != c.d_model):
        return []
    return [linear(f"{hf_name}.weight", "encoder/embedding_projection/kernel", (e, c.d_model)),
            copy(f"{hf_name}.bias", "encoder/embedding_projection/bias", (c.d_model,))]


def _pooler_rules(hf: str, c: TransformerConfig) -> List[Rule]:
    d = c.d_model
    return [linear(f"{hf}.weight", "pooler/dense/kernel", (d, d)),
            copy(f"{hf}.bias", "pooler/dense/bias", (d,))]


def roberta_rules(c: TransformerConfig, root: str = "roberta.", pooler: bool = False,
                  mlm: bool = True) -> List[Rule]:
    """RoBERTa's table under `root` ("roberta." with the MLM head, "" in RobertaModel)."""
    rules = _embedding_rules(f"{root}embeddings", c)
    for i in range(c.num_encoder_layers):
        rules += bert_layer_rules(f"{root}encoder.layer.{i}", f"encoder/layers/layer_{i}", c)
    if pooler:
        rules += _pooler_rules(f"{root}pooler.dense", c)
    if mlm:
        rules += _mlm_head_rules("lm_head.dense", "lm_head.layer_norm", "lm_head.bias", c)
    return rules


_SHARED = "shared"   # ALBERT's `layers/layer` is renamed while converting (not a scan stack)
_ALBERT_LAYER = {"query": "attention.query", "key": "attention.key", "value": "attention.value",
                 "out": "attention.dense", "attention_norm": "attention.LayerNorm",
                 "wi": "ffn", "wo": "ffn_output", "mlp_norm": "full_layer_layer_norm"}


def albert_rules(c: TransformerConfig, pooler: bool = True, heads: bool = True,
                 root: str = "albert.", sop: Optional[bool] = None) -> List[Rule]:
    """ALBERT's table under `root` ("albert." with heads, "" in AlbertModel): the pooler,
    the MLM head (`heads`) and the SOP head (`sop`, default `heads`) as asked."""
    rules = _embedding_rules(f"{root}embeddings", c)
    rules += _projection_rules(f"{root}encoder.embedding_hidden_mapping_in", c)
    rules += bert_layer_rules(f"{root}encoder.albert_layer_groups.0.albert_layers.0",
                              f"encoder/layers/{_SHARED}", c, _ALBERT_LAYER)
    if pooler:
        rules += _pooler_rules(f"{root}pooler", c)
    if heads:
        rules += _mlm_head_rules("predictions.dense", "predictions.LayerNorm", "predictions.bias",
                                 c)
    if heads if sop is None else sop:
        rules += _sop_rules(c)
    return rules


def _sop_rules(c: TransformerConfig) -> List[Rule]:
    return [linear("sop_classifier.classifier.weight", "nsp_head/dense/kernel", (c.d_model, 2)),
            copy("sop_classifier.classifier.bias", "nsp_head/dense/bias", (2,))]


def electra_rules(c: TransformerConfig, generator: Optional[bool],
                  root: Optional[str] = None) -> List[Rule]:
    """ELECTRA's table: the generator's MLM head (`generator` True), the discriminator's
    RTD head (False) or none (None), under `root` (default: "electra." with a head, none in
    `ElectraModel`)."""
    root = ("" if generator is None else "electra.") if root is None else root
    rules = _embedding_rules(f"{root}embeddings", c)
    rules += _projection_rules(f"{root}embeddings_project", c)
    for i in range(c.num_encoder_layers):
        rules += bert_layer_rules(f"{root}encoder.layer.{i}", f"encoder/layers/layer_{i}", c)
    if generator is None:
        return rules
    if generator:
        return rules + _mlm_head_rules("generator_predictions.dense",
                                       "generator_predictions.LayerNorm",
                                       "generator_lm_head.bias", c)
    d = c.d_model
    p = "discriminator_predictions"
    return rules + [linear(f"{p}.dense.weight", "rtd_head/dense/kernel", (d, d)),
                    copy(f"{p}.dense.bias", "rtd_head/dense/bias", (d,)),
                    linear(f"{p}.dense_prediction.weight", "rtd_head/prediction/kernel", (d, 1)),
                    copy(f"{p}.dense_prediction.bias", "rtd_head/prediction/bias", (1,))]


_DISTIL_LAYER = {"query": "attention.q_lin", "key": "attention.k_lin",
                 "value": "attention.v_lin", "out": "attention.out_lin",
                 "attention_norm": "sa_layer_norm", "wi": "ffn.lin1", "wo": "ffn.lin2",
                 "mlp_norm": "output_layer_norm"}


def distilbert_rules(c: TransformerConfig, root: str = "distilbert.",
                     mlm: bool = True) -> List[Rule]:
    """DistilBERT's table under `root` ("distilbert." with the MLM head, "" in
    DistilBertModel)."""
    rules = _embedding_rules(f"{root}embeddings", c)
    for i in range(c.num_encoder_layers):
        rules += bert_layer_rules(f"{root}transformer.layer.{i}",
                                  f"encoder/layers/layer_{i}", c, _DISTIL_LAYER)
    if not mlm:
        return rules
    return rules + _mlm_head_rules("vocab_transform", "vocab_layer_norm", "vocab_projector.bias",
                                   c)


# ----------------------------------------------------------------------- state dicts
def _check_tied(state: Mapping[str, np.ndarray], decoder: str, words: str) -> None:
    if decoder in state and words in state and not np.array_equal(state[decoder], state[words]):
        raise CheckpointMismatchError(f"{decoder} differs from {words}; t2t's MLM head is "
                                      "always tied to the word embeddings")


def _rename(params, old: str, new: str) -> Params:
    """Rename the key `old` under every `layers` node (ALBERT's shared layer)."""
    flat = {tuple(new if (k == old and i and p[i - 1] == "layers") else k
                  for i, k in enumerate(p)): v for p, v in flat_params(params).items()}
    return traverse_util.unflatten_dict(flat)


# ----------------------------------------------------------------------- per HF class
# HF class -> its table (config, pooler present?) -> rules; the first is written by default.
ROBERTA_TABLES: Dict[str, Callable[[TransformerConfig, bool], List[Rule]]] = {
    "RobertaForMaskedLM": lambda c, pooler: roberta_rules(c),
    "RobertaModel": lambda c, pooler: roberta_rules(c, "", pooler=pooler, mlm=False)}
ALBERT_TABLES: Dict[str, Callable[[TransformerConfig, bool], List[Rule]]] = {
    "AlbertForPreTraining": lambda c, pooler: albert_rules(c),
    "AlbertForMaskedLM": lambda c, pooler: albert_rules(c, pooler=False, sop=False),
    "AlbertModel": lambda c, pooler: albert_rules(c, pooler=pooler, heads=False, root="")}
# ELECTRA: HF class -> `electra_rules`' generator argument
ELECTRA_TABLES: Dict[str, Optional[bool]] = {
    "ElectraForPreTraining": False, "ElectraForMaskedLM": True, "ElectraModel": None}
DISTILBERT_TABLES: Dict[str, Callable[[TransformerConfig, bool], List[Rule]]] = {
    "DistilBertForMaskedLM": lambda c, pooler: distilbert_rules(c),
    "DistilBertModel": lambda c, pooler: distilbert_rules(c, "", mlm=False)}
# What AlbertForMaskedLM lacks of t2t's ALBERT (AlbertForPreTraining's pooler and SOP head):
# initialised on load, left out on save.
_ALBERT_MLM_MISSING = ("pooler", "nsp_head")


def _without(params, modules) -> Params:
    return {k: v for k, v in params.items() if k not in modules}


def _roberta_params(state: StateDict, c: TransformerConfig, architecture: str) -> Params:
    _check_tied(state, "lm_head.decoder.weight", "roberta.embeddings.word_embeddings.weight")
    rules = ROBERTA_TABLES[architecture](c, "pooler.dense.weight" in state)
    return import_params(state, rules, c, None)


def _albert_params(state: StateDict, c: TransformerConfig, architecture: str) -> Params:
    _check_tied(state, "predictions.decoder.weight", "albert.embeddings.word_embeddings.weight")
    rules = ALBERT_TABLES[architecture](c, "pooler.weight" in state)
    params = import_params(state, rules, c, scan=False)
    if architecture == "AlbertForMaskedLM":
        params = merge(params, initialise(
            _pooler_rules("albert.pooler", c) + _sop_rules(c), c,
            f"pooler and sentence-order head ({architecture} has the MLM head only)"))
    return _rename(params, _SHARED, "layer")


def _electra_params(state: StateDict, c: TransformerConfig, architecture: str) -> Params:
    generator = ELECTRA_TABLES[architecture]
    if generator is not None and "generator_lm_head.bias" in state:
        generator = True
    _check_tied(state, "generator_lm_head.weight", "electra.embeddings.word_embeddings.weight")
    return import_params(state, electra_rules(c, generator), c, None)


def _distilbert_params(state: StateDict, c: TransformerConfig, architecture: str) -> Params:
    _check_tied(state, "vocab_projector.weight", "distilbert.embeddings.word_embeddings.weight")
    return import_params(state, DISTILBERT_TABLES[architecture](c, False), c, None)


def _roberta_to_hf(model) -> Tuple[dict, Dict[str, np.ndarray]]:
    p = model.params
    rules = ROBERTA_TABLES[model.architecture](model.config, "pooler" in p)
    return (roberta_hf_config(model.config, model.pad_token_id, model.architecture),
            export_params(p, rules))


def _albert_to_hf(model) -> Tuple[dict, Dict[str, np.ndarray]]:
    p = model.params
    if model.architecture == "AlbertForMaskedLM":
        p = _without(p, _ALBERT_MLM_MISSING)
    rules = ALBERT_TABLES[model.architecture](model.config, "pooler" in p)
    return (albert_hf_config(model.config, model.architecture),
            export_params(_rename(p, "layer", _SHARED), rules))


def _electra_to_hf(model) -> Tuple[dict, Dict[str, np.ndarray]]:
    p = model.params
    architecture = ("ElectraForPreTraining" if "rtd_head" in p
                    else "ElectraForMaskedLM" if "mlm_head" in p else "ElectraModel")
    return (electra_hf_config(model.config, architecture),
            export_params(p, electra_rules(model.config, ELECTRA_TABLES[architecture])))


def _distilbert_to_hf(model) -> Tuple[dict, Dict[str, np.ndarray]]:
    rules = DISTILBERT_TABLES[model.architecture](model.config, False)
    return (distilbert_hf_config(model.config, model.architecture),
            export_params(model.params, rules))


# ----------------------------------------------------------------------- logits
def roberta_positions(input_ids: jax.Array, pad_token_id: int) -> jax.Array:
    """RoBERTa's (fairseq's) position ids: pad_token_id + 1 + index among non-pad tokens;
    pad tokens get pad_token_id.  [batch, length] -> [batch, length]."""
    real = (input_ids != pad_token_id).astype(jnp.int32)
    return jnp.cumsum(real, axis=1) * real + pad_token_id


def _electra_logits(model) -> Callable:
    """Replaced-token logits [batch, length] of a discriminator, else the generator's MLM."""
    if "rtd_head" not in model.params:
        return mlm_logits(model, ELECTRA_GENERATOR_ACTIVATION)
    return _discriminator_fn(model.config)


@functools.lru_cache(maxsize=None)
def _discriminator_fn(config: TransformerConfig):
    from t2t.models.electra import ElectraDiscriminator

    def fn(params, ids, mask, types):
        return ElectraDiscriminator(config).apply({"params": params}, ids, mask, types)
    return jax.jit(fn)


# ----------------------------------------------------------------------- t2t trees
def _keep(*modules: str):
    """`HfFamily.split` of a class that holds only `modules` of a t2t BertModel tree (an
    unused NSP head is dropped on export)."""
    def split(config: TransformerConfig, p: Params, generator=None):
        return {"model": (None, config, {k: v for k, v in p.items() if k in modules})}
    return split


def _electra_split(config: TransformerConfig, p: Params, generator=None):
    """An ELECTRA pretraining tree (`t2t.models.electra.ElectraPretraining`, with its
    `generator` config) -> "generator" (ElectraForMaskedLM) and "discriminator"
    (ElectraForPreTraining), each with the shared embeddings; any other tree whole."""
    if "generator" not in p:
        return {"model": (None, config, p)}
    if generator is None:
        raise PretrainedError("an ELECTRA pretraining tree needs the generator's config")
    shared = {"token_embedder": p["token_embedder"]}

    def encoder(stack):
        return {"embedder": p["embedder"], **p[stack]}
    disc = {**shared, "encoder": encoder("discriminator"), "rtd_head": p["rtd_head"]}
    gen = {**shared, "encoder": encoder("generator"), "mlm_head": p["generator_head"]}
    d_cfg = config.replace(embedding_dim=config.embedding_dim or config.d_model,
                           project_summed_embeddings=True)
    return {"generator": ("ElectraForMaskedLM", generator, gen),
            "discriminator": ("ElectraForPreTraining", d_cfg, disc)}


# ----------------------------------------------------------------------- task heads
# Each family's task-head classes (`t2t.convert.hf_heads`): the backbone under its root, no
# pooler; the dense before the output and the output of its pooled heads.
ROBERTA_HEADS = TaskHeads(
    "Roberta", lambda c: roberta_rules(c, "roberta.", pooler=False, mlm=False),
    {"SequenceClassification": ("classifier.dense", "classifier.out_proj"),
     "MultipleChoice": ("roberta.pooler.dense", "classifier")})
ALBERT_HEADS = TaskHeads(
    "Albert", lambda c: albert_rules(c, pooler=False, heads=False),
    {suffix: ("albert.pooler", "classifier")
     for suffix in ("SequenceClassification", "MultipleChoice")})
ELECTRA_HEADS = TaskHeads(
    "Electra", lambda c: electra_rules(c, None, root="electra."),
    {"SequenceClassification": ("classifier.dense", "classifier.out_proj"),
     "MultipleChoice": ("sequence_summary.summary", "classifier")})
DISTILBERT_HEADS = TaskHeads(
    "DistilBert", lambda c: distilbert_rules(c, mlm=False),
    {suffix: ("pre_classifier", "classifier")
     for suffix in ("SequenceClassification", "MultipleChoice")})


def _electra_check(d: Mapping, architecture: str) -> None:
    """ElectraForMultipleChoice's summary: the first token, projected, gelu (the family's
    multiple-choice pooler, `t2t.models.families.head_style`)."""
    if architecture != "ElectraForMultipleChoice":
        return
    summary = (d.get("summary_type", "first"), d.get("summary_use_proj", True),
               d.get("summary_activation", "gelu"), d.get("summary_proj_to_labels", False))
    if summary != ("first", True, "gelu", False):
        raise ValueError(f"summary_type/use_proj/activation/proj_to_labels = {summary}: t2t "
                         "reads ElectraForMultipleChoice's ('first', True, 'gelu', False)")


ROBERTA = with_heads(HfFamily(
    "roberta", tuple(ROBERTA_TABLES), roberta_config, _roberta_params, _roberta_to_hf,
    functools.partial(mlm_logits, mlm_activation=ROBERTA_MLM_ACTIVATION,
                      positions=roberta_positions),
    pad_token_id=1, split=_keep("token_embedder", "encoder", "mlm_head"),
    hidden_states=functools.partial(encoder_hidden_states, positions=roberta_positions)),
    ROBERTA_HEADS,
    lambda model: roberta_hf_config(model.config, model.pad_token_id, model.architecture),
    positions=roberta_positions)
ALBERT = with_heads(
    HfFamily("albert", tuple(ALBERT_TABLES), albert_config, _albert_params, _albert_to_hf,
             mlm_logits, hidden_states=encoder_hidden_states),
    ALBERT_HEADS, lambda model: albert_hf_config(model.config, model.architecture),
    after_import=lambda p: _rename(p, _SHARED, "layer"),
    before_export=lambda p: _rename(p, "layer", _SHARED), scan=False)
ELECTRA = with_heads(
    HfFamily("electra", tuple(ELECTRA_TABLES), electra_config, _electra_params,
             _electra_to_hf, _electra_logits, split=_electra_split,
             hidden_states=encoder_hidden_states, check=_electra_check),
    ELECTRA_HEADS, lambda model: electra_hf_config(model.config, model.architecture))
DISTILBERT = with_heads(HfFamily(
    "distilbert", tuple(DISTILBERT_TABLES), distilbert_config, _distilbert_params,
    _distilbert_to_hf, mlm_logits, split=_keep("token_embedder", "encoder", "mlm_head"),
    hidden_states=encoder_hidden_states),
    DISTILBERT_HEADS, lambda model: distilbert_hf_config(model.config, model.architecture))
