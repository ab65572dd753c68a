"""docs/tpu.md's TPU table: paper-size models x the TPU hardware configs, by `t2t compile`.

Each cell is one `t2t compile --json` subprocess (a compiler crash costs one cell, not the
table): the model's paper pretraining setup (T5.1.1: span corruption, batch 128 x (512 + 114),
Adafactor; BERT: MLM + NSP, batch 256 x 128, AdamW; GPT-2: causal LM, batch 512 x 1024,
AdamW) on `configs/hardware/tpu_*.gin`. Vocabularies are the papers' padded to a multiple
of 128, as t2t pads a task's vocabulary. Results accumulate in compile_table.json (a
rerun compiles only missing cells); the table is written between docs/tpu.md's
compile-table markers (the kernel table between its kernel-table markers).

    python benchmarks/compile_table.py [--models t5_base,bert_base] [--hardware v4-8] [--redo]
    python benchmarks/compile_table.py --microbatches    # what makes the ✗ cells fit
    python benchmarks/compile_table.py --render-only     # the docs table from the JSON

A cell that does not fit can be compiled again with its global batch split into
microbatches (TrainConfig.num_microbatches: gradients accumulated over 2, 4, ... passes, the
same update): `--microbatches` finds the fewest that fit and the table's footnote names them.
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
PAGE = ROOT / "docs" / "tpu.md"
BEGIN, END = "<!-- compile-table:begin -->", "<!-- compile-table:end -->"
KERNEL_BEGIN, KERNEL_END = "<!-- kernel-table:begin -->", "<!-- kernel-table:end -->"

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
# libtpu 0.0.42.1 crashes (SIGSEGV: a stack overflow in the convolution emitter's fusion-cost
# recursion) compiling some bfloat16 steps with scanned layers; turning off its fusion of
# producers into matmul inputs avoids it (docs/tpu.md).
LIBTPU_WORKAROUND = "--xla_jf_conv_input_fusion=false"
# A model whose heads the hardware config's tensor axis does not divide (GPT-2 XL: 25) gets
# tensor=1 with the same chips on fsdp; the cell records the override (its "overrides").
MESH_OVERRIDES = {
    ("gpt2_xl", "v5e-256"): ["--gin.MeshConfig.tensor=1", "--gin.MeshConfig.fsdp=16"],
    ("gpt2_xl", "2 x v5e-256"): ["--gin.MeshConfig.tensor=1", "--gin.MeshConfig.fsdp=32"],
}
# The memory table is XLA attention; the kernel table compares it with the TPU splash
# kernel (t2t/nn/attention_kernels.py) at 2048 tokens, without attention-probability
# dropout (splash has none) in both columns.
XLA = ["--gin.TransformerConfig.attention_kernel='xla'"]
KERNEL_HARDWARE = "v5e-256"
KERNEL_MODELS = {   # name: (label, model, extra flags)
    "gpt2_small": ("GPT-2 small, 512 x 2048", "gpt2_small",
                   ["--gin.TASK_FEATURE_LENGTHS={'targets': 2048}",
                    "--gin.TransformerConfig.max_length=2048",
                    "--gin.TransformerConfig.attention_dropout_rate=0.0"]),
    "t5_base": ("T5.1.1-base, 128 x (2048 + 512)", "t5_base",
                ["--gin.TASK_FEATURE_LENGTHS={'inputs': 2048, 'targets': 512}"]),
}
KERNELS = ("xla", "splash")
MICROBATCHES = (2, 4, 8, 16, 32)    # tried in order on a cell that does not fit
HARDWARE = {   # name: hardware gin (its TPU_TOPOLOGY / TPU_NUM_SLICES name the target)
    "v4-8": "hardware/tpu_v4_8.gin", "v4-128": "hardware/tpu_v4_128.gin",
    "v5e-8": "hardware/tpu_v5e_8.gin", "v5e-256": "hardware/tpu_v5e_256.gin",
    "2 x v5e-256": "hardware/tpu_v5e_256x2.gin", "v5p-128": "hardware/tpu_v5p_128.gin",
    "v6e-64": "hardware/tpu_v6e_64.gin",
}


def command(model: str, hardware: str, json_path: str, extra: list[str]) -> list[str]:
    _, model_gin, setup = MODELS[model]
    files = [model_gin] + [a for a in setup if not a.startswith("--")] + [HARDWARE[hardware]]
    flags = [a for a in setup if a.startswith("--")] + extra
    return ([sys.executable, "-m", "t2t.cli", "compile"] + [f"--gin_file={f}" for f in files]
            + flags + ["--gin.experiment.vocab_size_from_task=False", f"--json={json_path}"])


def run_cell(model: str, hardware: str, extra: list[str], crashed: bool = False) -> dict:
    """One `t2t compile` with `extra` flags: its JSON, or the error line / signal it ended
    with; mesh overrides are recorded. A cell libtpu crashed on (`crashed`, or now) is
    compiled with LIBTPU_WORKAROUND, and the cell records it ("libtpu_flags")."""
    overrides = MESH_OVERRIDES.get((model, hardware), [])
    flags = LIBTPU_WORKAROUND if crashed else ""
    cell = _compile_cell(model, hardware, extra + overrides, flags)
    if not flags and cell.get("exit_code") == -11:
        flags = LIBTPU_WORKAROUND
        cell = _compile_cell(model, hardware, extra + overrides, flags)
    cell = {**cell, "overrides": overrides} if overrides else cell
    return {**cell, "libtpu_flags": flags} if flags else cell


def fewest_microbatches(model: str, hardware: str, cell: dict) -> dict:
    """The cell that does not fit, compiled with its batch in 2, 4, ... microbatches until
    one fits: {"num_microbatches", "total_bytes", "step_time_s"} of the first that does, or
    {"num_microbatches": None, "tried": [...], "total_bytes": at the last} when none of
    MICROBATCHES fits (what is left is the state: parameters, gradients, optimizer)."""
    extra = XLA + cell.get("overrides", [])
    tried, total = [], None
    for n in MICROBATCHES:
        got = _compile_cell(model, hardware, extra + [f"--gin.TrainConfig.num_microbatches={n}"],
                            cell.get("libtpu_flags", ""))
        tried.append(n)
        print(f"  {n} microbatches: {got.get('verdict') or got.get('error')} "
              f"({got['seconds']:.0f} s)", flush=True)
        total = got["bytes_per_chip"]["total"] if "bytes_per_chip" in got else total
        if got.get("fits"):
            return {"num_microbatches": n, "total_bytes": total,
                    "step_time_s": got.get("step_time_s"), "seconds": got["seconds"]}
    return {"num_microbatches": None, "tried": tried, "total_bytes": total}


def _compile_cell(model: str, hardware: str, extra: list[str], libtpu_flags: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cell.json")
        cmd = command(model, hardware, out, extra)
        env = dict(os.environ)
        if libtpu_flags:
            env["LIBTPU_INIT_ARGS"] = (env.get("LIBTPU_INIT_ARGS", "") + " " + libtpu_flags).strip()
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
        seconds = time.perf_counter() - start
        shown = " ".join(["t2t compile"] + cmd[4:-1])
        if libtpu_flags:
            shown = f"LIBTPU_INIT_ARGS={libtpu_flags} {shown}"
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


def _gib(cell: dict, what: str) -> float:
    return cell["bytes_per_chip"][what] / 1024 ** 3


def render(cells: dict) -> str:
    """Markdown: one row per model, one column per hardware config."""
    hw = list(HARDWARE)
    head = "| model | " + " | ".join(hw) + " |\n|---|" + "---:|" * len(hw) + "\n"
    rows, overridden, worked_around, microbatched = [], {}, {}, {}
    for model, (label, _, _) in MODELS.items():
        cols = []
        for h in hw:
            cell = cells.get(f"{model}|{h}")
            if cell is None:
                cols.append("—")
                continue
            if "error" in cell:
                cols.append("error")
                continue
            mark = "" if cell["fits"] else " ✗"
            micro = cell.get("microbatched")
            if micro:
                microbatched[f"{label} on {h}"] = micro
                mark += " §"
            if cell.get("libtpu_flags"):
                worked_around[f"{label} on {h}"] = cell["libtpu_flags"]
                mark += " ‡"
            if cell.get("overrides"):
                overridden[f"{label} on {h}"] = " ".join(
                    o.replace("--gin.", "") for o in cell["overrides"])
                mark += " †"
            time_ms = cell["step_time_s"] * 1e3 if cell.get("step_time_s") else None
            mfu = cell.get("mfu_ceiling")
            cols.append(f"{_gib(cell, 'total'):.1f}{mark}"
                        + (f" · {time_ms:.0f} ms" if time_ms else "")
                        + (f" · {mfu:.0%}" if mfu else ""))
        rows.append(f"| {label} | " + " | ".join(cols) + " |")
    notes = "".join(f"\n† {where}: {what}" for where, what in overridden.items())
    notes += "".join(f"\n‡ {where}: LIBTPU_INIT_ARGS={what}" for where, what in
                     worked_around.items())
    notes += "".join(f"\n§ {where}: {_microbatch_note(m)}" for where, m in microbatched.items())
    errors = sorted({c["error"] for k, c in cells.items() if "error" in c and "@" not in k})
    notes += "".join(f"\nerror: {e}" for e in errors)
    return head + "\n".join(rows) + ("\n" + notes if notes else "") + "\n"


def _microbatch_note(micro: dict) -> str:
    n = micro["num_microbatches"]
    gib = (micro.get("total_bytes") or 0) / 1024 ** 3
    if n is None:
        return (f"does not fit in {micro['tried'][0]}–{micro['tried'][-1]} microbatches either "
                f"({gib:.1f} GiB at {micro['tried'][-1]}: mostly parameters, gradients and "
                "optimizer state): a larger slice")
    return f"fits with TrainConfig.num_microbatches={n} ({gib:.1f} GiB; the same FLOPs)"


def kernel_key(model: str, kernel: str) -> str:
    return f"{model}@{kernel}|{KERNEL_HARDWARE}"


def render_kernels(cells: dict) -> str:
    """Markdown: per-chip temporaries and total with XLA attention and with splash."""
    head = ("| model, batch x tokens | " + " | ".join(
        f"{k}: temporaries · total" for k in KERNELS) + " | temporaries saved |\n|---|"
        + "---:|" * (len(KERNELS) + 1) + "\n")
    rows = []
    for name, (label, _, _) in KERNEL_MODELS.items():
        got = [cells.get(kernel_key(name, k)) for k in KERNELS]
        cols = ["—" if c is None else "error" if "error" in c else
                f"{_gib(c, 'temporaries'):.2f} · {_gib(c, 'total'):.2f}" for c in got]
        done = [c for c in got if c is not None and "error" not in c]
        saved = (f"{1 - _gib(done[1], 'temporaries') / _gib(done[0], 'temporaries'):.0%}"
                 if len(done) == 2 else "—")
        rows.append(f"| {label} | " + " | ".join(cols) + f" | {saved} |")
    errors = sorted({c["error"] for k, c in cells.items() if "error" in c and "@" in k})
    return head + "\n".join(rows) + "".join(f"\nerror: {e}" for e in errors) + "\n"


def write_page(table: str, begin: str = BEGIN, end: str = END) -> None:
    text = PAGE.read_text()
    if begin not in text or end not in text:
        print(f"{PAGE} has no {begin} ... {end} markers; table not written", file=sys.stderr)
        return
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    PAGE.write_text(head + begin + "\n" + table + end + tail)


def _store(key: str, cell: dict) -> None:
    """Add one cell to the JSON as it is on disk now (another run may have added some)."""
    cells = json.loads(CELLS.read_text()) if CELLS.exists() else {}
    cells[key] = cell
    CELLS.write_text(json.dumps(cells, indent=1, sort_keys=True) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--hardware", default=",".join(HARDWARE))
    parser.add_argument("--kernels", action="store_true",
                        help=f"the attention-kernel table ({', '.join(KERNEL_MODELS)} on "
                        f"{KERNEL_HARDWARE}) instead of the memory table")
    parser.add_argument("--redo", action="store_true", help="recompile cells already done")
    parser.add_argument("--microbatches", action="store_true",
                        help="for each cell that does not fit, the fewest microbatches that do")
    parser.add_argument("--no-readme", action="store_true")
    parser.add_argument("--render-only", action="store_true", help="compile nothing")
    args = parser.parse_args()
    cells = json.loads(CELLS.read_text()) if CELLS.exists() else {}
    if args.kernels:
        todo = [(kernel_key(name, k), model, KERNEL_HARDWARE, flags + [
            f"--gin.TransformerConfig.attention_kernel='{k}'"])
            for name, (_, model, flags) in KERNEL_MODELS.items() for k in KERNELS
            if name in args.models.split(",")]
    else:
        todo = [(f"{m}|{h}", m, h, XLA) for h in args.hardware.split(",")
                for m in args.models.split(",")]
    if args.microbatches and not args.render_only:
        for key, model, hardware, _ in todo:
            cell = cells.get(key)
            if cell is None or "error" in cell or cell["fits"] or (
                    "microbatched" in cell and not args.redo):
                continue
            print(f"{key}: does not fit; trying microbatches", flush=True)
            cell["microbatched"] = fewest_microbatches(model, hardware, cell)
            _store(key, cell)
        todo = []
    for key, model, hardware, extra in todo:
        if args.render_only or (key in cells and "error" not in cells[key] and not args.redo):
            continue            # done (errors are retried: most are the config's)
        crashed = cells.get(key, {}).get("exit_code") == -11 or "libtpu_flags" in cells.get(key, {})
        cells[key] = c = run_cell(model, hardware, extra, crashed)
        print(f"{key}: {c.get('verdict') or c.get('error')} ({c['seconds']:.0f} s)",
              flush=True)
        _store(key, c)
    cells = json.loads(CELLS.read_text()) if CELLS.exists() else cells
    tables = [(render(cells), BEGIN, END),
              (render_kernels(cells), KERNEL_BEGIN, KERNEL_END)]
    for table, begin, end in tables:
        print(table)
        if not args.no_readme:
            write_page(table, begin, end)
    return 0


if __name__ == "__main__":
    sys.exit(main())
