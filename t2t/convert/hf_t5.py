"""Hugging Face T5 (`T5ForConditionalGeneration`, `T5Model`, `T5EncoderModel`) <-> t2t
`t2t.nn.stacks.EncoderDecoder` params: v1.0 (ReLU, tied and scaled logits) and v1.1 (gated
GeLU, untied) configs. `T5Model` has no LM head (`decoder/logits_dense`), `T5EncoderModel`
no decoder either; the config is the checkpoint's either way. `T5ForConditionalGeneration`'s
logits take `decoder_input_ids` (and `decoder_attention_mask`)."""
from __future__ import annotations

import functools
from typing import Callable, Dict, List, Mapping, Optional, Tuple

import jax

import numpy as np

from t2t.convert.hf_common import (T2T_TO_HF_ACTIVATION, HfFamily, activation,
                                   encoder_decoder_logits, require)
from t2t.convert.hf_files import load_directory, write_directory
from t2t.convert.rules import (CheckpointMismatchError, Params, Rule, StateDict, copy,
                               export_params, import_params, layer_norm, linear, transpose)
from t2t.nn.config import TransformerConfig


def t5_config(d: Mapping) -> TransformerConfig:
    """HF `T5Config` dict -> TransformerConfig (v1.0 relu + tied/scaled logits, v1.1 GeGLU)."""
    proj = d.get("feed_forward_proj", "relu")
    parts = proj.split("-")
    gated = parts[0] == "gated"
    if (len(parts) > 1 and not gated) or len(parts) > 2:
        raise ValueError(f"T5 feed_forward_proj={proj!r} is not 'ACT' or 'gated-ACT'")
    act = "gelu_tanh" if proj == "gated-gelu" else activation(parts[-1], "T5")  # HF's legacy rule
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


def t5_hf_config(config: TransformerConfig,
                 architecture: str = "T5ForConditionalGeneration") -> dict:
    """TransformerConfig -> HF `T5Config` dict (checks the config is a T5)."""
    c = config
    require(c.norm_type == "rms" and c.pre_norm and not c.use_bias, "T5",
            "needs norm_type='rms', pre_norm=True, use_bias=False")
    require(c.position_embedding == "relative" and c.attention_scale == "folded", "T5",
            "needs relative positions and attention_scale='folded'")
    require(c.scale_tied_logits == c.tie_embeddings, "T5",
            "HF T5 scales the logits by d_model**-0.5 exactly when the embeddings are tied")
    require(not c.share_encoder_decoder and not c.type_vocab_size and not c.embedding_norm,
            "T5", "share_encoder_decoder / type embeddings / embedding_norm have no HF T5 form")
    acts = c.mlp_activations
    if acts == ("gelu_tanh", "linear"):
        proj = "gated-gelu"
    elif len(acts) == 2 and acts[1] == "linear" and acts[0] in ("relu", "silu"):
        proj = f"gated-{acts[0]}"
    elif len(acts) == 1 and acts[0] in T2T_TO_HF_ACTIVATION:
        proj = T2T_TO_HF_ACTIVATION[acts[0]]
    else:
        raise ValueError(f"T5 cannot express mlp_activations={acts}")
    require(c.embedding_dim is None and not c.scale_embeddings and not c.share_layers, "T5",
            "factorized/scaled embeddings and shared layers have no HF T5 form")
    return {"architectures": [architecture], "model_type": "t5",
            "vocab_size": c.vocab_size, "d_model": c.d_model, "d_kv": c.head_dim,
            "d_ff": c.d_ff, "num_layers": c.num_encoder_layers,
            "num_decoder_layers": c.num_decoder_layers, "num_heads": c.num_heads,
            "relative_attention_num_buckets": c.relative_buckets,
            "relative_attention_max_distance": c.relative_max_distance,
            "dropout_rate": c.dropout_rate, "layer_norm_epsilon": c.norm_eps,
            "initializer_factor": 1.0, "feed_forward_proj": proj, "is_encoder_decoder": True,
            "tie_word_embeddings": c.tie_embeddings, "use_cache": True,
            "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0}


def _t5_attention(hf: str, t: str, c: TransformerConfig) -> List[Rule]:
    d, h, k = c.d_model, c.num_heads, c.head_dim
    rules = [linear(f"{hf}.{a}.weight", f"{t}/{b}/kernel", (d, h, k))
             for a, b in (("q", "query"), ("k", "key"), ("v", "value"))]
    return rules + [linear(f"{hf}.o.weight", f"{t}/out/kernel", (h, k, d), n_in=2)]


def _t5_mlp(hf: str, t: str, c: TransformerConfig) -> List[Rule]:
    d, f = c.d_model, c.d_ff
    if c.is_gated:
        rules = [linear(f"{hf}.wi_{j}.weight", f"{t}/wi_{j}/kernel", (d, f))
                 for j in range(len(c.mlp_activations))]
    else:
        rules = [linear(f"{hf}.wi.weight", f"{t}/wi/kernel", (d, f))]
    return rules + [linear(f"{hf}.wo.weight", f"{t}/wo/kernel", (f, d))]


def t5_rules(c: TransformerConfig, decoder: bool = True, lm_head: bool = True) -> List[Rule]:
    """T5's table: the shared embedding, both stacks' relative position biases, layers and
    final norms (the decoder's if `decoder`), and the untied output projection when there is
    one (and `lm_head`)."""
    d = c.d_model
    rules = [copy("shared.weight", "token_embedder/embedding", (c.vocab_size, d),
                  aliases=("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"))]
    stacks = (("encoder", c.num_encoder_layers), ("decoder", c.num_decoder_layers))
    for stack, n in stacks[:2 if decoder else 1]:
        rules.append(transpose(
            f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
            f"{stack}/relpos/rel_embedding", (c.num_heads, c.relative_buckets)))
        for i in range(n):
            hf, t = f"{stack}.block.{i}.layer", f"{stack}/layers/layer_{i}"
            rules += _t5_attention(f"{hf}.0.SelfAttention", f"{t}/self_attention", c)
            rules += layer_norm(f"{hf}.0.layer_norm", f"{t}/self_attention_norm", d, bias=False)
            m = 1
            if stack == "decoder":
                rules += _t5_attention(f"{hf}.1.EncDecAttention", f"{t}/cross_attention", c)
                rules += layer_norm(f"{hf}.1.layer_norm", f"{t}/cross_attention_norm", d,
                                    bias=False)
                m = 2
            rules += _t5_mlp(f"{hf}.{m}.DenseReluDense", f"{t}/mlp", c)
            rules += layer_norm(f"{hf}.{m}.layer_norm", f"{t}/mlp_norm", d, bias=False)
        rules += layer_norm(f"{stack}.final_layer_norm", f"{stack}/final_norm", d, bias=False)
    if decoder and lm_head and not c.tie_embeddings:
        rules.append(linear("lm_head.weight", "decoder/logits_dense/kernel", (d, c.vocab_size)))
    return rules


# HF class -> its table (`t5_rules`' decoder and lm_head arguments)
T5_TABLES: Dict[str, Dict[str, bool]] = {
    "T5ForConditionalGeneration": {"decoder": True, "lm_head": True},
    "T5Model": {"decoder": True, "lm_head": False},
    "T5EncoderModel": {"decoder": False, "lm_head": False}}


def t5_params_from_hf(state_dict: StateDict, config: TransformerConfig,
                      scan: Optional[bool] = None,
                      architecture: str = "T5ForConditionalGeneration") -> Params:
    """HF T5ForConditionalGeneration (or `architecture`'s) state dict (numpy) ->
    EncoderDecoder params."""
    if config.tie_embeddings and "lm_head.weight" in state_dict and "shared.weight" in state_dict:
        if not np.array_equal(state_dict["lm_head.weight"], state_dict["shared.weight"]):
            raise CheckpointMismatchError("config ties the embeddings but lm_head.weight "
                                          "differs from shared.weight")
    return import_params(state_dict, t5_rules(config, **T5_TABLES[architecture]), config, scan)


def t5_params_to_hf(config: TransformerConfig, params: Params,
                    architecture: str = "T5ForConditionalGeneration") -> Dict[str, np.ndarray]:
    """EncoderDecoder params -> HF T5ForConditionalGeneration (or `architecture`'s) state
    dict."""
    return export_params(params, t5_rules(config, **T5_TABLES[architecture]))


def load_t5(path, **overrides) -> Tuple[TransformerConfig, Params]:
    """HF T5 directory -> (config, EncoderDecoder params)."""
    return load_directory(path, t5_config, t5_params_from_hf, overrides)


def save_t5(config: TransformerConfig, params: Params, path) -> None:
    """Write a T5ForConditionalGeneration directory."""
    write_directory(path, t5_hf_config(config), t5_params_to_hf(config, params))


def _logits(model) -> Callable:
    """T5ForConditionalGeneration's LM logits (`hf_common.encoder_decoder_logits`)."""
    return encoder_decoder_logits(
        model, model.architecture == "T5ForConditionalGeneration",
        "; its encoder's states: hidden_states(input_ids, attention_mask)")


def _encoder_hidden_states(model) -> Callable:
    return _encode_fn(model.config)


@functools.lru_cache(maxsize=None)
def _encode_fn(config: TransformerConfig):
    from t2t.nn.stacks import EncoderDecoder

    def fn(params, ids, mask, types):
        return EncoderDecoder(config).apply({"params": params}, ids, mask,
                                            method=EncoderDecoder.encode)
    return jax.jit(fn)


T5 = HfFamily("t5", tuple(T5_TABLES), t5_config,
              lambda state, config, architecture: t5_params_from_hf(state, config, None,
                                                                    architecture),
              lambda model: (t5_hf_config(model.config, model.architecture),
                             t5_params_to_hf(model.config, model.params, model.architecture)),
              _logits, hidden_states=_encoder_hidden_states,
              logits_inputs=("decoder_input_ids", "decoder_attention_mask"))
