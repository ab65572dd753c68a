"""The README's TPU table: paper-size models x the TPU hardware configs, by `t2t compile`.

Each cell is one `t2t compile --json` subprocess (a compiler crash costs one cell, not the
table): the model's paper pretraining setup (T5.1.1: span corruption, batch 128 x (512 + 114),
Adafactor; BERT: MLM + NSP, batch 256 x 128, AdamW; GPT-2: causal LM, batch 512 x 1024,
AdamW) on `configs/hardware/tpu_*.gin`. Vocabularies are the papers' padded to a multiple
of 128, as t2t pads a task's vocabulary. Results accumulate in compile_table.json (a
rerun compiles only missing cells); the table is written between the README's
compile-table markers.

    python benchmarks/compile_table.py [--models t5_base,bert_base] [--hardware v4-8] [--redo]
    python benchmarks/compile_table.py --render-only     # the README table from the JSON
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CELLS = Path(__file__).with_name("compile_table.json")
README = ROOT / "README.md"
BEGIN, END = "<!-- compile-table:begin -->", "<!-- compile-table:end -->"

T5 = ["objectives/span_3_15_u_u.gin", "runs/pretrain.gin", "--gin.CORPUS=c4",
      "--gin.BATCH_SIZE=128"]
BERT = ["objectives/bert_mlm_nsp.gin", "runs/pretrain_bert.gin", "--gin.CORPUS=wikipedia",
        "--gin.BATCH_SIZE=256", "--gin.TransformerConfig.vocab_size=30592"]
GPT = ["objectives/causal_lm.gin", "runs/pretrain_gpt.gin", "--gin.CORPUS=c4",
       "--gin.BATCH_SIZE=512", "--gin.TransformerConfig.vocab_size=50304"]
MODELS = {   # name: (label, model gin, run setup)
    "t5_base": ("T5.1.1-base", "models/t5/1_1/base.gin", T5),
    "t5_large": ("T5.1.1-large", "models/t5/1_1/large.gin", T5),
    "t5_xl": ("T5.1.1-XL", "models/t5/1_1/xl.gin", T5),
    "t5_xxl": ("T5.1.1-XXL", "models/t5/1_1/xxl.gin", T5),
    "bert_base": ("BERT-base", "models/bert/base.gin", BERT),
    "bert_large": ("BERT-large", "models/bert/large.gin", BERT),
    "gpt2_small": ("GPT-2 small", "models/gpt2/small.gin", GPT),
    "gpt2_xl": ("GPT-2 XL", "models/gpt2/xl.gin", GPT),
}
HARDWARE = {   # name: hardware gin (its TPU_TOPOLOGY / TPU_NUM_SLICES name the target)
    "v4-8": "hardware/tpu_v4_8.gin", "v4-128": "hardware/tpu_v4_128.gin",
    "v5e-8": "hardware/tpu_v5e_8.gin", "v5e-256": "hardware/tpu_v5e_256.gin",
    "2 x v5e-256": "hardware/tpu_v5e_256x2.gin", "v5p-128": "hardware/tpu_v5p_128.gin",
    "v6e-64": "hardware/tpu_v6e_64.gin",
}


def command(model: str, hardware: str, json_path: str) -> list[str]:
    _, model_gin, setup = MODELS[model]
    files = [model_gin] + [a for a in setup if not a.startswith("--")] + [HARDWARE[hardware]]
    flags = [a for a in setup if a.startswith("--")]
    return ([sys.executable, "-m", "t2t.cli", "compile"] + [f"--gin_file={f}" for f in files]
            + flags + ["--gin.experiment.vocab_size_from_task=False", f"--json={json_path}"])


def run_cell(model: str, hardware: str) -> dict:
    """One `t2t compile`: its JSON, or the error line / signal it ended with."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cell.json")
        cmd = command(model, hardware, out)
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        shown = " ".join(["t2t compile"] + cmd[4:-1])
        if os.path.exists(out):
            with open(out) as f:
                return {**json.load(f), "seconds": seconds, "command": shown,
                        "exit_code": proc.returncode}
    lines = [l for l in (proc.stdout + proc.stderr).splitlines() if l.strip()]
    error = next((l for l in reversed(lines) if "error:" in l), lines[-1] if lines else "")
    if proc.returncode < 0:
        error = f"compiler crashed (signal {-proc.returncode})"
    return {"error": re.sub(r" \(details: .*$", "", error), "exit_code": proc.returncode,
            "seconds": seconds, "command": shown}


def render(cells: dict) -> str:
    """Markdown: one row per model, one column per hardware config."""
    hw = list(HARDWARE)
    head = "| model | " + " | ".join(hw) + " |\n|---|" + "---:|" * len(hw) + "\n"
    rows = []
    for model, (label, _, _) in MODELS.items():
        cols = []
        for h in hw:
            cell = cells.get(f"{model}|{h}")
            if cell is None:
                cols.append("—")
            elif "error" in cell:
                cols.append("error")
            else:
                b = cell["bytes_per_chip"]["total"] / 1024 ** 3
                mark = "" if cell["fits"] else " ✗"
                time_ms = cell["step_time_s"] * 1e3 if cell.get("step_time_s") else None
                mfu = cell.get("mfu_ceiling")
                cols.append(f"{b:.1f}{mark}" + (f" · {time_ms:.0f} ms" if time_ms else "")
                            + (f" · {mfu:.0%}" if mfu else ""))
        rows.append(f"| {label} | " + " | ".join(cols) + " |")
    errors = sorted({c["error"] for c in cells.values() if "error" in c})
    notes = "".join(f"\nerror: {e}" for e in errors)
    return head + "\n".join(rows) + ("\n" + notes if notes else "") + "\n"


def write_readme(table: str) -> None:
    text = README.read_text()
    if BEGIN not in text or END not in text:
        print(f"README has no {BEGIN} ... {END} markers; table not written", file=sys.stderr)
        return
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    README.write_text(head + BEGIN + "\n" + table + END + tail)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--hardware", default=",".join(HARDWARE))
    parser.add_argument("--redo", action="store_true", help="recompile cells already done")
    parser.add_argument("--no-readme", action="store_true")
    parser.add_argument("--render-only", action="store_true", help="compile nothing")
    args = parser.parse_args()
    cells = json.loads(CELLS.read_text()) if CELLS.exists() else {}
    for hardware in args.hardware.split(","):
        for model in args.models.split(","):
            key = f"{model}|{hardware}"
            if args.render_only or (key in cells and "error" not in cells[key]
                                    and not args.redo):
                continue            # done (errors are retried: most are the config's)
            cells[key] = run_cell(model, hardware)
            c = cells[key]
            print(f"{key}: {c.get('verdict') or c.get('error')} ({c['seconds']:.0f} s)",
                  flush=True)
            CELLS.write_text(json.dumps(cells, indent=1, sort_keys=True) + "\n")
    table = render(cells)
    print(table)
    if not args.no_readme:
        write_readme(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
