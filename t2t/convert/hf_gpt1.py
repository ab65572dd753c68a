"""Hugging Face OpenAI GPT (GPT-1, Radford et al. 2018) <-> t2t, and the double-heads
models of the GPT-1 fine-tuning format.

`OpenAIGPTLMHeadModel` is t2t's `Decoder` with post-LN layers (ln_1 after attention, ln_2
after the feed-forward, no final norm), learned positions, biases and a tied output.
HF's ``afn="gelu"`` is the tanh approximation (``gelu_new``), t2t's "gelu_tanh".

`OpenAIGPTDoubleHeadsModel` / `GPT2DoubleHeadsModel` add ``multiple_choice_head.summary``,
a Linear(d, 1) on the state at ``mc_token_ids``: t2t's `GptFormatHead` with combine
"choice" (its `Decoder` under ``decoder``, the linear layer as ``classifier/dense``).
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Mapping, Optional

import numpy as np

from t2t.convert.hf_common import HfFamily, common_checks, require
from t2t.convert.hf_gpt2 import decoder_hidden_states, gpt2_rules, gpt_layer_rules, lm_logits
from t2t.convert.rules import (CheckpointMismatchError, Params, Rule, copy, export_params,
                               import_params, linear)
from t2t.nn.config import TransformerConfig

MODEL_TYPE = "openai-gpt"
ARCHITECTURE = "OpenAIGPTLMHeadModel"
# HF's OpenAI GPT activations (modeling_openai.ACT_FNS) <-> t2t's.
_ACT_TO_T2T = {"gelu": "gelu_tanh", "relu": "relu", "silu": "silu", "swish": "silu"}
_ACT_TO_HF = {"gelu_tanh": "gelu", "relu": "relu", "silu": "silu"}


def openai_gpt_config(d: Mapping) -> TransformerConfig:
    """HF `OpenAIGPTConfig` dict -> TransformerConfig (post-LN, d_ff = 4 d_model)."""
    afn = d.get("afn", "gelu")
    if afn not in _ACT_TO_T2T:
        raise ValueError(f"openai-gpt: afn {afn!r} has no t2t equivalent; supported: "
                         f"{sorted(_ACT_TO_T2T)}")
    n_embd, n_head = d["n_embd"], d["n_head"]
    return TransformerConfig(
        vocab_size=d["vocab_size"], d_model=n_embd, num_heads=n_head, head_dim=n_embd // n_head,
        d_ff=4 * n_embd, num_encoder_layers=0, num_decoder_layers=d["n_layer"],
        mlp_activations=(_ACT_TO_T2T[afn],), norm_type="layer",
        norm_eps=d.get("layer_norm_epsilon", 1e-5), pre_norm=False, use_bias=True,
        position_embedding="learned", max_length=d.get("n_positions", 512),
        tie_embeddings=True, attention_scale="sqrt", dropout_rate=d.get("resid_pdrop", 0.1),
        attention_dropout_rate=d.get("attn_pdrop", 0.1), kernel_init="normal",
        initializer_range=d.get("initializer_range", 0.02))


def openai_gpt_hf_config(config: TransformerConfig, architecture: str = ARCHITECTURE) -> dict:
    """TransformerConfig -> HF `OpenAIGPTConfig` dict (checks the config is a GPT-1)."""
    c = config
    require(c.norm_type == "layer" and not c.pre_norm and c.use_bias, "OpenAI GPT",
            "needs norm_type='layer', pre_norm=False, use_bias=True")
    require(c.position_embedding == "learned" and not c.type_vocab_size
            and not c.embedding_norm and c.tie_embeddings, "OpenAI GPT",
            "needs learned positions, no type embeddings or embedding_norm, tied output")
    require(c.d_ff == 4 * c.d_model, "OpenAI GPT", f"needs d_ff = 4 * d_model, got {c.d_ff}")
    require(len(c.mlp_activations) == 1 and c.mlp_activations[0] in _ACT_TO_HF,
            "OpenAI GPT", f"mlp_activations={c.mlp_activations} is not one of "
            f"{sorted(_ACT_TO_HF)}")
    common_checks(c, "OpenAI GPT")
    return {"architectures": [architecture], "model_type": MODEL_TYPE,
            "vocab_size": c.vocab_size, "n_positions": c.max_length, "n_embd": c.d_model,
            "n_layer": c.num_decoder_layers, "n_head": c.num_heads,
            "afn": _ACT_TO_HF[c.mlp_activations[0]], "resid_pdrop": c.dropout_rate,
            "embd_pdrop": c.dropout_rate, "attn_pdrop": c.attn_dropout_rate,
            "layer_norm_epsilon": c.norm_eps, "initializer_range": c.initializer_range}


def rules(c: TransformerConfig, root: str = "transformer.") -> List[Rule]:
    """HF OpenAI GPT tensor names <-> `Decoder` param paths."""
    d = c.d_model
    out = [copy(f"{root}tokens_embed.weight", "token_embedder/embedding", (c.vocab_size, d)),
           copy(f"{root}positions_embed.weight", "embedder/position_embedder/embedding",
                (c.max_length, d))]
    for i in range(c.num_decoder_layers):      # post-LN: ln_1, ln_2 after their sublayer
        out += gpt_layer_rules(f"{root}h.{i}", f"layers/layer_{i}", c)
    return out


def _root(state: Mapping[str, np.ndarray]) -> str:
    return "transformer." if any(k.startswith("transformer.") for k in state) else ""


def _check_tied(state: Mapping[str, np.ndarray], table: str) -> None:
    if "lm_head.weight" in state and not np.array_equal(state["lm_head.weight"], state[table]):
        raise CheckpointMismatchError(f"lm_head.weight differs from {table}; t2t's GPT "
                                      "output is tied")


def params_from_hf(state: Mapping[str, np.ndarray], config: TransformerConfig,
                   scan: Optional[bool] = None) -> Params:
    """OpenAIGPTLMHeadModel / OpenAIGPTModel state dict (numpy) -> `Decoder` params."""
    root = _root(state)
    _check_tied(state, f"{root}tokens_embed.weight")
    return import_params(state, rules(config, root), config, scan)


def params_to_hf(config: TransformerConfig, params: Params,
                 architecture: str = ARCHITECTURE) -> Dict[str, np.ndarray]:
    """`Decoder` params -> OpenAIGPTLMHeadModel state dict (`transformer.` names), or
    OpenAIGPTModel's (`architecture`; no prefix)."""
    return export_params(params, rules(config, ROOTS[architecture]))


# HF class -> the prefix of its tensors (OpenAIGPTModel's have none)
ROOTS = {ARCHITECTURE: "transformer.", "OpenAIGPTModel": ""}


# ----------------------------------------------------------------------- double heads
# model_type -> (the trunk's table, its tied word embedding)
_TRUNKS = {MODEL_TYPE: (rules, "transformer.tokens_embed.weight"),
           "gpt2": (gpt2_rules, "transformer.wte.weight")}


def _under_decoder(rule: Rule) -> Rule:
    return dataclasses.replace(rule, paths=tuple(("decoder",) + p for p in rule.paths))


def _trunk(model_type: str):
    if model_type not in _TRUNKS:
        raise ValueError(f"double heads: model_type {model_type!r}; choose one of "
                         f"{sorted(_TRUNKS)}")
    return _TRUNKS[model_type]


def double_heads_rules(model_type: str, c: TransformerConfig) -> List[Rule]:
    """`OpenAIGPTDoubleHeadsModel` / `GPT2DoubleHeadsModel` names <-> `GptFormatHead`
    ("choice") paths: the trunk under ``decoder``, the summary Linear(d, 1) as the
    classifier."""
    trunk = [_under_decoder(r) for r in _trunk(model_type)[0](c, "transformer.")]
    return trunk + [linear("multiple_choice_head.summary.weight",
                           "classifier/dense/kernel", (c.d_model, 1)),
                    copy("multiple_choice_head.summary.bias", "classifier/dense/bias", (1,))]


def double_heads_from_hf(model_type: str, state: Mapping[str, np.ndarray],
                         config: TransformerConfig) -> Params:
    """A double-heads state dict (numpy) -> `GptFormatHead` params."""
    _check_tied(state, _trunk(model_type)[1])
    return import_params(state, double_heads_rules(model_type, config), config, False)


def double_heads_to_hf(model_type: str, config: TransformerConfig,
                       params: Params) -> Dict[str, np.ndarray]:
    """`GptFormatHead` ("choice") params -> a double-heads state dict (tied lm_head left
    out, as HF's own files)."""
    return export_params(params, double_heads_rules(model_type, config))


GPT1 = HfFamily(MODEL_TYPE, tuple(ROOTS), openai_gpt_config,
                lambda state, config, architecture: params_from_hf(state, config),
                lambda model: (openai_gpt_hf_config(model.config, model.architecture),
                               params_to_hf(model.config, model.params, model.architecture)),
                lm_logits, hidden_states=decoder_hidden_states,
                read_as={"OpenAIGPTDoubleHeadsModel": "OpenAIGPTLMHeadModel"})
