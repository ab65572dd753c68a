"""Metrics against values computed by hand (or published by the library)."""
import math

import pytest

from t2t.evaluation import metrics


def test_accuracy_and_f1():
    targets, preds = [1, 1, 1, 0, 0, 1], [1, 0, 1, 1, 0, 1]
    assert metrics.accuracy(targets, preds)["accuracy"] == pytest.approx(100 * 4 / 6)
    # TP 3, FP 1, FN 1 -> 2*3 / (2*3 + 1 + 1)
    assert metrics.f1(targets, preds)["f1"] == pytest.approx(75.0)
    # class 0: TP 1, FP 1, FN 1 -> 0.5; macro = (0.75 + 0.5) / 2
    assert metrics.f1(targets, preds, average="macro")["f1_macro"] == pytest.approx(62.5)
    assert metrics.accuracy(["a", "b"], ["a", "c"])["accuracy"] == pytest.approx(50.0)


def test_matthews_corrcoef_by_formula():
    # TP 3, TN 2, FP 1, FN 2
    targets = [1, 1, 1, 0, 0, 0, 1, 1]
    preds = [1, 1, 1, 0, 0, 1, 0, 0]
    tp, tn, fp, fn = 3, 2, 1, 2
    mcc = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    score = metrics.matthews_corrcoef(targets, preds)["matthews_corrcoef"]
    assert score == pytest.approx(100 * mcc)


def test_pearson_and_spearman():
    x, y = [1, 2, 3, 4, 5], [2, 4, 5, 4, 5]
    # deviations dx = [-2,-1,0,1,2], dy = [-2,0,1,0,1]: 6 / sqrt(10 * 6)
    assert metrics.pearson(x, y)["pearson_corrcoef"] == pytest.approx(100 * 6 / math.sqrt(60))
    # ranks of y with ties: [1, 2.5, 4.5, 2.5, 4.5]: 7 / sqrt(10 * 9)
    assert metrics.spearman(x, y)["spearman_corrcoef"] == pytest.approx(100 * 7 / math.sqrt(90))


def test_squad_normalization_em_f1():
    assert metrics.normalize_squad_answer("  The  Eiffel-Tower, an icon! ") == "eiffeltower icon"
    targets = [["eiffel tower"], ["Paris"], ["a banana", "apple"], "something"]
    preds = ["The Eiffel Tower!", "in Paris, France", "an apple", "nothing"]
    scores = metrics.squad(targets, preds)
    assert scores["em"] == pytest.approx(50.0)
    # F1s: 1, 2*(1/3)*1/(1/3+1) = 0.5, 1 (max over golds), 0
    assert scores["f1"] == pytest.approx(100 * 2.5 / 4)


def test_bleu():
    sents = ["the cat sat on the mat today", "a quick brown fox jumps over it"]
    assert metrics.bleu(sents, sents)["bleu"] == pytest.approx(100.0)
    # sacrebleu's README example: BLEU = 48.53 (13a tokenization, two references).
    refs1 = ["The dog bit the man.", "It was not unexpected.", "The man bit him first."]
    refs2 = ["The dog had bit the man.", "No one was surprised.", "The man had bitten the dog."]
    hyps = ["The dog bit the man.", "It wasn't surprising.", "The man had just bitten him."]
    targets = [list(r) for r in zip(refs1, refs2)]
    assert metrics.bleu(targets, hyps, tokenize="13a")["bleu"] == pytest.approx(48.53, abs=0.01)
    # The default is T5's "intl" tokenization (it splits "wasn't" differently from 13a).
    intl = metrics.bleu(targets, hyps)["bleu"]
    assert intl == metrics.bleu(targets, hyps, tokenize="intl")["bleu"]
    assert abs(intl - 48.53) > 1.0
    assert metrics.bleu(refs1, hyps)["bleu"] < 48.53


def test_rouge():
    scores = metrics.rouge(["the cat sat on the mat"], ["the cat on the mat"])
    # unigrams: 5 of 5 predicted, 5 of 6 target -> F = 10/11; LCS the same
    assert scores["rouge1"] == pytest.approx(100 * 10 / 11)
    assert scores["rougeL"] == pytest.approx(100 * 10 / 11)
    # bigrams: 3 shared of 4 predicted and 5 target -> 2*(3/4)*(3/5)/(3/4+3/5) = 2/3
    assert scores["rouge2"] == pytest.approx(100 * 2 / 3)
    # stemming: cats -> cat
    assert metrics.rouge(["the cats sat"], ["the cat sat"])["rouge1"] == pytest.approx(100.0)
    assert metrics.rouge(["the cats sat"], ["the cat sat"], use_stemmer=False)["rouge1"] == \
        pytest.approx(100 * 2 / 3)
    # swapped sentences: one LCS of 3 of 6 tokens, but each sentence matches fully
    swapped = metrics.rouge(["the cat sat. a dog ran."], ["a dog ran. the cat sat."])
    assert swapped["rougeL"] == pytest.approx(50.0)
    assert swapped["rougeLsum"] == pytest.approx(100.0)


def test_perplexity():
    scores = metrics.perplexity(-10 * math.log(4.0), 10)
    assert scores["perplexity"] == pytest.approx(4.0)
    assert scores["nll_per_token"] == pytest.approx(math.log(4.0))
    with pytest.raises(ValueError):
        metrics.perplexity(-1.0, 0)
