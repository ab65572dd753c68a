"""The micro pretraining corpus in numbers, and its task pipelines' throughput.

Needs ``t2t data build micro_corpus``. Prints a markdown table of documents, words
(whitespace-separated) and `micro_sentencepiece` tokens per source and split, the
tokenizer's rate, and (unless --no-pipeline) the examples and tokens per CPU-second of the
``micro_span_corruption`` (T5 512/114, packed) and ``micro_lm`` (512, packed) pipelines with
one reader thread. Rates are per CPU-second of this process (``time.process_time``).

    python benchmarks/micro_corpus.py [--seconds 20] [--no-pipeline]
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
import time

from t2t.data import preprocessors as prep
from t2t.data.catalog import builders, micro
from t2t.data.converters import EncDecConverter, LMConverter
from t2t.data.tasks import get_task


def count(vocab) -> tuple[dict, float]:
    """{(source, split): [documents, words, tokens]} over the corpus; CPU seconds encoding."""
    counts: dict = collections.defaultdict(lambda: [0, 0, 0])
    cpu = 0.0
    for split in ("train", "validation"):
        path = builders.dataset_dir(micro.NAME) / f"{split}.jsonl"
        with open(path, encoding="utf-8") as f:
            for line in f:
                record = json.loads(line)
                t0 = time.process_time()
                n = len(vocab.encode(record["text"]))
                cpu += time.process_time() - t0
                row = counts[(record["source"], split)]
                row[0] += 1
                row[1] += len(record["text"].split())
                row[2] += n
    return counts, cpu


def table(counts: dict) -> str:
    sources = sorted({s for s, _ in counts}, key=lambda s: -counts[(s, "train")][2])
    lines = ["| source | documents train / val | words train / val | tokens train / val |",
             "|---|---:|---:|---:|"]
    total = collections.defaultdict(int)
    for source in sources:
        t, v = counts[(source, "train")], counts[(source, "validation")]
        lines.append(f"| {source} | {t[0]:,} / {v[0]:,} | {t[1]:,} / {v[1]:,} | "
                     f"{t[2]:,} / {v[2]:,} |")
        for k in range(3):
            total[("t", k)] += t[k]
            total[("v", k)] += v[k]
    lines.append("| **total** | " + " | ".join(
        f"{total[('t', k)]:,} / {total[('v', k)]:,}" for k in range(3)) + " |")
    return "\n".join(lines)


def pipeline_rate(task_name: str, converter, seconds: float, batch_size: int = 8) -> tuple:
    """(examples/s, non-padding tokens/s) per CPU-second after the first batch."""
    it = get_task(task_name).get_pipeline(converter, batch_size, 0, process_index=0,
                                          process_count=1, read_threads=1)
    next(it)
    examples = tokens = 0
    cpu0 = time.process_time()
    while time.process_time() - cpu0 < seconds:
        before = it.stats["examples"]
        batch = next(it)
        examples += it.stats["examples"] - before
        tokens += sum(int((batch[k] > 0).sum()) for k in batch if k.endswith("segment_ids"))
    cpu = time.process_time() - cpu0
    return examples / cpu, tokens / cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="CPU s per pipeline")
    parser.add_argument("--no-pipeline", action="store_true")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    vocab = micro.micro_sentencepiece()
    print(f"micro_sentencepiece: {vocab.vocab_size} ids, ready in "
          f"{time.perf_counter() - t0:.0f} s (training included if it was not cached)")
    counts, cpu = count(vocab)
    print(table(counts))
    tokens = sum(row[2] for row in counts.values())
    print(f"\ntokenizer: {tokens / cpu:,.0f} tokens/s per core (SentencePiece encode of "
          f"whole documents)")
    if not args.no_pipeline:
        _, targets = prep.span_corruption_lengths(512)
        for name, converter in [
                ("micro_span_corruption", EncDecConverter({"inputs": 512, "targets": targets})),
                ("micro_lm", LMConverter({"targets": 512}))]:
            e, t = pipeline_rate(name, converter, args.seconds)
            print(f"{name}: {e:,.0f} examples/s, {t:,.0f} non-padding tokens/s per core "
                  f"(batch 8, packed, one reader thread)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
