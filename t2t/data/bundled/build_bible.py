"""Rebuild the bundled verse-aligned Bible texts from Debian's SWORD modules.

    apt-get install -y libsword-utils sword-text-web sword-text-kjv sword-text-sparv
    python -m t2t.data.bundled.build_bible [--out DIR]

`mod2imp MODULE` prints `$$$Book C:V` headers, each followed by the verse in OSIS markup.
We drop footnotes, cross references and headings, strip the remaining tags and normalise
whitespace. Output is deterministic: the same packages give byte-identical files (gzip
mtime 0), plus a README.md with provenance, counts and sha256 sums.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import html
import io
import json
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Iterator

HERE = Path(__file__).resolve().parent

# name -> (Debian package, candidate SWORD module names, human title)
TRANSLATIONS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "web": ("sword-text-web", ("engWEB2015eb", "WEB"), "World English Bible (with Deuterocanon)"),
    "kjv": ("sword-text-kjv", ("engKJV2006eb", "KJV"), "King James Version (1769)"),
    "rv1909": ("sword-text-sparv", ("spaRV1909eb", "SpaRV"), "Reina-Valera 1909 (Spanish)"),
}

# SWORD book name -> (OSIS id, display name), in canonical order.
BOOKS: dict[str, tuple[str, str]] = {
    s: (o, d or s) for s, o, d in [
        ("Genesis", "Gen", ""), ("Exodus", "Exod", ""), ("Leviticus", "Lev", ""),
        ("Numbers", "Num", ""), ("Deuteronomy", "Deut", ""), ("Joshua", "Josh", ""),
        ("Judges", "Judg", ""), ("Ruth", "Ruth", ""), ("I Samuel", "1Sam", "1 Samuel"),
        ("II Samuel", "2Sam", "2 Samuel"), ("I Kings", "1Kgs", "1 Kings"),
        ("II Kings", "2Kgs", "2 Kings"), ("I Chronicles", "1Chr", "1 Chronicles"),
        ("II Chronicles", "2Chr", "2 Chronicles"), ("Ezra", "Ezra", ""),
        ("Nehemiah", "Neh", ""), ("Esther", "Esth", ""), ("Job", "Job", ""),
        ("Psalms", "Ps", ""), ("Proverbs", "Prov", ""), ("Ecclesiastes", "Eccl", ""),
        ("Song of Solomon", "Song", ""), ("Isaiah", "Isa", ""), ("Jeremiah", "Jer", ""),
        ("Lamentations", "Lam", ""), ("Ezekiel", "Ezek", ""), ("Daniel", "Dan", ""),
        ("Hosea", "Hos", ""), ("Joel", "Joel", ""), ("Amos", "Amos", ""),
        ("Obadiah", "Obad", ""), ("Jonah", "Jonah", ""), ("Micah", "Mic", ""),
        ("Nahum", "Nah", ""), ("Habakkuk", "Hab", ""), ("Zephaniah", "Zeph", ""),
        ("Haggai", "Hag", ""), ("Zechariah", "Zech", ""), ("Malachi", "Mal", ""),
        ("Tobit", "Tob", ""), ("Judith", "Jdt", ""), ("Esther (Greek)", "EsthGr", ""),
        ("Wisdom", "Wis", ""), ("Sirach", "Sir", ""), ("Baruch", "Bar", ""),
        ("Prayer of Azariah", "PrAzar", ""), ("Susanna", "Sus", ""),
        ("Bel and the Dragon", "Bel", ""), ("I Maccabees", "1Macc", "1 Maccabees"),
        ("II Maccabees", "2Macc", "2 Maccabees"), ("I Esdras", "1Esd", "1 Esdras"),
        ("Prayer of Manasses", "PrMan", ""), ("Additional Psalm", "AddPs", "Psalm 151"),
        ("III Maccabees", "3Macc", "3 Maccabees"), ("II Esdras", "2Esd", "2 Esdras"),
        ("IV Maccabees", "4Macc", "4 Maccabees"),
        ("Matthew", "Matt", ""), ("Mark", "Mark", ""), ("Luke", "Luke", ""),
        ("John", "John", ""), ("Acts", "Acts", ""), ("Romans", "Rom", ""),
        ("I Corinthians", "1Cor", "1 Corinthians"), ("II Corinthians", "2Cor", "2 Corinthians"),
        ("Galatians", "Gal", ""), ("Ephesians", "Eph", ""), ("Philippians", "Phil", ""),
        ("Colossians", "Col", ""), ("I Thessalonians", "1Thess", "1 Thessalonians"),
        ("II Thessalonians", "2Thess", "2 Thessalonians"), ("I Timothy", "1Tim", "1 Timothy"),
        ("II Timothy", "2Tim", "2 Timothy"), ("Titus", "Titus", ""), ("Philemon", "Phlm", ""),
        ("Hebrews", "Heb", ""), ("James", "Jas", ""), ("I Peter", "1Pet", "1 Peter"),
        ("II Peter", "2Pet", "2 Peter"), ("I John", "1John", "1 John"),
        ("II John", "2John", "2 John"), ("III John", "3John", "3 John"), ("Jude", "Jude", ""),
        ("Revelation of John", "Rev", "Revelation"),
    ]
}

BOOKS_BY_NAME = {display: osis for osis, display in BOOKS.values()}

_HEADER = re.compile(r"^\$\$\$(.+) (\d+):(\d+)$")
_NOTE = re.compile(r"<note\b[^>]*>(?:(?!<note\b).)*?</note>", re.S)  # innermost first
_DROPPED = re.compile(r"<(title|speaker)\b[^>]*>.*?</\1>", re.S)       # headings, labels
_BLOCK_TAG = re.compile(
    r"</?(?:div|l|lg|lb|p|milestone|chapter|verse|list|item|table|row|cell)\b[^>]*>")
_TAG = re.compile(r"<[^>]*>")
_BOOK_END = re.compile(r"<div\b(?=[^>]*\beID=)(?=[^>]*\btype=\"book\")[^>]*>.*", re.S)
_USFM = re.compile(r"\\\+?[a-z]+\d*(?:\*| ?)")  # stray USFM markers such as \nd LORD\+nd*
# RV1909 puts added words (<transChange>) flush against the neighbouring <w> elements; most
# are separate words, but clitic pronouns after a verb are part of it ("oyéndo" + "lo").
_TC_AFTER_W = re.compile(r"([^\s>]*)</w>(<transChange\b[^>]*>)([^<]*)</transChange>")
_W_AFTER_TC = re.compile(r"</transChange>(?=<w\b)")
_CLITIC = re.compile(r"(?:me|te|se|nos|os|le|lo|la|les|los|las)+")
_NOT_A_HOST = {"y", "e", "o", "u", "que", "no", "ni", "si", "os", "gentes", "se", "me", "te", "le",
               "lo", "la", "les", "los", "las", "nos"}
# RV1909 keeps Psalm 119's acrostic letter names ("ALEPH.") in the verse text; the others
# mark them as headings, which we drop.
_ACROSTIC = re.compile(r"^(?:ALEPH|BETH|GIMEL|DALETH|HE|VAU|ZAIN|CHETH|TETH|JOD|CAPH|LAMED|MEM|NUN|"
                       r"SAMECH|AIN|PE|TZADDI|COPH|RESH|SIN|SCHIN|TAU)\.? ")
_NOTE_MARK = "\x00"
_NOTE_SITE = re.compile(r"\s*\x00[\s\x00]*")
_CLOSING = set(",.;:!?’”)]")
_OPENING = set("“‘([")
_DROP_CHARS = str.maketrans({"¶": " ", "\u00a0": " ", "\u200b": "", "\ufeff": ""})
_WORD = re.compile(r"\b[^\W\d_]{2,}\b")


def parse_imp(lines: Iterator[str]) -> Iterator[tuple[str, int, int, str]]:
    """Yield (SWORD book, chapter, verse, raw OSIS) for each `$$$Book C:V` entry."""
    head, body = None, []
    for line in lines:
        line = line.rstrip("\n")
        if line.startswith("$$$"):
            if head:
                yield (*head, " ".join(body))
            m = _HEADER.match(line)
            head = (m.group(1), int(m.group(2)), int(m.group(3))) if m else None
            body = []
        elif head:
            body.append(line)
    if head:
        yield (*head, " ".join(body))


def _note_site(m: re.Match) -> str:
    """What replaces a removed note: a space between words, nothing before punctuation."""
    text, i, j = m.string, m.start(), m.end()
    before, after = text[i - 1: i], text[j: j + 1]
    if not before or not after or after in _CLOSING:
        return ""
    if m.group().strip("\x00"):  # there was whitespace around the note
        return " "
    word_end = before.isalnum() or before in _CLOSING
    return " " if word_end and (after.isalnum() or after in _OPENING) else ""


def _join_added_word(m: re.Match) -> str:
    prev, tag, added = m.groups()
    glue = _CLITIC.fullmatch(added) and prev.islower() and prev not in _NOT_A_HOST
    return f"{prev}</w>{'' if glue else ' '}{tag}{added}</transChange>"


def clean_osis(raw: str) -> str:
    """OSIS verse markup -> plain text: no notes, headings, tags, pilcrows; single spaces."""
    text, n = _BOOK_END.sub("", raw), 1  # a book's last verse may carry a glossary after it
    while n:
        text, n = _NOTE.subn(_NOTE_MARK, text)
    text = _DROPPED.sub(" ", text)
    text = _W_AFTER_TC.sub("</transChange> ", text)
    text = _TC_AFTER_W.sub(_join_added_word, text)
    text = _BLOCK_TAG.sub(" ", text)
    text = _TAG.sub("", text)
    text = _USFM.sub("", text)
    text = _NOTE_SITE.sub(_note_site, text)
    text = html.unescape(text).translate(_DROP_CHARS)
    return " ".join(text.split())


def _fix_drop_cap(text: str, counts: Counter) -> str:
    """RV1909 prints a chapter's first word in capitals ("Y FUERON acabados").

    The word takes the casing it has most often elsewhere in the text ("fueron", "Jehová"),
    capitalised at the start of a sentence; capitalised phrases (inscriptions) stay.
    """
    words = list(_WORD.finditer(text))
    for i, m in enumerate(words):
        word = m.group()
        if not word.isupper():
            continue
        if i + 1 < len(words) and words[i + 1].group().isupper():
            return text
        lead = text[: m.start()].rstrip(" ¡¿“‘(")
        fixed = word.capitalize()
        if lead and lead[-1] not in ".:;!?" and counts[word.lower()] >= counts[fixed]:
            fixed = word.lower()
        return text[: m.start()] + fixed + text[m.end():]
    return text


def verses(name: str, imp_text: str) -> list[dict]:
    """Clean, ordered verse records of one translation from `mod2imp` output."""
    entries = [(BOOKS[book], chapter, verse, clean_osis(raw))
               for book, chapter, verse, raw in parse_imp(io.StringIO(imp_text))
               if chapter and verse and book in BOOKS]  # skip module/book/chapter intros
    if name == "rv1909":
        entries = [(b, c, v, _ACROSTIC.sub("", t) if b[0] == "Ps" and c == 119 and v % 8 == 1
                    else t)
                   for b, c, v, t in entries]
        counts = Counter(w for *_, text in entries for w in _WORD.findall(text))
        entries = [(b, c, v, _fix_drop_cap(t, counts) if v == 1 else t) for b, c, v, t in entries]
    out, seen = [], set()
    for (osis, display), chapter, verse, text in entries:
        vid = f"{osis}.{chapter}.{verse}"
        if not text or vid in seen:
            continue
        seen.add(vid)
        out.append({"id": vid, "book": display, "chapter": chapter, "verse": verse, "text": text})
    return out


def _module_dump(name: str) -> tuple[str, str]:
    """Run mod2imp on the first installed module for `name`: (module, output)."""
    package, modules, _ = TRANSLATIONS[name]
    if shutil.which("mod2imp") is None:
        sys.exit("mod2imp not found: apt-get install -y libsword-utils " +
                 " ".join(p for p, _, _ in TRANSLATIONS.values()))
    for module in modules:
        proc = subprocess.run(["mod2imp", module], capture_output=True, text=True)
        if proc.returncode == 0 and "$$$" in proc.stdout:
            return module, proc.stdout
    sys.exit(f"no SWORD module {modules} found: apt-get install -y {package}")


def write_jsonl_gz(records: list[dict], path: Path) -> None:
    """Write records as gzip'd JSON lines with mtime 0, so the bytes are reproducible."""
    payload = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw,
                                               compresslevel=9, mtime=0) as gz:
        gz.write(payload)
    tmp.replace(path)


def _package_version(package: str) -> str:
    proc = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package],
                          capture_output=True, text=True)
    return proc.stdout.strip() or "unknown"


def _readme(rows: list[tuple]) -> str:
    sword_version = _package_version("libsword-utils")
    table = "\n".join(f"| `{n}.jsonl.gz` | {t} | `{p}` {v} | `{m}` | {c:,} | {s:,} | `{h}` |"
                      for n, t, p, v, m, c, s, h in rows)
    return f"""# Bundled public-domain corpora

Verse-aligned Bible translations, one JSON object per verse in canonical order:
`{{"id": "Gen.1.1", "book": "Genesis", "chapter": 1, "verse": 1, "text": "..."}}`.
Ids are OSIS book abbreviations plus chapter and verse in each module's versification;
join two translations with `t2t.data.bundled.aligned(a, b)`.

| file | translation | Debian package | SWORD module | verses | bytes | sha256 |
|---|---|---|---|---|---|---|
{table}

License: public domain (each module's `DistributionLicense`; the World English Bible asks
that changed texts not be called "World English Bible").

Cleaning: footnotes, cross references, headings (psalm titles where the module marks them
as headings), speaker labels, Strong's numbers and stray USFM markers are removed, all tags
stripped, pilcrows dropped, whitespace collapsed. Reina-Valera's capitalised first word of
a chapter gets its usual casing and its Psalm 119 acrostic letter names are dropped. Verses
that are empty after cleaning are left out. Converted with `mod2imp` from `libsword-utils`
{sword_version}.

Rebuild (deterministic; gzip mtime 0):

    apt-get install -y libsword-utils {" ".join(p for p, _, _ in TRANSLATIONS.values())}
    python -m t2t.data.bundled.build_bible
"""


def build(out_dir: Path = HERE, names: tuple[str, ...] = tuple(TRANSLATIONS)) -> list[Path]:
    """Build each translation's `NAME.jsonl.gz` and the README into `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows, paths = [], []
    for name in names:
        module, dump = _module_dump(name)
        records = verses(name, dump)
        path = out_dir / f"{name}.jsonl.gz"
        write_jsonl_gz(records, path)
        package, _, title = TRANSLATIONS[name]
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        rows.append((name, title, package, _package_version(package), module,
                     len(records), path.stat().st_size, digest))
        paths.append(path)
        print(f"{path.name}: {len(records)} verses, {path.stat().st_size} bytes")
    if set(names) == set(TRANSLATIONS):
        (out_dir / "README.md").write_text(_readme(rows))
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="output directory")
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"translations to build (default: all of {', '.join(TRANSLATIONS)})")
    parser.add_argument("--vocabularies", action="store_true",
                        help="instead, train the two default vocabularies on the bundled "
                             "corpora into --out (about 15 s)")
    args = parser.parse_args(argv)
    if args.vocabularies:
        from t2t.data.catalog import bible
        for path in (bible.train_sentencepiece(args.out, 8000),
                     bible.train_wordpiece(args.out, 8000)):
            print(f"{path.name}: {path.stat().st_size} bytes")
        return 0
    unknown = set(args.names) - set(TRANSLATIONS)
    if unknown:
        parser.error(f"unknown translation(s) {sorted(unknown)}; choose from {list(TRANSLATIONS)}")
    build(args.out, tuple(args.names) or tuple(TRANSLATIONS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
