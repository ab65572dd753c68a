"""Your text read as a stream (t2t.data.corpus, t2t.data.streaming): every format with its
bad lines counted at file:line, shards to hosts and workers (disjoint, complete, once per
epoch), byte ranges of a lone file, exact resume in process and after a SIGKILL, memory
that does not grow with the corpus, the vocabulary's bounded sample cached by fingerprint,
BERT's NSP from the buffer, and the data report's counts."""
import gzip
import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from t2t.data import corpus, data_report, user_tasks, vocab_training
from t2t.data.converters import EncDecConverter, LMConverter
from t2t.data.pipeline import make_pipeline, take
from t2t.data.streaming import TextStream, host_shards, iterate
from t2t.errors import InputFileError

from tests.data.helpers import verses
from tests.jax_setup import cpu_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N = 60   # documents in each corpus
BAD = {"undecodable": 2, "missing_field": 1, "empty": 2}


def text_of(k: int) -> str:
    return f"Document {k} begins. It ends here {k}."


def jsonl_lines(first: int, count: int, bad: bool) -> list[bytes]:
    lines = [json.dumps({"body": text_of(k), "n": k}).encode() for k in range(first, first + count)]
    if bad:            # every kind of bad line, between good ones
        lines[1:1] = [b'{"body": "caf\xe9"}', b'{"body": cut', b'{"title": "x"}', b"",
                      b'{"body": "  "}']
    return lines


def write_jsonl(path, lines, compress=""):
    data = b"".join(line + b"\n" for line in lines)
    if compress == "gz":
        data = gzip.compress(data)
    elif compress == "zst":
        import zstandard
        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)


def write_corpus(root, fmt: str) -> str:
    """N documents (``text_of(k)``, k < N) in 3 shards of ``fmt``, the bad lines of `BAD`
    in the first; the TEXT_FILES pattern."""
    root.mkdir()
    parts = [(0, 20), (20, 20), (40, 20)]
    if fmt in ("jsonl", "jsonl.gz", "jsonl.zst"):
        compress = fmt.split(".")[1] if "." in fmt else ""
        for i, (first, count) in enumerate(parts):
            write_jsonl(root / f"part{i}.{fmt}", jsonl_lines(first, count, i == 0), compress)
        return str(root / f"*.{fmt}")
    if fmt == "txt":
        for i, (first, count) in enumerate(parts):
            paragraphs = [f"Document {k} begins.\nIt ends here {k}.".encode()
                          for k in range(first, first + count)]
            if i == 0:            # a line that is not UTF-8 inside a paragraph, and alone
                paragraphs[1] = paragraphs[1].replace(b"\n", b"\ncaf\xe9\n")
                paragraphs.insert(2, b"\xff\xfe")
            (root / f"part{i}.txt").write_bytes(b"\n\n".join(paragraphs) + b"\n")
        return str(root / "*.txt")
    import pyarrow as pa
    import pyarrow.parquet as pq
    if fmt == "parquet":
        for i, (first, count) in enumerate(parts):
            values = [text_of(k) for k in range(first, first + count)]
            if i == 0:
                values[1:1] = [None, "  ", ""]
            pq.write_table(pa.table({"body": values}), root / f"part{i}.parquet",
                           row_group_size=7)
        return str(root / "*.parquet")
    if fmt == "arrow":            # what `datasets.Dataset.save_to_disk` writes
        names = []
        for i, (first, count) in enumerate(parts):
            values = [text_of(k) for k in range(first, first + count)]
            if i == 0:
                values[1:1] = [None, " ", ""]
            names.append(f"data-{i:05d}-of-00003.arrow")
            table = pa.table({"body": values, "n": list(range(len(values)))})
            with pa.ipc.new_stream(str(root / names[-1]), table.schema) as writer:
                for batch in table.to_batches(max_chunksize=6):
                    writer.write_batch(batch)
        (root / "state.json").write_text(json.dumps(
            {"_data_files": [{"filename": n} for n in names], "_split": "train"}))
        (root / "dataset_info.json").write_text("{}")
        return str(root)
    assert fmt == "array_record"
    from array_record.python.array_record_module import ArrayRecordWriter
    for i, (first, count) in enumerate(parts):
        writer = ArrayRecordWriter(str(root / f"part{i}.array_record"), "group_size:4")
        records = [json.dumps({"body": text_of(k)}).encode() if k % 2 else text_of(k).encode()
                   for k in range(first, first + count)]
        if i == 0:
            records[1:1] = [b"caf\xe9", b'{"title": "x"}', b"  ", b"\xff"]
        for record in records:
            writer.write(record)
        writer.close()
    return str(root / "*.array_record")


EXPECTED_BAD = {"jsonl": BAD, "txt": {"undecodable": 2}, "parquet": {"missing_field": 1, "empty": 2},
                "arrow": {"missing_field": 1, "empty": 2},
                "array_record": {"undecodable": 2, "missing_field": 1, "empty": 1}}
FIRST_BAD = {"jsonl": "part0.{fmt}:2: not UTF-8", "txt": "part0.txt:5: not UTF-8",
             "parquet": "part0.parquet: record 1: no value in column 'body'",
             "arrow": "data-00000-of-00003.arrow: record 1: no value in column 'body'",
             "array_record": "part0.array_record: record 1: not UTF-8"}
FORMATS = ["jsonl", "jsonl.gz", "jsonl.zst", "txt", "parquet", "arrow", "array_record"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_streams_its_documents_and_counts_bad_lines(fmt, tmp_path):
    pattern = write_corpus(tmp_path / "c", fmt)
    stream = TextStream(pattern, "body", shuffle_buffer=0)
    head = stream.head(10**6)
    texts = [record["text"] for record, _ in head]
    assert texts == [text_of(k) for k in range(N)]          # files in order, nothing lost
    kind = fmt.split(".")[0]
    assert dict(head.bad.counts) == EXPECTED_BAD[kind] and head.fraction == 1
    where = FIRST_BAD[kind].format(fmt=fmt)
    first = head.bad.first_any()
    assert first.endswith(where) and os.path.isabs(first.split(":")[0]), first
    # The stream of one epoch: the same documents once, the same bad lines with them.
    elements = list(stream.dataset(0, num_epochs=1))
    assert sorted(e[2]["text"] for e in elements if e[2]) == sorted(texts)
    counts = {}
    for e in elements:
        for reason, n in (e[3] or {"counts": {}})["counts"].items():
            counts[reason] = counts.get(reason, 0) + n
    assert counts == EXPECTED_BAD[kind]


def test_plain_text_paragraphs_files_and_sentences(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"First line. Second one.\r\nThird.\n\n  \nNew doc.\nbad \xff byte\n\n\n")
    records = [r for r, _ in corpus.documents(corpus.find_shards(str(path))[0])]
    assert [corpus.complete(r) for r in records] == [
        {"id": f"{path}:1", "text": "First line. Second one. Third.",
         "sentences": ["First line.", "Second one.", "Third."]},
        {"id": f"{path}:5", "text": "New doc.", "sentences": ["New doc."]}]
    whole = list(corpus.documents(corpus.find_shards(str(path))[0], documents="files"))
    assert len(whole) == 1 and whole[0][1][0].where == f"{path}:6"


def test_unreadable_corpora_are_one_line_errors(tmp_path, monkeypatch):
    (tmp_path / "fake.jsonl.gz").write_bytes(b'{"text": "not gzip"}\n')
    with pytest.raises(InputFileError, match="not gzip-compressed"):
        TextStream(str(tmp_path / "fake.jsonl.gz")).first()
    (tmp_path / "cut.jsonl.gz").write_bytes(gzip.compress(b'{"text": "a"}\n' * 500)[:-30])
    with pytest.raises(InputFileError, match="cut short or damaged"):
        list(TextStream(str(tmp_path / "cut.jsonl.gz")).head(10**6))
    (tmp_path / "empty.jsonl").write_bytes(b'{"title": "x"}\n\n')
    with pytest.raises(InputFileError, match=r"no usable text in .*empty.jsonl \(.*:1: no field"):
        iterate(TextStream(str(tmp_path / "empty.jsonl")).dataset(0), 1)
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(InputFileError, match="not TSV/CSV"):
        TextStream(str(tmp_path / "x.csv"))
    (tmp_path / "a.txt").write_text("x")
    with pytest.raises(InputFileError, match="more than one format"):
        TextStream([str(tmp_path / "empty.jsonl"), str(tmp_path / "a.txt")])
    (tmp_path / "dd").mkdir()
    (tmp_path / "dd" / "dataset_dict.json").write_text('{"splits": ["train", "test"]}')
    with pytest.raises(InputFileError, match="give one split's folder"):
        TextStream(str(tmp_path / "dd"))
    write_jsonl(tmp_path / "z.jsonl.zst", [b'{"text": "a"}'], "zst")
    monkeypatch.setitem(sys.modules, "zstandard", None)            # the extra not installed
    with pytest.raises(InputFileError, match=r"needs zstandard: pip install 't2t\[corpora\]'"):
        TextStream(str(tmp_path / "z.jsonl.zst")).first()
    pattern = write_corpus(tmp_path / "pq", "parquet")
    with pytest.raises(InputFileError, match="has no column 'text'"):
        TextStream(pattern).first()
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(InputFileError, match=r"needs pyarrow: pip install 't2t\[corpora\]'"):
        TextStream(pattern, "body").first()


# ----------------------------------------------------------------------------- hosts, workers


def _documents(stream, **kwargs):
    return [(e[0], e[2]["text"]) for e in stream.dataset(3, **kwargs) if e[2]]


def test_two_hosts_read_disjoint_shards_each_document_once_per_epoch(tmp_path):
    root = tmp_path / "c"
    root.mkdir()
    for i in range(6):
        write_jsonl(root / f"s{i}.jsonl.gz", jsonl_lines(10 * i, 10, i == 2), "gz")
    stream = TextStream(str(root / "*.jsonl.gz"), "body", shuffle_buffer=8, cycle_length=2)
    hosts = [_documents(stream, num_epochs=2, process_index=h, process_count=2) for h in (0, 1)]
    texts = [{t for _, t in docs} for docs in hosts]
    assert not texts[0] & texts[1] and texts[0] | texts[1] == {text_of(k) for k in range(N)}
    for docs, mine in zip(hosts, texts):            # each document once in each epoch
        for epoch in (0, 1):
            assert sorted(t for e, t in docs if e == epoch) == sorted(mine)
    assert [t for e, t in hosts[0] if e == 0] != [t for e, t in hosts[0] if e == 1]  # reshuffled
    for seed in range(3):                          # a seeded deal: disjoint and complete
        dealt = [host_shards(range(6), seed, h, 2) for h in (0, 1)]
        assert sorted(dealt[0] + dealt[1]) == list(range(6)) and len(dealt[0]) == 3
    assert len({tuple(host_shards(range(6), seed, 0, 2)) for seed in range(8)}) > 1
    # Workers: grain's mp_prefetch gives worker w of W the host's shards w, w+W, ...
    dataset = stream.dataset(3, num_epochs=1, process_index=0, process_count=2)
    workers = []
    for w in range(2):
        part = stream.dataset(3, num_epochs=1, process_index=0, process_count=2)
        part.set_slice(slice(w, None, 2))
        workers.append({e[2]["text"] for e in part if e[2]})
    assert not workers[0] & workers[1] and workers[0] | workers[1] == texts[0]
    assert len(dataset.shards) == 3


def test_a_lone_file_is_cut_into_byte_ranges_and_compressed_ones_are_an_error(tmp_path):
    one = tmp_path / "one.jsonl"
    write_jsonl(one, jsonl_lines(0, N, True))
    stream = TextStream(str(one), "body", shuffle_buffer=4)
    hosts = [_documents(stream, num_epochs=1, process_index=h, process_count=2) for h in (0, 1)]
    assert sorted(t for h in hosts for _, t in h) == sorted(text_of(k) for k in range(N))
    assert all(len(h) > 10 for h in hosts)
    text = tmp_path / "one.txt"        # paragraphs are never cut: ranges start after a blank
    text.write_text("\n\n".join(f"Document {k} begins.\nIt ends here {k}." for k in range(N)))
    stream = TextStream(str(text), shuffle_buffer=0)
    pieces = [p for h in range(3) for _, p in stream.host_shards(0, h, 3)]
    piece = max(pieces, key=lambda p: p.start)
    assert len(pieces) == 3 and piece.start > 0
    lines = text.read_bytes()[piece.start:].split(b"\n")
    assert lines[0].startswith(b"Document") and lines[1].startswith(b"It ends")
    hosts = [_documents(stream, num_epochs=1, process_index=h, process_count=3) for h in range(3)]
    assert sorted(t for h in hosts for _, t in h) == sorted(text_of(k) for k in range(N))
    # a bad line in the second range is still named by its line in the file
    records = [corpus.complete(r)["id"] for r, _ in corpus.documents(piece) if r]
    k = int(records[0].split(":")[-1])
    assert text.read_text().split("\n")[k - 1].startswith("Document")
    write_jsonl(tmp_path / "one.jsonl.gz", jsonl_lines(0, N, False), "gz")
    with pytest.raises(InputFileError, match="1 file.* for 2 hosts.*at least 2 files"):
        TextStream(str(tmp_path / "one.jsonl.gz")).dataset(0, process_index=0, process_count=2)


# ----------------------------------------------------------------------------- exact resume


def tokens(record, seed):
    """A document -> an LM example of its bytes (and a seeded extra token)."""
    ids = np.frombuffer(record["text"].encode(), np.uint8).astype(np.int32) + 2
    return {"targets": np.append(ids[:20], np.random.default_rng(seed).integers(300, 400))}


def pipeline(pattern, **kwargs):
    stream = TextStream(pattern, "body", shuffle_buffer=kwargs.pop("buffer", 16),
                        cycle_length=2)
    return make_pipeline(stream, tokens, LMConverter({"targets": 32}), 4, 5,
                         **{"process_index": 0, "process_count": 1, **kwargs})


def same(a, b):
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    for i in range(3):
        write_jsonl(root / f"s{i}.jsonl.gz", jsonl_lines(20 * i, 20, i == 1), "gz")
    return str(root / "*.jsonl.gz")


@pytest.mark.parametrize("k, buffer", [(3, 16), (17, 16), (40, 16), (9, 0), (5, 200)])
def test_a_resumed_iterator_yields_the_batches_of_an_uninterrupted_one(shards, k, buffer):
    reference = pipeline(shards, buffer=buffer)            # 40 batches: several epochs
    expected = take(reference, k + 12)
    it = pipeline(shards, buffer=buffer)
    take(it, k)
    state = json.loads(json.dumps(it.get_state()))       # as a checkpoint stores it
    resumed = pipeline(shards, buffer=buffer)
    resumed.set_state(state)
    assert same(take(resumed, 12), expected[k:])
    assert resumed.stats == reference.stats and resumed.bad_lines() == reference.bad_lines()


def test_bad_lines_are_counted_once_as_training_meets_them(shards):
    it = pipeline(shards, buffer=16, num_epochs=1, shuffle=True)
    batches = list(it)
    assert it.stats["documents"] == N and sum(len(b["decoder_target_tokens"]) for b in batches)
    assert it.bad_lines()["counts"] == BAD
    assert it.bad_lines()["first"]["missing_field"].endswith("s1.jsonl.gz:4: no field 'body'")


CHILD = textwrap.dedent("""
    import json, os, signal, sys
    from t2t.data.streaming import TextStream
    pattern, out = sys.argv[1], sys.argv[2]
    it = iter(TextStream(pattern, "body", shuffle_buffer=16, cycle_length=2).dataset(5))
    for _ in range(45):
        next(it)
    with open(out + ".tmp", "w") as f:
        json.dump(it.get_state(), f)
    os.replace(out + ".tmp", out)                # saved: the checkpoint
    with open(out + ".next", "w") as f:
        json.dump([next(it)[2]["text"] for _ in range(30)], f)
    os.kill(os.getpid(), signal.SIGKILL)         # killed before it could say goodbye
""")


def test_a_sigkilled_reader_resumes_from_its_saved_state(shards, tmp_path):
    out = tmp_path / "state.json"
    child = subprocess.run([sys.executable, "-c", CHILD, shards, str(out)], cwd=ROOT,
                           env=cpu_env(1), capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    stream = TextStream(shards, "body", shuffle_buffer=16, cycle_length=2)
    resumed = iter(stream.dataset(5))
    resumed.set_state(json.loads(out.read_text()))
    texts = [next(resumed)[2]["text"] for _ in range(30)]
    assert texts == json.loads((tmp_path / "state.json.next").read_text())
    uninterrupted = [e[2]["text"] for e in iterate(stream.dataset(5), 75)]
    assert texts == uninterrupted[45:]


@pytest.mark.slow          # worker processes take ~10 s to start here
def test_worker_processes_resume_exactly(shards):
    expected = take(pipeline(shards, worker_count=2), 30)
    it = pipeline(shards, worker_count=2)
    take(it, 10)
    state = json.loads(json.dumps(it.get_state()))
    resumed = pipeline(shards, worker_count=2)
    resumed.set_state(state)
    assert same(take(resumed, 20), expected[10:])


# ----------------------------------------------------------------------------- memory


MEMORY = textwrap.dedent("""
    import resource, sys
    from t2t.data.streaming import TextStream, iterate
    peaks = []
    for pattern in sys.argv[1:]:
        elements = iterate(TextStream(pattern, "body").dataset(0), 100)
        assert len(elements) == 100
        peaks.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    print(*peaks)
""")


def test_memory_does_not_grow_with_the_corpus(tmp_path):
    """The first 100 documents of 50 MB of text take no more memory than those of 5 MB."""
    text = " ".join(verses(2000))
    for name, megabytes in (("small", 5), ("large", 50)):
        (tmp_path / name).mkdir()
        docs = [json.dumps({"body": text[i * 5000 % len(text):][:5000] + f" {i}"}).encode()
                for i in range(megabytes * 200)]
        for s in range(8):
            with gzip.open(tmp_path / name / f"{s}.jsonl.gz", "wb", compresslevel=1) as f:
                f.write(b"\n".join(docs[s::8]) + b"\n")
    run = subprocess.run([sys.executable, "-c", MEMORY, str(tmp_path / "small" / "*.jsonl.gz"),
                          str(tmp_path / "large" / "*.jsonl.gz")], cwd=ROOT, env=cpu_env(1),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    small, large = map(int, run.stdout.split())           # KiB
    assert large - small < 16 * 1024, (small, large)


# ----------------------------------------------------------------------------- vocabulary


def test_vocabulary_trains_on_a_bounded_sample_cached_by_fingerprint(tmp_path, monkeypatch):
    root = tmp_path / "c"
    root.mkdir()
    pool = verses(1500)
    for i in range(4):
        write_jsonl(root / f"s{i}.jsonl.gz",
                    [json.dumps({"body": " ".join(pool[j:j + 5])}).encode()
                     for j in range(i * 300, i * 300 + 300, 5)], "gz")
    stream = TextStream(str(root / "*.jsonl.gz"), "body")
    sample = stream.sample_texts(20_000, seed=1)
    assert sample == stream.sample_texts(20_000, seed=1)               # seeded
    assert 20_000 <= sum(map(len, sample)) < 20_000 + 4 * max(map(len, sample))  # bounded
    assert len({stream.sample_texts(20_000, seed=s, max_files=2)[0] for s in range(6)}) > 1
    monkeypatch.setenv("T2T_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(vocab_training, "files_digest", None)      # no content hashing
    vocab = user_tasks.text_vocabulary(stream, "sentencepiece", vocab_size=400, sample_chars=20_000)
    assert vocab.vocab_size > 300

    def train(*args, **kwargs):
        raise RuntimeError("trained again")

    monkeypatch.setattr(vocab_training.SentencePieceVocabulary, "train", train)
    again = user_tasks.text_vocabulary(stream, "sentencepiece", vocab_size=400, sample_chars=20_000)
    assert again.model_file == vocab.model_file                      # cached: not trained
    os.utime(root / "s0.jsonl.gz", ns=(1, 1))                        # a file changed: retrain
    with pytest.raises(RuntimeError, match="trained again"):
        user_tasks.text_vocabulary(TextStream(str(root / "*.jsonl.gz"), "body"), "sentencepiece",
                                   vocab_size=400, sample_chars=20_000)


# ----------------------------------------------------------------------------- tasks, report


def test_bert_nsp_takes_its_random_next_from_another_buffered_document(shards, wordpiece):
    from t2t.data.tasks import BertPretraining
    record = next(e[2] for e in TextStream(shards, "body").dataset(0))
    assert record["other_sentences"] and record["other_sentences"] != record["sentences"]
    bert = BertPretraining(lambda: None, sentences_key="sentences", streamed=True,
                           short_seq_prob=0)
    examples = [ex for s in range(20) for ex in bert(record, seed=(s,), vocabulary=wordpiece,
                                                       sequence_length={"inputs": 32,
                                                                        "max_predictions": 4})]
    assert {int(ex["next_sentence_label"]) for ex in examples} == {0, 1}


def test_the_data_report_of_a_stream_and_what_training_met(shards, spm, tmp_path, capsys):
    stream = TextStream(shards, "body", shuffle_buffer=8)
    task = next(t for t in user_tasks.text_files_tasks(stream, spm)
                if t.name == "text_files_span_corruption")
    converter = EncDecConverter({"inputs": 32, "targets": 8})
    whole = data_report.scan(task, "train", converter)
    assert (whole.lines, whole.sampled, dict(whole.bad.counts)) == (N, 1.0, BAD)
    part = data_report.scan(task, "train", converter, stream_limit=10)
    assert part.sampled < 1 and 25 < part.lines < 150 and part.as_dict()["sampled"]
    reports = data_report.announce(task, converter, 4, 10, model_dir=str(tmp_path))
    it = task.get_pipeline(converter, 4, 0, process_index=0, process_count=1)
    take(it, 30)
    row = data_report.after_training(reports, it, str(tmp_path))
    read = json.loads((tmp_path / "data.json").read_text())["train"]["read_in_training"]
    assert row == {f"data/{k}": v for k, v in read.items()}
    assert read["documents"] == it.stats["documents"] > N
    assert {r: read[r] for r in BAD} == it.bad_lines()["counts"]
    assert read["undecodable"] == 2 * read["missing_field"] == read["empty"] >= 2
    line, = data_report.end_lines(reports)
    assert line.startswith(f"data train: training read {read['documents']:,} documents")
    assert f"undecodable {read['undecodable']}, missing_field {read['missing_field']}" in line
    assert "(first bad line " in line


@pytest.mark.slow          # three `t2t train` runs (~1 min): the data-level tests above run always
def test_a_sigkilled_training_on_streamed_jsonl_gz_resumes_bitwise(shards, tmp_path):
    """tests/train/test_resume.py's check on your streamed text: SIGKILL after step 5, rerun,
    the losses of steps 4-8 equal an uninterrupted run's; the data counts reach
    metrics.jsonl and data.json."""
    from tests.train.cli_launcher import run_t2t
    flags = ["train", "--gin_file=experiments/t5_tiny_bible.gin",
             "--gin_file=models/t5/1_1/test.gin", "--gin.TRAIN_STEPS=8", "--gin.BATCH_SIZE=4",
             "--gin.TASK_FEATURE_LENGTHS={'inputs': 32, 'targets': 8}",
             f"--gin.TEXT_FILES={shards}", "--gin.TEXT_FIELD=body",
             "--gin.TrainConfig.log_every=1", "--gin.TrainConfig.checkpoint_every=3",
             "--gin.TrainConfig.progress_bar=False", "--gin.TransformerConfig.dropout_rate=0.1"]

    def losses(model_dir):
        rows = [json.loads(line) for line in open(model_dir / "metrics.jsonl")]
        return {r["step"]: r["loss"] for r in rows if "loss" in r}, rows

    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    done = run_t2t([*flags, f"--gin.MODEL_DIR={straight}"])
    assert done.returncode == 0, done.stderr[-3000:]
    killed = run_t2t([*flags, f"--gin.MODEL_DIR={interrupted}"], SIGNAL="SIGKILL",
                     SIGNAL_AFTER=5, WAIT_FOR_CHECKPOINT=3)
    assert killed.returncode == -9, killed.stderr[-3000:]
    resumed = run_t2t([*flags, f"--gin.MODEL_DIR={interrupted}"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    (a, rows), (b, _) = losses(straight), losses(interrupted)
    assert sorted(a) == sorted(b) == list(range(1, 9))
    assert all(a[step] == b[step] for step in range(4, 9)), (a, b)
    data = rows[-1]
    assert data["step"] == 8 and data["data/undecodable"] >= 2 and data["data/documents"] > 0
    read = json.loads((straight / "data.json").read_text())["train"]["read_in_training"]
    assert read == {k.removeprefix("data/"): v for k, v in data.items() if k != "step"}
    assert "data train: training read" in done.stdout


def test_the_corpus_scale_benchmark_runs_at_a_tiny_size(tmp_path, monkeypatch):
    """benchmarks/corpus_scale.py's corpus, stage rates and pipeline rate on 2 MB (its real
    runs take minutes): it cannot break unseen."""
    from benchmarks import corpus_scale
    monkeypatch.setenv("T2T_CACHE_DIR", str(tmp_path / "cache"))   # it sets the variable
    corpus = tmp_path / "corpus"
    info = corpus_scale.write_corpus(corpus, 0.002, 2, 1)
    assert info["text_bytes"] >= 2_000_000 and len(list(corpus.glob("*.jsonl.gz"))) == 2
    assert corpus_scale.write_corpus(corpus, 0.002, 2, 1) == info          # reused
    stages = corpus_scale.stage_rates(corpus, tmp_path / "cache", documents=40)
    assert stages["documents"] == 40 and stages["tokens"] > 0
    assert set(corpus_scale.STAGES) <= set(stages["rates"])
    assert all(rate > 0 for rate in stages["rates"].values())
    assert corpus_scale.pipeline_rate(corpus, tmp_path / "cache", 0, 0.2) > 0
