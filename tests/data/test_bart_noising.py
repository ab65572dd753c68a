"""BART's noising objectives (Lewis et al. 2020, Table 1): exact outputs on hand examples,
statistics within bounds on the bundled World English Bible, determinism from the seed."""
import math

import numpy as np
import pytest

from t2t.data import bart_noising as B
from t2t.data import preprocessors as P
from t2t.errors import ConfigError

from tests.data.helpers import verses

MASK = 99
END = 7                                     # the "full stop" of the hand examples


@pytest.fixture(scope="module")
def bible():
    """The bundled WEB's first 5,000 verses in 511-token documents (as the 512-token
    objective configs cut them, EOS after), their vocabulary and its sentence-end ids."""
    from t2t.data.catalog.bible import bible_sentencepiece
    vocab = bible_sentencepiece()
    ids = np.concatenate(vocab.encode_batch(verses(5000)))
    documents = [d for d in P.split_tokens(ids, 511) if len(d) == 511]
    return vocab, documents, B.sentence_end_ids(vocab)


def _is_subsequence(small, big):
    it = iter(big)
    return all(any(x == y for y in it) for x in small)


# ----------------------------------------------------------------------------- hand cases


def test_the_budget_is_the_ceiling_of_thirty_percent():
    assert [B.num_to_mask(n) for n in (0, 1, 3, 10, 20, 63, 511)] == [0, 1, 1, 3, 6, 19, 154]
    assert B.num_to_mask(10, 0.25) == 3 and B.num_to_mask(4, 1.0) == 4
    with pytest.raises(ConfigError, match=r"mask_ratio 1.5 is not a fraction"):
        B.num_to_mask(10, 1.5)


def test_infill_spans_puts_one_mask_per_span_and_inserts_for_empty_ones():
    tokens = np.arange(10, 20)
    # spans: [10 11], an empty one before 14, [17 18 19]
    assert B.infill_spans(tokens, [0, 4, 7], [2, 0, 3], mask_id=MASK).tolist() == \
        [MASK, 12, 13, MASK, 14, 15, 16, MASK]
    # touching spans keep a mask each; an empty span at the end appends one
    assert B.infill_spans(tokens, [2, 4, 10], [2, 1, 0], mask_id=MASK).tolist() == \
        [10, 11, MASK, MASK, 15, 16, 17, 18, 19, MASK]
    # an empty span before a masked one: two masks, the insertion first
    assert B.infill_spans(tokens, [3, 3], [0, 2], mask_id=MASK).tolist() == \
        [10, 11, 12, MASK, MASK, 15, 16, 17, 18, 19]
    assert B.infill_spans(tokens, [], [], mask_id=MASK).tolist() == tokens.tolist()
    # whole words: [10 11] [12] [13 14 15] [16 17]; words 1-2 masked, an empty span at word 0
    words = [1, 0, 1, 1, 0, 0, 1, 0]
    assert B.infill_spans(np.arange(10, 18), [0, 1], [0, 2], mask_id=MASK,
                          word_starts=words).tolist() == [MASK, 10, 11, MASK, 16, 17]


def test_poisson_lengths_are_the_draws_cut_to_the_budget():
    for seed, budget in [(0, 19), (1, 1), (2, 154), (3, 5)]:
        lengths = B.poisson_span_lengths(np.random.default_rng(seed), budget)
        draws = np.random.default_rng(seed).poisson(3.0, size=4 * budget + 40)
        k = len(lengths)
        assert lengths[:-1].tolist() == draws[:k - 1].tolist()      # untouched draws
        assert draws[:k - 1].sum() < budget <= draws[:k].sum()     # the first to reach it
        assert lengths.sum() == budget and lengths[-1] >= 1
    assert B.poisson_span_lengths(np.random.default_rng(0), 0).tolist() == []
    with pytest.raises(ConfigError, match="poisson_lambda 0 must be positive"):
        B.poisson_span_lengths(np.random.default_rng(0), 3, 0)


def test_spans_never_overlap_and_mask_exactly_the_budget():
    for seed in range(200):
        n = 1 + seed % 40
        starts, lengths = B.sample_infilling_spans(n, np.random.default_rng(seed))
        assert lengths.sum() == B.num_to_mask(n) and (lengths >= 0).all()
        ends = starts + lengths
        assert (starts[1:] >= ends[:-1]).all() and ends[-1] <= n and starts[0] >= 0


def test_token_masking_and_deletion_choose_uniformly_without_replacement():
    tokens = np.arange(10, 30)
    chosen = np.random.default_rng(4).choice(20, size=6, replace=False)
    masked = B.token_masking(tokens, seed=4, mask_id=MASK)
    expected = tokens.copy()
    expected[chosen] = MASK
    assert masked["inputs"].tolist() == expected.tolist() + [1]
    assert masked["targets"].tolist() == tokens.tolist() + [1]
    deleted = B.token_deletion(tokens, seed=4, eos_id=None)
    assert deleted["inputs"].tolist() == np.delete(tokens, chosen).tolist()
    assert deleted["targets"].tolist() == tokens.tolist()


def test_sentences_end_after_a_run_of_full_stops():
    tokens = [5, 6, END, 8, END, END, 9, 10]
    assert B.sentence_bounds(tokens, [END]).tolist() == [0, 3, 6, 8]
    assert B.sentence_bounds([5, END], [END]).tolist() == [0, 2]
    assert B.sentence_bounds([5, 6], [END]).tolist() == [0, 2]
    assert [s.tolist() for s in B.split_sentences(tokens, [END])] == \
        [[5, 6, END], [8, END, END], [9, 10]]
    assert B.split_sentences([], [END]) == []
    order = np.random.default_rng(3).permutation(3)
    sentences = [[5, 6, END], [8, END, END], [9, 10]]
    out = B.sentence_permutation(tokens, seed=3, sentence_end_ids=[END], eos_id=None)
    assert out["inputs"].tolist() == [t for i in order for t in sentences[i]]
    assert B.sentence_permutation([5, 6], seed=3, sentence_end_ids=[END])["inputs"].tolist() \
        == [5, 6, 1]


def test_document_rotation_starts_at_the_chosen_token():
    tokens = np.arange(10, 20)
    for seed in range(5):
        start = int(np.random.default_rng(seed).integers(10))
        out = B.document_rotation(tokens, seed=seed)
        assert out["inputs"].tolist() == np.roll(tokens, -start).tolist() + [1]
        assert out["inputs"][0] == 10 + start
    assert B.document_rotation([], seed=0)["inputs"].tolist() == [1]


def test_infilling_permutation_shuffles_then_infills_with_one_generator():
    tokens = [5, 6, END, 8, 9, END, 11, 12, 13, END, 15]
    rng = np.random.default_rng(8)
    shuffled = B.permute_sentences(tokens, rng, sentence_end_ids=[END])
    starts, lengths = B.sample_infilling_spans(len(tokens), rng)
    expected = B.infill_spans(shuffled, starts, lengths, mask_id=MASK)
    out = B.text_infilling_sentence_permutation(tokens, seed=8, mask_id=MASK,
                                                sentence_end_ids=[END])
    assert out["inputs"].tolist() == expected.tolist() + [1]
    assert out["targets"].tolist() == tokens + [1]


def test_objectives_by_name_are_the_named_functions_and_bad_names_say_so():
    tokens = np.arange(10, 60)
    calls = {"bart_token_masking": lambda s: B.token_masking(tokens, seed=s, mask_id=MASK),
             "bart_token_deletion": lambda s: B.token_deletion(tokens, seed=s),
             "bart_text_infilling": lambda s: B.text_infilling(tokens, seed=s, mask_id=MASK),
             "bart_sentence_permutation": lambda s: B.sentence_permutation(
                 tokens, seed=s, sentence_end_ids=(14, 30)),
             "bart_document_rotation": lambda s: B.document_rotation(tokens, seed=s),
             "bart_infilling_permutation": lambda s: B.text_infilling_sentence_permutation(
                 tokens, seed=s, mask_id=MASK, sentence_end_ids=(14, 30))}
    assert set(calls) == set(B.OBJECTIVES)
    for name, call in calls.items():
        fn = B.objective(name, mask_id=MASK, sentence_end_ids=[14, 30])
        for seed in (0, (3, 1, 4)):
            a, b = fn(tokens, seed), call(seed)
            assert a.keys() == b.keys() == {"inputs", "targets"}
            assert all(np.array_equal(a[k], b[k]) for k in a), name
    with pytest.raises(ConfigError, match="unknown BART objective 'bart_infill'"):
        B.objective("bart_infill")
    with pytest.raises(ConfigError, match="bart_text_infilling replaces tokens with a mask"):
        B.objective("bart_text_infilling")
    with pytest.raises(ConfigError, match="bart_infilling_permutation splits sentences after "
                                          "full stops, but no sentence-end ids were given"):
        B.objective("bart_infilling_permutation", mask_id=MASK)


def test_the_seed_decides_everything():
    tokens = np.arange(10, 210) % 50 + 10                 # 200 tokens, full stops at 14, 30
    for name in B.OBJECTIVES:
        fn = B.objective(name, mask_id=MASK, sentence_end_ids=[14, 30])
        outs = [fn(tokens, (s, 0))["inputs"].tolist() for s in range(6)]
        assert outs[0] == fn(tokens, (0, 0))["inputs"].tolist()              # same seed
        assert len({tuple(o) for o in outs}) == 6, name                      # others differ


# ----------------------------------------------------------------------------- real text


def test_text_infilling_statistics_on_the_bible(bible):
    """30% of the tokens masked exactly (ceil), one mask per span; span lengths Poisson(3):
    mean 3 (2.98 expected: the last span of each document is cut to the budget), 0-length
    spans e^-3 = 4.98% of them; masks spread evenly over the document."""
    vocab, documents, _ = bible
    mask = vocab.sentinel_id(0)
    lengths, thirds = [], np.zeros(3)
    for i, doc in enumerate(documents):
        out = B.text_infilling(doc, seed=(i, 7), mask_id=mask, eos_id=vocab.eos_id)
        inputs = out["inputs"][:-1]
        assert out["targets"].tolist() == doc.tolist() + [vocab.eos_id]
        starts, span_lengths = B.sample_infilling_spans(len(doc), P.make_rng((i, 7)))
        kept = inputs[inputs != mask]
        assert len(doc) - len(kept) == B.num_to_mask(len(doc)) == 154            # 30%, ceil
        assert (inputs == mask).sum() == len(span_lengths)                       # one per span
        assert len(inputs) == len(doc) - 154 + len(span_lengths)
        assert _is_subsequence(kept.tolist(), doc.tolist())
        lengths += span_lengths.tolist()
        covered = np.zeros(len(doc), bool)
        covered[np.repeat(starts, span_lengths) + np.concatenate(
            [np.arange(n) for n in span_lengths])] = True
        assert np.array_equal(B.infill_spans(doc, starts, span_lengths, mask_id=mask), inputs)
        thirds += [c.mean() for c in np.array_split(covered, 3)]
    lengths = np.asarray(lengths)
    assert len(documents) > 200 and len(lengths) > 10_000
    assert 2.92 < lengths.mean() < 3.05, lengths.mean()
    assert 0.044 < (lengths == 0).mean() < 0.056, (lengths == 0).mean()         # e^-3
    assert np.all(np.abs(thirds / len(documents) - 0.30) < 0.02), thirds / len(documents)


def test_token_masking_and_deletion_on_the_bible(bible):
    vocab, documents, _ = bible
    mask = vocab.sentinel_id(0)
    where = np.zeros(511)
    for i, doc in enumerate(documents[:100]):
        inputs = B.token_masking(doc, seed=i, mask_id=mask)["inputs"][:-1]
        changed = inputs != doc
        assert changed.sum() == 154 and (inputs[changed] == mask).all()
        where += changed
        inputs = B.token_deletion(doc, seed=i)["inputs"][:-1]
        assert len(inputs) == 511 - 154 and _is_subsequence(inputs.tolist(), doc.tolist())
    assert abs(where[:255].mean() / 100 - 0.3) < 0.03 and abs(where[255:].mean() / 100 - 0.3) < 0.03


def _as_sentences(tokens, sentences, used=()):
    """The indices of `sentences`, each used once, whose concatenation is `tokens` (None
    if there are none): how a shuffled document is undone."""
    if len(tokens) == 0:
        return [] if len(used) == len(sentences) else None
    for i, sentence in enumerate(sentences):
        if i not in used and tokens[:len(sentence)] == sentence:
            rest = _as_sentences(tokens[len(sentence):], sentences, (*used, i))
            if rest is not None:
                return [i, *rest]
    return None


def test_permutation_and_rotation_undone_decode_to_the_original(bible):
    vocab, documents, ends = bible
    assert {vocab.decode([i]).strip() for i in ends} >= {".", "?", "!", ".”"}
    assert not {vocab.decode([i]).strip() for i in ends} & {",", ";", ":", ""}
    moved, starts = 0, []
    for i, doc in enumerate(documents[:80]):
        text = vocab.decode(doc)
        original = [s.tolist() for s in B.split_sentences(doc, ends)]
        assert len(original) > 5
        inputs = B.sentence_permutation(doc, seed=i, sentence_end_ids=ends)["inputs"][:-1]
        order = _as_sentences(inputs.tolist(), original)
        assert sorted(order) == list(range(len(original)))      # every sentence once, whole
        undone = [t for k in sorted(order) for t in original[k]]
        assert vocab.decode(undone) == text
        moved += order != sorted(order)
        rotated = B.document_rotation(doc, seed=i)["inputs"][:-1]
        start = next(k for k in range(511) if np.array_equal(np.roll(doc, -k), rotated))
        assert vocab.decode(np.roll(rotated, start)) == text
        starts.append(start)
    assert moved == 80
    assert 511 * 0.35 < np.mean(starts) < 511 * 0.65                 # uniform: mean 255


def test_bible_tasks_run_every_bart_objective():
    from t2t.data import tasks as T
    names = set(T.registered_tasks())
    for name in B.OBJECTIVES:
        assert f"bible_web_{name}" in names and f"bible_web_{name}_validation" in names
    task = T.get_task("bible_web_bart_infilling_permutation")
    record = task.source[0]
    examples = task.preprocess(record, (0, 0), {"inputs": 64, "targets": 64})
    tokens = task.vocabulary.encode(record["text"])
    assert [t for ex in examples for t in ex["targets"][:-1]] == tokens
    mask = task.vocabulary.sentinel_id(0)
    for ex in examples:
        n = len(ex["targets"]) - 1
        assert (ex["inputs"] != mask).sum() - 1 == n - math.ceil(0.3 * n - 1e-9)
