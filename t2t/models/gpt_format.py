"""GPT-1 fine-tuning (Radford et al. 2018, sec. 3.2-3.3): a linear head on the final hidden
state at the extract token, and the auxiliary LM objective.

Inputs come from `t2t.data.gpt_format` ([batch, rows, length] token rows, each ending in
the extract token ``[e]`` at ``extract_positions`` [batch, rows]). Each row runs through
the pretrained `Decoder` independently; h_l^m, the last layer's state at ``[e]``, feeds
dropout (0.1) and W_y:

* "sum" (classification, entailment, similarity): the rows' h_l^m added elementwise
  (similarity's two orderings, sec. 3.3), then W_y -> [batch, classes] (eq. 3);
* "choice" (multiple choice): W_y -> one score per row, softmaxed over the rows ->
  [batch, choices].

The loss is L3 = L2 + lambda * L1 (eq. 5): L2 the classification cross-entropy (mean over
examples), L1 the LM loss (eq. 1) on the fine-tuning rows themselves — next-token
cross-entropy over every real token after ``[s]`` (the extract token included), a mean
over those tokens (as `OpenAIGPTDoubleHeadsModel`'s ``lm_loss`` with padding ignored);
lambda = 0.5 in the paper (`lm_weight`), 0 switches the auxiliary objective off (Table 5).

The start, delimiter and extract embeddings are the last three rows of the token table:
`init_from_pretrained` appends them, N(0, initializer_range), to a pretrained table three
rows shorter.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from t2t.errors import ConfigError
from t2t.models import losses
from t2t.models.base import Batch, LossConfig, Metrics
from t2t.models.classifiers import Params, FineTuningModel, log_prob
from t2t.models.heads import Classifier
from t2t.nn import mixed_einsum
from t2t.nn.config import TransformerConfig
from t2t.nn.gather import gather_positions
from t2t.nn.stacks import Decoder

COMBINES = ("sum", "choice")
NUM_SPECIAL_TOKENS = 3
FEATURES = ("decoder_input_tokens", "decoder_segment_ids", "extract_positions")


def gather_extract(hidden: jax.Array, extract_positions: jax.Array) -> jax.Array:
    """hidden [rows, length, d], extract_positions [rows] -> h_l^m [rows, d]."""
    return gather_positions(hidden, extract_positions[:, None])[:, 0]


def lm_loss(lm_logits: jax.Array, tokens: jax.Array, segment_ids: jax.Array
            ) -> Tuple[jax.Array, jax.Array]:
    """L1 on the fine-tuning rows: logits [..., length, vocab] at position t predict the
    token at t+1 wherever it is real (segment id > 0). (token mean, token count)."""
    vocab = lm_logits.shape[-1]
    logits = lm_logits[..., :-1, :].reshape(-1, 1, vocab)                # [N, 1, V]
    targets = tokens[..., 1:].reshape(-1, 1)
    weights = (segment_ids[..., 1:] > 0).astype(jnp.float32).reshape(-1, 1)
    loss, _, count = losses.cross_entropy_with_logits(logits, targets, weights, z_loss=0.0)
    return loss, count


def combined_loss(task_loss: jax.Array, auxiliary_lm_loss: jax.Array,
                  lm_weight: float) -> jax.Array:
    """L3 = L2 + lambda * L1 (eq. 5)."""
    return task_loss + lm_weight * auxiliary_lm_loss


class GptFormatHead(nn.Module):
    """[batch, rows, length] rows -> {"logits": [batch, classes] ("sum") or [batch, rows]
    ("choice"), "lm_logits": [batch, rows, length, vocab]}."""

    config: TransformerConfig
    num_outputs: int
    combine: str = "sum"
    classifier_dropout: float = 0.1

    def setup(self):
        cfg = self.config
        if self.combine not in COMBINES:
            raise ConfigError(f"combine={self.combine!r}; choose one of {list(COMBINES)}")
        if not cfg.tie_embeddings or cfg.output_layer != "softmax" or cfg.embedding_dim:
            raise ConfigError("the GPT fine-tuning format needs tie_embeddings=True, "
                              "output_layer='softmax' and no embedding_dim (its LM logits "
                              "read the token table)")
        self.decoder = Decoder(cfg, name="decoder")
        self.classifier = Classifier(cfg, 1 if self.combine == "choice" else self.num_outputs,
                                     dropout_rate=self.classifier_dropout, name="classifier")

    def __call__(self, decoder_input_tokens, decoder_segment_ids=None, extract_positions=None,
                 *, deterministic: bool = True) -> Dict[str, jax.Array]:
        cfg = self.config
        b, r, l = decoder_input_tokens.shape
        flat = lambda x: None if x is None else x.reshape(b * r, *x.shape[2:])  # noqa: E731
        if extract_positions is None:
            raise ConfigError("the GPT fine-tuning format needs `extract_positions`")
        hidden = self.decoder(flat(decoder_input_tokens), None, flat(decoder_segment_ids),
                              deterministic=deterministic, return_hidden=True)  # [b*r, l, d]
        table = nn.unbox(self.decoder.variables["params"]["token_embedder"]["embedding"])
        lm_logits = mixed_einsum.einsum("...d,vd->...v", hidden, table,
                                        cfg.compute_dtype).astype(cfg.compute_dtype)
        h = gather_extract(hidden, flat(extract_positions)).reshape(b, r, -1)  # [b, r, d]
        if self.combine == "sum":
            logits = self.classifier(jnp.sum(h, axis=1), deterministic=deterministic)
        else:
            logits = self.classifier(h, deterministic=deterministic)[..., 0]   # [b, r]
        return {"logits": logits, "lm_logits": lm_logits.reshape(b, r, l, -1)}


def extend_token_table(pretrained: Params, rows: int, rng: jax.Array, std: float) -> Params:
    """`pretrained` (a `Decoder` tree) with its token table grown to `rows` by new
    N(0, std) rows (the start/delimiter/extract embeddings); unchanged when it is not
    shorter."""
    table = pretrained["token_embedder"]["embedding"]                     # [V, d]
    if table.shape[0] >= rows:
        return pretrained
    new = jax.random.normal(rng, (rows - table.shape[0], table.shape[1]), table.dtype) * std
    grown = jnp.concatenate([jnp.asarray(table), new])                    # [rows, d]
    return {**pretrained, "token_embedder": {**pretrained["token_embedder"],
                                             "embedding": grown}}


class GptFormatClassifier(FineTuningModel):
    """The GPT-1 fine-tuning model (module docstring). `num_classes` for "sum", the number
    of choices for "choice"; `lm_weight` is lambda. Pretrained `Decoder` trees (a t2t GPT
    MODEL_DIR, `load_pretrained` of a GPT-2 / openai-gpt directory) go under `decoder`,
    their token table grown by the three special tokens. Feature `label` [batch]."""

    family = "gpt"
    input_features = FEATURES
    weight_key = "decoder_segment_ids"
    pretrained_prefix = ("decoder",)
    required_modules = ("decoder",)

    def __init__(self, config: TransformerConfig, num_classes: int, combine: str = "sum",
                 lm_weight: float = 0.5, classifier_dropout: float = 0.1,
                 pretrained: Optional[Params] = None):
        super().__init__(config, GptFormatHead(config, num_classes, combine, classifier_dropout),
                         LossConfig(z_loss=0.0), pretrained)
        self.num_classes, self.combine, self.lm_weight = num_classes, combine, lm_weight

    def init_from_pretrained(self, rng: jax.Array, batch: Batch, pretrained_params: Params, *,
                             return_report: bool = False):
        tree = nn.unbox(pretrained_params)
        if set(tree) == {"params"}:
            tree = tree["params"]
        if "decoder" not in tree:                        # a bare Decoder tree: grow its table
            tree = extend_token_table(tree, self.config.vocab_size, jax.random.fold_in(rng, 1),
                                      self.config.initializer_range)
        return super().init_from_pretrained(rng, batch, tree, return_report=return_report)

    def _logits(self, params, batch: Batch, rng=None) -> Dict[str, jax.Array]:
        out = self.apply(params, batch, rng)
        width = out["logits"].shape[1]
        if width != self.num_classes:
            raise ValueError(f"the batch has {width} choices, the model {self.num_classes}")
        return out

    def loss_fn(self, params, batch: Batch, rng: Optional[jax.Array] = None
                ) -> Tuple[jax.Array, Metrics]:
        out = self._logits(params, batch, rng)
        task_loss, metrics = self._classification_loss(out["logits"], batch["label"],
                                                       self.weights(batch))
        aux, tokens = lm_loss(out["lm_logits"], batch["decoder_input_tokens"],
                              batch["decoder_segment_ids"])
        loss = combined_loss(task_loss, aux, self.lm_weight)
        return loss, {**metrics, "loss": loss, "task_loss": task_loss, "lm_loss": aux,
                      "lm_tokens": tokens}

    def score(self, params, batch: Batch) -> jax.Array:
        """log p(label) [batch]."""
        return log_prob(self._logits(params, batch)["logits"], batch["label"])

    def predict(self, params, batch: Batch, **_) -> jax.Array:
        """The predicted class or choice [batch]."""
        return jnp.argmax(self._logits(params, batch)["logits"], axis=-1)
