"""The bundled Bible texts: counts, ids, clean text, alignment, and the build script's parts."""
import gzip
import hashlib
import io
import re

import pytest

from t2t.data import bundled
from t2t.data.bundled import build_bible

EXPECTED = {"web": (37_000, 38_000), "kjv": (31_000, 31_200), "rv1909": (31_000, 31_200)}
GENESIS_1_1 = {
    "web": "In the beginning, God created the heavens and the earth.",
    "kjv": "In the beginning God created the heaven and the earth.",
    "rv1909": "En el principio crió Dios los cielos y la tierra.",
}
MARKUP = re.compile(r"[<>{}\\¶|*=_~^@#$&\x00-\x1f]|strong:[HG]|\b[HG]\d{3,4}\b|  ")


def test_names_and_paths():
    assert bundled.names() == ["kjv", "rv1909", "web"]
    assert all(bundled.path(n).is_file() for n in bundled.names())
    with pytest.raises(KeyError):
        bundled.path("nope")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus(name):
    verses = bundled.load(name)
    lo, hi = EXPECTED[name]
    assert lo <= len(verses) <= hi
    assert verses[0] == {"id": "Gen.1.1", "book": "Genesis", "chapter": 1, "verse": 1,
                         "text": GENESIS_1_1[name]}
    ids = [v["id"] for v in verses]
    assert len(set(ids)) == len(ids)
    assert verses[-1]["book"] == "Revelation"
    for v in verses:
        assert v["id"] == f"{build_bible.BOOKS_BY_NAME[v['book']]}.{v['chapter']}.{v['verse']}"
        assert v["text"] and v["text"] == v["text"].strip()
        assert not MARKUP.search(v["text"]), (v["id"], v["text"])
    assert bundled.load(name) == verses  # cached


def test_aligned():
    pairs = bundled.aligned("web", "rv1909")
    assert 30_900 <= len(pairs) <= 31_200
    assert all(a["id"] == b["id"] and a["text"] and b["text"] for a, b in pairs)
    assert pairs[0][1]["text"] == GENESIS_1_1["rv1909"]
    assert 30_900 <= len(bundled.aligned("kjv", "web")) <= 31_200


def test_readme_lists_current_checksums():
    readme = (bundled.path("web").parent / "README.md").read_text()
    for name in bundled.names():
        digest = hashlib.sha256(bundled.path(name).read_bytes()).hexdigest()
        assert digest in readme, f"README.md is stale for {name}: rerun build_bible"


IMP = """$$$[ Module Heading ]
<milestone type="x-importer"/>
$$$Genesis 0:0
<div osisID="Gen" type="book" sID="b1"/><title type="main">Genesis</title>
$$$Genesis 1:0
<chapter n="1" osisID="Gen.1" sID="Gen.1"/>
$$$Genesis 1:1
<w lemma="strong:H0430">In</w> <w lemma="strong:H7225">beginning</w>, <w lemma="strong:H0430">God</w><note placement="foot"><reference type="annotateRef">1:1 </reference>Elohim.</note><w lemma="strong:H1254">created</w>.
$$$Genesis 1:2
<div type="x-milestone" subType="x-preverse" sID="pv1"/><title type="x-sub">A heading</title><div type="x-milestone" eID="pv1"/>¶ The \\nd <w>LORD</w>\\+nd* said<note n="a">x <note>nested</note> y</note>, “go <q>now</q> <note>n</note> ?”
$$$Genesis 1:3
<speaker>Beloved</speaker>   spaced
   out &amp; more
$$$Revelation of John 22:21
Amen. <chapter eID="Rev.22"/><div canonical="true" eID="b9" osisID="Rev" type="book"/> <div type="glossary"/>Glossary text.
"""


def test_parse_and_clean_synthetic_osis():
    entries = list(build_bible.parse_imp(io.StringIO(IMP)))
    assert [e[:3] for e in entries] == [("Genesis", 0, 0), ("Genesis", 1, 0), ("Genesis", 1, 1),
                                        ("Genesis", 1, 2), ("Genesis", 1, 3),
                                        ("Revelation of John", 22, 21)]
    verses = build_bible.verses("web", IMP)
    assert [v["id"] for v in verses] == ["Gen.1.1", "Gen.1.2", "Gen.1.3", "Rev.22.21"]
    texts = [v["text"] for v in verses]
    assert texts == ["In beginning, God created.", "The LORD said, “go now?”", "spaced out & more",
                     "Amen."]
    assert verses[-1]["book"] == "Revelation"


def test_rv1909_fixes():
    raw = ('<w>siempre</w><transChange type="added">es</transChange><w>su</w> '
           '<w>oyéndo</w><transChange type="added">lo</transChange> '
           '<w>Josué</w><transChange type="added">los</transChange> circuncidó')
    assert build_bible.clean_osis(raw) == "siempre es su oyéndolo Josué los circuncidó"
    from collections import Counter
    counts = Counter({"fueron": 50, "Fueron": 2, "Jehová": 90})
    assert build_bible._fix_drop_cap("Y FUERON acabados", counts) == "Y fueron acabados"
    assert build_bible._fix_drop_cap("Y JEHOVÁ dijo", counts) == "Y Jehová dijo"
    assert build_bible._fix_drop_cap("EN el principio", counts) == "En el principio"
    assert build_bible._fix_drop_cap("ESTE ES JESUS", counts) == "ESTE ES JESUS"


def test_gzip_output_is_reproducible(tmp_path):
    records = [{"id": "Gen.1.1", "text": "ñ"}]
    a, b = tmp_path / "a.jsonl.gz", tmp_path / "b.jsonl.gz"
    build_bible.write_jsonl_gz(records, a)
    build_bible.write_jsonl_gz(records, b)
    assert a.read_bytes() == b.read_bytes()
    assert gzip.decompress(a.read_bytes()).decode() == '{"id": "Gen.1.1", "text": "ñ"}\n'


def test_the_default_vocabularies_ship_and_load_without_training(monkeypatch):
    """The 8,000-piece SentencePiece and WordPiece of the bundled Bible come with t2t: loaded,
    not trained (the same ids on every machine), made with the settings training uses."""
    from sentencepiece import sentencepiece_model_pb2

    from t2t.data.catalog import bible
    from t2t.data.vocab import SentencePieceVocabulary, WordPieceVocabulary

    def no_training(*args, **kwargs):
        raise AssertionError("trained a vocabulary that ships with t2t")
    monkeypatch.setattr(SentencePieceVocabulary, "train", no_training)
    monkeypatch.setattr(WordPieceVocabulary, "train", no_training)
    bible.bible_sentencepiece.cache_clear()
    bible.bible_wordpiece.cache_clear()
    try:
        spm, wordpiece = bible.bible_sentencepiece(), bible.bible_wordpiece()
    finally:
        bible.bible_sentencepiece.cache_clear()
        bible.bible_wordpiece.cache_clear()
    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(spm.model_proto)
    spec = model.trainer_spec
    assert (len(model.pieces), spec.vocab_size, spec.model_type, spec.byte_fallback) == (
        8000, 8000, spec.UNIGRAM, True)
    assert (spec.pad_id, spec.eos_id, spec.unk_id, spec.bos_id, spec.num_threads) == (
        0, 1, 2, -1, 1)
    assert spec.model_prefix == "bible_web_rv1909_spm_8000"     # not a temporary path
    verse = "En el principio crió Dios los cielos y la tierra."
    assert spm.decode(spm.encode(verse)) == verse
    assert wordpiece.vocab_size >= 8000
    assert wordpiece.decode(wordpiece.encode("In the beginning, God created")) == \
        "in the beginning, god created"


@pytest.mark.slow
def test_the_shipped_sentencepiece_is_what_training_makes(tmp_path):
    """SentencePiece training (one thread, a fixed seed) is deterministic: retrained, the
    bundled model comes out byte for byte. (WordPiece training is not: `tokenizers` orders
    pieces of equal count differently run to run, the same set; the shipped file fixes it.)"""
    from t2t.data.catalog import bible
    fresh = bible.train_sentencepiece(tmp_path, 8000).read_bytes()
    assert fresh == bundled.vocabulary_path(bible.sentencepiece_name(8000)).read_bytes()
