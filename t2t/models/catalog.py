"""The built-in model families (`t2t.models.families` imports this module on its first
lookup): BERT and its successors, XLNet, ELMo, GPT-1/2 and T5.

RoBERTa and ALBERT are BERT's module and wrapper with other configs (configs/models/) and
vocabularies, GPT-1 GPT-2's; each is a variant with its own Hugging Face form. XLNet,
ELECTRA and DistilBERT are counted by the encoder formula: XLNet's query stream and
ELECTRA's generator are left out (as the trainer always counted them).
"""
from __future__ import annotations

from typing import Dict

import jax
import jax.numpy as jnp

from t2t.data import converters as conv
from t2t.data.characters import MAX_CHARS, ElmoConverter
from t2t.data.permutation_lm import PermutationLmConverter
from t2t.models import classifiers, decoding, elmo, gpt_format, longformer, xlnet_heads
from t2t.models.bert import BertModel, BertPretrainingModel
from t2t.models.distill import DistillationModel
from t2t.models.electra import ElectraDiscriminator, ElectraPretrainingModel
from t2t.models.families import DECODER, ENCODER, ENCODER_DECODER, Family, FlopFormula, register
from t2t.models.gpt import DecoderOnlyModel
from t2t.models.heads import TRUNK_ACTIVATION, PoolerStyle
from t2t.models.spanbert import SpanBertModel, SpanBertPretrainingModel
from t2t.models.t5 import EncoderDecoderModel
from t2t.models.xlnet import XLNet, XLNetPretrainingModel
from t2t.nn.stacks import Decoder, EncoderDecoder

Inputs = Dict[str, jax.Array]


def _tokens(batch: int, length: int) -> jax.Array:
    return jnp.ones((batch, length), jnp.int32)


def encoder_inputs(*, batch: int, length: int, max_predictions: int, **_) -> Inputs:
    return {"encoder_input_tokens": _tokens(batch, length),
            "token_type_ids": _tokens(batch, length) * 0,
            "masked_positions": jnp.zeros((batch, max_predictions), jnp.int32)}


def token_inputs(*, batch: int, length: int, **_) -> Inputs:
    return {"input_tokens": _tokens(batch, length)}


def encoder_decoder_inputs(*, batch: int, length: int, target_length: int, **_) -> Inputs:
    return {"encoder_input_tokens": _tokens(batch, length),
            "decoder_input_tokens": _tokens(batch, target_length)}


def decoder_inputs(*, batch: int, length: int, **_) -> Inputs:
    return {"decoder_input_tokens": _tokens(batch, length)}


def elmo_inputs(*, batch: int, length: int, **_) -> Inputs:
    # parameter shapes do not depend on the characters a token has
    return {"token_ids": _tokens(batch, length),
            "char_ids": jnp.ones((batch, length, MAX_CHARS), jnp.int32)}


ENCODER_HEADS = {"classification": classifiers.SequenceClassifier,
                 "regression": classifiers.Regressor, "tagging": classifiers.TokenTagger,
                 "span_qa": classifiers.SpanQA, "multiple_choice": classifiers.MultipleChoice}

# The pooled heads of each family's Hugging Face task classes (BERT's and ALBERT's: the
# pretrained pooler). RoBERTa's classification head drops out before its dense + tanh
# (its multiple choice reads the pooler); ELECTRA's uses gelu (its multiple choice: a gelu
# summary, no dropout first); DistilBERT's pre_classifier relu.
_ROBERTA = PoolerStyle(dropout_first=True)
_ELECTRA = PoolerStyle("gelu", dropout_first=True)
_DISTILBERT = PoolerStyle("relu")
_BIGBIRD = PoolerStyle(TRUNK_ACTIVATION, dropout_first=True)    # HF's hidden_act

BERT = register(Family(
    "bert", "BERT", BertModel, BertPretrainingModel, encoder_inputs, conv.EncoderConverter,
    ENCODER, heads=ENCODER_HEADS, masked_lm=True, tokenizer="wordpiece",
    hf_model_types=("bert",)))
register(BERT.variant(name="roberta", title="RoBERTa", tokenizer="byte_bpe",
                      hf_model_types=("roberta",),
                      head_styles={"classification": _ROBERTA, "regression": _ROBERTA}))
register(BERT.variant(name="longformer", title="Longformer", tokenizer="byte_bpe",  # RoBERTa's
                      hf_model_types=("longformer",), heads=longformer.HEADS,
                      head_styles={"classification": _ROBERTA, "regression": _ROBERTA}))
register(BERT.variant(name="albert", title="ALBERT", tokenizer="sentencepiece",
                      hf_model_types=("albert",)))
register(BERT.variant(name="bigbird", title="BigBird", tokenizer="sentencepiece",
                      hf_model_types=("big_bird",),    # attention_pattern: t2t/nn/block_sparse.py
                      head_styles={"classification": _BIGBIRD, "regression": _BIGBIRD}))
register(Family(
    "electra", "ELECTRA", ElectraDiscriminator, ElectraPretrainingModel, token_inputs,
    conv.EncoderConverter, ENCODER, generator=True, masked_lm=True, tokenizer="wordpiece",
    hf_model_types=("electra",),
    head_styles={"classification": _ELECTRA, "regression": _ELECTRA,
                 "multiple_choice": PoolerStyle("gelu")}))
register(Family(
    "spanbert", "SpanBERT", SpanBertModel, SpanBertPretrainingModel, encoder_inputs,
    conv.EncoderConverter, ENCODER, masked_lm=True, tokenizer="wordpiece"))
register(Family(   # the student's module; its size follows the teacher's
    "distill", "DistilBERT", BertModel, DistillationModel, encoder_inputs,
    conv.EncoderConverter, ENCODER, teacher=True, masked_lm=True, tokenizer="wordpiece",
    hf_model_types=("distilbert",),
    head_styles={kind: _DISTILBERT for kind in ("classification", "regression",
                                                "multiple_choice")}))
register(Family(   # Transformer-XL backbone and tied LM head
    "xlnet", "XLNet", XLNet, XLNetPretrainingModel, token_inputs, PermutationLmConverter,
    ENCODER, heads={"classification": xlnet_heads.XLNetSequenceClassifier,
                    "multiple_choice": xlnet_heads.XLNetMultipleChoice},
    hf_model_types=("xlnet",)))
register(Family(   # the biLM; its config is an ElmoConfig
    "elmo", "ELMo", elmo.BiLM, elmo.ElmoModel, elmo_inputs, ElmoConverter,
    FlopFormula(decoder=True, forward=elmo.forward_flops), config=elmo.ElmoConfig,
    tokenizer="words"))
T5 = register(Family(
    "t5", "T5", EncoderDecoder, EncoderDecoderModel, encoder_decoder_inputs,
    conv.EncDecConverter, ENCODER_DECODER, decoding=decoding.ENCODER_DECODER,
    hf_model_types=("t5",)))
register(T5.variant(name="bart", title="BART", tokenizer="byte_bpe", hf_model_types=("bart",),
                   heads={"classification": classifiers.EosClassifier,
                          "regression": classifiers.EosRegressor},
                   head_styles={"classification": classifiers.BART_HEAD,
                                "regression": classifiers.BART_HEAD}))
GPT = register(Family(
    "gpt", "GPT-2", Decoder, DecoderOnlyModel, decoder_inputs, conv.LMConverter, DECODER,
    prefix_converter=conv.PrefixLMConverter, decoding=decoding.DECODER_ONLY,
    heads={"last_token_classification": classifiers.LastTokenClassifier,
           "gpt_format": gpt_format.GptFormatClassifier},
    tokenizer="byte_bpe", hf_model_types=("gpt2",)))
register(GPT.variant(name="gpt1", title="GPT-1", tokenizer="bpe",
                     hf_model_types=("openai-gpt",)))
