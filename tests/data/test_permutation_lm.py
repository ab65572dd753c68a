"""XLNet's permutation-LM data against the paper (Yang et al. 2019 §2.2-2.3): uniform
factorization orders, the last n/K of each order as targets, windows with the window
before as memory, and the converter's batch."""
import numpy as np
import pytest

from t2t.data.permutation_lm import (PermutationLm, PermutationLmConverter, num_predictions,
                                     permutation_targets, ranks_of, windows)
from t2t.data.preprocessors import SkipExample


def test_ranks_invert_the_order():
    order = np.array([3, 0, 4, 1, 2])
    ranks = ranks_of(order)
    np.testing.assert_array_equal(ranks, [1, 3, 4, 0, 2])
    np.testing.assert_array_equal(np.argsort(ranks), order)


def test_partial_prediction_counts():
    assert num_predictions(512, 6) == 85          # the released code's num_predict for K = 6
    assert num_predictions(512, 7) == 73
    assert num_predictions(2, 6) == 1             # always one target and one token of context
    with pytest.raises(ValueError, match="K > 1"):
        num_predictions(10, 1)


def test_targets_are_the_end_of_a_uniform_order():
    n, k, trials = 12, 6, 3000
    rng = np.random.default_rng(0)
    first = np.zeros(n)
    target = np.zeros(n)
    for _ in range(trials):
        out = permutation_targets(np.arange(100, 100 + n), rng, k)
        ranks = out["factorization_ranks"]
        assert sorted(ranks) == list(range(n))
        np.testing.assert_array_equal(np.sort(out["masked_positions"]), out["masked_positions"])
        assert set(ranks[out["masked_positions"]]) == {n - 2, n - 1}     # the last n/K of z
        np.testing.assert_array_equal(out["masked_ids"], 100 + out["masked_positions"])
        first[np.argmin(ranks)] += 1
        target[out["masked_positions"]] += 1
    # Uniform orders: each position first with p = 1/n, a target with p = 2/n (4 sigma).
    for counts, p in ((first, 1 / n), (target, 2 / n)):
        sigma = np.sqrt(trials * p * (1 - p))
        assert np.all(np.abs(counts - trials * p) < 4 * sigma), counts


def test_windows_carry_the_tokens_before_them():
    pairs = windows(np.arange(23), length=8, memory_length=3)
    assert [(list(m), list(w)) for m, w in pairs] == [
        ([5, 6, 7], list(range(8, 16))), ([13, 14, 15], list(range(16, 23)))]
    assert windows(np.arange(17), 8, 8)[-1][1].tolist() == list(range(8, 16))  # 1 left: dropped
    with pytest.raises(ValueError, match="memory length"):
        windows(np.arange(20), 8, 9)


class _Words:
    """A stand-in vocabulary: one id per character of each word."""

    def tokenize_words(self, text):
        return [[ord(c) for c in word] for word in text.split()]


def test_preprocessor_and_converter():
    record = {"verses": ["In the beginning God created", "the heavens and the earth."]}
    lengths = {"inputs": 10, "memory": 4, "max_predictions": 3}
    examples = PermutationLm(k=4)(record, seed=7, vocabulary=_Words(),
                                  sequence_length=lengths)
    again = PermutationLm(k=4)(record, seed=7, vocabulary=_Words(), sequence_length=lengths)
    other = PermutationLm(k=4)(record, seed=8, vocabulary=_Words(), sequence_length=lengths)
    stream = [ord(c) for s in record["verses"] for c in s.replace(" ", "")]
    assert len(stream) == 46 and len(examples) == 4          # windows from 10, 20, 30, 40
    for e, e2 in zip(examples, again):
        np.testing.assert_array_equal(e["factorization_ranks"], e2["factorization_ranks"])
    assert any(not np.array_equal(e["factorization_ranks"], o["factorization_ranks"])
               for e, o in zip(examples, other))
    types = examples[0]["token_type_ids"]
    assert types[0] == 0 and types[-1] == 1 and np.all(np.diff(types) >= 0)  # A then B

    batch = PermutationLmConverter(lengths)(examples, num_rows=len(examples) + 1)
    assert batch["encoder_input_tokens"].shape == (len(examples) + 1, 10)
    assert batch["memory_tokens"].shape == (len(examples) + 1, 4)
    np.testing.assert_array_equal(batch["memory_tokens"][0], stream[6:10])
    ranks = batch["factorization_ranks"][3]        # the last window, 6 tokens, padded
    np.testing.assert_array_equal(batch["encoder_segment_ids"][3], [1] * 6 + [0] * 4)
    assert sorted(ranks[:6]) == list(range(6)) and ranks[6:].min() > 5
    np.testing.assert_array_equal(batch["masked_weights"][-1], 0)   # the all-padding row
    assert batch["masked_weights"][0].sum() == 2                    # 10 / K=4 -> 2 targets
    with pytest.raises(SkipExample):
        PermutationLmConverter(dict(lengths, memory=5)).prepare(examples[0])


def test_the_bible_task_windows_each_book_with_its_memory():
    """bible_web_xlnet (objectives/xlnet_plm.gin): on the held-out twin, every window's
    memory is the 64 tokens before it in its book, and 1/6 of each window is predicted."""
    import t2t.data.catalog.bible_successors  # noqa: F401  registers the tasks
    from t2t.data import tasks as tasks_lib

    task = tasks_lib.get_task("bible_web_xlnet_validation")
    lengths = {"inputs": 128, "memory": 64, "max_predictions": 21}
    vocab = task.vocabulary
    windows_seen = 0
    for i in range(0, len(task.source), 7):
        record = task.source[i]
        stream = [t for v in record["verses"] for w in vocab.tokenize_words(v) for t in w]
        for j, ex in enumerate(task.preprocess(record, (0, i), lengths)):
            start = 128 * (j + 1)
            np.testing.assert_array_equal(ex["inputs"], stream[start:start + 128])
            np.testing.assert_array_equal(ex["memory_tokens"], stream[start - 64:start])
            assert len(ex["masked_positions"]) == max(1, round(len(ex["inputs"]) / 6))
            windows_seen += 1
    assert windows_seen > 20
