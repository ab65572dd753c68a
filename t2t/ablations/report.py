"""Renders a grid's finished cells: a markdown table in the paper's layout (our numbers,
then the paper's published ones, labelled), the pretrained baseline's margin over the
random-init control, which of the paper's row orderings hold here, a compute table, and a
PNG plot.

Our numbers are the mean over the seeds that finished, with ``±`` half their range (for 2
seeds: half the difference), and ``n`` seeds where not every cell has the same count.
"""
from __future__ import annotations

import collections
import itertools
import math
import os
import statistics
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from t2t.ablations.grid import CONTROL_LABEL, Grid
from t2t.ablations.runner import FINISHED, stage_cpu_s, stage_seed_dir
from t2t.errors import UserError

Results = Dict[str, List[Dict[str, Any]]]   # cell key -> result per seed


def metric_value(result: Dict[str, Any], task: str, metric: str) -> Optional[float]:
    stage = result["finetune"].get(task, {})
    value = stage.get("metrics", {}).get(metric)
    return None if value is None else float(value)


def heldout_perplexity(result: Dict[str, Any], key: str = "heldout") -> Optional[float]:
    """exp of the held-out loss after pretraining (`key="heldout_early"`: at the scale's
    early step)."""
    held = result["pretrain"].get(key)
    if not held or held.get(held["metric"]) is None:
        return None
    return math.exp(min(float(held[held["metric"]]), 50.0))


def average(result: Dict[str, Any], tasks: Sequence[Tuple[str, str]]) -> Optional[float]:
    """Mean of the tasks' reported metrics (None unless all are there), as T5's GLUE."""
    values = [metric_value(result, t, m) for t, m in tasks]
    return None if any(v is None for v in values) else statistics.fmean(values)


def columns(grid: Grid) -> List[Tuple[str, Any]]:
    """(header, function of one result -> number) for our measured columns: the scale's
    averages, then each task that is in no average (every task with `task_columns`)."""
    metric_of = dict(grid.scale.tasks)
    grouped = set() if grid.scale.task_columns else {
        t for _, names in grid.scale.averages for t in names}
    cols = [(column, (lambda r, ts=tuple((t, metric_of[t]) for t in names): average(r, ts)))
            for column, names in grid.scale.averages]
    cols += [(f"{task} {metric}", (lambda r, t=task, m=metric: metric_value(r, t, m)))
             for task, metric in grid.scale.tasks if task not in grouped]
    if grid.scale.heldout:
        cols.insert(0, ("held-out ppl", heldout_perplexity))
    if grid.scale.heldout and grid.scale.heldout_early:
        cols.insert(0, (f"held-out ppl at {grid.scale.heldout_early}",
                        lambda r: heldout_perplexity(r, "heldout_early")))
    return cols


def summarize(values: Sequence[Optional[float]]) -> Optional[Tuple[float, float, int]]:
    """(mean, half range, n) of the present values."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    return statistics.fmean(present), (max(present) - min(present)) / 2, len(present)


def seed_list(found: Sequence[Mapping[str, Any]]) -> str:
    """The seeds a cell finished, e.g. '0, 1, 2' ('–' for none)."""
    return ", ".join(str(s) for s in sorted(r["seed"] for r in found)) or "–"


def pooled_sd(grid: Grid, results: Results, fn) -> Optional[Tuple[float, int]]:
    """(pooled standard deviation over seeds, cells pooled) of a column: the square root of
    the mean of the per-cell sample variances, over cells with at least 2 seeds."""
    variances = []
    for cell in grid.cells:
        values = [v for v in (fn(r) for r in results.get(cell.key, [])) if v is not None]
        if len(values) >= 2:
            variances.append(statistics.variance(values))
    return (math.sqrt(statistics.fmean(variances)), len(variances)) if variances else None


def random_init_row(grid: Grid):
    """The cell fine-tuned from random initialisation (the control row), or None."""
    return next((c for c in grid.cells if not c.pretrained), None)


def control_margins(grid: Grid, results: Results) -> List[str]:
    """Per measured column, the `control` cell (or, without one, every pretrained cell)
    against the row fine-tuned from random initialisation: the margin, the pooled seed
    spread, and whether the margin exceeds twice it (the `micro` scale's acceptance test:
    pretraining must matter more than the seed does)."""
    control = random_init_row(grid)
    if control is None:
        return []
    compared = [c for c in grid.cells if c.pretrained
                and (not grid.control or c.label == grid.control)]
    lines = []
    for header, fn in columns(grid):
        if header.startswith("held-out"):
            continue
        ctrl = summarize([fn(r) for r in results.get(control.key, [])])
        spread = pooled_sd(grid, results, fn)
        for cell in compared:
            base = summarize([fn(r) for r in results.get(cell.key, [])])
            if base is None or ctrl is None or spread is None:
                lines.append(f"- {header}, {cell.label}: not yet measured (needs both rows "
                             "and a row with 2+ seeds)")
                continue
            margin = base[0] - ctrl[0]
            verdict = "met" if margin > 2 * spread[0] else "not met"
            lines.append(f"- {header}: {cell.label} {base[0]:.2f} (n={base[2]}) − control "
                         f"{ctrl[0]:.2f} (n={ctrl[2]}) = **{margin:+.2f}**; pooled seed sd "
                         f"{spread[0]:.2f} over {spread[1]} rows; margin > 2 sd: **{verdict}**")
    return lines


def lower_is_better(column: str) -> bool:
    """Perplexity columns ('held-out ppl', the paper's 'LM (ppl)') rank the other way."""
    return "ppl" in column


def paper_orderings(grid: Grid, results: Results) -> List[str]:
    """Per `ablation.orderings` pair (our column -> the paper's), every two rows that have
    both a paper value and a result of ours, oriented as the paper orders them: does our
    difference hold (more than twice the pooled seed sd in the paper's direction), reverse
    (as much the other way) or sit within our seed noise? Pairs the paper itself cannot
    separate (within twice its stated run-to-run sd) are counted apart. Markdown lines."""
    ours = dict(columns(grid))
    lines = []
    for our_column, paper_column in grid.orderings.items():
        if our_column in ours:
            lines += _orderings(grid, results, our_column, ours[our_column], paper_column)
    return lines


def paired_rows(grid: Grid, results: Results, fn, paper_column: str):
    """[(row number from 1, label, paper value, our (mean, half range, n))] for the rows
    with both a paper value and a result of ours in the column `fn` computes."""
    j = grid.paper_columns.index(paper_column)
    rows = [(i, cell.label, grid.paper[cell.label][j],
             summarize([fn(r) for r in results.get(cell.key, [])]))
            for i, cell in enumerate(grid.cells, 1) if cell.label in grid.paper]
    return [row for row in rows if row[3] is not None]


def _orderings(grid: Grid, results: Results, our_column: str, fn, paper_column: str):
    sign, our_sign = (-1 if lower_is_better(c) else 1 for c in (paper_column, our_column))
    rows = [(label, paper, ours[0])
            for _, label, paper, ours in paired_rows(grid, results, fn, paper_column)]
    spread = pooled_sd(grid, results, fn)
    head = f"`{our_column}` against the paper's `{paper_column}`"
    if len(rows) < 2 or spread is None:
        return [f"{head}: not yet measured (needs two rows with paper values and results, "
                "and a row with 2+ seeds)", ""]
    tie = 2 * grid.paper_sd.get(paper_column, 0.0)
    pairs = []                                   # (paper gap, our gap, verdict, a, b)
    for a, b in itertools.combinations(rows, 2):
        if sign * (a[1] - b[1]) < 0:
            a, b = b, a                                   # a: the row the paper ranks higher
        paper_gap, our_gap = sign * (a[1] - b[1]), our_sign * (a[2] - b[2])
        pairs.append((paper_gap, our_gap, _verdict(paper_gap, our_gap, tie, spread[0]),
                      a[0], b[0]))
    better = {c: "lower is better" if lower_is_better(c) else "higher is better"
              for c in (our_column, paper_column)}
    direction = (better[our_column] if sign == our_sign else
                 ", ".join(f"{c}: {b}" for c, b in better.items()))
    summary = (f"{head} ({direction}), every two of the {len(rows)} rows with both: "
               + _pairs_summary(pairs, grid.paper_sd.get(paper_column))
               + f" (our pooled seed sd: {spread[0]:.2f} over {spread[1]} rows).")
    pretrained = [p for p in pairs if CONTROL_LABEL not in p[3:]]
    if len(pretrained) < len(pairs) and pretrained:
        summary += (" Among the pretrained rows alone (the control left out): "
                    + _pairs_summary(pretrained, grid.paper_sd.get(paper_column)) + ".")
    table = [f"| {a} > {b} | {paper_gap:+.2f} | {our_gap:+.2f} | "   # seeds all alike: sd 0
             + (f"{our_gap / spread[0]:+.1f}" if spread[0] else "–") + " | "
             + (f"**{verdict}**" if verdict == "reversed" else verdict) + " |"
             for paper_gap, our_gap, verdict, a, b in sorted(pairs, key=lambda p: -p[0])]
    return [summary, "", "<details><summary>The pairs, by the paper's gap</summary>", "",
            "| paper's order | paper gap | our gap | our gap / sd | here |",
            "|---|---|---|---|---|", *table, "", "</details>", ""]


def _pairs_summary(pairs, paper_sd: Optional[float]) -> str:
    """'of N pairs the paper separates …; here H hold …, R are reversed …, and W are within
    our noise …; Kendall's τ …' for [(paper gap, our gap, verdict, …)]."""
    counts = collections.Counter(p[2] for p in pairs)
    separated = len(pairs) - counts["a tie in the paper"]
    same, other = counts["within noise, same direction"], counts["within noise, other direction"]
    tie_text = (f"the paper separates {separated} (a gap above twice its run-to-run sd, "
                f"{paper_sd:g}; {count_are(len(pairs) - separated)} a tie there)"
                if paper_sd is not None else f"the paper orders {separated}")
    concordance = sum((1 if our > 0 else -1) for paper, our, *_ in pairs if paper > 0 and our)
    noun = "pair" if len(pairs) == 1 else "pairs"
    return (f"of {len(pairs)} {noun} {tie_text}; here **{counts['holds']} hold** by more than "
            f"twice our pooled seed sd, **{count_are(counts['reversed'])} reversed** by as much, "
            f"and {count_are(same + other)} within our noise ({same} of them in the paper's "
            f"direction); Kendall's τ between the two rankings {concordance / len(pairs):+.2f}")


def _verdict(paper_gap: float, our_gap: float, tie: float, sd: float) -> str:
    """One pair, oriented so that the paper ranks its first row higher (`paper_gap` >= 0)."""
    if paper_gap <= tie:
        return "a tie in the paper"
    if abs(our_gap) > 2 * sd:
        return "holds" if our_gap > 0 else "reversed"
    return "within noise, same direction" if our_gap > 0 else "within noise, other direction"


def count_are(n: int) -> str:
    """"1 is", "2 are", ...: a count and its verb."""
    return f"{n} is" if n == 1 else f"{n} are"


def unigram_line(grid: Grid, results: Results) -> str:
    """The held-out perplexity's floor: the same targets scored by the training targets'
    frequencies alone (mean over the results that measured it; '' if none did)."""
    found = [r["pretrain"]["heldout"]["unigram"] for rs in results.values() for r in rs
             if "unigram" in r["pretrain"].get("heldout", {})]
    if not found:
        return ""
    ppl = summarize([math.exp(u["loss"]) for u in found])
    return (f"Unigram baseline of `held-out ppl`: **{ppl[0]:.1f}** (the held-out targets "
            f"scored by the frequencies of {found[0]['train_targets']:,} training targets, "
            f"add-one smoothed; mean of {ppl[2]} measurements): a perplexity below it is "
            "learning.")


def _fmt(summary: Optional[Tuple[float, float, int]], seeds: int, digits: int = 2) -> str:
    if summary is None:
        return "–"
    mean, spread, n = summary
    text = f"{mean:.{digits}f}"
    if n > 1:
        text += f" ±{spread:.{digits}f}"
    if n != seeds:
        text += f" (n={n})"
    return text


def _accounting(grid: Grid, results: Results) -> Dict[str, Dict[str, float]]:
    """T5 Table 2's Params (in P) and Cost (in M) per cell, from the measured models:
    non-embedding parameters over the P cell's, layer FLOPs per row (dense + attention,
    no logits) over the M cell's."""
    by_label = {c.label: c.key for c in grid.cells}
    out: Dict[str, Dict[str, float]] = {}

    def first(key: str) -> Optional[Dict[str, Any]]:
        return (results.get(key) or [None])[0]

    def layer_flops(r: Dict[str, Any]) -> float:
        f = r["pretrain"]["forward_flops_per_row"]
        return f["dense"] + f["attention"]

    p_ref = first(by_label[grid.accounting["P"]]) if "P" in grid.accounting else None
    m_ref = first(by_label[grid.accounting["M"]]) if "M" in grid.accounting else None
    for cell in grid.cells:
        r = first(cell.key)
        if r is None or "nonembedding_params" not in r["pretrain"]:
            continue                      # a control row: no pretrained model measured
        row = {}
        if p_ref:
            row["P"] = r["pretrain"]["nonembedding_params"] / p_ref["pretrain"][
                "nonembedding_params"]
        if m_ref:
            row["M"] = layer_flops(r) / layer_flops(m_ref)
        out[cell.key] = row
    return out


def paper_digits(grid: Grid) -> List[int]:
    """Decimals per paper column, as printed in the paper (the most any value shows:
    gin reads 38.40 as 38.4)."""
    def decimals(v: float) -> int:
        text = repr(float(v))
        return 0 if text.endswith(".0") else len(text.split(".")[1])
    return [max((decimals(row[i]) for row in grid.paper.values()), default=0)
            for i in range(len(grid.paper_columns))]


def results_table(grid: Grid, results: Results) -> str:
    """The paper's layout: one row per cell, our columns, then the paper's."""
    cols = columns(grid)
    seeds = len(grid.scale.seeds)
    acct = _accounting(grid, results) if grid.accounting else {}
    header = list(grid.axes) + ["seeds"]
    if grid.accounting:
        header += ["Params", "Cost"]
    header += [h for h, _ in cols] + [f"paper: {c}" for c in grid.paper_columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    digits = paper_digits(grid)
    for cell in grid.cells:
        row = [label for _, label in cell.labels] + [seed_list(results.get(cell.key, []))]
        if grid.accounting:
            a = acct.get(cell.key, {})
            row += [f"{a['P']:.2f}P" if "P" in a else "–", f"{a['M']:.2f}M" if "M" in a else "–"]
        found = results.get(cell.key, [])
        row += [_fmt(summarize([fn(r) for r in found]), seeds) for _, fn in cols]
        paper = grid.paper.get(cell.label)
        row += ([f"{v:.{d}f}" for v, d in zip(paper, digits)] if paper
                else ["–"] * len(grid.paper_columns))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def _human(x: float) -> str:
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.2f}{unit}"
    return f"{x:.0f}"


def _copied(stages: Sequence[Mapping[str, Any]]) -> str:
    """' (ran in <grid>)' when stages were copied from another grid's (`runner` twins)."""
    grids = {_stage_cell(stage["copied_from"]).split("/")[0] for stage in stages
             if "copied_from" in stage}
    return f" (ran in {', '.join(sorted(grids))})" if grids else ""


def _stage_cell(stage_dir: str) -> str:
    """'<grid>/<cell>' of a stage directory <out>/<grid>/<scale>/<cell>/seed<k>/pretrain or
    .../seed<k>/finetune/<task>."""
    *_, grid, _scale, cell, _seed = stage_seed_dir(stage_dir).split(os.sep)
    return f"{grid}/{cell}"


def compute_table(grid: Grid, results: Results) -> str:
    """Per cell (mean over its seeds): parameters, pretraining steps/tokens/FLOPs/wall,
    fine-tuning FLOPs and wall summed over the downstream tasks, and the CPU seconds of every
    stage (the load-independent cost, where the runner recorded it), and the precision each
    seed ran in."""
    header = ["cell", "seeds", "precision", "params", "pretrain steps", "pretrain tokens",
              "pretrain FLOPs", "pretrain wall", "fine-tune steps", "fine-tune FLOPs",
              "fine-tune + eval wall", "CPU"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for cell in grid.cells:
        found = results.get(cell.key, [])
        if not found:
            lines.append(f"| {cell.label} | 0 |" + " – |" * (len(header) - 2))
            continue
        mean = lambda fn: statistics.fmean(fn(r) for r in found)  # noqa: E731
        ft = lambda r, k: sum(s.get(k, 0) for s in finetunings(grid, r))  # noqa: E731
        params = found[0]["pretrain"].get("params")
        lines.append("| " + " | ".join([
            cell.label, str(len(found)), precisions(found),
            "–" if params is None else f"{params:,}",
            f"{mean(lambda r: pretraining_used(r, 'steps')):.0f}",
            _human(mean(lambda r: pretraining_used(r, "tokens"))),
            _human(mean(lambda r: pretraining_used(r, "flops"))),
            f"{mean(lambda r: r['pretrain']['wall_s']):.0f} s"
            + _copied([r["pretrain"] for r in found]),
            f"{mean(lambda r: ft(r, 'steps')):.0f}",
            _human(mean(lambda r: ft(r, "flops"))),
            f"{mean(lambda r: ft(r, 'wall_s') + ft(r, 'eval_s')):.0f} s"
            + _copied([s for r in found for s in finetunings(grid, r)]),
            _cpu(grid, found)]) + " |")
    return "\n".join(lines) + "\n"


def precisions(found: Sequence[Mapping[str, Any]]) -> str:
    """The matmul precision of a cell's seeds: 'bfloat16', or 'bfloat16 (0, 1), float32 (2)'
    when hosts of different kinds ran them ('auto' is bfloat16 only where the CPU has it)."""
    seeds: Dict[str, List[int]] = {}
    for r in sorted(found, key=lambda r: r["seed"]):
        seeds.setdefault(r.get("precision") or "–", []).append(r["seed"])
    if len(seeds) == 1:
        return next(iter(seeds))
    return ", ".join(f"{p} ({', '.join(map(str, s))})" for p, s in seeds.items())


def vocabulary_counts(grid: Grid, finished: Sequence[Mapping[str, Any]]) -> Dict[str, int]:
    """{vocabulary file: how many of the results' stages used it}, for stages that say."""
    counts: Dict[str, int] = {}
    for r in finished:
        for stage in [r["pretrain"], *finetunings(grid, r)]:
            if stage.get("vocabulary"):
                counts[stage["vocabulary"]] = counts.get(stage["vocabulary"], 0) + 1
    return counts


def pretraining_used(result: Mapping[str, Any], key: str) -> float:
    """Steps, tokens or FLOPs of pretraining behind a cell's fine-tuning: the pretraining's,
    or the share of it up to the step a learning-curve cell fine-tuned from."""
    pre = result["pretrain"]
    step = result.get("from_step")
    if step is None or not pre["steps"]:
        return pre[key]
    return pre[key] * step / pre["steps"]


def finetunings(grid, result: Mapping[str, Any]) -> List[Mapping[str, Any]]:
    """The result's fine-tuning stages on the scale's tasks (a result finished before a task
    left the scale still holds that task's stage, which the table does not show)."""
    return [result["finetune"][task] for task, _ in grid.scale.tasks
            if task in result["finetune"]]


def cpu_total(grid: Grid, result: Mapping[str, Any]) -> Optional[float]:
    """CPU seconds of one finished cell-seed: pretraining, its held-out scores, every
    fine-tuning and scoring on the scale's tasks; None where the runner did not record them."""
    parts = [stage_cpu_s(result["pretrain"])] + [stage_cpu_s(s) for s in
                                                  finetunings(grid, result)]
    return None if None in parts else sum(parts)


def _cpu(grid, found: Sequence[Mapping[str, Any]]) -> str:
    """Mean CPU seconds of a cell; '–' for results from before the runner recorded them."""
    totals = [cpu_total(grid, r) for r in found]
    return "–" if None in totals else f"{statistics.fmean(totals):.0f} s"


def status(grid: Grid, results: Results, cells: Sequence[Any], seeds: Sequence[int],
           plans: Mapping[Tuple[str, int], Mapping[str, Optional[str]]],
           costs: Mapping[str, Sequence[float]]) -> str:
    """What `t2t ablate --list` prints: each cell's finished seeds (and their precision), the
    selected seeds still to train and those that would only copy other grids' finished
    stages (`plans`: `runner.plan_grid`'s), and the CPU time the training
    should take at the mean of `costs` (`runner.stage_cpu_seconds`) for each stage it runs.
    A finished seed whose plan is given and reuses less than all its stages finished under
    an earlier configuration (the scale's recipe changed since): it is listed to run again."""
    lines, todo, copies, finished_count = [], [], 0, 0
    for cell in cells:
        found = results.get(cell.key, [])
        stale = [r["seed"] for r in found if _changed_since(plans.get((cell.key, r["seed"])))]
        found = [r for r in found if r["seed"] not in stale]
        done = sorted(r["seed"] for r in found)
        finished_count += len(done)
        missing = {s: plans[cell.key, s] for s in seeds if s not in done}
        runs = [s for s, plan in missing.items() if None in plan.values()]
        copied = [s for s in missing if s not in runs]
        todo += [missing[s] for s in runs]
        copies += len(copied)
        finished = f"{', '.join(map(str, done))} ({precisions(found)})" if found else "–"
        line = (f"{cell.key:34s} {cell.label:38s} finished: {finished:30s} to run: "
                + (", ".join(map(str, runs)) or "–"))
        if stale:
            line += (f" ({', '.join(map(str, sorted(stale)))}: finished under an earlier "
                     "configuration)")
        if copied:
            twins = sorted({_stage_cell(d) for s in copied for d in missing[s].values()
                            if d != FINISHED})
            line += (f"; copies: {', '.join(map(str, copied))} "
                     f"({', '.join(twins) or 'its finished stages'})")
        lines.append(line)
    total = finished_count + len(todo) + copies
    summary = f"{finished_count} of {total} cell-seeds finished, {len(todo)} to run"
    summary += f", {copies} to copy from finished stages" if copies else ""
    stages = [stage for plan in todo for stage, source in plan.items() if source is None]
    if stages and all(costs.get(stage) for stage in stages):
        hours = sum(statistics.fmean(costs[stage]) for stage in stages) / 3600
        cost = f"{hours:.1f} CPU-hours" if hours >= 1 else f"{hours * 60:.0f} CPU-minutes"
        summary += f": about {cost} at the mean CPU time of this grid's stages that trained here"
    return "\n".join(lines + [summary])


def _changed_since(plan: Optional[Mapping[str, Optional[str]]]) -> bool:
    """Whether a finished cell-seed's `plan` (None: not planned) would not reuse all its own
    finished stages: their configuration changed since it ran."""
    return plan is not None and any(source != FINISHED for source in plan.values())


def check_plotting() -> None:
    """`t2t ablate` ends by drawing its chart: say before any cell runs if it cannot."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UserError("t2t ablate draws each table's chart with matplotlib, which is not "
                        "installed: pip install 't2t[plots]'") from None


def plot(grid: Grid, results: Results, path: str) -> str:
    """Bars per cell for each measured column (whiskers: the seeds' range; a single seed's
    bar hatched, without one; a dashed line at the random-init control's mean), the paper's
    first column, and (with `ablation.orderings`) our column against the paper's, a point
    per row; saved as PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cols = columns(grid)
    ours = dict(cols)
    panels = [(h, fn, None) for h, fn in cols]
    if grid.paper_columns:
        panels.append((f"paper: {grid.paper_columns[0]}", None, 0))
    scatter = next(((o, p) for o, p in grid.orderings.items() if o in ours), None)
    width = len(panels) + (scatter is not None)
    fig, axes = plt.subplots(1, width, figsize=(3.2 * width + 1, 4.2), squeeze=False)
    labels = [f"{i}. {c.label}" if scatter else c.label for i, c in enumerate(grid.cells, 1)]
    for ax, (title, fn, paper_index) in zip(axes[0], panels):
        means, errs, seeds = [], [], []     # errs: NaN draws no whisker (one seed, paper)
        for cell in grid.cells:
            if fn is None:
                paper = grid.paper.get(cell.label)
                means.append(paper[paper_index] if paper else math.nan)
                errs.append(math.nan)
                seeds.append(0)
                continue
            s = summarize([fn(r) for r in results.get(cell.key, [])])
            n = s[2] if s else 0
            means.append(s[0] if s else math.nan)
            errs.append(s[1] if n > 1 else math.nan)
            seeds.append(n)
        bars = ax.bar(range(len(labels)), means, yerr=errs, capsize=3,
                      color="tab:gray" if fn is None else "tab:blue")
        for bar, n in zip(bars, seeds):
            if n == 1:                        # no range to show, so say so
                bar.set_hatch("//")
                bar.set_edgecolor("white")
        control = [m for cell, m in zip(grid.cells, means) if not cell.pretrained]
        if fn is not None and control and not math.isnan(control[0]):   # what to beat
            ax.axhline(control[0], color="tab:red", linestyle="--", linewidth=1)
        ax.set_title(title, fontsize=9)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
        whisker = [0.0 if math.isnan(e) else e for e in errs]
        reach = [(m - w, m + w) for m, w in zip(means, whisker)   # whiskers stay in view
                 if not math.isnan(m)]
        if reach:
            lo, hi = min(r[0] for r in reach), max(r[1] for r in reach)
            pad = (hi - lo) * 0.3 or abs(hi) * 0.05 or 1.0
            ax.set_ylim(max(0.0, lo - pad) if lo >= 0 else lo - pad, hi + pad)
    if scatter:
        _plot_against_paper(axes[0][-1], grid, results, scatter[0], ours[scatter[0]],
                            scatter[1])
    fig.suptitle(f"{grid.title} (scale: {grid.scale.name})", fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_against_paper(ax, grid: Grid, results: Results, our_column: str, fn,
                        paper_column: str) -> None:
    """Our column against the paper's, a numbered point per row (whiskers: the seeds'
    range; a single seed's point hollow, without one), the control's mean dashed: rows in
    the paper's order climb to the right."""
    rows = paired_rows(grid, results, fn, paper_column)
    for number, _, paper, (mean, half, n) in rows:
        ax.errorbar(paper, mean, yerr=half if n > 1 else None, fmt="o", color="tab:blue",
                    mfc="tab:blue" if n > 1 else "white", capsize=3)   # hollow: one seed
        ax.annotate(str(number), (paper, mean), textcoords="offset points", xytext=(4, 3),
                    fontsize=7)
    control = random_init_row(grid)
    base = control and summarize([fn(r) for r in results.get(control.key, [])])
    if base:
        ax.axhline(base[0], color="tab:red", linestyle="--", linewidth=1)
    if lower_is_better(paper_column):
        ax.invert_xaxis()
    if lower_is_better(our_column):
        ax.invert_yaxis()
    ax.set_xlabel(f"paper: {paper_column}", fontsize=8)
    ax.set_ylabel(our_column, fontsize=8)
    ax.set_title(f"ours against the paper ({len(rows)} rows)", fontsize=9)


def render(grid: Grid, results: Results, out_dir: str, command: str) -> Tuple[str, str]:
    """Write `<out_dir>/<grid>_<scale>.md` and `.png`; returns their paths."""
    base = os.path.join(out_dir, f"{grid.name}_{grid.scale.name}")
    finished = [r for rs in results.values() for r in rs]
    png = plot(grid, results, base + ".png")
    hardware = sorted({r["hardware"] for r in finished}) or ["–"]
    dates = sorted(r["finished"][:10] for r in finished) or ["–"]
    text = [f"# {grid.title} — scale `{grid.scale.name}`", "",
            f"Produced by `{command}` on {', '.join(hardware)}; cells finished "
            f"{dates[0]} … {dates[-1]}. Our numbers are the mean ±half the range over the "
            f"seeds each row lists (the scale runs {list(grid.scale.seeds)}), on the "
            f"`{grid.scale.split}` split"
            + (f" ({grid.scale.eval_examples} examples spread evenly over it)"
               if grid.scale.eval_examples else "") + ".", ""]
    if grid.scale.description:
        text += [grid.scale.description, ""]
    text += [results_table(grid, results), ""]
    floor = unigram_line(grid, results)
    if floor:
        text += [floor, ""]
    margins = control_margins(grid, results)
    if margins:
        text += ["**Does pretraining matter here?** Against the same model fine-tuned from "
                 "random initialisation (the control row), per column:", "", *margins, ""]
    orderings = paper_orderings(grid, results)
    if orderings:
        text += ["**Do the paper's orderings hold here?**", "", *orderings]
    if grid.paper_columns:
        text += [f"Columns `paper: …` are the published values ({grid.paper_source}), typed "
                 "from the paper; they are for other tasks and scales, so compare orderings, "
                 "not numbers."
                 + (" The control row's are the paper's own model trained without "
                    "pretraining." if CONTROL_LABEL in grid.paper else "")
                 + (f" Not rows of the paper's table, so without its values: "
                    f"{', '.join(grid.not_in_paper)}." if grid.not_in_paper else ""), ""]
    if grid.accounting:
        text += ["Params: non-embedding parameters relative to the "
                 f"`{grid.accounting.get('P')}` cell (the paper's P); Cost: forward layer "
                 "FLOPs per row (dense + attention, logits excluded) relative to the "
                 f"`{grid.accounting.get('M')}` cell (the paper's M); both measured from the "
                 "models that ran.", ""]
    text += ["## Compute", "", compute_table(grid, results), ""]
    if len({r.get("precision") for r in finished}) > 1:
        text += ["Precision is what each seed's matmuls ran in: `hardware/cpu.gin`'s dtype "
                 "'auto' means bfloat16 on a CPU with AVX512-BF16 or AMX and float32 on an "
                 "AVX2-only one, so cells run on different kinds of host differ in precision "
                 "and rounding as well as in the seed.", ""]
    vocabularies = vocabulary_counts(grid, finished)
    if len(vocabularies) > 1:
        text += ["The cells' stages used more than one vocabulary (trained vocabularies are "
                 "named by a digest of their corpus, so a corpus built from other package "
                 "versions gives another): " + ", ".join(
                     f"`{name}` ({n} stages)" for name, n in vocabularies.items()) + ".", ""]
    text += [f"![{grid.name}]({os.path.basename(png)})", ""]
    cols = columns(grid)
    summaries = (summarize([fn(r) for r in results.get(cell.key, [])])
                 for cell in grid.cells for _, fn in cols)
    if any(s and s[2] == 1 for s in summaries):          # the n plot() hatches a bar at
        text += ["Whiskers span the seeds' range; a hatched bar (a hollow point) is a row "
                 "with one seed, which has no range to show yet.", ""]
    if grid.notes:
        text += ["## Notes", "", grid.notes.strip(), ""]
    with open(base + ".md", "w") as f:
        f.write("\n".join(text))
    return base + ".md", png
