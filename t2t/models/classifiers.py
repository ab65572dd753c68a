"""Fine-tuning models (GLUE, STS-B, NER, SQuAD 2.0, SWAG, GPT classification) that honour
the `Model` contract, so `Trainer` / `fit` train them unchanged.

The BERT-style modules keep `BertModel`'s names for the shared parts (`token_embedder`,
`encoder`, `pooler`), and the GPT-style one puts a `Decoder` under `decoder`, so a
`t2t.convert.hf.load_bert` / `load_gpt2` tree or a t2t pretraining checkpoint plugs in via
`init_from_pretrained` (or the `pretrained=` constructor argument, which makes `init` do it).

Batch features: `encoder_input_tokens`, `encoder_segment_ids` (1 tokens / 0 pad),
`token_type_ids` ([batch, length] int32; [batch, num_choices, length] for multiple choice),
plus `label` [batch], `target` [batch] float, `tag_labels` [batch, length] (-1 = ignore),
`start_positions` / `end_positions` [batch] (0 = [CLS] = no answer). A row with no real
token (all segment ids 0) is a padding row and carries no loss weight.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from t2t.models import losses
from t2t.models.base import Batch, LossConfig, Metrics, Model
from t2t.models.heads import BERT_POOLER, Classifier, Pooler, PoolerStyle
from t2t.nn.config import TransformerConfig
from t2t.nn.dropout import Dropout
from t2t.nn.embed import token_embed
from t2t.errors import ConfigError
from t2t.nn.stacks import Decoder, Encoder, EncoderDecoder

_log = logging.getLogger(__name__)

Params = Any
Path = Tuple[str, ...]
NEG_INF = -1e9  # masked span logits (finite: softmax of a fully masked row stays NaN-free)

ENCODER_FEATURES = ("encoder_input_tokens", "encoder_segment_ids", "token_type_ids",
                    "encoder_positions")
DECODER_FEATURES = ("decoder_input_tokens", "decoder_segment_ids", "decoder_positions")


# ----------------------------------------------------------------------------- modules
class BertTrunk(nn.Module):
    """`token_embedder` + `encoder`, named as in `BertModel`. Subclasses add heads."""

    config: TransformerConfig

    def setup(self):
        self.token_embedder = token_embed(self.config, "token_embedder")
        self.encoder = Encoder(self.config, self.token_embedder, name="encoder")

    def encode(self, encoder_input_tokens, encoder_segment_ids=None, token_type_ids=None,
               encoder_positions=None, *, deterministic: bool = True) -> jax.Array:
        """[batch, length] -> last hidden state [batch, length, d_model]."""
        return self.encoder(encoder_input_tokens, encoder_segment_ids, encoder_positions,
                            token_type_ids, deterministic=deterministic)


def last_token_index(segment_ids: Optional[jax.Array], length: int, batch: int) -> jax.Array:
    """Index of each row's last real token [batch] (segment id > 0); length-1 without ids."""
    if segment_ids is None:
        return jnp.full((batch,), length - 1, jnp.int32)
    idx = jnp.arange(length, dtype=jnp.int32)
    return jnp.max(jnp.where(segment_ids > 0, idx, 0), axis=-1)


POOLINGS = ("cls", "last")


class BiLstm(nn.Module):
    """A bidirectional LSTM over each row's first `lengths` steps -> its final forward and
    backward hidden states concatenated: [batch, length, d] -> [batch, 2 * units], or with
    `sequence` every step's: [batch, length, 2 * units].
    (BERT Table 5's "+ BiLSTM" row, randomly initialised at fine-tuning.)"""

    units: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    sequence: bool = False

    @nn.compact
    def __call__(self, x: jax.Array, lengths: jax.Array) -> jax.Array:
        boxed = nn.with_logical_partitioning
        cell = functools.partial(
            nn.OptimizedLSTMCell, self.units, dtype=self.dtype, param_dtype=self.param_dtype,
            kernel_init=boxed(nn.initializers.lecun_normal(), ("embed", None)),
            recurrent_kernel_init=boxed(nn.initializers.orthogonal(), (None, None)),
            bias_init=boxed(nn.initializers.zeros_init(), (None,)))
        bilstm = nn.Bidirectional(nn.RNN(cell(name="forward")), nn.RNN(cell(name="backward")),
                                  return_carry=True)
        # A length-0 (padding) row reads one step: finite, and it carries no loss weight.
        (forward, backward), steps = bilstm(x, seq_lengths=jnp.maximum(lengths, 1))
        if self.sequence:
            return steps                                              # [b, l, 2 units]
        return jnp.concatenate([forward[1], backward[1]], axis=-1)   # carries are (c, h)


class PooledHead(BertTrunk):
    """Hidden states -> a row vector -> dropout -> dense: [batch, num_outputs].

    The row vector: the pooler (dense + tanh) over the [CLS] (`pooling="cls"`, BERT) or over
    the last real token (`"last"`: a left-to-right trunk's [CLS] sees only itself); or,
    with `bilstm_units`, a fresh `BiLstm` over the real tokens (then `pooling` is unused).
    `style` is the family's pooler (`PoolerStyle`: RoBERTa's and ELECTRA's classification
    heads drop out before the dense too, ELECTRA's activation is gelu, DistilBERT's relu).
    """

    num_outputs: int = 2
    pooling: str = "cls"
    bilstm_units: Optional[int] = None
    style: PoolerStyle = BERT_POOLER

    def setup(self):
        super().setup()
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling={self.pooling!r}; choose one of {list(POOLINGS)}")
        cfg = self.config
        if self.bilstm_units:
            self.bilstm = BiLstm(self.bilstm_units, cfg.compute_dtype, cfg.params_dtype,
                                 name="bilstm")
        else:
            self.pooler = Pooler(cfg, self.style.activation, name="pooler")
            if self.style.dropout_first:
                self.first_dropout = Dropout(cfg.dropout_rate)
        self.classifier = Classifier(cfg, self.num_outputs, name="classifier")

    def __call__(self, encoder_input_tokens, encoder_segment_ids=None, token_type_ids=None,
                 encoder_positions=None, *, deterministic: bool = True) -> jax.Array:
        hidden = self.encode(encoder_input_tokens, encoder_segment_ids, token_type_ids,
                             encoder_positions, deterministic=deterministic)   # [b, l, d]
        b, l = encoder_input_tokens.shape
        last = last_token_index(encoder_segment_ids, l, b)                     # [b]
        if self.bilstm_units:
            row = self.bilstm(hidden, last + 1)                                # [b, 2 units]
        else:
            first = hidden[jnp.arange(b), last][:, None] if self.pooling == "last" \
                else hidden[:, :1]                                             # [b, 1, d]
            if self.style.dropout_first:
                first = self.first_dropout(first, deterministic=deterministic)
            row = self.pooler(first)                                           # [b, d]
        return self.classifier(row, deterministic=deterministic)


class ChoiceHead(PooledHead):
    """Inputs [batch, num_choices, length] -> one [CLS] logit per choice [batch, num_choices]."""

    num_outputs: int = 1

    def __call__(self, encoder_input_tokens, encoder_segment_ids=None, token_type_ids=None,
                 encoder_positions=None, *, deterministic: bool = True) -> jax.Array:
        b, c, l = encoder_input_tokens.shape
        flat = lambda x: None if x is None else x.reshape(b * c, l)  # noqa: E731
        logits = super().__call__(flat(encoder_input_tokens), flat(encoder_segment_ids),
                                  flat(token_type_ids), flat(encoder_positions),
                                  deterministic=deterministic)        # [b*c, 1]
        return logits.reshape(b, c)


class TokenHead(BertTrunk):
    """Per-token logits [batch, length, num_labels] (dropout + dense on every hidden state)."""

    num_labels: int = 2

    def setup(self):
        super().setup()
        self.tagger = Classifier(self.config, self.num_labels, name="tagger")

    def __call__(self, encoder_input_tokens, encoder_segment_ids=None, token_type_ids=None,
                 encoder_positions=None, *, deterministic: bool = True) -> jax.Array:
        hidden = self.encode(encoder_input_tokens, encoder_segment_ids, token_type_ids,
                             encoder_positions, deterministic=deterministic)
        return self.tagger(hidden, deterministic=deterministic)


class SpanHead(BertTrunk):
    """BERT SQuAD head: one dense to (start, end) logits, each [batch, length]; with
    `bilstm_units` over a fresh `BiLstm`'s per-token states (BERT Table 5's "+ BiLSTM")."""

    bilstm_units: Optional[int] = None

    def setup(self):
        super().setup()
        cfg = self.config
        if self.bilstm_units:
            self.bilstm = BiLstm(self.bilstm_units, cfg.compute_dtype, cfg.params_dtype,
                                 sequence=True, name="bilstm")
        self.qa_outputs = Classifier(cfg, 2, dropout_rate=0.0, name="qa_outputs")

    def __call__(self, encoder_input_tokens, encoder_segment_ids=None, token_type_ids=None,
                 encoder_positions=None, *, deterministic: bool = True) -> Dict[str, jax.Array]:
        hidden = self.encode(encoder_input_tokens, encoder_segment_ids, token_type_ids,
                             encoder_positions, deterministic=deterministic)   # [b, l, d]
        if self.bilstm_units:
            b, l = encoder_input_tokens.shape
            hidden = self.bilstm(hidden, last_token_index(encoder_segment_ids, l, b) + 1)
        logits = self.qa_outputs(hidden).astype(jnp.float32)         # [b, l, 2]
        return {"start_logits": logits[..., 0], "end_logits": logits[..., 1]}


class LastTokenHead(nn.Module):
    """GPT classification: the final hidden state of each row's last real token -> dense
    (`bias=False`: without a bias, as GPT-2's `score`)."""

    config: TransformerConfig
    num_classes: int = 2
    bias: bool = True

    def setup(self):
        self.decoder = Decoder(self.config, name="decoder")
        self.classifier = Classifier(self.config, self.num_classes, use_bias=self.bias,
                                     name="classifier")

    def __call__(self, decoder_input_tokens, decoder_segment_ids=None, decoder_positions=None,
                 *, deterministic: bool = True) -> jax.Array:
        b, l = decoder_input_tokens.shape
        hidden = self.decoder(decoder_input_tokens, None, decoder_segment_ids, None,
                              decoder_positions, deterministic=deterministic,
                              return_hidden=True)                         # [b, l, d]
        last = last_token_index(decoder_segment_ids, l, b)
        return self.classifier(hidden[jnp.arange(b), last], deterministic=deterministic)


class DecoderTokenHead(nn.Module):
    """Per-token logits of a left-to-right trunk [batch, length, num_labels] (GPT-2's token
    classification: dropout + dense on every final hidden state of the `decoder`)."""

    config: TransformerConfig
    num_labels: int = 2

    def setup(self):
        self.decoder = Decoder(self.config, name="decoder")
        self.tagger = Classifier(self.config, self.num_labels, name="tagger")

    def __call__(self, decoder_input_tokens, decoder_segment_ids=None, decoder_positions=None,
                 *, deterministic: bool = True) -> jax.Array:
        hidden = self.decoder(decoder_input_tokens, None, decoder_segment_ids, None,
                              decoder_positions, deterministic=deterministic,
                              return_hidden=True)                         # [b, l, d]
        return self.tagger(hidden, deterministic=deterministic)


def shift_inputs_right(tokens: jax.Array, start_id: int, xp=jnp) -> jax.Array:
    """BART's decoder inputs of a classification row: the row shifted right by one,
    `start_id` first ([batch, length] -> [batch, length]; as HF's `shift_tokens_right`).
    `xp`: the array module (jax.numpy in a model; numpy for host rows)."""
    start = xp.full(tokens.shape[:-1] + (1,), start_id, tokens.dtype)
    return xp.concatenate([start, tokens[..., :-1]], axis=-1)


def last_eos_index(tokens: jax.Array, segment_ids: Optional[jax.Array], eos_id: int) -> jax.Array:
    """Index of each row's last `eos_id` among its real tokens [batch]; a row without one:
    its last real token (`last_token_index`)."""
    b, l = tokens.shape
    real = jnp.ones_like(tokens, bool) if segment_ids is None else segment_ids > 0
    idx = jnp.arange(l, dtype=jnp.int32)
    is_eos = (tokens == eos_id) & real
    return jnp.where(jnp.any(is_eos, axis=-1), jnp.max(jnp.where(is_eos, idx, -1), axis=-1),
                     last_token_index(segment_ids, l, b))


# BART's classification head: dropout, dense, tanh, dropout, out_proj
BART_HEAD = PoolerStyle("tanh", dropout_first=True)


class EosPooledHead(EncoderDecoder):
    """BART sequence classification (Lewis et al. 2020, sec. 3.1): the same row feeds the
    encoder and, shifted right with `config.decoder_start_id` first, the decoder; the
    decoder's final state at the row's last `eos_id` (`last_eos_index`) goes through the
    classification head (`style`: dropout -> dense -> tanh -> dropout -> dense) ->
    [batch, num_outputs]. Parameters as `EncoderDecoder`'s (`token_embedder`, `encoder`,
    `decoder`; the decoder's logits bias is not used) plus `pooler` and `classifier`."""

    num_outputs: int = 2
    eos_id: int = 2
    style: PoolerStyle = BART_HEAD

    def setup(self):
        super().setup()
        cfg = self.config
        self.pooler = Pooler(cfg, self.style.activation, name="pooler")
        self.first_dropout = Dropout(cfg.dropout_rate if self.style.dropout_first else 0.0)
        self.classifier = Classifier(cfg, self.num_outputs, name="classifier")

    def __call__(self, encoder_input_tokens, encoder_segment_ids=None, token_type_ids=None,
                 encoder_positions=None, decoder_input_tokens=None, *,
                 deterministic: bool = True) -> jax.Array:
        del token_type_ids          # BART has no token types
        if decoder_input_tokens is None:
            decoder_input_tokens = shift_inputs_right(encoder_input_tokens,
                                                      self.config.decoder_start_id)
        encoded = self.encode(encoder_input_tokens, encoder_segment_ids, encoder_positions,
                              deterministic=deterministic)
        hidden = self.decoder(decoder_input_tokens, encoded, None, encoder_segment_ids,
                              deterministic=deterministic, return_hidden=True)   # [b, l, d]
        b = encoder_input_tokens.shape[0]
        last = last_eos_index(encoder_input_tokens, encoder_segment_ids, self.eos_id)
        row = self.first_dropout(hidden[jnp.arange(b), last][:, None],
                                 deterministic=deterministic)                   # [b, 1, d]
        return self.classifier(self.pooler(row), deterministic=deterministic)


# ----------------------------------------------------------------------------- pretrained
@dataclasses.dataclass
class LoadReport:
    """Which leaves `merge_pretrained` copied, which stayed freshly initialised (new) and
    which pretrained leaves had no place in the target (unused, e.g. `mlm_head`); `reset`:
    head leaves (outside the required modules) the pretrained tree has in another shape,
    e.g. a classifier over another number of labels, left freshly initialised (and also
    counted as new)."""

    copied: List[str]
    new: List[str]
    unused: List[str]
    reset: List[str] = dataclasses.field(default_factory=list)

    def summary(self) -> str:
        top = lambda paths: sorted({p.split("/")[0] for p in paths})  # noqa: E731
        return (f"copied {len(self.copied)} leaves ({', '.join(top(self.copied))}); "
                f"new {len(self.new)} ({', '.join(top(self.new)) or '-'}); "
                f"unused {len(self.unused)} ({', '.join(top(self.unused)) or '-'})")


def _flat(tree) -> Dict[Path, Any]:
    if isinstance(tree, Mapping) and set(tree) == {"params"}:
        tree = tree["params"]
    return traverse_util.flatten_dict(nn.unbox(tree))


def merge_pretrained(params: Params, pretrained: Params, *, prefix: Path = (),
                     required: Sequence[str] = ()) -> Tuple[Params, LoadReport]:
    """Copy every pretrained leaf whose path (under `prefix`) exists in `params`.

    `params` may hold logical-partitioning boxes (kept). Raises on a shape mismatch in the
    `required` top-level modules (the trunk), and when a leaf under one of them has no
    pretrained value (a wrong tree, or one saved with another layer layout such as
    `scan_layers`). A head leaf of another shape (a fine-tuned classifier over another
    number of labels) stays freshly initialised (`LoadReport.reset`).
    """
    source = {prefix + k: v for k, v in _flat(pretrained).items()}
    target = _flat(params)
    copied, new, errors, reset = [], [], [], []
    for path, value in target.items():
        name = "/".join(path)
        if path not in source:
            new.append(name)
            continue
        src = source[path]
        if tuple(src.shape) != tuple(value.shape):
            if path[0] not in required:
                reset.append(f"{name} {tuple(src.shape)} -> {tuple(value.shape)}")
                new.append(name)
                continue
            errors.append(f"{name}: pretrained {tuple(src.shape)} vs model {tuple(value.shape)}")
        copied.append(name)
    if errors:
        raise ValueError("pretrained parameters do not fit the model (shape mismatch):\n  "
                         + "\n  ".join(errors))
    missing = [n for n in new if n.split("/")[0] in required]
    if missing:
        raise ValueError(f"pretrained parameters lack {len(missing)} leaves of the shared "
                         f"modules {tuple(required)}, e.g. {missing[:3]}; is the tree from "
                         "another model or saved with another layer layout (scan_layers)?")
    unused = ["/".join(p) for p in source if p not in target]
    report = LoadReport(copied, new, unused, reset)
    fresh = {tuple(n.split("/")) for n in new}

    def one(path, leaf):
        key = tuple(getattr(k, "key", getattr(k, "name", None)) for k in path)
        if key not in source or key in fresh:
            return leaf
        is_box = isinstance(leaf, nn.Partitioned)
        value = leaf.unbox() if is_box else leaf
        new_value = jnp.asarray(source[key], dtype=value.dtype)
        return leaf.replace_boxed(new_value) if is_box else new_value

    merged = jax.tree_util.tree_map_with_path(
        one, params, is_leaf=lambda x: isinstance(x, nn.Partitioned))
    return merged, report


# ----------------------------------------------------------------------------- models
def example_weights(batch: Batch, key: str = "encoder_segment_ids") -> jax.Array:
    """[batch] float: 1 for rows with a real token, 0 for padding rows (1 without ids)."""
    seg = batch.get(key)
    if seg is None:
        first = next(iter(batch.values()))
        return jnp.ones((first.shape[0],), jnp.float32)
    return jnp.any(seg.reshape(seg.shape[0], -1) > 0, axis=-1).astype(jnp.float32)


def log_prob(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """log softmax(logits [..., C]) at labels [...] -> [...]."""
    lp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return jnp.take_along_axis(lp, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]


class FineTuningModel(Model):
    """Shared parts: constructor, pretrained loading, example-weighted cross-entropy."""

    family = "bert"
    input_features = ENCODER_FEATURES
    weight_key = "encoder_segment_ids"
    pretrained_prefix: Path = ()          # where the pretrained tree's root goes
    required_modules: Tuple[str, ...] = ("token_embedder", "encoder")

    def __init__(self, config: TransformerConfig, module: nn.Module,
                 loss: LossConfig = LossConfig(z_loss=0.0), pretrained: Optional[Params] = None):
        super().__init__(config, module, loss)
        self.pretrained = pretrained

    def init(self, rng: jax.Array, batch: Batch) -> Params:
        """Fresh parameters, or `init_from_pretrained` when built with `pretrained=`."""
        if self.pretrained is not None:
            return self.init_from_pretrained(rng, batch, self.pretrained)
        return self.fresh_init(rng, batch)

    def fresh_init(self, rng: jax.Array, batch: Batch) -> Params:
        """Randomly initialised parameters (logically boxed)."""
        return Model.init(self, rng, batch)

    def init_from_pretrained(self, rng: jax.Array, batch: Batch, pretrained_params: Params, *,
                             return_report: bool = False):
        """New heads initialised, every matching pretrained subtree copied (see
        `merge_pretrained`); logs which. With `return_report`: (params, LoadReport).

        Runs under one `jax.jit` with the pretrained tree as an argument, so the discarded
        initialisers of the copied parts are dead code (no compile or compute for them).
        """
        prefix = self.pretrained_prefix
        if prefix and any(k[:len(prefix)] == prefix for k in _flat(pretrained_params)):
            prefix = ()                   # already a tree of this model (a fine-tuned one)
        shapes = {k: (v.shape, v.dtype) for k, v in batch.items()}
        reports: List[LoadReport] = []

        def build(rng, pretrained):
            zeros = {k: jnp.zeros(s, d) for k, (s, d) in shapes.items()}
            merged, report = merge_pretrained(self.fresh_init(rng, zeros), pretrained,
                                              prefix=prefix, required=self.required_modules)
            reports.append(report)        # trace-time side output
            return merged

        pretrained_params = nn.unbox(pretrained_params)
        if isinstance(pretrained_params, Mapping) and set(pretrained_params) == {"params"}:
            pretrained_params = pretrained_params["params"]
        params = jax.jit(build)(rng, pretrained_params)
        _log.info("%s.init_from_pretrained: %s", type(self).__name__, reports[-1].summary())
        if reports[-1].reset:
            _log.warning("the pretrained head does not fit this task, initialised fresh: %s",
                         ", ".join(reports[-1].reset))
        return (params, reports[-1]) if return_report else params

    def derived_features(self, features: Batch) -> Batch:
        """The features this model reads beyond a task's rows, added (none here)."""
        return features

    def weights(self, batch: Batch) -> jax.Array:
        return example_weights(batch, self.weight_key)

    def loss_weight(self, batch: Batch) -> jax.Array:
        """Number of (non-padding) examples."""
        return jnp.sum(self.weights(batch))

    def _classification_loss(self, logits, labels, weights) -> Tuple[jax.Array, Metrics]:
        loss, z_loss, n = losses.cross_entropy_with_logits(
            logits, labels, weights, z_loss=self.loss.z_loss,
            label_smoothing=self.loss.label_smoothing,
            loss_normalizing_factor=self.loss.loss_normalizing_factor)
        return loss, {"loss": loss, "z_loss": z_loss, "num_tokens": n,
                      "accuracy": losses.accuracy(logits, labels, weights)}


class SequenceClassifier(FineTuningModel):
    """GLUE-style classification of a sentence or a sentence pair (`token_type_ids`) from
    the pooled [CLS] (`pooling="cls"`), the pooled last real token (`"last"`, for a
    left-to-right trunk: `TransformerConfig.encoder_causal`), or a randomly initialised
    BiLSTM over the final hidden states (`bilstm_units`; BERT Table 5). Pretrained weights
    load into the trunk (and pooler); the BiLSTM and classifier start fresh.
    Feature: `label` [batch] int."""

    def __init__(self, config: TransformerConfig, num_classes: int, pooling: str = "cls",
                 bilstm_units: Optional[int] = None, loss: LossConfig = LossConfig(z_loss=0.0),
                 pretrained: Optional[Params] = None, style: PoolerStyle = BERT_POOLER):
        super().__init__(config, PooledHead(config, num_classes, pooling, bilstm_units, style),
                         loss, pretrained)
        self.num_classes = num_classes

    def loss_fn(self, params, batch: Batch, rng: Optional[jax.Array] = None):
        logits = self.apply(params, batch, rng)                        # [b, C]
        return self._classification_loss(logits, batch["label"], self.weights(batch))

    def score(self, params, batch: Batch) -> jax.Array:
        """log p(label) [batch]."""
        return log_prob(self.apply(params, batch), batch["label"])

    def predict(self, params, batch: Batch, **_) -> jax.Array:
        """Predicted class [batch]."""
        return jnp.argmax(self.apply(params, batch), axis=-1)


class Regressor(FineTuningModel):
    """STS-B-style regression: one output from the pooled [CLS], MSE on `target` [batch]."""

    def __init__(self, config: TransformerConfig, pretrained: Optional[Params] = None,
                 style: PoolerStyle = BERT_POOLER):
        super().__init__(config, PooledHead(config, 1, style=style), LossConfig(z_loss=0.0),
                         pretrained)

    def loss_fn(self, params, batch: Batch, rng: Optional[jax.Array] = None):
        pred = self.apply(params, batch, rng)[:, 0].astype(jnp.float32)   # [b]
        w = self.weights(batch)
        n = jnp.sum(w)
        err = pred - batch["target"].astype(jnp.float32)
        mse = jnp.sum(w * err ** 2) / jnp.maximum(n, 1e-8)
        mae = jnp.sum(w * jnp.abs(err)) / jnp.maximum(n, 1e-8)
        return mse, {"loss": mse, "mse": mse, "mae": mae, "num_tokens": n}

    def score(self, params, batch: Batch) -> jax.Array:
        """Negative squared error [batch] (the Gaussian log-likelihood up to constants)."""
        pred = self.apply(params, batch)[:, 0].astype(jnp.float32)
        return -(pred - batch["target"].astype(jnp.float32)) ** 2

    def predict(self, params, batch: Batch, **_) -> jax.Array:
        """Predicted value [batch] float32."""
        return self.apply(params, batch)[:, 0].astype(jnp.float32)


class TokenTagger(FineTuningModel):
    """NER-style tagging (BIO label ids): per-token logits; the loss covers only tokens whose
    `tag_labels` [batch, length] is >= 0 (first sub-tokens; -1 marks the rest, specials, pad)."""

    def __init__(self, config: TransformerConfig, num_labels: int,
                 loss: LossConfig = LossConfig(z_loss=0.0), pretrained: Optional[Params] = None):
        super().__init__(config, TokenHead(config, num_labels), loss, pretrained)
        self.num_labels = num_labels

    def weights(self, batch: Batch) -> jax.Array:
        return (batch["tag_labels"] >= 0).astype(jnp.float32)           # [b, l]

    def loss_weight(self, batch: Batch) -> jax.Array:
        """Number of labelled tokens."""
        return jnp.sum(self.weights(batch))

    def loss_fn(self, params, batch: Batch, rng: Optional[jax.Array] = None):
        logits = self.apply(params, batch, rng)                          # [b, l, K]
        labels = jnp.maximum(batch["tag_labels"], 0)
        return self._classification_loss(logits, labels, self.weights(batch))

    def score(self, params, batch: Batch) -> jax.Array:
        """Sum of log p(tag) over the labelled tokens [batch]."""
        lp = log_prob(self.apply(params, batch), jnp.maximum(batch["tag_labels"], 0))
        return jnp.sum(lp * self.weights(batch), axis=-1)

    def predict(self, params, batch: Batch, **_) -> jax.Array:
        """Tag ids [batch, length]; -1 on padding (segment id 0)."""
        tags = jnp.argmax(self.apply(params, batch), axis=-1).astype(jnp.int32)
        seg = batch.get("encoder_segment_ids")
        return tags if seg is None else jnp.where(seg > 0, tags, -1)


def select_spans(start_logits: jax.Array, end_logits: jax.Array, context_mask: jax.Array, *,
                 max_answer_length: int = 30, null_threshold: float = 0.0,
                 null_index: int = 0) -> Dict[str, jax.Array]:
    """SQuAD 2.0 decoding. Logits [batch, length], context_mask bool [batch, length].

    The best span maximises start + end logits with start <= end, end - start + 1 <=
    `max_answer_length`, both inside the context. It is answered with "no answer" — (0, 0),
    the [CLS] position — when `null_score - best_span_score > null_threshold` (null_score =
    start + end logit at `null_index`) or no span is allowed. Returns {"start", "end"}
    [batch] int32 and {"span_score", "null_score"} [batch] float32.
    """
    b, l = start_logits.shape
    s = start_logits.astype(jnp.float32)
    e = end_logits.astype(jnp.float32)
    i = jnp.arange(l)[:, None]
    j = jnp.arange(l)[None, :]
    allowed = (j >= i) & (j - i < max_answer_length)                     # [l, l]
    allowed = allowed[None] & context_mask[:, :, None] & context_mask[:, None, :]
    scores = jnp.where(allowed, s[:, :, None] + e[:, None, :], -jnp.inf)  # [b, l, l]
    flat = scores.reshape(b, l * l)
    best = jnp.argmax(flat, axis=-1)
    span_score = jnp.max(flat, axis=-1)
    null_score = s[:, null_index] + e[:, null_index]
    is_null = (null_score - span_score > null_threshold) | ~jnp.isfinite(span_score)
    start = jnp.where(is_null, null_index, best // l).astype(jnp.int32)
    end = jnp.where(is_null, null_index, best % l).astype(jnp.int32)
    return {"start": start, "end": end, "span_score": span_score, "null_score": null_score}


class SpanQA(FineTuningModel):
    """SQuAD (1.1 and 2.0) extractive QA: start/end logits over the tokens; position 0 (the
    [CLS]) is the no-answer. Features `start_positions`, `end_positions` [batch]; the context
    is `token_type_ids == 1` on real tokens unless the batch has `context_mask`."""

    def __init__(self, config: TransformerConfig, loss: LossConfig = LossConfig(z_loss=0.0),
                 pretrained: Optional[Params] = None, bilstm_units: Optional[int] = None):
        super().__init__(config, SpanHead(config, bilstm_units=bilstm_units), loss, pretrained)

    def _logits(self, params, batch: Batch, rng=None) -> Tuple[jax.Array, jax.Array]:
        out = self.apply(params, batch, rng)
        seg = batch.get("encoder_segment_ids")
        if seg is None:
            return out["start_logits"], out["end_logits"]
        mask = lambda x: jnp.where(seg > 0, x, NEG_INF)  # noqa: E731  never point at padding
        return mask(out["start_logits"]), mask(out["end_logits"])

    def loss_fn(self, params, batch: Batch, rng: Optional[jax.Array] = None):
        start, end = self._logits(params, batch, rng)                    # [b, l] each
        w = self.weights(batch)
        ls, m_s = self._classification_loss(start, batch["start_positions"], w)
        le, m_e = self._classification_loss(end, batch["end_positions"], w)
        loss = (ls + le) / 2
        both = ((jnp.argmax(start, -1) == batch["start_positions"])
                & (jnp.argmax(end, -1) == batch["end_positions"])).astype(jnp.float32)
        return loss, {"loss": loss, "start_loss": ls, "end_loss": le,
                      "start_accuracy": m_s["accuracy"], "end_accuracy": m_e["accuracy"],
                      "span_accuracy": jnp.sum(both * w) / jnp.maximum(jnp.sum(w), 1e-8),
                      "num_tokens": m_s["num_tokens"]}

    def score(self, params, batch: Batch) -> jax.Array:
        """log p(start) + log p(end) of the gold span [batch]."""
        start, end = self._logits(params, batch)
        return log_prob(start, batch["start_positions"]) + log_prob(end, batch["end_positions"])

    def context_mask(self, batch: Batch) -> jax.Array:
        if "context_mask" in batch:
            return batch["context_mask"].astype(bool)
        mask = batch["token_type_ids"] == 1
        seg = batch.get("encoder_segment_ids")
        return mask if seg is None else mask & (seg > 0)

    def best_spans(self, params, batch: Batch, *, max_answer_length: int = 30,
                   null_threshold: float = 0.0) -> Dict[str, jax.Array]:
        """`select_spans` over the context: {"start", "end", "span_score", "null_score"}."""
        start, end = self._logits(params, batch)
        return select_spans(start, end, self.context_mask(batch),
                            max_answer_length=max_answer_length, null_threshold=null_threshold)

    def predict(self, params, batch: Batch, *, max_answer_length: int = 30,
                null_threshold: float = 0.0, **_) -> Tuple[jax.Array, jax.Array]:
        """(start [batch], end [batch]) token indices; (0, 0) for no answer."""
        spans = self.best_spans(params, batch, max_answer_length=max_answer_length,
                                null_threshold=null_threshold)
        return spans["start"], spans["end"]


class MultipleChoice(FineTuningModel):
    """SWAG-style: inputs [batch, num_choices, length], one [CLS] logit per choice, softmax
    over the choices; `label` [batch] is the right choice."""

    def __init__(self, config: TransformerConfig, num_choices: int,
                 loss: LossConfig = LossConfig(z_loss=0.0), pretrained: Optional[Params] = None,
                 style: PoolerStyle = BERT_POOLER):
        super().__init__(config, ChoiceHead(config, style=style), loss, pretrained)
        self.num_choices = num_choices

    def _choice_logits(self, params, batch: Batch, rng=None) -> jax.Array:
        logits = self.apply(params, batch, rng)                          # [b, c]
        if logits.shape[1] != self.num_choices:
            raise ValueError(f"batch has {logits.shape[1]} choices, the model "
                             f"{self.num_choices}")
        return logits

    def loss_fn(self, params, batch: Batch, rng: Optional[jax.Array] = None):
        logits = self._choice_logits(params, batch, rng)
        return self._classification_loss(logits, batch["label"], self.weights(batch))

    def score(self, params, batch: Batch) -> jax.Array:
        """log p(right choice) [batch]."""
        return log_prob(self._choice_logits(params, batch), batch["label"])

    def predict(self, params, batch: Batch, **_) -> jax.Array:
        """Chosen index [batch]."""
        return jnp.argmax(self._choice_logits(params, batch), axis=-1)


class BartRows:
    """What BART's fine-tuning heads (`EosPooledHead`) share: the family, the encoder rows
    (`classification_examples`) plus `decoder_input_tokens` (the rows shifted right, made
    here when a batch lacks them), and the trunk a pretrained `EncoderDecoder` tree (HF BART,
    a t2t BART checkpoint) loads into; `pooler` and `classifier` start fresh unless the tree
    has them (an HF `BartForSequenceClassification`)."""

    family = "bart"
    input_features = ENCODER_FEATURES + ("decoder_input_tokens",)
    required_modules = ("token_embedder", "encoder", "decoder")

    def derived_features(self, features: Batch) -> Batch:
        """`features` with `decoder_input_tokens` (`shift_inputs_right`) where they lack
        them: training rows carry them so that the step's FLOPs count the decoder."""
        if "decoder_input_tokens" in features:
            return features
        shifted = shift_inputs_right(np.asarray(features["encoder_input_tokens"], np.int32),
                                     self.config.decoder_start_id, xp=np)
        return {**features, "decoder_input_tokens": shifted}


class EosClassifier(BartRows, SequenceClassifier):
    """BART's sequence classifier (`EosPooledHead`): `SequenceClassifier`'s loss, score and
    predict over BART's rows (`BartRows`)."""

    def __init__(self, config: TransformerConfig, num_classes: int, pooling: str = "cls",
                 bilstm_units: Optional[int] = None, eos_id: int = 2,
                 loss: LossConfig = LossConfig(z_loss=0.0), pretrained: Optional[Params] = None,
                 style: PoolerStyle = BART_HEAD):
        if pooling != "cls" or bilstm_units:
            raise ConfigError("the BART head classifies from the decoder's last </s>: no "
                              "pooling or bilstm_units")
        FineTuningModel.__init__(self, config, EosPooledHead(config, num_classes, eos_id, style),
                                 loss, pretrained)
        self.num_classes = num_classes


class EosRegressor(BartRows, Regressor):
    """BART's regression head (HF `BartForSequenceClassification` with one label, its MSE
    loss): `Regressor`'s loss, score and predict from `EosPooledHead`'s one output."""

    def __init__(self, config: TransformerConfig, pretrained: Optional[Params] = None,
                 style: PoolerStyle = BART_HEAD, eos_id: int = 2):
        FineTuningModel.__init__(self, config, EosPooledHead(config, 1, eos_id, style),
                                 LossConfig(z_loss=0.0), pretrained)


class LastTokenClassifier(SequenceClassifier):
    """GPT-style classification from the final hidden state of each row's last real token
    (`decoder_segment_ids` 1 tokens / 0 pad, right padding). Pretrained `Decoder` trees
    (`load_gpt2`, a `DecoderOnlyModel` checkpoint) go under `decoder`."""

    family = "gpt"
    input_features = DECODER_FEATURES
    weight_key = "decoder_segment_ids"
    pretrained_prefix = ("decoder",)
    required_modules = ("decoder",)

    def __init__(self, config: TransformerConfig, num_classes: int,
                 loss: LossConfig = LossConfig(z_loss=0.0), pretrained: Optional[Params] = None):
        FineTuningModel.__init__(self, config, LastTokenHead(config, num_classes), loss,
                                 pretrained)
        self.num_classes = num_classes
