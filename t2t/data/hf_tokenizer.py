"""A Hugging Face checkpoint's tokenizer as a t2t vocabulary.

`load(directory)` reads the tokenizer files of a Hugging Face model directory in the order
transformers' `AutoTokenizer` (its fast tokenizers, the default) reads them, and returns a
vocabulary whose `encode(text)` equals `AutoTokenizer.from_pretrained(directory)(text)
["input_ids"]`, special tokens included as the family adds them (`[CLS] … [SEP]` for BERT,
ELECTRA, DistilBERT and ALBERT, `<s> … </s>` for RoBERTa, `… </s>` for T5, none for GPT-2;
`add_special_tokens=False` leaves them out), and whose `decode(ids)` equals
`tokenizer.decode(ids, skip_special_tokens=True)` (`skip_special_tokens=False`: HF's plain
`decode`; padding is dropped either way, as every t2t vocabulary does):

1. `tokenizer.json`: the `tokenizers` serialization, every model it has (WordPiece, BPE,
   Unigram, WordLevel), with what transformers changes from `tokenizer_config.json` (no
   truncation or padding; BERT's `do_lower_case` / `strip_accents` /
   `tokenize_chinese_chars`; byte-level `add_prefix_space`; special tokens it lacks);
2. `spiece.model` (ALBERT, T5): a Unigram SentencePiece model turned into the pipeline
   transformers converts it to (SentencePiece's normalisation table, `▁` pre-tokenisation;
   ALBERT's lowercasing, accent stripping and `[CLS] … [SEP]`; T5's `<extra_id_k>`
   sentinels and `</s>`);
3. `vocab.txt` (BERT, ELECTRA, DistilBERT): t2t's `WordPieceVocabulary` (with
   transformers' `clean_up_tokenization_spaces` on decoding);
4. `vocab.json` + `merges.txt` (GPT-2, RoBERTa): byte-level BPE, ids as the file numbers
   them (RoBERTa's `<s>`, `<pad>`, `</s>`, `<unk>`, `<mask>` are in its `vocab.json`).

The family (which of 2-4 applies, and its special tokens) is `tokenizer_config.json`'s
`tokenizer_class`, else `config.json`'s `model_type`. Not read: a BPE-type `spiece.model`,
the slow files of other families (XLNet's `spiece.model`, OpenAI GPT's BPE: give their
`tokenizer.json`), a legacy `added_tokens.json`, and tokenizer classes whose Python code
changes the pipeline beyond the above (Llama's `add_bos_token`, say).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Sequence

from t2t.data.vocab import Vocabulary, WordPieceVocabulary, as_ints, word_starts
from t2t.errors import InputFileError

TOKENIZER_FILES = ("tokenizer.json", "spiece.model", "vocab.txt", "vocab.json + merges.txt")
MODELS = ("WordPiece", "BPE", "Unigram", "WordLevel")   # the tokenizer.json models read
SPECIAL_NAMES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
GPT2_EOT = "<|endoftext|>"
BERT_SPECIALS = dict(unk="[UNK]", sep="[SEP]", pad="[PAD]", cls="[CLS]", mask="[MASK]")


@dataclasses.dataclass(frozen=True)
class TokenizerStyle:
    """What one family's transformers tokenizer class does beyond its files: its special
    tokens where tokenizer_config.json does not name them (the class's defaults), which
    slow files it reads ("vocab.txt", "bpe": vocab.json + merges.txt, "spiece"), and the
    options it sets on the pipeline."""

    specials: Mapping[str, str] = dataclasses.field(default_factory=dict)
    slow_files: Optional[str] = None
    bert_normalizer: bool = False      # do_lower_case / strip_accents / Chinese characters
    lstrip_mask: bool = False          # `mask` takes the space before it
    wraps_cls_sep: bool = False        # RoBERTa's <s> … </s> post-processor
    # a spiece.model: its pieces as the class adjusts them, (pieces, config) -> (pieces,
    # config), and the pipeline it builds, (tokenizer, config, specials, charsmap
    # normalizers) -> the Metaspace prepend scheme
    spiece_pieces: Optional[Callable[..., Any]] = None
    spiece_pipeline: Optional[Callable[..., str]] = None
    # an explicit add_prefix_space makes the fast class convert spiece.model again (T5)
    converts_spiece_on_prefix_space: bool = False


# transformers' `clean_up_tokenization`: the spaces a word-level detokenizer leaves
CLEAN_UP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
            (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


def clean_up_tokenization(text: str) -> str:
    """transformers' `clean_up_tokenization_spaces`: "a , b ." -> "a, b."."""
    for old, new in CLEAN_UP:
        text = text.replace(old, new)
    return text


# ----------------------------------------------------------------------------- vocabulary


class HfTokenizerVocabulary(Vocabulary):
    """A `tokenizers.Tokenizer` set up as transformers sets it up, with the special tokens
    its `tokenizer_config.json` names: the interface of `WordPieceVocabulary` (`cls_id`,
    `sep_id`, `mask_id`, `encode_pair`, `tokenize_words`, …) for any family.
    `bos_id`/`eos_id`/`unk_id`/`pad_id`/`cls_id`/`sep_id`/`mask_id` are None where the
    family has no such token (GPT-2 has no padding; BERT no bos or eos)."""

    def __init__(self, tokenizer: Any, specials: dict[str, str],
                 clean_up_tokenization_spaces: bool = False):
        self._tok, self.specials = tokenizer, dict(specials)
        self.clean_up_tokenization_spaces = clean_up_tokenization_spaces
        for name in SPECIAL_NAMES:
            token = self.specials.get(name)
            setattr(self, f"{name}_id", None if token is None else tokenizer.token_to_id(token))
        self.special_ids = frozenset(
            i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special)

    def __getstate__(self) -> dict:
        return {"json": self._tok.to_str(), "specials": self.specials,
                "clean_up": self.clean_up_tokenization_spaces}

    def __setstate__(self, state: dict) -> None:
        from tokenizers import Tokenizer

        self.__init__(Tokenizer.from_str(state["json"]), state["specials"], state["clean_up"])

    @property
    def tokenizer(self) -> Any:
        """The `tokenizers.Tokenizer` (transformers' `backend_tokenizer`)."""
        return self._tok

    @functools.cached_property
    def vocab_size(self) -> int:  # = len(AutoTokenizer): the model's ids plus added tokens
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """transformers' `tokenizer(text)["input_ids"]` (without the family's special tokens
        when add_special_tokens=False)."""
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts: Iterable[str],
                     add_special_tokens: bool = True) -> list[list[int]]:
        encodings = self._tok.encode_batch(list(texts), add_special_tokens=add_special_tokens)
        return [e.ids for e in encodings]

    def encode_pair(self, a: str, b: str) -> tuple[list[int], list[int]]:
        """`tokenizer(a, b)`'s input_ids and token_type_ids."""
        enc = self._tok.encode(a, b)
        return enc.ids, enc.type_ids

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """The text's ids (no specials) and each token's (start, end) span in `text`."""
        enc = self._tok.encode(text, add_special_tokens=False)
        return enc.ids, [tuple(o) for o in enc.offsets]

    def tokenize(self, text: str) -> list[str]:
        """The tokens of the text, without special tokens (transformers' `tokenize`)."""
        return self._tok.encode(text, add_special_tokens=False).tokens

    def tokenize_words(self, text: str) -> list[list[int]]:
        """Ids (no specials) grouped by the pre-tokenizer's words."""
        ids, starts = self.tokenize_words_batch([text])[0]
        words: list[list[int]] = []
        for token_id, start in zip(ids, starts):
            if start:
                words.append([])
            words[-1].append(token_id)
        return words

    def tokenize_words_batch(self, texts: Sequence[str]) -> list[tuple[list[int], list[bool]]]:
        """Each text's ids (no specials) and whether each id begins a word."""
        encodings = self._tok.encode_batch(list(texts), add_special_tokens=False)
        return [(e.ids, word_starts(e.word_ids)) for e in encodings]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """transformers' `decode(ids, skip_special_tokens=...)`, padding dropped."""
        ids = [i for i in as_ints(ids) if i != self.pad_id]
        text = self._tok.decode(ids, skip_special_tokens=skip_special_tokens)
        return clean_up_tokenization(text) if self.clean_up_tokenization_spaces else text

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(int(token_id))

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)


# ----------------------------------------------------------------------------- rows


@dataclasses.dataclass(frozen=True)
class RowLayout:
    """Where a tokenizer puts its special tokens around one text (`single`) or two
    (`pair`), as transformers' `tokenizer(a)` / `tokenizer(a, b)` do: each a tuple of
    (part, token type id), a part being a special token's id or "a" / "b" (that text's
    ids). `[CLS] a [SEP] b [SEP]` (types 0, 0, 0, 1, 1) for BERT's WordPiece, `<s> a </s>
    </s> b </s>` (types 0) for RoBERTa's BPE."""

    single: tuple
    pair: tuple

    def added(self, pair: bool = False) -> int:
        """How many special tokens a row of one text (two with `pair`) gets."""
        return sum(not isinstance(part, str) for part, _ in (self.pair if pair else self.single))

    def start_of_b(self, len_a: int) -> int:
        """Where the second text's ids begin in a pair row whose first text has `len_a`."""
        before = self.pair[:[part for part, _ in self.pair].index("b")]
        return sum(len_a if part == "a" else 1 for part, _ in before)

    def build(self, a: Sequence[int], b: Optional[Sequence[int]] = None
              ) -> tuple[list[int], list[int]]:
        """(input_ids, token_type_ids) of the ids `a` (and `b`) with the special tokens."""
        texts = {"a": list(a), "b": None if b is None else list(b)}
        ids: list[int] = []
        types: list[int] = []
        for part, kind in (self.single if b is None else self.pair):
            piece = texts[part] if isinstance(part, str) else [part]
            ids += piece
            types += [kind] * len(piece)
        return ids, types


PROBES = ("a", "b")   # two texts whose ids are no special token's


def row_layout(vocabulary: Any) -> RowLayout:
    """The `RowLayout` of a vocabulary with `encode(text, add_special_tokens=)` and
    `encode_pair(a, b)` (t2t's `WordPieceVocabulary`, `HfTokenizerVocabulary`), read off
    how it encodes two probe texts, so rows follow the tokenizer's own post-processor."""
    a, b = (vocabulary.encode(t, add_special_tokens=False) for t in PROBES)
    single = vocabulary.encode(PROBES[0])
    ids, types = vocabulary.encode_pair(*PROBES)
    return RowLayout(tuple((p, 0) for p in layout_parts(single, a)),
                     tuple(zip(layout_parts(ids, a, b), kinds_of(ids, types, a, b))))


def layout_parts(ids: Sequence[int], a: Sequence[int], b: Sequence[int] = ()) -> list:
    """`ids` with the first run of `a` (and the next run of `b` after it) as "a" / "b"."""
    parts: list = []
    i = 0
    for name, run in (("a", list(a)), ("b", list(b))):
        if not run:
            continue
        j = next((k for k in range(i, len(ids) - len(run) + 1)
                  if list(ids[k:k + len(run)]) == run), None)
        if j is None:
            raise ValueError(f"the probe text's ids {run} are not in its encoding {list(ids)}")
        parts += [*ids[i:j], name]
        i = j + len(run)
    return parts + list(ids[i:])


def kinds_of(ids: Sequence[int], types: Sequence[int], a: Sequence[int],
             b: Sequence[int]) -> list[int]:
    """The token type id of each part `layout_parts(ids, a, b)` gives."""
    kinds, i = [], 0
    for part in layout_parts(ids, a, b):
        kinds.append(types[i])
        i += len(a) if part == "a" else len(b) if part == "b" else 1
    return kinds


# ----------------------------------------------------------------------------- the directory


def load(directory: str | os.PathLike) -> Vocabulary:
    """The tokenizer of the Hugging Face directory `directory` (see the module docstring):
    a `HfTokenizerVocabulary`, or a `HfWordPieceVocabulary` (a `WordPieceVocabulary`) for
    a BERT `vocab.txt`.
    InputFileError, in one line, where the directory has no tokenizer file t2t reads."""
    d = Path(directory)
    config = read_tokenizer_config(d)
    family = family_of(d, config)
    style = STYLES.get(family, TokenizerStyle())
    if (d / "tokenizer.json").is_file() and not (
            style.converts_spiece_on_prefix_space and config.get("add_prefix_space") is not None
            and (d / "spiece.model").is_file()):
        return HfTokenizerVocabulary(*from_tokenizer_json(d / "tokenizer.json", config, style))
    if (d / "spiece.model").is_file():
        return HfTokenizerVocabulary(*from_spiece(d / "spiece.model", config, family, style))
    if (d / "vocab.txt").is_file():
        return from_vocab_txt(d / "vocab.txt", config, family, style)
    if (d / "vocab.json").is_file() and (d / "merges.txt").is_file():
        return HfTokenizerVocabulary(*from_byte_level_bpe(d, config, family, style))
    raise InputFileError(f"{d} has no tokenizer file t2t reads (one of "
                         f"{', '.join(TOKENIZER_FILES)}): copy the checkpoint's tokenizer "
                         "files into it, or give a vocabulary of your own")


def read_tokenizer_config(d: Path) -> dict:
    """`tokenizer_config.json`, with `special_tokens_map.json`'s tokens where transformers
    takes them (files saved before `added_tokens_decoder` existed); {} without either."""
    config = read_json(d / "tokenizer_config.json")
    if "added_tokens_decoder" not in config:
        config.update({k: v for k, v in read_json(d / "special_tokens_map.json").items()
                       if k != "additional_special_tokens" or not config.get(k)})
    return config


def read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise InputFileError(f"{path} is not JSON ({str(e)[:80]})") from None
    if not isinstance(value, dict):
        raise InputFileError(f"{path} holds a {type(value).__name__}, not a JSON object")
    return value


def family_of(d: Path, config: dict) -> str | None:
    """"bert", "roberta", "t5", … from `tokenizer_class` ("BertTokenizerFast" -> "bert"),
    else `config.json`'s `model_type`; None when neither names one."""
    name = config.get("tokenizer_class")
    if isinstance(name, str) and name.endswith(("Tokenizer", "TokenizerFast")):
        return name.removesuffix("Fast").removesuffix("Tokenizer").lower() or None
    model_type = read_json(d / "config.json").get("model_type")
    return model_type.lower().replace("-", "_") if isinstance(model_type, str) else None


def token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or {"content": …}."""
    return value.get("content") if isinstance(value, dict) else value


def special_tokens(config: dict, style: TokenizerStyle) -> dict[str, str]:
    """bos/eos/unk/sep/pad/cls/mask -> token text: the config's, else the family's."""
    names = dict(style.specials)
    for name in SPECIAL_NAMES:
        if f"{name}_token" in config:
            names[name] = token_text(config[f"{name}_token"])
    return {k: v for k, v in names.items() if v is not None}


def added_token(value: Any, special: bool = True, **flags) -> Any:
    """A `tokenizers.AddedToken` from a string or a serialized token (its flags kept)."""
    from tokenizers import AddedToken

    if isinstance(value, dict):
        fields = {k: value[k] for k in ("single_word", "lstrip", "rstrip", "normalized")
                  if k in value}
        return AddedToken(value["content"], **{**fields, **flags},
                          special=value.get("special", special))
    return AddedToken(value, **{"normalized": not special, **flags}, special=special)


def add_special_tokens(tok: Any, config: dict, style: TokenizerStyle,
                       specials: dict[str, str]) -> None:
    """What transformers' fast tokenizer adds on loading: tokenizer_config.json's
    `added_tokens_decoder` where its flags differ from the tokenizer's; special tokens given
    with flags (a {"content": …} in the config, or RoBERTa's and ALBERT's `mask`, which
    takes the space before it) with those flags; the other special tokens (and
    `additional_special_tokens`) where the tokenizer does not have them yet."""
    present = {t.content: t for t in tok.get_added_tokens_decoder().values()}
    saved = {v["content"]: v for v in config.get("added_tokens_decoder", {}).values()}
    wanted = [added_token(value) for value in saved.values()
              if value["content"] not in present or any(
                  getattr(present[value["content"]], k) != value.get(k)
                  for k in ("lstrip", "rstrip", "single_word", "normalized", "special")
                  if k in value)]
    given = [(name, config.get(f"{name}_token")) for name in specials]
    given += [("extra", v) for v in config.get("additional_special_tokens") or []]
    for name, value in given:
        text = token_text(value) if value is not None else specials[name]
        if text in saved:
            continue
        if isinstance(value, dict):
            wanted.append(added_token(value))
        elif name == "mask" and style.lstrip_mask:
            wanted.append(added_token(text, lstrip=True, rstrip=False, normalized=False))
        elif text not in present and text not in [t.content for t in wanted]:
            wanted.append(added_token(text))
    for token in wanted:
        (tok.add_special_tokens if token.special else tok.add_tokens)([token])


def rebuilt(component: Any, module: Any, **changes) -> Any:
    """`component` (a normalizer, pre-tokenizer, post-processor) with `changes` to its
    serialized fields, where it has them and they differ; else (or where the changed
    state builds no component, which transformers ignores too) `component` itself."""
    if component is None:
        return None
    state = json.loads(component.__getstate__())
    changes = {k: v for k, v in changes.items() if k in state and state[k] != v}
    if not changes:
        return component
    state.update(changes)
    for key in ("sep", "cls"):   # RobertaProcessing's (token, id) pairs
        if key in state:
            state[key] = tuple(state[key])
    try:
        return getattr(module, state.pop("type"))(**state)
    except (AttributeError, TypeError, ValueError):
        return component


def from_tokenizer_json(path: Path, config: dict,
                        style: TokenizerStyle) -> tuple[Any, dict[str, str], bool]:
    """A tokenizer.json as transformers loads it: (tokenizer, special tokens, clean-up)."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors

    model = read_json(path).get("model", {}).get("type")
    if model not in MODELS:
        raise InputFileError(f"{path}: model type {model!r} is not one t2t reads "
                             f"({', '.join(MODELS)})")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:   # tokenizers' own Exception: a newer or broken serialization
        raise InputFileError(f"{path} cannot be read by tokenizers "
                             f"({str(e).strip()[:100]})") from None
    tok.no_truncation()
    tok.no_padding()
    if style.bert_normalizer:
        tok.normalizer = rebuilt(tok.normalizer, normalizers,
                                 lowercase=config.get("do_lower_case", True),
                                 strip_accents=config.get("strip_accents"),
                                 handle_chinese_chars=config.get("tokenize_chinese_chars", True))
    prefix_space = config.get("add_prefix_space", False)
    if prefix_space is not None:
        tok.pre_tokenizer = rebuilt(tok.pre_tokenizer, pre_tokenizers,
                                    add_prefix_space=prefix_space)
    if style.wraps_cls_sep:
        tok.post_processor = rebuilt(tok.post_processor, processors,
                                     add_prefix_space=bool(prefix_space),
                                     trim_offsets=config.get("trim_offsets", True))
    specials = special_tokens(config, style)
    add_special_tokens(tok, config, style, specials)
    tok.encode_special_tokens = bool(config.get("split_special_tokens", False))
    return tok, specials, bool(config.get("clean_up_tokenization_spaces", False))


class HfWordPieceVocabulary(WordPieceVocabulary):
    """t2t's WordPiece with transformers' decoding: `clean_up_tokenization_spaces` (on
    unless tokenizer_config.json turns it off, as BertTokenizer has it) applied after the
    WordPiece decoder's own clean-up, as the fast tokenizer converted from vocab.txt does."""

    def __init__(self, vocab_file: str | os.PathLike, lowercase: bool = True,
                 strip_accents: bool | None = None, chinese_chars: bool = True,
                 clean_up_tokenization_spaces: bool = True):
        super().__init__(vocab_file, lowercase, strip_accents, chinese_chars)
        self.clean_up_tokenization_spaces = clean_up_tokenization_spaces

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "clean_up": self.clean_up_tokenization_spaces}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["vocab_file"], state["lowercase"], state["strip_accents"],
                      state["chinese_chars"], state["clean_up"])

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        text = super().decode(ids, skip_special_tokens=skip_special_tokens)
        return clean_up_tokenization(text) if self.clean_up_tokenization_spaces else text


def from_vocab_txt(path: Path, config: dict, family: str | None,
                   style: TokenizerStyle) -> HfWordPieceVocabulary:
    """BERT's WordPiece, with tokenizer_config.json's casing and accent options."""
    if style.slow_files not in ("vocab.txt", None):
        raise InputFileError(f"{path}: t2t reads a vocab.txt as BERT's WordPiece, not "
                             f"{family!r}'s: give the directory's tokenizer.json")
    return HfWordPieceVocabulary(
        path, lowercase=config.get("do_lower_case", True),
        strip_accents=config.get("strip_accents"),
        chinese_chars=config.get("tokenize_chinese_chars", True),
        clean_up_tokenization_spaces=config.get("clean_up_tokenization_spaces", True))


def from_byte_level_bpe(d: Path, config: dict, family: str | None,
                        style: TokenizerStyle) -> tuple[Any, dict[str, str], bool]:
    """GPT-2's or RoBERTa's vocab.json + merges.txt, as transformers converts them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    if style.slow_files != "bpe":
        raise InputFileError(f"{d}: t2t reads vocab.json + merges.txt as GPT-2's or "
                             f"RoBERTa's byte-level BPE, not {family!r}'s: give the "
                             "directory's tokenizer.json")
    try:
        tok = Tokenizer(models.BPE.from_file(str(d / "vocab.json"), str(d / "merges.txt")))
    except Exception as e:
        raise InputFileError(f"{d}: vocab.json + merges.txt cannot be read as a BPE "
                             f"({str(e).strip()[:100]})") from None
    prefix_space = bool(config.get("add_prefix_space", False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=prefix_space)
    tok.decoder = decoders.ByteLevel()
    specials = special_tokens(config, style)
    ids = {name: tok.token_to_id(text) for name, text in specials.items()}
    needed = ("cls", "sep") if style.wraps_cls_sep else ("bos",) if config.get(
        "add_bos_token") else ()
    missing = [specials.get(name, name) for name in needed if ids.get(name) is None]
    if missing:
        raise InputFileError(f"{d / 'vocab.json'} lacks {', '.join(missing)}, which "
                             f"{family}'s tokenizer puts around every text")
    if style.wraps_cls_sep:
        tok.post_processor = processors.RobertaProcessing(
            (specials["sep"], ids["sep"]), (specials["cls"], ids["cls"]),
            trim_offsets=config.get("trim_offsets", True), add_prefix_space=prefix_space)
    elif config.get("add_bos_token", False):
        bos = specials["bos"]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 $B:1", special_tokens=[(bos, ids["bos"])])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    add_special_tokens(tok, config, style, specials)
    return tok, specials, bool(config.get("clean_up_tokenization_spaces", False))


def from_spiece(path: Path, config: dict, family: str | None,
                style: TokenizerStyle) -> tuple[Any, dict[str, str], bool]:
    """ALBERT's or T5's spiece.model as transformers converts it to a fast tokenizer."""
    from sentencepiece import sentencepiece_model_pb2 as pb  # needs protobuf
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers

    if style.slow_files != "spiece":
        raise InputFileError(f"{path}: t2t reads a spiece.model as ALBERT's or T5's "
                             f"tokenizer, not {family!r}'s: give the directory's "
                             "tokenizer.json")
    try:
        proto = pb.ModelProto.FromString(path.read_bytes())
    except Exception as e:   # protobuf's DecodeError
        raise InputFileError(f"{path} is not a SentencePiece model "
                             f"({type(e).__name__})") from None
    kind = pb.TrainerSpec.ModelType.Name(proto.trainer_spec.model_type)
    if kind != "UNIGRAM":
        raise InputFileError(f"{path} is a {kind} SentencePiece model; t2t reads Unigram "
                             "ones: give the directory's tokenizer.json")
    specials = special_tokens(config, style)
    vocab, config = style.spiece_pieces([(p.piece, p.score) for p in proto.pieces], config)
    tok = Tokenizer(models.Unigram(vocab, unk_id=proto.trainer_spec.unk_id, byte_fallback=False))
    control, user = pb.ModelProto.SentencePiece.CONTROL, pb.ModelProto.SentencePiece.USER_DEFINED
    tok.add_tokens([AddedToken(p.piece, normalized=False, special=p.type == control)
                    for p in proto.pieces if p.type in (control, user)])
    charsmap = proto.normalizer_spec.precompiled_charsmap
    table = [normalizers.Precompiled(charsmap)] if charsmap else []
    scheme = style.spiece_pipeline(tok, config, specials, table)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=scheme)
    add_special_tokens(tok, config, style, specials)
    return tok, specials, bool(config.get("clean_up_tokenization_spaces", False))


def albert_pieces(vocab: list, config: dict) -> tuple[list, dict]:
    """ALBERT's pieces: "1," … "9," demoted, as transformers does."""
    return [(p, s - 100 if len(p) > 1 and p[-1] == "," and p[-2].isdigit() else s)
            for p, s in vocab], config


def albert_pipeline(tok: Any, config: dict, specials: dict, table: list) -> str:
    """ALBERT's normalisation (quotes, accents, lowercasing) and [CLS] … [SEP]."""
    from tokenizers import Regex, normalizers, processors

    steps = [normalizers.Replace("``", '"'), normalizers.Replace("''", '"')]
    if not config.get("keep_accents", False):
        steps += [normalizers.NFKD(), normalizers.StripAccents()]
    if config.get("do_lower_case", True):
        steps.append(normalizers.Lowercase())
    tok.normalizer = normalizers.Sequence([*steps, *table, normalizers.Replace(Regex(" {2,}"),
                                                                               " ")])
    cls, sep = specials["cls"], specials["sep"]
    tok.post_processor = processors.TemplateProcessing(
        single=[cls, "$A", sep], pair=[cls, "$A", sep, "$B:1", f"{sep}:1"],
        special_tokens=[(specials[t], tok.token_to_id(specials[t])) for t in ("cls", "sep")])
    return "always"


def t5_pieces(vocab: list, config: dict) -> tuple[list, dict]:
    """T5's pieces: the `<extra_id_k>` sentinels appended (k descending), and named as
    additional special tokens where the config does not name them."""
    extra = [token_text(t) for t in config.get("additional_special_tokens") or []]
    extra_ids = config.get("extra_ids", sum("<extra_id_" in str(t) for t in extra) or 100)
    vocab = vocab + [(f"<extra_id_{k}>", 0.0) for k in reversed(range(extra_ids))]
    if not any("<extra_id_" in str(t) for t in extra):
        config = {**config, "additional_special_tokens":
                  extra + [f"<extra_id_{k}>" for k in range(extra_ids)]}
    return vocab, config


def t5_pipeline(tok: Any, config: dict, specials: dict, table: list) -> str:
    """T5's normalisation and `… </s>`; the prepend scheme from add_prefix_space / legacy."""
    from tokenizers import Regex, normalizers, processors

    tok.normalizer = normalizers.Sequence([*table, normalizers.Strip(left=False, right=True),
                                           normalizers.Replace(Regex(" {2,}"), "▁")])
    eos = specials["eos"]
    tok.post_processor = processors.TemplateProcessing(
        single=["$A", eos], pair=["$A", eos, "$B", eos],
        special_tokens=[(eos, tok.token_to_id(eos))])
    if not config.get("add_prefix_space", True):
        return "never"
    return "first" if config.get("legacy") is False else "always"


WORDPIECE = TokenizerStyle(BERT_SPECIALS, "vocab.txt", bert_normalizer=True)
# by tokenizer family (`family_of`): transformers' classes' defaults
STYLES: Dict[str, TokenizerStyle] = {
    "bert": WORDPIECE, "electra": WORDPIECE, "distilbert": WORDPIECE,
    "roberta": TokenizerStyle(dict(bos="<s>", eos="</s>", sep="</s>", cls="<s>", unk="<unk>",
                                   pad="<pad>", mask="<mask>"), "bpe", lstrip_mask=True,
                              wraps_cls_sep=True),
    "gpt2": TokenizerStyle(dict(unk=GPT2_EOT, bos=GPT2_EOT, eos=GPT2_EOT), "bpe"),
    "albert": TokenizerStyle(dict(bos="[CLS]", eos="[SEP]", unk="<unk>", sep="[SEP]",
                                  pad="<pad>", cls="[CLS]", mask="[MASK]"), "spiece",
                             lstrip_mask=True, spiece_pieces=albert_pieces,
                             spiece_pipeline=albert_pipeline),
    "t5": TokenizerStyle(dict(eos="</s>", unk="<unk>", pad="<pad>"), "spiece",
                         spiece_pieces=t5_pieces, spiece_pipeline=t5_pipeline,
                         converts_spiece_on_prefix_space=True),
}


__all__ = ["load", "HfTokenizerVocabulary", "HfWordPieceVocabulary", "RowLayout",
           "TOKENIZER_FILES", "clean_up_tokenization", "row_layout"]
