"""Adaptive softmax (Grave et al. 2017, "Efficient softmax approximation for GPUs").

The vocabulary, its ids sorted by decreasing frequency (SentencePiece vocabularies roughly
are), is cut at `config.adaptive_cutoffs` c_1 < ... < c_n < V into a head [0, c_1) and tail
clusters V_i = [c_i, c_{i+1}) (c_{n+1} = V). The head classifies over its c_1 words plus one
entry per tail cluster; a tail cluster classifies among its own words (sec. 4.2-4.3):

    p(w | h) = p_head(w | h)                           w in the head
    p(w | h) = p_head(V_i | h) · p_i(w | h)            w in tail cluster V_i

Tail cluster i reads h projected to d_model / factor**i, the paper's smaller capacity for
rarer words (sec. 4.3, "we ... reduce the dimension of the hidden layer"); with
`adaptive_softmax_projection=False` every tail cluster reads the full d_model instead
(Narang et al. 2021's "adaptive softmax without projection").

With `tie_embeddings=True` and `adaptive_input=True` the input clusters' tables and
projections are the softmax's (`t2t.nn.adaptive_input.AdaptiveInput.log_probs`); this
module is the untied softmax.

The layer returns log-probabilities over the whole vocabulary [..., V] (the exponentials of
each row sum to 1). A normalised log-distribution is its own log-softmax, so they stand in
for logits everywhere: t5x cross-entropy (whose z-loss term is then 0), scoring, decoding.
Every cluster is computed for every token: exact, without the paper's training speed-up
(which skips the tail clusters a batch's targets do not fall in).
"""
from __future__ import annotations

from typing import List, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from t2t.errors import ConfigError
from t2t.nn.config import TransformerConfig
from t2t.nn.dense import Dense, kernel_init


def cluster_bounds(vocab_size: int, cutoffs: Sequence[int]) -> List[int]:
    """[0, c_1, ..., c_n, V]: the clusters of the adaptive input and softmax."""
    return [0, *cutoffs, vocab_size]


def cluster_widths(config: TransformerConfig) -> List[int]:
    """Width of each cluster (head first): d_model / factor**i, at least 1; all d_model
    without the projection."""
    n = len(config.adaptive_cutoffs) + 1
    if not config.adaptive_softmax_projection:
        return [config.d_model] * n
    return [max(1, int(config.d_model // config.adaptive_factor ** i)) for i in range(n)]


def check_adaptive_config(cfg: TransformerConfig) -> None:
    """One-line errors for cutoffs that do not split the vocabulary (TransformerConfig)."""
    cuts = list(cfg.adaptive_cutoffs)
    if not cuts:
        raise ConfigError("adaptive input/softmax needs adaptive_cutoffs, e.g. (2000, 10000)")
    if cuts != sorted(set(cuts)) or cuts[0] <= 0 or cuts[-1] >= cfg.vocab_size:
        raise ConfigError(f"adaptive_cutoffs={tuple(cuts)} must increase strictly within "
                          f"(0, vocab_size={cfg.vocab_size})")
    if cfg.adaptive_factor < 1:
        raise ConfigError(f"adaptive_factor must be >= 1, got {cfg.adaptive_factor}")
    if cfg.embedding_dim is not None:
        raise ConfigError("adaptive input/softmax size their own clusters: set embedding_dim=None")
    softmax = cfg.output_layer == "adaptive_softmax"
    if cfg.tie_embeddings and not (cfg.adaptive_input and softmax):
        raise ConfigError("tie_embeddings=True ties adaptive input to an adaptive softmax: set "
                          "both adaptive_input=True and output_layer='adaptive_softmax', or "
                          "tie_embeddings=False")


def adaptive_log_probs(head_logits: jax.Array, tail_logits: Sequence[jax.Array]) -> jax.Array:
    """head [..., c_1 + n], tails [..., |V_i|] -> log p over the vocabulary [..., V], float32.

    The head's last n entries are the tail clusters' probabilities (sec. 4.2).
    """
    head = jax.nn.log_softmax(head_logits.astype(jnp.float32), axis=-1)
    n = len(tail_logits)
    shortlist = head.shape[-1] - n
    parts = [head[..., :shortlist]]
    for i, tail in enumerate(tail_logits):
        parts.append(head[..., shortlist + i, None]
                     + jax.nn.log_softmax(tail.astype(jnp.float32), axis=-1))
    return jnp.concatenate(parts, axis=-1)


class AdaptiveSoftmax(nn.Module):
    """hidden [batch, length, d_model] -> log-probabilities [batch, length, vocab] (float32).

    Parameters: `head` [d_model, c_1 + n]; per tail cluster i, `tail_{i}` [d_i, |V_i|] and,
    with the projection, `tail_{i}_projection` [d_model, d_i].
    """

    config: TransformerConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config
        bounds = cluster_bounds(cfg.vocab_size, cfg.adaptive_cutoffs)
        widths = cluster_widths(cfg)
        dense = lambda feats, axes, name: Dense(  # noqa: E731
            feats, axes, use_bias=cfg.use_bias, dtype=cfg.compute_dtype,
            param_dtype=cfg.params_dtype, kernel_init=kernel_init(cfg), name=name)
        n = len(bounds) - 2
        head = dense(bounds[1] + n, ("embed", None), "head")(x)          # [b, l, c_1 + n]
        tails = []
        for i in range(1, n + 1):
            h = x                                       # widths[i] == d_model, unprojected
            if cfg.adaptive_softmax_projection:
                h = dense(widths[i], ("embed", None), f"tail_{i}_projection")(x)  # [b, l, d_i]
            tails.append(dense(bounds[i + 1] - bounds[i], (None, None), f"tail_{i}")(h))
        return adaptive_log_probs(head, tails)
