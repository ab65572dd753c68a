"""Span corruption + packing throughput on the bundled World English Bible.

Measures, on one core, for T5's 512/114 lengths:
  tokenize       SentencePiece encoding of chapters (the vocabulary is trained once, cached)
  span_corrupt   span corruption of pre-tokenised 568-token chunks (numpy)
  + pack         the above + EncDecConverter prepare, first-fit packing, finalize
  pipeline       the full grain pipeline (chapter text -> batches), one reader thread
Rates are per CPU-second of this process (``time.process_time``), i.e. per core; tokens
are the example's inputs + targets (packed: non-padding encoder + decoder positions).

    python benchmarks/data_throughput.py [--seconds 5] [--batch-size 8] [--no-write]
"""
from __future__ import annotations

import argparse
import datetime
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import numpy as np

from t2t.data import preprocessors as prep
from t2t.data import tasks
from t2t.data.catalog import bible
from t2t.data.converters import EncDecConverter
from t2t.data.sources import BundledSource

RESULTS = Path(__file__).with_name("RESULTS.md")


def _timed(fn, seconds: float) -> tuple[int, int, float, float]:
    """Calls ``fn() -> (examples, tokens)`` until ``seconds`` of CPU; totals, CPU s, wall s."""
    examples = tokens = 0
    cpu0, wall0 = time.process_time(), time.perf_counter()
    while time.process_time() - cpu0 < seconds:
        e, t = fn()
        examples, tokens = examples + e, tokens + t
    return examples, tokens, time.process_time() - cpu0, time.perf_counter() - wall0


def _model_tokens(batch: dict) -> int:
    """Non-padding encoder + decoder tokens of a batch."""
    return int((batch["encoder_segment_ids"] > 0).sum() + (batch["decoder_segment_ids"] > 0).sum())


def _cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines()
                    if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="CPU seconds per measurement")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--inputs-length", type=int, default=512)
    parser.add_argument("--no-write", action="store_true", help="do not append to RESULTS.md")
    args = parser.parse_args(argv)

    vocab = bible.bible_sentencepiece()
    chapters = [r["text"] for r in BundledSource("web", "chapter")]
    raw_length, targets_length = prep.span_corruption_lengths(args.inputs_length)
    lengths = {"inputs": args.inputs_length, "targets": targets_length}
    converter = EncDecConverter(lengths, pack=True)
    sentinel = vocab.sentinel_id(0)

    state = {"i": 0}

    def next_text() -> str:
        state["i"] += 1
        return chapters[state["i"] % len(chapters)]

    def tokenize():
        return 1, len(vocab.encode(next_text()))

    tokenized = [np.asarray(vocab.encode(t), np.int32) for t in chapters[:400]]
    chunks = [c for t in tokenized for c in prep.split_tokens(t, raw_length)]
    counter = {"k": 0}

    def corrupt_one(k: int) -> dict:
        return prep.span_corruption(chunks[k % len(chunks)], seed=(0, k), sentinel_id=sentinel,
                                    eos_id=vocab.eos_id)

    def span_corrupt():
        counter["k"] += 1
        out = corrupt_one(counter["k"])
        return 1, len(out["inputs"]) + len(out["targets"])

    efficiency = []

    def pack_batch():
        packer = converter.new_packer(args.batch_size)
        examples = 0
        while True:
            counter["k"] += 1
            packable, _ = converter.prepare(corrupt_one(counter["k"]))
            if not packer.add(packable):
                break
            examples += 1
        batch = converter.finalize(packer.rows(args.batch_size))
        efficiency.append(float((batch["encoder_segment_ids"] > 0).mean()))
        return examples, _model_tokens(batch)

    it = tasks.get_task("bible_web_span_corruption").get_pipeline(
        converter, args.batch_size, 0, process_index=0, process_count=1, read_threads=1)
    next(it)

    def pipeline_batch():
        before = it.stats["examples"]
        batch = next(it)
        return it.stats["examples"] - before, _model_tokens(batch)

    rows = []
    for name, fn, unit in [("tokenize (chapters)", tokenize, "text tokens"),
                           ("span corruption", span_corrupt, "inputs+targets"),
                           ("span corruption + pack", pack_batch, "inputs+targets"),
                           ("pipeline text->batches", pipeline_batch, "inputs+targets")]:
        examples, tokens, cpu, wall = _timed(fn, args.seconds)
        rows.append((name, examples / cpu, tokens / cpu, unit, cpu / wall))
    pipeline_stats = it.stats

    header = ("| stage | examples/s/core | tokens/s/core | tokens counted | cores busy |\n"
              "|---|---:|---:|---|---:|\n")
    table = header + "".join(f"| {n} | {e:,.0f} | {t:,.0f} | {u} | {c:.2f} |\n"
                             for n, e, t, u, c in rows)
    versions = ", ".join(f"{p} {metadata.version(p)}" for p in
                         ("numpy", "grain", "sentencepiece"))
    note = (f"batch {args.batch_size} x ({args.inputs_length} + {targets_length}), raw chunks of "
            f"{raw_length} tokens, SentencePiece {vocab.vocab_size} ids; packing efficiency "
            f"(encoder, non-pad fraction) {np.mean(efficiency):.3f}; pipeline packing efficiency "
            + ", ".join(f"{k} {v:.3f}" for k, v in pipeline_stats["packing_efficiency"].items()))
    print(table + "\n" + note)
    if not args.no_write:
        date = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
        entry = (f"\n## Data throughput: span corruption + packing ({date})\n\n"
                 f"Machine: {_cpu_name()}, {platform.system()} {platform.machine()}; "
                 f"Python {platform.python_version()}, {versions}.\n"
                 f"Command: `python benchmarks/data_throughput.py --seconds {args.seconds:g} "
                 f"--batch-size {args.batch_size}`. Rates per CPU-second of the process.\n\n"
                 f"{table}\n{note}.\n")
        header = "" if RESULTS.exists() else "# Benchmark results\n"
        with open(RESULTS, "a", encoding="utf-8") as f:
            f.write(header + entry)
        print(f"appended to {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
