"""DistilBERT-style distillation (Sanh et al. 2019): a frozen BERT teacher trains a student
with half its layers by

  loss = α_ce · T² · CE(softmax(teacher / T), softmax(student / T))   (soft targets)
       + α_mlm · MLM(student)                                        (hard targets)
       + α_cos · (1 − cos(h_student, h_teacher))                     (last hidden states)

the soft and cosine terms over every real token, the MLM term over the masked ones. The
student starts from every other teacher layer (and all of its embeddings and MLM head).
Defaults are the DistilBERT recipe: T = 2, α_ce = 5, α_mlm = 2, α_cos = 1.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import traverse_util

from t2t.models.base import LossConfig, Model
from t2t.models.bert import BertModel
from t2t.nn.config import TransformerConfig
from t2t.nn.gather import gather_positions

Params = Dict[str, Any]


def soft_cross_entropy(student_logits: jax.Array, teacher_logits: jax.Array,
                       weights: jax.Array, temperature: float) -> jax.Array:
    """T² · mean over weighted tokens of −Σ_v softmax(t/T)_v · log softmax(s/T)_v.

    logits [..., vocab], weights [...]. Equal logits give T² times the teacher's entropy at
    T, and a zero gradient (softmax(s/T) − softmax(t/T) = 0).
    """
    t = jax.nn.softmax(jax.lax.stop_gradient(teacher_logits).astype(jnp.float32) / temperature)
    log_s = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature)
    per_token = -jnp.sum(t * log_s, axis=-1)
    return temperature ** 2 * jnp.sum(per_token * weights) / jnp.maximum(jnp.sum(weights), 1.0)


def cosine_loss(student: jax.Array, teacher: jax.Array, weights: jax.Array) -> jax.Array:
    """Mean over weighted tokens of 1 − cos(student, teacher).  [..., d], [..., d], [...]."""
    s, t = student.astype(jnp.float32), jax.lax.stop_gradient(teacher).astype(jnp.float32)
    cos = jnp.sum(s * t, -1) / jnp.maximum(jnp.linalg.norm(s, axis=-1)
                                           * jnp.linalg.norm(t, axis=-1), 1e-8)
    return jnp.sum((1.0 - cos) * weights) / jnp.maximum(jnp.sum(weights), 1.0)


def student_from_teacher(config: TransformerConfig, params: Params, every: int = 2
                         ) -> Tuple[TransformerConfig, Params]:
    """Keep teacher layers 0, every, 2·every, … (renumbered), everything else as it is.

    `params` is a BertModel tree with `encoder/layers/layer_{i}` (not scanned, not shared).
    """
    if config.share_layers or config.scan_layers:
        raise ValueError("student_from_teacher needs a teacher with unshared, unscanned layers "
                         "(load it with scan_layers=False)")
    keep = list(range(0, config.num_encoder_layers, every))
    flat = traverse_util.flatten_dict(nn.unbox(params))
    out = {}
    for path, value in flat.items():
        if path[:2] == ("encoder", "layers"):
            i = int(path[2].split("_")[1])
            if i not in keep:
                continue
            path = path[:2] + (f"layer_{keep.index(i)}",) + path[3:]
        out[path] = value
    return config.replace(num_encoder_layers=len(keep)), traverse_util.unflatten_dict(out)


class DistillationModel(Model):
    """The student's trainer contract (init / loss_fn) around a frozen teacher.

    `teacher` is (config, BertModel params with an MLM head); the student is BertModel with
    `student_config`, initialised by `student_from_teacher` unless `init_from_teacher=False`.
    Teacher parameters enter the compiled step as constants (fine for small teachers).
    """

    family = "distill"
    input_features = ("encoder_input_tokens", "encoder_segment_ids", "token_type_ids",
                      "encoder_positions")

    def __init__(self, teacher: Tuple[TransformerConfig, Params],
                 loss: LossConfig = LossConfig(z_loss=0.0), temperature: float = 2.0,
                 alpha_ce: float = 5.0, alpha_mlm: float = 2.0, alpha_cos: float = 1.0,
                 init_from_teacher: bool = True, every: int = 2):
        teacher_config, teacher_params = teacher
        config, self.initial = student_from_teacher(teacher_config, teacher_params, every)
        super().__init__(config, BertModel(config), loss)
        self.teacher_config = teacher_config
        self.teacher_params = jax.tree.map(jnp.asarray, nn.unbox(teacher_params))
        self.temperature, self.init_from_teacher = temperature, init_from_teacher
        self.alphas = (alpha_ce, alpha_mlm, alpha_cos)

    def init(self, rng, batch):
        boxed = super().init(rng, batch)
        if not self.init_from_teacher:
            return boxed
        initial = traverse_util.flatten_dict(self.initial)
        flat = traverse_util.flatten_dict(boxed, is_leaf=lambda _, x: isinstance(
            x, nn.meta.AxisMetadata))
        return traverse_util.unflatten_dict({
            k: (v.replace_boxed(initial[k]) if isinstance(v, nn.meta.AxisMetadata)
                else initial[k]) if k in initial else v for k, v in flat.items()})

    def _outputs(self, config, params, batch, rng=None):
        rngs = {} if rng is None else {"dropout": rng}

        def run(module):
            hidden = module.encode(batch["encoder_input_tokens"],
                                   batch.get("encoder_segment_ids"), batch.get("token_type_ids"),
                                   batch.get("encoder_positions"), deterministic=rng is None)
            return hidden, module.mlm_head(hidden, module.token_embedder)
        return BertModel(config).apply({"params": params}, rngs=rngs, method=run)

    def loss_fn(self, params, batch, rng: Optional[jax.Array] = None):
        hidden, logits = self._outputs(self.config, params, batch, rng)
        t_hidden, t_logits = self._outputs(self.teacher_config, self.teacher_params, batch)
        real = (jnp.ones(hidden.shape[:2]) if batch.get("encoder_segment_ids") is None
                else (batch["encoder_segment_ids"] > 0).astype(jnp.float32))
        soft = soft_cross_entropy(logits, t_logits, real, self.temperature)
        mlm, m = self.token_loss(gather_positions(logits, batch["masked_positions"]),
                                 batch["masked_ids"], batch["masked_weights"])
        cos = cosine_loss(hidden, t_hidden, real)
        a_ce, a_mlm, a_cos = self.alphas
        loss = a_ce * soft + a_mlm * mlm + a_cos * cos
        return loss, {"loss": loss, "soft_ce": soft, "mlm_loss": mlm, "cosine_loss": cos,
                      "mlm_accuracy": m["accuracy"], "accuracy": m["accuracy"],
                      "num_tokens": m["num_tokens"]}

    def loss_weight(self, batch):
        return jnp.sum(batch["masked_weights"])
