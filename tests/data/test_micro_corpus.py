"""The micro corpus: markup and dictionary parsers on handcrafted samples, a source built
end to end from a small fake .deb, the combined corpus's split, and its tasks."""
import gzip
import json
import shutil
import struct
import subprocess
import zlib

import numpy as np
import pytest

from t2t.data.catalog import builders as B
from t2t.data.catalog import corpora, dictionaries, markup, micro, sword
from t2t.data.sources import split_of
from t2t.data.tasks import get_task

# ----------------------------------------------------------------------------- reST

RST = """\
:mod:`json` --- JSON encoder
============================

.. module:: json
   :synopsis: Encode and decode JSON.

`JSON <https://json.org>`_, specified by :rfc:`7159`, is **light** and *simple* [#f1]_.
See :func:`~json.dumps` and :ref:`the guide <json-guide>`, or ``json.loads``.

Encoding basic objects::

    >>> json.dumps([1, 2])
    '[1, 2]'

.. function:: dump(obj, fp, *, skipkeys=False, \\
                   indent=None)

   Serialize *obj* to *fp*.

   .. versionchanged:: 3.6
      All optional parameters are keyword-only.

.. code-block:: python

   print("dropped")

>>> 1 + 1
2

* First item
  continues here.
* Second item.

+------+------+
| grid | cell |
+------+------+

.. note::
   Keep this note.

.. [#f1] A footnote that is dropped.
.. _json-guide:

Trailing paragraph with a path like C:\\\\Temp and a tab "\\t".
"""


def test_rst_to_text():
    assert markup.rst_to_text(RST).split("\n") == [
        "json --- JSON encoder",
        "JSON, specified by RFC 7159, is light and simple. See dumps and the guide, or "
        "json.loads.",
        "Encoding basic objects:",
        "Serialize obj to fp.",
        "Changed in version 3.6: All optional parameters are keyword-only.",
        "First item continues here.",
        "Second item.",
        "Keep this note.",
        'Trailing paragraph with a path like C:\\Temp and a tab "\\t".',
    ]


# ----------------------------------------------------------------------------- POD, roff, HTML

POD = """\
=head1 NAME

perlfoo - a B<bold> I<idea>

=head2 Use C<< $x->y >> and L<perlre|perlre/"Modifiers">

Text with E<lt>tagE<gt> and S<no break>X<index>.

    my $code = "dropped";

=begin html

<p>dropped</p>

=end html

=over 4

=item * An item

=back

=cut

sub not_pod { 1 }
"""


def test_pod_to_text():
    assert markup.pod_to_text(POD).split("\n") == [
        "NAME", "perlfoo - a bold idea", "Use $x->y and perlre",
        "Text with <tag> and no break.", "An item"]


ROFF = r""".\" a comment
.TH READ 2 2022-12-04 "Linux man-pages"
.SH NAME
read \- read from a file descriptor
.SH SYNOPSIS
.nf
.B #include <unistd.h>
.fi
.SH DESCRIPTION
.BR read ()
attempts to read up to
.I count
bytes\(emor fewer.
.PP
.RI ( libc ", " \-lc )
uses \fBbold\fP and \fIitalic\fR.
"""


def test_roff_to_text():
    assert markup.roff_to_text(ROFF).split("\n") == [
        "Name", "read - read from a file descriptor", "Synopsis", "Description",
        "read() attempts to read up to count bytes\u2014or fewer.",
        "(libc, -lc) uses bold and italic."]


HTML = """<html><head><title>dropped title</title><style>p {}</style></head><body>
<div class="navheader"><table><tr><td>Prev</td><td>Next</td></tr></table></div>
<h1>F.2. amcheck</h1><p>The <code>amcheck</code> module
verifies &ldquo;relations&rdquo;.<br>Second line.</p>
<pre class="programlisting">SELECT 1;</pre>
<ul><li>One</li><li>Two <em>items</em></li></ul>
<div class="navfooter">Home</div></body></html>"""


def test_html_to_text():
    assert markup.html_to_text(HTML).split("\n") == [
        "F.2. amcheck", "The amcheck module verifies \u201crelations\u201d.", "Second line.",
        "One", "Two items"]


INFO = """This is grep.info, produced by makeinfo version 6.7 from grep.texi.

INFO-DIR-SECTION Text creation and manipulation
START-INFO-DIR-ENTRY
* grep: (grep).                 Print lines that match patterns.
END-INFO-DIR-ENTRY

\x1f
File: grep.info,  Node: Usage,  Next: Performance,  Prev: Invoking,  Up: Top

2.1 Usage
=========

Here is an example command that invokes GNU 'grep':

     grep -i 'hello.*world' menu.h main.c

   This lists all lines, as *note Invoking::.  See the
manual(1) and *note Regular Expressions: Regexps. for more.

'-V'
'--version'
     Print the version number of 'grep' to the standard output stream.

* Menu:

* Basic usage::     How to use it.
* Advanced::        More.
                    Continued.

   ---------- Footnotes ----------

   (1) A footnote.

\x1f
File: grep.info,  Node: GNU Free Documentation License,  Prev: Usage,  Up: Top

   Everyone is permitted to copy and distribute verbatim copies.

\x1f
File: grep.info,  Node: Index,  Prev: Usage,  Up: Top

* grep:     Usage.     (line 6)
\x1f
Tag Table:
Node: Usage97
\x1f
End Tag Table
"""


def test_info_to_text():
    assert markup.info_to_text(INFO).split("\n") == [
        "2.1 Usage", "Here is an example command that invokes GNU 'grep':",
        "This lists all lines, as Invoking. See the manual and Regular Expressions for more.",
        "'-V' '--version' Print the version number of 'grep' to the standard output stream.",
        "(1) A footnote."]


# ----------------------------------------------------------------------------- dictionaries


def b64(n):
    digits = ""
    while True:
        digits = dictionaries._B64[n % 64] + digits
        n //= 64
        if not n:
            return digits


GCIDE = [
    ("00-database-info", "This file was converted... GPL notice.\n"),
    ("Caloric", 'Caloric \\Ca*lor"ic\\, a.\n   Of or pertaining to {caloric}.\n'
                "   [1913 Webster]\n\n   {Caloric engine}, a kind of engine operated by\n"
                "      heated air.\n      [1913 Webster]\n"),
    ("Calorification", "Calorification \\Ca*lor`i*fi*ca\"tion\\\n"
                       "   (k[.a]*l[o^]r`[i^]*f[i^]*k[=a]\"sh[u^]n), n. [Cf. F.\n"
                       "   calorification, calorif[`e]re.]\n   Production of heat, at "
                       "0[deg].\n   [1913 Webster +PJC]\n"),
]


def dictd(entries, extra_heads=()):
    """A dictd database: (index text, data bytes); `extra_heads` index an entry again."""
    data, index = b"", []
    for head, text in entries:
        raw = text.encode()
        index.append((head, len(data), len(raw)))
        data += raw
    for head, of in extra_heads:
        index.append((head,) + next(i[1:] for i in index if i[0] == of))
    lines = "".join(f"{h}\t{b64(o)}\t{b64(n)}\n" for h, o, n in sorted(index))
    return lines, data


def test_dictd_number():
    assert dictionaries.dictd_number("Bdh") == 1 * 4096 + 29 * 64 + 33
    assert all(dictionaries.dictd_number(b64(n)) == n for n in (0, 63, 64, 123456789))


def test_dictd_articles_and_gcide_text():
    index, data = dictd(GCIDE, extra_heads=[("Caloric engine", "Caloric")])
    articles = dictionaries.dictd_articles(index, data)
    assert [h for h, _ in articles] == ["Caloric", "Calorification"]  # 00-* and repeats gone
    assert [dictionaries.gcide_text(a) for _, a in articles] == [
        "Caloric, a. Of or pertaining to caloric.\n"
        "Caloric engine, a kind of engine operated by heated air.",
        "Calorification, n. [Cf. F. calorification, calorif\u00e8re.] "
        "Production of heat, at 0\u00b0.",
    ]


def test_foldoc_and_jargon_and_wordnet():
    assert dictionaries.foldoc_text(
        "actor\n\n   1. <programming> In {object-oriented} programming, an\n   {object}.\n\n"
        "   (1994-11-08)\n") == "actor\n1. (programming) In object-oriented programming, an object."
    jargon = ("   The Jargon File\n\n   Front matter, not an entry.\n\n"
              "   :bar: n.\n\n   The second {metasyntactic variable}, after\n   foo.\n\n"
              "   :baz: /baz/, n.\n\n   The third.\n")
    assert list(dictionaries.jargon_entries(jargon)) == [
        {"id": "00000", "title": "bar",
         "text": "bar: n.\nThe second metasyntactic variable, after foo."},
        {"id": "00001", "title": "baz", "text": "baz: /baz/, n.\nThe third."}]
    data = ("  1 This software and database is being provided to you, the LICENSEE\n"
            "00001740 03 n 01 entity 0 003 ~ 00001930 n 0000 | that which is perceived "
            "or known or inferred to have its own distinct existence  \n"
            "00002098 00 a 02 able(a) 0 capable 0 000 | (usually followed by `to') having "
            'the necessary means; "able to swim"  \n')
    assert list(dictionaries.wordnet_synsets(data, "noun"))[0] == {
        "id": "n00001740", "title": "entity", "text": "entity: that which is perceived or "
        "known or inferred to have its own distinct existence"}
    assert list(dictionaries.wordnet_synsets(data, "adj"))[1]["text"] == (
        "able, capable: (usually followed by `to') having the necessary means; \"able to swim\"")


# ----------------------------------------------------------------------------- SWORD


def test_sword_commentary_blocks_to_documents():
    blocks = [b'<div osisID="Ps" type="book" sID="g1"/> Preface <div eID="g1"/>'
              b'<div sID="g2" type="x-p"/>My <hi type="italic">Preface</hi> is brief'
              b'<note n="a">a note</note>. <div eID="g2"/>',
              b"", "<p>Psalm 2 &amp; OVERVIEW</p><p>We shall not err.</p>".encode()]
    data, index = b"", b""
    for block in blocks:
        packed = zlib.compress(block) if block else b""
        index += struct.pack("<3I", len(data), len(packed), len(block))
        data += packed
    assert sword.zcom_blocks(index, data) == [blocks[0].decode(), blocks[2].decode()]
    assert [sword.osis_text(b) for b in sword.zcom_blocks(index, data)] == [
        "Preface\nMy Preface is brief.", "Psalm 2 & OVERVIEW\nWe shall not err."]
    convert = corpora.sword_converter()
    root = "./usr/share/sword/modules/comments/zcom/tdavid/ot.cz"
    assert list(convert(root + "s", index)) == [] and list(convert(root + "v", b"x")) == []
    docs = list(convert(root + "z", data))
    assert [(d["id"], d["title"]) for d in docs] == [("tdavid/ot-000", "Preface"),
                                                     ("tdavid/ot-001", "Psalm 2 & OVERVIEW")]


# ----------------------------------------------------------------------------- a source, built


def fake_deb(tmp_path, package, files):
    """A real .deb of `files` ({path under /usr/share: bytes}) made with dpkg-deb."""
    root = tmp_path / f"{package}-root"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: {package}\nVersion: 1.0\nArchitecture: all\nMaintainer: t <t@t>\n"
        "Description: test\n")
    for path, raw in files.items():
        (root / "usr/share" / path).parent.mkdir(parents=True, exist_ok=True)
        (root / "usr/share" / path).write_bytes(raw)
    deb = tmp_path / f"{package}_1.0_all.deb"
    subprocess.run(["dpkg-deb", "-Znone", "--build", str(root), str(deb)], check=True,
                   capture_output=True)
    return deb


@pytest.fixture
def fake_apt(tmp_path, monkeypatch):
    """`apt-get download P` copies debs/P_*.deb (made by the test) into the directory."""
    debs = tmp_path / "debs"
    debs.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apt-get").write_text(
        f'#!/bin/sh\nshift\nfor p in "$@"; do cp {debs}/"$p"_*.deb . || exit 100; done\n')
    (bin_dir / "apt-get").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return debs


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs Debian's dpkg-deb")
def test_gcide_builds_from_a_deb(tmp_path, fake_apt):
    index, data = dictd(GCIDE)
    fake_deb(fake_apt, "dict-gcide", {"dictd/gcide.index": index.encode(),
                                      "dictd/gcide.dict.dz": gzip.compress(data)})
    out = B.build("gcide", data_dir=tmp_path / "data", progress=False)
    m = B.manifest("gcide", tmp_path / "data")
    assert m["source"] == {"debian": ["dict-gcide_1.0_all"]} and m["license"] == "GPL-2+"
    records = [json.loads(line) for s in ("train", "validation")
               for line in (out / f"{s}.jsonl").open()]
    assert sorted(r["title"] for r in records) == ["Caloric", "Calorification"]
    assert sum(m["counts"].values()) == 2 and sum(m["words"].values()) == sum(
        len(r["text"].split()) for r in records)
    for split in ("train", "validation"):
        for line in (out / f"{split}.jsonl").open():
            assert corpora.split_name("gcide", json.loads(line)["id"]) == split


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs Debian's dpkg-deb")
def test_python_docs_takes_the_first_release_found(tmp_path, fake_apt):
    fake_deb(fake_apt, "python3.11-doc", {
        "doc/python3.11/html/_sources/library/json.rst.txt": RST.encode(),
        "doc/python3.11/html/_sources/api/json.stub.rst.txt": b"json.stub\n=========\n",
        "doc/python3.11/html/_static/x.js": b"var x;"})
    fake_deb(fake_apt, "python3.9-doc", {"doc/python3.9/html/_sources/old.rst.txt": b"Old."})
    out = B.build("python_docs", data_dir=tmp_path / "data", progress=False)
    records = [json.loads(line) for s in ("train", "validation")
               for line in (out / f"{s}.jsonl").open()]
    assert [r["id"] for r in records] == ["library/json"]  # the one-word stub is dropped
    assert records[0]["text"] == markup.rst_to_text(RST)
    assert B.manifest("python_docs", tmp_path / "data")["source"] == {
        "debian": ["python3.11-doc_1.0_all"]}


# ----------------------------------------------------------------------------- micro_corpus


def fake_built(root, name, records):
    """A dataset as `t2t data build` leaves it: split files and a manifest."""
    out = root / name
    out.mkdir(parents=True)
    B.write_splits(records, lambda r: r["id"], out, "whatever")
    (out / B.MANIFEST).write_text(json.dumps({"source": {"test": name}, "counts": {}}))


@pytest.fixture
def micro_root(tmp_path, monkeypatch):
    """A data root with two fake built sources, micro_corpus reading only them and WEB."""
    root = tmp_path / "data"
    fake_built(root, "sotu", [{"id": f"{1800 + i}", "text": f"Address {i}. " * 5}
                              for i in range(40)])
    fake_built(root, "gcide", [{"id": f"{i:06d}", "text": f"Word{i}, n. A thing."}
                               for i in range(400)] + [{"id": "empty", "text": " "}])
    monkeypatch.setattr(micro, "MICRO_SOURCES", ("sotu", "gcide"))
    monkeypatch.setattr(micro, "BIBLES", ("web",))
    monkeypatch.setenv("T2T_DATA_DIR", str(root))
    return root


def corpus(root):
    return {s: [json.loads(line) for line in (root / micro.NAME / f"{s}.jsonl").open()]
            for s in ("train", "validation")}


def test_micro_corpus_split_is_by_document_deterministic_and_disjoint(micro_root):
    B.build(micro.NAME, progress=False)
    first = corpus(micro_root)
    B.build(micro.NAME, force=True, progress=False)
    assert corpus(micro_root) == first
    ids = {s: [r["id"] for r in first[s]] for s in first}
    assert not set(ids["train"]) & set(ids["validation"])
    n = len(ids["train"]) + len(ids["validation"])
    assert n == 1388 + 40 + 400 and len(set(ids["train"] + ids["validation"])) == n
    assert 0.03 < len(ids["validation"]) / n < 0.07
    for split, records in first.items():
        for r in records:
            assert split_of(r["id"], *corpora.MICRO_SPLIT) == split
            assert r["id"].split("/")[0] == r["source"]
    m = B.manifest(micro.NAME)
    assert m["counts"] == {s: len(r) for s, r in first.items()}
    assert set(m["sources"]) == {"bible", "sotu", "gcide"}
    assert sum(m["sources"]["gcide"]["documents"].values()) == 400
    assert m["sources"]["gcide"]["words"]["validation"] == 4 * sum(
        r["source"] == "gcide" for r in first["validation"])


def test_micro_corpus_names_the_source_that_fails(micro_root, monkeypatch):
    monkeypatch.setattr(micro, "MICRO_SOURCES", ("sotu", "devil"))
    monkeypatch.setenv("PATH", str(micro_root))  # no apt-get
    with pytest.raises(B.BuildError, match=r"source 'devil' failed .*`t2t data build devil`"):
        B.build(micro.NAME, progress=False)


def test_unbuilt_corpus_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setenv("T2T_DATA_DIR", str(tmp_path))
    for name in ("micro_span_corruption", "micro_lm", "micro_mlm_validation"):
        with pytest.raises(B.BuildError) as e:
            len(get_task(name).source)
        assert str(e.value) == ("dataset 'micro_corpus' is not built: run "
                                "`t2t data build micro_corpus`")


def test_micro_tasks_read_their_split(micro_root, spm):
    B.build(micro.NAME, progress=False)
    tasks = {t.name: t for split in ("train", "validation")
             for t in micro.micro_tasks(split, sentencepiece=spm)}
    assert {"micro_span_corruption", "micro_lm", "micro_prefix_lm", "micro_iid_15_u_u",
            "micro_mlm", "micro_mlm_nsp", "micro_ltr", "micro_lm_validation"} <= set(tasks)
    first = corpus(micro_root)
    for split, suffix in (("train", ""), ("validation", "_validation")):
        task = tasks["micro_lm" + suffix]
        assert [task.source[i]["id"] for i in range(len(task.source))] == [
            r["id"] for r in first[split]]
        documents = tasks["micro_mlm" + suffix].source
        assert documents[0]["verses"] and documents[0]["id"] == first[split][0]["id"]
    examples = tasks["micro_lm"].preprocess(tasks["micro_lm"].source[0], (0,),
                                            {"inputs": 32, "targets": 32})
    assert examples and all(np.asarray(e["targets"]).size for e in examples)
    assert spm.decode(examples[0]["targets"].tolist()).startswith(first["train"][0]["text"][:20])


def test_every_source_has_a_builder_and_license():
    assert set(micro.MICRO_SOURCES) <= set(B.BUILDERS) and micro.NAME in B.BUILDERS
    assert {"bible", *micro.MICRO_SOURCES} <= set(corpora.MICRO_LICENSES)
