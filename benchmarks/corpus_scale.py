"""Own-text pretraining at corpus scale: time to the first step, peak memory, pipeline rate.

Writes a corpus of real text (the bundled Bibles' verses, repeated, in documents of 40
verses) of ``--gb`` gigabytes as ``--shards`` gzipped JSONL files (kept under ``--dir`` and
reused), then:

1. runs the README's own-text command for ``--steps`` steps under ``/usr/bin/time -v``
   (psutil's sampled peak where that is missing), with a fresh vocabulary cache, and
   reports its peak RSS, the seconds to the first step (metrics.jsonl's first row) and
   in all;
2. measures the input pipeline alone (T5.1.1-base's 512/114 span corruption, batch 128, the
   same stream, vocabulary and packing): each stage alone in one process (read + decode,
   SentencePiece, span corruption, trim, first-fit packing, batch assembly, a batch's
   pickling both ways), the whole pipeline for ``--seconds`` with 0 (in-process), 1 and
   2 worker processes, and the main-process ceiling (the rate it takes finished batches
   from workers that only resend one), as non-padding tokens per second against what a
   T5.1.1-base step takes per host of a v5e-256 (``benchmarks/compile_table.json``: batch x
   lengths / step time / 64 hosts); then projects the headroom of a v5e host's
   ``--host-workers`` workers: min(ceiling, workers x a worker's rate) / need, labelled as a
   projection from this machine.

Prints a markdown table row per size (and per worker count). Not run by the tests (tens of
minutes at 2 GB); ``tests/data/test_streaming.py`` has the test-size memory check.

    python benchmarks/corpus_scale.py --gb 0.25            # the issue's sizes: 0.25, 2, 8
    python benchmarks/corpus_scale.py --gb 0.01 --steps 2 --seconds 5    # a smoke run
    python benchmarks/corpus_scale.py --gb 0.01 --steps 0 --seconds 5    # the pipeline only
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import _common  # noqa: E402  (sets JAX's platforms before JAX loads)

import grain  # noqa: E402  (imports JAX)

VERSES_PER_DOCUMENT = 40
HOSTS_PER_V5E_256 = 64        # 4 chips a host
V5E_HOST_VCPUS = 112          # ct5lp-hightpu-4t, the 4-chip host of a v5e-256
HOST_WORKERS = 32             # the workers assumed for such a host (see report_pipeline)
BATCH_ROWS = 128
STAGE_DOCUMENTS = 1500


def documents() -> list[bytes]:
    """The bundled Bibles as JSONL lines of 40 verses, ``{"id", "body"}``."""
    from t2t.data import bundled
    out = []
    for name in ("web", "kjv", "rv1909"):
        verses = [v["text"] for v in bundled.load(name)]
        for i in range(0, len(verses), VERSES_PER_DOCUMENT):
            body = " ".join(verses[i:i + VERSES_PER_DOCUMENT])
            out.append(json.dumps({"id": f"{name}/{i}", "body": body}).encode() + b"\n")
    return out


def write_corpus(directory: Path, gb: float, shards: int, level: int) -> dict:
    """``gb`` GB of text in ``shards`` .jsonl.gz files (reused when a manifest matches)."""
    manifest = directory / "manifest.json"
    want = {"gb": gb, "shards": shards, "level": level}
    if manifest.exists() and json.loads(manifest.read_text()).get("want") == want:
        return json.loads(manifest.read_text())
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    lines = documents()
    target = int(gb * 1e9 / shards)
    start, text, compressed, docs = time.perf_counter(), 0, 0, 0
    for s in range(shards):
        written, k = 0, s
        path = directory / f"part-{s:05d}.jsonl.gz"
        with gzip.open(path, "wb", compresslevel=level) as f:
            while written < target:
                line = lines[k % len(lines)]
                f.write(line)
                written, k, docs = written + len(line), k + 1, docs + 1
        text += written
        compressed += path.stat().st_size
    info = {"want": want, "text_bytes": text, "gzip_bytes": compressed, "documents": docs,
            "write_s": round(time.perf_counter() - start, 1)}
    manifest.write_text(json.dumps(info))
    return info


def train(corpus: Path, steps: int, work: Path) -> dict:
    """The own-text command for ``steps`` steps: peak RSS (KiB), first-step and wall s."""
    model_dir, cache = work / "run", work / "cache"
    shutil.rmtree(model_dir, ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)
    command = [sys.executable, "-m", "t2t.cli", "train",
               "--gin_file=experiments/t5_tiny_bible.gin",
               f"--gin.TEXT_FILES={corpus}/*.jsonl.gz", "--gin.TEXT_FIELD=body",
               f"--gin.TRAIN_STEPS={steps}", f"--gin.MODEL_DIR={model_dir}",
               "--gin.TrainConfig.log_every=1", "--gin.TrainConfig.progress_bar=False"]
    timed = shutil.which("time") or ("/usr/bin/time" if os.path.exists("/usr/bin/time") else None)
    env = {**os.environ, "T2T_CACHE_DIR": str(cache)}
    argv = [timed, "-v", *command] if timed else command
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    sampled, first = [0], [None]

    def watch():
        metrics = model_dir / "metrics.jsonl"
        try:
            import psutil
            parent = psutil.Process(proc.pid)
        except Exception:  # noqa: BLE001  no psutil: /usr/bin/time's number only
            parent = None
        while proc.poll() is None:
            if first[0] is None and metrics.exists() and metrics.stat().st_size:
                first[0] = time.perf_counter() - start
            if parent is not None:
                try:
                    rss = sum(p.memory_info().rss for p in [parent, *parent.children(True)])
                    sampled[0] = max(sampled[0], rss // 1024)
                except Exception:  # noqa: BLE001  a process ended between the calls
                    pass
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    watcher.join()
    if proc.returncode:
        raise SystemExit(f"t2t train failed ({proc.returncode}):\n{err[-3000:]}")
    peak = max([int(line.split(":")[1]) for line in err.splitlines()
                if "Maximum resident set size" in line] or [sampled[0]])
    return {"peak_kib": peak, "first_step_s": first[0], "wall_s": wall,
            "command": " ".join(command[2:]), "tail": out.strip().splitlines()[-4:]}


def needed_tokens_per_host() -> float:
    """Tokens a T5.1.1-base step takes per v5e-256 host per second (`t2t compile`'s row)."""
    row = json.loads((ROOT / "benchmarks" / "compile_table.json").read_text())["t5_base|v5e-256"]
    shapes = row["batch_shapes"]
    tokens = (shapes["encoder_input_tokens"][0] * shapes["encoder_input_tokens"][1]
              + shapes["decoder_target_tokens"][0] * shapes["decoder_target_tokens"][1])
    return tokens / row["step_time_s"] / HOSTS_PER_V5E_256


def _span_corruption_task(corpus: Path, cache: Path) -> tuple:
    """The stream, its vocabulary, the span-corruption task and T5.1.1-base's converter."""
    os.environ["T2T_CACHE_DIR"] = str(cache)
    from t2t.data.converters import EncDecConverter
    from t2t.data.streaming import TextStream
    from t2t.data.user_tasks import text_files_tasks, text_vocabulary
    stream = TextStream(f"{corpus}/*.jsonl.gz", "body")
    vocab = text_vocabulary(stream, "sentencepiece")            # cached by the training run
    task = next(t for t in text_files_tasks(stream, vocab)
                if t.name == "text_files_span_corruption")
    return stream, vocab, task, EncDecConverter({"inputs": 512, "targets": 114})


def pipeline_rate(corpus: Path, cache: Path, workers: int, seconds: float) -> float:
    """Non-padding tokens per second of the span-corruption pipeline at 512/114."""
    _, _, task, converter = _span_corruption_task(corpus, cache)
    it = task.get_pipeline(converter, BATCH_ROWS, 0, process_index=0, process_count=1,
                           worker_count=workers)
    next(it)                                                    # start-up is not the rate
    tokens, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        tokens += batch_tokens(next(it))
    return tokens / (time.perf_counter() - start)


def batch_tokens(batch: dict) -> int:
    return int((batch["encoder_segment_ids"] > 0).sum() + (batch["decoder_segment_ids"] > 0).sum())


def stage_rates(corpus: Path, cache: Path, documents: int = STAGE_DOCUMENTS) -> dict:
    """Each stage of the pipeline alone, in one process, over the same ``documents``: its
    rate in the pipeline's unit (non-padding tokens of the packed batches per second),
    the stages' seconds divided into the tokens they end up as."""
    import itertools
    import pickle

    from t2t.data import tasks as tasks_lib
    stream, vocab, task, converter = _span_corruption_task(corpus, cache)
    clock = time.perf_counter
    seconds = {}
    start = clock()
    elements = list(itertools.islice(iter(stream.dataset(0, process_index=0, process_count=1)),
                                     documents))
    seconds["read"] = clock() - start
    records = [e[2] for e in elements if e[2] is not None]
    start = clock()
    tokenized = [tasks_lib.tokenize(r, vocabulary=vocab) for r in records]
    seconds["tokenize"] = clock() - start
    rest = tasks_lib.Task("stages", None, task.preprocessors[1:], vocab)
    start = clock()
    examples = [e for i, t in enumerate(tokenized) for e in rest.preprocess(t, (0, 0, i),
                                                                            converter.lengths)]
    seconds["span_corruption"] = clock() - start
    start = clock()
    prepared = [converter.prepare(e)[0] for e in examples]
    seconds["prepare"] = clock() - start
    start = clock()
    rows, packer = [], converter.new_packer(BATCH_ROWS)
    for example in prepared:
        if not packer.add(example):
            rows.append(packer.rows(BATCH_ROWS))
            packer = converter.new_packer(BATCH_ROWS)
            packer.add(example)
    rows.append(packer.rows(BATCH_ROWS))
    seconds["pack"] = clock() - start
    start = clock()
    batches = [converter.finalize(r) for r in rows]
    seconds["finalize"] = clock() - start
    element = {"batch": batches[0], "stats": {"documents": 50, "examples": 150}}
    start = clock()
    sent = [pickle.dumps(element, pickle.HIGHEST_PROTOCOL) for _ in batches]
    seconds["send"] = clock() - start
    start = clock()
    for message in sent:
        pickle.loads(message)
    seconds["receive"] = clock() - start
    tokens = sum(batch_tokens(b) for b in batches)
    rates = {name: tokens / max(s, 1e-9) for name, s in seconds.items()}
    rates["one_process"] = tokens / sum(seconds[k] for k in STAGES_IN_A_WORKER[:-1])
    rates["worker"] = tokens / sum(seconds[k] for k in STAGES_IN_A_WORKER)
    return {"rates": rates, "documents": len(records), "batches": len(batches),
            "tokens": tokens, "batch_tokens": tokens / len(batches)}


STAGES = {"read": "read + decode (gzip, JSON lines, shuffle buffer)",
          "tokenize": "SentencePiece tokenization",
          "span_corruption": "span corruption (568-token chunks, noise spans, sentinels)",
          "prepare": "trim to 512/114 (converter.prepare)",
          "pack": f"first-fit packing into {128} rows",
          "finalize": "batch assembly (finalize: decoder inputs, loss weights)",
          "send": "a worker sends a batch (pickle)",
          "receive": "the main process receives a batch (unpickle)"}
STAGES_IN_A_WORKER = ("read", "tokenize", "span_corruption", "prepare", "pack", "finalize",
                      "send")


class Replay(grain.IterDataset):
    """One finished batch element ``count`` times, cut among the workers like a stream's
    shards: the workers' side of the main-process ceiling."""

    def __init__(self, element: dict, count: int):
        super().__init__()
        self.element, self.count = element, count

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        self.count = len(range(self.count)[sl])

    def __iter__(self) -> ReplayIterator:
        return ReplayIterator(self.element, self.count)


class ReplayIterator(grain.DatasetIterator):
    def __init__(self, element: dict, count: int):
        super().__init__()
        self.element, self.count, self.i = element, count, 0

    def __next__(self) -> dict:
        if self.i >= self.count:
            raise StopIteration
        self.i += 1
        return self.element

    def get_state(self) -> dict:
        return {"i": self.i}

    def set_state(self, state: dict) -> None:
        self.i = state["i"]


def main_process_ceiling(corpus: Path, cache: Path, workers: int, seconds: float) -> dict:
    """The rate at which the main process takes finished batches from ``workers`` worker
    processes that only resend one made batch: wall tokens/s, and tokens per second of the
    main process's CPU time (its ceiling when it has a core of its own)."""
    from t2t.data import pipeline
    _, _, task, converter = _span_corruption_task(corpus, cache)
    made = task.get_pipeline(converter, BATCH_ROWS, 0, process_index=0, process_count=1)
    batch = next(made)
    element = {"batch": batch, "stats": {"documents": 50, "examples": 150}}
    tokens_each = batch_tokens(batch)
    it = task.get_pipeline(converter, BATCH_ROWS, 0, process_index=0, process_count=1)
    pipeline._mark_flags_parsed()
    it._parent = iter(Replay(element, 10**9).mp_prefetch(grain.MultiprocessingOptions(
        num_workers=workers, per_worker_buffer_size=pipeline.WORKER_BUFFER)))
    for _ in range(4):                                          # start-up is not the rate
        next(it)
    n, start, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        next(it)                                                # BatchIterator's own share
        n += 1
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    it._parent.close()
    return {"wall": n * tokens_each / wall, "cpu": n * tokens_each / max(cpu, 1e-9)}


def report_pipeline(corpus: Path, cache: Path, workers: Sequence[int], seconds: float,
                    host_workers: int, text_gb: float) -> None:
    need = needed_tokens_per_host()
    stages = stage_rates(corpus, cache)
    rates = stages["rates"]
    print(f"\nStages alone, one process, {stages['documents']:,} documents -> "
          f"{stages['batches']} batches of {BATCH_ROWS} rows ({stages['batch_tokens']:,.0f} "
          "non-padding tokens each); tokens/s = the packed batches' non-padding tokens per "
          "second of that stage:\n\n| stage | tokens/s | x 911k-equivalent need |\n"
          "|---|---:|---:|".replace("911k-equivalent need", f"{need / 1e3:,.0f}k"))
    for key, name in STAGES.items():
        print(f"| {name} | {rates[key]:,.0f} | {rates[key] / need:.1f}x |")
    print(f"| **a worker: all but receive** | {rates['worker']:,.0f} | "
          f"{rates['worker'] / need:.2f}x |", flush=True)
    print("\n| corpus (text) | pipeline workers | tokens/s (512/114 span corruption) | "
          "T5.1.1-base on v5e-256 needs per host | headroom |\n|---|---:|---:|---:|---:|")
    measured = {}
    for count in workers:
        measured[count] = pipeline_rate(corpus, cache, count, seconds)
        print(f"| {text_gb:.2f} GB | {count} | {measured[count]:,.0f} | {need:,.0f} | "
              f"{measured[count] / need:.1f}x |", flush=True)
    print("\nMain process taking made batches from worker processes (its ceiling):\n\n"
          "| workers | tokens/s (wall, this machine) | tokens per main-process CPU s |\n"
          "|---:|---:|---:|")
    ceilings = []
    for count in [w for w in workers if w > 0] or [1]:
        c = main_process_ceiling(corpus, cache, count, seconds)
        ceilings.append(c["cpu"])
        print(f"| {count} | {c['wall']:,.0f} | {c['cpu']:,.0f} |", flush=True)
    ceiling = min(ceilings)
    per_worker = rates["worker"]
    projected = min(ceiling, host_workers * per_worker)
    print(f"\nPROJECTION from this {os.cpu_count()}-core machine, not a measurement: a v5e "
          f"host (4 chips, {V5E_HOST_VCPUS} vCPUs = {V5E_HOST_VCPUS // 2} cores) with "
          f"{host_workers} workers (--host-workers; a worker a core for half the cores, the "
          "rest left to the training process's JAX, checkpoint and grain threads): "
          f"min(main-process ceiling {ceiling:,.0f}, {host_workers} x per-worker "
          f"{per_worker:,.0f}) = {projected:,.0f} tokens/s = {projected / need:.1f}x the "
          f"{need:,.0f} a host needs; 10x needs {int(np.ceil(10 * need / per_worker))} "
          f"workers and a main-process ceiling of {10 * need:,.0f} "
          f"({'met' if ceiling >= 10 * need else 'NOT met'}: {ceiling / need:.0f}x).",
          flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gb", type=float, default=0.25, help="GB of text to write")
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--steps", type=int, default=6, help="training steps; 0: no training")
    parser.add_argument("--seconds", type=float, default=20, help="per pipeline measurement")
    parser.add_argument("--workers", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--host-workers", type=int, default=HOST_WORKERS,
                        help="worker processes assumed for a v5e host in the projection")
    parser.add_argument("--level", type=int, default=6, help="gzip compression level")
    parser.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "t2t_corpus_scale"))
    args = parser.parse_args(argv)
    root = Path(args.dir)
    corpus = root / f"corpus_{args.gb:g}gb"
    print(_common.machine_line("jax", "grain"), f"Load {_common.loadavg()}.", flush=True)
    info = write_corpus(corpus, args.gb, args.shards, args.level)
    print(f"corpus: {info['text_bytes'] / 1e9:.3f} GB of text ({info['gzip_bytes'] / 1e6:,.0f} "
          f"MB gzipped), {info['documents']:,} documents, {args.shards} shards "
          f"(written in {info['write_s']} s)", flush=True)
    if args.steps > 0:
        run = train(corpus, args.steps, root / "work")
        print(f"command: t2t {run['command']}")
        print("\n".join(f"  {line}" for line in run["tail"]))
        first = "n/a" if run["first_step_s"] is None else f"{run['first_step_s']:,.0f}"
        print("\n| corpus (text) | gzipped | shards | steps | time to first step s | wall s | "
              "peak RSS GB |\n|---|---:|---:|---:|---:|---:|---:|")
        print(f"| {info['text_bytes'] / 1e9:.2f} GB | {info['gzip_bytes'] / 1e6:,.0f} MB | "
              f"{args.shards} | {args.steps} | {first} | {run['wall_s']:,.0f} | "
              f"{run['peak_kib'] / 2**20:.2f} |", flush=True)
    else:
        print("--steps 0: no training run (time to first step and peak RSS not measured)")
    report_pipeline(corpus, root / "work" / "cache", args.workers, args.seconds,
                    args.host_workers, info["text_bytes"] / 1e9)


if __name__ == "__main__":
    main()
