"""ELMo's bidirectional language model (Peters et al. 2018, "Deep contextualized word
representations", Sec. 3.1 and 3.4) and its layers for downstream models (Sec. 3.2-3.3).

The biLM, as the paper's Sec. 3.4 describes the released model:

- a context-independent token representation from each token's characters: character
  embeddings, convolutions of several widths max-pooled over the characters, two highway
  layers and a linear projection (the CNN-BIG-LSTM input of Jozefowicz et al. 2016);
- L = 2 layers of LSTMs with projections in each direction (4096 cells, 512-dimensional
  projections) and a residual connection from the first layer to the second;
- a forward LM (position k predicts token k+1 from tokens 1..k) and a backward LM (position
  k predicts token k-1 from tokens k..N) sharing the token representation and the softmax
  (Sec. 3.1, the joint log likelihood); each direction has its own LSTMs.

LSTMP (Sak et al. 2014, eq. 1-7: the recurrent input is the projection r = W_rm m of the
cell output m) is built from flax's own `OptimizedLSTMCell` run by `flax.linen.RNN`: flax's
cells size the recurrent state as the cell, so the cell's recurrent kernels are stored
factored as `projection @ recurrent` ([cell, proj] @ [proj, 4 * cell]) and put together by
`nn.map_variables` once per sequence. Then W_hx h_{t-1} with h = m is W_rx (W_rm m_{t-1}),
exactly LSTMP's gates, and the layer's output is the projection of the cell outputs,
`m @ projection`. bilm-tf also clips the cell and the projection at +-3; the paper does not,
and neither does this module.

`layers` are the 2L + 1 representations of Sec. 3.2 as L + 1 layers of width 2 * proj:
the token representation repeated for both directions, then [forward_j; backward_j].
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from t2t.data.characters import MAX_CHARS, NUM_CHAR_IDS
from t2t.errors import ConfigError, UserError
from t2t.models import losses
from t2t.models.base import Batch, LossConfig, Metrics, Model
from t2t.models.probing import ScalarMix
from t2t.nn.dropout import Dropout

Params = Any
GATES = "ifgo"                   # flax's OptimizedLSTMCell gate names: i, f, g, o
# The original biLM's character convolutions (width, filters): 2048 filters in all.
ORIGINAL_FILTERS = ((1, 32), (2, 32), (3, 64), (4, 128), (5, 256), (6, 512), (7, 1024))


@dataclasses.dataclass(frozen=True)
class ElmoConfig:
    """Sizes of the biLM; the defaults are the paper's original 2 x 4096 x 512 model
    (93.6M parameters without the softmax) with its 793,471-word softmax."""

    vocab_size: int = 793471                 # token softmax (word vocabulary)
    max_chars: int = MAX_CHARS               # characters per token
    char_vocab_size: int = NUM_CHAR_IDS
    char_embed_dim: int = 16
    filters: Tuple[Tuple[int, int], ...] = ORIGINAL_FILTERS
    num_highway: int = 2
    projection_dim: int = 512                # token representation and LSTM projections
    cell_size: int = 4096                    # LSTM cells
    num_layers: int = 2
    dropout_rate: float = 0.1
    dtype: str = "float32"

    def __post_init__(self):
        for name in ("vocab_size", "char_embed_dim", "projection_dim", "cell_size", "num_layers"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"ElmoConfig.{name} must be positive, got {getattr(self, name)}")
        if not self.filters:
            raise ConfigError("ElmoConfig.filters needs at least one (width, count) pair")
        widest = max(w for w, _ in self.filters)
        if widest > self.max_chars:
            raise ConfigError(f"ElmoConfig.filters has width {widest} > max_chars "
                              f"{self.max_chars}: a token could not fill the convolution")
        if not 0.0 <= self.dropout_rate < 1.0:
            raise ConfigError(f"ElmoConfig.dropout_rate must be in [0, 1), got {self.dropout_rate}")

    @property
    def num_filters(self) -> int:
        return sum(n for _, n in self.filters)

    @property
    def compute_dtype(self):
        return jnp.dtype(self.dtype)

    def replace(self, **changes) -> "ElmoConfig":
        return dataclasses.replace(self, **changes)


def forward_flops(config: ElmoConfig, *, target_length: int, **_) -> Dict[str, float]:
    """Forward FLOPs of ONE sentence of ``target_length`` tokens through the biLM (ELMo's
    FLOP formula, `t2t.train.flops`; ``c`` characters a token, ``e``-dim character
    embeddings, filters ``(w, k)`` with ``F = Σk``, projection ``p``, cells ``n``), per token:
    convolutions ``Σ 2·w·e·k·(c - w + 1)``, highway ``2·2·F²`` a layer, projection ``2·F·p``;
    per LSTMP layer and direction ``2·(p·4n + p·4n + n·p)`` (input, projected recurrent
    state, projection: LSTMP's own count, whatever the implementation multiplies); logits
    ``2·p·V`` for each direction."""
    c, e, f, p, n = (config.max_chars, config.char_embed_dim, config.num_filters,
                     config.projection_dim, config.cell_size)
    chars = sum(2 * w * e * k * (c - w + 1) for w, k in config.filters)
    chars += config.num_highway * 2 * 2 * f * f + 2 * f * p
    lstm = 2 * config.num_layers * 2 * (p * 4 * n + p * 4 * n + n * p)
    length = target_length
    return {"dense": float(length * (chars + lstm)), "attention": 0.0,
            "logits": float(length * 2 * 2 * p * config.vocab_size)}


# ----------------------------------------------------------------------------- char CNN
class Highway(nn.Module):
    """y = t * relu(W_H x + b_H) + (1 - t) * x, t = sigmoid(W_T x + b_T) (Srivastava et al.
    2015, eq. 3); b_T starts at -2 so each layer first carries its input (their Sec. 2)."""

    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:               # [..., d] -> [..., d]
        d = x.shape[-1]
        h = nn.relu(nn.Dense(d, dtype=self.dtype, name="transform")(x))
        t = nn.sigmoid(nn.Dense(d, dtype=self.dtype, bias_init=nn.initializers.constant(-2.0),
                                name="gate")(x))
        return t * h + (1.0 - t) * x


class CharacterEncoder(nn.Module):
    """char ids [b, l, max_chars] -> token representations [b, l, projection_dim]."""

    config: ElmoConfig

    @nn.compact
    def __call__(self, char_ids: jax.Array) -> jax.Array:
        cfg = self.config
        b, l, c = char_ids.shape
        x = nn.Embed(cfg.char_vocab_size, cfg.char_embed_dim, dtype=cfg.compute_dtype,
                     name="char_embed")(char_ids.reshape(b * l, c))           # [bl, c, e]
        pooled = []
        for width, count in cfg.filters:
            conv = nn.Conv(count, (width,), padding="VALID", dtype=cfg.compute_dtype,
                           name=f"conv_{width}")(x)                           # [bl, c-w+1, n]
            pooled.append(nn.relu(jnp.max(conv, axis=1)))                     # [bl, n]
        h = jnp.concatenate(pooled, axis=-1)                                  # [bl, filters]
        for i in range(cfg.num_highway):
            h = Highway(cfg.compute_dtype, name=f"highway_{i}")(h)
        h = nn.Dense(cfg.projection_dim, dtype=cfg.compute_dtype, name="projection")(h)
        return h.reshape(b, l, cfg.projection_dim)                            # [b, l, p]


# ----------------------------------------------------------------------------- LSTMP
class ProjectedLSTM(nn.Module):
    """One direction of one LSTMP layer: [b, l, d_in] -> [b, l, projection] (module
    docstring: flax's OptimizedLSTMCell with its recurrent kernels factored through the
    projection). `reverse` reads each sequence backwards from its own last real token."""

    cell_size: int
    projection_dim: int
    reverse: bool = False
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, lengths: jax.Array) -> jax.Array:
        n, p = self.cell_size, self.projection_dim
        init = nn.initializers.lecun_normal()
        projection = self.param("projection", init, (n, p), jnp.float32)      # W_rm^T
        recurrent = self.param("recurrent", init, (p, 4 * n), jnp.float32)    # W_r{i,f,c,o}^T

        def with_recurrent_kernels(variables):
            if "params" not in variables:
                return variables
            kernel = projection @ recurrent                                   # [n, 4n], rank p
            cell = dict(variables["params"])
            for k, gate in enumerate(GATES):
                cell[f"h{gate}"] = {**cell[f"h{gate}"], "kernel": kernel[:, k * n:(k + 1) * n]}
            return {**variables, "params": cell}

        def without_recurrent_kernels(variables):
            if "params" not in variables:
                return variables
            return {**variables, "params": {
                name: ({"bias": v["bias"]} if name[0] == "h" else v)
                for name, v in variables["params"].items()}}

        rnn = nn.map_variables(nn.RNN, "params", with_recurrent_kernels,
                               without_recurrent_kernels, init=True)
        cell = nn.OptimizedLSTMCell(n, dtype=self.dtype, name="cell")
        m = rnn(cell, reverse=self.reverse, keep_order=True, name="rnn")(
            x, seq_lengths=lengths)                                           # [b, l, n]
        return jnp.einsum("bln,np->blp", m, projection.astype(m.dtype))       # [b, l, p]


# ----------------------------------------------------------------------------- biLM
class BiLM(nn.Module):
    """token_ids [b, l] (0 pads), char_ids [b, l, max_chars] -> {"layers" [L+1, b, l, 2p],
    "forward_logits", "backward_logits" [b, l, vocab]}: forward_logits[:, k] predicts token
    k+1, backward_logits[:, k] token k-1."""

    config: ElmoConfig

    @nn.compact
    def __call__(self, token_ids: jax.Array, char_ids: jax.Array, *,
                 deterministic: bool = True, with_logits: bool = True) -> Dict[str, jax.Array]:
        cfg = self.config
        lengths = jnp.sum(token_ids > 0, axis=-1).astype(jnp.int32)           # [b]
        mask = (token_ids > 0)[..., None]                                     # [b, l, 1]
        tokens = CharacterEncoder(cfg, name="char_encoder")(char_ids) * mask  # [b, l, p]
        dropout = Dropout(cfg.dropout_rate)
        layers = [jnp.concatenate([tokens, tokens], axis=-1)]                 # [b, l, 2p]
        inputs = {"forward": tokens, "backward": tokens}
        for j in range(cfg.num_layers):
            outputs = {}
            for direction, x in inputs.items():
                h = ProjectedLSTM(cfg.cell_size, cfg.projection_dim, direction == "backward",
                                  cfg.compute_dtype, name=f"{direction}_lstm_{j}")(x, lengths)
                h = dropout(h, deterministic=deterministic)
                outputs[direction] = (h + x if j > 0 else h) * mask           # residual 1 -> 2
            inputs = outputs
            layers.append(jnp.concatenate([outputs["forward"], outputs["backward"]], axis=-1))
        result = {"layers": jnp.stack(layers)}                                # [L+1, b, l, 2p]
        if with_logits:
            softmax = nn.Dense(cfg.vocab_size, dtype=cfg.compute_dtype, name="softmax")
            result["forward_logits"] = softmax(inputs["forward"])             # [b, l, V]
            result["backward_logits"] = softmax(inputs["backward"])
        return result


def lm_targets(token_ids: jax.Array) -> Dict[str, jax.Array]:
    """The two LMs' targets [b, l] and weights: forward k -> token k+1, backward k -> k-1,
    weighted 1 where both position k and its target are real tokens."""
    pad = jnp.zeros_like(token_ids[:, :1])
    forward = jnp.concatenate([token_ids[:, 1:], pad], axis=1)
    backward = jnp.concatenate([pad, token_ids[:, :-1]], axis=1)
    real = token_ids > 0
    return {"forward": forward, "backward": backward,
            "forward_weights": (real & (forward > 0)).astype(jnp.float32),
            "backward_weights": (real & (backward > 0)).astype(jnp.float32)}


class ElmoModel(Model):
    """The biLM under the Model contract: `loss_fn` is the mean negative log likelihood
    per predicted token over both directions (Sec. 3.1's joint objective, each direction's
    tokens counted once; plus `loss`'s z-loss or smoothing if any, none by default);
    `perplexity` is the exponential of the plain NLL."""

    family = "elmo"
    input_features = ("token_ids", "char_ids")

    def __init__(self, config: ElmoConfig, loss: LossConfig = LossConfig(z_loss=0.0)):
        self.config = config              # not Model.__init__, which wants a Transformer
        self.module = BiLM(config)
        self.loss = loss

    def _check(self, batch: Batch) -> None:
        for key in self.input_features:
            if key not in batch:
                raise UserError(f"an ELMo batch needs {list(self.input_features)}; "
                                f"{key!r} is missing (t2t.data.characters.sentence_features)")
        if batch["char_ids"].shape[-1] != self.config.max_chars:
            raise UserError(f"char_ids have {batch['char_ids'].shape[-1]} characters per token "
                            f"but ElmoConfig.max_chars is {self.config.max_chars}: make them "
                            "agree (TASK_FEATURE_LENGTHS['characters'])")

    def init(self, rng: jax.Array, batch: Batch) -> Params:
        self._check(batch)
        return super().init(rng, batch)

    def loss_fn(self, params, batch: Batch, rng: Optional[jax.Array] = None
                ) -> Tuple[jax.Array, Metrics]:
        out = self.apply(params, batch, rng)
        t = lm_targets(batch["token_ids"])
        logits = jnp.concatenate([out["forward_logits"], out["backward_logits"]], 1)
        targets = jnp.concatenate([t["forward"], t["backward"]], 1)
        weights = jnp.concatenate([t["forward_weights"], t["backward_weights"]], 1)
        loss, z_loss, num_tokens = losses.cross_entropy_with_logits(
            logits.astype(jnp.float32), targets, weights, z_loss=self.loss.z_loss,
            label_smoothing=self.loss.label_smoothing,
            loss_normalizing_factor=self.loss.loss_normalizing_factor)
        directions = {}
        for d in ("forward", "backward"):     # plain NLL per direction (no z-loss, smoothing)
            directions[f"{d}_loss"] = losses.cross_entropy_with_logits(
                out[f"{d}_logits"].astype(jnp.float32), t[d], t[f"{d}_weights"],
                z_loss=0.0)[0]
        nll = (directions["forward_loss"] * jnp.sum(t["forward_weights"])
               + directions["backward_loss"] * jnp.sum(t["backward_weights"])
               ) / jnp.maximum(num_tokens, 1.0)
        metrics = {"loss": loss, "z_loss": z_loss, "perplexity": jnp.exp(nll),
                   "num_tokens": num_tokens, "accuracy": losses.accuracy(logits, targets, weights),
                   **directions}
        return loss, metrics

    def loss_weight(self, batch: Batch) -> jax.Array:
        t = lm_targets(batch["token_ids"])
        return jnp.sum(t["forward_weights"]) + jnp.sum(t["backward_weights"])

    def score(self, params, batch: Batch) -> jax.Array:
        """Forward-LM log-likelihood of each sentence after `<S>` [batch]."""
        logits = self.apply(params, batch)["forward_logits"].astype(jnp.float32)
        t = lm_targets(batch["token_ids"])
        lp = jnp.take_along_axis(jax.nn.log_softmax(logits), t["forward"][..., None], -1)
        return jnp.sum(lp[..., 0] * t["forward_weights"], axis=-1)

    def predict(self, params, batch: Batch, **options) -> jax.Array:
        raise UserError("ELMo's biLM gives representations (ElmoModel.layers), not decoded text")

    def layers(self, params, batch: Batch) -> jax.Array:
        """The frozen biLM's representations [num_layers + 1, b, l, 2 * projection_dim]."""
        self._check(batch)
        out = self.module.apply({"params": params}, batch["token_ids"], batch["char_ids"],
                                with_logits=False)
        return jax.lax.stop_gradient(out["layers"])


# ----------------------------------------------------------------------------- downstream
class ElmoMixClassifier(nn.Module):
    """ELMo_task = gamma * sum_j softmax(s)_j h_j (Sec. 3.2, eq. 1) over the frozen biLM's
    layers, averaged over the real tokens, then dropout and a linear classifier:
    layers [L+1, b, l, d], token_ids [b, l] -> logits [b, num_classes]."""

    num_layers: int                   # L + 1 mixed representations
    num_classes: int
    dropout_rate: float = 0.0

    @nn.compact
    def __call__(self, layers: jax.Array, token_ids: jax.Array, *,
                 deterministic: bool = True) -> jax.Array:
        mixed = ScalarMix(self.num_layers, name="scalar_mix")(layers)         # [b, l, d]
        w = (token_ids > 0).astype(mixed.dtype)[..., None]                    # [b, l, 1]
        pooled = jnp.sum(mixed * w, axis=1) / jnp.maximum(jnp.sum(w, axis=1), 1.0)
        pooled = Dropout(self.dropout_rate)(pooled, deterministic=deterministic)
        return nn.Dense(self.num_classes, name="classifier")(pooled)          # [b, C]


def train_mix_classifier(layers: np.ndarray, token_ids: np.ndarray, labels: np.ndarray,
                         num_classes: int, *, steps: int = 300, batch_size: int = 64,
                         learning_rate: float = 1e-2, dropout_rate: float = 0.0,
                         seed: int = 0) -> Tuple[Params, List[float]]:
    """Fits an ElmoMixClassifier (the mix and the classifier only: the biLM is frozen)
    on precomputed layers [L+1, N, l, d] with Adam, `steps` minibatches drawn with
    `seed` -> (head params, training loss every step)."""
    num_layers, n = layers.shape[0], layers.shape[1]
    if n != len(labels) or n != len(token_ids):
        raise UserError(f"{n} examples of layers, {len(token_ids)} of tokens and "
                        f"{len(labels)} labels: give one of each per example")
    head = ElmoMixClassifier(num_layers, num_classes, dropout_rate)
    rng = jax.random.PRNGKey(seed)
    params = head.init(rng, jnp.asarray(layers[:, :1]), jnp.asarray(token_ids[:1]))["params"]
    tx = optax.adam(learning_rate)

    def loss_fn(p, x, t, y, key):
        logits = head.apply({"params": p}, x, t, deterministic=False, rngs={"dropout": key})
        lp = jax.nn.log_softmax(logits.astype(jnp.float32))
        return -jnp.mean(jnp.take_along_axis(lp, y[:, None], -1))

    @jax.jit
    def step(p, state, x, t, y, key):
        loss, grads = jax.value_and_grad(loss_fn)(p, x, t, y, key)
        updates, state = tx.update(grads, state, p)
        return optax.apply_updates(p, updates), state, loss

    state, history = tx.init(params), []
    order = np.random.default_rng(seed)
    for i in range(steps):
        rows = order.choice(n, size=min(batch_size, n), replace=False)
        params, state, loss = step(params, state, jnp.asarray(layers[:, rows]),
                                   jnp.asarray(token_ids[rows]),
                                   jnp.asarray(labels[rows], jnp.int32),
                                   jax.random.fold_in(rng, i))
        history.append(float(loss))
    return params, history


def mix_accuracy(head_params: Params, layers: np.ndarray, token_ids: np.ndarray,
                 labels: np.ndarray, num_classes: int) -> float:
    """Accuracy of a trained ElmoMixClassifier on precomputed layers [L+1, N, l, d]."""
    head = ElmoMixClassifier(layers.shape[0], num_classes)
    logits = jax.jit(lambda p, x, t: head.apply({"params": p}, x, t))(
        head_params, jnp.asarray(layers), jnp.asarray(token_ids))
    return float(np.mean(np.argmax(np.asarray(logits), -1) == np.asarray(labels)))


def mix_weights(head_params: Params) -> Dict[str, Any]:
    """The learned mix: softmax(s) [L + 1] and gamma of an ElmoMixClassifier tree."""
    mix = nn.unbox(head_params)["scalar_mix"]
    return {"weights": jax.nn.softmax(mix["weights"]), "gamma": mix["gamma"]}


def count_params(config: ElmoConfig, softmax: bool = True) -> int:
    """Parameters of the biLM (the paper's counts leave out the softmax: softmax=False)."""
    model = BiLM(config)
    tokens = jnp.ones((1, 4), jnp.int32)
    chars = jnp.ones((1, 4, config.max_chars), jnp.int32)
    shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), tokens, chars))
    params = nn.unbox(shapes["params"])
    if not softmax:
        params = {k: v for k, v in params.items() if k != "softmax"}
    return int(sum(x.size for x in jax.tree_util.tree_leaves(params)))
