"""Feed-forward block: plain (relu, gelu, silu, elu, selu, sigmoid, softplus) or gated
(GLU, GeGLU, ReGLU, SeGLU, SwiGLU, LiGLU: Shazeer 2020; Narang et al. 2021, Table 1)."""
from __future__ import annotations

from typing import Callable, Dict

import flax.linen as nn
import jax
import jax.numpy as jnp

from t2t.nn.config import TransformerConfig
from t2t.nn.dense import Dense, kernel_init
from t2t.nn.dropout import Dropout
from t2t.nn.residual import fixup_bias, fixup_init

ACTIVATIONS: Dict[str, Callable[[jax.Array], jax.Array]] = {
    "relu": jax.nn.relu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),   # BERT: exact erf
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),  # GPT-2 "gelu_new", T5.1.1
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "sigmoid": jax.nn.sigmoid,
    "tanh": jnp.tanh,
    "elu": jax.nn.elu,           # Clevert et al. 2016: x > 0 ? x : exp(x) - 1
    "selu": jax.nn.selu,         # Klambauer et al. 2017: lambda * elu_alpha(x), their constants
    "softplus": jax.nn.softplus,  # log(1 + exp(x))
    "linear": lambda x: x,
}

# Named gated variants (Shazeer 2020, "GLU Variants Improve Transformer", eqs. 5-6; the
# bias-free FFN_GLU family): FFN(x) = (act(x W) * x V) W2. LiGLU is Shazeer's "Bilinear"
# (no nonlinearity), under the name Narang et al. 2021 (Table 1) give it.
GATED = {
    "glu": ("sigmoid", "linear"),
    "geglu": ("gelu_tanh", "linear"),
    "reglu": ("relu", "linear"),
    "seglu": ("selu", "linear"),
    "swiglu": ("silu", "linear"),
    "liglu": ("linear", "linear"),
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
        wi_init = fixup_init(cfg, kernel_init(cfg), last=False)   # Fixup: scaled, and
        for i, act in enumerate(acts):
            name = "wi" if len(acts) == 1 else f"wi_{i}"
            y = dense(cfg.d_ff, ("embed", "mlp"), name, wi_init)(x)
            y = get_activation(act)(fixup_bias(self, f"fixup_bias_{name}", y))
            h = y if h is None else h * y
        h = nn.with_logical_constraint(h, ("batch", "length", "mlp"))
        h = Dropout(cfg.mlp_dropout_rate)(h, deterministic=self.deterministic)
        h = fixup_bias(self, "fixup_bias_wo", h)
        return dense(cfg.d_model, ("mlp", "embed"), "wo",         # the branch's last layer
                     fixup_init(cfg, kernel_init(cfg), last=True))(h)   # starts at 0
