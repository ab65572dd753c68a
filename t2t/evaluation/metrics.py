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
             "rouge_score": "rouge-score"}


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
