"""Encoder-decoder (T5) model: text-to-text with teacher forcing."""
from __future__ import annotations

from typing import Optional

import jax

from t2t.models import chunked_loss
from t2t.models.base import Batch, LossConfig, Model
from t2t.nn.config import TransformerConfig
from t2t.nn.stacks import EncoderDecoder


class EncoderDecoderModel(chunked_loss.ChunkedDecoderLoss, Model):
    family = "t5"
    input_features = ("encoder_input_tokens", "decoder_input_tokens", "encoder_segment_ids",
                      "decoder_segment_ids", "encoder_positions", "decoder_positions")

    def __init__(self, config: TransformerConfig, loss: LossConfig = LossConfig()):
        super().__init__(config, EncoderDecoder(config), loss)

    def decoder_hidden(self, params, batch: Batch, rng: Optional[jax.Array] = None):
        """The decoder's final hidden state [b, l, d] (the loss in chunks:
        chunked_loss.py)."""
        return self.apply(params, batch, rng, method=_hidden)

    def head_params(self, params):
        """The output layer lives in "decoder", its token table at the top."""
        return {**params["decoder"], "token_embedder": params["token_embedder"]}

    def predict(self, params, batch: Batch, *, max_decode_length: Optional[int] = None,
                strategy: str = "greedy", eos_id: Optional[int] = 1, **options) -> jax.Array:
        """Encode `encoder_input_tokens` once, decode from `config.decoder_start_id` (T5 0,
        BART 2) with the KV cache -> [batch, max_decode_length] (default: the width of
        `decoder_target_tokens`, else of `decoder_input_tokens`)."""
        if max_decode_length is None:
            targets = batch.get("decoder_target_tokens", batch.get("decoder_input_tokens"))
            max_decode_length = targets.shape[1]
        return super().predict(params, batch, max_decode_length=max_decode_length,
                               strategy=strategy, eos_id=eos_id, **options)


def _hidden(module: EncoderDecoder, encoder_input_tokens, decoder_input_tokens,
            encoder_segment_ids=None, decoder_segment_ids=None, encoder_positions=None,
            decoder_positions=None, *, deterministic: bool = True) -> jax.Array:
    """EncoderDecoder's forward pass up to the decoder's final hidden state [b, l, d]."""
    encoded = module.encode(encoder_input_tokens, encoder_segment_ids, encoder_positions,
                            deterministic=deterministic)
    return module.decoder(decoder_input_tokens, encoded, decoder_segment_ids,
                          encoder_segment_ids, decoder_positions,
                          deterministic=deterministic, return_hidden=True)
