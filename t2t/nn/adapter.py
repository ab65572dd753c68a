"""Houlsby et al. 2019 bottleneck adapter: x + W_up · gelu(W_down · x + b_down) + b_up."""
from __future__ import annotations

import flax.linen as nn
import jax

from t2t.nn.config import TransformerConfig
from t2t.nn.dense import Dense

# The paper: weights ~ N(0, 1e-2²) truncated at two standard deviations, biases 0, so the
# adapter starts near the identity and the pretrained network is (almost) unchanged.
ADAPTER_STDDEV = 1e-2


def adapter_init(stddev: float = ADAPTER_STDDEV):
    """Truncated normal with standard deviation `stddev`, cut at ±2 standard deviations."""
    # jax's truncated_normal(stddev) is the std *before* truncation; the ratio rescales it
    # so the truncated draw has exactly `stddev` (as flax's variance_scaling does).
    return nn.initializers.truncated_normal(stddev / 0.87962566103423978, lower=-2.0,
                                            upper=2.0)


class Adapter(nn.Module):
    """[batch, length, d_model] -> same; `config.adapter_size` hidden units (m): 2md + d + m
    parameters."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config
        dense = lambda feats, axes, name: Dense(  # noqa: E731
            feats, axes, use_bias=True, dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype,
            kernel_init=adapter_init(), name=name)
        h = jax.nn.gelu(dense(cfg.adapter_size, ("embed", "mlp"), "down")(x), approximate=False)
        return x + dense(cfg.d_model, ("mlp", "embed"), "up")(h)
