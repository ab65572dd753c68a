"""Every table of a scale against its control, in one page: does pretraining help here?

    python -m t2t.ablations.overview GRID_FILE... [--scale micro] [--out_dir runs/ablations]
                                     [--render docs/ablations/micro_overview]

For each grid with a "Random init (control)" row: every pretrained row's gap to the control
in the scale's first average column (the mean over its seeds minus the control's, with half
the row's range) against twice the table's pooled seed sd, the margin the `micro` scale's
acceptance test asks pretraining to clear. Prints markdown; ``--render`` also writes
``<render>.md`` and ``<render>.png`` (a bar per row, grouped by table, its ±2 sd band grey).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import List, Optional, Sequence, Tuple

from t2t.ablations import grid as grid_lib, report, runner
from t2t.errors import ConfigError, UserError


@dataclasses.dataclass(frozen=True)
class Gap:
    """One pretrained row of one table against that table's control."""

    table: str
    row: str
    n: int              # seeds of the row
    mean: float         # the row's mean over its seeds
    half_range: float
    control: float      # the control's mean
    margin: float       # twice the table's pooled seed sd

    @property
    def gap(self) -> float:
        return self.mean - self.control

    @property
    def verdict(self) -> str:
        if self.gap > self.margin:
            return "above"
        return "below" if self.gap < -self.margin else "within"


def first_average(grid: grid_lib.Grid) -> Tuple[str, object]:
    """(header, fn) of the scale's first column that is not a held-out perplexity."""
    return next((h, fn) for h, fn in report.columns(grid) if not h.startswith("held-out"))


def gaps(grid: grid_lib.Grid, results: report.Results) -> List[Gap]:
    """The pretrained rows of `grid` with a result, against its control (none: [])."""
    control = report.random_init_row(grid)
    _, fn = first_average(grid)
    base = control and report.summarize([fn(r) for r in results.get(control.key, [])])
    spread = report.pooled_sd(grid, results, fn)
    if not base or spread is None:
        return []
    found = []
    for cell in grid.cells:
        row = report.summarize([fn(r) for r in results.get(cell.key, [])])
        if cell.pretrained and row:
            found.append(Gap(grid.title.split(":")[0], cell.label, row[2], row[0], row[1], base[0],
                             2 * spread[0]))
    return found


def markdown(found: Sequence[Gap], column: str) -> str:
    """A row per pretrained row, then the count of each verdict."""
    if not found:
        return "No table has a control row and a pretrained row with results yet."
    lines = [f"| table | row | seeds | {column} | control | gap | 2 × pooled sd | verdict |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    words = {"above": "**above**", "below": "**below**", "within": "within the noise"}
    for g in found:
        lines.append(f"| {g.table} | {g.row} | {g.n} | {g.mean:.2f} ±{g.half_range:.2f} | "
                     f"{g.control:.2f} | {g.gap:+.2f} | {g.margin:.2f} | {words[g.verdict]} |")
    counts = {v: sum(g.verdict == v for g in found) for v in words}
    tables = len(dict.fromkeys(g.table for g in found))
    lines += ["", f"Of {len(found)} pretrained rows in {tables} table"
              f"{'s' * (tables != 1)}, **{report.count_are(counts['above'])} above their "
              f"control** by more than twice their table's pooled seed sd, "
              f"{report.count_are(counts['within'])} within it and **"
              f"{report.count_are(counts['below'])} below** by more (a row shared by several "
              "tables, such as a copied baseline, is counted in each)."]
    return "\n".join(lines)


def plot(found: Sequence[Gap], column: str, title: str, path: str) -> str:
    """Horizontal bars of each row's gap (whiskers: half its seeds' range), grouped by
    table, with each table's ±2 pooled sd band shaded and zero (the control) drawn."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    fig, ax = plt.subplots(figsize=(8, 0.28 * len(found) + 1.6))
    colors = {"above": "tab:green", "within": "tab:gray", "below": "tab:red"}
    for i, g in enumerate(found):
        ax.barh(i, g.gap, xerr=g.half_range if g.n > 1 else None, capsize=2,
                color=colors[g.verdict])
        ax.fill_between([-g.margin, g.margin], i - 0.5, i + 0.5, color="0.9", zorder=0)
    starts = [i for i, g in enumerate(found) if i == 0 or found[i - 1].table != g.table]
    for i in starts[1:]:
        ax.axhline(i - 0.5, color="black", linewidth=0.5)
    ax.axvline(0, color="black", linewidth=1)
    ax.set_yticks(range(len(found)))
    ax.set_yticklabels([f"{g.table}: {g.row}" for g in found], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"{column}: row − control (grey: ±2 pooled seed sd of its table)",
                  fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.legend(handles=[Patch(color=c, label=f"{v} the control by more than 2 sd"
                             if v != "within" else "within 2 sd of the control")
                       for v, c in colors.items()], fontsize=7, loc="lower left")
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def overview(grid_files: Sequence[str], scale: str, out_dir: str,
             render: Optional[str] = None, command: Optional[str] = None) -> str:
    """The markdown page for the grids' finished cells (and, with `render`, its files;
    `command`: how it was produced, said on the page)."""
    found, column = [], None
    for path in grid_files:
        grid = grid_lib.load_grid(path, scale)
        if report.random_init_row(grid) is None:
            raise ConfigError(f"{path} has no control row at scale {scale!r}: the overview "
                              "compares each table's rows with its random-init control")
        column = column or first_average(grid)[0]
        found += gaps(grid, runner.load_results(grid, out_dir))
    title = f"Every pretrained row against its table's control (scale: {scale})"
    text = f"# {title}\n\n"
    if command:
        text += (f"Produced by `{command}` from each table's finished cells "
                 f"(`{out_dir}/<grid>/{scale}/<cell>/seed<k>/result.json`).\n\n")
    text += markdown(found, column or "Average") + "\n"
    if render:
        report.check_plotting()
        if found:
            plot(found, column, title, render + ".png")
            text += f"\n![the gaps]({os.path.basename(render)}.png)\n"
        with open(render + ".md", "w", encoding="utf-8") as f:
            f.write(text)
    return text


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m t2t.ablations.overview",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("grid_files", nargs="+", help="configs/ablations/<grid>.gin")
    parser.add_argument("--scale", default="micro")
    parser.add_argument("--out_dir", default="runs/ablations", help="where the cells ran")
    parser.add_argument("--render", default=None,
                        help="also write RENDER.md and RENDER.png, e.g. "
                             "docs/ablations/micro_overview")
    args = parser.parse_args(argv)
    try:
        command = " ".join(["python -m t2t.ablations.overview", *(argv or sys.argv[1:])])
        print(overview(args.grid_files, args.scale, args.out_dir, args.render, command))
    except (UserError, FileNotFoundError) as error:
        print(f"error: {str(error).splitlines()[0]}", file=sys.stderr)   # gin adds a line
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
