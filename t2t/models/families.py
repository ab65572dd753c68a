"""Which flax module serves each model family, with example inputs and parameter counts."""
from __future__ import annotations

from typing import Callable, Dict, Mapping, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from t2t.data.characters import MAX_CHARS
from t2t.models.base import LossConfig, Model
from t2t.models.bert import BertModel, BertPretrainingModel
from t2t.models.distill import DistillationModel
from t2t.models.electra import ElectraDiscriminator, ElectraPretrainingModel
from t2t.models.elmo import BiLM, ElmoModel
from t2t.models.gpt import DecoderOnlyModel
from t2t.models.spanbert import SpanBertModel, SpanBertPretrainingModel
from t2t.models.t5 import EncoderDecoderModel
from t2t.models.xlnet import XLNet, XLNetPretrainingModel
from t2t.nn.config import TransformerConfig
from t2t.nn.stacks import Decoder, EncoderDecoder

FAMILIES = ("bert", "t5", "gpt", "electra", "spanbert", "distill", "xlnet")


def make_module(family: str, config: TransformerConfig) -> nn.Module:
    """bert -> BertModel (encoder + heads), t5 -> EncoderDecoder, gpt -> Decoder,
    electra -> the discriminator (the model fine-tuned, and the one the papers count)."""
    if family == "bert":
        return BertModel(config)
    if family == "electra":
        return ElectraDiscriminator(config)
    if family == "spanbert":
        return SpanBertModel(config)
    if family == "distill":      # the student; its size follows the teacher's
        return BertModel(config)
    if family == "t5":
        return EncoderDecoder(config)
    if family == "gpt":
        return Decoder(config)
    if family == "xlnet":        # Transformer-XL backbone and tied LM head (t2t/models/xlnet.py)
        return XLNet(config)
    if family == "elmo":         # the biLM; `config` is an ElmoConfig (t2t/models/elmo.py)
        return BiLM(config)
    raise ValueError(f"unknown model family {family!r}; choose one of {list(FAMILIES)}")


MODEL_CLASSES: Dict[str, Callable[..., Model]] = {
    "bert": BertPretrainingModel, "t5": EncoderDecoderModel, "gpt": DecoderOnlyModel,
    "electra": ElectraPretrainingModel, "spanbert": SpanBertPretrainingModel,
    "distill": DistillationModel, "xlnet": XLNetPretrainingModel, "elmo": ElmoModel}


def make_model(family: str, config: TransformerConfig, loss: LossConfig | None = None,
               teacher=None, classes: Optional[Mapping[str, Callable[..., Model]]] = None
               ) -> Model:
    """The family's model wrapper (init / loss_fn / score) around its module; 'distill' is
    a DistilBERT student of `teacher` = (config, params), whose size follows the teacher's.
    `classes` overrides entries of `MODEL_CLASSES` (the run layer passes gin-configurable
    versions, t2t/run/configurables.py)."""
    classes = {**MODEL_CLASSES, **(classes or {})}
    if family not in classes:
        raise ValueError(f"unknown model family {family!r}; choose one of {list(FAMILIES)}")
    if family == "distill":
        if teacher is None:
            raise ValueError("the 'distill' family needs a teacher: bind TEACHER (see "
                             "configs/experiments/distilbert_tiny_bible.gin)")
        return classes[family](teacher, loss or LossConfig(z_loss=0.0))
    return classes[family](config) if loss is None else classes[family](config, loss)


def example_inputs(family: str, batch: int = 2, length: int = 16,
                   target_length: int = 8, max_predictions: int = 4) -> Dict[str, jax.Array]:
    """Keyword inputs of the right shapes for `make_module(family, ...)`."""
    tokens = lambda n: jnp.ones((batch, n), jnp.int32)  # noqa: E731
    if family in ("bert", "spanbert", "distill"):
        return {"encoder_input_tokens": tokens(length), "token_type_ids": tokens(length) * 0,
                "masked_positions": jnp.zeros((batch, max_predictions), jnp.int32)}
    if family in ("electra", "xlnet"):
        return {"input_tokens": tokens(length)}
    if family == "t5":
        return {"encoder_input_tokens": tokens(length),
                "decoder_input_tokens": tokens(target_length)}
    if family == "gpt":
        return {"decoder_input_tokens": tokens(length)}
    if family == "elmo":         # parameter shapes do not depend on the characters a token
        return {"token_ids": tokens(length), "char_ids": jnp.ones((batch, length, MAX_CHARS),
                                                                  jnp.int32)}
    raise ValueError(f"unknown model family {family!r}; choose one of {list(FAMILIES)}")


def abstract_params(family: str, config: TransformerConfig):
    """Parameter shapes (logical boxes removed) without allocating them."""
    module = make_module(family, config)
    inputs = example_inputs(family)
    shapes = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), **inputs))
    return nn.unbox(shapes["params"])


def count_params(family: str, config: TransformerConfig) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(
        abstract_params(family, config))))
