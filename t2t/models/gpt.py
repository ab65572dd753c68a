"""Decoder-only (GPT) model: causal LM, or prefix LM when `decoder_causal_attention` is fed."""
from __future__ import annotations

from typing import Any, Optional

import jax
import numpy as np

from t2t.models import chunked_loss, decoding
from t2t.models.base import Batch, LossConfig, Model
from t2t.nn.config import TransformerConfig
from t2t.nn.stacks import Decoder


class DecoderOnlyModel(chunked_loss.ChunkedDecoderLoss, Model):
    family = "gpt"
    input_features = ("decoder_input_tokens", "decoder_segment_ids", "decoder_positions",
                      "decoder_causal_attention")

    def __init__(self, config: TransformerConfig, loss: LossConfig = LossConfig()):
        super().__init__(config, Decoder(config), loss)

    def decoder_hidden(self, params, batch: Batch, rng: Optional[jax.Array] = None):
        """The final hidden state [b, l, d] (the loss in chunks: chunked_loss.py)."""
        return self.apply(params, batch, rng, return_hidden=True)

    def predict(self, params, batch: Batch, *, max_decode_length: Optional[int] = None,
                strategy: str = "greedy", eos_id: Optional[int] = 1,
                prompt_lengths: Optional[Any] = None, **options) -> jax.Array:
        """Continue each prompt -> only the generated tokens [batch, max_decode_length].

        The prompt is the first `prompt_lengths` tokens of `decoder_input_tokens` (default:
        the prefix flagged by `decoder_causal_attention`, see `decoding.decode`). The
        default length is the row width left after the longest prompt (so positions stay
        within what training saw); it needs concrete prompt lengths.
        """
        if max_decode_length is None:
            lengths = decoding.prompt_features(batch, prompt_lengths)["prompt_lengths"]
            width = batch["decoder_input_tokens"].shape[1]
            max_decode_length = max(width - int(np.max(np.asarray(lengths))), 1)
        return decoding.decode(self, params, batch, max_decode_length=max_decode_length,
                               strategy=strategy, eos_id=eos_id, prompt_lengths=prompt_lengths,
                               **options)
