"""The token mask that sparse encoder self-attention receives instead of a dense l x l mask,
and the config checks both sparse patterns share.

With ``attention_pattern != "dense"`` the Encoder passes a :class:`TokenMask` as the
self-attention mask (t2t/nn/stacks.py Encoder): per-token validity, the packed example of
each token and, for Longformer, the global tokens; the pattern itself (window, blocks) comes
from the config, and each layer knows its index (`LayerFields.layer_index`: Longformer's
per-layer window, BigBird's per-layer random plan). The layers need distinct Python
indices, so sparse patterns run the layers as a Python loop (``scan_layers=False``); a
Longformer with one window for every layer may scan (its layers need no index).
"""
from __future__ import annotations

from typing import Optional

import flax.struct
import jax
import jax.numpy as jnp

from t2t.errors import ConfigError
from t2t.nn.dropout import keep_mask

BIG_NEG = -1e10     # masked logits (finite: a fully masked padding row stays NaN-free)


@flax.struct.dataclass
class TokenMask:
    """valid: [batch, length] bool, False at padding; global_tokens: [batch, length] bool or
    None (Longformer); segment_ids: [batch, length] int or None, the packed example of each
    token (0 = padding): tokens attend only within their own example."""

    valid: jax.Array
    global_tokens: Optional[jax.Array] = None
    segment_ids: Optional[jax.Array] = None

    def dense(self) -> jax.Array:
        """The [batch, 1, length, length] bool mask of full attention within the same
        limits: valid keys of the query's own example."""
        mask = self.valid[:, None, None, :]
        if self.segment_ids is not None:
            seg = self.segment_ids
            mask = mask & (seg[:, None, :, None] == seg[:, None, None, :])
        return mask


def masked_softmax(logits: jax.Array, mask: jax.Array, dtype, dropout_rate: float = 0.0,
                   dropout_rng: Optional[jax.Array] = None) -> jax.Array:
    """Softmax over the last axis of `logits` where `mask` (float32), the weights dropped out
    at `dropout_rate` when `dropout_rng` is given, in `dtype`: both sparse patterns' rows."""
    probs = jax.nn.softmax(jnp.where(mask, logits, BIG_NEG).astype(jnp.float32), axis=-1)
    if dropout_rng is not None and dropout_rate > 0.0:
        keep = keep_mask(dropout_rng, 1.0 - dropout_rate, probs.shape)
        probs = jnp.where(keep, probs / (1.0 - dropout_rate), 0.0)
    return probs.astype(dtype)


def token_mask(input_tokens: jax.Array, segment_ids: Optional[jax.Array],
               global_tokens: Optional[jax.Array]) -> TokenMask:
    """The Encoder's TokenMask: valid where `segment_ids` > 0 (everywhere without them);
    padding is never global."""
    valid = (jnp.ones(input_tokens.shape, bool) if segment_ids is None
             else segment_ids > 0)
    if global_tokens is not None:
        global_tokens = global_tokens.astype(bool) & valid
    return TokenMask(valid, global_tokens, segment_ids)


def check_sparse_config(cfg) -> None:
    """ConfigError (one line) unless a sparse `attention_pattern` can run with `cfg`."""
    name = f"attention_pattern={cfg.attention_pattern!r}"
    if cfg.attention_pattern == "sliding_window":
        from t2t.nn.longformer import check_longformer_config
        check_longformer_config(cfg)
    if cfg.scan_layers and not (cfg.attention_pattern == "sliding_window"
                                and len(cfg.attention_window) == 1):
        raise ConfigError(f"{name} gives each layer its own index (a window per layer, a "
                          "random plan): set scan_layers=False (or give Longformer one "
                          "attention_window)")
    if cfg.share_layers or cfg.universal_steps or cfg.share_encoder_decoder:
        raise ConfigError(f"{name} needs distinct encoder layers: set share_layers=False, "
                          "universal_steps=0 and share_encoder_decoder=False")
    if cfg.position_embedding == "relative":
        raise ConfigError(f"{name} has no l x l attention to add a relative position bias "
                          "to: set position_embedding to learned, sinusoidal, rotary or none")
    others = [n for n, on in (("encoder_causal", cfg.encoder_causal),
                              ("linformer_k", cfg.linformer_k),
                              ("synthesizer", cfg.synthesizer != "none"),
                              ("funnel_blocks", cfg.funnel_blocks),
                              ("convolution", cfg.convolution != "none"),
                              ("prefix_length", cfg.prefix_length)) if on]
    if others:
        raise ConfigError(f"{name} replaces the dense encoder self-attention, which "
                          f"{', '.join(others)} also change; turn those off")
