"""Feed-forward block: plain (relu, gelu, silu) or gated (GLU, GeGLU, ReGLU, SwiGLU)."""
from __future__ import annotations

from typing import Callable, Dict

import flax.linen as nn
import jax
import jax.numpy as jnp

from t2t.nn.config import TransformerConfig
from t2t.nn.dense import Dense, kernel_init

ACTIVATIONS: Dict[str, Callable[[jax.Array], jax.Array]] = {
    "relu": jax.nn.relu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),   # BERT: exact erf
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),  # GPT-2 "gelu_new", T5.1.1
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "sigmoid": jax.nn.sigmoid,
    "tanh": jnp.tanh,
    "linear": lambda x: x,
}

# Named gated variants (Shazeer 2020, "GLU Variants Improve Transformer").
GATED = {
    "glu": ("sigmoid", "linear"),
    "geglu": ("gelu_tanh", "linear"),
    "reglu": ("relu", "linear"),
    "swiglu": ("silu", "linear"),
}


def get_activation(name: str) -> Callable[[jax.Array], jax.Array]:
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; choose one of {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


class MlpBlock(nn.Module):
    """x -> wo(prod_i act_i(wi_i x)).  [batch, length, embed] -> same.

    One activation gives kernel `wi`; several give `wi_0, wi_1, ...` whose activated
    outputs are multiplied (t5x's convention, so ("gelu_tanh", "linear") is GeGLU).
    """

    config: TransformerConfig
    deterministic: bool = True

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config
        acts = cfg.mlp_activations
        dense = lambda feats, axes, name, init: Dense(  # noqa: E731
            feats, axes, use_bias=cfg.use_bias, dtype=cfg.compute_dtype,
            param_dtype=cfg.params_dtype, kernel_init=init, name=name)
        h = None
        for i, act in enumerate(acts):
            name = "wi" if len(acts) == 1 else f"wi_{i}"
            y = get_activation(act)(dense(cfg.d_ff, ("embed", "mlp"), name, kernel_init(cfg))(x))
            h = y if h is None else h * y
        h = nn.with_logical_constraint(h, ("batch", "length", "mlp"))
        h = nn.Dropout(cfg.mlp_dropout_rate)(h, deterministic=self.deterministic)
        return dense(cfg.d_model, ("mlp", "embed"), "wo", kernel_init(cfg))(h)
