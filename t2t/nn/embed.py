"""Token, position and type embeddings, and the tied output projection."""
from __future__ import annotations

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from t2t.errors import ConfigError
from t2t.nn import mixed_einsum
from t2t.nn.adaptive_input import AdaptiveInput
from t2t.nn.config import TransformerConfig
from t2t.nn.dense import Dense, embedding_init, kernel_init
from t2t.nn.dropout import Dropout
from t2t.nn.norms import make_norm
from t2t.nn.position import sinusoidal


class Embed(nn.Module):
    """A lookup table [num, features]; `attend` multiplies by its transpose (tied logits)."""

    num_embeddings: int
    features: int
    axes: tuple = ("vocab", "embed")
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    embedding_init: nn.initializers.Initializer = nn.initializers.normal(stddev=1.0)

    def setup(self):
        self.embedding = self.param(
            "embedding", nn.with_logical_partitioning(self.embedding_init, self.axes),
            (self.num_embeddings, self.features), self.param_dtype)

    def __call__(self, ids: jax.Array) -> jax.Array:
        """[...] int -> [..., features]."""
        return jnp.take(self.embedding, ids, axis=0).astype(self.dtype)

    def attend(self, x: jax.Array) -> jax.Array:
        """[..., features] -> [..., num_embeddings], float32 accumulation."""
        return mixed_einsum.einsum("...d,vd->...v", x, self.embedding, self.dtype,
                                   float32_layout=True).astype(self.dtype)


def token_embed(config: TransformerConfig, name: str = "token_embedder") -> nn.Module:
    """The token table: [vocab, embed] (or [vocab, E] when factorized, ALBERT); adaptive
    input clusters (Baevski & Auli 2019) when the config asks, with the tied adaptive
    softmax when it also ties the output."""
    if config.adaptive_input:
        tied = config.tie_embeddings and config.output_layer == "adaptive_softmax"
        return AdaptiveInput(config, with_softmax=tied, name=name)
    return Embed(config.vocab_size, config.embedding_dim or config.d_model,
                 dtype=config.compute_dtype, param_dtype=config.params_dtype,
                 embedding_init=embedding_init(config), name=name)


class Embedder(nn.Module):
    """tokens (+ absolute positions) (+ token types) -> [batch, length, d_model].

    `token_embedder` may be passed in to share one table between stacks (T5).
    With `config.project_summed_embeddings` every table has width E and the output stays
    [batch, length, E]: the stack projects it (`project_embeddings`), so two stacks of
    different widths can share one Embedder (ELECTRA's generator and discriminator).
    """

    config: TransformerConfig
    token_embedder: Optional[Embed] = None
    deterministic: bool = True

    @nn.compact
    def __call__(self, tokens: jax.Array, positions: jax.Array,
                 token_type_ids: Optional[jax.Array] = None,
                 deterministic: Optional[bool] = None) -> jax.Array:
        cfg = self.config
        if deterministic is None:
            deterministic = self.deterministic
        table = token_embed(cfg) if self.token_embedder is None else self.token_embedder
        x = table(tokens)                                          # [b, l, E]
        if cfg.scale_embeddings:
            x = x * jnp.sqrt(cfg.d_model).astype(x.dtype)
        width = cfg.d_model
        if cfg.project_summed_embeddings:
            width = cfg.embedding_dim or cfg.d_model
        elif cfg.embedding_dim is not None and cfg.embedding_dim != cfg.d_model:
            x = Dense(cfg.d_model, (None, "embed"), use_bias=cfg.use_bias, dtype=cfg.compute_dtype,
                      param_dtype=cfg.params_dtype, kernel_init=kernel_init(cfg),
                      name="embedding_projection")(x)
        if cfg.position_embedding == "learned":
            length, first = tokens.shape[-1], cfg.position_offset
            if first + length > cfg.max_length:      # the lookup would read NaN past the table
                start = f" from position {first}" if first else ""
                raise ConfigError(
                    f"sequences of {length} tokens{start}, but the learned position table has "
                    f"TransformerConfig.max_length = {cfg.max_length} rows: shorten "
                    "TASK_FEATURE_LENGTHS or raise --gin.TransformerConfig.max_length")
            x = x + Embed(cfg.max_length, width, axes=("length", "embed"),
                          dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype,
                          embedding_init=embedding_init(cfg), name="position_embedder")(positions)
        elif cfg.position_embedding == "sinusoidal":
            x = x + sinusoidal(positions, width).astype(x.dtype)
        if cfg.type_vocab_size:
            if token_type_ids is None:
                token_type_ids = jnp.zeros_like(tokens)
            x = x + Embed(cfg.type_vocab_size, width, axes=(None, "embed"),
                          dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype,
                          embedding_init=embedding_init(cfg), name="type_embedder")(token_type_ids)
        if cfg.embedding_norm:
            x = make_norm(cfg, "embedding_norm")(x)
        x = Dropout(cfg.dropout_rate)(x, deterministic=deterministic)
        return nn.with_logical_constraint(x, ("batch", "length", "embed"))


def project_embeddings(cfg: TransformerConfig, x: jax.Array) -> jax.Array:
    """[batch, length, E] -> [batch, length, d_model] by `embedding_projection` when the
    config sums its embeddings in width E (ALBERT, ELECTRA); else x unchanged.

    Call from inside a compact module (it creates params in the caller's scope).
    """
    if not cfg.project_summed_embeddings or x.shape[-1] == cfg.d_model:
        return x
    return Dense(cfg.d_model, (None, "embed"), use_bias=cfg.use_bias, dtype=cfg.compute_dtype,
                 param_dtype=cfg.params_dtype, kernel_init=kernel_init(cfg),
                 name="embedding_projection")(x)
