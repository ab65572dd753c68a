"""Task heads on top of the stacks: BERT pooler, MLM head, classifiers."""
from __future__ import annotations

import dataclasses
from typing import Optional

import flax.linen as nn
import jax

from t2t.nn.config import TransformerConfig
from t2t.nn.dense import Dense, kernel_init
from t2t.nn.dropout import Dropout
from t2t.nn.embed import Embed
from t2t.nn.mlp import get_activation
from t2t.nn.norms import make_norm


@dataclasses.dataclass(frozen=True)
class PoolerStyle:
    """How a family's pooled fine-tuning head turns the first token's state into the row
    vector its classifier reads: `activation`(W · h[CLS] + b), with dropout before the
    dense too when `dropout_first` (the classifier's dropout always follows it).

    BERT and ALBERT: the pretrained pooler (tanh); RoBERTa's classification head: the same
    dense + tanh with dropout before it; ELECTRA's: gelu with dropout before (its multiple
    choice summary: gelu); DistilBERT's pre_classifier: relu; BigBird's classification
    head: the trunk's own activation (`TRUNK_ACTIVATION`: `mlp_activations[0]`, HF's
    `hidden_act`) with dropout before. A family's entry in `t2t.models.families` chooses
    its style per task kind (`Family.head_styles`)."""

    activation: str = "tanh"
    dropout_first: bool = False


BERT_POOLER = PoolerStyle()
TRUNK_ACTIVATION = "trunk"    # a PoolerStyle activation: the config's first MLP activation


class Pooler(nn.Module):
    """BERT pooler: tanh(W · h[CLS] + b) (another `activation` for other families, see
    `PoolerStyle`; `TRUNK_ACTIVATION`: the config's first MLP activation).
    [batch, length, d] -> [batch, d]."""

    config: TransformerConfig
    activation: str = "tanh"

    @nn.compact
    def __call__(self, hidden: jax.Array) -> jax.Array:
        cfg = self.config
        dense = Dense(cfg.d_model, ("embed", None), use_bias=True, dtype=cfg.compute_dtype,
                      param_dtype=cfg.params_dtype, kernel_init=kernel_init(cfg), name="dense")
        name = (cfg.mlp_activations[0] if self.activation == TRUNK_ACTIVATION
                else self.activation)
        return get_activation(name)(dense(hidden[:, 0]))


class MlmHead(nn.Module):
    """BERT masked-LM head: dense + gelu + LayerNorm, then the tied token table + bias.

    hidden [batch, p, d] (already gathered at the masked positions) -> logits [batch, p, vocab].
    """

    config: TransformerConfig
    activation: str = "gelu"

    @nn.compact
    def __call__(self, hidden: jax.Array, table: Embed) -> jax.Array:
        cfg = self.config
        width = cfg.embedding_dim or cfg.d_model
        h = Dense(width, ("embed", None), use_bias=True, dtype=cfg.compute_dtype,
                  param_dtype=cfg.params_dtype, kernel_init=kernel_init(cfg),
                  name="transform")(hidden)
        h = make_norm(cfg, "transform_norm")(get_activation(self.activation)(h))
        bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, ("vocab",)),
                          (cfg.vocab_size,), cfg.params_dtype)
        return table.attend(h) + bias.astype(cfg.compute_dtype)


class Classifier(nn.Module):
    """Dropout + dense to `num_classes` (`use_bias=False`: no bias, as GPT-2's `score`).
    [batch, d] -> [batch, num_classes]."""

    config: TransformerConfig
    num_classes: int
    dropout_rate: Optional[float] = None
    use_bias: bool = True

    @nn.compact
    def __call__(self, x: jax.Array, *, deterministic: bool = True) -> jax.Array:
        cfg = self.config
        rate = cfg.dropout_rate if self.dropout_rate is None else self.dropout_rate
        x = Dropout(rate)(x, deterministic=deterministic)
        return Dense(self.num_classes, ("embed", None), use_bias=self.use_bias,
                     dtype=cfg.compute_dtype,
                     param_dtype=cfg.params_dtype, kernel_init=kernel_init(cfg), name="dense")(x)
