"""Pretraining text from Debian packages: the builders of the `micro` corpus's sources.

Each builder (`t2t data build NAME`) fetches Debian packages with ``apt-get download``,
turns their documentation or dictionary files into plain-text documents
(`t2t.data.catalog.markup`, `t2t.data.catalog.dictionaries`) and writes
``{train,validation}.jsonl`` records ``{"id", "title", "text"}`` (paragraphs joined by
"\\n"), split by document with `MICRO_SPLIT` on the key ``NAME/id``, the same split that
`micro_corpus` gives every document, plus a manifest with counts, words per split and the
package versions. Sources and licenses (the manifest says each; build on your machine, commit
none of it; docs/data.md has the sizes):

* python_docs: python3.X-doc's ``_sources/**/*.rst.txt``, reST stripped. PSF License 2.
* sphinx_docs: the ``_sources`` of `SPHINX_DOC_PACKAGES` (pandas, scikit-learn, astropy,
  SymPy, ...). Each project's: BSD-3-Clause, MIT or Apache-2.0.
* gcide: dict-gcide, the GNU Collaborative International Dictionary of English (Webster's
  1913 + WordNet). GPL-2+.
* wordnet: wordnet-base, WordNet 3.0 synsets (words, glosses, examples). WordNet 3.0
  license (BSD-like).
* foldoc: dict-foldoc, the Free On-line Dictionary of Computing. GFDL-1.1+.
* devil: dict-devil, Bierce's The Devil's Dictionary (1911). Public domain.
* jargon: jargon-text, the Jargon File 4.4.7. Public domain.
* perl_docs: perl-doc's ``perl*.pod`` manuals. Artistic-1 or GPL-1+.
* man_pages: English man pages of manpages, manpages-dev and the core packages of
  `MAN_PACKAGES`. Linux-man-pages-copyleft, GPL, BSD and other free licenses.
* info_manuals: manuals in info form, `INFO_PACKAGES` (GNU's, R, Octave, Maxima, zsh,
  gnuplot, MIT/GNU Scheme, SBCL). GFDL-1.3+ without invariant sections, GPL-2+, zsh's and
  gnuplot's permissive licenses, public domain/BSD (SBCL).
* debian_docs: debian-reference-en, developers-reference, maint-guide, debian-faq,
  debian-handbook (en-US), debian-policy. GPL-2+; maint-guide MIT-style; handbook GPL-2+
  or CC-BY-SA-3.0.
* postgresql_docs: postgresql-doc-N's HTML manual. PostgreSQL License (BSD-like).
* linux_docs: linux-doc-N's ``_sources`` (the kernel's Documentation/, English: no
  translations/). GPL-2.
* server_docs: the English manuals of apache2-doc, exim4-doc-html, postfix-doc (HTML).
  Apache-2.0, GPL-2+, IPL-1.0 or EPL-2.0.
* commentaries: sword-comm-tdavid, -mhcc, -scofield: Spurgeon's The Treasury of David
  (1885), Matthew Henry's Concise Commentary, the Scofield Reference Notes (1917). Public
  domain.
"""
from __future__ import annotations

import gzip
import re
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

from t2t.data.catalog import dictionaries, markup, sword
from t2t.data.catalog.builders import (BUILDERS, Builder, BuildError, apt_download,
                                       deb_members, decode_text, progress_bar, write_splits)

MICRO_SPLIT = ("micro_corpus", (0.95, 0.05))  # (hash seed, train/validation), by document
MICRO_LICENSES: dict[str, str] = {}           # source name -> license, for the manifest

Document = dict
Converter = Callable[[str, bytes], Iterable[Document]]  # (member path, bytes) -> documents


def micro_key(source: str, doc_id: str) -> str:
    """The key `MICRO_SPLIT` hashes: ``SOURCE/ID`` (e.g. "gcide/01234")."""
    return f"{source}/{doc_id}"


def word_count(text: str) -> int:
    return len(text.split())


MIN_WORDS = 3  # shorter documents (Sphinx autosummary stubs, `.so` man pages) are dropped


def write_documents(name: str, documents: Iterable[Document], out: Path) -> dict:
    """Write documents of `MIN_WORDS` words or more by `MICRO_SPLIT`; manifest fields
    counts and words."""
    docs = [d for d in documents if word_count(d["text"]) >= MIN_WORDS]
    ids = [d["id"] for d in docs]
    if len(set(ids)) != len(ids):
        raise BuildError(f"{name}: duplicate document ids")
    counts = write_splits(docs, lambda d: micro_key(name, d["id"]), out, *MICRO_SPLIT)
    words = {s: 0 for s in counts}
    for d in docs:
        words[split_name(name, d["id"])] += word_count(d["text"])
    return {"counts": counts, "words": words}


def split_name(source: str, doc_id: str) -> str:
    from t2t.data.sources import split_of
    return split_of(micro_key(source, doc_id), *MICRO_SPLIT)


def _unzip(name: str, raw: bytes) -> tuple[str, bytes]:
    if name.endswith(".gz"):
        return name[:-3], gzip.decompress(raw)
    return name, raw


def _stem(path: str, root: str, suffixes: Sequence[str]) -> str:
    """The id of a member: its path below `root` without the first matching suffix."""
    rel = path.split(root, 1)[-1].lstrip("/")
    for suffix in suffixes:
        if rel.endswith(suffix):
            return rel[: -len(suffix)]
    return rel


def _title(text: str) -> str:
    return text.split("\n", 1)[0][:200]


# ----------------------------------------------------------------------------- converters


def rst_documents(name: str, raw: bytes) -> Iterator[Document]:
    """A Sphinx ``_sources/PATH.rst.txt`` -> one document, id PATH."""
    text = markup.rst_to_text(decode_text(raw))
    yield {"id": _stem(name, "/_sources/", (".rst.txt", ".txt")), "title": _title(text),
           "text": text}


def pod_documents(name: str, raw: bytes) -> Iterator[Document]:
    text = markup.pod_to_text(decode_text(raw))
    yield {"id": Path(name).stem, "title": _title(text), "text": text}


def man_documents(name: str, raw: bytes) -> Iterator[Document]:
    """A man page (``man2/read.2.gz``) -> one document, id ``man2/read.2``; ``.so``
    redirections give no text and are dropped by `write_documents`, as are BSD mdoc pages
    (``.Dd``/``.Nm`` macros, which `markup.roff_to_text` does not read)."""
    name, raw = _unzip(name, raw)
    source = decode_text(raw)
    text = "" if re.search(r"^\.(Dd|Nm)\b", source, re.M) else markup.roff_to_text(source)
    yield {"id": _stem(name, "/share/man/", ()), "title": _title(text), "text": text}


def info_documents(name: str, raw: bytes) -> Iterator[Document]:
    """An info file (``grep.info.gz``, or one part ``guile.info-3.gz``) -> one document."""
    name, raw = _unzip(name, raw)
    text = markup.info_to_text(decode_text(raw))
    yield {"id": _stem(name, "/share/info/", ()), "title": _title(text), "text": text}


def html_documents(name: str, raw: bytes) -> Iterator[Document]:
    text = markup.html_to_text(decode_text(raw))
    yield {"id": _stem(name, "/html/", (".html",)), "title": _title(text), "text": text}


def doc_documents(name: str, raw: bytes) -> Iterator[Document]:
    """HTML pages and reST sources, by file name; id: the path below /usr/share."""
    convert = rst_documents if name.endswith(".rst.txt") else html_documents
    for doc in convert(name, raw):
        doc["id"] = _stem(name, "/usr/share/", (".rst.txt", ".html"))
        yield doc


def dictd_converter(clean: Callable[[str], str]) -> Converter:
    """A converter for a dictd database whose ``.index`` and ``.dict.dz`` arrive in turn."""
    pending: dict[str, bytes] = {}

    def convert(name: str, raw: bytes) -> Iterator[Document]:
        stem = re.sub(r"\.(index|dict\.dz|dict)$", "", name)
        pending[name] = raw
        index = pending.get(stem + ".index")
        data = pending.get(stem + ".dict.dz") or pending.get(stem + ".dict")
        if index is None or data is None:
            return
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        for i, (head, article) in enumerate(
                dictionaries.dictd_articles(index.decode("utf-8", "replace"), data)):
            yield {"id": f"{i:06d}", "title": head, "text": clean(article)}
        pending.clear()

    return convert


def sword_converter() -> Converter:
    """A converter for SWORD commentaries: a testament's ``{ot,nt}.Xz{s,v,z}`` files are
    buffered until its block index and data have arrived; one document per block, id
    ``MODULE/TESTAMENT-NNN``."""
    pending: dict[str, bytes] = {}

    def convert(name: str, raw: bytes) -> Iterator[Document]:
        if not name.endswith(("zs", "zz")):
            return
        stem = name[:-1]  # ".../ot.bz" of ".../ot.bzs"
        pending[name] = raw
        if stem + "s" not in pending or stem + "z" not in pending:
            return
        module, testament = Path(stem).parent.name, Path(stem).name.split(".")[0]
        for i, block in enumerate(sword.zcom_blocks(pending.pop(stem + "s"),
                                                    pending.pop(stem + "z"))):
            text = sword.osis_text(block)
            yield {"id": f"{module}/{testament}-{i:03d}", "title": _title(text), "text": text}

    return convert


def jargon_documents(name: str, raw: bytes) -> Iterator[Document]:
    _, raw = _unzip(name, raw)
    yield from dictionaries.jargon_entries(decode_text(raw))


def wordnet_documents(name: str, raw: bytes) -> Iterator[Document]:
    yield from dictionaries.wordnet_synsets(decode_text(raw), name.rsplit(".", 1)[-1])


# ----------------------------------------------------------------------------- builders


def apt_download_first(candidates: Sequence[str], dest: Path) -> list[Path]:
    """The first of `candidates` that this Debian release has (e.g. the newest
    python3.X-doc), downloaded into `dest`."""
    for package in candidates:
        try:
            return apt_download([package], dest / package)
        except BuildError:
            continue
    raise BuildError(f"apt-get download failed for each of {', '.join(candidates)} "
                     "(run `apt-get update` first?)")


def deb_corpus(name: str, packages: Sequence[str], pattern: str, convert: Converter,
               license: str, first_of: bool = False) -> Callable[[Path, Path, bool], dict]:
    """A builder function: documents of the package members matching `pattern`.

    ``first_of=True`` downloads only the first of `packages` the release has."""
    MICRO_LICENSES[name] = license

    def build(out: Path, work: Path, progress: bool) -> dict:
        debs = (apt_download_first(packages, work) if first_of
                else apt_download(packages, work, progress))
        docs: list[Document] = []
        for deb in debs:
            members = deb_members(deb, pattern)
            for member, raw in progress_bar(members, progress, f"{name} {deb.name.split('_')[0]}"):
                docs.extend(convert(member, raw))
        if not docs:
            raise BuildError(f"{name}: no file matching {pattern!r} in "
                             f"{', '.join(d.name for d in debs)}")
        info = write_documents(name, docs, out)
        return {**info, "source": {"debian": sorted(d.name[:-len(".deb")] for d in debs)},
                "license": license}

    return build


# The Linux man-pages project, and the man pages of core packages (Debian's essential and
# standard tools, git, ssh, the packaging tools).
MAN_PACKAGES = ("manpages", "manpages-dev", "coreutils", "bash", "tar", "grep", "sed",
                "findutils", "diffutils", "util-linux", "procps", "psmisc", "apt", "dpkg",
                "dpkg-dev", "debhelper", "git-man", "openssh-client", "rsync", "make", "gawk",
                "systemd", "e2fsprogs", "iproute2", "less", "cron", "sudo", "gzip", "xz-utils",
                "zstd", "bzip2", "cpio", "wget", "curl", "man-db", "groff-base", "lintian",
                "devscripts", "gnupg", "gpg", "passwd", "login", "mount", "kmod", "udev")
PYTHON_DOC_PACKAGES = tuple(f"python3.{minor}-doc" for minor in range(14, 8, -1))
DEBIAN_DOC_PACKAGES = ("debian-reference-en", "developers-reference", "maint-guide",
                       "debian-faq", "debian-handbook", "debian-policy")
_DEBIAN_DOC_PATTERN = (r"^\./usr/share/(debian-reference/[^/]+\.en\.html"
                       r"|developers-reference/_sources/[^/]+\.rst\.txt"
                       r"|doc/maint-guide/html/[^/]+\.en\.html"
                       r"|doc/debian/FAQ/[^/]+\.en\.html"
                       r"|doc/debian-handbook/html/en-US/[^/]+\.html"
                       r"|doc/debian-policy/(?!README)[^/]+\.html"
                       r"|doc/debian-policy/policy\.html/_sources/[^/]+\.rst\.txt"
                       r"|doc/debian-policy/fhs/[^/]+\.html)$")
# Sphinx-built documentation whose reST sources Debian ships (`_sources/`), prose-rich and
# at most ~50 MB a package: user guides and API references of Python projects.
SPHINX_DOC_PACKAGES = ("sphinx-doc", "python-pandas-doc", "python-sklearn-doc",
                       "python-astropy-doc", "python-celery-doc", "python-sympy-doc",
                       "python-pytest-doc", "python-dask-doc", "python-xarray-doc",
                       "python-setuptools-doc", "cython-doc", "python-flask-doc",
                       "python-bottle-doc", "python-jinja2-doc", "python-werkzeug-doc",
                       "python-pygments-doc", "python-attr-doc", "python-requests-doc")
# Manuals in info form from Debian main: GNU's (GFDL without invariant sections), R's,
# Octave's, Maxima's (GPL), zsh's and gnuplot's (their own permissive licenses), MIT/GNU
# Scheme's and SBCL's.
INFO_PACKAGES = ("coreutils", "grep", "sed", "findutils", "diffutils", "gzip", "wget",
                 "bash-doc", "autoconf-doc", "automake", "libtool-doc", "flex", "screen",
                 "guile-3.0-doc", "r-doc-info", "octave-doc", "maxima-doc", "zsh-doc",
                 "gnuplot-doc", "mit-scheme-doc", "texinfo", "sbcl-doc", "gnu-standards",
                 "m4", "units", "mtools", "nano", "sharutils", "gperf", "indent", "ed", "bc")
# The Linux kernel's documentation (Sphinx, reST sources), newest release first.
LINUX_DOC_PACKAGES = ("linux-doc-6.12", "linux-doc-6.1", "linux-doc-5.10")
SERVER_DOC_PACKAGES = ("apache2-doc", "exim4-doc-html", "postfix-doc")
_SERVER_DOC_PATTERN = (r"^\./usr/share/doc/(apache2-doc/manual/en/.+|exim4-doc-html/.+"
                       r"|postfix/html/.+)\.html$")
POSTGRESQL_DOC_PACKAGES = tuple(f"postgresql-doc-{v}" for v in range(18, 12, -1))

CORPUS_BUILDERS = [
    Builder("python_docs", "Python documentation, reST sources as prose (Debian python3.X-doc)",
            ("apt-get", "dpkg-deb"),
            deb_corpus("python_docs", PYTHON_DOC_PACKAGES, r"/_sources/.+\.rst\.txt$",
                       rst_documents, "PSF License Version 2", first_of=True)),
    Builder("gcide", "GNU Collaborative International Dictionary of English (Debian "
            "dict-gcide; GPL: do not commit)", ("apt-get", "dpkg-deb"),
            deb_corpus("gcide", ("dict-gcide",), r"/dictd/gcide\.(index|dict\.dz)$",
                       dictd_converter(dictionaries.gcide_text), "GPL-2+")),
    Builder("wordnet", "WordNet 3.0 synsets: words, glosses, examples (Debian wordnet-base)",
            ("apt-get", "dpkg-deb"),
            deb_corpus("wordnet", ("wordnet-base",), r"/wordnet/data\.(noun|verb|adj|adv)$",
                       wordnet_documents, "WordNet 3.0 license (BSD-like)")),
    Builder("foldoc", "Free On-line Dictionary of Computing (Debian dict-foldoc)",
            ("apt-get", "dpkg-deb"),
            deb_corpus("foldoc", ("dict-foldoc",), r"/dictd/foldoc\.(index|dict\.dz)$",
                       dictd_converter(dictionaries.foldoc_text), "GFDL-1.1+")),
    Builder("devil", "Ambrose Bierce, The Devil's Dictionary (Debian dict-devil)",
            ("apt-get", "dpkg-deb"),
            deb_corpus("devil", ("dict-devil",), r"/dictd/devil\.(index|dict\.dz)$",
                       dictd_converter(dictionaries.plain_article), "public domain")),
    Builder("jargon", "The Jargon File 4.4.7 (Debian jargon-text)", ("apt-get", "dpkg-deb"),
            deb_corpus("jargon", ("jargon-text",), r"/jargon\.txt\.gz$", jargon_documents,
                       "public domain")),
    Builder("perl_docs", "Perl's manuals, POD as prose (Debian perl-doc)",
            ("apt-get", "dpkg-deb"),
            deb_corpus("perl_docs", ("perl-doc",), r"/usr/share/perl/[^/]+/pod/[^/]+\.pod$",
                       pod_documents, "Artistic-1 or GPL-1+")),
    Builder("man_pages", "Linux man-pages and core packages' man pages, roff as prose "
            "(Debian manpages, manpages-dev, coreutils, git-man, ...)",
            ("apt-get", "dpkg-deb"),
            deb_corpus("man_pages", MAN_PACKAGES,
                       r"/usr/share/man/man\d/[^/]+\.gz$", man_documents,
                       "Linux-man-pages-copyleft, GPL, BSD and others (free)")),
    Builder("debian_docs", "Debian's English manuals: reference, developers-reference, "
            "maint-guide, FAQ, handbook, policy (Debian)", ("apt-get", "dpkg-deb"),
            deb_corpus("debian_docs", DEBIAN_DOC_PACKAGES, _DEBIAN_DOC_PATTERN, doc_documents,
                       "GPL-2+ (reference, developers-reference, FAQ, policy), MIT-style "
                       "(maint-guide), GPL-2+ or CC-BY-SA-3.0 (handbook)")),
    Builder("postgresql_docs", "The PostgreSQL manual, HTML as prose (Debian "
            "postgresql-doc-N)", ("apt-get", "dpkg-deb"),
            deb_corpus("postgresql_docs", POSTGRESQL_DOC_PACKAGES,
                       r"/usr/share/doc/postgresql-doc-\d+/html/[^/]+\.html$", html_documents,
                       "PostgreSQL License (BSD-like)", first_of=True)),
]
CORPUS_BUILDERS += [
    Builder("commentaries", "Public-domain Bible commentaries: Spurgeon's Treasury of David, "
            "Matthew Henry's Concise, Scofield's 1917 notes (Debian sword-comm-*)",
            ("apt-get", "dpkg-deb"),
            deb_corpus("commentaries", ("sword-comm-tdavid", "sword-comm-mhcc",
                                        "sword-comm-scofield"),
                       r"/modules/comments/zcom/[^/]+/(ot|nt)\.[a-z]z[sz]$", sword_converter(),
                       "public domain")),
    Builder("sphinx_docs", "Python projects' Sphinx docs (pandas, scikit-learn, astropy, "
            "sympy, ...), reST sources as prose (Debian python-*-doc)", ("apt-get", "dpkg-deb"),
            deb_corpus("sphinx_docs", SPHINX_DOC_PACKAGES, r"/_sources/.+\.txt$",
                       doc_documents, "each project's: BSD-3-Clause (Sphinx, pandas, "
                       "scikit-learn, astropy, SymPy, Dask, xarray, Celery, Flask, Werkzeug, "
                       "Jinja, Pygments), MIT (pytest, setuptools, Bottle, attrs), Apache-2.0 "
                       "(Cython, Requests)")),
    Builder("linux_docs", "The Linux kernel's documentation, reST sources as prose (Debian "
            "linux-doc-N)", ("apt-get", "dpkg-deb"),
            deb_corpus("linux_docs", LINUX_DOC_PACKAGES,
                       r"/html/_sources/(?!translations/).+\.txt$", rst_documents, "GPL-2",
                       first_of=True)),
    Builder("server_docs", "The Apache httpd, Exim and Postfix manuals, HTML as prose "
            "(Debian apache2-doc, exim4-doc-html, postfix-doc)", ("apt-get", "dpkg-deb"),
            deb_corpus("server_docs", SERVER_DOC_PACKAGES, _SERVER_DOC_PATTERN, doc_documents,
                       "Apache-2.0 (httpd), GPL-2+ (Exim), IPL-1.0 or EPL-2.0 (Postfix)")),
    Builder("info_manuals", "Manuals in info form: coreutils, bash, autoconf, Guile, R, "
            "Octave, Maxima, zsh, gnuplot, ... (Debian)", ("apt-get", "dpkg-deb"),
            deb_corpus("info_manuals", INFO_PACKAGES, r"/usr/share/info/.+\.info(-\d+)?\.gz$",
                       info_documents, "GFDL-1.3+ without invariant sections (GNU manuals), "
                       "GPL-2+ (R, Octave, Maxima), zsh's and gnuplot's permissive licenses, "
                       "GPL/GFDL (MIT/GNU Scheme), public domain and BSD (SBCL)")),
]
BUILDERS.update((b.name, b) for b in CORPUS_BUILDERS)
