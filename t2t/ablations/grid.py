"""Ablation grids: a paper table's cells, declared in gin (`configs/ablations/*.gin`).

A grid file binds ``ablation.*``:

* ``axes``: ``{axis name: {option label: option}}``; the cells are the product of the axes
  (first axis slowest), or only the rows listed in ``cells`` (for tables that are not a
  full product, e.g. BERT Table 6). An option is a list of gin lines (bindings, or
  ``include 'file.gin'``) used in both stages, or a dict with ``pretrain`` / ``finetune``
  / ``both`` lists, and optionally ``key`` (the cell directory's name part) and
  ``from_step`` (fine-tune from that step's checkpoint of the pretraining, not its last:
  a learning curve; 0 = from random initialisation, no pretraining).
* ``control``: the label of the cell whose model and fine-tuning a last row, "Random init
  (control)", repeats without pretraining (what pretraining adds is measured against it).
* ``scales``: ``{scale name: {"pretrain": [...], "finetune": [...], "tasks": {task:
  metric}, "seeds": [...], ...}}``. Stage lists hold gin files (``*.gin``) and bindings;
  the cell's own lines come after the scale's, so they win (and may use its macros).
  ``task_finetune: {task: [...]}`` adds lines to one task's fine-tuning (BERT's SQuAD
  runs a span-QA experiment instead of a classifier).
* ``paper``: the published values, ``{cell label: [numbers]}`` with ``paper_columns``;
  cell labels join the option labels with " / ".
* ``orderings``: ``{our column: paper column}``, the columns whose row orderings the report
  compares (e.g. ``{'Average': 'GLUE'}``; a column this scale lacks is skipped), and
  ``paper_sd``: ``{paper column: the paper's run-to-run standard deviation}`` where it
  states one (T5's Table 1): two rows closer than twice it are a tie in the paper.
  ``paper_control``: the paper's values for the control row, where it trained one (T5's
  Table 1, "No pre-training": the baseline fine-tuned from scratch for as many steps).
* ``not_in_paper``: labels of rows the paper's table does not have (a later paper's
  objective run beside it, BART's text infilling in T5 Table 4): they have no paper values.
"""
from __future__ import annotations

import dataclasses
import itertools
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import gin

from t2t.errors import ConfigError
from t2t.run.configurables import configurable

STAGES = ("pretrain", "finetune")
CONTROL_LABEL = "Random init (control)"
NO_LABEL = "–"                           # the control row's other axes
SCALE_KEYS = {"pretrain", "finetune", "tasks", "seeds", "heldout", "eval_examples", "split",
              "description", "averages", "splits", "task_finetune", "heldout_early",
              "task_columns", "plan"}


@dataclasses.dataclass(frozen=True)
class Cell:
    """One row of a table: its labels per axis and the gin lines of each stage."""

    key: str                              # directory name, e.g. "encoder_decoder-denoising"
    labels: Tuple[Tuple[str, str], ...]   # ((axis, option label), ...)
    pretrain: Tuple[str, ...]
    finetune: Tuple[str, ...]
    from_step: Optional[int] = None       # fine-tune from this pretraining step (0: none)

    @property
    def label(self) -> str:
        return " / ".join(value for _, value in self.labels if value != NO_LABEL)

    @property
    def pretrained(self) -> bool:
        return self.from_step != 0


@dataclasses.dataclass(frozen=True)
class Scale:
    """What `--scale` picks: base gin lines per stage, downstream tasks, seeds."""

    name: str
    pretrain: Tuple[str, ...]
    finetune: Tuple[str, ...]
    tasks: Tuple[Tuple[str, str], ...]    # (task, metric reported)
    seeds: Tuple[int, ...] = (0,)
    heldout: Optional[Tuple[str, str]] = None   # (held-out task, loss metric) -> perplexity
    eval_examples: Optional[int] = None   # score the first ones of the split (None: all)
    split: str = "validation"             # the papers report dev-set numbers
    description: str = ""
    averages: Tuple[Tuple[str, Tuple[str, ...]], ...] = ()  # (column, tasks): T5's "GLUE"
    splits: Tuple[Tuple[str, str], ...] = ()   # (task, split) where not `split` (MNLI)
    task_finetune: Tuple[Tuple[str, Tuple[str, ...]], ...] = ()  # (task, extra lines): SQuAD
    heldout_early: int = 0                # also score `heldout` at this pretraining step
    task_columns: bool = False            # a column per task even where an average has it
    plan: Tuple[str, ...] = ()            # lines a cost plan adds (`t2t ablate --plan`)

    def split_of(self, task: str) -> str:
        return dict(self.splits).get(task, self.split)

    def finetune_lines(self, task: str) -> Tuple[str, ...]:
        """The scale's fine-tuning lines, then the task's own (a span-QA run for SQuAD)."""
        return self.finetune + dict(self.task_finetune).get(task, ())


@dataclasses.dataclass(frozen=True)
class Grid:
    name: str
    title: str
    axes: Tuple[str, ...]
    cells: Tuple[Cell, ...]
    scale: Scale
    paper: Mapping[str, Sequence[float]]
    paper_columns: Tuple[str, ...]
    paper_source: str
    accounting: Mapping[str, str]         # {"P": cell label, "M": cell label} (T5 Table 2)
    notes: str
    control: str = ""                     # the cell label the control row repeats
    orderings: Mapping[str, str] = dataclasses.field(default_factory=dict)  # ours -> paper's
    paper_sd: Mapping[str, float] = dataclasses.field(default_factory=dict)  # paper column
    source: str = ""                      # the grid's gin file, parsed again under each
    source_bindings: Tuple[str, ...] = ()  # stage so its macros (and overrides) resolve
    not_in_paper: Tuple[str, ...] = ()    # rows the paper's table lacks: no paper values

    def select(self, patterns: Sequence[str] = ()) -> List[Cell]:
        """Cells whose key or label matches any regex in `patterns` (all when empty)."""
        if not patterns:
            return list(self.cells)
        chosen = [c for c in self.cells
                  if any(re.search(p, c.key) or re.search(p, c.label) for p in patterns)]
        if not chosen:
            raise ConfigError(f"no cell of {self.name} matches {list(patterns)}; cells: "
                              f"{[c.key for c in self.cells]}")
        return chosen


def slug(text: str) -> str:
    """A file-system-safe key: 'Enc-dec, 6 layers' -> 'enc_dec_6_layers'."""
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def _stage_lines(option: Any, where: str) -> Dict[str, Tuple[str, ...]]:
    if isinstance(option, (list, tuple)):
        return {stage: tuple(option) for stage in STAGES}
    if isinstance(option, Mapping):
        unknown = set(option) - {"pretrain", "finetune", "both", "key", "from_step"}
        if unknown:
            raise ConfigError(f"{where}: unknown keys {sorted(unknown)}; use pretrain, "
                              "finetune, both, key, from_step")
        both = tuple(option.get("both", ()))
        return {stage: both + tuple(option.get(stage, ())) for stage in STAGES}
    raise ConfigError(f"{where}: an option is a list of gin lines or a dict, got {option!r}")


def make_cells(axes: Mapping[str, Mapping[str, Any]],
               rows: Optional[Sequence[Sequence[str]]] = None) -> Tuple[Cell, ...]:
    """The product of the axes' options (or only `rows`, each a label per axis)."""
    names = list(axes)
    combos = (list(itertools.product(*[list(axes[n]) for n in names])) if rows is None
              else [tuple(r) for r in rows])
    cells = []
    for combo in combos:
        if len(combo) != len(names):
            raise ConfigError(f"row {combo} needs one label per axis {names}")
        lines = {stage: () for stage in STAGES}
        keys, from_step = [], None
        for axis, label in zip(names, combo):
            if label not in axes[axis]:
                raise ConfigError(f"axis {axis!r} has no option {label!r}; "
                                  f"options: {list(axes[axis])}")
            option = axes[axis][label]
            for stage, stage_lines in _stage_lines(option, f"{axis}/{label}").items():
                lines[stage] += stage_lines
            if isinstance(option, Mapping):
                keys.append(option.get("key", slug(label)))
                from_step = option.get("from_step", from_step)
            else:
                keys.append(slug(label))
        cells.append(Cell("-".join(keys), tuple(zip(names, combo)), lines["pretrain"],
                          lines["finetune"], None if from_step is None else int(from_step)))
    if len({c.key for c in cells}) != len(cells):
        raise ConfigError("two cells share a key; give options distinct labels or keys")
    return tuple(cells)


def make_scale(name: str, spec: Mapping[str, Any]) -> Scale:
    unknown = set(spec) - SCALE_KEYS
    if unknown:
        raise ConfigError(f"scale {name!r}: unknown keys {sorted(unknown)}; "
                          f"valid: {sorted(SCALE_KEYS)}")
    missing = {"pretrain", "finetune", "tasks"} - set(spec)
    if missing:
        raise ConfigError(f"scale {name!r} needs {sorted(missing)}")
    heldout = spec.get("heldout")
    averages = tuple((column, tuple(names)) for column, names in
                     dict(spec.get("averages", {})).items())
    task_finetune = tuple((task, tuple(lines)) for task, lines in
                          dict(spec.get("task_finetune", {})).items())
    unknown_tasks = ({t for _, names in averages for t in names} | set(dict(task_finetune))
                     ) - set(dict(spec["tasks"]))
    if unknown_tasks:
        raise ConfigError(f"scale {name!r}: averages or task_finetune name tasks not in "
                          f"`tasks`: {sorted(unknown_tasks)}")
    return Scale(name, tuple(spec["pretrain"]), tuple(spec["finetune"]),
                 tuple(dict(spec["tasks"]).items()), tuple(spec.get("seeds", (0,))),
                 tuple(heldout) if heldout else None, spec.get("eval_examples"),
                 spec.get("split", "validation"), spec.get("description", ""), averages,
                 tuple(dict(spec.get("splits", {})).items()), task_finetune,
                 int(spec.get("heldout_early", 0)), bool(spec.get("task_columns", False)),
                 tuple(spec.get("plan", ())))


@configurable
def ablation(name: str = gin.REQUIRED, title: str = gin.REQUIRED,
             axes: Mapping[str, Mapping[str, Any]] = gin.REQUIRED,
             scales: Mapping[str, Mapping[str, Any]] = gin.REQUIRED,
             rows: Optional[Sequence[Sequence[str]]] = None,
             paper: Optional[Mapping[str, Sequence[float]]] = None,
             paper_columns: Sequence[str] = (), paper_source: str = "",
             accounting: Optional[Mapping[str, str]] = None, notes: str = "",
             overrides: Optional[Mapping[str, Any]] = None,
             control: Optional[str] = None, scale: str = "tiny",
             orderings: Optional[Mapping[str, str]] = None,
             paper_sd: Optional[Mapping[str, float]] = None,
             paper_control: Optional[Sequence[float]] = None,
             not_in_paper: Sequence[str] = ()) -> Grid:
    """The grid at `scale` (see the module docstring for the format). `overrides`:
    `{cell label: option}`, extra lines for single cells (after the axes' lines);
    `control`: the cell the random-initialisation row repeats without pretraining."""
    if scale not in scales:
        raise ConfigError(f"grid {name!r} has no scale {scale!r}; scales: {list(scales)}")
    cells = make_cells(axes, rows)
    for label, option in (overrides or {}).items():
        matches = [i for i, c in enumerate(cells) if c.label == label]
        if not matches:
            raise ConfigError(f"override for unknown cell {label!r}; cells: "
                              f"{[c.label for c in cells]}")
        extra = _stage_lines(option, f"overrides/{label}")
        cell = cells[matches[0]]
        cells = cells[:matches[0]] + (dataclasses.replace(
            cell, pretrain=cell.pretrain + extra["pretrain"],
            finetune=cell.finetune + extra["finetune"]),) + cells[matches[0] + 1:]
    if control is not None:
        cells += (control_cell(cells, control, tuple(axes)),)
    paper = dict(paper or {})
    if paper_control is not None:            # the paper's own row without pretraining
        if control is None:
            raise ConfigError("paper_control gives the paper's values for the control row; "
                              "set ablation.control (the cell it repeats) too")
        paper[CONTROL_LABEL] = list(paper_control)
    labels = {c.label for c in cells}
    stray = set(paper) - labels
    if stray:
        raise ConfigError(f"paper values for unknown cells {sorted(stray)}; "
                          f"cells: {sorted(labels)}")
    for label, values in paper.items():
        if len(values) != len(paper_columns):
            raise ConfigError(f"paper row {label!r} has {len(values)} values for "
                              f"{len(paper_columns)} paper_columns")
    for label in not_in_paper:
        if label not in labels or label in paper:
            raise ConfigError(f"not_in_paper names {label!r}: give a cell without paper "
                              f"values; cells: {sorted(labels)}")
    for role, label in (accounting or {}).items():
        if label not in labels:
            raise ConfigError(f"accounting {role}: no cell {label!r}")
    for what, named in (("orderings", set(dict(orderings or {}).values())),
                        ("paper_sd", set(dict(paper_sd or {})))):
        if named - set(paper_columns):
            raise ConfigError(f"{what} names paper columns {sorted(named - set(paper_columns))}"
                              f" that are not in paper_columns {list(paper_columns)}")
    return Grid(name, title, tuple(axes), cells, make_scale(scale, scales[scale]), paper,
                tuple(paper_columns), paper_source, dict(accounting or {}), notes,
                control or "", orderings=dict(orderings or {}),
                paper_sd={k: float(v) for k, v in dict(paper_sd or {}).items()},
                not_in_paper=tuple(not_in_paper))


def control_cell(cells: Sequence[Cell], label: str, axes: Tuple[str, ...]) -> Cell:
    """The row "Random init (control)": `label`'s cell fine-tuned from random
    initialisation (its pretraining lines kept only to name the model it builds)."""
    like = next((c for c in cells if c.label == label), None)
    if like is None:
        raise ConfigError(f"control: no cell {label!r}; cells: {[c.label for c in cells]}")
    labels = tuple((axis, CONTROL_LABEL if i == 0 else NO_LABEL) for i, axis in enumerate(axes))
    return Cell("random_init", labels, like.pretrain, like.finetune, from_step=0)


def load_grid(path: str, scale: str = "tiny", bindings: Sequence[str] = ()) -> Grid:
    """Parse a grid gin file and build its `Grid` at `scale` (leaves gin cleared)."""
    from t2t.run import gin_utils
    gin_utils.parse([path], list(bindings) + [f"ablation.scale = {scale!r}"])
    try:
        return dataclasses.replace(ablation(), source=path, source_bindings=tuple(bindings))
    finally:
        gin.clear_config()
