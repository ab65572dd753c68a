"""Hugging Face XLNet (`XLNetLMHeadModel`, `XLNetModel`) <-> t2t `t2t.models.xlnet.XLNet`.

The t2t tree: `token_embedder/embedding` [vocab, d], `mask_emb` [d], `lm_bias` [vocab] and
per layer `layer_{i}/attention/{query,key,value,relative}/kernel` [d, heads, head_dim],
`attention/out/kernel` [heads, head_dim, d], `attention/{r_w_bias,r_r_bias,r_s_bias}`
[heads, head_dim], `attention/seg_embed` [2, heads, head_dim], `attention/norm`, `mlp/wi`,
`mlp/wo`, `mlp_norm`. HF's `lm_loss.weight` is the word embedding (tied); its bias is
`lm_bias`. Settings outside TransformerConfig (mem_len, clamp_len, attn_type,
same_length) travel as `XLNetOptions`.
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Optional

import numpy as np

from t2t.convert import hf
from t2t.convert.hf import (CheckpointMismatchError, _act, _copy, _import, _layer_norm,
                            _linear, _require, _reshape, _Rule, _split, _T2T_ACT_TO_HF)
from t2t.models.xlnet import XLNetOptions
from t2t.nn.config import TransformerConfig

ARCHITECTURE = "XLNetLMHeadModel"


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
        mlp_activations=(_act(d.get("ff_activation", "gelu"), "XLNet"),),
        norm_type="layer", norm_eps=d.get("layer_norm_eps", 1e-12), pre_norm=False,
        use_bias=True, position_embedding="none", type_vocab_size=0, tie_embeddings=True,
        attention_scale="sqrt", dropout_rate=dropout, attention_dropout_rate=dropout,
        mlp_dropout_rate=dropout, kernel_init="normal",
        initializer_range=d.get("initializer_range", 0.02))


def xlnet_options(d: Mapping) -> XLNetOptions:
    """The HF config's memory and position settings."""
    return XLNetOptions(mem_len=d.get("mem_len") or 0, clamp_len=d.get("clamp_len", -1),
                        attn_type=d.get("attn_type", "bi"),
                        same_length=bool(d.get("same_length", False)))


def xlnet_hf_config(c: TransformerConfig, options: Optional[XLNetOptions] = None,
                    pad_token_id: int = 5) -> dict:
    """TransformerConfig + options (default `XLNetOptions()`) -> an `XLNetConfig` dict for
    `XLNetLMHeadModel`."""
    options = options or XLNetOptions()
    family = "XLNet"
    _require(c.norm_type == "layer" and not c.pre_norm and c.use_bias, family,
             "needs post-LN LayerNorm and biases")
    _require(c.num_heads * c.head_dim == c.d_model, family, "needs num_heads*head_dim == d_model")
    _require(len(c.mlp_activations) == 1 and c.mlp_activations[0] in _T2T_ACT_TO_HF, family,
             f"mlp_activations={c.mlp_activations} is not one HF activation")
    _require(c.tie_embeddings and c.embedding_dim in (None, c.d_model) and not c.share_layers
             and c.type_vocab_size == 0 and not c.scale_embeddings, family,
             "needs tied, unfactorized, unscaled embeddings and no type table or sharing")
    _require(c.dropout_rate == c.attn_dropout_rate == c.mlp_dropout_rate, family,
             "has one dropout rate (dropout_rate, attention and mlp dropout must be equal)")
    return {"architectures": [ARCHITECTURE], "model_type": "xlnet",
            "vocab_size": c.vocab_size, "d_model": c.d_model, "n_layer": c.num_encoder_layers,
            "n_head": c.num_heads, "d_head": c.head_dim, "d_inner": c.d_ff,
            "ff_activation": _T2T_ACT_TO_HF[c.mlp_activations[0]], "untie_r": True,
            "attn_type": options.attn_type, "initializer_range": c.initializer_range,
            "layer_norm_eps": c.norm_eps, "dropout": c.dropout_rate,
            "mem_len": options.mem_len or None, "reuse_len": None, "bi_data": False,
            "clamp_len": options.clamp_len, "same_length": options.same_length,
            "pad_token_id": pad_token_id, "bos_token_id": 1, "eos_token_id": 2}


def _out_projection(hf_name: str, path: str, c: TransformerConfig) -> _Rule:
    """HF `o` [d, heads, head_dim] <-> t2t out kernel [heads, head_dim, d]."""
    d, h, k = c.d_model, c.num_heads, c.head_dim
    return _Rule(hf_name, (d, h, k), (_split(path),), ((h, k, d),),
                 lambda w: (np.transpose(w, (1, 2, 0)),),
                 lambda ws: np.transpose(ws[0], (2, 0, 1)))


def xlnet_rules(c: TransformerConfig, root: str = "transformer.") -> List[_Rule]:
    """The table HF name <-> t2t path; `root` is "transformer." for the LM head model."""
    d, h, k, f, v = c.d_model, c.num_heads, c.head_dim, c.d_ff, c.vocab_size
    rules = [_copy(f"{root}word_embedding.weight", "token_embedder/embedding", (v, d),
                   aliases=("lm_loss.weight",)),
             _reshape(f"{root}mask_emb", "mask_emb", (1, 1, d), (d,))]
    for i in range(c.num_encoder_layers):
        a, t = f"{root}layer.{i}.rel_attn", f"layer_{i}/attention"
        rules += [_copy(f"{a}.{n}", f"{t}/{name}/kernel", (d, h, k))
                  for n, name in (("q", "query"), ("k", "key"), ("v", "value"),
                                  ("r", "relative"))]
        rules += [_out_projection(f"{a}.o", f"{t}/out/kernel", c),
                  *[_copy(f"{a}.{n}", f"{t}/{n}", (h, k))
                    for n in ("r_w_bias", "r_r_bias", "r_s_bias")],
                  _copy(f"{a}.seg_embed", f"{t}/seg_embed", (2, h, k)),
                  *_layer_norm(f"{a}.layer_norm", f"{t}/norm", d)]
        ff, t = f"{root}layer.{i}.ff", f"layer_{i}"
        rules += [_linear(f"{ff}.layer_1.weight", f"{t}/mlp/wi/kernel", (d, f)),
                  _copy(f"{ff}.layer_1.bias", f"{t}/mlp/wi/bias", (f,)),
                  _linear(f"{ff}.layer_2.weight", f"{t}/mlp/wo/kernel", (f, d)),
                  _copy(f"{ff}.layer_2.bias", f"{t}/mlp/wo/bias", (d,)),
                  *_layer_norm(f"{ff}.layer_norm", f"{t}/mlp_norm", d)]
    if root:
        rules.append(_copy("lm_loss.bias", "lm_bias", (v,)))
    return rules


def params_from_hf(state: Mapping[str, np.ndarray], c: TransformerConfig) -> hf.Params:
    """An `XLNetLMHeadModel` (or bare `XLNetModel`: then `lm_bias` is zero) state dict ->
    XLNet params."""
    root = "transformer." if any(n.startswith("transformer.") for n in state) else ""
    words, head = state.get(f"{root}word_embedding.weight"), state.get("lm_loss.weight")
    if words is not None and head is not None and not np.array_equal(words, head):
        raise CheckpointMismatchError("lm_loss.weight differs from the word embedding; t2t's "
                                      "XLNet ties its LM head to the token table")
    params = _import(state, xlnet_rules(c, root), c, scan=False)
    if not root:
        params["lm_bias"] = np.zeros((c.vocab_size,), c.params_dtype)
    return params


def params_to_hf(c: TransformerConfig, params) -> Dict[str, np.ndarray]:
    """XLNet params -> the `XLNetLMHeadModel` state dict (the tied lm_loss.weight left out,
    as `transformers` writes it too)."""
    return hf._export(hf._tree(params), xlnet_rules(c))
