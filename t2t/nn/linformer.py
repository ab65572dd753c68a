"""Linformer (Wang et al. 2020): self-attention with keys and values projected along the
length, n -> k (sec. 4, eq. 7):

    head_i = softmax(Q_i (E_i K_i)ᵀ / √d_k) · (F_i V_i),   E_i, F_i ∈ R^{k×n}

so the attention matrix is [n, k] and time and memory grow linearly in n for a fixed k.
`config.linformer_k = k` applies it to the encoder's self-attention only (the paper's
bidirectional setting: a projection along the length mixes future positions, so it cannot
be causal). E and F are learned per layer and shared by the heads (the paper's "headwise
sharing", sec. 4), [max_length, k], the first n rows used for a length-n input;
init N(0, 1/n_max). Padding keys (no query attends them) are zeroed before the projection;
packed examples in one row would be mixed by it, so pack encoder inputs only without it.
The projected keys carry no relative offsets: use absolute positions (learned, sinusoidal,
rotary or none).
"""
from __future__ import annotations

from typing import Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from t2t.errors import ConfigError, UserError
from t2t.nn.config import TransformerConfig


def check_linformer_config(cfg: TransformerConfig) -> None:
    """One-line errors for Linformer options (called by TransformerConfig)."""
    if cfg.linformer_k < 0:
        raise ConfigError(f"linformer_k must be >= 0 (0 = off), got {cfg.linformer_k}")
    if cfg.position_embedding == "relative":
        raise ConfigError("linformer_k projects keys along the length, which has no relative "
                          "offsets: set position_embedding to learned, sinusoidal or rotary")
    if cfg.synthesizer != "none":
        raise ConfigError("linformer_k and synthesizer both replace the attention logits; "
                          "choose one")
    if cfg.encoder_causal or cfg.share_encoder_decoder:
        raise ConfigError("linformer_k applies to a bidirectional encoder of its own: set "
                          "encoder_causal=False and share_encoder_decoder=False")


class LowRankKeys(nn.Module):
    """k, v [batch, n, heads, d] -> E k, F v [batch, linformer_k, heads, d]; the mask
    [batch|1, 1, q, n] (True = may attend) only zeroes padding keys before the projection."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, k: jax.Array, v: jax.Array, mask: Optional[jax.Array]
                 ) -> Tuple[jax.Array, jax.Array]:
        cfg = self.config
        n = k.shape[1]
        if n > cfg.max_length:
            raise UserError(f"Linformer self-attention over {n} positions, but its "
                            f"projections have max_length={cfg.max_length} rows; raise it")
        init = nn.with_logical_partitioning(nn.initializers.normal(cfg.max_length ** -0.5),
                                            (None, None))
        shape = (cfg.max_length, cfg.linformer_k)
        e = self.param("e", init, shape, cfg.params_dtype)[:n].astype(k.dtype)   # [n, k]
        f = self.param("f", init, shape, cfg.params_dtype)[:n].astype(v.dtype)
        if mask is not None:                                # keys some query may attend
            keep = jnp.any(mask, axis=-2)[:, 0, :, None, None]          # [b|1, n, 1, 1]
            k, v = jnp.where(keep, k, 0), jnp.where(keep, v, 0)
        k = jnp.einsum("bnhd,nk->bkhd", k, e, preferred_element_type=jnp.float32)
        v = jnp.einsum("bnhd,nk->bkhd", v, f, preferred_element_type=jnp.float32)
        return k.astype(e.dtype), v.astype(f.dtype)
