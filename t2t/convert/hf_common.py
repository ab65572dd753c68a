"""What every Hugging Face family's converter shares: `HfFamily`, the description of one
`model_type` that `t2t.convert.pretrained` loads and saves through; activation names both
ways; the one-line refusal of a config HF cannot express; `PretrainedError`."""
from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import numpy as np

from t2t.errors import UserError
from t2t.models import families
from t2t.nn.config import TransformerConfig

_log = logging.getLogger(__name__)

HF_TO_T2T_ACTIVATION = {
    "gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh", "relu": "relu", "silu": "silu", "swish": "silu",
    "sigmoid": "sigmoid", "tanh": "tanh", "linear": "linear"}
T2T_TO_HF_ACTIVATION = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu",
                        "sigmoid": "sigmoid", "tanh": "tanh", "linear": "linear"}


class PretrainedError(UserError, ValueError):
    """A directory t2t cannot load or a model it cannot save (one readable line)."""


def activation(name: str, family: str) -> str:
    """An HF activation name -> t2t's (ValueError naming `family` if it has none)."""
    if name not in HF_TO_T2T_ACTIVATION:
        raise ValueError(f"{family}: activation {name!r} has no t2t equivalent; "
                         f"supported: {sorted(HF_TO_T2T_ACTIVATION)}")
    return HF_TO_T2T_ACTIVATION[name]


def require(ok: bool, family: str, what: str) -> None:
    """ValueError unless `ok`: this config has no HF `family` form (`what` says why)."""
    if not ok:
        raise ValueError(f"this TransformerConfig cannot be written as a Hugging Face "
                         f"{family} checkpoint: {what}")


def common_checks(c: TransformerConfig, family: str) -> None:
    """What BERT, GPT-2 and GPT-1 checkpoints all need of a config."""
    require(c.position_offset == 0, family, "has no position_offset (RoBERTa's)")
    require(c.attention_scale == "sqrt", family, "needs attention_scale='sqrt'")
    require(c.num_heads * c.head_dim == c.d_model, family,
            f"needs num_heads * head_dim == d_model ({c.num_heads}*{c.head_dim} != {c.d_model})")
    require(c.embedding_dim is None and not c.scale_embeddings and not c.share_layers, family,
            "factorized/scaled embeddings and shared layers have no HF form")


@dataclasses.dataclass(frozen=True)
class HfFamily:
    """One Hugging Face `model_type` t2t converts, both ways.

    The hooks see a `t2t.convert.pretrained.PretrainedModel` (`model`) with plain numpy
    params; `to_hf` and `logits` choose by the HF class (`model.architecture`) and the heads
    its tree holds.
    """

    model_type: str
    # the HF classes it reads and writes; the first is written by default and read when
    # config.json names none
    classes: Tuple[str, ...]
    config_from_hf: Callable[[Mapping], TransformerConfig]
    # (state dict, config, architecture) -> the t2t tree (its rule tables)
    params_from_hf: Callable[[Mapping[str, np.ndarray], TransformerConfig, str], Any]
    to_hf: Callable[[Any], Tuple[dict, Dict[str, np.ndarray]]]   # -> (config.json, tensors)
    # model -> jitted (params, input_ids, attention_mask, token_type_ids, **inputs) -> HF's
    # logits, `inputs` among `logits_inputs`
    logits: Callable[[Any], Callable]
    pad_token_id: int = 0                    # of a model that names none
    options_from_hf: Optional[Callable[[Mapping], Any]] = None   # settings outside the config
    # (config.json, architecture): ValueError when t2t cannot read that class's settings
    check: Optional[Callable[[Mapping, str], None]] = None
    # (config, t2t training tree, generator config) -> {name: (architecture, config, tree)}
    # of the HF models the tree holds (default: one, the whole tree)
    split: Optional[Callable[..., Dict[str, Tuple[Optional[str], Any, Any]]]] = None
    # model -> jitted (params, input_ids, attention_mask, token_type_ids) -> HF's
    # `last_hidden_state` of the base class [batch, length, d_model] (T5: the encoder's)
    hidden_states: Optional[Callable[[Any], Callable]] = None
    # HF classes whose own head t2t does not map yet, read as the class named (the backbone
    # and what heads it shares): their other tensors are named in one "ignored" log line
    read_as: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # inputs `logits` takes besides ids, mask and token types (T5: decoder_input_ids)
    logits_inputs: Tuple[str, ...] = ()


def registry_family(model_type: str) -> "families.Family":
    """The t2t family (`t2t.models.families`) whose Hugging Face form `model_type` is."""
    return next(f for f in families.registered() if model_type in f.hf_model_types)


def check_class(family: "HfFamily", architecture: str) -> None:
    """PretrainedError (one line) unless `family` reads the HF class `architecture`."""
    if architecture not in family.classes:
        raise PretrainedError(f"{family.model_type} class {architecture!r} is not supported; "
                              f"t2t reads {list(family.classes)}")


def class_to_read(family: "HfFamily", architecture: str) -> str:
    """The class of ``family`` whose tables read a checkpoint of ``architecture``: itself, or
    (logged, one line) the class `read_as` names for a head t2t does not map yet; a
    PretrainedError (one line) for any other class."""
    if architecture in family.classes:
        return architecture
    if architecture in family.read_as:
        read = family.read_as[architecture]
        _log.warning("%s: t2t reads it as %s (its own head is not mapped yet)", architecture,
                     read)
        return read
    check_class(family, architecture)
    return architecture


def encoder_decoder_logits(model, has_lm_head: bool, no_head_hint: str = "") -> Callable:
    """An HF encoder-decoder's (T5's, BART's) LM logits [batch, target, vocab]: (params,
    input_ids, attention_mask, token_type_ids, decoder_input_ids=, decoder_attention_mask=)."""
    if not has_lm_head:
        raise PretrainedError(f"a {model.architecture} has no LM head, so no logits"
                              f"{no_head_hint}")
    fn = _encoder_decoder_fn(model.config)

    def logits(params, ids, mask, types, decoder_input_ids=None, decoder_attention_mask=None):
        if decoder_input_ids is None:
            raise PretrainedError(f"{model.architecture}.logits needs decoder_input_ids "
                                  "[batch, target] (HF's: the targets shifted right, "
                                  "decoder_start_token_id first)")
        return fn(params, ids, mask, decoder_input_ids, decoder_attention_mask)
    return logits


@functools.lru_cache(maxsize=None)
def _encoder_decoder_fn(config: TransformerConfig) -> Callable:
    import jax

    from t2t.nn.stacks import EncoderDecoder

    def fn(params, ids, mask, decoder_ids, decoder_mask):
        return EncoderDecoder(config).apply({"params": params}, ids, decoder_ids, mask,
                                            decoder_mask)
    return jax.jit(fn)
