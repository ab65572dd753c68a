"""Dictionary formats -> one plain-text document per entry, for pretraining text.

* dictd databases (``NAME.index`` + ``NAME.dict[.dz]``, RFC 2229 servers' format: GCIDE, the
  Devil's Dictionary, FOLDOC): `dictd_articles` reads the index (headword, base64 offset,
  base64 length) and slices each distinct article once; `gcide_text` and `foldoc_text`
  strip each dictionary's markup;
* the Jargon File's plain-text edition: `jargon_entries` (``:headword: ...`` entries);
* WordNet 3.0's ``data.{noun,verb,adj,adv}`` (wndb(5WN)): `wordnet_synsets`, a synset's
  words, then its gloss (definition and quoted examples).

Documents are ``{"id", "title", "text"}`` with paragraphs joined by "\\n".
"""
from __future__ import annotations

import re
import unicodedata
from typing import Iterator

_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def dictd_number(s: str) -> int:
    """dictd's base-64 numbers (big-endian digits of `_B64`): "Bdh" -> 1*4096 + 29*64 + 33."""
    n = 0
    for ch in s:
        n = n * 64 + _B64.index(ch)
    return n


def dictd_articles(index: str, data: bytes) -> list[tuple[str, str]]:
    """(first headword, article text) of each distinct article, in file order, skipping the
    ``00-database-*`` (and other ``00-``) metadata entries."""
    first: dict[tuple[int, int], str] = {}
    for line in index.splitlines():
        parts = line.split("\t")
        if len(parts) < 3 or parts[0].startswith("00-") or parts[0].startswith("00database"):
            continue
        first.setdefault((dictd_number(parts[1]), dictd_number(parts[2])), parts[0])
    return [(head, data[start:start + size].decode("utf-8", errors="replace"))
            for (start, size), head in sorted(first.items())]


def _paragraphs(text: str) -> str:
    blocks = re.split(r"\n[ \t]*\n", text.strip())
    return "\n".join(b for b in (" ".join(x.split()) for x in blocks) if b)


# ----------------------------------------------------------------------------- GCIDE

# GCIDE's dictd conversion spells accented letters as "[`e]", "[=a]", ...: base letter plus
# a combining mark (the pronunciation keys' breve, macron, dot, ... included).
_GCIDE_MARKS = {"`": "\u0300", "'": "\u0301", '"': "\u0308", "^": "\u0306", "=": "\u0304",
                ".": "\u0307", "~": "\u0303", ",": "\u0327", "-": "\u0304"}
_GCIDE_NAMED = {"ae": "\u00e6", "AE": "\u00c6", "oe": "\u0153", "OE": "\u0152",
                "deg": "\u00b0", "frac12": "\u00bd", "frac14": "\u00bc", "frac34": "\u00be",
                "sec": "\u2033", "min": "\u2032", "root": "\u221a", "ddag": "\u2021",
                "dag": "\u2020", "para": "\u00b6", "sect": "\u00a7", "pound": "\u00a3",
                "cent": "\u00a2", "times": "\u00d7", "divide": "\u00f7", "minus": "\u2212",
                "ounce": "\u2125", "prime": "\u2032"}
_GCIDE_CODE = re.compile(r"\[(?:([`'\"^=.~,-])([A-Za-z])|([A-Za-z]+\d*))\]")
_GCIDE_PRONUNCIATION = re.compile(r"\\[^\\\n]*\\")
_GCIDE_RESPELLING = re.compile(r"\((?=[^)\s]*[*\"`])[^)\s]+\)")
_GCIDE_SOURCE_LINE = re.compile(r"^\s*\[[^\[\]]*(?:Webster|WordNet|PJC|Century|Stormonth|"
                                r"Chambers|RN|Ogilvie|Johnson|Wright|Craig|Cook|Latham|"
                                r"Hamilton|Todd|Bartlett|[A-Z]{2,})[^\[\]]*\]\s*$", re.M)


def _gcide_code(m: re.Match) -> str:
    if m.group(3):
        return _GCIDE_NAMED.get(m.group(3), m.group(0))
    return unicodedata.normalize("NFC", m.group(2) + _GCIDE_MARKS[m.group(1)])


def gcide_text(article: str) -> str:
    """A GCIDE article as text: pronunciations (``\\Ca*lor"ic\\``, ``(k[.a]*l...)``) and
    source lines (``[1913 Webster]``) dropped, ``{cross refs}`` unbraced, accent codes
    (``[`e]``) as letters."""
    text = _GCIDE_SOURCE_LINE.sub("", article)
    text = _GCIDE_PRONUNCIATION.sub("", text)
    text = _GCIDE_RESPELLING.sub("", text)
    text = _GCIDE_CODE.sub(_gcide_code, text)
    return re.sub(r" +,", ",", _paragraphs(re.sub(r"[{}]", "", text)))


# ----------------------------------------------------------------------------- FOLDOC, Devil


def foldoc_text(article: str) -> str:
    """A FOLDOC article: ``{cross refs}`` unbraced, ``<subject>`` as "(subject)", the last-
    edited date line ``(1994-11-08)`` dropped."""
    text = re.sub(r"^\s*\(\d{4}-\d\d-\d\d\)\s*$", "", article, flags=re.M)
    text = re.sub(r"<([a-z][\w ,.-]*)>", r"(\1)", text)
    return _paragraphs(re.sub(r"[{}]", "", text))


def plain_article(article: str) -> str:
    """An article with no markup (the Devil's Dictionary): paragraphs, whitespace collapsed."""
    return _paragraphs(article)


# ----------------------------------------------------------------------------- Jargon File

_JARGON_HEAD = re.compile(r"^ {3}:([^:\n]+):(.*)$", re.M)


def jargon_entries(text: str) -> Iterator[dict]:
    """The Jargon File's glossary entries: ``   :hacker: n.`` starts one; its text runs to
    the next. Front matter before the first entry is not an entry; ``{refs}`` unbraced."""
    heads = list(_JARGON_HEAD.finditer(text))
    for i, m in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        title = m.group(1).strip()
        body = re.sub(r"[{}]", "", f"{title}:{m.group(2)}\n{text[m.end():end]}")
        yield {"id": f"{i:05d}", "title": title, "text": _paragraphs(body)}


# ----------------------------------------------------------------------------- WordNet

WORDNET_POS = {"noun": "n", "verb": "v", "adj": "a", "adv": "r"}


def wordnet_synsets(data: str, pos: str) -> Iterator[dict]:
    """Synsets of one ``data.POS`` file: ``{"id": "n00001740", "title": first word,
    "text": "entity: that which is perceived ..."}``. License header lines (they start with
    two spaces) are skipped; words lose underscores and adjective markers ("(a)")."""
    for line in data.splitlines():
        if not line or line.startswith("  ") or " | " not in line:
            continue
        fields, gloss = line.split(" | ", 1)
        parts = fields.split()
        count = int(parts[3], 16)
        words = [re.sub(r"\([a-z]+\)$", "", w).replace("_", " ")
                 for w in parts[4:4 + 2 * count:2]]
        yield {"id": f"{WORDNET_POS.get(pos, pos)}{parts[0]}", "title": words[0],
               "text": f"{', '.join(words)}: {' '.join(gloss.split())}"}
