"""Import and export Hugging Face BERT, T5 and GPT-2 checkpoints (safetensors only).

`load_pretrained(directory)` / `save_pretrained(model, directory)` serve every family
(RoBERTa, ALBERT, ELECTRA and DistilBERT rules live in `hf_encoders.py`).

Each family is one table of rules `HF tensor name <-> t2t param path(s)` built from the
config, so one table drives both directions. Trees are plain nested dicts of numpy arrays:

  BERT   -> `t2t.models.bert.BertModel(config)` params (pooler / heads only when present)
  T5     -> `t2t.nn.stacks.EncoderDecoder(config)` params
  GPT-2  -> `t2t.nn.stacks.Decoder(config)` params (the decoder-only LM)

Layers go under `layers/layer_{i}`, or stacked under `layers/layer` with a leading layer
axis when `config.scan_layers` (or `scan=True`). Pickle checkpoints (`*.bin`) are refused.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from flax import traverse_util
from flax.core.meta import unbox
from safetensors.numpy import load_file, save_file

from t2t.errors import InputFileError
from t2t.nn.config import TransformerConfig

log = logging.getLogger(__name__)

Params = Dict[str, object]          # nested dict of np.ndarray
StateDict = Mapping[str, np.ndarray]
Path = Tuple[str, ...]

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"


class CheckpointMismatchError(ValueError):
    """A checkpoint tensor is missing or does not have the shape the config implies."""


# ----------------------------------------------------------------------- activations
_HF_ACT_TO_T2T = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                  "gelu_fast": "gelu_tanh", "relu": "relu", "silu": "silu", "swish": "silu",
                  "sigmoid": "sigmoid", "tanh": "tanh", "linear": "linear"}
_T2T_ACT_TO_HF = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu",
                  "sigmoid": "sigmoid", "tanh": "tanh", "linear": "linear"}


def _act(name: str, family: str) -> str:
    if name not in _HF_ACT_TO_T2T:
        raise ValueError(f"{family}: activation {name!r} has no t2t equivalent; "
                         f"supported: {sorted(_HF_ACT_TO_T2T)}")
    return _HF_ACT_TO_T2T[name]


def _require(ok: bool, family: str, what: str) -> None:
    if not ok:
        raise ValueError(f"this TransformerConfig cannot be written as a Hugging Face "
                         f"{family} checkpoint: {what}")


# ----------------------------------------------------------------------- config maps
def bert_config(d: Mapping) -> TransformerConfig:
    """HF `BertConfig` dict -> TransformerConfig (post-LN, learned positions, biases)."""
    if d.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"BERT position_embedding_type={d['position_embedding_type']!r} is "
                         "not supported (only 'absolute')")
    hidden, heads = d["hidden_size"], d["num_attention_heads"]
    return TransformerConfig(
        vocab_size=d["vocab_size"], d_model=hidden, num_heads=heads, head_dim=hidden // heads,
        d_ff=d["intermediate_size"], num_encoder_layers=d["num_hidden_layers"],
        num_decoder_layers=0, mlp_activations=(_act(d.get("hidden_act", "gelu"), "BERT"),),
        norm_type="layer", norm_eps=d.get("layer_norm_eps", 1e-12), pre_norm=False,
        use_bias=True, position_embedding="learned",
        max_length=d.get("max_position_embeddings", 512),
        type_vocab_size=d.get("type_vocab_size", 2), embedding_norm=True,
        tie_embeddings=True, attention_scale="sqrt",
        dropout_rate=d.get("hidden_dropout_prob", 0.1),
        attention_dropout_rate=d.get("attention_probs_dropout_prob", 0.1),
        kernel_init="normal", initializer_range=d.get("initializer_range", 0.02))


def t5_config(d: Mapping) -> TransformerConfig:
    """HF `T5Config` dict -> TransformerConfig (v1.0 relu + tied/scaled logits, v1.1 GeGLU)."""
    proj = d.get("feed_forward_proj", "relu")
    parts = proj.split("-")
    gated = parts[0] == "gated"
    if (len(parts) > 1 and not gated) or len(parts) > 2:
        raise ValueError(f"T5 feed_forward_proj={proj!r} is not 'ACT' or 'gated-ACT'")
    act = "gelu_tanh" if proj == "gated-gelu" else _act(parts[-1], "T5")  # HF's legacy rule
    tied = d.get("tie_word_embeddings", True)
    num_layers = d.get("num_layers", 6)
    num_decoder_layers = d.get("num_decoder_layers")
    # HF's T5 drops out the residual branches, the attention weights and the feed-forward
    # activations, all at dropout_rate
    rate = d.get("dropout_rate", 0.1)
    return TransformerConfig(
        vocab_size=d["vocab_size"], d_model=d["d_model"], num_heads=d["num_heads"],
        head_dim=d["d_kv"], d_ff=d["d_ff"], num_encoder_layers=num_layers,
        num_decoder_layers=num_layers if num_decoder_layers is None else num_decoder_layers,
        mlp_activations=(act, "linear") if gated else (act,),
        norm_type="rms", norm_eps=d.get("layer_norm_epsilon", 1e-6), pre_norm=True,
        use_bias=False, position_embedding="relative",
        relative_buckets=d.get("relative_attention_num_buckets", 32),
        relative_max_distance=d.get("relative_attention_max_distance", 128),
        tie_embeddings=tied, scale_tied_logits=tied, attention_scale="folded",
        dropout_rate=rate, mlp_dropout_rate=rate, kernel_init="variance_scaling")


def gpt2_config(d: Mapping) -> TransformerConfig:
    """HF `GPT2Config` dict -> TransformerConfig (pre-LN, learned positions, biases, tied)."""
    if not d.get("scale_attn_weights", True) or d.get("scale_attn_by_inverse_layer_idx", False):
        raise ValueError("GPT-2 scale_attn_weights=False / scale_attn_by_inverse_layer_idx=True "
                         "are not supported")
    n_embd, n_head = d["n_embd"], d["n_head"]
    return TransformerConfig(
        vocab_size=d["vocab_size"], d_model=n_embd, num_heads=n_head, head_dim=n_embd // n_head,
        d_ff=d.get("n_inner") or 4 * n_embd, num_encoder_layers=0,
        num_decoder_layers=d["n_layer"],
        mlp_activations=(_act(d.get("activation_function", "gelu_new"), "GPT-2"),),
        norm_type="layer", norm_eps=d.get("layer_norm_epsilon", 1e-5), pre_norm=True,
        use_bias=True, position_embedding="learned", max_length=d.get("n_positions", 1024),
        tie_embeddings=d.get("tie_word_embeddings", True), attention_scale="sqrt",
        dropout_rate=d.get("resid_pdrop", 0.1), attention_dropout_rate=d.get("attn_pdrop", 0.1),
        kernel_init="normal", initializer_range=d.get("initializer_range", 0.02))


def bert_hf_config(config: TransformerConfig, architecture: str = "BertModel") -> dict:
    """TransformerConfig -> HF `BertConfig` dict (checks the config is a BERT)."""
    c = config
    _require(c.norm_type == "layer" and not c.pre_norm and c.use_bias, "BERT",
             "needs norm_type='layer', pre_norm=False, use_bias=True")
    _require(c.position_embedding == "learned" and c.embedding_norm and c.type_vocab_size > 0,
             "BERT", "needs learned positions, embedding_norm and type_vocab_size > 0")
    _require(len(c.mlp_activations) == 1 and c.mlp_activations[0] in _T2T_ACT_TO_HF, "BERT",
             f"mlp_activations={c.mlp_activations} is not one HF activation")
    _common_checks(c, "BERT")
    return {"architectures": [architecture], "model_type": "bert",
            "vocab_size": c.vocab_size, "hidden_size": c.d_model,
            "num_hidden_layers": c.num_encoder_layers, "num_attention_heads": c.num_heads,
            "intermediate_size": c.d_ff, "hidden_act": _T2T_ACT_TO_HF[c.mlp_activations[0]],
            "hidden_dropout_prob": c.dropout_rate,
            "attention_probs_dropout_prob": c.attn_dropout_rate,
            "max_position_embeddings": c.max_length, "type_vocab_size": c.type_vocab_size,
            "initializer_range": c.initializer_range, "layer_norm_eps": c.norm_eps,
            "position_embedding_type": "absolute", "pad_token_id": 0}


def t5_hf_config(config: TransformerConfig) -> dict:
    """TransformerConfig -> HF `T5Config` dict (checks the config is a T5)."""
    c = config
    _require(c.norm_type == "rms" and c.pre_norm and not c.use_bias, "T5",
             "needs norm_type='rms', pre_norm=True, use_bias=False")
    _require(c.position_embedding == "relative" and c.attention_scale == "folded", "T5",
             "needs relative positions and attention_scale='folded'")
    _require(c.scale_tied_logits == c.tie_embeddings, "T5",
             "HF T5 scales the logits by d_model**-0.5 exactly when the embeddings are tied")
    _require(not c.share_encoder_decoder and not c.type_vocab_size and not c.embedding_norm,
             "T5", "share_encoder_decoder / type embeddings / embedding_norm have no HF T5 form")
    acts = c.mlp_activations
    if acts == ("gelu_tanh", "linear"):
        proj = "gated-gelu"
    elif len(acts) == 2 and acts[1] == "linear" and acts[0] in ("relu", "silu"):
        proj = f"gated-{acts[0]}"
    elif len(acts) == 1 and acts[0] in _T2T_ACT_TO_HF:
        proj = _T2T_ACT_TO_HF[acts[0]]
    else:
        raise ValueError(f"T5 cannot express mlp_activations={acts}")
    _require(c.embedding_dim is None and not c.scale_embeddings and not c.share_layers, "T5",
             "factorized/scaled embeddings and shared layers have no HF T5 form")
    return {"architectures": ["T5ForConditionalGeneration"], "model_type": "t5",
            "vocab_size": c.vocab_size, "d_model": c.d_model, "d_kv": c.head_dim,
            "d_ff": c.d_ff, "num_layers": c.num_encoder_layers,
            "num_decoder_layers": c.num_decoder_layers, "num_heads": c.num_heads,
            "relative_attention_num_buckets": c.relative_buckets,
            "relative_attention_max_distance": c.relative_max_distance,
            "dropout_rate": c.dropout_rate, "layer_norm_epsilon": c.norm_eps,
            "initializer_factor": 1.0, "feed_forward_proj": proj, "is_encoder_decoder": True,
            "tie_word_embeddings": c.tie_embeddings, "use_cache": True,
            "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0}


def gpt2_hf_config(config: TransformerConfig) -> dict:
    """TransformerConfig -> HF `GPT2Config` dict (checks the config is a GPT-2)."""
    c = config
    _require(c.norm_type == "layer" and c.pre_norm and c.use_bias, "GPT-2",
             "needs norm_type='layer', pre_norm=True, use_bias=True")
    _require(c.position_embedding == "learned" and not c.type_vocab_size
             and not c.embedding_norm, "GPT-2",
             "needs learned positions, no type embeddings, no embedding_norm")
    _require(len(c.mlp_activations) == 1 and c.mlp_activations[0] in _T2T_ACT_TO_HF, "GPT-2",
             f"mlp_activations={c.mlp_activations} is not one HF activation")
    _common_checks(c, "GPT-2")
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
            "vocab_size": c.vocab_size, "n_positions": c.max_length, "n_embd": c.d_model,
            "n_layer": c.num_decoder_layers, "n_head": c.num_heads, "n_inner": c.d_ff,
            "activation_function": _T2T_ACT_TO_HF[c.mlp_activations[0]],
            "resid_pdrop": c.dropout_rate, "embd_pdrop": c.dropout_rate,
            "attn_pdrop": c.attn_dropout_rate, "layer_norm_epsilon": c.norm_eps,
            "initializer_range": c.initializer_range, "scale_attn_weights": True,
            "tie_word_embeddings": c.tie_embeddings, "use_cache": True}


def _common_checks(c: TransformerConfig, family: str) -> None:
    _require(c.position_offset == 0, family, "has no position_offset (RoBERTa's)")
    _require(c.attention_scale == "sqrt", family, "needs attention_scale='sqrt'")
    _require(c.num_heads * c.head_dim == c.d_model, family,
             f"needs num_heads * head_dim == d_model ({c.num_heads}*{c.head_dim} != {c.d_model})")
    _require(c.embedding_dim is None and not c.scale_embeddings and not c.share_layers, family,
             "factorized/scaled embeddings and shared layers have no HF form")


# ----------------------------------------------------------------------- rule tables
@dataclasses.dataclass(frozen=True)
class _Rule:
    """One HF tensor <-> one or more t2t params.

    to_t2t(hf_array) -> tuple of arrays for `paths`; to_hf(tuple of arrays) -> hf_array.
    `aliases` are other HF names to read the tensor from (tied copies, legacy names).
    """

    hf: str
    hf_shape: Tuple[int, ...]
    paths: Tuple[Path, ...]
    shapes: Tuple[Tuple[int, ...], ...]
    to_t2t: Callable
    to_hf: Callable
    aliases: Tuple[str, ...] = ()


def _split(path: str) -> Path:
    return tuple(path.split("/"))


def _copy(hf: str, path: str, shape, aliases=()) -> _Rule:
    shape = tuple(shape)
    return _Rule(hf, shape, (_split(path),), (shape,), lambda w: (w,), lambda ws: ws[0],
                 tuple(aliases))


def _linear(hf: str, path: str, shape, n_in: int = 1) -> _Rule:
    """nn.Linear weight [out, in] <-> t2t kernel [*in_dims, *out_dims] (first n_in are in)."""
    shape = tuple(shape)
    fan_in, fan_out = int(np.prod(shape[:n_in])), int(np.prod(shape[n_in:]))
    return _Rule(hf, (fan_out, fan_in), (_split(path),), (shape,),
                 lambda w: (w.T.reshape(shape),),
                 lambda ws: ws[0].reshape(fan_in, fan_out).T)


def _reshape(hf: str, path: str, hf_shape, shape) -> _Rule:
    """Same data in another shape (biases [h*d] <-> [h, d]; Conv1D [in, out] kernels)."""
    hf_shape, shape = tuple(hf_shape), tuple(shape)
    return _Rule(hf, hf_shape, (_split(path),), (shape,), lambda w: (w.reshape(shape),),
                 lambda ws: ws[0].reshape(hf_shape))


def _transpose(hf: str, path: str, shape, aliases=()) -> _Rule:
    shape = tuple(shape)
    return _Rule(hf, shape[::-1], (_split(path),), (shape,), lambda w: (w.T,),
                 lambda ws: ws[0].T, tuple(aliases))


def _layer_norm(hf: str, path: str, d: int, bias: bool = True) -> List[_Rule]:
    rules = [_copy(f"{hf}.weight", f"{path}/scale", (d,), aliases=(f"{hf}.gamma",))]
    if bias:
        rules.append(_copy(f"{hf}.bias", f"{path}/bias", (d,), aliases=(f"{hf}.beta",)))
    return rules


def _bert_layer_rules(hf: str, t: str, c: TransformerConfig,
                      names: Optional[Mapping[str, str]] = None) -> List[_Rule]:
    """One post-LN layer: HF `hf` (BERT's submodule names, or `names` overriding them:
    ALBERT's, DistilBERT's) <-> t2t `t`."""
    d, h, k, f = c.d_model, c.num_heads, c.head_dim, c.d_ff
    n = {"query": "attention.self.query", "key": "attention.self.key",
         "value": "attention.self.value", "out": "attention.output.dense",
         "attention_norm": "attention.output.LayerNorm", "wi": "intermediate.dense",
         "wo": "output.dense", "mlp_norm": "output.LayerNorm", **(names or {})}
    rules = []
    for name in ("query", "key", "value"):
        rules += [_linear(f"{hf}.{n[name]}.weight", f"{t}/self_attention/{name}/kernel",
                          (d, h, k)),
                  _reshape(f"{hf}.{n[name]}.bias", f"{t}/self_attention/{name}/bias",
                           (h * k,), (h, k))]
    return rules + [
        _linear(f"{hf}.{n['out']}.weight", f"{t}/self_attention/out/kernel", (h, k, d), n_in=2),
        _copy(f"{hf}.{n['out']}.bias", f"{t}/self_attention/out/bias", (d,)),
        *_layer_norm(f"{hf}.{n['attention_norm']}", f"{t}/self_attention_norm", d),
        _linear(f"{hf}.{n['wi']}.weight", f"{t}/mlp/wi/kernel", (d, f)),
        _copy(f"{hf}.{n['wi']}.bias", f"{t}/mlp/wi/bias", (f,)),
        _linear(f"{hf}.{n['wo']}.weight", f"{t}/mlp/wo/kernel", (f, d)),
        _copy(f"{hf}.{n['wo']}.bias", f"{t}/mlp/wo/bias", (d,)),
        *_layer_norm(f"{hf}.{n['mlp_norm']}", f"{t}/mlp_norm", d),
    ]


def _bert_rules(c: TransformerConfig, root: str, pooler: bool, mlm: bool,
                nsp: bool) -> List[_Rule]:
    d = c.d_model
    e = f"{root}embeddings"
    rules = [
        _copy(f"{e}.word_embeddings.weight", "token_embedder/embedding", (c.vocab_size, d)),
        _copy(f"{e}.position_embeddings.weight", "encoder/embedder/position_embedder/embedding",
              (c.max_length, d)),
        _copy(f"{e}.token_type_embeddings.weight", "encoder/embedder/type_embedder/embedding",
              (c.type_vocab_size, d)),
        *_layer_norm(f"{e}.LayerNorm", "encoder/embedder/embedding_norm", d),
    ]
    for i in range(c.num_encoder_layers):
        rules += _bert_layer_rules(f"{root}encoder.layer.{i}", f"encoder/layers/layer_{i}", c)
    if pooler:
        rules += [_linear(f"{root}pooler.dense.weight", "pooler/dense/kernel", (d, d)),
                  _copy(f"{root}pooler.dense.bias", "pooler/dense/bias", (d,))]
    if mlm:
        p = "cls.predictions"
        rules += [_linear(f"{p}.transform.dense.weight", "mlm_head/transform/kernel", (d, d)),
                  _copy(f"{p}.transform.dense.bias", "mlm_head/transform/bias", (d,)),
                  *_layer_norm(f"{p}.transform.LayerNorm", "mlm_head/transform_norm", d),
                  _copy(f"{p}.bias", "mlm_head/bias", (c.vocab_size,),
                        aliases=(f"{p}.decoder.bias",))]
    if nsp:
        rules += [_linear("cls.seq_relationship.weight", "nsp_head/dense/kernel", (d, 2)),
                  _copy("cls.seq_relationship.bias", "nsp_head/dense/bias", (2,))]
    return rules


def _t5_attention(hf: str, t: str, c: TransformerConfig) -> List[_Rule]:
    d, h, k = c.d_model, c.num_heads, c.head_dim
    rules = [_linear(f"{hf}.{a}.weight", f"{t}/{b}/kernel", (d, h, k))
             for a, b in (("q", "query"), ("k", "key"), ("v", "value"))]
    return rules + [_linear(f"{hf}.o.weight", f"{t}/out/kernel", (h, k, d), n_in=2)]


def _t5_mlp(hf: str, t: str, c: TransformerConfig) -> List[_Rule]:
    d, f = c.d_model, c.d_ff
    if c.is_gated:
        rules = [_linear(f"{hf}.wi_{j}.weight", f"{t}/wi_{j}/kernel", (d, f))
                 for j in range(len(c.mlp_activations))]
    else:
        rules = [_linear(f"{hf}.wi.weight", f"{t}/wi/kernel", (d, f))]
    return rules + [_linear(f"{hf}.wo.weight", f"{t}/wo/kernel", (f, d))]


def _t5_rules(c: TransformerConfig) -> List[_Rule]:
    d = c.d_model
    rules = [_copy("shared.weight", "token_embedder/embedding", (c.vocab_size, d),
                   aliases=("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"))]
    for stack, n in (("encoder", c.num_encoder_layers), ("decoder", c.num_decoder_layers)):
        rules.append(_transpose(
            f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
            f"{stack}/relpos/rel_embedding", (c.num_heads, c.relative_buckets)))
        for i in range(n):
            hf, t = f"{stack}.block.{i}.layer", f"{stack}/layers/layer_{i}"
            rules += _t5_attention(f"{hf}.0.SelfAttention", f"{t}/self_attention", c)
            rules += _layer_norm(f"{hf}.0.layer_norm", f"{t}/self_attention_norm", d, bias=False)
            m = 1
            if stack == "decoder":
                rules += _t5_attention(f"{hf}.1.EncDecAttention", f"{t}/cross_attention", c)
                rules += _layer_norm(f"{hf}.1.layer_norm", f"{t}/cross_attention_norm", d,
                                     bias=False)
                m = 2
            rules += _t5_mlp(f"{hf}.{m}.DenseReluDense", f"{t}/mlp", c)
            rules += _layer_norm(f"{hf}.{m}.layer_norm", f"{t}/mlp_norm", d, bias=False)
        rules += _layer_norm(f"{stack}.final_layer_norm", f"{stack}/final_norm", d, bias=False)
    if not c.tie_embeddings:
        rules.append(_linear("lm_head.weight", "decoder/logits_dense/kernel", (d, c.vocab_size)))
    return rules


def _gpt2_c_attn(hf: str, t: str, c: TransformerConfig, what: str) -> _Rule:
    """Conv1D c_attn [d, 3·h·k] (or its bias [3·h·k]) <-> query/key/value [d, h, k] ([h, k])."""
    d, h, k = c.d_model, c.num_heads, c.head_dim
    lead = (d,) if what == "kernel" else ()
    hf_shape = lead + (3 * h * k,)
    shape = lead + (h, k)
    paths = tuple(_split(f"{t}/{n}/{what}") for n in ("query", "key", "value"))
    return _Rule(f"{hf}.{'weight' if what == 'kernel' else 'bias'}", hf_shape, paths,
                 (shape,) * 3,
                 lambda w: tuple(x.reshape(shape) for x in np.split(w, 3, axis=-1)),
                 lambda ws: np.concatenate([x.reshape(lead + (h * k,)) for x in ws], axis=-1))


def _gpt2_rules(c: TransformerConfig, root: str) -> List[_Rule]:
    d, h, k, f = c.d_model, c.num_heads, c.head_dim, c.d_ff
    rules = [_copy(f"{root}wte.weight", "token_embedder/embedding", (c.vocab_size, d)),
             _copy(f"{root}wpe.weight", "embedder/position_embedder/embedding",
                   (c.max_length, d))]
    for i in range(c.num_decoder_layers):
        hf, t = f"{root}h.{i}", f"layers/layer_{i}"
        rules += [
            *_layer_norm(f"{hf}.ln_1", f"{t}/self_attention_norm", d),
            _gpt2_c_attn(f"{hf}.attn.c_attn", f"{t}/self_attention", c, "kernel"),
            _gpt2_c_attn(f"{hf}.attn.c_attn", f"{t}/self_attention", c, "bias"),
            _reshape(f"{hf}.attn.c_proj.weight", f"{t}/self_attention/out/kernel",
                     (h * k, d), (h, k, d)),
            _copy(f"{hf}.attn.c_proj.bias", f"{t}/self_attention/out/bias", (d,)),
            *_layer_norm(f"{hf}.ln_2", f"{t}/mlp_norm", d),
            _copy(f"{hf}.mlp.c_fc.weight", f"{t}/mlp/wi/kernel", (d, f)),   # Conv1D: [in, out]
            _copy(f"{hf}.mlp.c_fc.bias", f"{t}/mlp/wi/bias", (f,)),
            _copy(f"{hf}.mlp.c_proj.weight", f"{t}/mlp/wo/kernel", (f, d)),
            _copy(f"{hf}.mlp.c_proj.bias", f"{t}/mlp/wo/bias", (d,)),
        ]
    rules += _layer_norm(f"{root}ln_f", "final_norm", d)
    if not c.tie_embeddings:
        rules.append(_linear("lm_head.weight", "logits_dense/kernel", (d, c.vocab_size)))
    return rules


# ----------------------------------------------------------------------- the engine
_LAYER = re.compile(r"layer_(\d+)$")


def _fetch(state: StateDict, rule: _Rule) -> np.ndarray:
    for name in (rule.hf,) + rule.aliases:
        if name in state:
            w = np.asarray(state[name])
            if tuple(w.shape) != rule.hf_shape:
                raise CheckpointMismatchError(
                    f"checkpoint tensor {name!r} has shape {tuple(w.shape)}, but the config "
                    f"implies {rule.hf_shape} (for t2t {_names(rule)})")
            return w
    raise CheckpointMismatchError(
        f"checkpoint has no tensor {rule.hf!r} (expected shape {rule.hf_shape}, for t2t "
        f"{_names(rule)})")


def _names(rule: _Rule) -> str:
    return ", ".join("/".join(p) for p in rule.paths)


def _import(state: StateDict, rules: Sequence[_Rule], config: TransformerConfig,
            scan: Optional[bool]) -> Params:
    flat: Dict[Path, np.ndarray] = {}
    for rule in rules:
        for path, arr in zip(rule.paths, rule.to_t2t(_fetch(state, rule))):
            flat[path] = np.ascontiguousarray(arr, dtype=config.params_dtype)
    used = {n for r in rules for n in (r.hf,) + r.aliases}
    unused = sorted(n for n in state if n not in used and not _is_buffer(n))
    if unused:
        log.warning("ignored %d checkpoint tensors: %s", len(unused), unused[:10])
    if config.scan_layers if scan is None else scan:
        flat = _stack_layers(flat)
    return traverse_util.unflatten_dict(flat)


def _is_buffer(name: str) -> bool:
    return name.endswith(("position_ids", ".attn.bias", ".attn.masked_bias"))


def _layer_axis(path: Path) -> Optional[int]:
    """Index of the `layer_{i}` / `layer` key right under a `layers` stack, if any."""
    if "layers" in path[:-1]:
        return path.index("layers") + 1
    return None


def _stack_layers(flat: Dict[Path, np.ndarray]) -> Dict[Path, np.ndarray]:
    """`layers/layer_{i}/...` -> `layers/layer/...` with a leading layer axis (nn.scan)."""
    out, groups = {}, {}
    for path, arr in flat.items():
        j = _layer_axis(path)
        if j is None:
            out[path] = arr
        else:
            stacked = path[:j] + ("layer",) + path[j + 1:]
            groups.setdefault(stacked, {})[int(_LAYER.match(path[j]).group(1))] = arr
    for path, by_index in groups.items():
        out[path] = np.stack([by_index[i] for i in range(len(by_index))])
    return out


def _unstack_layers(flat: Dict[Path, np.ndarray]) -> Dict[Path, np.ndarray]:
    """Inverse of `_stack_layers` (a no-op on unstacked trees)."""
    out = {}
    for path, arr in flat.items():
        j = _layer_axis(path)
        if j is None or path[j] != "layer":
            out[path] = arr
            continue
        for i in range(arr.shape[0]):
            out[path[:j] + (f"layer_{i}",) + path[j + 1:]] = arr[i]
    return out


def _export(params: Params, rules: Sequence[_Rule]) -> Dict[str, np.ndarray]:
    flat = _unstack_layers(_flat(params))
    out = {}
    for rule in rules:
        arrays = []
        for path, shape in zip(rule.paths, rule.shapes):
            if path not in flat:
                raise CheckpointMismatchError(f"params have no {'/'.join(path)!r} "
                                              f"(expected shape {shape}, for HF {rule.hf!r})")
            arr = flat.pop(path)
            if tuple(arr.shape) != shape:
                raise CheckpointMismatchError(
                    f"param {'/'.join(path)!r} has shape {tuple(arr.shape)}, but the config "
                    f"implies {shape} (for HF {rule.hf!r})")
            arrays.append(arr.astype(np.float32))
        out[rule.hf] = np.ascontiguousarray(rule.to_hf(tuple(arrays)))
    if flat:
        raise CheckpointMismatchError("params with no Hugging Face counterpart: "
                                      + ", ".join("/".join(p) for p in sorted(flat)))
    return out


def _tree(params) -> Params:
    return traverse_util.unflatten_dict(_flat(params))


def _flat(params) -> Dict[Path, np.ndarray]:
    """{path: numpy array}; accepts {"params": tree}, boxed (partitioned) leaves, jax arrays."""
    if isinstance(params, Mapping) and set(params) == {"params"}:
        params = params["params"]
    flat = traverse_util.flatten_dict(unbox(params))
    return {path: np.asarray(arr) for path, arr in flat.items()}


# ----------------------------------------------------------------------- state-dict API
def bert_params_from_hf(state_dict: StateDict, config: TransformerConfig,
                        scan: Optional[bool] = None) -> Params:
    """HF BERT state dict (numpy) -> BertModel params.

    Works with and without the `bert.` prefix; the pooler, MLM head (`cls.predictions.*`)
    and NSP head (`cls.seq_relationship.*`) are converted when present.
    `scan` (default: `config.scan_layers`) stacks the layers for `nn.scan`.
    """
    root = "bert." if any(k.startswith("bert.embeddings.") for k in state_dict) else ""
    mlm = "cls.predictions.transform.dense.weight" in state_dict
    decoder = state_dict.get("cls.predictions.decoder.weight")
    words = state_dict.get(f"{root}embeddings.word_embeddings.weight")
    if decoder is not None and words is not None and not np.array_equal(decoder, words):
        raise CheckpointMismatchError("cls.predictions.decoder.weight differs from the word "
                                      "embeddings; t2t's MLM head is always tied")
    rules = _bert_rules(config, root, pooler=f"{root}pooler.dense.weight" in state_dict,
                        mlm=mlm, nsp="cls.seq_relationship.weight" in state_dict)
    return _import(state_dict, rules, config, scan)


def t5_params_from_hf(state_dict: StateDict, config: TransformerConfig,
                      scan: Optional[bool] = None) -> Params:
    """HF T5ForConditionalGeneration state dict (numpy) -> EncoderDecoder params."""
    if config.tie_embeddings and "lm_head.weight" in state_dict and "shared.weight" in state_dict:
        if not np.array_equal(state_dict["lm_head.weight"], state_dict["shared.weight"]):
            raise CheckpointMismatchError("config ties the embeddings but lm_head.weight "
                                          "differs from shared.weight")
    return _import(state_dict, _t5_rules(config), config, scan)


def gpt2_params_from_hf(state_dict: StateDict, config: TransformerConfig,
                        scan: Optional[bool] = None) -> Params:
    """HF GPT2LMHeadModel / GPT2Model state dict (numpy) -> Decoder params.

    Conv1D weights are already [in, out]; `c_attn` [d, 3d] is split into query/key/value.
    """
    root = "transformer." if any(k.startswith("transformer.") for k in state_dict) else ""
    if config.tie_embeddings and "lm_head.weight" in state_dict:
        if not np.array_equal(state_dict["lm_head.weight"], state_dict[f"{root}wte.weight"]):
            raise CheckpointMismatchError("config ties the embeddings but lm_head.weight "
                                          "differs from wte.weight")
    return _import(state_dict, _gpt2_rules(config, root), config, scan)


def bert_params_to_hf(config: TransformerConfig, params: Params) -> Dict[str, np.ndarray]:
    """BertModel params -> HF state dict (`bert.`-prefixed when there is a head)."""
    p = _tree(params)
    mlm, nsp = "mlm_head" in p, "nsp_head" in p
    root = "bert." if (mlm or nsp) else ""
    # Like HF's own files: the tied `cls.predictions.decoder.weight` is left out.
    return _export(p, _bert_rules(config, root, "pooler" in p, mlm, nsp))


def t5_params_to_hf(config: TransformerConfig, params: Params) -> Dict[str, np.ndarray]:
    """EncoderDecoder params -> HF T5ForConditionalGeneration state dict."""
    return _export(params, _t5_rules(config))


def gpt2_params_to_hf(config: TransformerConfig, params: Params) -> Dict[str, np.ndarray]:
    """Decoder params -> HF GPT2LMHeadModel state dict (`transformer.` names)."""
    return _export(params, _gpt2_rules(config, "transformer."))


# ----------------------------------------------------------------------- files
def read_safetensors(path: str) -> Dict[str, np.ndarray]:
    """All tensors of `model.safetensors` (or of the shards its index names) in `path`."""
    path = os.fspath(path)
    if os.path.isfile(path):
        return load_file(path)
    single, index = os.path.join(path, WEIGHTS_FILE), os.path.join(path, WEIGHTS_INDEX_FILE)
    if os.path.exists(single):
        return load_file(single)
    if os.path.exists(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        state = {}
        for shard in shards:
            state.update(load_file(os.path.join(path, shard)))
        return state
    raise FileNotFoundError(f"no {WEIGHTS_FILE} or {WEIGHTS_INDEX_FILE} in {path!r} (t2t reads "
                            "safetensors only; pickle checkpoints such as *.bin are refused)")


def read_json(path: str) -> Any:
    """A JSON file such as a Hugging Face config.json; one that is not UTF-8 JSON (binary,
    compressed, cut short) is an InputFileError naming it and the place."""
    try:
        with open(path, "rb") as f:
            return json.loads(f.read().decode("utf-8"))
    except UnicodeDecodeError:
        raise InputFileError(f"{path} is not UTF-8 text (a binary or compressed file?): it "
                             "should be JSON; copy it again from the model's source") from None
    except json.JSONDecodeError as e:
        raise InputFileError(f"{path}: not valid JSON at line {e.lineno}, column {e.colno} "
                             f"({e.msg}); cut short, or something after the JSON? copy it "
                             "again") from None


def _read_config(path: str) -> dict:
    path = os.fspath(path)
    directory = os.path.dirname(path) if os.path.isfile(path) else path
    return read_json(os.path.join(directory, CONFIG_FILE))


def _load(path, config_fn, params_fn, overrides) -> Tuple[TransformerConfig, Params]:
    config = config_fn(_read_config(path))
    if overrides:
        config = config.replace(**overrides)
    return config, params_fn(read_safetensors(path), config)


def load_bert(path, **overrides) -> Tuple[TransformerConfig, Params]:
    """HF BERT directory (config.json + model.safetensors) -> (config, BertModel params).

    `overrides` replace config fields, e.g. `scan_layers=True`, `dropout_rate=0.0`.
    """
    return _load(path, bert_config, bert_params_from_hf, overrides)


def load_t5(path, **overrides) -> Tuple[TransformerConfig, Params]:
    """HF T5 directory -> (config, EncoderDecoder params)."""
    return _load(path, t5_config, t5_params_from_hf, overrides)


def load_gpt2(path, **overrides) -> Tuple[TransformerConfig, Params]:
    """HF GPT-2 directory -> (config, Decoder params)."""
    return _load(path, gpt2_config, gpt2_params_from_hf, overrides)


def _save(path, hf_config: dict, state: Dict[str, np.ndarray]) -> None:
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, CONFIG_FILE), "w") as f:
        json.dump(hf_config, f, indent=2, sort_keys=True)
    save_file(state, os.path.join(path, WEIGHTS_FILE), metadata={"format": "pt"})


def save_bert(config: TransformerConfig, params: Params, path) -> None:
    """Write config.json + model.safetensors that `transformers` loads (BertModel, or
    BertForPreTraining / BertForMaskedLM when the params have heads)."""
    p = _tree(params)
    arch = ("BertForPreTraining" if "mlm_head" in p and "nsp_head" in p
            else "BertForMaskedLM" if "mlm_head" in p else "BertModel")
    _save(path, bert_hf_config(config, arch), bert_params_to_hf(config, p))


def save_t5(config: TransformerConfig, params: Params, path) -> None:
    """Write a T5ForConditionalGeneration directory."""
    _save(path, t5_hf_config(config), t5_params_to_hf(config, params))


def save_gpt2(config: TransformerConfig, params: Params, path) -> None:
    """Write a GPT2LMHeadModel directory."""
    _save(path, gpt2_hf_config(config), gpt2_params_to_hf(config, params))


# ----------------------------------------------------------------------- any model_type
def load_pretrained(path, **overrides):
    """Any supported HF directory (BERT, RoBERTa, ALBERT, ELECTRA, DistilBERT, GPT-2, T5) ->
    `t2t.convert.pretrained.PretrainedModel`, chosen by config.json's `model_type`."""
    from t2t.convert.pretrained import load_pretrained as load
    return load(path, **overrides)


def save_pretrained(model, path) -> None:
    """A `PretrainedModel` -> a directory `transformers` loads (`AutoModel*.from_pretrained`)."""
    from t2t.convert.pretrained import save_pretrained as save
    save(model, path)
