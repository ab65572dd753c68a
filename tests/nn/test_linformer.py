"""Linformer (Wang et al. 2020) self-attention against its eq. 7, computed here in numpy."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.errors import ConfigError
from t2t.nn import EncoderDecoder
from t2t.nn.attention import MultiHeadAttention, segment_mask

from tests.nn.helpers import T5_TINY, init, max_diff, tokens

CFG = T5_TINY.replace(linformer_k=3, position_embedding="learned", max_length=10)


def _softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_attention_is_softmax_of_q_times_projected_keys():
    """head_i = softmax(Q_i (E K_i)ᵀ / √d) (F V_i), E, F in R^{k x n} (n = 7 of 10 rows)."""
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 7, CFG.d_model))
    attn = MultiHeadAttention(CFG, low_rank=True)
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), init(attn, x, x))
    xs = np.asarray(x, np.float64)
    q, k, v = (np.einsum("bld,dhk->blhk", xs, p[n]["kernel"]) for n in ("query", "key", "value"))
    e, f = p["linformer"]["e"][:7].T, p["linformer"]["f"][:7].T          # [k, n]
    kp, vp = np.einsum("jn,bnhd->bjhd", e, k), np.einsum("jn,bnhd->bjhd", f, v)
    weights = _softmax(np.einsum("bqhd,bjhd->bhqj", q, kp) / np.sqrt(CFG.head_dim))
    assert weights.shape == (2, CFG.num_heads, 7, 3)                     # n x k, not n x n
    want = np.einsum("bhqj,bjhd,hdm->bqm", weights, vp, p["out"]["kernel"])
    assert max_diff(attn.apply({"params": p}, x, x), want) < 1e-5


def test_padding_keys_do_not_reach_the_projection():
    """A row padded from 5 to 7 tokens gives the real positions the 5-token result."""
    x = jax.random.normal(jax.random.PRNGKey(1), (1, 7, CFG.d_model))
    attn = MultiHeadAttention(CFG, low_rank=True)
    params = init(attn, x, x)
    seg = jnp.array([[1, 1, 1, 1, 1, 0, 0]])
    padded = attn.apply({"params": params}, x, x, segment_mask(seg, seg))
    short = attn.apply({"params": params}, x[:, :5], x[:, :5])
    assert max_diff(padded[:, :5], short) < 1e-5


def test_only_the_encoder_self_attention_is_projected():
    model = EncoderDecoder(CFG)
    params = init(model, tokens(1, (2, 8)), tokens(2, (2, 5)))
    enc, dec = params["encoder"], params["decoder"]
    layers = [k for k in (enc.get("layers") or enc) if k.startswith("layer")]
    assert layers and all("linformer" in enc["layers"][n]["self_attention"] for n in layers)
    flat = jax.tree_util.tree_flatten_with_path(dec)[0]
    assert not any("linformer" in jax.tree_util.keystr(path) for path, _ in flat)


def test_bad_linformer_options_are_one_line_config_errors():
    with pytest.raises(ConfigError, match="position_embedding"):
        T5_TINY.replace(linformer_k=4)
    with pytest.raises(ConfigError, match="encoder_causal=False"):
        CFG.replace(encoder_causal=True)
