"""Word tokens and their characters for ELMo's biLM (Peters et al. 2018, Sec. 3.4).

The biLM reads each token as its UTF-8 bytes (the character CNN input of Jozefowicz et al.
2016, as the released bilm-tf does) and predicts tokens from a word vocabulary:

- `tokenize(text)`: words and single punctuation marks, case kept (ELMo is cased);
- `char_ids(word)`: [max_chars] ids, `<bow> bytes... <eow>` then padding, truncated to
  `max_chars - 2` bytes; every id is one more than bilm-tf's so that 0 means "no token";
- `WordVocabulary`: the softmax vocabulary (pad 0, `<S>` 1, `</S>` 2, `<UNK>` 3, then the
  words of a corpus by descending count);
- `sentence_features(...)`: a batch `{"token_ids" [b, l], "char_ids" [b, l, max_chars]}`
  with `<S>` and `</S>` around each sentence (what both LMs predict at the ends);
- `ElmoConverter`: the same features from a pipeline's examples (`text_example` makes one
  per sentence), one sentence per row; an out-of-vocabulary word is `<UNK>` for the
  softmax but keeps its characters.
"""
from __future__ import annotations

import collections
import re
from typing import Any, Dict, Iterable, List, Mapping, Sequence

import numpy as np

from t2t.data.converters import FeatureConverter
from t2t.data.preprocessors import SkipExample
from t2t.errors import UserError

MAX_CHARS = 50               # characters per token, as the original biLM
# bilm-tf's character ids (bytes are 0..255), each + 1 here so 0 pads.
BOS_CHAR, EOS_CHAR, BOW_CHAR, EOW_CHAR, PAD_CHAR = (c + 1 for c in range(256, 261))
NUM_CHAR_IDS = 262           # 0 (no token) .. PAD_CHAR
PAD, BOS, EOS, UNK = 0, 1, 2, 3
SPECIALS = ("<pad>", "<S>", "</S>", "<UNK>")

_TOKEN = re.compile(r"\w+(?:['’]\w+)*|[^\w\s]", re.UNICODE)


def tokenize(text: str) -> List[str]:
    """Words (with inner apostrophes) and single punctuation marks, case kept."""
    return _TOKEN.findall(text)


def char_ids(word: str, max_chars: int = MAX_CHARS) -> np.ndarray:
    """[max_chars] int32: BOW, the word's UTF-8 bytes (at most max_chars - 2), EOW, PAD...;
    `<S>` and `</S>` are BOW BOS_CHAR EOW and BOW EOS_CHAR EOW."""
    if max_chars < 3:
        raise UserError(f"max_chars must be at least 3 (BOW, a character, EOW), got {max_chars}")
    if word == SPECIALS[BOS]:
        body = [BOS_CHAR]
    elif word == SPECIALS[EOS]:
        body = [EOS_CHAR]
    else:
        body = [b + 1 for b in word.encode("utf-8")[: max_chars - 2]]
    ids = np.full((max_chars,), PAD_CHAR, np.int32)
    ids[: len(body) + 2] = [BOW_CHAR, *body, EOW_CHAR]
    return ids


class WordVocabulary:
    """The token softmax's vocabulary: specials, then words by descending count (ties by
    first appearance), at most `size` ids in all; other words are `<UNK>`."""

    def __init__(self, words: Sequence[str]):
        self.words = list(SPECIALS) + [w for w in words if w not in SPECIALS]
        self._ids = {w: i for i, w in enumerate(self.words)}

    @classmethod
    def from_texts(cls, texts: Iterable[str], size: int) -> "WordVocabulary":
        if size <= len(SPECIALS):
            raise UserError(f"a word vocabulary needs more than {len(SPECIALS)} ids "
                            f"(the specials), got size={size}")
        counts = collections.Counter(w for t in texts for w in tokenize(t))
        return cls([w for w, _ in counts.most_common(size - len(SPECIALS))])

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, tokens: Sequence[str]) -> List[int]:
        return [self._ids.get(w, UNK) for w in tokens]

    def decode(self, ids: Iterable[int]) -> List[str]:
        return [self.words[int(i)] for i in ids]


def _wrapped(words: Sequence[str], max_length: int) -> List[str]:
    """`<S> w1 .. wn </S>`, keeping the first max_length - 2 words."""
    if max_length < 3:
        raise UserError(f"max_length must be at least 3 (<S>, a word, </S>), got {max_length}")
    return [SPECIALS[BOS], *words[: max_length - 2], SPECIALS[EOS]]


def sentence_features(sentences: Sequence[Sequence[str]], vocabulary: WordVocabulary,
                      max_length: int, max_chars: int = MAX_CHARS) -> Dict[str, np.ndarray]:
    """Tokenized sentences -> {"token_ids" [b, max_length], "char_ids" [b, max_length,
    max_chars]}: `<S> w1 .. wn </S>`, padded with 0 (a sentence longer than max_length - 2
    words keeps its first max_length - 2 and still ends with `</S>`)."""
    converter = ElmoConverter({"tokens": max_length, "characters": max_chars})
    return converter([text_example(words, vocabulary, max_length, max_chars)
                      for words in sentences], num_rows=len(sentences))


def text_example(words: Sequence[str], vocabulary: WordVocabulary, max_length: int,
                 max_chars: int = MAX_CHARS) -> Dict[str, np.ndarray]:
    """One sentence's pipeline example: {"tokens" [n], "chars" [n * max_chars]} for
    `<S> words </S>` (n <= max_length)."""
    tokens = _wrapped(words, max_length)
    chars = np.stack([char_ids(w, max_chars) for w in tokens])               # [n, c]
    return {"tokens": np.asarray(vocabulary.encode(tokens), np.int32), "chars": chars.reshape(-1)}


class ElmoConverter(FeatureConverter):
    """`text_example`s -> {"token_ids" [b, l], "char_ids" [b, l, max_chars]}, one sentence
    per row (the biLM's LSTMs read a row as one sequence); lengths {"tokens": l} and
    optionally {"characters": max_chars} (default MAX_CHARS)."""

    def __init__(self, lengths: Mapping[str, int], pack: bool = False):
        if pack:
            raise UserError("ELMo rows hold one sentence each: bind experiment.pack = False")
        super().__init__(lengths, pack=False)
        self.max_chars = int(self.lengths.get("characters", MAX_CHARS))
        length = self.lengths["tokens"]
        self.packed_lengths = {"tokens": length, "chars": length * self.max_chars}

    def prepare(self, example: Mapping[str, Any]) -> tuple[Dict[str, np.ndarray], int]:
        tokens = np.asarray(example["tokens"], np.int32)
        chars = np.asarray(example["chars"], np.int32).reshape(len(tokens), -1)
        if len(tokens) < 3:
            raise SkipExample("empty")
        if chars.shape[1] != self.max_chars:
            raise UserError(f"an ELMo example has {chars.shape[1]} characters per token; "
                            f"the converter expects max_chars={self.max_chars}")
        length = self.lengths["tokens"]
        cut = max(len(tokens) - length, 0)
        if cut:                                 # keep the first words and the closing </S>
            keep = np.r_[np.arange(length - 1), len(tokens) - 1]
            tokens, chars = tokens[keep], chars[keep]
        return {"tokens": tokens, "chars": chars.reshape(-1)}, cut

    def finalize(self, rows: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
        b = rows["tokens"].shape[0]
        return {"token_ids": rows["tokens"],                                  # [b, l]
                "char_ids": rows["chars"].reshape(b, self.lengths["tokens"], self.max_chars)}
