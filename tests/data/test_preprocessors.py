"""Objectives: exact outputs on hand examples and statistics over many seeds."""
import numpy as np
import pytest

from t2t.data import preprocessors as P

SENTINEL = 999  # <extra_id_0> of a pretend 1000-id vocabulary


def _restore(inputs, targets, sentinel=SENTINEL):
    """Rebuilds the original text from span-corruption inputs and targets (EOS stripped)."""
    inputs, targets = list(inputs[:-1]), list(targets[:-1])
    spans, current = {}, None
    for t in targets:
        if t > sentinel - 100:
            current = t
            spans[current] = []
        else:
            spans[current].append(t)
    return [x for t in inputs for x in (spans[t] if t > sentinel - 100 else [t])]


def test_span_corruption_lengths_match_t5():
    assert P.span_corruption_lengths(512) == (568, 114)
    assert P.span_corruption_lengths(128) == (141, 29)


def test_random_segmentation_partitions():
    rng = np.random.default_rng(0)
    for items, segments in [(10, 1), (10, 10), (57, 9), (2, 1)]:
        lengths = P._random_segmentation(items, segments, rng)
        assert len(lengths) == segments and lengths.sum() == items and lengths.min() >= 1


@pytest.mark.parametrize("length,noise,spans", [(30, 4, 1), (31, 5, 2), (100, 15, 5), (568, 85, 28),
                                                (1, 0, 1), (2, 1, 1)])
def test_random_spans_noise_mask_counts(length, noise, spans):
    # float32 round-half-even as tf.round: 30 * 0.15 -> 4, not 5.
    for seed in range(5):
        mask = P.random_spans_noise_mask(length, P.make_rng(seed), noise_density=0.15)
        assert mask.shape == (length,) and mask.sum() == noise
        if length >= 2:
            assert not mask[0] and mask[-1]  # starts with non-noise, ends with noise
            starts = np.flatnonzero(mask & ~np.concatenate([[False], mask[:-1]]))
            assert len(starts) == spans


def test_unique_sentinels_hand_example():
    tokens = np.arange(10, 20)
    mask = np.array([0, 0, 1, 1, 0, 0, 0, 1, 0, 1], bool)
    assert P.noise_span_to_unique_sentinel(tokens, mask, sentinel_id=99).tolist() == \
        [10, 11, 99, 14, 15, 16, 98, 18, 97]
    assert P.nonnoise_span_to_unique_sentinel(tokens, mask, sentinel_id=99).tolist() == \
        [99, 12, 13, 98, 17, 97, 19]
    assert P.noise_span_to_sentinel(tokens, mask, sentinel_id=5).tolist() == \
        [10, 11, 5, 14, 15, 16, 5, 18, 5]
    assert P.drop_noise_tokens(tokens, mask).tolist() == [10, 11, 14, 15, 16, 18]
    assert P.drop_nonnoise_tokens(tokens, mask).tolist() == [12, 13, 17, 19]


def test_span_corruption_round_trip_and_structure():
    tokens = np.arange(100, 300)
    for seed in range(20):
        out = P.span_corruption(tokens, seed=(7, seed), sentinel_id=SENTINEL, eos_id=1)
        inputs, targets = out["inputs"], out["targets"]
        assert inputs[-1] == 1 and targets[-1] == 1
        assert _restore(inputs, targets) == tokens.tolist()
        sentinels = [t for t in targets if t > SENTINEL - 100]
        assert sentinels == list(range(SENTINEL, SENTINEL - len(sentinels), -1))
        assert targets[0] == SENTINEL  # targets start with the first sentinel
        assert len(targets) - 1 - len(sentinels) == 30  # round(200 * 0.15) noise tokens
        assert len(sentinels) == 10  # round(30 / 3) spans
    a = P.span_corruption(tokens, seed=3, sentinel_id=SENTINEL)
    b = P.span_corruption(tokens, seed=3, sentinel_id=SENTINEL)
    c = P.span_corruption(tokens, seed=4, sentinel_id=SENTINEL)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["inputs"], c["inputs"])


def test_span_corruption_fits_t5_lengths():
    for seed in range(10):
        out = P.span_corruption(np.arange(3, 571), seed=seed, sentinel_id=SENTINEL)
        assert len(out["inputs"]) == 512 and len(out["targets"]) == 114


def test_objective_names_match_named_functions():
    tokens = np.arange(10, 60)
    fn = P.objective("span_3_15_u_u", sentinel_id=SENTINEL)
    a, b = fn(tokens, 5), P.span_corruption(tokens, seed=5, sentinel_id=SENTINEL)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    a = P.objective("iid_15_d_d")(tokens, 2)
    b = P.drop_corrupted_tokens(tokens, seed=2)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    out = P.objective("iid_15_r10s90_f", sentinel_id=SENTINEL, vocab_size=1000)(tokens, 1)
    assert np.array_equal(out["targets"][:-1], tokens)
    for bad in ("span_15_x", "iid_15_x_f", "iid_15_u_x"):
        with pytest.raises(ValueError, match="unknown objective"):
            P.objective(bad)


def test_iid_objectives_statistics():
    tokens = np.arange(10, 1010)
    fractions = [P.iid_noise_mask(1000, P.make_rng(s), noise_density=0.15).mean()
                 for s in range(20)]
    assert abs(np.mean(fractions) - 0.15) < 0.01
    out = P.drop_corrupted_tokens(tokens, seed=0)
    both = np.concatenate([out["inputs"][:-1], out["targets"][:-1]])
    assert sorted(both.tolist()) == tokens.tolist()
    assert 100 < len(out["targets"]) < 200
    out = P.mass_style_corruption(tokens, seed=0, mask_id=7)
    assert np.array_equal(out["targets"][:-1], tokens)
    changed = out["inputs"][:-1] != tokens
    assert np.all(out["inputs"][:-1][changed] == 7) and 100 < changed.sum() < 200
    out = P.iid_denoising(tokens, seed=1, sentinel_id=5000)
    kept = [t for t in np.concatenate([out["inputs"][:-1], out["targets"][:-1]]) if t < 4000]
    assert sorted(kept) == tokens.tolist()  # every token once, in inputs or targets


def test_bert_style_corruption_80_10_10():
    tokens = np.arange(10, 5010)
    out = P.bert_style_corruption(tokens, seed=0, vocab_size=6000, mask_id=5,
                                  special_ids=(0, 1, 2, 5))
    assert np.array_equal(out["targets"][:-1], tokens)
    inputs = out["inputs"][:-1]
    masked = (inputs == 5).sum()
    changed_random = ((inputs != tokens) & (inputs != 5)).sum()
    # 15% of 5000 = 750 noise tokens: 600 mask, 75 random (a few equal the original), 75 kept.
    assert 520 < masked < 680 and 40 < changed_random < 115
    assert not np.isin(inputs[(inputs != tokens) & (inputs != 5)], (0, 1, 2, 5)).any()


def test_deshuffle_prefix_lm_full_lm():
    tokens = np.arange(10, 40)
    out = P.deshuffle(tokens, seed=0)
    assert sorted(out["inputs"].tolist()) == sorted(out["targets"].tolist())
    assert not np.array_equal(out["inputs"], out["targets"])
    for seed in range(20):
        out = P.prefix_lm_split(tokens, seed)
        assert 1 <= len(out["inputs"]) - 1 <= 29
        assert np.array_equal(np.concatenate([out["inputs"][:-1], out["targets"][:-1]]), tokens)
    assert P.full_lm([4, 5], eos_id=1)["targets"].tolist() == [4, 5, 1]


def test_split_and_decode():
    assert [c.tolist() for c in P.split_tokens(range(7), 3)] == [[0, 1, 2], [3, 4, 5], [6]]
    assert P.decode_text(" héllo ".encode()) == "héllo"
    with pytest.raises(P.SkipExample, match="undecodable"):
        P.decode_text(b"\xff\xfe bad")
    with pytest.raises(P.SkipExample, match="empty"):
        P.decode_text("   ")


SPECIAL = (0, 101, 102, 103)  # pad, cls, sep, mask


def _bert_tokens(n=128):
    return np.concatenate([[101], np.arange(1000, 1000 + n - 3), [102], [0]]).astype(np.int32)


def test_mlm_mask_structure_and_80_10_10():
    tokens = _bert_tokens()
    counts = np.zeros(3)
    for seed in range(300):
        out = P.mlm_mask(tokens, seed, vocab_size=30000, mask_id=103, special_ids=SPECIAL,
                         max_predictions=20)
        n = int(out["masked_weights"].sum())
        assert n == 19  # round(0.15 * 125) non-special positions
        pos = out["masked_positions"][:n]
        assert np.all(np.diff(pos) > 0) and not np.isin(tokens[pos], SPECIAL).any()
        assert np.array_equal(out["masked_ids"][:n], tokens[pos])
        assert np.all(out["masked_positions"][n:] == 0) and np.all(out["masked_weights"][n:] == 0)
        unchanged = np.setdiff1d(np.arange(len(tokens)), pos)
        assert np.array_equal(out["inputs"][unchanged], tokens[unchanged])
        new = out["inputs"][pos]
        counts += [(new == 103).sum(), ((new != 103) & (new != tokens[pos])).sum(),
                   (new == tokens[pos]).sum()]
        assert not np.isin(new[new != 103], SPECIAL).any()
    fractions = counts / counts.sum()
    assert abs(fractions[0] - 0.8) < 0.02 and abs(fractions[1] - 0.1) < 0.015
    assert abs(fractions[2] - 0.1) < 0.015


def test_mlm_mask_cap_and_dynamic():
    tokens = _bert_tokens(512)
    out = P.mlm_mask(tokens, 0, 30000, 103, SPECIAL, max_predictions=20)
    assert out["masked_weights"].sum() == 20  # capped
    a = P.mlm_mask(tokens, (0, 0, 5), 30000, 103, SPECIAL)  # (seed, epoch, index)
    b = P.mlm_mask(tokens, (0, 1, 5), 30000, 103, SPECIAL)
    assert not np.array_equal(a["masked_positions"], b["masked_positions"])


def test_whole_word_masking():
    tokens = _bert_tokens(128)
    word_starts = np.zeros(len(tokens), bool)
    word_starts[::3] = True  # words of three sub-tokens
    for seed in range(50):
        out = P.mlm_mask(tokens, seed, 30000, 103, SPECIAL, max_predictions=40, whole_word=True,
                         word_starts=word_starts)
        pos = set(out["masked_positions"][out["masked_weights"] > 0].tolist())
        for start in range(1, len(tokens) - 2):
            group = [p for p in range(start - start % 3, start - start % 3 + 3)
                     if 0 < p < len(tokens) - 2]
            if start in pos:
                assert set(group) <= pos  # a word is masked whole
        assert len(pos) <= 19


def test_span_masking_lengths():
    lengths = P.span_lengths(np.random.default_rng(0), 20000)
    assert lengths.min() == 1 and lengths.max() == 10
    assert abs(lengths.mean() - 3.78) < 0.06  # truncated Geometric(0.2), SpanBERT's 3.8
    tokens = np.arange(1000, 3000)
    realised, same_decision = [], []
    for seed in range(20):
        out = P.mlm_mask(tokens, seed, 30000, 103, SPECIAL, mask_rate=0.15, max_predictions=300,
                         span=True)
        pos = out["masked_positions"][out["masked_weights"] > 0]
        assert len(pos) == 300
        breaks = np.flatnonzero(np.diff(pos) > 1)
        realised.extend(np.diff(np.concatenate([[0], breaks + 1, [len(pos)]])))
        # one replacement decision per span: neighbours in a run mostly agree on [MASK]
        for run in np.split(pos, breaks + 1):
            is_mask = out["inputs"][run] == 103
            same_decision.extend(is_mask[1:] == is_mask[:-1])
    # adjacent spans merge and budget/overlap cut a few: the mean stays near SpanBERT's.
    assert 3.3 < np.mean(realised) < 4.8
    assert np.mean(same_decision) > 0.85  # independent tokens would agree 0.8^2 + 0.2^2 = 68%


def _documents(num_docs=40, sentences=30, seed=0):
    rng = np.random.default_rng(seed)
    first = lambda d, s: 1_000_000 + d * 100_000 + s * 100  # noqa: E731 - token = doc, sentence, k
    return [[list(range(first(d, s), first(d, s) + int(rng.integers(5, 25))))
             for s in range(sentences)] for d in range(num_docs)]


def test_nsp_structure_and_balance():
    docs = _documents(num_docs=10, sentences=200)
    # short_seq_prob=0: a document drawn short (BERT draws once per document) yields only
    # one-sentence chunks, which are always random-next, and would swamp this small sample.
    instances = P.nsp_examples(docs, seed=0, max_length=64, cls_id=101, sep_id=102,
                               short_seq_prob=0.0)
    labels = np.array([x["next_sentence_label"] for x in instances])
    assert len(instances) > 500 and abs(labels.mean() - 0.5) < 0.05
    for x in instances:
        tokens, types = x["tokens"], x["token_type_ids"]
        assert len(tokens) <= 64 and tokens[0] == 101 and tokens[-1] == 102
        seps = np.flatnonzero(tokens == 102)
        assert len(seps) == 2
        assert np.all(types[:seps[0] + 1] == 0) and np.all(types[seps[0] + 1:] == 1)
        a, b = tokens[1:seps[0]], tokens[seps[0] + 1:-1]
        assert len(a) and len(b)
        doc_a, doc_b = set((a - 1_000_000) // 100_000), set((b - 1_000_000) // 100_000)
        assert len(doc_a) == 1
        if x["next_sentence_label"] == 0:
            assert doc_a == doc_b and b.min() > a.max()  # B continues A
        else:
            assert doc_a != doc_b
    # short_seq_prob=1 makes every target length random and short.
    short = P.nsp_examples(docs, 0, 64, 101, 102, short_seq_prob=1.0)
    mean_length = lambda xs: np.mean([len(x["tokens"]) for x in xs])  # noqa: E731
    assert mean_length(short) < mean_length(instances)


def test_truncate_seq_pair():
    a, b = list(range(10)), list(range(100, 104))
    P.truncate_seq_pair(a, b, 8, np.random.default_rng(0))
    assert len(a) + len(b) == 8 and len(b) == 4 and len(a) == 4
    assert a == list(range(a[0], a[0] + 4))  # trimmed from the ends only
