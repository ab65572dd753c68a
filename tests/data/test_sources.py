"""Sources: text/jsonl (plain, gzip, bad bytes), sharding, bundled, TFDS (mock + ArrayRecord)."""
import gzip
import importlib.util
import json
import pickle

import numpy as np
import pytest

from t2t.data.sources import (InvalidRecord, JsonlSource, ListSource, ShardedSource,
                              TextLineSource, TfdsSource)

LINES = b"first line\r\nsecond \xc3\xa9\n\nbad \xff\xfe bytes\nlast without newline"


def test_text_lines_plain_and_gzip(tmp_path):
    plain, zipped = tmp_path / "a.txt", tmp_path / "b.txt.gz"
    plain.write_bytes(LINES)
    zipped.write_bytes(gzip.compress(b"x\ny\n"))
    source = TextLineSource([plain, zipped])
    assert len(source) == 7
    assert [source[i] for i in (0, 1, 2, 4, 5, 6)] == ["first line", "second é", "",
                                                        "last without newline", "x", "y"]
    assert source[3] == InvalidRecord("undecodable", b"bad \xff\xfe bytes")
    assert source[-1] == "y"
    with pytest.raises(IndexError):
        source[7]
    clone = pickle.loads(pickle.dumps(source))  # workers get a copy without open maps
    assert [clone[i] for i in range(7)] == [source[i] for i in range(7)]
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    assert len(TextLineSource(empty)) == 0


def test_jsonl(tmp_path):
    path = tmp_path / "d.jsonl.gz"
    rows = [{"text": "a", "n": 1}, {"text": "b", "n": 2}]
    with gzip.open(path, "wt") as f:
        f.write("\n".join(json.dumps(r) for r in rows) + "\n{not json\n" + json.dumps({"n": 3}))
    assert JsonlSource(path)[1] == rows[1]
    source = JsonlSource(path, field="text")
    assert len(source) == 4 and [source[0], source[1]] == ["a", "b"]
    assert source[2].reason == "undecodable" and source[3].reason == "missing_field"


@pytest.mark.parametrize("n,count", [(10, 3), (2, 3), (100, 7), (0, 2)])
def test_sharding_covers_every_record_once(n, count):
    source = ListSource(range(n))
    shards = [ShardedSource(source, i, count) for i in range(count)]
    seen = [shard[j] for shard in shards for j in range(len(shard))]
    assert seen == list(range(n))  # no loss, no duplicate, contiguous blocks
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1
    assert [shards[-1].global_index(j) for j in range(len(shards[-1]))] == seen[n - sizes[-1]:]


def test_sharding_defaults_to_jax_process():
    shard = ShardedSource(ListSource(range(5)))
    assert (shard.process_index, shard.process_count, len(shard)) == (0, 1, 5)
    with pytest.raises(ValueError):
        ShardedSource(ListSource(range(5)), 3, 3)


def test_bundled_source_levels():
    bundled = pytest.importorskip("t2t.data.bundled")
    if not hasattr(bundled, "load"):
        pytest.skip("t2t.data.bundled.load not available yet")
    from t2t.data.sources import BundledSource

    verses = BundledSource("web")
    chapters = BundledSource("web", "chapter")
    books = BundledSource("web", "book")
    assert verses[0]["id"] == "Gen.1.1"
    assert chapters[0]["id"] == "Gen.1" and chapters[0]["verses"][0] == verses[0]["text"]
    assert len(books) >= 66 and len(verses) == sum(len(b["verses"]) for b in books)
    assert 1189 <= len(chapters) < 1500  # 1189 protestant chapters + deuterocanon


def test_tfds_mock_data():
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.testing.mock_data(num_examples=5):
        source = TfdsSource("c4/en", split="train", field="text")  # c4 needs its module import
        assert len(source) == 5 and isinstance(source[0], (str, bytes))
        glue = TfdsSource("glue/cola", split="validation")
        assert set(glue[0]) >= {"sentence", "label"}


def _tiny_builder(tfds):
    class TinyText(tfds.core.GeneratorBasedBuilder):
        """A three-split text dataset built in the test (no TensorFlow needed)."""

        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
                {"text": tfds.features.Text(), "idx": np.int64}))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(11), "validation": self._generate_examples(3)}

        def _generate_examples(self, n):
            for i in range(n):
                yield i, {"text": f"line {i} é", "idx": i}

    # tfds resolves a builder's code path from its package; for the namespace package `tests`
    # that needs `importlib_resources` (absent on Python >= 3.9), so present a top-level module.
    TinyText.__module__ = "tiny_text_builder"
    return TinyText


def test_tfds_local_array_record(tmp_path):
    tfds = pytest.importorskip("tensorflow_datasets")
    builder = _tiny_builder(tfds)(data_dir=str(tmp_path), file_format="array_record")
    builder.download_and_prepare()
    source = TfdsSource("tiny_text", split="train", data_dir=tmp_path)
    assert source.backend == "array_record" and len(source) == 11
    records = sorted((int(source[i]["idx"]), source[i]["text"]) for i in range(len(source)))
    assert records == [(i, f"line {i} é".encode()) for i in range(11)]  # Text -> bytes
    texts = TfdsSource("tiny_text", split="validation", data_dir=tmp_path, field="text")
    shards = [ShardedSource(texts, i, 2) for i in range(2)]
    assert sorted(s[j] for s in shards for j in range(len(s))) == \
        sorted(f"line {i} é".encode() for i in range(3))


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is not None,
                    reason="with TensorFlow the tfds.load fallback is taken")
def test_tfds_without_tensorflow_explains(tmp_path):
    with pytest.raises(RuntimeError, match="array_record"):
        TfdsSource("tiny_text_missing", split="train", data_dir=tmp_path)
