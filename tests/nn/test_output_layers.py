"""Adaptive input (Baevski & Auli 2019), adaptive softmax (Grave et al. 2017) with and
without projection, and mixture of softmaxes (Yang et al. 2018) against numpy references
written from the papers' definitions."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.errors import ConfigError
from t2t.nn import Decoder
from t2t.nn.adaptive_input import AdaptiveInput
from t2t.nn.adaptive_softmax import AdaptiveSoftmax
from t2t.nn.mixture_of_softmaxes import MixtureOfSoftmaxes

from tests.nn.helpers import GPT_TINY, T5_TINY, init, tokens

CUTS = (10, 30)                   # head [0, 10), tails [10, 30) and [30, 64)
ADAPTIVE = T5_TINY.replace(adaptive_cutoffs=CUTS, tie_embeddings=False)


def _np_log_softmax(x):
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def _hidden(shape=(2, 3)):
    return np.random.default_rng(0).normal(size=shape + (32,)).astype(np.float32)


@pytest.mark.parametrize("projection", [True, False])
def test_adaptive_softmax_is_head_times_cluster_probabilities(projection):
    cfg = ADAPTIVE.replace(output_layer="adaptive_softmax", adaptive_softmax_projection=projection)
    layer = AdaptiveSoftmax(cfg)
    h = _hidden()
    params = init(layer, jnp.asarray(h))
    out = np.asarray(layer.apply({"params": params}, jnp.asarray(h)))
    assert out.shape == (2, 3, 64)
    # Parameter shapes: head c_1 + 2 clusters; tails d/4 and d/16 wide with projection.
    assert params["head"]["kernel"].shape == (32, CUTS[0] + 2)
    widths = (8, 2) if projection else (32, 32)
    assert params["tail_1"]["kernel"].shape == (widths[0], 20)
    assert params["tail_2"]["kernel"].shape == (widths[1], 34)
    assert ("tail_1_projection" in params) == projection
    # Reference: p(w) = p_head(w) in the head, p_head(cluster i) * p_i(w) in tail i.
    head = _np_log_softmax(h @ np.asarray(params["head"]["kernel"]))
    ref = np.zeros((2, 3, 64))
    ref[..., :10] = head[..., :10]
    for i, (lo, hi) in enumerate([(10, 30), (30, 64)], start=1):
        x = h @ np.asarray(params[f"tail_{i}_projection"]["kernel"]) if projection else h
        tail = _np_log_softmax(x @ np.asarray(params[f"tail_{i}"]["kernel"]))
        ref[..., lo:hi] = head[..., 10 + i - 1, None] + tail
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.exp(out.astype(np.float64)).sum(-1), 1.0, atol=1e-5)


def test_adaptive_input_embeds_each_cluster_at_its_width_then_projects():
    cfg = ADAPTIVE.replace(adaptive_input=True)
    layer = AdaptiveInput(cfg)
    ids = jnp.array([[0, 9, 10, 29], [30, 63, 5, 31]])
    params = init(layer, ids)
    out = np.asarray(layer.apply({"params": params}, ids))
    bounds = [0, 10, 30, 64]
    for i, width in enumerate((32, 8, 2)):
        assert params[f"cluster_{i}"].shape == (bounds[i + 1] - bounds[i], width)
    ref = np.zeros((2, 4, 32))
    for (r, c), w in np.ndenumerate(np.asarray(ids)):
        i = int(np.searchsorted(bounds, w, side="right")) - 1
        ref[r, c] = (np.asarray(params[f"cluster_{i}"])[w - bounds[i]]
                     @ np.asarray(params[f"cluster_{i}_projection"]))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("projection", [True, False])
def test_tied_adaptive_softmax_scores_with_the_input_clusters(projection):
    cfg = ADAPTIVE.replace(adaptive_input=True, output_layer="adaptive_softmax",
                           tie_embeddings=True, adaptive_softmax_projection=projection)
    layer = AdaptiveInput(cfg, with_softmax=True)
    params = init(layer, jnp.array([[0, 12, 40]]))
    h = _hidden()
    out = np.asarray(layer.apply({"params": params}, jnp.asarray(h),
                                 method=AdaptiveInput.log_probs))
    tables = [np.asarray(params[f"cluster_{i}"]) for i in range(3)]
    proj = [np.asarray(params[f"cluster_{i}_projection"]) if projection else np.eye(32)
            for i in range(3)]
    head = _np_log_softmax((h @ proj[0].T) @ np.concatenate(
        [tables[0], np.asarray(params["cluster_rows"])]).T)         # [.., 10 + 2]
    ref = [head[..., :10]] + [head[..., 9 + i, None] + _np_log_softmax(
        (h @ proj[i].T) @ tables[i].T) for i in (1, 2)]
    np.testing.assert_allclose(out, np.concatenate(ref, -1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.exp(out.astype(np.float64)).sum(-1), 1.0, atol=1e-5)
    scaled = AdaptiveInput(cfg.replace(scale_tied_logits=True), with_softmax=True).apply(
        {"params": params}, jnp.asarray(h) * 32 ** 0.5, method=AdaptiveInput.log_probs)
    np.testing.assert_allclose(scaled, out, rtol=1e-5, atol=1e-5)   # T5.1.0's d^-0.5
    count = sum(x.size for x in jax.tree_util.tree_leaves(params))
    if not projection:     # as many parameters as one full table, plus a row per tail cluster
        assert count == 64 * 32 + 2 * 32


def _mos_reference(params, table, h):
    prior = _np_log_softmax(h @ np.asarray(params["prior"]["kernel"]))          # [.., K]
    ctx = np.tanh(np.einsum("...d,dke->...ke", h, np.asarray(params["contexts"]["kernel"])))
    comp = _np_log_softmax(ctx @ table.T)                                       # [.., K, V]
    a = prior[..., None] + comp
    m = a.max(-2, keepdims=True)
    return (m + np.log(np.exp(a - m).sum(-2, keepdims=True)))[..., 0, :]


@pytest.mark.parametrize("k", [1, 3])
def test_mixture_of_softmaxes_mixes_k_softmaxes_by_a_learned_prior(k):
    cfg = T5_TINY.replace(output_layer="mixture_of_softmaxes", mos_num_softmaxes=k)
    table = np.random.default_rng(1).normal(size=(64, 32)).astype(np.float32)
    layer = MixtureOfSoftmaxes(cfg)
    h = _hidden()
    word_logits = lambda x: x @ jnp.asarray(table).T  # noqa: E731
    params = init(layer, jnp.asarray(h), word_logits)
    out = np.asarray(layer.apply({"params": params}, jnp.asarray(h), word_logits))
    np.testing.assert_allclose(out, _mos_reference(params, table, h), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.exp(out.astype(np.float64)).sum(-1), 1.0, atol=1e-5)
    if k == 1:   # the prior is 1: a plain softmax over tanh(W_1 h) · table
        ctx = np.tanh(h @ np.asarray(params["contexts"]["kernel"])[:, 0])
        np.testing.assert_allclose(out, _np_log_softmax(ctx @ table.T), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("changes", [
    {"output_layer": "adaptive_softmax"},
    {"output_layer": "adaptive_softmax", "adaptive_input": True},
    {"output_layer": "adaptive_softmax", "adaptive_softmax_projection": False},
    {"output_layer": "adaptive_softmax", "adaptive_input": True, "tie_embeddings": True},
    {"output_layer": "mixture_of_softmaxes", "tie_embeddings": True},
    {"output_layer": "mixture_of_softmaxes", "tie_embeddings": False},
], ids=["adaptive_softmax", "adaptive_input_and_softmax", "no_projection", "tied_adaptive",
         "mos_tied",
        "mos_untied"])
def test_decoder_outputs_normalised_log_probabilities(changes):
    cfg = GPT_TINY.replace(**{"adaptive_cutoffs": CUTS, "tie_embeddings": False, **changes})
    dec = Decoder(cfg)
    toks = tokens(0, (2, 6))
    params = init(dec, toks)
    out = np.asarray(dec.apply({"params": params}, toks), np.float64)
    assert out.shape == (2, 6, 64)
    np.testing.assert_allclose(np.exp(out).sum(-1), 1.0, atol=1e-5)


@pytest.mark.parametrize("changes,match", [
    ({"output_layer": "adaptive_softmax"}, "adaptive_cutoffs"),
    ({"output_layer": "adaptive_softmax", "adaptive_cutoffs": (30, 10)}, "increase"),
    ({"output_layer": "adaptive_softmax", "adaptive_cutoffs": (10, 64)}, "increase"),
    ({"adaptive_input": True, "adaptive_cutoffs": (10,), "tie_embeddings": True},
     "tie_embeddings=False"),
    ({"output_layer": "mixture_of_softmaxes", "mos_num_softmaxes": 0}, "mos_num_softmaxes"),
    ({"output_layer": "hierarchical"}, "output_layer"),
])
def test_bad_output_layer_options_are_one_line_config_errors(changes, match):
    with pytest.raises(ConfigError, match=match):
        T5_TINY.replace(**changes)
