"""Residual branches without (or beside) normalisation: ReZero and Fixup.

`config.residual_scaling` picks how a layer's sub-block output F joins the residual stream:

* ``"rezero"`` (Bachlechner et al. 2020, eq. 5): x_{i+1} = x_i + alpha_i F(x_i), one scalar
  alpha per sub-block initialised to 0, so every layer is the identity map at init. With
  `norm_type="none"` there is no normalisation at all ("Rezero" in Narang et al. 2021,
  Table 1); with "layer" or "rms" the norm stays on the branch input (pre-LN) or output
  (post-LN) ("Rezero + LayerNorm", "Rezero + RMS Norm").
* ``"fixup"`` (Zhang et al. 2019, sec. 3, "Fixup initialization", rules 1-3), with
  `norm_type="none"`: (1) the last layer of every residual branch (attention `out`, FFN
  `wo`) starts at 0 (the paper zeroes the classification layer too; t2t's output layer keeps
  its init: tied, it is the embedding table, which must not start at 0); (2) the other weight
  layers of a branch start at their usual initialisation scaled by L^(-1/(2m-2)), L the
  number of residual branches of the network and m the number of weight layers in a branch
  (m = 2 for attention: q/k/v then out; and for the FFN: wi then wo); (3) a scalar
  multiplier (init 1) per branch and scalar biases (init 0) before each weight layer and
  activation: x + s * F(x + b_in) + b_out here, with the interior ones (before the FFN's
  activation and `wo`, before attention's `out`) added by `fixup_bias` in mlp.py and
  attention.py.

L counts the branches of the encoder-decoder (2 per encoder layer, 3 per decoder layer:
self-attention, cross-attention, FFN), the paper's setting; a decoder-only model built from
the same config counts its encoder layers too (set num_encoder_layers=0 there).
"""
from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from t2t.errors import ConfigError
from t2t.nn.config import TransformerConfig

FIXUP_BRANCH_DEPTH = 2   # m: weight layers along each branch (q/k/v -> out, wi -> wo)


def check_residual_config(cfg: TransformerConfig) -> None:
    """One-line errors for residual options that cannot work (called by TransformerConfig)."""
    if cfg.residual_scaling == "fixup" and cfg.norm_type != "none":
        raise ConfigError("residual_scaling='fixup' replaces normalisation; set norm_type='none'")
    if cfg.residual_scaling == "fixup" and cfg.moe_num_experts:
        raise ConfigError("residual_scaling='fixup' has no rule for expert layers; "
                          "set moe_num_experts=0")


def fixup_num_branches(cfg: TransformerConfig) -> int:
    """L of Fixup: residual branches of the encoder-decoder (2 per encoder, 3 per decoder
    layer)."""
    return 2 * cfg.num_encoder_layers + 3 * cfg.num_decoder_layers


def fixup_scale(cfg: TransformerConfig) -> float:
    """Fixup rule 2's factor L^(-1/(2m-2)) for the inner weight layers of a branch."""
    return float(fixup_num_branches(cfg)) ** (-1.0 / (2 * FIXUP_BRANCH_DEPTH - 2))


def fixup_init(cfg: TransformerConfig, init: Callable[..., jax.Array], last: bool):
    """`init` unchanged unless Fixup: zeros for a branch's last layer (`last`), else `init`
    scaled by `fixup_scale`."""
    if cfg.residual_scaling != "fixup":
        return init
    if last:
        return nn.initializers.zeros
    factor = fixup_scale(cfg)

    def scaled(*args):
        return init(*args) * jnp.asarray(factor, args[-1] if len(args) > 2 else jnp.float32)
    return scaled


def _scalar(module: nn.Module, name: str, value: float) -> jax.Array:
    init = nn.with_logical_partitioning(nn.initializers.constant(value), ())
    return module.param(name, init, (), module.config.params_dtype)


def fixup_bias(module: nn.Module, name: str, x: jax.Array) -> jax.Array:
    """Fixup rule 3's scalar bias (init 0) added to `x`, or `x` when not Fixup. Call from a
    compact module that has a `config`."""
    if module.config.residual_scaling != "fixup":
        return x
    return x + _scalar(module, name, 0.0).astype(x.dtype)


class ResidualGate(nn.Module):
    """The residual stream's share of one sub-block: F(x) (none), alpha * F(x) (ReZero) or
    s * F(x + b_in) + b_out (Fixup); the caller adds x. [.., embed] -> [.., embed]."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, x: jax.Array, branch: Callable[[jax.Array], jax.Array]) -> jax.Array:
        mode = self.config.residual_scaling
        if mode == "rezero":
            return _scalar(self, "alpha", 0.0).astype(x.dtype) * branch(x)
        if mode == "fixup":
            y = branch(fixup_bias(self, "bias_in", x))
            return fixup_bias(self, "bias_out", _scalar(self, "scale", 1.0).astype(y.dtype) * y)
        return branch(x)
