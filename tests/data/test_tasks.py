"""Task registry, lazy vocabularies, the bible tasks end to end (with fake vocabularies)."""
import functools
import subprocess
import sys
import zlib

import numpy as np
import pytest

from t2t.data import tasks as T
from t2t.data.catalog import bible
from t2t.data.converters import EncDecConverter, EncoderConverter, LMConverter, PrefixLMConverter
from t2t.data.pipeline import take
from t2t.data.sources import ListSource


class FakeSentencePiece:
    """Word-hash vocabulary with T5 conventions: pad 0, eos 1, unk 2, sentinels at the top."""

    pad_id, eos_id, unk_id, vocab_size = 0, 1, 2, 1000

    def encode(self, text):
        return [3 + zlib.crc32(w.encode()) % 800 for w in text.split()]

    def sentinel_id(self, k):
        return self.vocab_size - 1 - k


class FakeWordPiece:
    """Word-hash WordPiece: words longer than five letters become two sub-tokens."""

    pad_id, unk_id, cls_id, sep_id, mask_id, eos_id, vocab_size = 0, 1, 2, 3, 4, None, 600

    def tokenize_words(self, text):
        ids = [5 + zlib.crc32(w.lower().encode()) % 500 for w in text.split()]
        return [[i, 505 + i % 90] if len(w) > 5 else [i] for i, w in zip(ids, text.split())]

    def encode(self, text, add_special_tokens=True):
        ids = [t for w in self.tokenize_words(text) for t in w]
        return [self.cls_id, *ids, self.sep_id] if add_special_tokens else ids


TEXTS = [" ".join(f"w{(i * 31 + j) % 97}" for j in range(5 + (i * 13) % 90)) for i in range(40)]


def test_unknown_task_lists_close_matches():
    with pytest.raises(KeyError) as error:
        T.get_task("bible_web_lmm")
    message = str(error.value)
    assert "Did you mean 'bible_web_lm'" in message and "bible_web_span_corruption" in message


def test_registry_round_trip():
    task = T.Task("test_registry_task", functools.partial(ListSource, TEXTS), [T.tokenize])
    assert T.register_task(task) is task and T.get_task("test_registry_task") is task
    with pytest.raises(ValueError, match="already registered"):
        T.register_task(task)
    T.register_task(task, overwrite=True)
    T.remove_task("test_registry_task")
    assert "test_registry_task" not in T.registered_tasks()
    expected = {"bible_web_span_corruption", "bible_web_lm", "bible_web_prefix_lm",
                "bible_web_mlm_nsp", "bible_web_iid_15_b_f", "bible_web_all_permute"}
    assert expected <= set(T.registered_tasks())


def test_vocabulary_is_lazy():
    # Importing trains nothing: checked in a fresh process, as other tests in this worker
    # may already have built the vocabulary.
    code = ("import t2t.run.finetune, t2t.data.tasks as T; T.registered_tasks(); "
            "from t2t.data.catalog import bible; "
            "assert bible.bible_sentencepiece.cache_info().currsize == 0")
    subprocess.run([sys.executable, "-c", code], check=True)
    calls = []

    def build():
        calls.append(1)
        return FakeSentencePiece()

    task = T.Task("lazy", functools.partial(ListSource, TEXTS), [T.tokenize], build)
    assert task.built_vocabulary is None and calls == []      # asking does not build it
    assert task.vocabulary is task.vocabulary and calls == [1]
    assert task.built_vocabulary is task.vocabulary


def test_preprocess_seeds_and_flattening():
    seen = []

    def fan_out(example, *, seed):
        seen.append(seed)
        return [{"tokens": example["tokens"][:2]}, {"tokens": example["tokens"][2:4]}]

    def drop_second(example, *, seed):
        seen.append(seed)
        return None if example["tokens"][0] == 7 else example

    task = T.Task("seeds", functools.partial(ListSource, ["x"]),
                  [lambda record: {"tokens": np.array([5, 6, 7, 8])}, fan_out, drop_second])
    assert [e["tokens"].tolist() for e in task.preprocess("x", (1, 0, 9))] == [[5, 6]]
    assert seen == [(1, 0, 9, 1, 0), (1, 0, 9, 2, 0), (1, 0, 9, 2, 1)]


def _fake_task(task_name, vocabulary, records=None):
    """A registered task's recipe with a fake vocabulary (and optionally other records)."""
    task = T.get_task(task_name)
    source_fn = task.source_fn if records is None else functools.partial(ListSource, records)
    return T.Task(task_name + "_fake", source_fn, task.preprocessors, vocabulary)


def test_span_corruption_task_pipeline():
    task = _fake_task("bible_web_span_corruption", FakeSentencePiece(),
                      [{"text": t} for t in TEXTS])
    it = task.get_pipeline(EncDecConverter({"inputs": 64, "targets": 16}), 4, 0, num_epochs=1,
                           process_index=0, process_count=1)
    batches = list(it)
    inputs = np.concatenate([b["encoder_input_tokens"] for b in batches])
    assert (inputs == 999).sum() > 0 and inputs.max() <= 999
    assert it.stats["truncated"] == 0  # chunks of 70 raw tokens fit 64 + 16 exactly
    assert it.stats["examples"] > len(TEXTS) and it.stats["packing_efficiency"]["inputs"] > 0.8


def test_bible_tasks_end_to_end():
    bundled = pytest.importorskip("t2t.data.bundled")
    if not hasattr(bundled, "load"):
        pytest.skip("bundled corpora not available")
    vocab = FakeSentencePiece()
    cases = [("bible_web_span_corruption", EncDecConverter({"inputs": 128, "targets": 32})),
             ("bible_web_lm", LMConverter({"targets": 128})),
             ("bible_web_prefix_lm", PrefixLMConverter({"inputs": 64, "targets": 64})),
             ("bible_web_iid_15_b_f", EncDecConverter({"inputs": 128, "targets": 128}))]
    for name, converter in cases:
        it = _fake_task(name, vocab).get_pipeline(converter, 4, 0, process_index=0,
                                                  process_count=1)
        batch = next(it)
        assert set(batch) == set(converter.empty_batch(1)), name
        assert batch[next(iter(batch))].shape[0] == 4
        assert it.stats["truncated"] == 0 and not it.stats["skipped"], (name, it.stats)
        assert min(it.stats["packing_efficiency"].values()) > 0.5, (name, it.stats)


def test_bert_mlm_nsp_task():
    bundled = pytest.importorskip("t2t.data.bundled")
    if not hasattr(bundled, "load"):
        pytest.skip("bundled corpora not available")
    task = _fake_task("bible_web_mlm_nsp", FakeWordPiece())
    converter = EncoderConverter({"inputs": 128, "max_predictions": 20})
    batches = take(task.get_pipeline(converter, 16, 0, process_index=0, process_count=1), 4)
    labels = np.concatenate([b["next_sentence_labels"] for b in batches])
    assert 0 < labels.mean() < 1
    for b in batches:
        tokens = b["encoder_input_tokens"]
        # [CLS] A [SEP] B [SEP]
        assert np.all(tokens[:, 0] == 2) and np.all((tokens == 3).sum(1) == 2)
        rows = np.arange(len(tokens))[:, None]
        picked = tokens[rows, b["masked_positions"]]
        weights = b["masked_weights"] > 0
        assert np.all(weights.sum(1) >= 10)
        assert abs((picked[weights] == 4).mean() - 0.8) < 0.1  # mostly [MASK]
        assert np.all(b["token_type_ids"][:, 0] == 0) and np.all(b["token_type_ids"].max(1) == 1)


def _bundled():
    bundled = pytest.importorskip("t2t.data.bundled")
    if not hasattr(bundled, "load"):
        pytest.skip("bundled corpora not available")


def test_bible_splits_are_disjoint_and_cover_web():
    _bundled()
    from t2t.data.sources import BundledSource

    every = [c["id"] for c in BundledSource("web", "chapter")]
    train = [c["id"] for c in bible.BibleSplit("chapter", "train")]
    held = [c["id"] for c in bible.BibleSplit("chapter", "validation")]
    assert not set(train) & set(held) and sorted(train + held) == sorted(every)
    assert 0.03 < len(held) / len(every) < 0.07
    assert held == [c["id"] for c in bible.BibleSplit("chapter", "validation")]  # deterministic
    assert held != [c["id"] for c in bible.BibleSplit("chapter", "validation", seed="x")]
    # Book level (BERT documents): the same verses as the chapter level, split the same way.
    for split in ("train", "validation"):
        books = bible.BibleSplit("book", split)
        assert len({b["id"] for b in books}) == len(books)
        assert ([v for b in books for v in b["verses"]]
                == [v for c in bible.BibleSplit("chapter", split) for v in c["verses"]])
    ids = [b["id"] for b in bible.BibleSplit("book", "train")]
    assert ids[:2] == ["Gen.1-23", "Gen.25-26"] and "2Sam" in ids   # runs; a whole book
    # Every registered bible pretraining task has a held-out twin; tasks read their split.
    names = set(T.registered_tasks())
    trained = {n for n in names if n.startswith("bible_web_") and not n.endswith("_validation")}
    assert {"bible_web_mlm", "bible_web_mlm_nsp", "bible_web_ltr", "bible_web_lm"} <= trained
    assert {f"{n}_validation" for n in trained} <= names
    for name, expected in (("bible_web_lm", train), ("bible_web_lm_validation", held)):
        assert [r["id"] for r in T.get_task(name).source] == expected
    ltr = T.get_task("bible_web_ltr_validation")
    assert {r["id"] for r in ltr.source} == {b["id"] for b in bible.BibleSplit("book", "validation")}


def test_next_token_targets():
    ex = T.next_token_targets([2, 7, 8, 9, 3])
    assert ex["inputs"].tolist() == [2, 7, 8, 9, 3]
    assert ex["masked_positions"].tolist() == [0, 1, 2, 3]
    assert ex["masked_ids"].tolist() == [7, 8, 9, 3]          # the inputs shifted by one
    assert ex["masked_weights"].tolist() == [1, 1, 1, 1]
    assert ex["token_type_ids"].tolist() == [0] * 5


def test_bert_ltr_task():
    _bundled()
    vocab = FakeWordPiece()
    task = _fake_task("bible_web_ltr", vocab)
    # Rows [CLS] text [SEP] of `inputs` tokens (the last shorter): the book's verses in order.
    record = task.source[0]
    examples = task.preprocess(record, (0,), {"inputs": 64, "max_predictions": 64})
    flat = [t for v in record["verses"] for t in vocab.encode(v, add_special_tokens=False)]
    assert [t for e in examples for t in e["inputs"][1:-1]] == flat
    assert [len(e["inputs"]) for e in examples[:-1]] == [64] * (len(examples) - 1)
    assert all(e["inputs"][0] == 2 and e["inputs"][-1] == 3 for e in examples)
    # Through the (packing) converter the MLM features say: predict the next token.
    converter = EncoderConverter({"inputs": 64, "max_predictions": 64}, pack=True, nsp=False)
    it = task.get_pipeline(converter, 8, 0, process_index=0, process_count=1)
    for b in take(it, 3):
        assert "next_sentence_labels" not in b
        tokens, seg = b["encoder_input_tokens"], b["encoder_segment_ids"]
        rows = np.arange(len(tokens))[:, None]
        w = b["masked_weights"] > 0
        pos = b["masked_positions"]
        np.testing.assert_array_equal(b["masked_ids"][w], tokens[rows, pos + 1][w])
        assert np.all(seg[rows, pos][w] == seg[rows, pos + 1][w])   # never across examples
        # every real token with a next token of its own example is a target
        has_next = (seg[:, :-1] > 0) & (seg[:, :-1] == seg[:, 1:])
        assert w.sum() == has_next.sum()
        assert not np.any(tokens == vocab.mask_id)                  # nothing masked
    assert it.stats["truncated"] == 0 and it.stats["packing_efficiency"]["inputs"] > 0.97


def test_mixture_interleaves_by_rate():
    def task(name, offset):
        records = [" ".join(f"t{offset + i}" for _ in range(3)) for i in range(8)]
        return T.Task(name, functools.partial(ListSource, records), [T.tokenize, T.lm_chunks],
                      FakeSentencePiece())

    a, b = task("mix_a", 0), task("mix_b", 100)
    vocab = FakeSentencePiece()
    a_ids = {vocab.encode(f"t{i}")[0] for i in range(8)}
    mixture = T.register_mixture("test_mixture", [(a, 1.0), (b, 3.0)])
    try:
        assert T.get_task("test_mixture") is mixture
        batches = take(mixture.get_pipeline(LMConverter({"targets": 8}, pack=False), 4, 0,
                                            process_index=0, process_count=1), 25)
        first = np.concatenate([bt["decoder_target_tokens"][:, 0] for bt in batches])
        assert abs(np.isin(first, list(a_ids)).mean() - 0.25) < 0.03
    finally:
        T.remove_task("test_mixture")
