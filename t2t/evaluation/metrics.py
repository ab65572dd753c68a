"""Task metrics over lists of targets and predictions, backed by scikit-learn, scipy,
sacrebleu and rouge-score (the `eval` extra: imported when a metric first needs them, so
training needs none of them). Each returns a dict of floats; scores that are customarily
percentages (as in T5's tables) are multiplied by 100.
"""
from __future__ import annotations

import collections
import importlib
import math
import re
import string
from typing import Dict, Sequence, Union

import numpy as np

from t2t.errors import UserError

Scores = Dict[str, float]
_PACKAGES = {"sklearn": "scikit-learn", "scipy": "scipy", "sacrebleu": "sacrebleu",
             "rouge_score": "rouge-score", "seqeval": "seqeval"}


def backend(module: str):
    """An optional metric library (`module`, e.g. "sklearn.metrics"), or one line saying
    how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        top = module.split(".")[0]
        raise UserError(f"this metric needs {_PACKAGES.get(top, top)}, which is not "
                        f"installed: pip install 't2t[eval]'") from None


def accuracy(targets: Sequence, predictions: Sequence) -> Scores:
    """Exact-match accuracy of labels (or strings), in percent."""
    right = backend("sklearn.metrics").accuracy_score(list(targets), list(predictions))
    return {"accuracy": 100.0 * right}


def f1(targets: Sequence, predictions: Sequence, *, average: str = "binary",
       pos_label=1) -> Scores:
    """F1 in percent: "binary" (of `pos_label`; MRPC, QQP) -> {"f1"}, or "macro" (mean of
    per-class F1s; e.g. CB) -> {"f1_macro"}."""
    if average not in ("binary", "macro"):
        raise ValueError(f"average must be 'binary' or 'macro', got {average!r}")
    score = backend("sklearn.metrics").f1_score(
        list(targets), list(predictions), average=average,
        pos_label=pos_label if average == "binary" else 1, zero_division=0)
    return {"f1" if average == "binary" else "f1_macro": 100.0 * float(score)}


def matthews_corrcoef(targets: Sequence, predictions: Sequence) -> Scores:
    """Matthews correlation (CoLA), x100."""
    mcc = backend("sklearn.metrics").matthews_corrcoef(list(targets), list(predictions))
    return {"matthews_corrcoef": 100.0 * float(mcc)}


def pearson(targets: Sequence[float], predictions: Sequence[float]) -> Scores:
    """Pearson correlation (STS-B), x100."""
    return {"pearson_corrcoef": 100.0 * float(backend("scipy.stats").pearsonr(
        np.asarray(targets, float), np.asarray(predictions, float))[0])}


def spearman(targets: Sequence[float], predictions: Sequence[float]) -> Scores:
    """Spearman rank correlation (STS-B), x100."""
    return {"spearman_corrcoef": 100.0 * float(backend("scipy.stats").spearmanr(
        np.asarray(targets, float), np.asarray(predictions, float))[0])}


# ------------------------------------------------------------------------ SQuAD
def normalize_squad_answer(text: str) -> str:
    """SQuAD v1.1 normalization: lowercase, drop punctuation, drop articles (a, an, the),
    collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def _squad_f1(gold: str, prediction: str) -> float:
    pred_tokens = normalize_squad_answer(prediction).split()
    gold_tokens = normalize_squad_answer(gold).split()
    common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def squad(targets: Sequence[Union[str, Sequence[str]]], predictions: Sequence[str]) -> Scores:
    """SQuAD exact match and token F1 in percent, each the max over an example's gold
    answers (a string or a list of strings), averaged over examples."""
    if len(targets) != len(predictions):
        raise ValueError(f"{len(targets)} targets but {len(predictions)} predictions")
    em_total = f1_total = 0.0
    for golds, pred in zip(targets, predictions):
        golds = [golds] if isinstance(golds, str) else list(golds)
        em_total += max(float(normalize_squad_answer(g) == normalize_squad_answer(pred))
                        for g in golds)
        f1_total += max(_squad_f1(g, pred) for g in golds)
    n = max(len(predictions), 1)
    return {"em": 100.0 * em_total / n, "f1": 100.0 * f1_total / n}


# ------------------------------------------------------------------- SQuAD 2.0
def _squad_v2_f1(gold: str, prediction: str) -> float:
    """v2.0's token F1: where either side has no tokens (no answer), 1 if both have none."""
    pred_tokens = normalize_squad_answer(prediction).split()
    gold_tokens = normalize_squad_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    return _squad_f1(gold, prediction)


def squad_v2_raw(targets: Sequence[Sequence[str]], predictions: Sequence[str]
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per question of the official SQuAD 2.0 evaluation (evaluate-v2.0.py): exact [n] and
    F1 [n] in [0, 1], each the max over the gold answers whose normalised text is not empty
    (none: the one gold answer ""), and has_answer [n] bool (any gold answer given)."""
    if len(targets) != len(predictions):
        raise ValueError(f"{len(targets)} targets but {len(predictions)} predictions")
    exact, f1_, has_answer = [], [], []
    for golds, pred in zip(targets, predictions):
        golds = [golds] if isinstance(golds, str) else list(golds)
        has_answer.append(bool(golds))
        golds = [g for g in golds if normalize_squad_answer(g)] or [""]
        exact.append(max(float(normalize_squad_answer(g) == normalize_squad_answer(pred))
                         for g in golds))
        f1_.append(max(_squad_v2_f1(g, pred) for g in golds))
    return np.asarray(exact, float), np.asarray(f1_, float), np.asarray(has_answer, bool)


def find_best_thresh(predictions: Sequence[str], scores: np.ndarray, na_scores: Sequence[float],
                     has_answer: np.ndarray) -> tuple[float, float]:
    """The official script's ``find_best_thresh``: start from answering nothing (the share
    of unanswerable questions), then answer the questions in increasing order of their
    no-answer score, keeping the best total; returns (best score in percent, the no-answer
    score of the last question answered there, 0.0 if none). A question is then "no answer"
    when its no-answer score is above the threshold."""
    na_scores = np.asarray(na_scores, float)
    total = best = float(np.sum(~has_answer))
    thresh = 0.0
    for q in sorted(range(len(na_scores)), key=lambda q: na_scores[q]):   # stable, as sorted()
        if has_answer[q]:
            total += float(scores[q])
        elif predictions[q]:
            total -= 1.0
        if total > best:
            best, thresh = total, float(na_scores[q])
    return 100.0 * best / max(len(na_scores), 1), thresh


def squad_v2(targets: Sequence[Sequence[str]], predictions: Sequence[str],
             na_scores: Sequence[float] | None = None, na_threshold: float = 1.0) -> Scores:
    """The official SQuAD 2.0 metric (evaluate-v2.0.py). targets: each question's gold
    answers (an empty list: unanswerable); predictions: "" for no answer.

    exact / f1 (percent) over all questions and split into HasAns_* / NoAns_* (with their
    totals); an empty prediction against an unanswerable question scores 1. With
    ``na_scores`` (per question, higher = more likely unanswerable; BERT: null score minus
    best span score), questions scoring above ``na_threshold`` count as answered "no
    answer", and ``best_exact`` / ``best_f1`` with ``best_exact_thresh`` / ``best_f1_thresh``
    are the scores at the threshold `find_best_thresh` picks for each.
    """
    exact, f1_, has_answer = squad_v2_raw(targets, predictions)
    raw_exact, raw_f1 = exact, f1_
    if na_scores is not None:
        abstain = np.asarray(na_scores, float) > na_threshold
        exact = np.where(abstain, (~has_answer).astype(float), exact)
        f1_ = np.where(abstain, (~has_answer).astype(float), f1_)
    out: Scores = {"exact": 100.0 * float(np.mean(exact)) if len(exact) else 0.0,
                   "f1": 100.0 * float(np.mean(f1_)) if len(f1_) else 0.0,
                   "total": float(len(exact))}
    for name, rows in (("HasAns", has_answer), ("NoAns", ~has_answer)):
        if rows.any():
            out[f"{name}_exact"] = 100.0 * float(np.mean(exact[rows]))
            out[f"{name}_f1"] = 100.0 * float(np.mean(f1_[rows]))
            out[f"{name}_total"] = float(np.sum(rows))
    if na_scores is not None:
        for name, raw in (("exact", raw_exact), ("f1", raw_f1)):
            out[f"best_{name}"], out[f"best_{name}_thresh"] = find_best_thresh(
                predictions, raw, na_scores, has_answer)
    return out


# ------------------------------------------------------------------------- NER
def token_accuracy(targets: Sequence[Sequence[str]], predictions: Sequence[Sequence[str]]
                   ) -> Scores:
    """Share of tokens whose predicted tag is the gold one, in percent."""
    pairs = [(t, p) for ts, ps in zip(targets, predictions) for t, p in zip(ts, ps)]
    return {"accuracy": 100.0 * float(np.mean([t == p for t, p in pairs])) if pairs else 0.0}


ENTITY_MODES = ("default", "strict")


def entities(targets: Sequence[Sequence[str]], predictions: Sequence[Sequence[str]], *,
             mode: str = "default", scheme: str = "IOB2") -> Scores:
    """Entity-level precision, recall and F1 (micro, percent) of tag sequences, by seqeval.

    ``mode="default"`` is conlleval's reading (an I- tag after O or another type opens an
    entity; IOB1 and IOB2 alike); ``"strict"`` reads the tags with seqeval's ``scheme``
    class (IOB2, IOE2, IOBES, BILOU, ...), where an ill-formed chunk is no entity. An entity
    is right when its type and both ends match."""
    if mode not in ENTITY_MODES:
        raise ValueError(f"mode must be one of {ENTITY_MODES}, got {mode!r}")
    if len(targets) != len(predictions):
        raise ValueError(f"{len(targets)} target sequences but {len(predictions)} predicted")
    sk = backend("seqeval.metrics")
    kwargs = {}
    if mode == "strict":
        kwargs = {"mode": "strict", "scheme": getattr(backend("seqeval.scheme"), scheme)}
    y_true = [[str(t) for t in seq] for seq in targets]
    y_pred = [[str(t) for t in seq] for seq in predictions]
    return {name: 100.0 * float(fn(y_true, y_pred, zero_division=0, **kwargs))
            for name, fn in (("precision", sk.precision_score), ("recall", sk.recall_score),
                             ("f1", sk.f1_score))}


# ------------------------------------------------------------------ BLEU, ROUGE
def bleu(targets: Sequence[Union[str, Sequence[str]]], predictions: Sequence[str], *,
         tokenize: str = "intl") -> Scores:
    """Corpus BLEU (sacrebleu; T5 used tokenize="intl", exponential smoothing).

    targets: one reference per example, or a list of references per example (all
    examples with the same number)."""
    if targets and not isinstance(targets[0], str):
        references = [list(refs) for refs in zip(*targets)]   # [num_refs][examples]
    else:
        references = [list(targets)]
    result = backend("sacrebleu").corpus_bleu(
        list(predictions), references, smooth_method="exp", lowercase=False,
        tokenize=tokenize, use_effective_order=False)
    return {"bleu": float(result.score)}


def _split_sentences(text: str) -> str:
    """One sentence per line (what rougeLsum expects): break after . ! ? and a space."""
    return "\n".join(s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s)


def rouge(targets: Sequence[str], predictions: Sequence[str], *,
          use_stemmer: bool = True) -> Scores:
    """Mean ROUGE-1/2/L F-measure in percent, plus "rougeLsum" (summary-level LCS over
    sentences split onto lines, as seqio does for summarization)."""
    keys = ("rouge1", "rouge2", "rougeL", "rougeLsum")
    scorer = backend("rouge_score.rouge_scorer").RougeScorer(list(keys), use_stemmer=use_stemmer)
    totals = dict.fromkeys(keys, 0.0)
    for target, prediction in zip(targets, predictions):
        scores = scorer.score(_split_sentences(target), _split_sentences(prediction))
        for key in keys:
            totals[key] += scores[key].fmeasure
    n = max(len(predictions), 1)
    return {key: 100.0 * total / n for key, total in totals.items()}


def perplexity(log_likelihood: float, num_tokens: float) -> Scores:
    """From a summed (natural-log) log-likelihood over `num_tokens` tokens."""
    if num_tokens <= 0:
        raise ValueError(f"num_tokens must be positive, got {num_tokens}")
    nll = -float(log_likelihood) / float(num_tokens)
    return {"perplexity": math.exp(nll), "nll_per_token": nll}
