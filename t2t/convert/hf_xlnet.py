"""Hugging Face XLNet (`XLNetLMHeadModel`, `XLNetModel`) <-> t2t `t2t.models.xlnet.XLNet`.

The t2t tree: `token_embedder/embedding` [vocab, d], `mask_emb` [d], `lm_bias` [vocab] and
per layer `layer_{i}/attention/{query,key,value,relative}/kernel` [d, heads, head_dim],
`attention/out/kernel` [heads, head_dim, d], `attention/{r_w_bias,r_r_bias,r_s_bias}`
[heads, head_dim], `attention/seg_embed` [2, heads, head_dim], `attention/norm`, `mlp/wi`,
`mlp/wo`, `mlp_norm`. HF's `lm_loss.weight` is the word embedding (tied); its bias is
`lm_bias`. Settings outside TransformerConfig (mem_len, clamp_len, attn_type,
same_length, summary_last_dropout) travel as `XLNetOptions`.

The fine-tuning heads (`XLNetForSequenceClassification`, `XLNetForMultipleChoice`;
`t2t.models.xlnet_heads.XLNetClassifierHead`) put the same tree under `transformer/` (no
`lm_bias`) beside `sequence_summary/summary/{kernel,bias}` and `logits_proj/{kernel,bias}`.
"""
from __future__ import annotations

import functools
from typing import Callable, Dict, List, Mapping, Optional, Tuple

import jax
import numpy as np

from t2t.convert.hf_common import T2T_TO_HF_ACTIVATION, HfFamily, activation, require
from t2t.convert.rules import (CheckpointMismatchError, Params, Rule, copy, export_params,
                               import_params, layer_norm, linear, reshape, split, tree)
from t2t.models.xlnet import XLNetOptions
from t2t.nn.config import TransformerConfig

ARCHITECTURE = "XLNetLMHeadModel"
HEADS = ("XLNetForSequenceClassification", "XLNetForMultipleChoice")
# HF's sequence summary settings the heads implement (summary_type "last", projection d -> d).
SUMMARY = {"summary_type": "last", "summary_use_proj": True, "summary_activation": "tanh",
           "summary_proj_to_labels": False}


def xlnet_config(d: Mapping) -> TransformerConfig:
    """HF `XLNetConfig` -> TransformerConfig (post-LN, biases on the feed-forward only, one
    dropout rate everywhere, no absolute positions: they are relative, in the module)."""
    if d.get("bi_data") or d.get("reuse_len"):
        raise ValueError(f"bi_data={d.get('bi_data')!r}, reuse_len={d.get('reuse_len')!r}: "
                         "pretraining-input settings t2t does not read (use false and null)")
    d_model, heads = d["d_model"], d["n_head"]
    dropout = d.get("dropout", 0.1)
    return TransformerConfig(
        vocab_size=d["vocab_size"], d_model=d_model, num_heads=heads,
        head_dim=d.get("d_head", d_model // heads), d_ff=d["d_inner"],
        num_encoder_layers=d["n_layer"], num_decoder_layers=0,
        mlp_activations=(activation(d.get("ff_activation", "gelu"), "XLNet"),),
        norm_type="layer", norm_eps=d.get("layer_norm_eps", 1e-12), pre_norm=False,
        use_bias=True, position_embedding="none", type_vocab_size=0, tie_embeddings=True,
        attention_scale="sqrt", dropout_rate=dropout, attention_dropout_rate=dropout,
        mlp_dropout_rate=dropout, kernel_init="normal",
        initializer_range=d.get("initializer_range", 0.02))


def xlnet_options(d: Mapping) -> XLNetOptions:
    """The HF config's memory and position settings."""
    return XLNetOptions(mem_len=d.get("mem_len") or 0, clamp_len=d.get("clamp_len", -1),
                        attn_type=d.get("attn_type", "bi"),
                        same_length=bool(d.get("same_length", False)),
                        summary_last_dropout=d.get("summary_last_dropout", 0.1))


def check_summary(d: Mapping) -> None:
    """A fine-tuning head's config must use the summary t2t implements (ValueError if not)."""
    defaults = {"summary_type": "last", "summary_use_proj": False,   # HF when a key is absent
                "summary_activation": None, "summary_proj_to_labels": False}
    found = {k: d.get(k, v) for k, v in defaults.items()}
    if found != SUMMARY or d.get("summary_first_dropout", 0):
        raise ValueError(f"sequence summary {found} (summary_first_dropout "
                         f"{d.get('summary_first_dropout', 0)}): t2t implements only {SUMMARY}")


def xlnet_hf_config(c: TransformerConfig, options: Optional[XLNetOptions] = None,
                    pad_token_id: int = 5, architecture: str = ARCHITECTURE,
                    num_labels: int = 2) -> dict:
    """TransformerConfig + options (default `XLNetOptions()`) -> an `XLNetConfig` dict for
    `architecture` (`XLNetLMHeadModel`, or one of `HEADS` with `num_labels`)."""
    options = options or XLNetOptions()
    family = "XLNet"
    require(c.norm_type == "layer" and not c.pre_norm and c.use_bias, family,
            "needs post-LN LayerNorm and biases")
    require(c.num_heads * c.head_dim == c.d_model, family, "needs num_heads*head_dim == d_model")
    require(len(c.mlp_activations) == 1 and c.mlp_activations[0] in T2T_TO_HF_ACTIVATION, family,
            f"mlp_activations={c.mlp_activations} is not one HF activation")
    require(c.tie_embeddings and c.embedding_dim in (None, c.d_model) and not c.share_layers
            and c.type_vocab_size == 0 and not c.scale_embeddings, family,
            "needs tied, unfactorized, unscaled embeddings and no type table or sharing")
    require(c.dropout_rate == c.attn_dropout_rate == c.mlp_dropout_rate, family,
            "has one dropout rate (dropout_rate, attention and mlp dropout must be equal)")
    labels = {"id2label": {str(i): f"LABEL_{i}" for i in range(num_labels)},
              "label2id": {f"LABEL_{i}": i for i in range(num_labels)}}
    return {"architectures": [architecture], "model_type": "xlnet", **SUMMARY, **labels,
            "summary_last_dropout": options.summary_last_dropout,
            "vocab_size": c.vocab_size, "d_model": c.d_model, "n_layer": c.num_encoder_layers,
            "n_head": c.num_heads, "d_head": c.head_dim, "d_inner": c.d_ff,
            "ff_activation": T2T_TO_HF_ACTIVATION[c.mlp_activations[0]], "untie_r": True,
            "attn_type": options.attn_type, "initializer_range": c.initializer_range,
            "layer_norm_eps": c.norm_eps, "dropout": c.dropout_rate,
            "mem_len": options.mem_len or None, "reuse_len": None, "bi_data": False,
            "clamp_len": options.clamp_len, "same_length": options.same_length,
            "pad_token_id": pad_token_id, "bos_token_id": 1, "eos_token_id": 2}


def _out_projection(hf_name: str, path: str, c: TransformerConfig) -> Rule:
    """HF `o` [d, heads, head_dim] <-> t2t out kernel [heads, head_dim, d]."""
    d, h, k = c.d_model, c.num_heads, c.head_dim
    return Rule(hf_name, (d, h, k), (split(path),), ((h, k, d),),
                lambda w: (np.transpose(w, (1, 2, 0)),),
                lambda ws: np.transpose(ws[0], (2, 0, 1)))


def xlnet_rules(c: TransformerConfig, root: str = "transformer.", lm_head: bool = True,
                prefix: str = "") -> List[Rule]:
    """The table HF name <-> t2t path; `root` is "transformer." for the LM head model (and
    the fine-tuning heads, whose t2t paths start with `prefix` "transformer/")."""
    d, h, k, f, v = c.d_model, c.num_heads, c.head_dim, c.d_ff, c.vocab_size
    rules = [copy(f"{root}word_embedding.weight", f"{prefix}token_embedder/embedding", (v, d),
                  aliases=("lm_loss.weight",) if lm_head else ()),
             reshape(f"{root}mask_emb", f"{prefix}mask_emb", (1, 1, d), (d,))]
    for i in range(c.num_encoder_layers):
        a, t = f"{root}layer.{i}.rel_attn", f"{prefix}layer_{i}/attention"
        rules += [copy(f"{a}.{n}", f"{t}/{name}/kernel", (d, h, k))
                  for n, name in (("q", "query"), ("k", "key"), ("v", "value"),
                                  ("r", "relative"))]
        rules += [_out_projection(f"{a}.o", f"{t}/out/kernel", c),
                  *[copy(f"{a}.{n}", f"{t}/{n}", (h, k))
                    for n in ("r_w_bias", "r_r_bias", "r_s_bias")],
                  copy(f"{a}.seg_embed", f"{t}/seg_embed", (2, h, k)),
                  *layer_norm(f"{a}.layer_norm", f"{t}/norm", d)]
        ff, t = f"{root}layer.{i}.ff", f"{prefix}layer_{i}"
        rules += [linear(f"{ff}.layer_1.weight", f"{t}/mlp/wi/kernel", (d, f)),
                  copy(f"{ff}.layer_1.bias", f"{t}/mlp/wi/bias", (f,)),
                  linear(f"{ff}.layer_2.weight", f"{t}/mlp/wo/kernel", (f, d)),
                  copy(f"{ff}.layer_2.bias", f"{t}/mlp/wo/bias", (d,)),
                  *layer_norm(f"{ff}.layer_norm", f"{t}/mlp_norm", d)]
    if root and lm_head:
        rules.append(copy("lm_loss.bias", "lm_bias", (v,)))
    return rules


def head_rules(c: TransformerConfig, num_outputs: int) -> List[Rule]:
    """`XLNetForSequenceClassification` / `XLNetForMultipleChoice` (num_outputs 1): the
    backbone under `transformer/`, the summary projection and `logits_proj`."""
    d = c.d_model
    return [*xlnet_rules(c, lm_head=False, prefix="transformer/"),
            linear("sequence_summary.summary.weight", "sequence_summary/summary/kernel", (d, d)),
            copy("sequence_summary.summary.bias", "sequence_summary/summary/bias", (d,)),
            linear("logits_proj.weight", "logits_proj/kernel", (d, num_outputs)),
            copy("logits_proj.bias", "logits_proj/bias", (num_outputs,))]


def params_from_hf(state: Mapping[str, np.ndarray], c: TransformerConfig,
                   architecture: str = ARCHITECTURE) -> Params:
    """An `XLNetLMHeadModel` (or bare `XLNetModel`: then `lm_bias` is zero) state dict ->
    XLNet params; for one of `HEADS`, `XLNetClassifierHead` params."""
    if architecture in HEADS:
        if "logits_proj.weight" not in state:
            raise CheckpointMismatchError(f"this {architecture} checkpoint has no "
                                          "'logits_proj.weight'")
        outputs = np.shape(state["logits_proj.weight"])[0]
        return import_params(state, head_rules(c, outputs), c, scan=False)
    root = "transformer." if any(n.startswith("transformer.") for n in state) else ""
    words, head = state.get(f"{root}word_embedding.weight"), state.get("lm_loss.weight")
    if words is not None and head is not None and not np.array_equal(words, head):
        raise CheckpointMismatchError("lm_loss.weight differs from the word embedding; t2t's "
                                      "XLNet ties its LM head to the token table")
    params = import_params(state, xlnet_rules(c, root), c, scan=False)
    if not root:
        params["lm_bias"] = np.zeros((c.vocab_size,), c.params_dtype)
    return params


def num_outputs(params) -> Optional[int]:
    """The head's output count of `XLNetClassifierHead` params; None for an LM tree."""
    p = tree(params)
    return p["logits_proj"]["kernel"].shape[-1] if "logits_proj" in p else None


def params_to_hf(c: TransformerConfig, params) -> Dict[str, np.ndarray]:
    """XLNet params -> the `XLNetLMHeadModel` state dict (the tied lm_loss.weight left out,
    as `transformers` writes it too); `XLNetClassifierHead` params -> the head's."""
    outputs = num_outputs(params)
    rules = xlnet_rules(c) if outputs is None else head_rules(c, outputs)
    return export_params(tree(params), rules)


# ----------------------------------------------------------------------- as a HfFamily
def _params_from_hf(state: Mapping[str, np.ndarray], c: TransformerConfig,
                    architecture: str) -> Params:
    return params_from_hf(state, c, architecture)


def _check(d: Mapping, architecture: str) -> None:
    if architecture in HEADS:
        check_summary(d)


def _to_hf(model) -> Tuple[dict, Dict[str, np.ndarray]]:
    outputs = num_outputs(model.params)
    if outputs is None and model.architecture == "XLNetModel":   # no prefix, no LM head
        body = {k: v for k, v in tree(model.params).items() if k != "lm_bias"}
        return (xlnet_hf_config(model.config, model.options, model.pad_token_id,
                                "XLNetModel", 2),
                export_params(body, xlnet_rules(model.config, root="")))
    architecture = ARCHITECTURE if outputs is None else (
        "XLNetForMultipleChoice" if model.architecture == "XLNetForMultipleChoice"
        else "XLNetForSequenceClassification")
    return (xlnet_hf_config(model.config, model.options, model.pad_token_id, architecture,
                            outputs or 2),
            params_to_hf(model.config, model.params))


def _logits(model) -> Callable:
    """LM logits of the content stream over the whole input; a head's class logits
    ([batch, labels], or [batch, choices] for inputs [batch, choices, length])."""
    outputs = num_outputs(model.params) if model.architecture in HEADS else None
    return _logits_fn(model.config, model.options, outputs)


@functools.lru_cache(maxsize=None)
def _logits_fn(config: TransformerConfig, options: XLNetOptions, outputs: Optional[int]):
    from t2t.models.xlnet import XLNet
    from t2t.models.xlnet_heads import XLNetClassifierHead

    if outputs is not None:
        def fn(params, ids, mask, types):
            return XLNetClassifierHead(config, outputs, options).apply({"params": params}, ids,
                                                                       mask, types)
    else:
        def fn(params, ids, mask, types):
            return XLNet(config, options).apply({"params": params}, ids, mask, types)[0]
    return jax.jit(fn)


def _hidden_states(model) -> Callable:
    """The content stream's last states [batch, length, d_model] (XLNetModel's
    `last_hidden_state`); of a head's tree, its `transformer`'s."""
    return _hidden_fn(model.config, model.options, model.architecture in HEADS)


@functools.lru_cache(maxsize=None)
def _hidden_fn(config: TransformerConfig, options: XLNetOptions, head: bool):
    from t2t.models.xlnet import XLNet

    def fn(params, ids, mask, types):
        body = dict(params["transformer"] if head else params)
        body.setdefault("lm_bias", np.zeros((config.vocab_size,), config.params_dtype))
        return XLNet(config, options).apply({"params": body}, ids, mask, types,
                                            method=XLNet.encode)[0]
    return jax.jit(fn)


XLNET = HfFamily("xlnet", (ARCHITECTURE, "XLNetModel") + HEADS, xlnet_config, _params_from_hf,
                 _to_hf, _logits, pad_token_id=5, options_from_hf=xlnet_options, check=_check,
                 hidden_states=_hidden_states)
