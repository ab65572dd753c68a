"""RoBERTa's vocabulary: GPT-2's byte-level BPE with fairseq's special tokens
(Liu et al. 2019, §4.4: "a byte-level BPE vocabulary ... 50K subword units ... without any
additional preprocessing or tokenization of the input", the one of GPT-2, Radford et al.
2019, §2.2).

Ids: ``<s>`` 0 ([CLS]), ``<pad>`` 1, ``</s>`` 2 ([SEP] and end), ``<unk>`` 3 (never
produced: bytes cover every text), then GPT-2 id g as g + 4, and ``<mask>`` last (50,260,
in the slot of GPT-2's ``<|endoftext|>``, which plain text never produces): 50,261 ids. The
tokenization is GPT-2's, so roberta-base's tokens; the numbering is not roberta-base's.
Released RoBERTa numbers tokens through fairseq's ``dict.txt`` (GPT-2 ids reordered by
frequency, 50,265 rows), which no package this project can install ships; a model
pretrained here therefore reads its own ids, and cannot take roberta-base's embedding
rows. Everything RoBERTa's format depends on holds: ``<pad>`` = 1, so a converted model's
position ids (pad + 1 + index, `t2t.convert.pretrained.roberta_positions`) start at 2 as
`TransformerConfig.position_offset = 2` assumes.
"""
from __future__ import annotations

import itertools
import os
from typing import Iterable, Sequence

from t2t.data.vocab import GPT2BPEVocabulary, as_ints, word_starts

SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")
OFFSET = len(SPECIALS)


class RobertaBPEVocabulary(GPT2BPEVocabulary):
    """GPT-2's byte-level BPE (`vocab.json` + `merges.txt`) with RoBERTa's special ids.

    Offers what the BERT-family pretraining tasks use: `cls_id`, `sep_id`, `pad_id`,
    `mask_id`, `encode(_batch)(add_special_tokens=...)` and `tokenize_words`.
    """

    def __init__(self, vocab_json: str | os.PathLike, merges_txt: str | os.PathLike):
        super().__init__(vocab_json, merges_txt)
        self.mask_id = self.eos_id + OFFSET        # GPT-2's <|endoftext|> slot
        self.cls_id, self.pad_id, self.sep_id, self.unk_id = 0, 1, 2, 3
        self.eos_id = self.sep_id

    @property
    def vocab_size(self) -> int:
        return self.mask_id + 1

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """The text's ids (`<s> text </s>` with add_special_tokens)."""
        ids = [i + OFFSET for i in super().encode(text)]
        return [self.cls_id, *ids, self.sep_id] if add_special_tokens else ids

    def encode_batch(self, texts: Iterable[str],
                     add_special_tokens: bool = False) -> list[list[int]]:
        return [self.encode(t, add_special_tokens) for t in texts]

    def tokenize_words(self, text: str) -> list[list[int]]:
        """Ids grouped by word, for a sentence inside running text: encoded with the space
        that precedes it there (GPT-2's words carry their leading space, "Ġword"), so a
        verse's first word is the token it is in the book, not a sentence-initial one."""
        enc = self._tok.encode(" " + text.lstrip())
        return [[t + OFFSET for t, _ in group]
                for _, group in itertools.groupby(zip(enc.ids, enc.word_ids), lambda p: p[1])]

    def tokenize_words_batch(self, texts: Sequence[str]) -> list[tuple[list[int], list[bool]]]:
        """`vocab.word_pieces` in one call of the tokenizer, each text as `tokenize_words`
        encodes it (with its leading space)."""
        encodings = self._tok.encode_batch([" " + t.lstrip() for t in texts])
        return [([t + OFFSET for t in e.ids], word_starts(e.word_ids)) for e in encodings]

    def decode(self, ids: Iterable[int], stop_at_eos: bool = False) -> str:
        """Ids to text, special ids (and <mask>) dropped."""
        return super().decode([i - OFFSET for i in as_ints(ids)
                               if i >= OFFSET and i != self.mask_id], stop_at_eos=False)
