"""Vocabularies: one small interface over SentencePiece (T5), WordPiece (BERT), byte BPE (GPT-2).

Every vocabulary maps text to a list of int ids and back, knows its special ids and the
embedding size a model needs (`padded_vocab_size`, rounded up to a multiple of 128 as in T5).
All are picklable so grain worker processes can use them. Tokenization itself is done by
`sentencepiece` and Hugging Face `tokenizers`; this module only sets them up.
"""
from __future__ import annotations

import abc
import functools
import os
import pathlib
from pathlib import Path
from typing import Any, Iterable, Sequence

import sentencepiece as spm

from t2t.errors import InputFileError

PAD_MULTIPLE = 128


def round_up(n: int, multiple: int = PAD_MULTIPLE) -> int:
    """Smallest multiple of `multiple` that is >= n (T5 pads 32100 ids to 32128 rows)."""
    return -(-n // multiple) * multiple


class Vocabulary(abc.ABC):
    """What every vocabulary offers; special ids are None where the vocabulary has none."""

    pad_id: int | None
    eos_id: int | None
    unk_id: int | None

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int:
        """Number of real ids, extra ids included."""

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the model's embedding: `vocab_size` rounded up to a multiple of 128."""
        return round_up(self.vocab_size)

    @abc.abstractmethod
    def encode(self, text: str) -> list[int]:
        """Text to ids (no EOS or other specials added unless the subclass says so)."""

    @abc.abstractmethod
    def decode(self, ids: Iterable[int]) -> str:
        """Ids to text, skipping padding."""

    def encode_batch(self, texts: Iterable[str]) -> list[list[int]]:
        """`encode` over many texts."""
        return [self.encode(t) for t in texts]

    def decode_batch(self, batch: Iterable[Iterable[int]]) -> list[str]:
        """`decode` over many id sequences (rows of a 2-d array work too)."""
        return [self.decode(ids) for ids in batch]


def as_ints(ids: Iterable[int]) -> list[int]:
    """`ids` as a list of Python ints."""
    return [int(i) for i in ids]  # accepts numpy arrays and numpy scalars


def word_starts(word_ids: Sequence[int | None]) -> list[bool]:
    """Per token, whether it begins a word (its word index differs from the token before)."""
    return [k == 0 or word_ids[k] != word_ids[k - 1] for k in range(len(word_ids))]


WORD_PIECES_CHUNK = 4096   # texts per batched tokenizer call


def word_pieces(vocabulary: Any, texts: Sequence[str]) -> list[tuple[list[int], list[bool]]]:
    """Each text's sub-token ids (no specials) and, per id, whether it begins a word: the flat
    view of `tokenize_words` that whole-word masking and first-sub-token tagging read.
    Batched calls where the vocabulary has `tokenize_words_batch`, which run on the
    tokenizer's threads: the Bible's 35k verses, tokenised when BERT pretraining starts, in
    2.3 s instead of 4.8 on two cores (3.9 s of CPU instead of 4.8)."""
    batch = getattr(vocabulary, "tokenize_words_batch", None)
    if batch is not None:   # in chunks: a tokenizer's encodings weigh far more than their ids
        texts = list(texts)
        return [pieces for i in range(0, len(texts), WORD_PIECES_CHUNK)
                for pieces in batch(texts[i:i + WORD_PIECES_CHUNK])]
    pieces = []
    for text in texts:
        words = vocabulary.tokenize_words(text)
        pieces.append(([t for w in words for t in w],
                       [k == 0 for w in words for k in range(len(w))]))
    return pieces


# ----------------------------------------------------------------------------- SentencePiece

class SentencePieceVocabulary(Vocabulary):
    """A SentencePiece model with T5 conventions: pad 0, eos 1, unk 2, sentinels at the end.

    `extra_ids` sentinels `<extra_id_k>` are appended as user-defined pieces in reverse, so
    `<extra_id_0>` is `vocab_size - 1` and sentinel k is `vocab_size - 1 - k`; text
    containing `<extra_id_k>` encodes to that id and decodes back to the same string.
    """

    pad_id, eos_id, unk_id = 0, 1, 2

    def __init__(self, model_file: str | os.PathLike | bytes, extra_ids: int = 100):
        proto = model_file if isinstance(model_file, bytes) else Path(model_file).read_bytes()
        self.model_file = None if isinstance(model_file, bytes) else str(model_file)
        self._proto, self.extra_ids = proto, extra_ids
        try:
            self._sp = self._load(proto, extra_ids)
        except Exception as e:   # protobuf's DecodeError, sentencepiece's RuntimeError
            if self.model_file is None:
                raise
            raise InputFileError(f"{self.model_file} is not a SentencePiece model "
                                 f"({type(e).__name__}: {str(e).strip()[:80]}): give the "
                                 ".model file SentencePiece's trainer wrote") from None
        self._base_size = self._sp.get_piece_size() - extra_ids
        ids = (self._sp.pad_id(), self._sp.eos_id(), self._sp.unk_id())
        if ids != (self.pad_id, self.eos_id, self.unk_id):
            raise ValueError(f"model has pad/eos/unk ids {ids}; T5 conventions need (0, 1, 2)")

    @staticmethod
    def _load(proto: bytes, extra_ids: int) -> spm.SentencePieceProcessor:
        if extra_ids:
            from sentencepiece import sentencepiece_model_pb2 as pb  # needs protobuf

            model = pb.ModelProto.FromString(proto)
            for k in reversed(range(extra_ids)):
                model.pieces.add(piece=f"<extra_id_{k}>", score=0.0,
                                 type=pb.ModelProto.SentencePiece.USER_DEFINED)
            proto = model.SerializeToString()
        return spm.SentencePieceProcessor(model_proto=proto)

    def __getstate__(self) -> dict:
        return {"proto": self._proto, "extra_ids": self.extra_ids}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["proto"], state["extra_ids"])

    @property
    def model_proto(self) -> bytes:
        """The serialized SentencePiece model, without the extra ids."""
        return self._proto

    @property
    def vocab_size(self) -> int:
        return self._base_size + self.extra_ids

    def sentinel_id(self, k: int) -> int:
        """Id of `<extra_id_k>`."""
        if not 0 <= k < self.extra_ids:
            raise ValueError(f"sentinel {k} out of range for {self.extra_ids} extra ids")
        return self.vocab_size - 1 - k

    def is_sentinel(self, token_id: int) -> bool:
        return self._base_size <= token_id < self.vocab_size

    def id_to_piece(self, token_id: int) -> str:
        return self._sp.id_to_piece(int(token_id))

    def piece_to_id(self, piece: str) -> int:
        return self._sp.piece_to_id(piece)

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text, out_type=int)

    def encode_batch(self, texts: Iterable[str]) -> list[list[int]]:
        return self._sp.encode(list(texts), out_type=int)

    def decode(self, ids: Iterable[int], stop_at_eos: bool = True) -> str:
        """Ids to text: stops at the first EOS, drops padding, out-of-range ids become unk."""
        out = []
        for i in as_ints(ids):
            if i == self.eos_id and stop_at_eos:
                break
            if i != self.pad_id:
                out.append(i if 0 <= i < self.vocab_size else self.unk_id)
        return self._sp.decode(out)

    def tokenize(self, text: str) -> list[str]:
        """The pieces `encode` produces, as strings (for inspection)."""
        return self._sp.encode(text, out_type=str)

    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        model_prefix_or_path: str | os.PathLike,
        vocab_size: int,
        model_type: str = "unigram",
        extra_ids: int = 100,
        byte_fallback: bool = True,
        character_coverage: float = 0.9995,
        input_sentence_size: int = 1_000_000,
        max_sentence_length: int = 16384,
        seed: int = 0,
        num_threads: int = 1,
        **trainer_kwargs,
    ) -> "SentencePieceVocabulary":
        """Train a model on `texts` and save it as `<prefix>.model` (and `.vocab`).

        `vocab_size` counts SentencePiece pieces (pad, eos, unk and the 256 byte pieces
        included); the `extra_ids` sentinels come on top. Normalisation is the identity
        and whitespace is kept as is, so with byte fallback `decode(encode(s)) == s` for
        any UTF-8 string. Texts are fed line by line, long lines in chunks (the trainer
        skips sentences over `max_sentence_length` bytes). Training is deterministic for a
        given input order and `seed` (lines beyond `input_sentence_size` are sampled with
        that seed); more `num_threads` is faster but not guaranteed bit-identical.
        """
        prefix = str(model_prefix_or_path)
        if prefix.endswith(".model"):
            prefix = prefix[: -len(".model")]
        Path(prefix).parent.mkdir(parents=True, exist_ok=True)
        spm.set_random_generator_seed(seed)
        spm.SentencePieceTrainer.train(
            sentence_iterator=_training_lines(texts, max_sentence_length // 4),
            model_prefix=prefix,
            vocab_size=vocab_size,
            model_type=model_type,
            pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
            byte_fallback=byte_fallback,
            normalization_rule_name="identity",
            remove_extra_whitespaces=False,
            add_dummy_prefix=True,
            allow_whitespace_only_pieces=True,
            character_coverage=character_coverage,
            input_sentence_size=input_sentence_size,
            shuffle_input_sentence=True,
            max_sentence_length=max_sentence_length,
            num_threads=num_threads,
            minloglevel=2,
            **trainer_kwargs,
        )
        return cls(prefix + ".model", extra_ids=extra_ids)


def _training_lines(texts: Iterable[str], max_chars: int) -> Iterable[str]:
    for text in texts:
        for line in text.splitlines():
            for start in range(0, len(line), max_chars):
                chunk = line[start: start + max_chars]
                if chunk.strip():
                    yield chunk


# ----------------------------------------------------------------------------- WordPiece


class WordPieceVocabulary(Vocabulary):
    """BERT's WordPiece from a `vocab.txt`; ids equal Hugging Face `BertTokenizer`'s.

    `lowercase`, `strip_accents` and `chinese_chars` are BertTokenizer's `do_lower_case`,
    `strip_accents` (None: strip them iff lowercasing) and `tokenize_chinese_chars`.
    """

    def __init__(self, vocab_file: str | os.PathLike, lowercase: bool = True,
                 strip_accents: bool | None = None, chinese_chars: bool = True):
        from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

        self.vocab_file, self.lowercase = str(vocab_file), lowercase
        self.strip_accents, self.chinese_chars = strip_accents, chinese_chars
        try:
            tok = Tokenizer(models.WordPiece.from_file(self.vocab_file, unk_token="[UNK]",
                                                       max_input_chars_per_word=100))
        except Exception as e:   # tokenizers' own Exception: not UTF-8, unreadable
            raise InputFileError(f"{vocab_file} cannot be read as a WordPiece vocab.txt "
                                 f"({str(e).strip()[:80]}): one token per line, UTF-8 "
                                 "text") from None
        tok.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=chinese_chars, strip_accents=strip_accents,
            lowercase=lowercase)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece(prefix="##")
        self.cls_id, self.sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        self.pad_id, self.unk_id = tok.token_to_id("[PAD]"), tok.token_to_id("[UNK]")
        self.mask_id, self.eos_id = tok.token_to_id("[MASK]"), None
        if None in (self.cls_id, self.sep_id, self.pad_id, self.unk_id, self.mask_id):
            raise InputFileError(f"{vocab_file} lacks one of [CLS] [SEP] [PAD] [UNK] [MASK]: "
                                 "a BERT WordPiece vocab.txt has them (an empty or cut file?)")
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", self.cls_id), ("[SEP]", self.sep_id)])
        tok.add_special_tokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
        self._tok = tok
        self.special_ids = frozenset(
            (self.cls_id, self.sep_id, self.pad_id, self.unk_id, self.mask_id))

    @classmethod
    def train(cls, texts: Iterable[str], vocab_file: str | os.PathLike, vocab_size: int,
              lowercase: bool = True) -> "WordPieceVocabulary":
        """Train a BERT WordPiece vocabulary with `tokenizers`, write `vocab_file` (atomically,
        ids in order), and load it."""
        from tokenizers import BertWordPieceTokenizer

        tokenizer = BertWordPieceTokenizer(lowercase=lowercase)
        tokenizer.train_from_iterator(texts, vocab_size=vocab_size, show_progress=False)
        tokens = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
        path = pathlib.Path(vocab_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text("".join(token + "\n" for token, _ in tokens), encoding="utf-8")
        tmp.replace(path)
        return cls(path, lowercase=lowercase)

    def __getstate__(self) -> dict:
        return {"vocab_file": self.vocab_file, "lowercase": self.lowercase,
                "strip_accents": self.strip_accents, "chinese_chars": self.chinese_chars}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["vocab_file"], state["lowercase"],
                      state.get("strip_accents"), state.get("chinese_chars", True))

    @functools.cached_property
    def vocab_size(self) -> int:  # tokenizers counts its map on every call (~1 ms)
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """`[CLS] text [SEP]` ids (just the text's ids with add_special_tokens=False)."""
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts: Iterable[str],
                     add_special_tokens: bool = True) -> list[list[int]]:
        encs = self._tok.encode_batch(list(texts), add_special_tokens=add_special_tokens)
        return [e.ids for e in encs]

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """The text's ids (no specials) and each token's (start, end) character span in
        `text` (after normalisation is undone: spans index the string as given)."""
        enc = self._tok.encode(text, add_special_tokens=False)
        return enc.ids, [tuple(o) for o in enc.offsets]

    def encode_pair(self, a: str, b: str) -> tuple[list[int], list[int]]:
        """`[CLS] a [SEP] b [SEP]` ids and token_type_ids (0 for a's part, 1 for b's)."""
        enc = self._tok.encode(a, b)
        return enc.ids, enc.type_ids

    def tokenize(self, text: str) -> list[str]:
        """WordPiece tokens without specials, e.g. ["un", "##aff", "##able"]."""
        return self._tok.encode(text, add_special_tokens=False).tokens

    def tokenize_words(self, text: str) -> list[list[int]]:
        """Sub-token ids grouped by word (as BERT's pre-tokenizer splits words).

        For whole-word masking and first-sub-token tagging: `sum(result, [])` equals
        `encode(text, add_special_tokens=False)`.
        """
        enc = self._tok.encode(text, add_special_tokens=False)
        words: list[list[int]] = []
        last = None
        for token_id, word in zip(enc.ids, enc.word_ids):
            if word != last or not words:
                words.append([])
                last = word
            words[-1].append(token_id)
        return words

    def tokenize_words_batch(self, texts: Sequence[str]) -> list[tuple[list[int], list[bool]]]:
        """`word_pieces` for many texts in one call of the tokenizer (its threads, not a
        Python loop): each text's ids and whether each id begins a word."""
        encodings = self._tok.encode_batch(list(texts), add_special_tokens=False)
        return [(e.ids, word_starts(e.word_ids)) for e in encodings]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Ids to text; drops [PAD] always and [CLS]/[SEP]/[MASK] unless told to keep them."""
        ids = [i for i in as_ints(ids) if i != self.pad_id]
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(int(token_id))

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)


# ----------------------------------------------------------------------------- byte-level BPE


class GPT2BPEVocabulary(Vocabulary):
    """GPT-2's byte-level BPE from `vocab.json` and `merges.txt` ("Hello world" -> [15496, 995]).

    GPT-2 has no padding or unknown token: `eos_id` is `<|endoftext|>` (50256), `pad_id`
    reuses it (the usual convention; padding is masked by segment ids and loss weights) and
    `unk_id` is None. `decode` stops at the first `<|endoftext|>` unless told otherwise.
    """

    EOS = "<|endoftext|>"

    def __init__(self, vocab_json: str | os.PathLike, merges_txt: str | os.PathLike):
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

        self.vocab_json, self.merges_txt = str(vocab_json), str(merges_txt)
        tok = Tokenizer(models.BPE.from_file(self.vocab_json, self.merges_txt))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        self.eos_id = tok.token_to_id(self.EOS)
        if self.eos_id is None:
            raise ValueError(f"{vocab_json} has no {self.EOS} token")
        tok.add_special_tokens([self.EOS])
        self._tok = tok
        self.pad_id, self.unk_id = self.eos_id, None

    def __getstate__(self) -> dict:
        return {"vocab_json": self.vocab_json, "merges_txt": self.merges_txt}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["vocab_json"], state["merges_txt"])

    @functools.cached_property
    def vocab_size(self) -> int:  # tokenizers counts its map on every call (~1 ms)
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def encode_batch(self, texts: Iterable[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts))]

    def decode(self, ids: Iterable[int], stop_at_eos: bool = True) -> str:
        ids = as_ints(ids)
        if stop_at_eos and self.eos_id in ids:
            ids = ids[: ids.index(self.eos_id)]
        return self._tok.decode(ids, skip_special_tokens=False)

    def tokenize(self, text: str) -> list[str]:
        return self._tok.encode(text).tokens


def load_vocabulary(kind: str, *files: str | os.PathLike, **kwargs) -> Vocabulary:
    """Build a vocabulary by kind name: "sentencepiece", "wordpiece" or "gpt2_bpe"."""
    kinds = {"sentencepiece": SentencePieceVocabulary, "wordpiece": WordPieceVocabulary,
             "gpt2_bpe": GPT2BPEVocabulary}
    if kind not in kinds:
        raise ValueError(f"unknown vocabulary kind {kind!r}; choose from {sorted(kinds)}")
    return kinds[kind](*files, **kwargs)


__all__ = ["Vocabulary", "SentencePieceVocabulary", "WordPieceVocabulary", "GPT2BPEVocabulary",
           "load_vocabulary", "round_up", "word_pieces", "PAD_MULTIPLE"]
