"""The model contract every family honours, so the trainer calls every family alike.

`init(rng, batch) -> params` (logically boxed), `loss_fn(params, batch, rng) -> (loss,
metrics)`, `score(params, batch) -> [batch] log-likelihood of the targets`,
`predict(params, batch, **decode_options) -> tokens` (sequence families).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from t2t.models import decoding, losses
from t2t.nn import moe, universal
from t2t.nn.config import TransformerConfig

Batch = Mapping[str, jax.Array]
Metrics = Dict[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Cross-entropy options (t5x defaults: z-loss 1e-4, no smoothing, per-token mean)."""

    z_loss: float = 1e-4
    label_smoothing: float = 0.0
    loss_normalizing_factor: Optional[float] = None


class Model:
    """A flax module plus the pure functions the trainer and evaluator call."""

    family: str = ""
    # Batch features the module consumes (the rest, such as targets, feed the loss).
    input_features: Tuple[str, ...] = ()

    def __init__(self, config: TransformerConfig, module: nn.Module,
                 loss: LossConfig = LossConfig()):
        self.config = config
        self.module = module
        self.loss = loss
        if config.moe_num_experts and type(self).loss_fn is not Model.loss_fn:
            raise ValueError(f"{type(self).__name__} has its own loss, which does not add the "
                             "router losses of mixture-of-experts layers; use a T5 or GPT "
                             "model, or moe_num_experts=0")

    def _inputs(self, batch: Batch) -> Dict[str, jax.Array]:
        return {k: batch[k] for k in self.input_features if k in batch}

    def init(self, rng: jax.Array, batch: Batch) -> Any:
        """Parameters (with logical-axis boxes) for batches shaped like `batch`."""
        return self.module.init({"params": rng, "dropout": rng}, **self._inputs(batch))["params"]

    def apply(self, params, batch: Batch, rng: Optional[jax.Array] = None, **kwargs):
        """Run the module; dropout is on iff an rng is given."""
        rngs = {} if rng is None else {"dropout": rng}
        return self.module.apply({"params": params}, **self._inputs(batch),
                                 deterministic=rng is None, rngs=rngs, **kwargs)

    def apply_with_router_losses(self, params, batch: Batch, rng: Optional[jax.Array] = None
                                 ) -> Tuple[Any, jax.Array, Metrics]:
        """(`apply`'s output, MoE router losses and the Universal Transformer's ponder cost
        to add to the loss, their metrics); the losses are 0 and the metrics empty for a
        model with neither experts nor adaptive computation time."""
        cfg = self.config
        collections = [name for name, on in (
            (moe.MOE_COLLECTION, cfg.moe_num_experts),
            (universal.PONDER_COLLECTION, cfg.universal_steps and cfg.universal_act)) if on]
        if not collections:
            return self.apply(params, batch, rng), jnp.zeros((), jnp.float32), {}
        out, state = self.apply(params, batch, rng, mutable=collections)
        router, router_metrics = moe.router_losses(cfg, state.get(moe.MOE_COLLECTION, {}))
        ponder, ponder_metrics = universal.ponder_loss(cfg, state.get(universal.PONDER_COLLECTION,
                                                                      {}))
        return out, router + ponder, {**router_metrics, **ponder_metrics}

    def token_loss(self, logits, targets, weights) -> Tuple[jax.Array, Metrics]:
        loss, z_loss, weight_sum = losses.cross_entropy_with_logits(
            logits, targets, weights, z_loss=self.loss.z_loss,
            label_smoothing=self.loss.label_smoothing,
            loss_normalizing_factor=self.loss.loss_normalizing_factor)
        metrics = {"loss": loss, "z_loss": z_loss, "num_tokens": weight_sum,
                   "accuracy": losses.accuracy(logits, targets, weights)}
        return loss, metrics

    def loss_fn(self, params, batch: Batch, rng: Optional[jax.Array] = None
                ) -> Tuple[jax.Array, Metrics]:
        logits, router_loss, router_metrics = self.apply_with_router_losses(params, batch, rng)
        loss, metrics = self.token_loss(logits, batch["decoder_target_tokens"],
                                        batch["decoder_loss_weights"])
        if router_metrics:
            loss = loss + router_loss
            metrics = {**metrics, **router_metrics, "loss": loss}
        return loss, metrics

    def loss_weight(self, batch: Batch) -> jax.Array:
        """What the loss is a mean over (target tokens), to combine microbatches exactly."""
        return jnp.sum(batch["decoder_loss_weights"])

    def score(self, params, batch: Batch) -> jax.Array:
        """Sum of target-token log-probabilities per example [batch] (rank classification)."""
        logits = self.apply(params, batch).astype(jnp.float32)
        log_probs = jax.nn.log_softmax(logits, axis=-1)
        targets = batch["decoder_target_tokens"]
        token_lp = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
        return jnp.sum(token_lp * batch["decoder_loss_weights"], axis=-1)

    def predict(self, params, batch: Batch, *, max_decode_length: Optional[int] = None,
                strategy: str = "greedy", eos_id: Optional[int] = 1, **options) -> jax.Array:
        """Decoded tokens [batch, max_decode_length], pad after EOS (`decoding.decode`:
        strategy "greedy" | "sample" | "beam" and their options). The default length is
        the width of `decoder_target_tokens`."""
        if max_decode_length is None:
            max_decode_length = batch["decoder_target_tokens"].shape[1]
        return decoding.decode(self, params, batch, max_decode_length=max_decode_length,
                               strategy=strategy, eos_id=eos_id, **options)
