"""ELMo-style feature extraction from a frozen encoder: every layer's output, a learned
scalar mix of them (Peters et al. 2018), and one linear probe per layer.

The layer outputs come from the "intermediates" collection: each `TransformerLayer` sows
`hidden_states` (one entry per call: `layers/layer_{i}` in a Python loop, one stacked
[num_layers, ...] array under `layers/layer` with `scan_layers`, `num_layers` entries under
`layers/layer` with `share_layers`), and the embedding output is captured from the stack's
`embedder` with `capture_intermediates`. For pre-LN stacks these are the un-normalised
residual streams (the stack's own output adds `final_norm`); for BERT (post-LN) the last one
is exactly the encoder output.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from t2t.models.base import Batch, LossConfig
from t2t.models.classifiers import BertTrunk, Params, SequenceClassifier
from t2t.models.heads import Classifier
from t2t.nn.config import TransformerConfig
from t2t.nn.embed import Embedder

Path = Tuple[str, ...]


def capture_embedder(module: nn.Module, method_name: str) -> bool:
    """`capture_intermediates` filter: keep only the embedding output."""
    return isinstance(module, Embedder) and method_name == "__call__"


def collect_layers(intermediates: Mapping[str, Any], config: TransformerConfig,
                   stack: Path = ("encoder",)) -> jax.Array:
    """All layer outputs of one stack, embeddings first: [num_layers + 1, batch, length, d].

    `intermediates` is the collection from `apply(..., mutable=["intermediates"],
    capture_intermediates=capture_embedder)`; `stack` is the stack's module path.
    """
    node = intermediates
    for key in stack:
        node = node[key]
    embedded = node["embedder"]["__call__"][0]                     # [b, l, d]
    layers = node["layers"]
    if "layer" in layers:                                           # scanned or shared
        sown = layers["layer"]["hidden_states"]
        stacked = sown[0] if (config.scan_layers and not config.share_layers) else jnp.stack(sown)
    else:
        names = sorted(layers, key=lambda k: int(k.rsplit("_", 1)[1]))
        stacked = jnp.stack([layers[k]["hidden_states"][0] for k in names])
    return jnp.concatenate([embedded[None].astype(stacked.dtype), stacked], axis=0)


def bert_layers(config: TransformerConfig, params: Params, input_tokens: jax.Array,
                segment_ids: Optional[jax.Array] = None,
                token_type_ids: Optional[jax.Array] = None,
                positions: Optional[jax.Array] = None) -> jax.Array:
    """Frozen BERT features [num_layers + 1, batch, length, d_model] from any tree with
    BertModel's `token_embedder` / `encoder` (load_bert, pretraining or fine-tuned)."""
    _, state = BertTrunk(config).apply(
        {"params": params}, input_tokens, segment_ids, token_type_ids, positions,
        method="encode", mutable=["intermediates"], capture_intermediates=capture_embedder)
    return jax.lax.stop_gradient(collect_layers(state["intermediates"], config))


def pool(hidden: jax.Array, segment_ids: Optional[jax.Array], pooling: str) -> jax.Array:
    """[..., batch, length, d] -> [..., batch, d]: "cls" (position 0) or "mean" over real
    tokens (segment id > 0)."""
    if pooling == "cls":
        return hidden[..., 0, :]
    if pooling != "mean":
        raise ValueError(f"pooling must be 'cls' or 'mean', got {pooling!r}")
    if segment_ids is None:
        return jnp.mean(hidden, axis=-2)
    w = (segment_ids > 0).astype(hidden.dtype)[..., None]          # [b, l, 1]
    return jnp.sum(hidden * w, axis=-2) / jnp.maximum(jnp.sum(w, axis=-2), 1.0)


class ScalarMix(nn.Module):
    """γ · Σ_j softmax(w)_j · h_j over `num_inputs` layers [num_inputs, ..., d] -> [..., d].
    Starts as the plain mean (w = 0, γ = 1)."""

    num_inputs: int

    @nn.compact
    def __call__(self, layers: jax.Array) -> jax.Array:
        if layers.shape[0] != self.num_inputs:
            raise ValueError(f"ScalarMix over {self.num_inputs} layers got {layers.shape[0]}")
        weights = self.param("weights", nn.initializers.zeros, (self.num_inputs,), jnp.float32)
        gamma = self.param("gamma", nn.initializers.ones, (), jnp.float32)
        s = jax.nn.softmax(weights)
        return (gamma * jnp.tensordot(s, layers.astype(jnp.float32), axes=1)).astype(layers.dtype)


def mix_weights(params: Params) -> jax.Array:
    """The normalised layer weights [num_layers + 1] of a ScalarMixClassifier tree."""
    return jax.nn.softmax(nn.unbox(params)["scalar_mix"]["weights"])


class MixHead(BertTrunk):
    """BERT trunk + ScalarMix + pooling + classifier; `classify` reads precomputed layers."""

    num_classes: int = 2
    pooling: str = "cls"

    def setup(self):
        super().setup()
        self.scalar_mix = ScalarMix(self.config.num_encoder_layers + 1, name="scalar_mix")
        self.classifier = Classifier(self.config, self.num_classes, name="classifier")

    def classify(self, layers: jax.Array, segment_ids: Optional[jax.Array] = None, *,
                 deterministic: bool = True) -> jax.Array:
        """layers [num_layers + 1, batch, length, d] -> logits [batch, num_classes]."""
        mixed = self.scalar_mix(layers)                             # [b, l, d]
        return self.classifier(pool(mixed, segment_ids, self.pooling),
                               deterministic=deterministic)


class ScalarMixClassifier(SequenceClassifier):
    """ELMo-style classifier over FROZEN BERT layers: only `scalar_mix` and `classifier`
    get gradients (the features pass `jax.lax.stop_gradient`); the trunk keeps BertModel's
    names, so `init_from_pretrained` loads it. Pair with `peft.freeze(tx, ("token_embedder",
    "encoder"))` so the frozen trunk holds no optimizer state."""

    def __init__(self, config: TransformerConfig, num_classes: int, pooling: str = "cls",
                 loss: LossConfig = LossConfig(z_loss=0.0), pretrained: Optional[Params] = None):
        SequenceClassifier.__init__(self, config, num_classes, loss, pretrained)
        self.module = MixHead(config, num_classes, pooling)
        self.pooling = pooling

    def features(self, params: Params, batch: Batch) -> jax.Array:
        """Frozen layer outputs [num_layers + 1, batch, length, d]."""
        return bert_layers(self.config, params, batch["encoder_input_tokens"],
                           batch.get("encoder_segment_ids"), batch.get("token_type_ids"),
                           batch.get("encoder_positions"))

    def fresh_init(self, rng: jax.Array, batch: Batch) -> Params:
        inputs = self._inputs(batch)
        rngs = {"params": rng, "dropout": rng}
        trunk = self.module.init(rngs, **inputs, method="encode")["params"]
        b, l = batch["encoder_input_tokens"].shape
        layers = jnp.zeros((self.config.num_encoder_layers + 1, b, l, self.config.d_model),
                           self.config.compute_dtype)
        head = self.module.init(rngs, layers, inputs.get("encoder_segment_ids"),
                                method="classify")["params"]
        return {**trunk, **head}

    def apply(self, params, batch: Batch, rng: Optional[jax.Array] = None, **kwargs):
        layers = self.features(params, batch)
        rngs = {} if rng is None else {"dropout": rng}
        return self.module.apply({"params": params}, layers, batch.get("encoder_segment_ids"),
                                 deterministic=rng is None, rngs=rngs, method="classify",
                                 **kwargs)


# ----------------------------------------------------------------------------- probes
def probe_layers(features: jax.Array, labels: jax.Array, num_classes: int, *,
                 eval_features: Optional[jax.Array] = None,
                 eval_labels: Optional[jax.Array] = None, steps: int = 200,
                 learning_rate: float = 0.05, seed: int = 0) -> np.ndarray:
    """One linear softmax probe per layer on frozen features -> accuracy per layer [L].

    features [L, N, d] (e.g. `pool(bert_layers(...), segment_ids, "cls")`), labels [N];
    each layer is standardised with its training mean/std, then all L probes train together
    (independent parameters, full-batch Adam, `steps` steps). Accuracy is measured on
    `eval_features` [L, M, d] / `eval_labels` [M] when given, else on the training set.
    """
    x = jax.lax.stop_gradient(jnp.asarray(features, jnp.float32))
    y = jnp.asarray(labels, jnp.int32)
    mean = jnp.mean(x, axis=1, keepdims=True)
    std = jnp.std(x, axis=1, keepdims=True) + 1e-6
    ex = x if eval_features is None else jnp.asarray(eval_features, jnp.float32)
    ey = y if eval_labels is None else jnp.asarray(eval_labels, jnp.int32)
    num_layers, _, d = x.shape
    w = 0.01 * jax.random.normal(jax.random.PRNGKey(seed), (num_layers, d, num_classes))
    params = {"w": w, "b": jnp.zeros((num_layers, 1, num_classes))}
    tx = optax.adam(learning_rate)

    def logits(p, feats):                                           # [L, N, C]
        return jnp.einsum("lnd,ldc->lnc", (feats - mean) / std, p["w"]) + p["b"]

    def loss(p):
        lp = jax.nn.log_softmax(logits(p, x), axis=-1)
        return -jnp.sum(jnp.mean(jnp.take_along_axis(lp, y[None, :, None], -1), axis=(1, 2)))

    def step(carry, _):
        p, s = carry
        g = jax.grad(loss)(p)
        u, s = tx.update(g, s, p)
        return (optax.apply_updates(p, u), s), None

    @jax.jit
    def run(p):
        (p, _), _ = jax.lax.scan(step, (p, tx.init(p)), None, length=steps)
        return jnp.mean(jnp.argmax(logits(p, ex), -1) == ey[None], axis=1)

    return np.asarray(run(params))
