"""XLNet against the paper's definitions (Yang et al. 2019 §2.3; Dai et al. 2019 §3.2-3.3):
the query stream never sees its own content, both streams' masks are the ones the sampled
factorization order implies, the identity order without memory is a causal LM, the memory
carries no gradient, and the relative-position shift picks distance mlen + i - j."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from t2t.data.permutation_lm import PermutationLmConverter, permutation_lm_example, windows
from t2t.models.xlnet import XLNet, XLNetOptions, XLNetPretrainingModel
from t2t.nn.config import TransformerConfig
from t2t.nn.relative_xl import relative_distances, shift_to_keys
from t2t.nn.two_stream import perm_mask_from_ranks, stream_visibility

V, L = 50, 8
CONFIG = TransformerConfig(vocab_size=V, d_model=32, num_heads=4, head_dim=8, d_ff=64,
                           num_encoder_layers=2, num_decoder_layers=0,
                           mlp_activations=("gelu",), norm_type="layer", norm_eps=1e-12,
                           pre_norm=False, use_bias=True, position_embedding="none",
                           kernel_init="normal", initializer_range=0.2, dropout_rate=0.0)


@pytest.fixture(scope="module")
def params():
    tokens = jnp.ones((1, L), jnp.int32)
    return jax.jit(XLNet(CONFIG).init)(jax.random.PRNGKey(0), tokens)["params"]


def _order(seed=0):
    rng = np.random.default_rng(seed)
    return rng.permutation(L)


@jax.jit
def _query_stream(params, tokens, ranks):
    """Query-stream states at every position [L, d] (target_mapping = identity)."""
    return XLNet(CONFIG).apply({"params": params}, tokens[None], None, None,
                               perm_mask_from_ranks(ranks[None]), jnp.eye(L)[None],
                               method=XLNet.encode)[0][0]


@jax.jit
def _content_stream(params, tokens, ranks):
    """Content-stream states [L, d] under the order of `ranks`."""
    return XLNet(CONFIG).apply({"params": params}, tokens[None],
                               perm_mask=perm_mask_from_ranks(ranks[None]),
                               method=XLNet.encode)[0][0]


def test_query_stream_never_sees_its_own_content(params):
    """g at position i is unchanged when x_i or any token after i in z changes, and changes
    with a token before i in z; the content stream h_i does change with x_i."""
    order = _order()
    ranks = np.argsort(order)
    tokens = np.random.default_rng(1).integers(0, V, L)
    g = np.asarray(_query_stream(params, tokens, ranks))   # numpy: no eager jnp ops below
    h = np.asarray(_content_stream(params, tokens, ranks))
    for t in range(1, L):       # z[0] has no context: its query row is empty (never a target)
        i = order[t]
        for j in range(L):
            changed = tokens.copy()
            changed[j] = (changed[j] + 1) % V
            moved = np.abs(np.asarray(_query_stream(params, changed, ranks))[i] - g[i]).max()
            if ranks[j] >= ranks[i]:                  # itself and everything after it in z
                assert moved == 0.0, (i, j)
            else:
                assert moved > 1e-4, (i, j)
        changed = tokens.copy()
        changed[i] = (changed[i] + 1) % V
        h2 = np.asarray(_content_stream(params, changed, ranks))
        assert np.abs(h2[i] - h[i]).max() > 1e-4


@pytest.mark.parametrize("memory", [0, 3])
def test_stream_masks_equal_the_sampled_order(memory):
    """The masks the model builds from the data side's ranks equal those read off z by hand:
    h_{z_t} sees z_1..z_t, g_{z_t} sees z_1..z_{t-1}, and both see all of the memory."""
    rng = np.random.default_rng(3)
    window = rng.integers(0, V, L)
    example = permutation_lm_example(np.zeros(max(memory, 1), np.int32), window, rng, k=4)
    order = np.argsort(example["factorization_ranks"])       # the sampled z
    content, query = stream_visibility(
        L, memory, perm_mask_from_ranks(jnp.asarray(example["factorization_ranks"])[None]))
    want_content = np.zeros((L, memory + L), bool)
    want_query = np.zeros((L, memory + L), bool)
    want_content[:, :memory] = want_query[:, :memory] = True
    for t, i in enumerate(order):
        want_query[i, memory + order[:t]] = True
        want_content[i, memory + order[:t + 1]] = True
    np.testing.assert_array_equal(np.asarray(content[0]), want_content)
    np.testing.assert_array_equal(np.asarray(query[0]), want_query)
    # Partial prediction: the targets are the last L/K of z.
    assert set(example["masked_positions"]) == set(order[-2:])


def test_identity_order_without_memory_is_a_causal_lm(params):
    """Order 1..L: the content stream equals Transformer-XL's causal ("uni") attention, and
    h_i is blind to every later token."""
    tokens = np.random.default_rng(2).integers(0, V, L)
    identity = np.arange(L)
    h = np.asarray(_content_stream(params, tokens, identity))
    uni = XLNet(CONFIG, XLNetOptions(attn_type="uni"))
    causal = jax.jit(lambda p, t: uni.apply({"params": p}, t[None], method=XLNet.encode)[0][0])(
        params, jnp.asarray(tokens))                 # jitted: one compile, not many eager ops
    np.testing.assert_allclose(h, causal, atol=1e-6)
    for j in range(1, L):
        changed = tokens.copy()
        changed[j] = (changed[j] + 1) % V
        h2 = np.asarray(_content_stream(params, changed, identity))
        np.testing.assert_array_equal(h2[:j], h[:j])
        assert np.abs(h2[j] - h[j]).max() > 1e-4


def test_shift_picks_the_distance_of_each_key():
    """Row r of the table holds distance k_len - r; key j from query i is at mlen + i - j."""
    q_len, mem = 3, 2
    k_len = q_len + mem
    distances = np.asarray(relative_distances(q_len, k_len))
    scores = jnp.broadcast_to(jnp.asarray(distances), (1, 1, q_len, len(distances)))
    got = np.asarray(shift_to_keys(scores, k_len))[0, 0]
    want = np.array([[mem + i - j for j in range(k_len)] for i in range(q_len)])
    np.testing.assert_array_equal(got, want)


def _batch(seed=0, length=16, memory=8, predictions=4):
    rng = np.random.default_rng(seed)
    stream = rng.integers(3, V, 5 * length)
    examples = [permutation_lm_example(m, w, rng, k=4)
                for m, w in windows(stream, length, memory)]
    converter = PermutationLmConverter({"inputs": length, "memory": memory,
                                        "max_predictions": predictions})
    return {k: jnp.asarray(v) for k, v in converter(examples).items()}


def test_memory_has_no_gradient_and_the_loss_falls():
    model = XLNetPretrainingModel(CONFIG)
    batch = _batch()
    params = jax.jit(model.init)(jax.random.PRNGKey(0), batch)   # one compile, not eager ops
    grads = jax.jit(jax.grad(lambda p: sum(jnp.sum(m) for m in model.memory(p, batch))))(params)
    assert all(float(np.abs(np.asarray(g)).max()) == 0.0 for g in jax.tree.leaves(grads))
    loss, metrics = jax.jit(model.loss_fn)(params, batch)    # score sums what the loss means
    np.testing.assert_allclose(-jnp.sum(jax.jit(model.score)(params, batch)),
                               loss * metrics["num_tokens"], rtol=1e-5)

    opt = optax.adam(3e-3)
    state = opt.init(params)
    step = jax.jit(lambda p, s: _step(model, opt, p, s, batch))
    losses = []
    for _ in range(25):
        params, state, loss = step(params, state)
        losses.append(float(loss))
    assert abs(losses[0] - np.log(V)) < 1.5          # near uniform at initialisation
    assert losses[-1] < 0.5 * losses[0]


def _step(model, opt, params, state, batch):
    loss, grads = jax.value_and_grad(lambda p: model.loss_fn(p, batch)[0])(params)
    updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss


@pytest.mark.parametrize("size,shape,hf_count", [
    ("base", (12, 768, 12, 3072), 116_750_336),
    ("large", (24, 1024, 16, 4096), 360_300_800)])
def test_presets_have_the_published_shape_and_hf_parameter_count(size, shape, hf_count):
    """XLNet-Base/Large = BERT-Base/Large's L, H, A, FF (paper §3.1) with the 32k
    SentencePiece vocabulary; t2t's tree holds exactly XLNetLMHeadModel's parameters (the
    HF count, computed on the meta device: 116.8M / 360.3M; the "110M / 340M" often quoted
    for XLNet are BERT-Base/Large's, whose vocabulary is smaller)."""
    import torch
    import transformers

    from t2t.convert.hf_xlnet import xlnet_hf_config
    from t2t.models.families import count_params
    from t2t.run import configurables as configured
    from t2t.run import gin_utils

    gin_utils.parse([f"models/xlnet/{size}.gin"])
    config = configured.TransformerConfig()
    assert gin_utils.query_macro("MODEL_FAMILY") == "xlnet"
    assert (config.num_encoder_layers, config.d_model, config.num_heads, config.d_ff) == shape
    assert config.vocab_size == 32000
    with torch.device("meta"):
        hf = transformers.XLNetLMHeadModel(transformers.XLNetConfig(**xlnet_hf_config(config)))
    assert sum(p.numel() for p in hf.parameters()) == hf_count
    assert count_params("xlnet", config) == hf_count
