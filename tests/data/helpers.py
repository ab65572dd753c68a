"""Shared by the data tests."""
import json

import numpy as np

from t2t.data import bundled
from t2t.data.catalog import builders


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


# Tiny stand-ins for datasets `t2t data build` makes (bbc, spam, gettext_de): a test that plans
# or runs a task on them needs no built dataset on the machine.
BBC = {
    "train": [("business", "Shares rise", "Markets rose today."),
              ("sports", "Team wins", "The team won the cup.")],
    "validation": [("tech", "New phone", "A phone was launched.\nIt is fast."),
                   ("politics", "Vote held", "People voted."),
                   ("entertainment", "Film hit", "The film was a hit."),
                   ("sports", "Final lost", "They lost the final.")],
    "test": [("business", "Bank fails", "A bank failed.")],
}
SPAM = {
    "train": [("ham", "Re: lunch", "See you at noon."), ("spam", "WIN", "Click now!")],
    "validation": [("ham", "notes", "Minutes attached."), ("ham", "Re: bug", "Fixed it."),
                   ("ham", "hi", "How are you?"), ("spam", "Cheap pills", "Buy now.")],
    "test": [("spam", "Prize", "You won a prize!")],
}
GETTEXT = {"train": [("Save the file", "Datei speichern")],
           "validation": [("Remove all files in the directory",
                           "Alle Dateien im Verzeichnis entfernen"),
                          ("Could not open the input file", "Eingabedatei konnte nicht "
                           "geöffnet werden")],
           "test": [("Print the help text", "Hilfetext ausgeben")]}


def write_offline_datasets(root):
    """Write tiny bbc, spam and gettext_de under `root` in the builders' format (split files
    and a manifest), as `t2t data build` leaves them; point $T2T_DATA_DIR at `root` to use
    them. Returns `root`."""
    records = {
        "bbc": {s: [{"id": f"{c}/{i:03d}", "category": c, "headline": h, "text": t}
                    for i, (c, h, t) in enumerate(rows)] for s, rows in BBC.items()},
        "spam": {s: [{"id": f"g/{i}", "label": lab, "group": "g", "subject": sub, "text": t}
                     for i, (lab, sub, t) in enumerate(rows)] for s, rows in SPAM.items()},
        "gettext_de": {s: [{"en": en, "de": de, "domain": "tar"} for en, de in rows]
                       for s, rows in GETTEXT.items()},
    }
    for name, splits in records.items():
        out = root / name
        out.mkdir()
        counts = {s: builders.write_jsonl(rs, out / f"{s}.jsonl") for s, rs in splits.items()}
        (out / builders.MANIFEST).write_text(json.dumps({"name": name, "counts": counts}))
    return root
