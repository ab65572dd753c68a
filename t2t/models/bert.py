"""BERT: the encoder with a pooler, a masked-LM head (logits only at masked positions)
and a next-sentence head."""
from __future__ import annotations

from typing import Dict

import flax.linen as nn
import jax
import jax.numpy as jnp

from t2t.models import chunked_loss, losses
from t2t.models.base import LossConfig, Model
from t2t.models.heads import Classifier, MlmHead, Pooler
from t2t.nn.config import TransformerConfig
from t2t.nn.embed import token_embed
from t2t.nn.gather import gather_positions
from t2t.nn.stacks import Encoder


class BertModel(nn.Module):
    """Params: `token_embedder` (shared with the MLM output), `encoder` (other embeddings
    + layers), `pooler`, `mlm_head`, `nsp_head`.

    RoBERTa, ALBERT, DistilBERT and ELECTRA's generator are this module with other configs;
    `mlm_activation` is their MLM head's activation (HF: BERT/ALBERT/DistilBERT use the
    config's hidden_act, RoBERTa and the ELECTRA generator exact gelu).
    """

    config: TransformerConfig
    mlm_activation: str = "gelu"

    def setup(self):
        self.token_embedder = token_embed(self.config, "token_embedder")
        self.encoder = Encoder(self.config, self.token_embedder, name="encoder")
        self.pooler = Pooler(self.config, name="pooler")
        self.mlm_head = MlmHead(self.config, self.mlm_activation, name="mlm_head")
        self.nsp_head = Classifier(self.config, 2, name="nsp_head")

    def encode(self, input_tokens, segment_ids=None, token_type_ids=None, positions=None, *,
               deterministic: bool = True) -> jax.Array:
        """[batch, length] -> last hidden state [batch, length, d_model]."""
        return self.encoder(input_tokens, segment_ids, positions, token_type_ids,
                            deterministic=deterministic)

    def __call__(self, encoder_input_tokens, encoder_segment_ids=None, token_type_ids=None,
                 encoder_positions=None, masked_positions=None, *,
                 deterministic: bool = True) -> Dict[str, jax.Array]:
        """Features as in docs/design.md -> {"hidden", "pooled", "mlm_logits", "nsp_logits"}.

        MLM logits are computed only at `masked_positions` [batch, p] when given
        (BERT's own choice, and p/length of the vocab-projection FLOPs).
        """
        hidden = self.encode(encoder_input_tokens, encoder_segment_ids, token_type_ids,
                             encoder_positions, deterministic=deterministic)
        pooled = self.pooler(hidden)
        at = hidden if masked_positions is None else gather_positions(hidden, masked_positions)
        return {
            "hidden": hidden,
            "pooled": pooled,
            "mlm_logits": self.mlm_head(at, self.token_embedder),
            "nsp_logits": self.nsp_head(pooled, deterministic=deterministic),
        }


    def mlm_logits(self, input_tokens, segment_ids=None, token_type_ids=None, positions=None,
                   *, deterministic: bool = True) -> jax.Array:
        """MLM logits at every position [batch, length, vocab] (no pooler, no NSP head)."""
        hidden = self.encode(input_tokens, segment_ids, token_type_ids, positions,
                             deterministic=deterministic)
        return self.mlm_head(hidden, self.token_embedder)


def hidden_states(config: TransformerConfig, params, input_ids, attention_mask=None,
                  token_type_ids=None) -> jax.Array:
    """The encoder's last hidden state [batch, length, d_model], like HF BertModel's.

    `params` is a BertModel tree (as `t2t.convert.hf.load_bert` returns); heads may be
    absent. `attention_mask` is 1 on tokens and 0 on padding.
    """
    input_ids = jnp.asarray(input_ids, jnp.int32)
    if attention_mask is not None:
        attention_mask = jnp.asarray(attention_mask, jnp.int32)
    if token_type_ids is not None:
        token_type_ids = jnp.asarray(token_type_ids, jnp.int32)
    return BertModel(config).apply({"params": params}, input_ids, attention_mask,
                                   token_type_ids, method=BertModel.encode)


def _masked_hidden(module: BertModel, encoder_input_tokens, encoder_segment_ids=None,
                   token_type_ids=None, encoder_positions=None, masked_positions=None, *,
                   deterministic: bool = True):
    """BertModel's forward pass without the MLM head: (hidden states at the masked
    positions [b, p, d] (all positions without them), NSP logits [b, 2])."""
    hidden = module.encode(encoder_input_tokens, encoder_segment_ids, token_type_ids,
                           encoder_positions, deterministic=deterministic)
    nsp = module.nsp_head(module.pooler(hidden), deterministic=deterministic)
    at = hidden if masked_positions is None else gather_positions(hidden, masked_positions)
    return at, nsp


class BertPretrainingModel(Model):
    """MLM (+ NSP when the batch has `next_sentence_labels`) with logits only at the
    masked positions."""

    family = "bert"
    input_features = ("encoder_input_tokens", "encoder_segment_ids", "token_type_ids",
                      "encoder_positions", "masked_positions")

    def __init__(self, config: TransformerConfig, loss: LossConfig = LossConfig(z_loss=0.0)):
        super().__init__(config, BertModel(config), loss)

    def loss_fn(self, params, batch, rng=None):
        if self.config.loss_chunk_tokens:      # MLM logits a chunk at a time
            hidden, nsp_logits = self.apply(params, batch, rng, method=_masked_hidden)
            out = {"nsp_logits": nsp_logits}
            mlm, metrics = chunked_loss.token_loss(
                self, chunked_loss.MlmProjection(self.config, self.module.mlm_activation),
                {"token_embedder": params["token_embedder"], "mlm_head": params["mlm_head"]},
                hidden, batch["masked_ids"], batch["masked_weights"])
        else:
            out = self.apply(params, batch, rng)
            mlm, metrics = self.token_loss(out["mlm_logits"], batch["masked_ids"],
                                           batch["masked_weights"])
        metrics = {"mlm_loss": mlm, "mlm_accuracy": metrics["accuracy"],
                   "num_tokens": metrics["num_tokens"]}
        loss = mlm
        if "next_sentence_labels" in batch:
            nsp = losses.nsp_loss(out["nsp_logits"], batch["next_sentence_labels"])
            metrics["nsp_loss"] = nsp
            metrics["nsp_accuracy"] = losses.accuracy(out["nsp_logits"],
                                                      batch["next_sentence_labels"])
            loss = loss + nsp
        metrics["loss"] = loss
        return loss, metrics

    def loss_weight(self, batch):
        return jnp.sum(batch["masked_weights"])

    def score(self, params, batch):
        """Log-likelihood of the masked ids per example [batch] (pseudo-likelihood)."""
        out = self.apply(params, batch)
        log_probs = jax.nn.log_softmax(out["mlm_logits"].astype(jnp.float32), axis=-1)
        lp = jnp.take_along_axis(log_probs, batch["masked_ids"][..., None], axis=-1)[..., 0]
        return jnp.sum(lp * batch["masked_weights"], axis=-1)
