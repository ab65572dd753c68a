"""Hugging Face BART (Lewis et al. 2020: `BartForConditionalGeneration`, `BartModel`) <->
t2t `t2t.nn.stacks.EncoderDecoder` params, and `BartForSequenceClassification` <-> t2t's
fine-tuning head `t2t.models.classifiers.EosPooledHead` (the same trunk plus `pooler` =
HF's `classification_head.dense` and `classifier` = its `out_proj`): learned positions
offset by 2 in both stacks, post-LN with an embedding LayerNorm (eps 1e-5, HF's
nn.LayerNorm default), GeLU MLPs with biases, tied embeddings and the `final_logits_bias`
[vocab] (a zero buffer in HF, a trained param in t2t). `BartModel` has no LM head and no
final_logits_bias. Decoding starts from `decoder_start_token_id` (2 = `</s>`),
`TransformerConfig.decoder_start_id`. HF's classification head drops out with
`classifier_dropout` (0.0 by default), t2t's with `dropout_rate`: equal in inference."""
from __future__ import annotations

import functools
from typing import Callable, Dict, List, Mapping, Tuple

import jax

import numpy as np

from t2t.convert.hf_common import (T2T_TO_HF_ACTIVATION, HfFamily, PretrainedError,
                                   activation, encoder_decoder_logits, require)
from t2t.convert.hf_files import load_directory, write_directory
from t2t.convert.hf_heads import TaskHeads, export_head, head_config, import_head, num_outputs
from t2t.convert.rules import (CheckpointMismatchError, Params, Rule, StateDict, copy,
                               export_params, import_params, layer_norm, linear, reshape)
from t2t.nn.config import TransformerConfig

# HF BartLearnedPositionalEmbedding: row = position + 2 (a fairseq legacy)
POSITION_OFFSET = 2
EOS_ID = 2        # HF BART's eos_token_id: the classification head pools at the last one
LAYER_NORM_EPS = 1e-5


def bart_config(d: Mapping) -> TransformerConfig:
    """HF `BartConfig` dict -> TransformerConfig."""
    d_model, heads = d["d_model"], d["encoder_attention_heads"]
    require_hf(d.get("decoder_attention_heads", heads) == heads
               and d.get("decoder_ffn_dim", d["encoder_ffn_dim"]) == d["encoder_ffn_dim"],
               "encoder and decoder with different heads or ffn sizes")
    require_hf(d.get("normalize_before", False) is False and d.get("add_final_layer_norm",
                                                                    False) is False,
               "pre-LN (mBART-style normalize_before / add_final_layer_norm)")
    require_hf(d.get("eos_token_id", EOS_ID) == EOS_ID, f"eos_token_id other than {EOS_ID}")
    rate = d.get("dropout", 0.1)
    return TransformerConfig(
        vocab_size=d["vocab_size"], d_model=d_model, num_heads=heads, head_dim=d_model // heads,
        d_ff=d["encoder_ffn_dim"], num_encoder_layers=d["encoder_layers"],
        num_decoder_layers=d["decoder_layers"],
        mlp_activations=(activation(d.get("activation_function", "gelu"), "BART"),),
        norm_type="layer", norm_eps=LAYER_NORM_EPS, pre_norm=False, use_bias=True,
        position_embedding="learned",
        max_length=d.get("max_position_embeddings", 1024) + POSITION_OFFSET,
        position_offset=POSITION_OFFSET, embedding_norm=True,
        scale_embeddings=bool(d.get("scale_embedding", False)),
        tie_embeddings=d.get("tie_word_embeddings", True), final_logits_bias=True,
        decoder_start_id=d.get("decoder_start_token_id", 2), attention_scale="sqrt",
        dropout_rate=rate, attention_dropout_rate=d.get("attention_dropout", 0.0),
        mlp_dropout_rate=d.get("activation_dropout", 0.0), kernel_init="normal",
        initializer_range=d.get("init_std", 0.02))


def require_hf(ok: bool, what: str) -> None:
    """ValueError unless `ok`: this HF BART config has no t2t form (`what` it has)."""
    if not ok:
        raise ValueError(f"BART config with {what} is not supported by t2t")


def bart_hf_config(config: TransformerConfig,
                   architecture: str = "BartForConditionalGeneration") -> dict:
    """TransformerConfig -> HF `BartConfig` dict (checks the config is a BART)."""
    c = config
    require(c.norm_type == "layer" and not c.pre_norm and c.use_bias and c.embedding_norm,
            "BART", "needs post-LN layer norms, biases and embedding_norm")
    require(c.norm_eps == LAYER_NORM_EPS, "BART", f"needs norm_eps={LAYER_NORM_EPS}")
    require(c.position_embedding == "learned" and c.position_offset == POSITION_OFFSET,
            "BART", f"needs learned positions with position_offset={POSITION_OFFSET}")
    require(c.attention_scale == "sqrt" and c.num_heads * c.head_dim == c.d_model, "BART",
            "needs attention_scale='sqrt' and num_heads * head_dim == d_model")
    require(c.tie_embeddings and c.share_input_embeddings and not c.scale_tied_logits
            and c.final_logits_bias, "BART",
            "needs tied, shared embeddings (unscaled) and final_logits_bias")
    require(len(c.mlp_activations) == 1 and c.mlp_activations[0] in T2T_TO_HF_ACTIVATION,
            "BART", f"cannot express mlp_activations={c.mlp_activations}")
    require(c.embedding_dim is None and not c.share_layers and not c.type_vocab_size
            and not c.share_encoder_decoder, "BART",
            "factorized/type embeddings and shared layers have no HF BART form")
    return {"architectures": [architecture], "model_type": "bart",
            "vocab_size": c.vocab_size, "d_model": c.d_model,
            "encoder_layers": c.num_encoder_layers, "decoder_layers": c.num_decoder_layers,
            "encoder_attention_heads": c.num_heads, "decoder_attention_heads": c.num_heads,
            "encoder_ffn_dim": c.d_ff, "decoder_ffn_dim": c.d_ff,
            "activation_function": T2T_TO_HF_ACTIVATION[c.mlp_activations[0]],
            "max_position_embeddings": c.max_length - POSITION_OFFSET,
            "scale_embedding": c.scale_embeddings, "dropout": c.dropout_rate,
            "attention_dropout": c.attn_dropout_rate, "activation_dropout": c.mlp_dropout_rate,
            "init_std": c.initializer_range, "is_encoder_decoder": True,
            "tie_word_embeddings": True, "use_cache": True, "pad_token_id": 1,
            "bos_token_id": 0, "eos_token_id": EOS_ID, "forced_eos_token_id": EOS_ID,
            "decoder_start_token_id": c.decoder_start_id}


def _attention(hf: str, t: str, c: TransformerConfig) -> List[Rule]:
    d, h, k = c.d_model, c.num_heads, c.head_dim
    rules = []
    for a, b in (("q", "query"), ("k", "key"), ("v", "value")):
        rules += [linear(f"{hf}.{a}_proj.weight", f"{t}/{b}/kernel", (d, h, k)),
                  reshape(f"{hf}.{a}_proj.bias", f"{t}/{b}/bias", (h * k,), (h, k))]
    return rules + [linear(f"{hf}.out_proj.weight", f"{t}/out/kernel", (h, k, d), n_in=2),
                    copy(f"{hf}.out_proj.bias", f"{t}/out/bias", (d,))]


def bart_rules(c: TransformerConfig, root: str, lm_head: bool) -> List[Rule]:
    """BART's table: the shared embedding, each stack's position table, embedding norm and
    post-LN layers under `root` ("model." with a head), and `final_logits_bias` if
    `lm_head` (the LM head itself is the tied embedding)."""
    d, f = c.d_model, c.d_ff
    aliases = (f"{root}encoder.embed_tokens.weight", f"{root}decoder.embed_tokens.weight")
    if lm_head:
        aliases += ("lm_head.weight",)
    rules = [copy(f"{root}shared.weight", "token_embedder/embedding", (c.vocab_size, d),
                  aliases=aliases)]
    for stack, n in (("encoder", c.num_encoder_layers), ("decoder", c.num_decoder_layers)):
        s = f"{root}{stack}"
        rules.append(copy(f"{s}.embed_positions.weight",
                          f"{stack}/embedder/position_embedder/embedding", (c.max_length, d)))
        rules += layer_norm(f"{s}.layernorm_embedding", f"{stack}/embedder/embedding_norm", d)
        for i in range(n):
            hf, t = f"{s}.layers.{i}", f"{stack}/layers/layer_{i}"
            rules += _attention(f"{hf}.self_attn", f"{t}/self_attention", c)
            rules += layer_norm(f"{hf}.self_attn_layer_norm", f"{t}/self_attention_norm", d)
            if stack == "decoder":
                rules += _attention(f"{hf}.encoder_attn", f"{t}/cross_attention", c)
                rules += layer_norm(f"{hf}.encoder_attn_layer_norm", f"{t}/cross_attention_norm",
                                    d)
            rules += [linear(f"{hf}.fc1.weight", f"{t}/mlp/wi/kernel", (d, f)),
                      copy(f"{hf}.fc1.bias", f"{t}/mlp/wi/bias", (f,)),
                      linear(f"{hf}.fc2.weight", f"{t}/mlp/wo/kernel", (f, d)),
                      copy(f"{hf}.fc2.bias", f"{t}/mlp/wo/bias", (d,))]
            rules += layer_norm(f"{hf}.final_layer_norm", f"{t}/mlp_norm", d)
    if lm_head:
        rules.append(reshape("final_logits_bias", "decoder/final_logits_bias/bias",
                             (1, c.vocab_size), (c.vocab_size,)))
    return rules


# HF class -> its table (`bart_rules`' root and lm_head arguments)
BART_TABLES: Dict[str, Dict] = {
    "BartForConditionalGeneration": {"root": "model.", "lm_head": True},
    "BartModel": {"root": "", "lm_head": False}}


def bart_params_from_hf(state_dict: StateDict, config: TransformerConfig,
                        architecture: str = "BartForConditionalGeneration") -> Params:
    """HF BART state dict (numpy) of `architecture` -> EncoderDecoder params (BartModel's
    has no final_logits_bias: zeros, as HF's buffer starts)."""
    table = BART_TABLES[architecture]
    root = table["root"]
    if "lm_head.weight" in state_dict and f"{root}shared.weight" in state_dict:
        if not np.array_equal(state_dict["lm_head.weight"], state_dict[f"{root}shared.weight"]):
            raise CheckpointMismatchError("BART ties the embeddings but lm_head.weight "
                                          "differs from shared.weight")
    state = dict(state_dict)
    if not table["lm_head"]:
        state["final_logits_bias"] = np.zeros((1, config.vocab_size), np.float32)
        rules = bart_rules(config, root, False) + bart_rules(config, root, True)[-1:]
    else:
        rules = bart_rules(config, root, True)
    return import_params(state, rules, config, None)


def bart_params_to_hf(config: TransformerConfig, params: Params,
                      architecture: str = "BartForConditionalGeneration"
                      ) -> Dict[str, np.ndarray]:
    """EncoderDecoder params -> HF BART state dict of `architecture`."""
    if not BART_TABLES[architecture]["lm_head"]:   # a BartModel has no final_logits_bias
        decoder = dict(params["decoder"])
        bias = np.asarray(decoder.pop("final_logits_bias", {"bias": np.zeros(1)})["bias"])
        if np.any(bias):
            raise PretrainedError(f"a {architecture} has no final_logits_bias but this "
                                  "model's is nonzero; save it as BartForConditionalGeneration")
        params = {**params, "decoder": decoder}
    out = export_params(params, bart_rules(config, **BART_TABLES[architecture]))
    if BART_TABLES[architecture]["lm_head"]:
        out["lm_head.weight"] = out["model.shared.weight"]
    return out


def load_bart(path, **overrides) -> Tuple[TransformerConfig, Params]:
    """HF BART directory -> (config, EncoderDecoder params)."""
    return load_directory(path, bart_config, bart_params_from_hf, overrides)


def save_bart(config: TransformerConfig, params: Params, path) -> None:
    """Write a BartForConditionalGeneration directory."""
    write_directory(path, bart_hf_config(config), bart_params_to_hf(config, params))


def _logits(model) -> Callable:
    """BartForConditionalGeneration's LM logits (`hf_common.encoder_decoder_logits`)."""
    return encoder_decoder_logits(
        model, bool(BART_TABLES.get(model.architecture, {}).get("lm_head")))


def _hidden_states(model) -> Callable:
    """HF `BartModel`'s `last_hidden_state` for input_ids alone: the decoder's final states
    [batch, length, d_model] over the ids shifted right (`decoder_start_id` first), as
    transformers makes a BartModel's decoder inputs when it is given none."""
    return _hidden_fn(model.config)


@functools.lru_cache(maxsize=None)
def _hidden_fn(config: TransformerConfig):
    from t2t.models.classifiers import shift_inputs_right
    from t2t.nn.stacks import EncoderDecoder

    def states(module, ids, mask):
        encoded = module.encode(ids, mask)
        return module.decoder(shift_inputs_right(ids, config.decoder_start_id), encoded, None,
                              mask, return_hidden=True)

    def fn(params, ids, mask, types):
        trunk = {k: params[k] for k in ("token_embedder", "encoder", "decoder")}
        return EncoderDecoder(config).apply({"params": trunk}, ids, mask, method=states)
    return jax.jit(fn)


# ----------------------------------------------------------------------- task head
SEQUENCE_CLASSIFICATION = "BartForSequenceClassification"
BART_HEADS = TaskHeads("Bart", lambda c: bart_rules(c, "model.", False),
                       {"SequenceClassification": ("classification_head.dense",
                                                   "classification_head.out_proj")})


def _params_from_hf(state: StateDict, config: TransformerConfig, architecture: str,
                    labels=None) -> Params:
    if architecture == SEQUENCE_CLASSIFICATION:
        return import_head(BART_HEADS, state, config, architecture, None, labels)
    return bart_params_from_hf(state, config, architecture)


def _to_hf(model) -> Tuple[dict, Dict[str, np.ndarray]]:
    hf_config = bart_hf_config(model.config, model.architecture)
    if model.architecture != SEQUENCE_CLASSIFICATION:
        return hf_config, bart_params_to_hf(model.config, model.params, model.architecture)
    outputs = num_outputs(model.params, model.architecture, BART_HEADS)
    return ({**hf_config, **head_config(model, outputs)},
            export_head(BART_HEADS, model.params, model.config, model.architecture))


def _all_logits(model) -> Callable:
    """LM logits, or a `BartForSequenceClassification`'s [batch, labels]."""
    if model.architecture != SEQUENCE_CLASSIFICATION:
        return _logits(model)
    fn = _head_fn(model.config, num_outputs(model.params, model.architecture, BART_HEADS))

    def logits(params, ids, mask, types, decoder_input_ids=None, decoder_attention_mask=None):
        if decoder_input_ids is not None or decoder_attention_mask is not None:
            raise PretrainedError(f"{SEQUENCE_CLASSIFICATION}.logits makes its decoder inputs "
                                  "itself (the input_ids shifted right): pass none")
        return fn(params, ids, mask)
    return logits


@functools.lru_cache(maxsize=None)
def _head_fn(config: TransformerConfig, outputs: int):
    from t2t.models.classifiers import EosPooledHead
    module = EosPooledHead(config, outputs, EOS_ID)
    return jax.jit(lambda params, ids, mask: module.apply({"params": params}, ids, mask))


BART = HfFamily("bart", tuple(BART_TABLES) + (SEQUENCE_CLASSIFICATION,), bart_config,
                _params_from_hf, _to_hf, _all_logits, pad_token_id=1,
                hidden_states=_hidden_states,
                logits_inputs=("decoder_input_ids", "decoder_attention_mask"))
