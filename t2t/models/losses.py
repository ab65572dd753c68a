"""Losses and simple metrics (pure jnp, float32 internally).

Cross entropy follows t5x: z-loss ``z_loss * log(Z)**2`` (keeps the softmax normaliser near
1, PaLM §5), label smoothing with a constant subtracted so a perfect prediction of the
smoothed distribution costs 0, per-token weights for padding/packing. A custom VJP keeps
the softmax probabilities (in the logits' dtype) and ``log Z`` for the backward pass, so the
exponentials are computed once (cheaper than recomputing them from the logits in a GPT-2
small train step on CPU: benchmarks/README.md; no one-hot residual).
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Optional

import jax
import jax.numpy as jnp

from t2t.nn.gather import gather_positions


def _smoothing_constants(label_smoothing: float, vocab_size: int) -> tuple[float, float, float]:
    """(confidence, low_confidence, normalizing_constant) as in t5x."""
    confidence = 1.0 - label_smoothing
    low_confidence = (1.0 - confidence) / (vocab_size - 1)
    normalizing_constant = -(confidence * math.log(confidence)
                             + (vocab_size - 1) * low_confidence
                             * math.log(low_confidence + 1e-20)) if label_smoothing else 0.0
    return confidence, low_confidence, normalizing_constant


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _token_cross_entropy(logits: jax.Array, targets: jax.Array, z_loss: float,
                         label_smoothing: float) -> tuple[jax.Array, jax.Array]:
    """Per-token (loss incl. z-loss, z-loss), both [..., ] float32. logits [..., V]."""
    out, _ = _token_cross_entropy_fwd(logits, targets, z_loss, label_smoothing)
    return out


def _token_cross_entropy_fwd(logits, targets, z_loss, label_smoothing):
    vocab = logits.shape[-1]
    confidence, low, constant = _smoothing_constants(label_smoothing, vocab)
    x = logits.astype(jnp.float32)
    row_max = jax.lax.stop_gradient(jnp.max(x, axis=-1, keepdims=True))  # [..., 1]
    unnormalized = jnp.exp(x - row_max)                                   # [..., V]
    total = jnp.sum(unnormalized, axis=-1, keepdims=True)
    log_z = (row_max + jnp.log(total))[..., 0]                            # [...]
    # A masked sum rather than a gather: stays local when the vocab axis is sharded.
    is_target = jnp.arange(vocab, dtype=jnp.int32) == targets[..., None].astype(jnp.int32)
    target_logit = jnp.sum(jnp.where(is_target, x, 0.0), axis=-1)  # [...]
    # -sum_v soft_v * log_softmax_v with soft = low + (confidence - low) * onehot(target)
    nll = -(confidence - low) * (target_logit - log_z)
    if low:
        nll = nll - low * (jnp.sum(x, axis=-1) - vocab * log_z)
    z = z_loss * jnp.square(log_z)
    loss = nll - constant + z
    probs = (unnormalized / total).astype(logits.dtype)
    return (loss, z), (probs, targets, log_z)


def _token_cross_entropy_bwd(z_loss, label_smoothing, res, g):
    probs, targets, log_z = res
    g_loss, g_z = g  # [...]
    vocab = probs.shape[-1]
    confidence, low, _ = _smoothing_constants(label_smoothing, vocab)
    p = probs.astype(jnp.float32)
    onehot = jax.nn.one_hot(targets, vocab, dtype=jnp.float32)
    soft = low + (confidence - low) * onehot
    dz = 2.0 * z_loss * log_z  # d(z_loss * logZ^2)/dlogZ; dlogZ/dlogits = probs
    grad = (g_loss[..., None] * (p * (1.0 + dz[..., None]) - soft)
            + (g_z * dz)[..., None] * p)
    return grad.astype(probs.dtype), None


_token_cross_entropy.defvjp(_token_cross_entropy_fwd, _token_cross_entropy_bwd)


def token_cross_entropy(logits: jax.Array, targets: jax.Array, *, z_loss: float = 0.0,
                        label_smoothing: float = 0.0) -> tuple[jax.Array, jax.Array]:
    """Unweighted per-token (loss incl. z-loss, z-loss): logits [..., V], targets [...]."""
    return _token_cross_entropy(logits, targets, float(z_loss), float(label_smoothing))


def cross_entropy_with_logits(
    logits: jax.Array, targets: jax.Array, weights: Optional[jax.Array] = None, *,
    z_loss: float = 1e-4, label_smoothing: float = 0.0,
    loss_normalizing_factor: Optional[float] = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Weighted cross entropy. logits [b, l, V], targets [b, l] int, weights [b, l].

    Returns ``(loss, z_loss, weight_sum)``: ``loss`` already includes the z-loss term (the
    separate ``z_loss`` is for logging). Both are divided by ``weight_sum`` when
    ``loss_normalizing_factor`` is None, else by that constant (t5x's fixed factor, which
    keeps the loss scale independent of how many target tokens a batch happens to hold).
    """
    loss, z = token_cross_entropy(logits, targets, z_loss=z_loss,
                                  label_smoothing=label_smoothing)  # [b, l]
    if weights is None:
        weights = jnp.ones(targets.shape, jnp.float32)
    weights = weights.astype(jnp.float32)
    weight_sum = jnp.sum(weights)
    total, total_z = jnp.sum(loss * weights), jnp.sum(z * weights)
    if loss_normalizing_factor is None:
        denom = jnp.maximum(weight_sum, 1e-8)  # an all-padding batch gives 0, not NaN
    else:
        denom = jnp.float32(loss_normalizing_factor)
    return total / denom, total_z / denom, weight_sum


def chunked_cross_entropy(
    project: Callable[[jax.Array], jax.Array], hidden: jax.Array, targets: jax.Array,
    weights: Optional[jax.Array] = None, *, chunk_tokens: int, z_loss: float = 1e-4,
    label_smoothing: float = 0.0, loss_normalizing_factor: Optional[float] = None,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """`cross_entropy_with_logits(project(hidden), ...)` and its `accuracy`, with the logits
    made and consumed a chunk of positions at a time: hidden [b, l, d], targets and weights
    [b, l]; `project` maps [b, c, d] to logits [b, c, V].

    The length is cut into chunks of c = max(1, chunk_tokens // b) positions (the batch
    axis is kept whole, so a batch split over devices stays split), each chunk's
    projection and loss inside `jax.checkpoint`: the backward pass recomputes one chunk's
    logits at a time, so at most [b, c, V] logits exist at once (and the projection's
    forward FLOPs run twice). Returns ``(loss, z_loss, weight_sum, accuracy)``.
    """
    b, length = targets.shape
    if weights is None:
        weights = jnp.ones(targets.shape, jnp.float32)
    c = max(1, min(length, chunk_tokens // max(b, 1)))
    n = -(-length // c)
    pad = n * c - length
    if pad:                                     # padded positions carry weight 0
        hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
        targets = jnp.pad(targets, ((0, 0), (0, pad)))
        weights = jnp.pad(weights, ((0, 0), (0, pad)))

    def chunks(x):                              # [b, n*c, ...] -> [n, b, c, ...]
        return jnp.moveaxis(x.reshape((b, n, c) + x.shape[2:]), 1, 0)

    @jax.checkpoint
    def one(xs):
        h, t, w = xs
        logits = project(h)
        loss, z = token_cross_entropy(logits, t, z_loss=z_loss,
                                      label_smoothing=label_smoothing)
        correct = jax.lax.stop_gradient(_first_argmax(logits) == t.astype(jnp.int32))
        w = w.astype(jnp.float32)
        return jnp.stack([jnp.sum(loss * w), jnp.sum(z * w),
                          jnp.sum(correct.astype(jnp.float32) * w)])

    total, total_z, total_correct = jnp.sum(
        jax.lax.map(one, (chunks(hidden), chunks(targets), chunks(weights))), axis=0)
    weight_sum = jnp.sum(weights.astype(jnp.float32))
    if loss_normalizing_factor is None:
        denom = jnp.maximum(weight_sum, 1e-8)
    else:
        denom = jnp.float32(loss_normalizing_factor)
    return (total / denom, total_z / denom, weight_sum,
            total_correct / jnp.maximum(weight_sum, 1e-8))


def mlm_loss(logits: jax.Array, masked_ids: jax.Array, masked_weights: jax.Array, *,
             masked_positions: Optional[jax.Array] = None, z_loss: float = 0.0,
             label_smoothing: float = 0.0) -> tuple[jax.Array, jax.Array]:
    """Masked-LM loss averaged over real predictions; returns (loss, weight_sum).

    ``logits`` are [b, p, V] at the masked positions only (the cheap path: the model gathers
    hidden states with :func:`gather_positions` before the vocab projection). If
    ``masked_positions`` [b, p] is given, ``logits`` are [b, l, V] and are gathered here.
    """
    if masked_positions is not None:
        logits = gather_positions(logits, masked_positions)  # [b, p, V]
    loss, _, weight_sum = cross_entropy_with_logits(
        logits, masked_ids, masked_weights, z_loss=z_loss, label_smoothing=label_smoothing)
    return loss, weight_sum


def nsp_loss(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Next-sentence-prediction loss: logits [b, 2], labels [b] (0 = is next) → mean."""
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.mean(jnp.take_along_axis(log_probs, labels[:, None].astype(jnp.int32), -1))


def _first_argmax(logits: jax.Array) -> jax.Array:
    """argmax over the last axis as the first index holding the row's maximum (see
    `accuracy`)."""
    x = logits.astype(jnp.float32)
    vocab = x.shape[-1]
    row_max = jnp.max(x, axis=-1, keepdims=True)                               # [..., 1]
    index = jnp.arange(vocab, dtype=jnp.int32)
    return jnp.min(jnp.where(x == row_max, index, vocab), axis=-1)             # [...]


def accuracy(logits: jax.Array, targets: jax.Array,
             weights: Optional[jax.Array] = None) -> jax.Array:
    """Weighted fraction of argmax(logits [..., V]) == targets [...].

    The argmax is taken as the first index holding the row's maximum (two plain
    reductions): XLA:CPU runs `jnp.argmax` as a variadic (value, index) reduction that is
    not vectorised, 169-203 ms of a traced GPT-2 small bf16 train step over 50,257 logits
    (benchmarks/README.md). Ties resolve as argmax's do: to the first index.
    """
    correct = (_first_argmax(logits) == targets.astype(jnp.int32)).astype(jnp.float32)
    if weights is None:
        return jnp.mean(correct)
    weights = weights.astype(jnp.float32)
    return jnp.sum(correct * weights) / jnp.maximum(jnp.sum(weights), 1e-8)
