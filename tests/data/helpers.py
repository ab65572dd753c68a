"""Shared by the data tests."""
import numpy as np

from t2t.data import bundled


def verses(n):
    """The first n World English Bible verses."""
    return [r["text"] for r in bundled.load("web")[:n]]


def squad_records(n, seed=0, words=12):
    """SQuAD-shaped records over bundled verses: a few verses of context, a question, and
    a word-aligned answer of 1-4 words at its `answer_start`."""
    rng = np.random.default_rng(seed)
    pool = verses(400)
    records = []
    for i in range(n):
        context = " ".join(pool[(i * 3 + k) % len(pool)] for k in range(int(rng.integers(1, 5))))
        spaces = [0] + [j + 1 for j, c in enumerate(context) if c == " "]
        first = int(rng.integers(0, len(spaces)))
        start = spaces[first]
        stop = len(context)
        for j in spaces[first + 1:first + 1 + int(rng.integers(1, 5))]:
            stop = j - 1
        answer = context[start:stop]
        question = " ".join(pool[(i * 7 + 1) % len(pool)].split()[:words])
        records.append({"question": question, "context": context,
                        "answers": {"text": [answer, answer.lower()],
                                    "answer_start": [start, start]}})
    return records
