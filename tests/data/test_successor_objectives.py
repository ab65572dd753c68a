"""ALBERT n-gram masking and SOP, RoBERTa FULL-SENTENCES rows, and the Bible tasks of
RoBERTa / SpanBERT / ALBERT, against the papers' definitions."""
import numpy as np
import pytest

from t2t.data import preprocessors as prep

MASK, CLS, SEP = 3, 1, 2


def test_ngram_lengths_follow_one_over_n():
    n = prep.ngram_lengths(np.random.default_rng(0), 40000)
    freq = np.bincount(n, minlength=4)[1:] / len(n)
    np.testing.assert_allclose(freq, [6 / 11, 3 / 11, 2 / 11], atol=0.01)


def _sentence_ids(words, first=10):
    """Words of 1-2 tokens with distinct ids; returns tokens and word starts."""
    tokens, starts, t = [], [], first
    for size in words:
        tokens += list(range(t, t + size))
        starts += [True] + [False] * (size - 1)
        t += size
    return np.array(tokens, np.int32), np.array(starts, bool)


def test_ngram_mask_whole_words_budget_and_per_gram_replacement():
    rng = np.random.default_rng(1)
    sizes = rng.integers(1, 3, 300)
    tokens, starts = _sentence_ids(sizes)
    tokens = np.concatenate([[CLS], tokens, [SEP]]).astype(np.int32)
    starts = np.concatenate([[True], starts, [True]])
    word_of = np.cumsum(starts) - 1
    outcomes = {"mask": 0, "keep": 0, "random": 0}
    for seed in range(200):
        out = prep.ngram_mask(tokens, seed, 1000, MASK, (CLS, SEP, 0, MASK), starts,
                              max_predictions=80)
        real = out["masked_weights"] > 0
        pos, ids = out["masked_positions"][real], out["masked_ids"][real]
        budget = min(80, round(0.15 * (len(tokens) - 2)))
        assert budget - 2 <= len(pos) <= budget                    # a 2-token word may not fit
        np.testing.assert_array_equal(ids, tokens[pos])
        assert CLS not in ids and SEP not in ids
        words = set(word_of[pos])
        for w in words:                                            # whole words only
            assert set(np.flatnonzero(word_of == w)) <= set(pos)
        # A run of masked words is one or more n-grams; each token is [MASK], kept or random.
        got = out["inputs"][pos]
        outcomes["mask"] += int(np.sum(got == MASK))
        outcomes["keep"] += int(np.sum(got == ids))
        outcomes["random"] += int(np.sum((got != MASK) & (got != ids)))
        untouched = np.setdiff1d(np.arange(len(tokens)), pos)
        np.testing.assert_array_equal(out["inputs"][untouched], tokens[untouched])
    total = sum(outcomes.values())
    assert abs(outcomes["mask"] / total - 0.8) < 0.03
    assert abs(outcomes["keep"] / total - 0.1) < 0.03


def test_choose_ngrams_lengths_without_budget_pressure():
    rng = np.random.default_rng(2)
    lengths = [len(g) for _ in range(300) for g in prep.choose_ngrams([1] * 400, 20, rng)]
    freq = np.bincount(lengths, minlength=4)[1:] / len(lengths)
    # Shrinking only when a gram would overlap one chosen before: close to 6/11, 3/11, 2/11.
    np.testing.assert_allclose(freq, [6 / 11, 3 / 11, 2 / 11], atol=0.04)


def test_sop_pairs_are_consecutive_and_swapped_half_the_time():
    document = [list(range(100 + 10 * s, 100 + 10 * s + 8)) for s in range(60)]
    labels = []
    for seed in range(40):
        for inst in prep.sop_instances(document, np.random.default_rng(seed), 64, CLS, SEP,
                                       short_seq_prob=0.0):
            toks, types = inst["tokens"], inst["token_type_ids"]
            assert toks[0] == CLS and toks[-1] == SEP and len(toks) <= 64
            a = toks[1:np.flatnonzero(toks == SEP)[0]]
            b = toks[types == 1][:-1]
            sentence = lambda t: (t - 100) // 10  # noqa: E731
            first, second = (a, b) if inst["next_sentence_label"] == 0 else (b, a)
            # Consecutive whole sentences (truncation may trim the outer ends only).
            assert sentence(second[0]) == sentence(first[-1]) + 1
            labels.append(int(inst["next_sentence_label"]))
    assert abs(np.mean(labels) - 0.5) < 0.06, np.mean(labels)


def _docs():
    tok = iter(range(10, 10_000))
    sizes = [[5, 7, 3], [4], [9, 30, 2], [6, 6]]
    return [[[(next(tok), True) for _ in range(n)] for n in doc] for doc in sizes]


def test_full_sentences_cross_documents_with_a_separator():
    rows = prep.full_sentences_rows(_docs(), 16, cross_documents=True, doc_separator=SEP)
    flat = [t for _, row in rows for t, _ in row]
    body = [t for t in flat if t != SEP]
    assert body == sorted(body) == list(range(10, 10 + len(body)))   # every token once, in order
    assert all(len(row) <= 16 for _, row in rows)
    # 15 | 4 SEP 9 | 16 (a cut 30-token sentence) | 14 + 2 | 6 + 6: the separator goes in
    # only with the next sentence that fits, so no row ends with it.
    assert [len(row) for _, row in rows] == [15, 14, 16, 16, 12]
    assert [t for t, _ in rows[1][1]][:6] == [25, 26, 27, 28, SEP, 29]
    assert [d for d, _ in rows] == [0, 1, 2, 2, 3]


def test_full_sentences_within_documents():
    rows = prep.full_sentences_rows(_docs(), 16, cross_documents=False, doc_separator=SEP)
    assert all(SEP not in [t for t, _ in row] for _, row in rows)
    assert [d for d, _ in rows] == [0, 1, 2, 2, 2, 3]
    assert [len(row) for _, row in rows] == [15, 4, 9, 16, 16, 12]


@pytest.mark.parametrize("name, nsp", [("bible_web_roberta", False), ("bible_web_spanbert", False),
                                       ("bible_web_albert", True)])
def test_bible_tasks(name, nsp):
    from t2t.data import tasks
    task = tasks.get_task(name)
    examples = task.preprocess(task.source[3], (0, 0, 3), {"inputs": 128, "max_predictions": 20})
    vocab = task.vocabulary
    assert examples and all(len(e["inputs"]) <= 128 for e in examples)
    again = task.preprocess(task.source[3], (0, 1, 3), {"inputs": 128, "max_predictions": 20})
    # Dynamic masking: another epoch's seed masks other positions.
    assert any(not np.array_equal(a["masked_positions"], b["masked_positions"])
               for a, b in zip(examples, again))
    for e in examples:
        assert e["inputs"][0] == vocab.cls_id and ("next_sentence_label" in e) == nsp
        w = e["masked_weights"] > 0
        assert 0 < w.sum() <= 20
