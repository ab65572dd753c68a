"""Product-key memory (Lample et al. 2019) against a brute-force numpy memory that scores
all n² keys: the product-key search must find the exact top k."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.errors import ConfigError
from t2t.nn import EncoderDecoder
from t2t.nn.product_key import ProductKeyMemory, product_key_lookup

from tests.nn.helpers import T5_TINY, init, tokens

CFG = T5_TINY.replace(pkm_layers=(1,), pkm_num_keys=6, pkm_key_dim=8, pkm_heads=2,
                      pkm_topk=3)


def _brute_force(params, x, cfg):
    """Every one of the n² keys (K1_i, K2_j) scored; exact top k; softmax; values summed
    over heads."""
    n, k, half = cfg.pkm_num_keys, cfg.pkm_topk, cfg.pkm_key_dim // 2
    q = np.einsum("bld,dhe->blhe", x, np.asarray(params["query"]["kernel"]), dtype=np.float64)
    q = (q - q.mean(-1, keepdims=True)) / np.sqrt(q.var(-1, keepdims=True) + cfg.norm_eps)
    q = q * np.asarray(params["query_norm_scale"]) + np.asarray(params["query_norm_bias"])
    k1, k2 = np.asarray(params["sub_keys_1"]), np.asarray(params["sub_keys_2"])
    values = np.asarray(params["values"], np.float64)
    out = np.zeros(x.shape)
    for b, l, h in np.ndindex(x.shape[0], x.shape[1], cfg.pkm_heads):
        full = np.array([q[b, l, h, :half] @ k1[h, i] + q[b, l, h, half:] @ k2[h, j]
                         for i in range(n) for j in range(n)])          # slot i * n + j
        top = np.argsort(-full)[:k]
        w = np.exp(full[top] - full[top].max())
        out[b, l] += (w / w.sum()) @ values[top]
    return out


def test_memory_equals_the_brute_force_search_over_all_product_keys():
    layer = ProductKeyMemory(CFG)
    x = np.random.default_rng(0).normal(size=(2, 5, 32)).astype(np.float32)
    params = init(layer, jnp.asarray(x))
    assert params["values"].shape == (36, 32)                      # n² slots
    assert params["sub_keys_1"].shape == (2, 6, 4)
    out = layer.apply({"params": params}, jnp.asarray(x))
    np.testing.assert_allclose(out, _brute_force(params, x, CFG), rtol=1e-5, atol=1e-5)


def test_lookup_finds_the_exact_top_k_slots_and_scores():
    rng = np.random.default_rng(1)
    q1, q2 = rng.normal(size=(2, 50, 3, 4)), rng.normal(size=(2, 50, 3, 4))
    k1, k2 = rng.normal(size=(3, 7, 4)), rng.normal(size=(3, 7, 4))
    scores, slots = product_key_lookup(*(jnp.asarray(a, jnp.float32) for a in (q1, q2, k1, k2)),
                                       5)
    full = (np.einsum("...hd,hnd->...hn", q1, k1)[..., :, None]
            + np.einsum("...hd,hnd->...hn", q2, k2)[..., None, :]).reshape(2, 50, 3, 49)
    ref = -np.sort(-full, axis=-1)[..., :5]
    np.testing.assert_allclose(scores, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.take_along_axis(full, np.asarray(slots), -1), ref,
                               rtol=1e-5, atol=1e-5)


def test_memory_replaces_the_feed_forward_of_the_listed_decoder_layers_only():
    model = EncoderDecoder(CFG)
    params = init(model, tokens(0, (2, 7)), tokens(1, (2, 5)))
    layers = params["decoder"]["layers"]
    assert "values" in layers["layer_1"]["mlp"] and "wo" in layers["layer_0"]["mlp"]
    assert "wo" in params["encoder"]["layers"]["layer_1"]["mlp"]
    grads = jax.jit(jax.grad(lambda p: jnp.sum(model.apply({"params": p}, tokens(0, (2, 7)),
                                                           tokens(1, (2, 5))))))(params)
    assert np.isfinite(np.asarray(grads["decoder"]["layers"]["layer_1"]["mlp"]["values"])).all()


@pytest.mark.parametrize("changes,match", [
    ({"pkm_key_dim": 7}, "pkm_key_dim"),
    ({"pkm_topk": 7}, "pkm_topk"),
    ({"pkm_layers": (2,)}, "decoder layer indices"),
    ({"scan_layers": True}, "distinct layers"),
])
def test_bad_memory_options_are_one_line_config_errors(changes, match):
    with pytest.raises(ConfigError, match=match):
        CFG.replace(**changes)
