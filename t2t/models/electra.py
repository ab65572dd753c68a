"""ELECTRA (Clark et al. 2020): a small MLM generator proposes replacements, a discriminator
detects them at every position (replaced-token detection, RTD).

The two encoders share one embedding block (token, position and type tables and their
LayerNorm, width E = the discriminator's embedding size); each projects it to its own width.
Loss = MLM(generator) + λ·RTD(discriminator), λ = 50; the sampled replacements carry no
gradient, so the generator learns only from its MLM loss.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp

from t2t.models.base import LossConfig, Model
from t2t.models.heads import MlmHead, gather_positions
from t2t.nn.config import TransformerConfig
from t2t.nn.dense import Dense, kernel_init
from t2t.nn.embed import Embedder, token_embed
from t2t.nn.mlp import get_activation
from t2t.nn.stacks import Encoder
from t2t.train import losses


class RtdHead(nn.Module):
    """dense + activation + dense to one logit per token.  [b, l, d] -> [b, l]."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, hidden: jax.Array) -> jax.Array:
        cfg = self.config
        dense = lambda n, name: Dense(n, ("embed", None), use_bias=True,  # noqa: E731
                                      dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype,
                                      kernel_init=kernel_init(cfg), name=name)
        h = get_activation(cfg.mlp_activations[0])(dense(cfg.d_model, "dense")(hidden))
        return dense(1, "prediction")(h)[..., 0]


class ElectraDiscriminator(nn.Module):
    """The discriminator alone (HF `ElectraForPreTraining`): tokens -> RTD logits [b, l]."""

    config: TransformerConfig

    def setup(self):
        self.token_embedder = token_embed(self.config, "token_embedder")
        self.encoder = Encoder(self.config, self.token_embedder, name="encoder")
        self.rtd_head = RtdHead(self.config, name="rtd_head")

    def __call__(self, input_tokens, segment_ids=None, token_type_ids=None, positions=None, *,
                 deterministic: bool = True) -> jax.Array:
        hidden = self.encoder(input_tokens, segment_ids, positions, token_type_ids,
                              deterministic=deterministic)
        return self.rtd_head(hidden)
