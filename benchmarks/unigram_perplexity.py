"""The unigram baseline for BERT Table 6's held-out masked-LM perplexity at the tiny scale.

Counts the bible WordPiece (8k) tokens of the WEB training chapters and scores the held-out
chapters (`t2t.data.catalog.bible.BibleSplit`, the `bible_web_*_validation` tasks' text) with
add-one smoothing: the perplexity a model gets from token frequencies alone.

    python benchmarks/unigram_perplexity.py
"""
from __future__ import annotations

import collections
import math

VOCAB_SIZE = 8000   # the bible WordPiece of the tiny BERT scale (bible_wordpiece_path)


def main() -> None:
    from t2t.data.catalog import bible
    wordpiece = bible.bible_wordpiece(VOCAB_SIZE)

    def token_ids(split: str) -> list:
        return [t for rec in bible.BibleSplit("chapter", split)
                for t in wordpiece.encode(rec["text"])]

    train, held = token_ids("train"), token_ids("validation")
    counts, n = collections.Counter(train), len(train)
    nats = -sum(math.log((counts[t] + 1) / (n + VOCAB_SIZE)) for t in held) / len(held)
    print(f"train tokens {n:,}, held-out tokens {len(held):,}: unigram cross-entropy "
          f"{nats:.3f} nats, perplexity {math.exp(nats):.1f}")


if __name__ == "__main__":
    main()
