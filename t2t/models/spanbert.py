"""SpanBERT (Joshi et al. 2020): MLM over masked spans plus the span-boundary objective
(SBO): each masked token is predicted again from the encoder outputs of the two tokens just
outside its span and its position inside the span, through a 2-layer GeLU + LayerNorm FFN.
"""
from __future__ import annotations

from typing import Dict, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from t2t.models.base import LossConfig
from t2t.models.bert import BertModel, BertPretrainingModel
from t2t.nn.config import TransformerConfig
from t2t.nn.dense import Dense, embedding_init, kernel_init
from t2t.nn.embed import Embed
from t2t.nn.gather import gather_positions
from t2t.nn.norms import make_norm


def span_boundaries(masked_positions: jax.Array, masked_weights: jax.Array, length: int
                    ) -> Tuple[jax.Array, jax.Array, jax.Array]:
    """For each prediction [b, p]: the nearest unmasked position to its left and to its right
    (a span = a maximal run of masked tokens) and its 0-based offset inside the span."""
    hit = ((masked_positions[..., None] == jnp.arange(length))
           & (masked_weights[..., None] > 0))
    masked = jnp.any(hit, axis=1)                                           # [b, l]
    idx = jnp.broadcast_to(jnp.arange(length), masked.shape)
    last = jax.lax.cummax(jnp.where(masked, -1, idx), axis=1)               # [b, l]
    following = jax.lax.cummin(jnp.where(masked, length, idx), axis=1, reverse=True)
    left = jnp.maximum(jnp.take_along_axis(last, masked_positions, axis=1), 0)
    right = jnp.minimum(jnp.take_along_axis(following, masked_positions, axis=1), length - 1)
    return left, right, masked_positions - left - 1


class SboHead(nn.Module):
    """[x_left; x_right; p_offset] -> 2 × (dense, gelu, LayerNorm) -> tied vocab logits + bias.

    hidden [b, l, d], masked_positions / masked_weights [b, p] -> logits [b, p, vocab].
    """

    config: TransformerConfig
    max_offset: int = 32     # offsets past it share the last embedding (spans of ≤ 10 words)

    @nn.compact
    def __call__(self, hidden, masked_positions, masked_weights, table: Embed) -> jax.Array:
        cfg = self.config
        left, right, offset = span_boundaries(masked_positions, masked_weights, hidden.shape[1])
        offsets = Embed(self.max_offset, cfg.d_model, axes=(None, "embed"),
                        dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype,
                        embedding_init=embedding_init(cfg), name="offset_embedder")
        h = jnp.concatenate([gather_positions(hidden, left), gather_positions(hidden, right),
                             offsets(jnp.clip(offset, 0, self.max_offset - 1))], axis=-1)
        for i in range(2):
            h = Dense(cfg.d_model, (None, "embed"), use_bias=True, dtype=cfg.compute_dtype,
                      param_dtype=cfg.params_dtype, kernel_init=kernel_init(cfg),
                      name=f"dense_{i}")(h)
            h = make_norm(cfg, f"norm_{i}")(jax.nn.gelu(h, approximate=False))
        width = cfg.embedding_dim or cfg.d_model
        if width != cfg.d_model:
            h = Dense(width, ("embed", None), use_bias=False, dtype=cfg.compute_dtype,
                      param_dtype=cfg.params_dtype, kernel_init=kernel_init(cfg),
                      name="projection")(h)
        bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, ("vocab",)),
                          (cfg.vocab_size,), cfg.params_dtype)
        return table.attend(h) + bias.astype(cfg.compute_dtype)


class SpanBertModel(BertModel):
    """BertModel (same parameter names, so `save_bert` exports its encoder) + `sbo_head`."""

    def setup(self):
        super().setup()
        self.sbo_head = SboHead(self.config, name="sbo_head")

    def __call__(self, encoder_input_tokens, encoder_segment_ids=None, token_type_ids=None,
                 encoder_positions=None, masked_positions=None, masked_weights=None, *,
                 deterministic: bool = True) -> Dict[str, jax.Array]:
        if masked_positions is None:
            masked_positions = jnp.zeros(encoder_input_tokens.shape[:1] + (1,), jnp.int32)
        if masked_weights is None:
            masked_weights = jnp.ones(masked_positions.shape, jnp.float32)
        hidden = self.encode(encoder_input_tokens, encoder_segment_ids, token_type_ids,
                             encoder_positions, deterministic=deterministic)
        return {"hidden": hidden,
                "mlm_logits": self.mlm_head(gather_positions(hidden, masked_positions),
                                            self.token_embedder),
                "sbo_logits": self.sbo_head(hidden, masked_positions, masked_weights,
                                            self.token_embedder)}


class SpanBertPretrainingModel(BertPretrainingModel):
    """Loss = MLM + `sbo_weight` · SBO (SpanBERT: 1), both over the masked tokens; no NSP."""

    family = "spanbert"
    input_features = BertPretrainingModel.input_features + ("masked_weights",)

    def __init__(self, config: TransformerConfig, loss: LossConfig = LossConfig(z_loss=0.0),
                 sbo_weight: float = 1.0):
        super().__init__(config, loss)
        self.module = SpanBertModel(config)
        self.sbo_weight = sbo_weight

    def loss_fn(self, params, batch, rng=None):
        out = self.apply(params, batch, rng)
        ids, weights = batch["masked_ids"], batch["masked_weights"]
        mlm, m = self.token_loss(out["mlm_logits"], ids, weights)
        sbo, s = self.token_loss(out["sbo_logits"], ids, weights)
        loss = mlm + self.sbo_weight * sbo
        return loss, {"loss": loss, "mlm_loss": mlm, "mlm_accuracy": m["accuracy"],
                      "accuracy": m["accuracy"], "sbo_loss": sbo, "sbo_accuracy": s["accuracy"],
                      "num_tokens": m["num_tokens"]}
