"""ELMo's biLM (Peters et al. 2018): LSTMP against its equations, the two LMs' information
flow by perturbation, the char CNN and highway layers, the residual, the joint loss, the
scalar mix over its layers and the paper's parameter count."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.data import characters
from t2t.errors import ConfigError, UserError
from t2t.models import elmo
from t2t.models.base import LossConfig

TINY = elmo.ElmoConfig(vocab_size=40, max_chars=8, char_embed_dim=4, filters=((1, 4), (3, 6)),
                       num_highway=2, projection_dim=6, cell_size=10, num_layers=2,
                       dropout_rate=0.0)
TOKENS = jnp.array([[1, 5, 6, 7, 8, 9, 2], [1, 11, 12, 2, 0, 0, 0]], jnp.int32)   # [2, 7]


def _chars(tokens, seed=0):
    rng = np.random.default_rng(seed)
    chars = rng.integers(1, characters.NUM_CHAR_IDS, (*tokens.shape, TINY.max_chars))
    return jnp.asarray(chars * (np.asarray(tokens) > 0)[..., None], jnp.int32)


@pytest.fixture(scope="module")
def bilm():
    module = elmo.BiLM(TINY)
    params = module.init(jax.random.PRNGKey(0), TOKENS, _chars(TOKENS))["params"]
    return module, params


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _lstmp_reference(p, x, length, reverse):
    """Sak et al. 2014 eq. 1-7 without peepholes, in numpy: gates from x_t and the
    projected r_{t-1}; r_t = W_rm m_t. Reads x[:length] (backwards when reverse)."""
    n = p["projection"].shape[0]
    cell = p["cell"]
    w_x = {g: np.asarray(cell[f"i{g}"]["kernel"]) for g in elmo.GATES}
    bias = {g: np.asarray(cell[f"h{g}"]["bias"]) for g in elmo.GATES}
    w_r = {g: np.asarray(p["recurrent"])[:, k * n:(k + 1) * n] for k, g in enumerate(elmo.GATES)}
    proj = np.asarray(p["projection"])
    c, r = np.zeros(n), np.zeros(proj.shape[1])
    out = np.zeros((x.shape[0], proj.shape[1]))
    order = range(length - 1, -1, -1) if reverse else range(length)
    for t in order:
        z = {g: x[t] @ w_x[g] + r @ w_r[g] + bias[g] for g in elmo.GATES}
        c = _sigmoid(z["f"]) * c + _sigmoid(z["i"]) * np.tanh(z["g"])
        m = _sigmoid(z["o"]) * np.tanh(c)
        r = m @ proj
        out[t] = r
    return out


@pytest.mark.parametrize("reverse", [False, True])
def test_projected_lstm_follows_the_lstmp_equations(reverse):
    layer = elmo.ProjectedLSTM(cell_size=10, projection_dim=6, reverse=reverse)
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 7, 5))
    lengths = jnp.array([7, 4])
    params = layer.init(jax.random.PRNGKey(2), x, lengths)["params"]
    # The recurrent kernels are stored only as their factors (proj x 4 cell + cell x proj).
    assert set(params["cell"]["hi"]) == {"bias"}
    assert params["recurrent"].shape == (6, 40) and params["projection"].shape == (10, 6)
    out = np.asarray(layer.apply({"params": params}, x, lengths))
    for row, length in enumerate([7, 4]):
        want = _lstmp_reference(params, np.asarray(x[row], np.float64), length, reverse)
        np.testing.assert_allclose(out[row, :length], want[:length], atol=1e-5)


def test_forward_lm_never_sees_later_tokens_and_backward_never_earlier(bilm):
    module, params = bilm
    chars, p, length = _chars(TOKENS), TINY.projection_dim, 7

    @jax.jit
    def directions(tokens, chars):
        """Every forward and backward state of sentence 0 [k, length, width]: both LSTM
        layers' halves and each LM's logits."""
        out = module.apply({"params": params}, tokens, chars)
        forward = [out["layers"][j, 0, :, :p] for j in (1, 2)] + [out["forward_logits"][0]]
        backward = [out["layers"][j, 0, :, p:] for j in (1, 2)] + [out["backward_logits"][0]]
        return forward, backward, out["layers"][:, 1]

    f0, b0, other0 = directions(TOKENS, chars)
    for j in range(1, length - 1):
        tokens = TOKENS.at[0, j].set(30)
        changed = chars.at[0, j].set(_chars(TOKENS, seed=j + 10)[0, j])
        f1, b1, other1 = directions(tokens, changed)
        for old, new in zip(f0, f1):
            np.testing.assert_array_equal(np.asarray(old[:j]), np.asarray(new[:j]))
            assert float(jnp.abs(old[j:length] - new[j:length]).max()) > 1e-4
        for old, new in zip(b0, b1):
            np.testing.assert_array_equal(np.asarray(old[j + 1:length]),
                                          np.asarray(new[j + 1:length]))
            assert float(jnp.abs(old[:j + 1] - new[:j + 1]).max()) > 1e-4
        np.testing.assert_array_equal(np.asarray(other0), np.asarray(other1))


def test_char_cnn_and_highway_shapes_and_locality():
    enc = elmo.CharacterEncoder(TINY)
    chars = _chars(TOKENS)
    params = enc.init(jax.random.PRNGKey(0), chars)["params"]
    assert params["char_embed"]["embedding"].shape == (characters.NUM_CHAR_IDS, 4)
    assert params["conv_1"]["kernel"].shape == (1, 4, 4)          # [width, embed, filters]
    assert params["conv_3"]["kernel"].shape == (3, 4, 6)
    assert params["highway_1"]["gate"]["kernel"].shape == (10, 10)  # filters = 4 + 6
    assert params["projection"]["kernel"].shape == (10, TINY.projection_dim)
    out = enc.apply({"params": params}, chars)
    assert out.shape == (2, 7, TINY.projection_dim)
    # a token's representation depends on its own characters only
    changed = enc.apply({"params": params}, chars.at[0, 3, 2].set(77))
    diff = np.abs(np.asarray(changed - out)).max(-1)
    assert diff[0, 3] > 0 and np.count_nonzero(diff) == 1


def test_highway_is_the_gated_carry():
    hw = elmo.Highway()
    x = jax.random.normal(jax.random.PRNGKey(3), (5, 8))
    params = hw.init(jax.random.PRNGKey(4), x)["params"]
    np.testing.assert_array_equal(params["gate"]["bias"], -2.0 * np.ones(8))
    t = _sigmoid(np.asarray(x @ params["gate"]["kernel"] + params["gate"]["bias"]))
    h = np.maximum(np.asarray(x @ params["transform"]["kernel"] + params["transform"]["bias"]), 0)
    np.testing.assert_allclose(hw.apply({"params": params}, x), t * h + (1 - t) * np.asarray(x),
                               atol=1e-6)


def test_residual_connection_between_the_lstm_layers(bilm):
    module, params = bilm
    chars = _chars(TOKENS)
    out = module.apply({"params": params}, TOKENS, chars)["layers"]
    # a second layer whose LSTMs output nothing passes the first layer's output through
    silent = jax.tree_util.tree_map(lambda x: x, params)
    for d in ("forward", "backward"):
        silent[f"{d}_lstm_1"] = {**params[f"{d}_lstm_1"],
                                 "projection": jnp.zeros_like(params[f"{d}_lstm_1"]["projection"])}
    quiet = module.apply({"params": silent}, TOKENS, chars)["layers"]
    np.testing.assert_array_equal(np.asarray(quiet[2]), np.asarray(out[1]))
    assert float(jnp.abs(out[2] - out[1]).max()) > 1e-4
    # layer 0 is the token representation for both directions
    p = TINY.projection_dim
    np.testing.assert_array_equal(np.asarray(out[0, ..., :p]), np.asarray(out[0, ..., p:]))


def test_loss_is_the_joint_forward_and_backward_likelihood(bilm):
    _, params = bilm
    model = elmo.ElmoModel(TINY)
    batch = {"token_ids": TOKENS, "char_ids": _chars(TOKENS)}
    loss, metrics = model.loss_fn(params, batch)
    out = model.apply(params, batch)
    lp_f = np.asarray(jax.nn.log_softmax(out["forward_logits"]))
    lp_b = np.asarray(jax.nn.log_softmax(out["backward_logits"]))
    nll = []
    for row, n in enumerate([7, 4]):
        toks = np.asarray(TOKENS[row])
        nll += [-lp_f[row, k, toks[k + 1]] for k in range(n - 1)]   # k predicts k+1
        nll += [-lp_b[row, k, toks[k - 1]] for k in range(1, n)]    # k predicts k-1
    np.testing.assert_allclose(float(loss), np.mean(nll), rtol=1e-5)
    assert float(metrics["num_tokens"]) == len(nll) == float(model.loss_weight(batch))
    np.testing.assert_allclose(float(metrics["perplexity"]), np.exp(np.mean(nll)), rtol=1e-5)
    # nll holds sentence 0's 6 forward then 6 backward terms, then sentence 1's 3 and 3
    np.testing.assert_allclose(float(metrics["forward_loss"]),
                               np.mean(nll[:6] + nll[12:15]), rtol=1e-5)
    # the softmax is one shared layer
    assert set(params) >= {"softmax"} and not any("softmax_" in k for k in params)
    # a z-loss adds to the loss, not to the perplexity
    z_loss, z_metrics = elmo.ElmoModel(TINY, LossConfig(z_loss=1e-2)).loss_fn(params, batch)
    assert float(z_loss) > float(loss) + 1e-3 and float(z_metrics["z_loss"]) > 0
    np.testing.assert_allclose(float(z_metrics["perplexity"]), float(metrics["perplexity"]),
                               rtol=1e-6)
    score = model.score(params, batch)
    np.testing.assert_allclose(np.asarray(score), [-sum(nll[:6]), -sum(nll[12:15])], rtol=1e-5)


def test_scalar_mix_over_elmo_layers(bilm):
    _, params = bilm
    model = elmo.ElmoModel(TINY)
    batch = {"token_ids": TOKENS, "char_ids": _chars(TOKENS)}
    layers = model.layers(params, batch)                          # [3, 2, 7, 12]
    assert layers.shape == (3, 2, 7, 2 * TINY.projection_dim)
    head = elmo.ElmoMixClassifier(num_layers=3, num_classes=2)
    hp = head.init(jax.random.PRNGKey(5), layers, TOKENS)["params"]
    s, gamma = jnp.array([0.3, -1.0, 2.0]), 1.7
    hp = {**hp, "scalar_mix": {"weights": s, "gamma": jnp.asarray(gamma)}}
    want_mix = gamma * np.einsum("j,jbld->bld", np.asarray(jax.nn.softmax(s)), np.asarray(layers))
    mask = (np.asarray(TOKENS) > 0)[..., None]
    pooled = (want_mix * mask).sum(1) / mask.sum(1)
    want = pooled @ np.asarray(hp["classifier"]["kernel"]) + np.asarray(hp["classifier"]["bias"])
    np.testing.assert_allclose(head.apply({"params": hp}, layers, TOKENS), want, rtol=1e-5,
                               atol=1e-6)
    got = elmo.mix_weights(hp)
    np.testing.assert_allclose(got["weights"], jax.nn.softmax(s), rtol=1e-6)
    # frozen features: no gradient reaches the biLM through `layers`
    grads = jax.jit(jax.grad(lambda p: jnp.sum(model.layers(p, batch))))(params)
    assert all(float(jnp.abs(g).max()) == 0 for g in jax.tree_util.tree_leaves(grads))


def test_parameter_counts():
    # Sec. 3.4 / the released "original" biLM: 93.6M parameters without the softmax.
    convs = sum(w * 16 * n + n for w, n in elmo.ORIGINAL_FILTERS)
    highway = 2 * 2 * (2048 * 2048 + 2048)
    lstmp = 4 * (512 * 4096 + 4096) + 4096 * 512 + 512 * 4 * 4096
    want = 262 * 16 + convs + highway + 2048 * 512 + 512 + 4 * lstmp
    original = elmo.ElmoConfig()
    assert elmo.count_params(original, softmax=False) == want == 93_600_864
    assert elmo.count_params(original) == want + 512 * 793471 + 793471


def test_bad_config_and_batch_are_one_line_errors():
    with pytest.raises(ConfigError, match="max_chars"):
        elmo.ElmoConfig(max_chars=5)
    with pytest.raises(ConfigError, match="cell_size"):
        elmo.ElmoConfig(cell_size=0)
    with pytest.raises(UserError, match="char_ids"):
        elmo.ElmoModel(TINY).init(jax.random.PRNGKey(0), {"token_ids": TOKENS})
    with pytest.raises(UserError, match="max_chars is 8"):
        elmo.ElmoModel(TINY).init(jax.random.PRNGKey(0), {
            "token_ids": TOKENS, "char_ids": jnp.ones((2, 7, 9), jnp.int32)})


def test_the_mix_learns_which_layer_carries_the_label():
    # 3 layers of noise; only layer 2's mean over tokens tells the class apart
    rng = np.random.default_rng(0)
    n, length, d = 256, 5, 8
    labels = rng.integers(0, 2, n)
    layers = rng.normal(size=(3, n, length, d)).astype(np.float32)
    layers[2, :, :, 0] += 3.0 * (2 * labels[:, None] - 1)
    tokens = np.ones((n, length), np.int32)
    head, losses = elmo.train_mix_classifier(layers, tokens, labels, 2, steps=150,
                                             batch_size=64, learning_rate=0.05)
    weights = np.asarray(elmo.mix_weights(head)["weights"])
    assert weights.argmax() == 2 and weights[2] > 0.5, weights
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10])
    assert elmo.mix_accuracy(head, layers, tokens, labels, 2) > 0.95
    with pytest.raises(UserError, match="one of each"):
        elmo.train_mix_classifier(layers, tokens, labels[:10], 2, steps=1)
