"""GPT-1 fine-tuning head and loss (Radford et al. 2018, eqs. 3 and 5) on the test GPT-1:
extract-state gather, the similarity sum, L3 = L2 + lambda L1 against hand computation,
and the special-token rows appended to a pretrained table."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.data.gpt_format import SpecialTokens, format_features
from t2t.models.gpt import DecoderOnlyModel
from t2t.models.gpt_format import GptFormatClassifier, extend_token_table, gather_extract
from t2t.nn.stacks import Decoder
from t2t.run import gin_utils
from t2t.run.configurables import TransformerConfig

V = 512


@pytest.fixture(scope="module")
def config():
    gin_utils.parse(["models/gpt1/test.gin"])
    return TransformerConfig().replace(vocab_size=V + 3, dropout_rate=0.0)


def _pairs(n=3, seed=0):
    rng = np.random.RandomState(seed)
    text = lambda: list(rng.randint(3, V, rng.randint(1, 8)))  # noqa: E731
    return [(text(), text(), i % 2) for i in range(n)]


def test_gather_extract():
    hidden = jnp.arange(3 * 5 * 4, dtype=jnp.float32).reshape(3, 5, 4)
    got = gather_extract(hidden, jnp.array([4, 0, 2]))
    np.testing.assert_array_equal(got, np.stack([hidden[0, 4], hidden[1, 0], hidden[2, 2]]))


def test_similarity_sums_both_orders_then_w_y(config):
    """eq. 3 with sec. 3.3's similarity: logits = W_y (h_m(a;b) + h_m(b;a)) + b."""
    batch = format_features("similarity", _pairs(), SpecialTokens.after(V), 16)
    model = GptFormatClassifier(config, 2, "sum")
    params = nn.unbox(model.init(jax.random.PRNGKey(0), batch))
    logits = model.apply(params, batch)["logits"]                              # [3, 2]
    rows = batch["decoder_input_tokens"].reshape(6, 16)
    hidden = Decoder(config).apply({"params": params["decoder"]}, rows,
                                   decoder_segment_ids=batch["decoder_segment_ids"].reshape(6, 16),
                                   return_hidden=True)                          # [6, 16, d]
    h = np.asarray(hidden)[np.arange(6), batch["extract_positions"].reshape(6)].reshape(3, 2, -1)
    dense = params["classifier"]["dense"]
    expected = (h[:, 0] + h[:, 1]) @ np.asarray(dense["kernel"]) + np.asarray(dense["bias"])
    np.testing.assert_allclose(logits, expected, atol=1e-5)


def test_loss_is_task_loss_plus_lambda_lm_loss(config):
    batch = format_features("entailment", _pairs(4, 1), SpecialTokens.after(V), 16)
    model = GptFormatClassifier(config, 2, "sum", lm_weight=0.5)
    params = nn.unbox(model.init(jax.random.PRNGKey(1), batch))
    out = model.apply(params, batch)
    loss, metrics = model.loss_fn(params, batch)
    # by hand: L1 over every real next token (the extract token included), L2 over examples
    lp = np.asarray(jax.nn.log_softmax(out["lm_logits"][:, 0]))                 # [4, 16, V+3]
    tokens, seg = batch["decoder_input_tokens"][:, 0], batch["decoder_segment_ids"][:, 0]
    nll = [-lp[i, t, tokens[i, t + 1]] for i in range(4) for t in range(15) if seg[i, t + 1]]
    l1 = np.mean(nll)
    l2 = -np.mean(np.asarray(jax.nn.log_softmax(out["logits"]))[np.arange(4), batch["label"]])
    assert float(metrics["lm_loss"]) == pytest.approx(l1, rel=1e-5)
    assert float(metrics["task_loss"]) == pytest.approx(l2, rel=1e-5)
    assert float(loss) == pytest.approx(l2 + 0.5 * l1, rel=1e-5)
    no_lm, _ = GptFormatClassifier(config, 2, "sum", lm_weight=0.0).loss_fn(params, batch)
    assert float(no_lm) == pytest.approx(l2, rel=1e-5)


def test_pretrained_table_grows_by_the_special_tokens(config):
    trunk_cfg = config.replace(vocab_size=V)
    batch = format_features("classification", [(a, None, y) for a, _, y in _pairs(2)],
                            SpecialTokens.after(V), 16)
    pre = nn.unbox(DecoderOnlyModel(trunk_cfg).init(
        jax.random.PRNGKey(2), {"decoder_input_tokens": np.zeros((2, 16), np.int32)}))
    grown = extend_token_table(pre, V + 3, jax.random.PRNGKey(3), 0.02)
    assert grown["token_embedder"]["embedding"].shape == (V + 3, config.d_model)
    model = GptFormatClassifier(config, 2, "sum", pretrained=pre)
    params, report = model.init_from_pretrained(jax.random.PRNGKey(4), batch, pre,
                                                return_report=True)
    table = np.asarray(nn.unbox(params)["decoder"]["token_embedder"]["embedding"])
    np.testing.assert_array_equal(table[:V], pre["token_embedder"]["embedding"])
    assert 0.005 < table[V:].std() < 0.05                     # N(0, 0.02) new rows
    assert {p.split("/")[0] for p in report.new} == {"classifier"}
    assert model.predict(nn.unbox(params), batch).shape == (2,)
