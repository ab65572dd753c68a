"""One cell run twice, side by side seed by seed: did a rerun on another kind of host, under
other code or on a corpus built from other packages give the same numbers?

    python -m t2t.ablations.compare A_CELL_DIR B_CELL_DIR [--grid GRID_FILE]

A cell directory is ``<out>/<grid>/<scale>/<cell>``, holding ``seed<k>/result.json``; the
two may be cells of different grids that ran the same configuration (T5 Table 2's baseline
and the micro learning curve's 500-step row). The columns are the scale's, as its table
shows them (each average, each task's scored metric; BERT Table 6's held-out perplexity),
plus the final pretraining loss, taken from A's grid file (``configs/ablations/<grid>.gin``
unless ``--grid`` names it). For each seed both have: A, B and B − A per column; then the
mean and standard deviation of the paired differences, and what each side ran on (its
stages' precision, vocabulary file and code). Prints markdown.
"""
from __future__ import annotations

import argparse
import glob
import os
import statistics
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from t2t.ablations import grid as grid_lib, report, runner
from t2t.errors import ConfigError

Column = Tuple[str, Callable[[Dict[str, Any]], Optional[float]]]


def load_seeds(cell_dir: str) -> Dict[int, Dict[str, Any]]:
    """{seed: result} of a cell directory's finished seeds."""
    found = {}
    for path in sorted(glob.glob(os.path.join(cell_dir, "seed*", "result.json"))):
        result = runner.read_json(path)
        found[int(result["seed"])] = result
    if not found:
        raise ConfigError(f"{cell_dir} has no finished seed (no seed*/result.json): give a "
                          "cell directory such as runs/ablations/t5_table2/micro/<cell>")
    return found


def grid_columns(result: Dict[str, Any], grid_file: Optional[str] = None) -> List[Column]:
    """The scale's table columns for `result`'s grid, then the final pretraining loss."""
    from t2t.run.gin_utils import CONFIG_DIR
    path = grid_file or str(CONFIG_DIR / "ablations" / f"{result['grid']}.gin")
    grid = grid_lib.load_grid(path, result["scale"])
    return report.columns(grid) + [
        ("pretraining loss", lambda r: r["pretrain"].get("final_loss"))]


def ran_on(cell_dir: str, seeds: Sequence[int], results: Dict[int, Dict[str, Any]]) -> str:
    """'float32, spm_16000_fa8c….model, t2t 0.1.0 @ b309fee': what a side's seeds ran on."""
    precision, vocab, code = set(), set(), set()
    for seed in seeds:
        result = results[seed]
        stages = [os.path.join(cell_dir, f"seed{seed}", "pretrain")] + glob.glob(
            os.path.join(cell_dir, f"seed{seed}", "finetune", "*"))
        precision |= {runner.stage_precision(runner.read_text(os.path.join(d, "config.gin"))
                                             or "") for d in stages}
        vocab |= {st.get("vocabulary") for st in [result["pretrain"],
                                                   *result["finetune"].values()]}
        code.add(result.get("code"))
    said = lambda values: " / ".join(sorted(v for v in values if v)) or "unrecorded"  # noqa: E731
    return f"precision {said(precision)}; vocabulary {said(vocab)}; code {said(code)}"


def _fmt(value: Optional[float]) -> str:
    return "–" if value is None else f"{value:.2f}"


def compare(a_dir: str, b_dir: str, grid_file: Optional[str] = None) -> str:
    """The markdown comparison of two cell directories (module docstring)."""
    a, b = load_seeds(a_dir), load_seeds(b_dir)
    seeds = sorted(set(a) & set(b))
    if not seeds:
        raise ConfigError(f"{a_dir} has seeds {sorted(a)} and {b_dir} {sorted(b)}: none in "
                          "common to compare")
    columns = [(name, value) for name, value in grid_columns(a[seeds[0]], grid_file)
               if any(value(r[s]) is not None for r in (a, b) for s in seeds)]
    head = ["seed"] + [f"{name}: A / B / B − A" for name, _ in columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    deltas: Dict[str, List[float]] = {name: [] for name, _ in columns}
    for seed in seeds:
        cells = [str(seed)]
        for name, value in columns:
            x, y = value(a[seed]), value(b[seed])
            if x is None or y is None:
                cells.append(f"{_fmt(x)} / {_fmt(y)} / –")
                continue
            deltas[name].append(y - x)
            cells.append(f"{x:.2f} / {y:.2f} / {y - x:+.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    summary = ["mean ± sd of B − A"]
    for name, _ in columns:
        d = deltas[name]
        summary.append("–" if not d else f"{statistics.fmean(d):+.2f}"
                       + (f" ± {statistics.stdev(d):.2f}" if len(d) > 1 else "")
                       + f" (n={len(d)})")
    lines.append("| " + " | ".join(summary) + " |")
    return "\n".join([f"A: `{a_dir}` ({ran_on(a_dir, seeds, a)})",
                      f"B: `{b_dir}` ({ran_on(b_dir, seeds, b)})", ""] + lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m t2t.ablations.compare",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("a_dir")
    parser.add_argument("b_dir")
    parser.add_argument("--grid", default=None, help="A's grid file (default: by its name)")
    args = parser.parse_args(argv)
    try:
        print(compare(args.a_dir, args.b_dir, args.grid))
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
