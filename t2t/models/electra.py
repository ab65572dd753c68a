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
import jax
import jax.numpy as jnp

from t2t.models.base import LossConfig, Model
from t2t.models.heads import MlmHead
from t2t.nn.config import TransformerConfig
from t2t.nn.dense import Dense, kernel_init
from t2t.nn.embed import Embedder, token_embed
from t2t.nn.gather import gather_positions
from t2t.nn.mlp import get_activation
from t2t.nn.stacks import Encoder


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


def generator_config(config: TransformerConfig, size: float) -> TransformerConfig:
    """The generator: the discriminator with hidden, feed-forward and head counts scaled by
    `size` (the paper's 1/4 small and large, 1/3 base), reading the same width-E embeddings.

    Its heads split its width exactly (heads x head_dim = d_model, BERT's convention, which
    the authors' `get_generator_config` inherits and HF's ElectraConfig requires): at the
    published sizes that keeps head_dim 64; a narrow generator (tiny: 32 wide, one head)
    gets narrower heads rather than a 64-wide attention inside a 32-wide model.
    """
    d_model = max(1, round(config.d_model * size))
    heads = min(d_model, max(1, round(config.num_heads * size)))
    while d_model % heads:
        heads -= 1
    return config.replace(d_model=d_model, d_ff=max(1, round(config.d_ff * size)),
                          num_heads=heads, head_dim=d_model // heads,
                          embedding_dim=config.embedding_dim or config.d_model,
                          project_summed_embeddings=True)


class ElectraPretraining(nn.Module):
    """Generator and discriminator over one shared embedding block.

    Params: `token_embedder` [vocab, E], `embedder` (position and type tables, LayerNorm),
    `generator` / `discriminator` (each its `embedding_projection` when E differs from its
    width, and layers), `generator_head` (MLM, tied to the token table), `rtd_head`.
    """

    config: TransformerConfig             # the discriminator's
    generator: TransformerConfig

    def setup(self):
        cfg = self.config.replace(embedding_dim=self.config.embedding_dim or self.config.d_model,
                                  project_summed_embeddings=True)
        self.token_embedder = token_embed(cfg, "token_embedder")
        self.embedder = Embedder(cfg, self.token_embedder, name="embedder")
        self.generator_encoder = Encoder(self.generator, embedder=self.embedder,
                                         name="generator")
        self.generator_head = MlmHead(self.generator, "gelu", name="generator_head")
        self.discriminator = Encoder(cfg, embedder=self.embedder, name="discriminator")
        self.rtd_head = RtdHead(cfg, name="rtd_head")

    def generate(self, input_tokens, masked_positions, segment_ids=None, token_type_ids=None,
                 positions=None, *, deterministic: bool = True) -> jax.Array:
        """Masked inputs -> MLM logits at `masked_positions` [batch, p, vocab]."""
        hidden = self.generator_encoder(input_tokens, segment_ids, positions, token_type_ids,
                                        deterministic=deterministic)
        return self.generator_head(gather_positions(hidden, masked_positions),
                                   self.token_embedder)

    def discriminate(self, input_tokens, segment_ids=None, token_type_ids=None, positions=None,
                     *, deterministic: bool = True) -> jax.Array:
        """Corrupted inputs -> replaced-token logits [batch, length]."""
        hidden = self.discriminator(input_tokens, segment_ids, positions, token_type_ids,
                                    deterministic=deterministic)
        return self.rtd_head(hidden)

    def __call__(self, encoder_input_tokens, encoder_segment_ids=None, token_type_ids=None,
                 encoder_positions=None, masked_positions=None, *,
                 deterministic: bool = True) -> Dict[str, jax.Array]:
        if masked_positions is None:
            masked_positions = jnp.zeros(encoder_input_tokens.shape[:1] + (1,), jnp.int32)
        args = (encoder_segment_ids, token_type_ids, encoder_positions)
        return {"mlm_logits": self.generate(encoder_input_tokens, masked_positions, *args,
                                            deterministic=deterministic),
                "rtd_logits": self.discriminate(encoder_input_tokens, *args,
                                                deterministic=deterministic)}


def replace_tokens(inputs: jax.Array, masked_positions: jax.Array, masked_ids: jax.Array,
                   masked_weights: jax.Array, sampled: jax.Array) -> Tuple[jax.Array, jax.Array]:
    """The discriminator's inputs and labels.

    inputs [b, l] (masked), masked_positions / masked_ids / masked_weights / sampled [b, p].
    Returns (corrupted [b, l]: the original tokens with each real masked position set to
    its sample, labels [b, l] float: 1 exactly where corrupted != original; a sample equal
    to the original token is "original").
    """
    inputs = jnp.asarray(inputs)
    hit = ((masked_positions[..., None] == jnp.arange(inputs.shape[1]))
           & (masked_weights[..., None] > 0))                                  # [b, p, l]
    at = jnp.any(hit, axis=1)                                                  # [b, l]
    put = lambda values: jnp.sum(jnp.where(hit, values[..., None], 0), axis=1)  # noqa: E731
    original = jnp.where(at, put(masked_ids), inputs)
    corrupted = jnp.where(at, put(sampled), inputs)
    return corrupted, (corrupted != original).astype(jnp.float32)


class ElectraPretrainingModel(Model):
    """Loss = generator MLM + `rtd_weight` · discriminator BCE over every real token
    (λ = 50); replacements sampled from the generator's softmax, with no gradient through
    them. `generator_size` scales the generator's width (1/4 small and large, 1/3 base)."""

    family = "electra"
    input_features = ("encoder_input_tokens", "encoder_segment_ids", "token_type_ids",
                      "encoder_positions", "masked_positions")

    def __init__(self, config: TransformerConfig, loss: LossConfig = LossConfig(z_loss=0.0),
                 generator_size: float = 0.25, rtd_weight: float = 50.0):
        self.generator_config = generator_config(config, generator_size)
        self.rtd_weight = rtd_weight
        super().__init__(config, ElectraPretraining(config, self.generator_config), loss)

    def _call(self, params, method, rng, *args):
        rngs = {} if rng is None else {"dropout": rng}
        return self.module.apply({"params": params}, *args, deterministic=rng is None,
                                 rngs=rngs, method=method)

    def loss_fn(self, params, batch, rng: Optional[jax.Array] = None):
        sample_rng = jax.random.PRNGKey(0) if rng is None else rng
        sample_rng, g_rng, d_rng = jax.random.split(sample_rng, 3)
        if rng is None:
            g_rng = d_rng = None
        args = (batch.get("encoder_segment_ids"), batch.get("token_type_ids"),
                batch.get("encoder_positions"))
        tokens, positions = batch["encoder_input_tokens"], batch["masked_positions"]
        mlm_logits = self._call(params, ElectraPretraining.generate, g_rng, tokens, positions,
                                *args)
        mlm, mlm_metrics = self.token_loss(mlm_logits, batch["masked_ids"],
                                           batch["masked_weights"])
        sampled = jax.random.categorical(sample_rng,
                                         jax.lax.stop_gradient(mlm_logits).astype(jnp.float32))
        corrupted, labels = replace_tokens(tokens, positions, batch["masked_ids"],
                                           batch["masked_weights"], sampled)
        rtd_logits = self._call(params, ElectraPretraining.discriminate, d_rng, corrupted, *args)
        real = (jnp.ones_like(labels) if batch.get("encoder_segment_ids") is None
                else (batch["encoder_segment_ids"] > 0).astype(jnp.float32))
        rtd, rtd_accuracy = rtd_loss(rtd_logits, labels, real)
        loss = mlm + self.rtd_weight * rtd
        metrics = {"loss": loss, "mlm_loss": mlm, "mlm_accuracy": mlm_metrics["accuracy"],
                   "accuracy": mlm_metrics["accuracy"], "num_tokens": mlm_metrics["num_tokens"],
                   "rtd_loss": rtd, "rtd_accuracy": rtd_accuracy,
                   "replaced_fraction": jnp.sum(labels * real) / jnp.maximum(jnp.sum(real), 1)}
        return loss, metrics

    def loss_weight(self, batch):
        return jnp.sum(batch["masked_weights"])


def rtd_loss(logits: jax.Array, labels: jax.Array, weights: jax.Array
             ) -> Tuple[jax.Array, jax.Array]:
    """Mean sigmoid cross-entropy and accuracy over weighted tokens.  All [b, l]."""
    logits = logits.astype(jnp.float32)
    per_token = jnp.maximum(logits, 0) - logits * labels + jnp.log1p(jnp.exp(-jnp.abs(logits)))
    total = jnp.maximum(jnp.sum(weights), 1.0)
    correct = ((logits > 0).astype(jnp.float32) == labels).astype(jnp.float32)
    return jnp.sum(per_token * weights) / total, jnp.sum(correct * weights) / total
