"""Vocabularies trained on your own files, cached by content, and how well a vocabulary
covers a text.

`sentencepiece_for` (T5, GPT) and `wordpiece_for` (BERT) train on the texts of your files
once; the result is kept under ``$T2T_CACHE_DIR/vocab/`` (`t2t.platforms.cache_dir`)
named by a hash of the files' bytes and the settings (or, for a corpus read as a stream,
of its files' paths, sizes and modification times: `fingerprint_digest`), so the same
files give the same vocabulary without training again, and changed files a new one.
`coverage` measures the share of a text's tokens that are byte pieces (SentencePiece's byte
fallback) or [UNK] (WordPiece), and the characters responsible.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import logging
import os
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from t2t.data.vocab import SentencePieceVocabulary, WordPieceVocabulary

_log = logging.getLogger(__name__)
HIGH_BYTE_RATE = 0.01     # above this share of byte pieces / [UNK], warn


def files_digest(paths: Sequence[str], *settings: Any) -> str:
    """16 hex digits of sha256 over the files' bytes (in order) and ``settings``."""
    h = hashlib.sha256(repr(settings).encode())
    for path in paths:
        h.update(b"\0file\0")
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]


def fingerprint_digest(fingerprint: Sequence, *settings: Any) -> str:
    """16 hex digits of sha256 over a corpus's fingerprint (each file's path, size and
    mtime: `t2t.data.corpus.fingerprint`) and ``settings``; reads no file."""
    return hashlib.sha256(repr((list(map(tuple, fingerprint)), settings)).encode()
                          ).hexdigest()[:16]


def _vocab_dir() -> Path:
    from t2t.platforms import cache_dir
    return cache_dir() / "vocab"


_TOO_HIGH = re.compile(r"Vocabulary size (?:is )?too high \((\d+)\)\. Please set it to a value <= "
                       r"(\d+)")


def sentencepiece_for(paths: Sequence[str], texts: Callable[[], Iterable[str]],
                      vocab_size: int = 8000, extra_ids: int = 100, key: str | None = None
                      ) -> SentencePieceVocabulary:
    """A unigram SentencePiece (T5 ids, byte fallback, ``extra_ids`` sentinels) trained on
    ``texts()``, the texts of ``paths``; cached by their content (or by ``key``, e.g. a
    `fingerprint_digest`). A corpus too small for ``vocab_size`` pieces gets the most
    SentencePiece can make (logged)."""
    key = key or files_digest(paths, 'spm', vocab_size)
    path = _vocab_dir() / f"spm_{vocab_size}_{key}.model"
    if not path.exists():
        _log.info("training a %d-piece SentencePiece on %d file(s) -> %s", vocab_size,
                  len(paths), path)
        tmp = path.with_name(f"{path.stem}.tmp{os.getpid()}")
        try:
            SentencePieceVocabulary.train(texts(), tmp, vocab_size, extra_ids=extra_ids)
        except RuntimeError as e:
            m = _TOO_HIGH.search(str(e))
            if not m:
                raise
            _log.info("your text makes at most %s pieces: training %s", m.group(2), m.group(2))
            SentencePieceVocabulary.train(texts(), tmp, int(m.group(2)), extra_ids=extra_ids)
        Path(f"{tmp}.model").replace(path)
        Path(f"{tmp}.vocab").unlink(missing_ok=True)
    return SentencePieceVocabulary(str(path), extra_ids=extra_ids)


def wordpiece_for(paths: Sequence[str], texts: Callable[[], Iterable[str]],
                  vocab_size: int = 8000, lowercase: bool = True, key: str | None = None
                  ) -> WordPieceVocabulary:
    """An uncased (unless told) BERT WordPiece trained on ``texts()`` with ``tokenizers``;
    cached by the content of ``paths`` (or by ``key``)."""
    key = (key + ("" if lowercase else "_cased") if key
           else files_digest(paths, "wordpiece", vocab_size, lowercase))
    path = _vocab_dir() / f"wordpiece_{vocab_size}_{key}.txt"
    if path.exists():
        return WordPieceVocabulary(str(path), lowercase=lowercase)
    _log.info("training a %d-token WordPiece on %d file(s) -> %s", vocab_size, len(paths), path)
    return WordPieceVocabulary.train(texts(), path, vocab_size, lowercase=lowercase)


def load(path: str, extra_ids: int = 100) -> Any:
    """A vocabulary file: a SentencePiece ``.model``, else a WordPiece ``vocab.txt``."""
    if str(path).endswith(".model"):
        return SentencePieceVocabulary(str(path), extra_ids=extra_ids)
    return WordPieceVocabulary(str(path), lowercase=True)


def save(vocabulary: Any, model_dir: str) -> str:
    """Writes ``vocabulary`` into ``model_dir`` (``vocabulary.model`` or ``vocab.txt``),
    where fine-tuning from that directory finds it; returns the path."""
    from t2t import storage
    if isinstance(vocabulary, SentencePieceVocabulary):
        path = storage.path(model_dir) / SAVED_SENTENCEPIECE
        data = vocabulary.model_proto
    else:
        path = storage.path(model_dir) / SAVED_WORDPIECE
        data = Path(vocabulary.vocab_file).read_bytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return str(path)


SAVED_SENTENCEPIECE = "vocabulary.model"
SAVED_WORDPIECE = "vocab.txt"


def saved(model_dir: str | None) -> Any:
    """The vocabulary a pretraining saved in ``model_dir`` (`save`), or None."""
    if not model_dir:
        return None
    for name in (SAVED_SENTENCEPIECE, SAVED_WORDPIECE):
        if os.path.isfile(os.path.join(model_dir, name)):
            return load(os.path.join(model_dir, name))
    return None


# ----------------------------------------------------------------------------- coverage


@dataclasses.dataclass
class Coverage:
    """How a vocabulary tokenises a text: ``rate`` of byte pieces (or [UNK]) among its
    tokens, and the most frequent characters it has no piece for."""

    tokens: int
    fallback: int
    missing: list[str]
    kind: str                    # "byte pieces" | "[UNK]"

    @property
    def rate(self) -> float:
        return self.fallback / max(self.tokens, 1)

    @property
    def high(self) -> bool:
        return self.rate > HIGH_BYTE_RATE


def _is_fallback(vocabulary: Any) -> tuple[Callable[[int], bool], str]:
    if isinstance(vocabulary, SentencePieceVocabulary):
        return (lambda i: re.fullmatch(r"<0x[0-9A-F]{2}>", vocabulary.id_to_piece(i))
                is not None), "byte pieces"
    unk = getattr(vocabulary, "unk_id", None)
    return (lambda i: i == unk), "[UNK]"


def _encode(vocabulary: Any, text: str) -> list[int]:
    if isinstance(vocabulary, WordPieceVocabulary):
        return vocabulary.encode(text, add_special_tokens=False)
    return vocabulary.encode(text)


def coverage(vocabulary: Any, texts: Iterable[str], max_missing: int = 8) -> Coverage:
    """Byte-fallback (SentencePiece) or [UNK] (WordPiece) share of ``texts``' tokens."""
    is_fallback, kind = _is_fallback(vocabulary)
    texts = list(texts)
    tokens = fallback = 0
    for text in texts:
        ids = _encode(vocabulary, text)
        tokens += len(ids)
        fallback += sum(1 for i in ids if is_fallback(int(i)))
    missing = []
    if fallback:
        chars = collections.Counter(c for text in texts for c in text if c != " ")
        for char, _ in chars.most_common():
            if any(is_fallback(int(i)) for i in _encode(vocabulary, f"a{char}a")):
                missing.append(char if char.isprintable() else repr(char))
                if len(missing) == max_missing:
                    break
    return Coverage(tokens, fallback, missing, kind)
