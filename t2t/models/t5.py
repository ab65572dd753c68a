"""Encoder-decoder (T5) model: text-to-text with teacher forcing."""
from __future__ import annotations

from typing import Optional

import jax

from t2t.models.base import Batch, LossConfig, Model
from t2t.nn.config import TransformerConfig
from t2t.nn.stacks import EncoderDecoder


class EncoderDecoderModel(Model):
    family = "t5"
    input_features = ("encoder_input_tokens", "decoder_input_tokens", "encoder_segment_ids",
                      "decoder_segment_ids", "encoder_positions", "decoder_positions")

    def __init__(self, config: TransformerConfig, loss: LossConfig = LossConfig()):
        super().__init__(config, EncoderDecoder(config), loss)

    def predict(self, params, batch: Batch, *, max_decode_length: Optional[int] = None,
                strategy: str = "greedy", eos_id: Optional[int] = 1, **options) -> jax.Array:
        """Encode `encoder_input_tokens` once, decode from start token 0 with the KV cache
        -> [batch, max_decode_length] (default: the width of `decoder_target_tokens`, else
        of `decoder_input_tokens`)."""
        if max_decode_length is None:
            targets = batch.get("decoder_target_tokens", batch.get("decoder_input_tokens"))
            max_decode_length = targets.shape[1]
        return super().predict(params, batch, max_decode_length=max_decode_length,
                               strategy=strategy, eos_id=eos_id, **options)
