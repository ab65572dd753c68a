"""Narang et al. 2021 Table 1's activations in the feed-forward block, against torch's
definitions (ELU, SeLU, sigmoid, softplus) and Shazeer 2020's gated FFNs (eq. 5-6)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from t2t.nn.mlp import GATED, MlpBlock, get_activation

from tests.nn.helpers import T5_TINY, init, max_diff

TORCH = {"relu": F.relu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
         "silu": F.silu, "sigmoid": torch.sigmoid, "elu": F.elu, "selu": F.selu,
         "softplus": F.softplus, "linear": lambda t: t}


def _reference(params, x, acts):
    """(prod_i act_i(x W_i)) W_o in float64 torch."""
    t = torch.tensor(np.asarray(x), dtype=torch.float64)
    h = None
    for i, act in enumerate(acts):
        w = torch.tensor(np.asarray(params["wi" if len(acts) == 1 else f"wi_{i}"]["kernel"]),
                         dtype=torch.float64)
        y = TORCH[act](t @ w)
        h = y if h is None else h * y
    return (h @ torch.tensor(np.asarray(params["wo"]["kernel"]), dtype=torch.float64)).numpy()


@pytest.mark.parametrize("acts", [("elu",), ("selu",), ("sigmoid",), ("softplus",)])
def test_plain_activations_match_torch(acts):
    cfg = T5_TINY.replace(mlp_activations=acts)
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 5, cfg.d_model)) * 2
    block = MlpBlock(cfg)
    params = init(block, x)
    assert max_diff(block.apply({"params": params}, x), _reference(params, x, acts)) < 1e-5


@pytest.mark.parametrize("name", ["glu", "geglu", "reglu", "seglu", "swiglu", "liglu"])
def test_gated_variants_are_shazeers_ffns(name):
    """FFN_name(x) = (act(x W) * x V) W2 with V linear; LiGLU is the bilinear one."""
    acts = GATED[name]
    assert acts[1] == "linear"
    assert acts[0] == {"glu": "sigmoid", "geglu": "gelu_tanh", "reglu": "relu", "seglu": "selu",
                       "swiglu": "silu", "liglu": "linear"}[name]
    cfg = T5_TINY.replace(mlp_activations=acts)
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 5, cfg.d_model)) * 2
    block = MlpBlock(cfg)
    params = init(block, x)
    assert set(params) == {"wi_0", "wi_1", "wo"}
    assert max_diff(block.apply({"params": params}, x), _reference(params, x, acts)) < 1e-5


def test_selu_uses_klambauer_constants():
    x = torch.linspace(-4, 4, 41, dtype=torch.float64)
    lam, alpha = 1.0507009873554804934193349852946, 1.6732632423543772848170429916717
    want = lam * torch.where(x > 0, x, alpha * (torch.exp(x) - 1))
    got = np.asarray(get_activation("selu")(jnp.asarray(x.numpy(), jnp.float32)))
    assert np.max(np.abs(got - want.numpy())) < 1e-5
