"""GPT-1's Table 5 ablation at a tiny scale: fine-tuning in the paper's input format with
the auxiliary LM objective (lambda = 0.5), without it (lambda = 0) and without pretraining,
on experiments/gpt1_format_paraphrase.gin (similarity) and gpt1_format_next_verse.gin
(multiple choice). Each run is one `t2t finetune` command, one at a time (nice 10), every
row once before the next seed; a rerun with the same --out skips the runs already in its
gpt1_format_table.json. Prints a markdown table: validation accuracy, mean ± half the
spread over the seeds, the LM loss L1 on the last logged training batch (per seed) and
wall time per run.

    python benchmarks/gpt1_format_table.py --out /tmp/gpt1fmt --pretrained runs/gpt_tiny \
        [--seeds 0 1] [--float32]

--pretrained: the MODEL_DIR of `t2t train --gin_file=experiments/gpt_tiny_bible.gin`.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

EXPERIMENTS = {"paraphrase": "experiments/gpt1_format_paraphrase.gin",
               "next_verse": "experiments/gpt1_format_next_verse.gin"}
# row -> (pretrained?, lambda)
ROWS = {"pretrained, lambda 0.5": (True, 0.5), "pretrained, lambda 0": (True, 0.0),
        "no pretraining, lambda 0.5": (False, 0.5)}


def model_dir_of(out: str, task: str, row: str, seed: int) -> str:
    use_pretrained, lm_weight = ROWS[row]
    return os.path.join(out, f"{task}_{'pre' if use_pretrained else 'scratch'}_"
                             f"{lm_weight}_{seed}")


def last_lm_loss(model_dir: str) -> float:
    """L1 on the last logged training batch (metrics.jsonl), logged whatever lambda is."""
    with open(os.path.join(model_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r["lm_loss"] for r in rows if "lm_loss" in r][-1]


def run(task: str, row: str, seed: int, pretrained: str, out: str, extra: list) -> dict:
    use_pretrained, lm_weight = ROWS[row]
    model_dir = model_dir_of(out, task, row, seed)
    checkpoint = f"'{pretrained}'" if use_pretrained else "None"
    cmd = ["nice", "-n", "10", sys.executable, "-m", "t2t.cli", "finetune",
           f"--gin_file={EXPERIMENTS[task]}", f"--gin.MODEL_DIR='{model_dir}'",
           f"--gin.INITIAL_CHECKPOINT={checkpoint}", f"--gin.LM_WEIGHT={lm_weight}",
           f"--gin.SEED={seed}", *extra]
    print("t2t " + " ".join(cmd[6:]), flush=True)
    start = time.time()
    subprocess.run(cmd, check=True)
    seconds = time.time() - start
    metrics = json.load(open(os.path.join(model_dir, "metrics.json")))
    validation = next(v for k, v in metrics.items() if k.endswith("/validation"))
    return {"task": task, "row": row, "seed": seed, "accuracy": validation["accuracy"],
            "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--pretrained", required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--tasks", nargs="+", default=list(EXPERIMENTS))
    parser.add_argument("--float32", action="store_true",
                        help="pin TransformerConfig.dtype to float32 (hardware/cpu.gin: 'auto')")
    args = parser.parse_args()
    extra = ["--gin.TransformerConfig.dtype='float32'"] if args.float32 else []
    os.makedirs(args.out, exist_ok=True)
    table = os.path.join(args.out, "gpt1_format_table.json")
    done = json.load(open(table)) if os.path.exists(table) else []   # rerun: resume
    for seed in args.seeds:
        for task in args.tasks:
            for row in ROWS:
                if any((r["task"], r["row"], r["seed"]) == (task, row, seed) for r in done):
                    continue
                done.append(run(task, row, seed, args.pretrained, args.out, extra))
                with open(table, "w") as f:
                    json.dump(done, f, indent=1)
    print("| task | row | validation accuracy (mean ± half spread) | seeds | "
          "L1 at the last step | wall per run |")
    print("|---|---|---:|---|---:|---:|")
    for task in args.tasks:
        for row in ROWS:
            mine = [r for r in done if (r["task"], r["row"]) == (task, row)]
            if not mine:
                continue
            acc = [r["accuracy"] for r in mine]        # metrics.json holds percent
            lm = [last_lm_loss(model_dir_of(args.out, task, row, r["seed"])) for r in mine]
            print(f"| {task} | {row} | {sum(acc) / len(acc):.1f} ± "
                  f"{(max(acc) - min(acc)) / 2:.1f} | "
                  f"{', '.join(f'{a:.1f}' for a in acc)} | "
                  f"{', '.join(f'{x:.2f}' for x in lm)} | "
                  f"{sum(r['seconds'] for r in mine) / len(mine):.0f} s |")


if __name__ == "__main__":
    main()
