"""XLNet fine-tuning heads: sequence classification and multiple choice (Yang et al. 2019;
the released code's `summarize_sequence` with summary_type "last", as Hugging Face's
`XLNetForSequenceClassification` / `XLNetForMultipleChoice` do it).

XLNet classifies from the *last* position: its inputs are `A [SEP] B [SEP] [CLS]`, padded on
the left, with segment ids A = 0, B = 1, [CLS] = 2 (the released run_classifier.py's layout),
so the [CLS] is always at index -1. The sequence summary takes that state, projects it
(d -> d), applies tanh and dropout, and a linear layer gives the logits.

The fine-tuning pipeline builds BERT rows (`[CLS] A [SEP] (B [SEP])`, right padded;
`t2t.data.finetune_tasks.classification_examples`, `t2t.data.multiple_choice`); the model
wrappers here rearrange them into XLNet's layout (`xlnet_layout`) before the module, so
training, evaluation and `t2t infer` run unchanged.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from t2t.errors import ConfigError
from t2t.models.base import Batch, LossConfig
from t2t.models.classifiers import MultipleChoice, Params, SequenceClassifier, FineTuningModel
from t2t.models.xlnet import XLNet, XLNetOptions
from t2t.nn.config import TransformerConfig
from t2t.nn.dense import Dense, kernel_init
from t2t.nn.dropout import Dropout

SEG_ID_CLS = 2   # the [CLS]'s segment id in the released code (data_utils.py)
SEG_ID_PAD = 4   # padding's (masked out anyway)


def xlnet_layout(tokens: jax.Array, segment_ids: jax.Array, types: jax.Array
                 ) -> Tuple[jax.Array, jax.Array, jax.Array]:
    """BERT rows -> XLNet rows: `[CLS] A [SEP] (B [SEP]) pad…` -> `pad… A [SEP] (B [SEP])
    [CLS]` (the [CLS] moved to the end, the row shifted right against it).

    tokens, segment_ids (> 0 on real tokens, one example per row), types (A 0 / B 1):
    [..., length] -> (tokens, attention mask (1 = token), token types with the [CLS] at
    `SEG_ID_CLS` and padding at `SEG_ID_PAD`), each [..., length]. A row of n tokens reads
    its position j >= length - n from (j - (length - n) + 1) mod n, and its padding from
    the original row's padding (n + j), so the pad id is kept.
    """
    length = tokens.shape[-1]
    n = jnp.sum(segment_ids > 0, axis=-1, keepdims=True)                 # [..., 1]
    j = jnp.arange(length)
    start = length - n
    real = j >= start                                                    # [..., length]
    src = jnp.where(real, (j - start + 1) % jnp.maximum(n, 1), jnp.minimum(n + j, length - 1))
    take = lambda x: jnp.take_along_axis(x, src, axis=-1)  # noqa: E731
    out_types = jnp.where(real, take(types), SEG_ID_PAD)
    out_types = jnp.where(real & (j == length - 1), SEG_ID_CLS, out_types)
    return take(tokens), real.astype(jnp.int32), out_types.astype(types.dtype)


class SequenceSummary(nn.Module):
    """HF's summary_type "last" with a projection: dropout(tanh(W · h[:, -1] + b)).
    [batch, length, d] -> [batch, d]."""

    config: TransformerConfig
    dropout_rate: float = 0.1

    @nn.compact
    def __call__(self, hidden: jax.Array, *, deterministic: bool = True) -> jax.Array:
        cfg = self.config
        dense = Dense(cfg.d_model, ("embed", None), use_bias=True, dtype=cfg.compute_dtype,
                      param_dtype=cfg.params_dtype, kernel_init=kernel_init(cfg), name="summary")
        summary = jnp.tanh(dense(hidden[:, -1]))
        return Dropout(self.dropout_rate)(summary, deterministic=deterministic)


class XLNetClassifierHead(nn.Module):
    """`transformer` (XLNet without its LM head) -> `sequence_summary` -> `logits_proj`.

    Inputs in XLNet's layout (HF's arguments): input_tokens, attention_mask, token_type_ids
    [batch, length] -> logits [batch, num_outputs]; or [batch, choices, length] (multiple
    choice, `num_outputs` = 1) -> [batch, choices].
    """

    config: TransformerConfig
    num_outputs: int = 2
    options: XLNetOptions = XLNetOptions()

    def setup(self):
        cfg = self.config
        self.transformer = XLNet(cfg, self.options, lm_head=False)
        self.sequence_summary = SequenceSummary(cfg, self.options.summary_last_dropout)
        self.logits_proj = Dense(self.num_outputs, ("embed", None), use_bias=True,
                                 dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype,
                                 kernel_init=kernel_init(cfg))

    def __call__(self, input_tokens: jax.Array, attention_mask: Optional[jax.Array] = None,
                 token_type_ids: Optional[jax.Array] = None, *,
                 deterministic: bool = True) -> jax.Array:
        lead = input_tokens.shape[:-1]
        flat = lambda x: None if x is None else x.reshape(-1, x.shape[-1])  # noqa: E731
        hidden, _ = self.transformer.encode(flat(input_tokens), flat(attention_mask),
                                            flat(token_type_ids),
                                            deterministic=deterministic)     # [b', l, d]
        summary = self.sequence_summary(hidden, deterministic=deterministic)  # [b', d]
        logits = self.logits_proj(summary)                                    # [b', outputs]
        if len(lead) == 2:                       # multiple choice: [b, c]
            return logits.reshape(lead)
        return logits


class _XLNetInputs(FineTuningModel):
    """Feeds `XLNetClassifierHead` from the pipeline's BERT rows (`xlnet_layout`); a
    pretrained XLNet tree (a t2t `XLNetPretrainingModel` checkpoint) goes under
    `transformer` (its `lm_bias` is unused)."""

    family = "xlnet"
    input_features = ("encoder_input_tokens", "encoder_segment_ids", "token_type_ids")
    pretrained_prefix = ("transformer",)
    required_modules = ("transformer",)

    def _inputs(self, batch: Batch) -> Dict[str, jax.Array]:
        tokens = batch["encoder_input_tokens"]
        segments = batch.get("encoder_segment_ids")
        segments = jnp.ones_like(tokens) if segments is None else segments
        types = batch.get("token_type_ids")
        types = jnp.zeros_like(tokens) if types is None else types
        tokens, mask, types = xlnet_layout(tokens, segments, types)
        return {"input_tokens": tokens, "attention_mask": mask, "token_type_ids": types}


class XLNetSequenceClassifier(_XLNetInputs, SequenceClassifier):
    """`SequenceClassifier`'s loss, score and predict over `XLNetClassifierHead` (which
    classifies from the last position: `pooling` and `bilstm_units` are BERT's only)."""

    def __init__(self, config: TransformerConfig, num_classes: int,
                 options: XLNetOptions = XLNetOptions(),
                 loss: LossConfig = LossConfig(z_loss=0.0), pretrained: Optional[Params] = None,
                 pooling: str = "cls", bilstm_units: Optional[int] = None):
        if pooling != "cls" or bilstm_units:
            raise ConfigError("the XLNet head classifies from its last position: no pooling "
                              "or bilstm_units")
        FineTuningModel.__init__(self, config, XLNetClassifierHead(config, num_classes, options),
                                 loss, pretrained)
        self.num_classes = num_classes


class XLNetMultipleChoice(_XLNetInputs, MultipleChoice):
    """`MultipleChoice`'s loss, score and predict over `XLNetClassifierHead` (one logit per
    choice; inputs [batch, choices, length])."""

    def __init__(self, config: TransformerConfig, num_choices: int,
                 options: XLNetOptions = XLNetOptions(),
                 loss: LossConfig = LossConfig(z_loss=0.0), pretrained: Optional[Params] = None):
        FineTuningModel.__init__(self, config, XLNetClassifierHead(config, 1, options), loss,
                                 pretrained)
        self.num_choices = num_choices
