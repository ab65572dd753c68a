"""Mixture of softmaxes (Yang et al. 2018, "Breaking the Softmax Bottleneck", sec. 2.3).

K softmaxes over the vocabulary, mixed by a learned, context-dependent prior:

    P(w | g) = sum_k pi_k(g) · softmax(h_k(g) · W)_w,
    pi(g) = softmax(w_pi · g)  [K],   h_k(g) = tanh(W_k · g)  [d_model]

where g is the decoder's last hidden state and W the output word embeddings (the token
table transposed when `tie_embeddings`, else the decoder's own `logits_dense`). With K = 1
the prior is 1 and the layer is a plain softmax over tanh(W_1 · g) · W.

Returns log P [..., V] (float32), normalised: it stands in for logits in the loss,
scoring and decoding, as the adaptive softmax does.
"""
from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from t2t.nn.config import TransformerConfig
from t2t.nn.dense import Dense, kernel_init


def mixture_log_probs(prior_logits: jax.Array, component_logits: jax.Array) -> jax.Array:
    """prior [..., K], components [..., K, V] -> log sum_k pi_k softmax_k [..., V], float32."""
    log_prior = jax.nn.log_softmax(prior_logits.astype(jnp.float32), axis=-1)
    log_comp = jax.nn.log_softmax(component_logits.astype(jnp.float32), axis=-1)
    return jax.nn.logsumexp(log_prior[..., None] + log_comp, axis=-2)


class MixtureOfSoftmaxes(nn.Module):
    """hidden [batch, length, d_model] -> log-probabilities [batch, length, vocab].

    `word_logits` maps [..., d_model] to [..., vocab] (the model's ordinary output layer,
    applied to all K context vectors at once). Parameters: `prior` [d_model, K] and
    `contexts` [d_model, K, d_model].
    """

    config: TransformerConfig

    @nn.compact
    def __call__(self, x: jax.Array, word_logits: Callable[[jax.Array], jax.Array]) -> jax.Array:
        cfg = self.config
        k = cfg.mos_num_softmaxes
        dense = lambda feats, axes, name, init: Dense(  # noqa: E731
            feats, axes, use_bias=cfg.use_bias, dtype=cfg.compute_dtype,
            param_dtype=cfg.params_dtype, kernel_init=init, name=name)
        prior = dense(k, ("embed", None), "prior", kernel_init(cfg))(x)     # [b, l, K]
        contexts = jnp.tanh(dense((k, cfg.d_model), ("embed", None, None), "contexts",
                                  kernel_init(cfg, in_axis=0, out_axis=(1, 2)))(x))  # [b,l,K,d]
        return mixture_log_probs(prior, word_logits(contexts))              # [b, l, V]
