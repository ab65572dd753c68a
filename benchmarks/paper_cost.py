"""What reproducing each ablation table at the paper scale costs on TPU slices, by
`t2t ablate GRID --scale=paper --plan --hardware=H` (no TPU needed; libtpu compiles).

Each (grid, hardware) is one subprocess (a compiler crash costs one plan, not the run);
compiled steps accumulate in benchmarks/paper_cost/cache.json (keyed by what the step
depends on, so identical stages across tables compile once and a rerun compiles only what
is missing) and each plan's rows in benchmarks/paper_cost/<grid>@<hardware>.json. The table
goes between docs/ablations/paper_cost.md's markers.

    python benchmarks/paper_cost.py [--grids t5_table2,bert_table5] [--hardware tpu_v5e_256]
    python benchmarks/paper_cost.py --render-only
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DIR = Path(__file__).with_name("paper_cost")
CACHE = DIR / "cache.json"
PAGE = ROOT / "docs" / "ablations" / "paper_cost.md"
BEGIN, END = "<!-- paper-cost:begin -->", "<!-- paper-cost:end -->"
GRIDS = ("t5_table2", "t5_table4", "t5_table5", "t5_table6", "t5_table7", "bert_table5",
         "bert_table6", "transformer_modifications")
HARDWARE = ("tpu_v5e_256", "tpu_v5p_128")
# The papers' vocabulary files are not needed to compile (the scales' `plan` lines give
# their sizes), but their macros must be bound.
BINDINGS = ("--gin=T5_VOCABULARY='/unused/t5.spm'", "--gin=BERT_VOCABULARY='/unused/vocab.txt'")


def plan_file(grid: str, hardware: str) -> Path:
    return DIR / f"{grid}@{hardware}.json"


def run_plan(grid: str, hardware: str, timeout: int) -> int:
    out = plan_file(grid, hardware)
    command = [sys.executable, "-m", "t2t.cli", "ablate", f"t2t/configs/ablations/{grid}.gin",
               "--scale=paper", "--plan", f"--hardware={hardware}", f"--plan_cache={CACHE}",
               f"--json={out}", *BINDINGS]
    print("$", " ".join(command[2:]), flush=True)
    start = time.time()
    try:
        code = subprocess.run(command, cwd=ROOT, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        code = 124
    print(f"exit {code} after {time.time() - start:.0f} s", flush=True)
    return code


def render() -> str:
    """The docs table: per grid and slice, chip-hours (per seed) and the slice's hours."""
    rows = ["| table | slice | cells | stages not counted | chip-hours per seed | "
            "hours of the slice |", "|---|---|---:|---:|---:|---:|"]
    for grid in GRIDS:
        for hardware in HARDWARE:
            path = plan_file(grid, hardware)
            if not path.exists():
                rows.append(f"| {grid} | {hardware} | | | not planned yet | |")
                continue
            plan = json.loads(path.read_text())
            cells = len({s["cell"] for s in plan["stages"]})
            skipped = sum(s["step_time_s"] is None and "shares" not in s["note"]
                          for s in plan["stages"])
            hours = plan["chip_hours_per_seed"] / plan["chips"]
            rows.append(f"| {grid} | {plan['topology']} ({plan['chips']} chips) | {cells} | "
                        f"{skipped} | {plan['chip_hours_per_seed']:,.0f} | {hours:,.1f} |")
    return "\n".join(rows)


def write_page(table: str) -> None:
    text = PAGE.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    PAGE.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--grids", default=",".join(GRIDS))
    p.add_argument("--hardware", default=",".join(HARDWARE))
    p.add_argument("--redo", action="store_true", help="plan again where a plan exists")
    p.add_argument("--timeout", type=int, default=4 * 3600, help="seconds per plan")
    p.add_argument("--render-only", action="store_true")
    args = p.parse_args(argv)
    DIR.mkdir(exist_ok=True)
    if not args.render_only:
        for grid in args.grids.split(","):
            for hardware in args.hardware.split(","):
                if plan_file(grid, hardware).exists() and not args.redo:
                    continue
                run_plan(grid, hardware, args.timeout)
    write_page(render())
    print(f"wrote {os.path.relpath(PAGE, ROOT)}")


if __name__ == "__main__":
    main()
