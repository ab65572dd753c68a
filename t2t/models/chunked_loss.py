"""`TransformerConfig.loss_chunk_tokens`: the output projection and cross entropy of T5, GPT
and BERT's MLM over chunks of positions (`losses.chunked_cross_entropy`), so that the
[tokens, vocab] logits never exist at once.

The model runs up to its last hidden state; the output layer is then applied to one chunk
at a time as a module of its own (`DecoderHead`, `MlmProjection`) over the model's own
parameters (their subtrees, not copies: the gradients reach the model's leaves).
"""
from __future__ import annotations

from typing import Any, Dict, Tuple

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from t2t.models import losses
from t2t.models.heads import MlmHead
from t2t.nn.config import TransformerConfig
from t2t.nn.embed import token_embed
from t2t.nn.stacks import output_logits


class DecoderHead(nn.Module):
    """The decoder's output layer alone: hidden [..., d_model] -> logits [..., vocab]
    (`output_logits`: the tied table or `logits_dense`), its parameters named as in the
    decoder's scope plus the token table."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, hidden: jax.Array) -> jax.Array:
        return output_logits(self.config, hidden, token_embed(self.config, "token_embedder"))


class MlmProjection(nn.Module):
    """BERT's MLM head alone (transform, norm, tied table + bias): hidden [..., d_model]
    -> logits [..., vocab], parameters named as in BertModel."""

    config: TransformerConfig
    activation: str = "gelu"

    @nn.compact
    def __call__(self, hidden: jax.Array) -> jax.Array:
        table = token_embed(self.config, "token_embedder")
        return MlmHead(self.config, self.activation, name="mlm_head")(hidden, table)


def token_loss(model, head: nn.Module, head_params, hidden: jax.Array, targets: jax.Array,
               weights: jax.Array) -> Tuple[jax.Array, Dict[str, jax.Array]]:
    """`Model.token_loss` (loss, {"loss", "z_loss", "num_tokens", "accuracy"}) from the
    last hidden state [b, l, d], `head` applied a chunk at a time."""
    loss_cfg = model.loss
    loss, z, weight_sum, acc = losses.chunked_cross_entropy(
        lambda h: head.apply({"params": head_params}, h), hidden, targets, weights,
        chunk_tokens=model.config.loss_chunk_tokens, z_loss=loss_cfg.z_loss,
        label_smoothing=loss_cfg.label_smoothing,
        loss_normalizing_factor=loss_cfg.loss_normalizing_factor)
    return loss, {"loss": loss, "z_loss": z, "num_tokens": weight_sum, "accuracy": acc}


@flax.struct.dataclass
class DecoderHidden:
    """What T5's and GPT's loss reads in place of logits under `loss_chunk_tokens`: the
    decoder's final hidden state [b, l, d] and its output layer's parameters."""

    hidden: jax.Array
    head_params: Any


class ChunkedDecoderLoss:
    """For T5's and GPT's `Model` (before `Model` in the bases): with
    `config.loss_chunk_tokens`, `apply_with_router_losses` gives a `DecoderHidden` instead
    of logits and `token_loss` chunks the projection and loss over it; `Model.loss_fn`
    itself is unchanged (the config allows no router loss or ponder cost with chunks)."""

    def decoder_hidden(self, params, batch, rng) -> jax.Array:
        """The decoder's final hidden state [b, l, d] (the family's own forward pass)."""
        raise NotImplementedError

    def head_params(self, params) -> Dict[str, Any]:
        """`DecoderHead`'s parameters within the model's: a decoder-only model's are its
        own (an encoder-decoder overrides this)."""
        return dict(params)

    def apply_with_router_losses(self, params, batch, rng=None):
        if not self.config.loss_chunk_tokens:
            return super().apply_with_router_losses(params, batch, rng)
        hidden = DecoderHidden(self.decoder_hidden(params, batch, rng), self.head_params(params))
        return hidden, jnp.zeros((), jnp.float32), {}

    def token_loss(self, logits, targets, weights):
        if not isinstance(logits, DecoderHidden):
            return super().token_loss(logits, targets, weights)
        return token_loss(self, DecoderHead(self.config), logits.head_params, logits.hidden,
                          targets, weights)
