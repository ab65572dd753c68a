"""Optimizers, learning-rate schedules and gradient accumulation (all optax underneath).

* :func:`adamw_bert` — BERT's AdamW: decay off for biases and norm parameters, global-norm
  clipping at 1.0.
* :func:`adafactor_t5` — T5's Adafactor (factored second moments, decay 0.8, no momentum,
  update clipping 1.0, step scaled by the parameter RMS), used with :func:`rsqrt`.
* schedules — ``linear_warmup_linear_decay`` (BERT), ``rsqrt`` (T5), ``cosine``, ``constant``.
* :func:`accumulate_gradients` — microbatching with ``lax.scan``.

``make_schedule`` / ``make_optimizer`` pick one by name (gin binds them in the run layer).
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import optax

from t2t.errors import ConfigError
from t2t.train import param_views

Schedule = Callable[[jax.Array], jax.Array]
LearningRate = Union[float, Schedule]
PyTree = Any

# ----------------------------------------------------------------------------- schedules


def constant(learning_rate: float) -> Schedule:
    """The same value at every step."""
    return optax.constant_schedule(learning_rate)


def linear_warmup_linear_decay(peak: float, warmup_steps: int, total_steps: int,
                               end: float = 0.0) -> Schedule:
    """0 → ``peak`` linearly over ``warmup_steps``, then linearly to ``end`` at ``total_steps``
    (BERT)."""
    _check_warmup("linear_warmup_linear_decay", warmup_steps, total_steps)
    return optax.join_schedules(
        [optax.linear_schedule(0.0, peak, warmup_steps),
         optax.linear_schedule(peak, end, total_steps - warmup_steps)], [warmup_steps])


def rsqrt(base_learning_rate: float = 1.0, warmup_steps: int = 10_000) -> Schedule:
    """T5's inverse square root: ``base / sqrt(max(step, warmup_steps))``.

    With the T5 defaults (base 1.0, 10k warmup) the rate is a constant 0.01 for the first
    10k steps, then decays as 1/sqrt(step).
    """
    floor = max(int(warmup_steps), 1)

    def schedule(step):
        return base_learning_rate * jax.lax.rsqrt(
            jnp.maximum(jnp.asarray(step, jnp.float32), floor))
    return schedule


def cosine(peak: float, warmup_steps: int, total_steps: int, end: float = 0.0) -> Schedule:
    """Linear warmup 0 → ``peak``, then cosine to ``end`` at ``total_steps`` (incl. warmup)."""
    _check_warmup("cosine", warmup_steps, total_steps)
    return optax.warmup_cosine_decay_schedule(0.0, peak, warmup_steps, total_steps, end)


def _check_warmup(name: str, warmup_steps: int, total_steps: int) -> None:
    """A warm-up longer than the run is a config error (optax fails cryptically on it)."""
    if not 0 <= warmup_steps <= total_steps:
        raise ConfigError(f"the {name} schedule needs 0 <= warmup_steps ({warmup_steps}) <= "
                          f"total_steps ({total_steps}): raise --gin.TRAIN_STEPS or lower "
                          "--gin.WARMUP_STEPS (make_schedule.warmup_steps)")


SCHEDULES: dict[str, Callable[..., Schedule]] = {
    "constant": constant,
    "linear_warmup_linear_decay": linear_warmup_linear_decay,
    "rsqrt": rsqrt,
    "cosine": cosine,
}


def make_schedule(name: str, **kwargs: Any) -> Schedule:
    """A schedule by name (one of :data:`SCHEDULES`) with its keyword arguments."""
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; choose one of {sorted(SCHEDULES)}")
    return SCHEDULES[name](**kwargs)


# ----------------------------------------------------------------------------- optimizers




def decay_mask(params: PyTree, no_decay_names: Sequence[str] = ("bias", "scale"),
               no_decay_modules: Sequence[str] = ("norm",)) -> PyTree:
    """Bool tree: True where weight decay applies.

    Excluded: leaves named ``bias`` or ``scale`` (e.g. ``…/query/bias``, a norm's
    ``scale``), and every leaf under a module whose name contains ``norm``
    (case-insensitive: ``pre_attention_norm``, ``embedding_norm``, ``LayerNorm``).
    Kernels and embeddings decay.
    """
    modules = tuple(m.lower() for m in no_decay_modules)

    def one(path, _):
        names = jax.tree_util.keystr(path, simple=True, separator="/").split("/")
        if names and names[-1] in no_decay_names:
            return False
        return not any(m in n.lower() for n in names[:-1] for m in modules)

    return jax.tree_util.tree_map_with_path(one, params)


def adamw_bert(learning_rate: LearningRate, weight_decay: float = 0.01, b1: float = 0.9,
               b2: float = 0.999, eps: float = 1e-6, clip: Optional[float] = 1.0,
               mask: Optional[Callable[[PyTree], PyTree]] = decay_mask
               ) -> optax.GradientTransformation:
    """BERT's AdamW: global-norm clip, Adam, decoupled decay masked by :func:`decay_mask`."""
    adam = optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay,
                       mask=mask)
    return adam if clip is None else optax.chain(optax.clip_by_global_norm(clip), adam)


def adafactor_t5(learning_rate: LearningRate, decay_rate: float = 0.8, factored: bool = True,
                 multiply_by_parameter_scale: bool = True,
                 clipping_threshold: Optional[float] = 1.0, momentum: Optional[float] = None,
                 min_dim_size_to_factor: int = 128, eps: float = 1e-30,
                 weight_decay_rate: Optional[float] = None) -> optax.GradientTransformation:
    """T5's Adafactor (Mesh-TF defaults): ``beta2_t = 1 - t**-decay_rate``, factored second
    moments for matrices with both dims >= ``min_dim_size_to_factor``, no first moment,
    per-parameter update RMS clipped to ``clipping_threshold``, step multiplied by
    ``max(1e-3, RMS(param))``, ``epsilon1 = 1e-30``. Each parameter is seen as Mesh TF
    stored it once the Trainer binds the logical axes (`t2t.train.param_views`): attention
    kernels [d_model, heads * head_dim], every scanned layer its own parameter."""
    return param_views.per_parameter(optax.adafactor(
        learning_rate, min_dim_size_to_factor=min_dim_size_to_factor, decay_rate=decay_rate,
        multiply_by_parameter_scale=multiply_by_parameter_scale,
        clipping_threshold=clipping_threshold, momentum=momentum, eps=eps, factored=factored,
        weight_decay_rate=weight_decay_rate))


OPTIMIZERS: dict[str, Callable[..., optax.GradientTransformation]] = {
    "adamw_bert": adamw_bert,
    "adafactor_t5": adafactor_t5,
}


def make_optimizer(name: str, learning_rate: LearningRate,
                   **kwargs: Any) -> optax.GradientTransformation:
    """An optimizer by name (one of :data:`OPTIMIZERS`); ``learning_rate`` may be a schedule,
    e.g. ``make_optimizer.learning_rate = @make_schedule()`` in gin."""
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {sorted(OPTIMIZERS)}")
    return OPTIMIZERS[name](learning_rate, **kwargs)


# ----------------------------------------------------------------------------- accumulation


def accumulate_gradients(
    loss_and_grad_fn: Callable[[PyTree, PyTree, jax.Array], tuple[tuple[jax.Array, Any], PyTree]],
    params: PyTree, batch: PyTree, rng: jax.Array, num_microbatches: int, *,
    weight_fn: Optional[Callable[[PyTree], jax.Array]] = None, reduction: str = "mean",
) -> tuple[tuple[jax.Array, Any], PyTree]:
    """Splits ``batch`` on axis 0 into microbatches and combines their gradients.

    ``loss_and_grad_fn(params, microbatch, rng) -> ((loss, aux), grads)`` is e.g.
    ``jax.value_and_grad(loss_fn, has_aux=True)``. Semantics of the combination:

    * ``reduction="mean"``: each microbatch loss is a mean over its own normaliser ``w_i``
      (``weight_fn(microbatch)``, e.g. its sum of loss weights; None = all equal). The result
      is ``sum_i w_i * g_i / sum_i w_i`` — exactly the gradient of the whole-batch mean.
    * ``reduction="sum"``: each microbatch loss is already divided by a constant (t5x's fixed
      ``loss_normalizing_factor``), so the whole-batch loss is the plain sum ``sum_i g_i``.

    The loss is combined the same way; ``aux`` comes back stacked, each leaf with a leading
    ``[num_microbatches]`` axis, for the caller to reduce (sums vs means). Each microbatch gets
    its own rng (``rng`` itself when ``num_microbatches == 1``).
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    if num_microbatches < 1:
        raise ValueError(f"num_microbatches must be >= 1, got {num_microbatches}")
    if num_microbatches == 1:
        (loss, aux), grads = loss_and_grad_fn(params, batch, rng)
        return (loss, jax.tree.map(lambda x: jnp.asarray(x)[None], aux)), grads

    def split(x):  # [B, ...] -> [n, B / n, ...]
        if x.shape[0] % num_microbatches:
            raise ValueError(f"batch dimension {x.shape[0]} is not divisible by "
                             f"num_microbatches={num_microbatches}")
        return x.reshape((num_microbatches, x.shape[0] // num_microbatches) + x.shape[1:])

    micro = jax.tree.map(split, batch)
    rngs = jax.random.split(rng, num_microbatches)

    def step(carry, xs):
        grad_sum, loss_sum, weight_sum = carry
        mb, r = xs
        (loss, aux), grads = loss_and_grad_fn(params, mb, r)
        w = (jnp.float32(1.0) if weight_fn is None or reduction == "sum"
             else jnp.asarray(weight_fn(mb), jnp.float32))
        grad_sum = jax.tree.map(lambda s, g: s + w * g.astype(s.dtype), grad_sum, grads)
        return (grad_sum, loss_sum + w * loss, weight_sum + w), aux

    # Accumulate in float32 (bf16 sums over many microbatches lose bits), cast back at the end.
    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.promote_types(p.dtype, jnp.float32)),
                         params)
    init = (zeros, jnp.float32(0.0), jnp.float32(0.0))
    (grad_sum, loss_sum, weight_sum), aux = jax.lax.scan(step, init, (micro, rngs))
    denom = jnp.float32(1.0) if reduction == "sum" else jnp.maximum(weight_sum, 1e-8)
    grads = jax.tree.map(lambda g, p: (g / denom).astype(p.dtype), grad_sum, params)
    return (loss_sum / denom, aux), grads
