"""Hugging Face GPT-2 (`GPT2LMHeadModel`, `GPT2Model`) <-> t2t `t2t.nn.stacks.Decoder`
params (the decoder-only LM: pre-LN, learned positions, biases, a tied output), and the
LM logits GPT-1 shares. Its task heads map onto t2t's fine-tuning heads, the Decoder under
`decoder`: `GPT2ForSequenceClassification` -> `t2t.models.classifiers.LastTokenHead`
(`score`, no bias, on each row's last real token: [batch, labels]) and
`GPT2ForTokenClassification` -> `DecoderTokenHead` (`classifier` as `tagger`: [batch,
length, labels])."""
from __future__ import annotations

import functools
from typing import Callable, Dict, List, Mapping, Optional, Tuple

import jax
import numpy as np

from t2t.convert.hf_common import (T2T_TO_HF_ACTIVATION, HfFamily, activation, common_checks,
                                   require)
from t2t.convert.hf_files import load_directory, write_directory
from t2t.convert.hf_heads import head_config
from t2t.convert.rules import (CheckpointMismatchError, Params, Rule, StateDict, copy, dense,
                               export_params, import_params, layer_norm, linear, nest, reshape,
                               split, tree)
from t2t.nn.config import TransformerConfig


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
        mlp_activations=(activation(d.get("activation_function", "gelu_new"), "GPT-2"),),
        norm_type="layer", norm_eps=d.get("layer_norm_epsilon", 1e-5), pre_norm=True,
        use_bias=True, position_embedding="learned", max_length=d.get("n_positions", 1024),
        tie_embeddings=d.get("tie_word_embeddings", True), attention_scale="sqrt",
        dropout_rate=d.get("resid_pdrop", 0.1), attention_dropout_rate=d.get("attn_pdrop", 0.1),
        kernel_init="normal", initializer_range=d.get("initializer_range", 0.02))


def gpt2_hf_config(config: TransformerConfig, architecture: str = "GPT2LMHeadModel") -> dict:
    """TransformerConfig -> HF `GPT2Config` dict (checks the config is a GPT-2)."""
    c = config
    require(c.norm_type == "layer" and c.pre_norm and c.use_bias, "GPT-2",
            "needs norm_type='layer', pre_norm=True, use_bias=True")
    require(c.position_embedding == "learned" and not c.type_vocab_size
            and not c.embedding_norm, "GPT-2",
            "needs learned positions, no type embeddings, no embedding_norm")
    require(len(c.mlp_activations) == 1 and c.mlp_activations[0] in T2T_TO_HF_ACTIVATION, "GPT-2",
            f"mlp_activations={c.mlp_activations} is not one HF activation")
    common_checks(c, "GPT-2")
    return {"architectures": [architecture], "model_type": "gpt2",
            "vocab_size": c.vocab_size, "n_positions": c.max_length, "n_embd": c.d_model,
            "n_layer": c.num_decoder_layers, "n_head": c.num_heads, "n_inner": c.d_ff,
            "activation_function": T2T_TO_HF_ACTIVATION[c.mlp_activations[0]],
            "resid_pdrop": c.dropout_rate, "embd_pdrop": c.dropout_rate,
            "attn_pdrop": c.attn_dropout_rate, "layer_norm_epsilon": c.norm_eps,
            "initializer_range": c.initializer_range, "scale_attn_weights": True,
            "tie_word_embeddings": c.tie_embeddings, "use_cache": True}


def gpt2_c_attn(hf: str, t: str, c: TransformerConfig, what: str) -> Rule:
    """Conv1D c_attn [d, 3·h·k] (or its bias [3·h·k]) <-> query/key/value [d, h, k] ([h, k])."""
    d, h, k = c.d_model, c.num_heads, c.head_dim
    lead = (d,) if what == "kernel" else ()
    hf_shape = lead + (3 * h * k,)
    shape = lead + (h, k)
    paths = tuple(split(f"{t}/{n}/{what}") for n in ("query", "key", "value"))
    return Rule(f"{hf}.{'weight' if what == 'kernel' else 'bias'}", hf_shape, paths,
                (shape,) * 3,
                lambda w: tuple(x.reshape(shape) for x in np.split(w, 3, axis=-1)),
                lambda ws: np.concatenate([x.reshape(lead + (h * k,)) for x in ws], axis=-1))


def gpt_layer_rules(hf: str, t: str, c: TransformerConfig) -> List[Rule]:
    """One layer `hf` (`h.{i}`) <-> t2t `t`, GPT-2's and GPT-1's alike: `ln_1` is the
    attention's norm and `ln_2` the MLP's, before them (GPT-2) or after (GPT-1); Conv1D
    kernels are [in, out]."""
    d, h, k, f = c.d_model, c.num_heads, c.head_dim, c.d_ff
    return [
        *layer_norm(f"{hf}.ln_1", f"{t}/self_attention_norm", d),
        gpt2_c_attn(f"{hf}.attn.c_attn", f"{t}/self_attention", c, "kernel"),
        gpt2_c_attn(f"{hf}.attn.c_attn", f"{t}/self_attention", c, "bias"),
        reshape(f"{hf}.attn.c_proj.weight", f"{t}/self_attention/out/kernel",
                (h * k, d), (h, k, d)),
        copy(f"{hf}.attn.c_proj.bias", f"{t}/self_attention/out/bias", (d,)),
        *layer_norm(f"{hf}.ln_2", f"{t}/mlp_norm", d),
        copy(f"{hf}.mlp.c_fc.weight", f"{t}/mlp/wi/kernel", (d, f)),
        copy(f"{hf}.mlp.c_fc.bias", f"{t}/mlp/wi/bias", (f,)),
        copy(f"{hf}.mlp.c_proj.weight", f"{t}/mlp/wo/kernel", (f, d)),
        copy(f"{hf}.mlp.c_proj.bias", f"{t}/mlp/wo/bias", (d,)),
    ]


def gpt2_rules(c: TransformerConfig, root: str, lm_head: bool = True) -> List[Rule]:
    """GPT-2's table under `root` ("transformer." in the LM head model): embeddings,
    pre-LN layers (Conv1D kernels [in, out]), the final norm, an untied lm_head (when
    `lm_head`)."""
    d = c.d_model
    rules = [copy(f"{root}wte.weight", "token_embedder/embedding", (c.vocab_size, d)),
             copy(f"{root}wpe.weight", "embedder/position_embedder/embedding",
                  (c.max_length, d))]
    for i in range(c.num_decoder_layers):
        rules += gpt_layer_rules(f"{root}h.{i}", f"layers/layer_{i}", c)
    rules += layer_norm(f"{root}ln_f", "final_norm", d)
    if root and lm_head and not c.tie_embeddings:    # GPT2Model (no root) has no LM head
        rules.append(linear("lm_head.weight", "logits_dense/kernel", (d, c.vocab_size)))
    return rules


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
    return import_params(state_dict, gpt2_rules(config, root), config, scan)


def gpt2_params_to_hf(config: TransformerConfig, params: Params,
                      architecture: str = "GPT2LMHeadModel") -> Dict[str, np.ndarray]:
    """Decoder params -> HF GPT2LMHeadModel state dict (`transformer.` names), or
    GPT2Model's (`architecture`; no prefix, no LM head)."""
    return export_params(params, gpt2_rules(config, GPT2_ROOTS[architecture]))


# HF class -> the prefix of its tensors (GPT2Model's have none, and no LM head)
GPT2_ROOTS = {"GPT2LMHeadModel": "transformer.", "GPT2Model": ""}


def load_gpt2(path, **overrides) -> Tuple[TransformerConfig, Params]:
    """HF GPT-2 directory -> (config, Decoder params)."""
    return load_directory(path, gpt2_config, gpt2_params_from_hf, overrides)


def save_gpt2(config: TransformerConfig, params: Params, path) -> None:
    """Write a GPT2LMHeadModel directory."""
    write_directory(path, gpt2_hf_config(config), gpt2_params_to_hf(config, params))


def lm_logits(model) -> Callable:
    """`HfFamily.logits` of GPT-2 and GPT-1: the LM logits [batch, length, vocab] of a
    right-padded batch."""
    return _lm_fn(model.config)


def decoder_hidden_states(model) -> Callable:
    """`HfFamily.hidden_states` of GPT-2 and GPT-1: the last layer's states (after GPT-2's
    final norm) [batch, length, d_model] of a right-padded batch."""
    return _lm_fn(model.config, True)


@functools.lru_cache(maxsize=None)
def _lm_fn(config: TransformerConfig, hidden: bool = False):
    from t2t.nn.stacks import Decoder

    def fn(params, ids, mask, types):
        return Decoder(config).apply({"params": params}, ids, decoder_segment_ids=mask,
                                     return_hidden=hidden)
    return jax.jit(fn)


# ----------------------------------------------------------------------- task heads
# HF class -> (its output Linear, whether it has a bias, the t2t module holding it)
GPT2_HEADS = {"GPT2ForSequenceClassification": ("score", False, "classifier"),
              "GPT2ForTokenClassification": ("classifier", True, "tagger")}


def gpt2_head_rules(c: TransformerConfig, architecture: str, outputs: int) -> List[Rule]:
    """A GPT-2 head class's table: the backbone under `decoder`, the output dense."""
    name, bias, module = GPT2_HEADS[architecture]
    return (nest("decoder", gpt2_rules(c, "transformer.", lm_head=False))
            + dense(name, f"{module}/dense", c.d_model, outputs, bias))


def _outputs(params, architecture: str) -> int:
    return int(tree(params)[GPT2_HEADS[architecture][2]]["dense"]["kernel"].shape[-1])


def _params_from_hf(state: StateDict, config: TransformerConfig, architecture: str) -> Params:
    if architecture not in GPT2_HEADS:
        return gpt2_params_from_hf(state, config)
    name = f"{GPT2_HEADS[architecture][0]}.weight"
    if name not in state:
        raise CheckpointMismatchError(f"this {architecture} checkpoint has no {name!r}")
    return import_params(state, gpt2_head_rules(config, architecture, state[name].shape[0]),
                         config, None)


def _to_hf(model) -> Tuple[dict, Dict[str, np.ndarray]]:
    hf_config = gpt2_hf_config(model.config, model.architecture)
    if model.architecture not in GPT2_HEADS:
        return hf_config, gpt2_params_to_hf(model.config, model.params, model.architecture)
    outputs = _outputs(model.params, model.architecture)
    return ({**hf_config, **head_config(model, outputs), "pad_token_id": model.pad_token_id},
            export_params(model.params, gpt2_head_rules(model.config, model.architecture,
                                                        outputs)))


def _logits(model) -> Callable:
    """LM logits; a head class's: [batch, labels] from each row's last real token (by the
    attention mask; HF finds it by pad_token_id: the same for right padding with pad ids
    nowhere else), or [batch, length, labels]."""
    if model.architecture not in GPT2_HEADS:
        return lm_logits(model)
    return _head_fn(model.config, model.architecture, _outputs(model.params,
                                                              model.architecture))


@functools.lru_cache(maxsize=None)
def _head_fn(config: TransformerConfig, architecture: str, outputs: int):
    from t2t.models.classifiers import DecoderTokenHead, LastTokenHead
    module = (LastTokenHead(config, outputs, bias=False)
              if architecture == "GPT2ForSequenceClassification"
              else DecoderTokenHead(config, outputs))

    def fn(params, ids, mask, types):
        return module.apply({"params": params}, ids, mask)
    return jax.jit(fn)


def _hidden_states(model) -> Callable:
    """The backbone's last states; of a head class, its `decoder`'s."""
    fn = _lm_fn(model.config, True)
    if model.architecture not in GPT2_HEADS:
        return fn
    return lambda params, ids, mask, types: fn(params["decoder"], ids, mask, types)


GPT2 = HfFamily("gpt2", tuple(GPT2_ROOTS) + tuple(GPT2_HEADS), gpt2_config, _params_from_hf,
                _to_hf, _logits, hidden_states=_hidden_states,
                read_as={"GPT2DoubleHeadsModel": "GPT2LMHeadModel"})
