"""Longformer (Beltagy et al. 2020) as a t2t family: BERT's (RoBERTa's) module and wrappers
with `attention_pattern="sliding_window"` (t2t/nn/longformer.py), and the global tokens.

Which tokens are global is a property of the task, not of the module, so it travels with
the batch: the feature `global_attention_mask` [batch, length] (1 = global, HF's name and
meaning), made by the data side where a task wants its own choice. Without it each
fine-tuning head puts global attention where the paper (sec. 6) and transformers' task
classes do: classification and regression on the first token ([CLS]/<s>) of each packed
example; extractive QA on the question (the real tokens outside the context,
`SpanQA.context_mask`: the question and its separators, where transformers takes the tokens
before the first </s>); multiple choice on each choice's first token; tagging on none.
MLM pretraining has none (the paper's continued pretraining is local attention only).

The global tokens reach the Encoder through `global_attention` (a flax method interceptor
that hands every `Encoder` call in its scope `global_tokens`), so the BERT-shaped modules
(`BertModel`, `t2t.models.classifiers`' heads) and their parameter trees are used as they
are.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from t2t.models import classifiers
from t2t.nn.stacks import Encoder

GLOBAL_FEATURE = "global_attention_mask"
# where each head puts global attention without the feature
DEFAULT_GLOBAL = ("none", "first", "question")


@contextlib.contextmanager
def global_attention(global_tokens: Optional[jax.Array]) -> Iterator[None]:
    """Within: every `Encoder` call gets `global_tokens` ([..., length], reshaped to its
    input's shape: a multiple-choice head's [batch, choices, length] too)."""
    def inject(next_fun, args, kwargs, context):
        if (global_tokens is not None and isinstance(context.module, Encoder)
                and context.method_name == "__call__"):
            tokens = args[0] if args else kwargs["input_tokens"]
            kwargs = {**kwargs, "global_tokens": global_tokens.reshape(tokens.shape)}
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(inject):
        yield


def first_tokens(tokens: jax.Array, segment_ids: Optional[jax.Array]) -> jax.Array:
    """[..., length] bool: the first token of each (packed) example."""
    if segment_ids is None:
        return jnp.zeros(tokens.shape, bool).at[..., 0].set(True)
    before = jnp.pad(segment_ids[..., :-1], [(0, 0)] * (segment_ids.ndim - 1) + [(1, 0)])
    return (segment_ids > 0) & (segment_ids != before)


def global_tokens_of(batch, default: str, context_mask=None) -> Optional[jax.Array]:
    """The batch's `global_attention_mask`, else the head's `default` (`DEFAULT_GLOBAL`):
    "first" tokens, the "question" (real tokens outside `context_mask`) or "none"."""
    if GLOBAL_FEATURE in batch:
        return batch[GLOBAL_FEATURE]
    tokens, seg = batch["encoder_input_tokens"], batch.get("encoder_segment_ids")
    if default == "first":
        return first_tokens(tokens, seg)
    if default == "question":
        real = jnp.ones(tokens.shape, bool) if seg is None else seg > 0
        return real & ~context_mask
    return None


class GlobalAttention:
    """A fine-tuning wrapper's `apply` with the batch's global tokens (mix in first)."""

    global_default = "none"

    def apply(self, params, batch, rng=None, **kwargs):
        context = self.context_mask(batch) if self.global_default == "question" else None
        with global_attention(global_tokens_of(batch, self.global_default, context)):
            return super().apply(params, batch, rng, **kwargs)


class LongformerClassifier(GlobalAttention, classifiers.SequenceClassifier):
    """Sequence classification with global attention on [CLS] (paper sec. 6)."""

    global_default = "first"


class LongformerRegressor(GlobalAttention, classifiers.Regressor):
    global_default = "first"


class LongformerSpanQA(GlobalAttention, classifiers.SpanQA):
    """Extractive QA with global attention on the question tokens (paper sec. 6)."""

    global_default = "question"


class LongformerMultipleChoice(GlobalAttention, classifiers.MultipleChoice):
    global_default = "first"


class LongformerTagger(GlobalAttention, classifiers.TokenTagger):
    """Token tagging; global tokens only from the batch's feature."""


HEADS = {"classification": LongformerClassifier, "regression": LongformerRegressor,
         "tagging": LongformerTagger, "span_qa": LongformerSpanQA,
         "multiple_choice": LongformerMultipleChoice}
