"""Decoding: cached strategies against full recomputation, filters, EOS, beam search, and a
tiny encoder-decoder trained to copy its input."""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from t2t.models import decoding
from t2t.models.gpt import DecoderOnlyModel
from t2t.models.t5 import EncoderDecoderModel

from tests.nn.helpers import GPT_TINY, T5_TINY

# Untied output layers: a random tied model mostly repeats its input token.
ENCDEC = T5_TINY.replace(tie_embeddings=False)
GPT = GPT_TINY.replace(tie_embeddings=False)
N = 7  # max_decode_length


@functools.lru_cache(maxsize=None)
def _jit_score(model):
    return jax.jit(model.score)


def _init(model, batch, seed=0):
    return nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(seed), batch))


def _first_eos(row, eos):
    hits = np.flatnonzero(np.asarray(row) == eos)
    return int(hits[0]) if len(hits) else None


def _greedy_reference(next_logits, batch_size, n, eos):
    """Greedy by full recomputation: next_logits(tokens so far [b, n], i) -> [b, V]."""
    out = np.zeros((batch_size, n), np.int32)
    done = np.zeros(batch_size, bool)
    for i in range(n):
        y = np.where(done, 0, np.argmax(np.asarray(next_logits(out, i)), -1))
        out[:, i] = y
        if eos is not None:
            done |= y == eos
    return out


# ---------------------------------------------------------------- encoder-decoder
@pytest.fixture(scope="module")
def encdec():
    model = EncoderDecoderModel(ENCDEC)
    rng = np.random.default_rng(0)
    enc = rng.integers(2, 64, (4, 9)).astype(np.int32)
    seg = (np.arange(9)[None] < np.array([[9], [6], [4], [8]])).astype(np.int32)
    batch = {"encoder_input_tokens": enc * seg, "encoder_segment_ids": seg,
             "decoder_input_tokens": np.zeros((4, N), np.int32)}
    params = _init(model, batch)
    full = jax.jit(lambda dec: model.apply(params, {**batch, "decoder_input_tokens": dec}))

    def next_logits(out, i):  # decoder inputs = outputs shifted right, start token 0
        dec = np.concatenate([np.zeros((out.shape[0], 1), np.int32), out[:, :-1]], 1)
        return full(dec)[:, i]

    free = decoding.decode(model, params, batch, max_decode_length=N, eos_id=None)
    # An EOS id that stops some rows early (row 0's third token) but maybe not others.
    eos = int(free[0, 2])
    return model, params, batch, next_logits, np.asarray(free), eos


def _encdec_logprob(model, params, batch, seqs, eos):
    """log p(seq | inputs) by full recomputation, up to and including the first EOS."""
    seqs = np.asarray(seqs)
    weights = np.ones(seqs.shape, np.float32)
    for r, row in enumerate(seqs):
        e = _first_eos(row, eos)
        if e is not None:
            weights[r, e + 1:] = 0
    dec = np.concatenate([np.zeros((seqs.shape[0], 1), np.int32), seqs[:, :-1]], 1)
    return np.asarray(_jit_score(model)(params, {**batch, "decoder_input_tokens": dec,
                                           "decoder_target_tokens": seqs,
                                           "decoder_loss_weights": weights}))


def test_encdec_cached_greedy_equals_full_recomputation(encdec):
    model, params, batch, next_logits, free, eos = encdec
    np.testing.assert_array_equal(free, _greedy_reference(next_logits, 4, N, None))
    assert len({tuple(r) for r in free}) > 1 and len(set(free[0])) > 2  # not degenerate
    tokens, aux = decoding.decode(model, params, batch, max_decode_length=N, eos_id=eos,
                                  return_aux=True)
    tokens = np.asarray(tokens)
    np.testing.assert_array_equal(tokens, _greedy_reference(next_logits, 4, N, eos))
    np.testing.assert_array_equal(np.asarray(model.predict(params, batch, eos_id=eos)), tokens)
    # After EOS every position is pad; the loop ran until the last row finished.
    ends = [_first_eos(r, eos) for r in tokens]
    assert ends[0] is not None and ends[0] <= 2
    for row, e in zip(tokens, ends):
        if e is not None:
            assert not row[e + 1:].any()
    expected_steps = N if None in ends else max(ends) + 1
    assert int(aux["steps"]) == expected_steps


def test_beam_size_1_equals_greedy(encdec):
    model, params, batch, _, _, eos = encdec
    greedy = decoding.decode(model, params, batch, max_decode_length=N, eos_id=eos)
    beam = decoding.decode(model, params, batch, max_decode_length=N, eos_id=eos,
                           strategy="beam", beam_size=1, alpha=0.0)
    np.testing.assert_array_equal(np.asarray(beam), np.asarray(greedy))


def test_beam_search_beats_greedy_and_scores_are_model_logprobs(encdec):
    model, params, batch, _, _, eos = encdec
    greedy = decoding.decode(model, params, batch, max_decode_length=N, eos_id=eos)
    best, aux = decoding.decode(model, params, batch, max_decode_length=N, eos_id=eos,
                                strategy="beam", beam_size=4, alpha=0.0, return_aux=True)
    lp_beam = _encdec_logprob(model, params, batch, best, eos)
    lp_greedy = _encdec_logprob(model, params, batch, greedy, eos)
    assert np.all(lp_beam >= lp_greedy - 1e-4), (lp_beam, lp_greedy)
    assert np.any(lp_beam > lp_greedy + 1e-3)  # beam search found something better
    # With alpha 0 a beam's score is its log-probability; beams come sorted, best first.
    scores = np.asarray(aux["scores"])
    for j in range(4):
        np.testing.assert_allclose(
            scores[:, j], _encdec_logprob(model, params, batch, aux["beams"][:, j], eos),
            rtol=1e-4, atol=1e-4)
    assert np.all(np.diff(scores, axis=1) <= 0)


def test_sampling_top_k_1_and_tiny_temperature_equal_greedy(encdec):
    model, params, batch, _, _, eos = encdec
    greedy = np.asarray(decoding.decode(model, params, batch, max_decode_length=N, eos_id=eos))
    for options in ({"top_k": 1}, {"temperature": 1e-4}):
        for seed in (0, 1):
            out = decoding.decode(model, params, batch, max_decode_length=N, eos_id=eos,
                                  strategy="sample", rng=jax.random.PRNGKey(seed), **options)
            np.testing.assert_array_equal(np.asarray(out), greedy, err_msg=str(options))


# ------------------------------------------------------------------- decoder-only
def _gpt_reference(model, params, prompt, lengths, n, prefix, eos=None):
    """Greedy by recomputing the whole row (prompt, then generated tokens) every step."""
    b = prompt.shape[0]
    width = prompt.shape[1] + n
    rows = np.zeros((b, width), np.int32)
    for r in range(b):
        rows[r, :lengths[r]] = prompt[r, :lengths[r]]
    feats = {}
    if prefix:
        feats["decoder_causal_attention"] = (np.arange(width)[None] < lengths[:, None]).astype(
            np.int32)
    full = jax.jit(lambda x: model.apply(params, {"decoder_input_tokens": x, **feats}))

    def next_logits(out, i):
        x = rows.copy()
        for r in range(b):
            x[r, lengths[r]:lengths[r] + i] = out[r, :i]
        return full(x)[np.arange(b), lengths + i - 1]
    return _greedy_reference(next_logits, b, n, eos)


def _gpt_batch(prefix: bool):
    rng = np.random.default_rng(1)
    lengths = np.array([5, 2, 7])
    tokens = rng.integers(2, 64, (3, 9)).astype(np.int32)   # junk after each prompt
    tokens[:, 0] = 0                                         # start token
    batch = {"decoder_input_tokens": tokens}
    if prefix:
        batch["decoder_causal_attention"] = (np.arange(9)[None] < lengths[:, None]).astype(np.int32)
    return batch, lengths


@pytest.mark.parametrize("cfg,prefix", [
    (GPT, False),
    (T5_TINY.replace(tie_embeddings=False, num_encoder_layers=0, scan_layers=True), True),
], ids=["causal_lm_learned", "prefix_lm_relative_scan"])
def test_decoder_only_prefill_equals_full_recomputation(cfg, prefix):
    model = DecoderOnlyModel(cfg)
    batch, lengths = _gpt_batch(prefix)
    params = _init(model, batch)
    out = model.predict(params, batch, max_decode_length=5, eos_id=None,
                        prompt_lengths=None if prefix else lengths)
    ref = _gpt_reference(model, params, batch["decoder_input_tokens"], lengths, 5, prefix)
    np.testing.assert_array_equal(np.asarray(out), ref)
    if prefix:  # the bidirectional prefix matters: a causal-only prompt decodes differently
        causal = _gpt_reference(model, params, batch["decoder_input_tokens"], lengths, 5, False)
        assert not np.array_equal(ref, causal)


def test_decoder_only_beam_scores_are_model_logprobs():
    """Cache tiling and parent gathering with left-padded prompts and scanned layers."""
    model = DecoderOnlyModel(T5_TINY.replace(tie_embeddings=False, num_encoder_layers=0,
                                             scan_layers=True))
    batch, lengths = _gpt_batch(prefix=True)
    params = _init(model, batch)
    alpha, n = 0.6, 5
    _, aux = decoding.decode(model, params, batch, max_decode_length=n, eos_id=7,
                             strategy="beam", beam_size=3, alpha=alpha, return_aux=True)
    width = 9 + n
    prefix = (np.arange(width)[None] < lengths[:, None]).astype(np.int32)
    for j in range(3):
        beam = np.asarray(aux["beams"][:, j])
        rows = np.zeros((3, width), np.int32)
        targets = np.zeros((3, width), np.int32)
        weights = np.zeros((3, width), np.float32)
        for r in range(3):
            L = lengths[r]
            end = _first_eos(beam[r], 7)
            k = n if end is None else end + 1
            rows[r, :L] = batch["decoder_input_tokens"][r, :L]
            rows[r, L:L + n] = beam[r]
            targets[r, L - 1:L - 1 + n] = beam[r]
            weights[r, L - 1:L - 1 + k] = 1
        logp = np.asarray(_jit_score(model)(params, {
            "decoder_input_tokens": rows, "decoder_causal_attention": prefix,
            "decoder_target_tokens": targets, "decoder_loss_weights": weights}))
        penalty = ((5.0 + weights.sum(1)) / 6.0) ** alpha
        np.testing.assert_allclose(np.asarray(aux["scores"][:, j]), logp / penalty,
                                   rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------- filters and loops
@pytest.mark.parametrize("traced", [False, True])
def test_top_p_keeps_smallest_set_with_mass_at_least_p(traced):
    probs = np.array([0.1, 0.5, 0.05, 0.2, 0.15])
    logits = jnp.log(jnp.asarray(probs))[None]
    top_p, top_k = decoding.top_p_filter, decoding.top_k_filter
    if traced:  # options passed as traced values take the sort-based paths
        top_p, top_k = jax.jit(top_p), jax.jit(top_k)
    kept = lambda out: set(np.flatnonzero(np.isfinite(np.asarray(out)[0])))  # noqa: E731
    assert kept(top_p(logits, 0.3)) == {1}              # 0.5 >= 0.3
    assert kept(top_p(logits, 0.6)) == {1, 3}           # 0.5 + 0.2
    assert kept(top_p(logits, 0.8)) == {1, 3, 4}        # 0.85
    assert kept(top_p(logits, 0.9)) == {1, 3, 4, 0}     # 0.95
    assert kept(top_p(logits, 0.99)) == {0, 1, 2, 3, 4}
    assert kept(top_p(logits, 1.0)) == {0, 1, 2, 3, 4}
    assert kept(top_k(logits, 2)) == {1, 3}
    assert kept(top_k(logits, 0)) == {0, 1, 2, 3, 4}
    np.testing.assert_allclose(np.asarray(top_k(logits, 2))[0, 1], logits[0, 1])


def _scripted_logits(script):
    """A fake model: row r at step i puts all mass on script[r][i]."""
    script = jnp.asarray(script)

    def logits_fn(tokens, cache, i):
        return jax.nn.one_hot(script[:, i], 16) * 50.0, cache + 1
    return logits_fn, jax.nn.one_hot(script[:, 0], 16) * 50.0


def test_eos_stops_rows_and_the_loop():
    # Row 0 emits EOS (1) at step 2, row 1 at step 4; max length 10.
    script = [[5, 6, 1, 7, 8, 9, 9, 9, 9, 9], [4, 4, 4, 4, 1, 3, 3, 3, 3, 3]]
    logits_fn, first = _scripted_logits(script)
    out = jax.jit(lambda c: decoding.greedy(logits_fn, first, c, max_decode_length=10))(
        jnp.int32(0))
    np.testing.assert_array_equal(out.tokens, [[5, 6, 1, 0, 0, 0, 0, 0, 0, 0],
                                               [4, 4, 4, 4, 1, 0, 0, 0, 0, 0]])
    assert int(out.steps) == 5   # stopped once both rows finished, not after 10
    sampled = jax.jit(functools.partial(decoding.sample, logits_fn, max_decode_length=10,
                                        top_p=0.9))(first, jnp.int32(0), jax.random.PRNGKey(0))
    np.testing.assert_array_equal(sampled.tokens, out.tokens)
    assert int(sampled.steps) == 5


def test_beam_search_stops_early_when_no_live_beam_can_win():
    # EOS is all but certain at step 1: live beams fall far behind the finished ones.
    def logits_fn(tokens, cache, i):
        logits = jnp.zeros((tokens.shape[0], 16)).at[:, 1].set(30.0)
        return logits, cache
    first = jnp.zeros((2, 16)).at[:, 3].set(5.0)
    search = jax.jit(functools.partial(   # one compile, not many eager ops
        decoding.beam_search, logits_fn, max_decode_length=10, cache_batch_axes={"step": 0},
        beam_size=2, alpha=0.6))
    out = search(first, {"step": jnp.zeros((2, 1))})
    assert int(out.steps) < 10
    np.testing.assert_array_equal(out.tokens, [[3, 1] + [0] * 8] * 2)
    assert np.all(np.asarray(out.beams)[:, :, 2:] == 0)


def test_sampling_respects_top_k_and_seed():
    probs = jnp.log(jnp.array([0.4, 0.3, 0.2, 0.1] + [1e-9] * 12))

    def logits_fn(tokens, cache, i):
        return jnp.broadcast_to(probs, (tokens.shape[0], 16)), cache
    first = jnp.broadcast_to(probs, (64, 16))
    run = jax.jit(lambda rng: decoding.sample(logits_fn, first, 0, rng, max_decode_length=8,
                                              eos_id=None, top_k=2).tokens)
    a, b = np.asarray(run(jax.random.PRNGKey(0))), np.asarray(run(jax.random.PRNGKey(1)))
    assert set(np.unique(a)) == {0, 1} and not np.array_equal(a, b)
    np.testing.assert_array_equal(a, np.asarray(run(jax.random.PRNGKey(0))))
    assert 0.45 < np.mean(a == 0) < 0.7   # 0.4 / (0.4 + 0.3) = 0.57


# ------------------------------------------------------------------- copy task
def _copy_batch(rng, n, length=6, vocab=16):
    lens = rng.integers(3, length + 1, n)
    seg = (np.arange(length)[None] < lens[:, None]).astype(np.int32)
    x = rng.integers(2, vocab, (n, length)).astype(np.int32) * seg
    targets = np.zeros((n, length + 1), np.int32)
    targets[:, :length] = x
    targets[np.arange(n), lens] = 1                                   # EOS
    dec_in = np.concatenate([np.zeros((n, 1), np.int32), targets[:, :-1]], 1)
    weights = (np.arange(length + 1)[None] <= lens[:, None]).astype(np.float32)
    return {"encoder_input_tokens": x, "encoder_segment_ids": seg,
            "decoder_input_tokens": dec_in, "decoder_target_tokens": targets,
            "decoder_loss_weights": weights}


@pytest.mark.slow    # 400 training steps (14 s); CI checks cached decoding against full passes
def test_tiny_encoder_decoder_learns_to_copy():
    cfg = T5_TINY.replace(vocab_size=16, d_ff=64, position_embedding="learned", max_length=16)
    model = EncoderDecoderModel(cfg)
    rng = np.random.default_rng(0)
    params = _init(model, _copy_batch(rng, 2))
    tx = optax.adam(3e-3)

    @jax.jit
    def train_step(params, opt_state, batch):
        (loss, _), grads = jax.value_and_grad(model.loss_fn, has_aux=True)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    opt_state = tx.init(params)
    for _ in range(400):
        params, opt_state, loss = train_step(params, opt_state, _copy_batch(rng, 64))
    assert float(loss) < 0.1
    held_out = _copy_batch(np.random.default_rng(123), 64)
    out = np.asarray(model.predict(params, held_out))
    np.testing.assert_array_equal(out, held_out["decoder_target_tokens"])


def test_beam_search_finish_in_beam_drops_eos_outside_the_beam():
    """Beam 2, alpha 0, EOS = 1. Step 0: p(3) .4, p(4) .35, p(EOS) .2 (rank 3 of the 4
    expansions); after that p(EOS) .35, p(5) .25. T5X's rule finishes [EOS] at step 0
    (log .2 = -1.61 beats log .4 + log .35 = -1.97 of [3, EOS]); fairseq's (and
    transformers') `finish_in_beam` drops it, finishes [3, EOS] and [4, EOS] at step 1 and
    stops: [3, 5] (-2.30) cannot beat [4, EOS] (-2.10)."""
    def log_probs(pairs):
        rest = (1.0 - sum(pairs.values())) / (16 - len(pairs))
        p = jnp.full((16,), rest)
        for token, prob in pairs.items():
            p = p.at[token].set(prob)
        return jnp.log(p)
    later = log_probs({1: 0.35, 5: 0.25})

    def logits_fn(tokens, cache, i):
        return jnp.broadcast_to(later, (tokens.shape[0], 16)), cache
    first = jnp.broadcast_to(log_probs({3: 0.4, 4: 0.35, 1: 0.2}), (1, 16))
    search = jax.jit(functools.partial(   # one compile per rule, not many eager ops
        decoding.beam_search, logits_fn, max_decode_length=6, cache_batch_axes={"step": 0},
        beam_size=2, alpha=0.0), static_argnames="finish_in_beam")
    run = lambda finish: search(  # noqa: E731
        first, {"step": jnp.zeros((1, 1))}, finish_in_beam=finish)
    t5x, fairseq = run(False), run(True)
    np.testing.assert_array_equal(t5x.tokens, [[1, 0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(fairseq.tokens, [[3, 1, 0, 0, 0, 0]])
    np.testing.assert_array_equal(fairseq.beams[0, 1], [4, 1, 0, 0, 0, 0])
    np.testing.assert_allclose(fairseq.scores[0], [np.log(.4 * .35), np.log(.35 * .35)],
                               rtol=1e-6)
    assert int(fairseq.steps) == 2
