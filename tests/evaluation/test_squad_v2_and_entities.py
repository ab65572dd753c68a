"""The official SQuAD 2.0 metric (hand-computed cases; Hugging Face's port of
evaluate-v2.0.py, `transformers.data.metrics.squad_metrics`, as the reference) and seqeval's
entity-level scores on hand-made BIO sequences with known entity counts."""
import types

import numpy as np
import pytest

from t2t.evaluation import metrics


def test_squad_v2_hand_computed_cases():
    targets = [[], [], ["The Cat!", "a dog"], ["red fox"], ["the"]]
    predictions = ["", "something", "cat", "", "red fox"]
    scores = metrics.squad_v2(targets, predictions)
    # per question: exact 1 (empty vs none), 0 (answer vs none), 1 (normalised "cat"),
    # 0 (no answer vs an answer), F1 of "red fox" vs gold "the" -> "" (normalises to
    # nothing: the gold list becomes [""]) -> 0; has_answer: F, F, T, T, T
    assert scores["exact"] == pytest.approx(100 * 2 / 5)
    assert scores["f1"] == pytest.approx(100 * 2 / 5)
    assert scores["HasAns_total"] == 3 and scores["NoAns_total"] == 2
    assert scores["HasAns_exact"] == pytest.approx(100 / 3)
    assert scores["NoAns_exact"] == pytest.approx(50.0) and scores["NoAns_f1"] == 50.0
    assert "best_f1" not in scores

    partial = metrics.squad_v2([["the quick brown fox"]], ["quick fox jumps"])
    # gold tokens quick brown fox, predicted quick fox jumps: 2 common, P = R = 2/3
    assert partial["f1"] == pytest.approx(100 * 2 / 3) and partial["exact"] == 0.0


def test_find_best_thresh_by_hand():
    # no-answer scores; answering in increasing order: q0 (has answer, right: +1),
    # q1 (unanswerable, answered: -1), q2 (has answer, right: +1), q3 (unanswerable)
    predictions = ["a", "b", "c", "d"]
    raw = np.array([1.0, 0.0, 1.0, 0.0])
    has_answer = np.array([True, False, True, False])
    na = [-3.0, -1.0, 0.5, 2.0]
    # start 2 (abstain everywhere), then 3 at -3.0, 2 at -1.0, 3 at 0.5 (not above 3), 2
    assert metrics.find_best_thresh(predictions, raw, na, has_answer) == (75.0, -3.0)
    scores = metrics.squad_v2([["a"], [], ["c"], []], predictions, na_scores=na,
                              na_threshold=-3.0)
    assert scores["exact"] == scores["best_exact"] == 75.0
    assert scores["best_f1_thresh"] == -3.0


class _Example(types.SimpleNamespace):
    pass


def _reference(targets, predictions, na_scores, threshold):
    from transformers.data.metrics import squad_metrics   # the test command installs it
    examples = [_Example(qas_id=str(i), answers=[{"text": t} for t in golds])
                for i, golds in enumerate(targets)]
    preds = {str(i): p for i, p in enumerate(predictions)}
    na = {str(i): float(s) for i, s in enumerate(na_scores)}
    return squad_metrics.squad_evaluate(examples, preds, na, threshold)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_squad_v2_matches_the_official_logic(seed):
    """Random answerable / unanswerable questions, predictions drawn from the golds, near
    misses, punctuation and article variants and "", tied and untied no-answer scores."""
    rng = np.random.default_rng(seed)
    words = ["the", "red", "fox", "a", "jumps", "over", "lazy", "dog", "An", "cat."]
    phrase = lambda: " ".join(rng.choice(words, int(rng.integers(1, 5))))  # noqa: E731
    targets, predictions = [], []
    for _ in range(60):
        golds = [] if rng.random() < 0.4 else [phrase() for _ in range(int(rng.integers(1, 3)))]
        kind = rng.integers(0, 4)
        pred = ("" if kind == 0 else golds[0].upper() + "!" if kind == 1 and golds
                else phrase())
        targets.append(golds)
        predictions.append(pred)
    na_scores = np.round(rng.normal(size=60), 1)          # rounding makes ties
    for threshold in (1.0, 0.0, -0.5):
        ours = metrics.squad_v2(targets, predictions, na_scores=na_scores,
                                na_threshold=threshold)
        ref = _reference(targets, predictions, na_scores, threshold)
        assert set(ref) == set(ours)
        for key, value in ref.items():
            assert ours[key] == pytest.approx(value, abs=1e-9), key


# ------------------------------------------------------------------------- seqeval
GOLD = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "I-ORG", "I-ORG", "O"], ["O", "B-MISC"]]
PRED = [["B-PER", "I-PER", "O", "I-LOC"], ["B-ORG", "I-ORG", "O", "O"], ["O", "B-MISC"]]


def test_entities_default_mode_counts_like_conlleval():
    # gold: PER, LOC, ORG[0:3], MISC (4); predicted: PER, LOC (an I- after O opens an
    # entity), ORG[0:2], MISC (4); right: PER, LOC, MISC (3)
    scores = metrics.entities(GOLD, PRED)
    assert scores["precision"] == pytest.approx(75.0)
    assert scores["recall"] == pytest.approx(75.0)
    assert scores["f1"] == pytest.approx(75.0)


def test_entities_strict_iob2_drops_ill_formed_chunks():
    # strict IOB2: the lone I-LOC is no entity -> predicted PER, ORG[0:2], MISC (3),
    # right PER, MISC (2): P 2/3, R 2/4, F1 4/7
    scores = metrics.entities(GOLD, PRED, mode="strict")
    assert scores["precision"] == pytest.approx(200 / 3)
    assert scores["recall"] == pytest.approx(50.0)
    assert scores["f1"] == pytest.approx(400 / 7)


def test_entities_edge_cases_and_bad_mode():
    assert metrics.entities([["O", "O"]], [["B-PER", "O"]])["precision"] == 0.0
    assert metrics.entities([["B-X", "I-X"]], [["B-X", "I-X"]])["f1"] == 100.0
    # same type back to back: B-X B-X is two entities, B-X I-X one
    assert metrics.entities([["B-X", "B-X"]], [["B-X", "I-X"]])["recall"] == 0.0
    with pytest.raises(ValueError, match="mode must be one of"):
        metrics.entities(GOLD, PRED, mode="lenient")
    with pytest.raises(ValueError, match="3 target sequences but 1"):
        metrics.entities(GOLD, PRED[:1])
