"""XLNet (Yang et al. 2019): permutation language modelling with two-stream attention over a
Transformer-XL backbone.

- Objective (§2.2, eq. 3; partial prediction §2.3, eq. 5): for a sampled factorization
  order z, predict the last 1/K of z, each token from the tokens before it in z. The data
  side (`t2t.data.permutation_lm`) samples z and gives each position its rank in z; here
  the ranks become the two streams' masks (`t2t.nn.two_stream`).
- Two-stream attention (§2.3): the query stream g starts from a learned `mask_emb` and
  never sees the content of the position it predicts; the content stream h does.
- Transformer-XL (§2.4): relative positional attention with biases u, v
  (`t2t.nn.relative_xl`) and segment recurrence: each layer's input states of the
  previous segment are cached (no gradient) and attended as memory.
- Relative segment encodings (§2.5): `r_s_bias` and `seg_embed` on same/different segment.

The module mirrors Hugging Face's `XLNetLMHeadModel` (tests/convert/test_xlnet_parity.py):
the LM head is the token table transposed plus `lm_bias`; layers are post-LN.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from t2t.errors import ConfigError
from t2t.models.base import LossConfig, Model
from t2t.nn.config import TransformerConfig
from t2t.nn.dropout import Dropout
from t2t.nn.embed import token_embed
from t2t.nn.relative_xl import ATTENTION_TYPES, relative_distances, relative_encoding
from t2t.nn.two_stream import TwoStreamLayer, perm_mask_from_ranks, stream_visibility

Mems = Tuple[jax.Array, ...]


@dataclasses.dataclass(frozen=True)
class XLNetOptions:
    """XLNet settings outside `TransformerConfig` (Hugging Face `XLNetConfig` names).

    mem_len: states each layer keeps for the next segment (0 = all of them, HF's None);
    clamp_len: relative distances clipped to ±clamp_len (-1 = none); attn_type: "bi"
    (XLNet) or "uni" (Transformer-XL's causal attention); same_length: "uni" queries all
    see the same number of keys; summary_last_dropout: the dropout after the fine-tuning
    heads' sequence summary (`t2t.models.xlnet_heads`).
    """

    mem_len: int = 0
    clamp_len: int = -1
    attn_type: str = "bi"
    same_length: bool = False
    summary_last_dropout: float = 0.1

    def __post_init__(self):
        if self.attn_type not in ATTENTION_TYPES:
            raise ConfigError(f"XLNetOptions.attn_type={self.attn_type!r}; choose one of "
                              f"{list(ATTENTION_TYPES)}")
        if self.mem_len < 0:
            raise ConfigError(f"XLNetOptions.mem_len must be >= 0, got {self.mem_len}")


class XLNet(nn.Module):
    """Token ids -> LM logits and the memory for the next segment.

    Params: `token_embedder` [vocab, d], `mask_emb` [d] (the query stream's start),
    `layer_{i}` (`TwoStreamLayer`), `lm_bias` [vocab] (only with `lm_head`: HF's
    `XLNetModel` under a fine-tuning head has none).
    """

    config: TransformerConfig
    options: XLNetOptions = XLNetOptions()
    lm_head: bool = True

    def setup(self):
        cfg = self.config
        self.token_embedder = token_embed(cfg, "token_embedder")
        self.mask_emb = self.param(
            "mask_emb", nn.with_logical_partitioning(
                nn.initializers.normal(cfg.initializer_range), ("embed",)),
            (cfg.d_model,), cfg.params_dtype)
        if self.lm_head:
            self.lm_bias = self.param("lm_bias", nn.with_logical_partitioning(
                nn.initializers.zeros, ("vocab",)), (cfg.vocab_size,), cfg.params_dtype)
        self.dropout = Dropout(cfg.dropout_rate)
        self.layers = [TwoStreamLayer(cfg, name=f"layer_{i}")
                       for i in range(cfg.num_encoder_layers)]

    def __call__(self, input_tokens: jax.Array, attention_mask: Optional[jax.Array] = None,
                 token_type_ids: Optional[jax.Array] = None,
                 perm_mask: Optional[jax.Array] = None,
                 target_mapping: Optional[jax.Array] = None,
                 mems: Optional[Sequence[jax.Array]] = None, *,
                 deterministic: bool = True) -> Tuple[jax.Array, Mems]:
        """(logits, new mems).

        input_tokens [b, q]; attention_mask [b, q] (1 = token, 0 = padding);
        token_type_ids [b, q] (segment A/B; None = no segment term); perm_mask [b, q, q]
        (1 = query i may not attend key j, HF's sense); target_mapping [b, p, q] (one-hot
        rows: the positions the query stream predicts); mems: one [b, m, d] per layer.
        Logits are [b, p, vocab] from the query stream when `target_mapping` is given,
        else [b, q, vocab] from the content stream. New mems: each layer's input states,
        memory first, the last `mem_len` of them, with no gradient.
        """
        out, new_mems = self.encode(input_tokens, attention_mask, token_type_ids, perm_mask,
                                    target_mapping, mems, deterministic=deterministic)
        return self.logits(out), new_mems

    def logits(self, hidden: jax.Array) -> jax.Array:
        """[b, n, d] -> [b, n, vocab]: tied token table plus `lm_bias`."""
        return self.token_embedder.attend(hidden) + self.lm_bias.astype(hidden.dtype)

    def encode(self, input_tokens, attention_mask=None, token_type_ids=None, perm_mask=None,
               target_mapping=None, mems=None, *, deterministic: bool = True
               ) -> Tuple[jax.Array, Mems]:
        """(last states [b, p|q, d] of the query stream if `target_mapping` else of the
        content stream, new mems); arguments as `__call__`."""
        cfg, opt = self.config, self.options
        b, q = input_tokens.shape
        if mems is not None and len(mems) != cfg.num_encoder_layers:
            raise ValueError(f"mems has {len(mems)} entries; the model has "
                             f"{cfg.num_encoder_layers} layers")
        m = 0 if mems is None else mems[0].shape[1]
        content_visible, query_visible = stream_visibility(
            q, m, perm_mask, attention_mask, opt.attn_type, opt.same_length)

        h = self.dropout(self.token_embedder(input_tokens), deterministic=deterministic)
        g = None
        if target_mapping is not None:                                 # [b, p, d]
            g = jnp.broadcast_to(self.mask_emb.astype(h.dtype),
                                 target_mapping.shape[:2] + (cfg.d_model,))
            g = self.dropout(g, deterministic=deterministic)
        different_segment = None
        if token_type_ids is not None:                  # memory counts as segment 0 (HF)
            key_types = jnp.concatenate([jnp.zeros((b, m), token_type_ids.dtype),
                                         token_type_ids], axis=1)
            different_segment = token_type_ids[:, :, None] != key_types[:, None, :]
        rel = relative_encoding(relative_distances(q, m + q, opt.attn_type, opt.clamp_len),
                                cfg.d_model).astype(cfg.compute_dtype)   # [R, d]
        rel = self.dropout(rel, deterministic=deterministic)

        new_mems = []
        for i, layer in enumerate(self.layers):
            memory = None if mems is None else mems[i]
            new_mems.append(self._cache(h, memory))
            h, g = layer(h, g, rel, content_visible, query_visible, different_segment, memory,
                         target_mapping, deterministic=deterministic)
        out = self.dropout(h if g is None else g, deterministic=deterministic)
        return out, tuple(new_mems)

    def _cache(self, h: jax.Array, memory: Optional[jax.Array]) -> jax.Array:
        """Transformer-XL §3.2: SG(memory ∘ h), the last `mem_len` states.  [b, m', d]."""
        states = h if memory is None else jnp.concatenate([memory.astype(h.dtype), h], 1)
        if self.options.mem_len:
            states = states[:, -self.options.mem_len:]
        return jax.lax.stop_gradient(states)


def target_mapping_from_positions(positions: jax.Array, length: int,
                                  weights: Optional[jax.Array] = None) -> jax.Array:
    """One-hot rows for the predicted positions.  [b, p] -> float32 [b, p, length]
    (rows of weight 0, padding predictions, are all zero)."""
    mapping = jax.nn.one_hot(positions, length, dtype=jnp.float32)
    if weights is not None:
        mapping = mapping * (weights > 0)[..., None]
    return mapping


class XLNetPretrainingModel(Model):
    """Permutation-LM loss: cross-entropy of the query stream's predictions of the targets.

    Batch features (`t2t.data.permutation_lm`): `encoder_input_tokens` [b, L],
    `factorization_ranks` [b, L] (each position's step in z), `masked_positions` /
    `masked_ids` / `masked_weights` [b, P] (the targets: the last L/K of z),
    optional `token_type_ids` [b, L], `encoder_segment_ids` [b, L] (0 = padding) and
    `memory_tokens` [b, M]: the text right before the segment, whose per-layer states
    (content stream, no gradient, Transformer-XL §3.2) are attended as memory. The paper
    carries those states over from the previous training step; here the previous segment
    rides in the batch and its states are recomputed, so the trainer stays stateless.
    """

    family = "xlnet"
    input_features = ("encoder_input_tokens", "encoder_segment_ids", "token_type_ids",
                      "factorization_ranks", "masked_positions", "masked_weights",
                      "memory_tokens")

    def __init__(self, config: TransformerConfig, loss: LossConfig = LossConfig(z_loss=0.0),
                 options: XLNetOptions = XLNetOptions()):
        self.options = options
        super().__init__(config, XLNet(config, options), loss)

    def init(self, rng: jax.Array, batch) -> dict:
        return self.module.init({"params": rng, "dropout": rng},
                                **self._features(batch))["params"]

    def _features(self, batch, mems=None) -> dict:
        tokens = batch["encoder_input_tokens"]
        segments = batch.get("encoder_segment_ids")
        return {"input_tokens": tokens,
                "attention_mask": None if segments is None else (segments > 0),
                "token_type_ids": batch.get("token_type_ids"),
                "perm_mask": perm_mask_from_ranks(batch["factorization_ranks"]),
                "target_mapping": target_mapping_from_positions(
                    batch["masked_positions"], tokens.shape[1], batch["masked_weights"]),
                "mems": mems}

    def memory(self, params, batch, rng: Optional[jax.Array] = None) -> Optional[Mems]:
        """The per-layer states of `memory_tokens` (None without them), no gradient."""
        if "memory_tokens" not in batch:
            return None
        rngs = {} if rng is None else {"dropout": rng}
        _, mems = self.module.apply({"params": params}, batch["memory_tokens"],
                                    deterministic=rng is None, rngs=rngs,
                                    method=XLNet.encode)
        return jax.lax.stop_gradient(mems)

    def apply(self, params, batch, rng: Optional[jax.Array] = None, **kwargs) -> jax.Array:
        """Logits of the targets [b, P, vocab] (query stream, over the memory's states)."""
        memory_rng = step_rng = rng
        if rng is not None:
            memory_rng, step_rng = jax.random.split(rng)
        mems = self.memory(params, batch, memory_rng)
        rngs = {} if step_rng is None else {"dropout": step_rng}
        logits, _ = self.module.apply({"params": params}, **self._features(batch, mems),
                                      deterministic=rng is None, rngs=rngs, **kwargs)
        return logits

    def loss_fn(self, params, batch, rng: Optional[jax.Array] = None):
        logits = self.apply(params, batch, rng)
        return self.token_loss(logits, batch["masked_ids"], batch["masked_weights"])

    def loss_weight(self, batch) -> jax.Array:
        return jnp.sum(batch["masked_weights"])

    def score(self, params, batch) -> jax.Array:
        """log p(targets | the tokens before them in z) per example [b] (eq. 5's sum)."""
        log_probs = jax.nn.log_softmax(self.apply(params, batch).astype(jnp.float32), -1)
        token_lp = jnp.take_along_axis(log_probs, batch["masked_ids"][..., None], -1)[..., 0]
        return jnp.sum(token_lp * batch["masked_weights"], axis=-1)
