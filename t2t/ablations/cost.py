"""What an ablation grid costs at a scale on a TPU slice, found on a CPU before asking for
the slice: `t2t ablate GRID --scale=paper --plan --hardware=tpu_v5e_256`.

Every stage of every selected cell (its pretraining; its fine-tuning on each task) is built
as `t2t train` / `t2t finetune` would build it on the slice and compiled for it as `t2t
compile` does (t2t/run/aot.py: XLA's TPU compiler over compile-only devices). Stages whose
compiled step is the same (T5's fine-tuning on 22 tasks at one length; two cells sharing a
pretraining) compile once. Each stage row gives whether the step fits in HBM, the per-chip
GiB, the compute-bound step time (XLA's FLOPs at the chip's bf16 peak: a lower bound; a run
at 50% MFU takes twice as long), the steps the stage runs and its chip-hours; the table's
total is the sum over cells and seeds.

Compiled reports are kept in a JSON cache keyed by what the step depends on (the operative
gin config without run-only values such as directories, seed and step count; the
parameters', batch's and mesh's shapes), so a rerun, another grid with the same cells or a
grid at more seeds compiles only what is new. A stage that cannot be built here (a
fine-tuning sized in epochs whose task data is not built) is listed as not counted, with
why, and left out of the total.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import gin

from t2t.ablations import runner
from t2t.ablations.grid import Cell, Grid
from t2t.data.catalog.builders import BuildError
from t2t.errors import ConfigError, InputFileError
from t2t.train.chips import TopologyError

CACHE_VERSION = 1
# Bindings that change what a run reads, writes or how long it runs, not the compiled step.
_RUN_ONLY = ("MODEL_DIR", "INITIAL_CHECKPOINT", "SEED", "TRAIN_STEPS", "MIXTURE_OR_TASK_NAME",
             "TrainConfig.model_dir", "TrainConfig.seed", "TrainConfig.train_steps",
             "TrainConfig.log_every", "TrainConfig.checkpoint_every",
             "TrainConfig.keep_checkpoints", "finetune_experiment.initial_checkpoint",
             "experiment.task", "experiment.eval_task")
_RUN_ONLY_BINDINGS = re.compile(
    r"^(?:%s) = [^\n]*(?:\n[ \t]+[^\n]*)*" % "|".join(re.escape(n) for n in _RUN_ONLY),
    re.MULTILINE)


def hardware_file(hardware: str) -> str:
    """--hardware=tpu_v5e_256 (a configs/hardware name), hardware/tpu_v5e_256.gin or a path."""
    if hardware.endswith(".gin"):
        return hardware
    return f"hardware/{hardware}.gin"


def on_hardware(lines: Sequence[str], hardware: str) -> List[str]:
    """A stage's lines with its hardware config replaced by `hardware`'s."""
    kept = [line for line in lines if not line.strip().startswith("hardware/")]
    return kept + [hardware_file(hardware)]


def step_key(operative_config: str, signature: Dict[str, Any]) -> str:
    """The cache key of a compiled step: its operative config without run-only bindings,
    and its shapes."""
    config = _RUN_ONLY_BINDINGS.sub("", operative_config)
    config = "\n".join(line for line in config.splitlines()
                       if line.strip() and not line.startswith("#"))
    blob = json.dumps({"version": CACHE_VERSION, "config": config, "signature": signature},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


@dataclasses.dataclass
class StageCost:
    """One stage row of a plan: a cell's pretraining or its fine-tuning on `tasks` (the
    tasks whose fine-tuning is the same compiled step)."""

    cell: str
    stage: str                      # "pretrain" or "finetune"
    tasks: Sequence[str] = ()
    steps: int = 0                  # per run (a fine-tuning: per task)
    report: Optional[Dict[str, Any]] = None   # aot.Report.to_dict() of the step
    note: str = ""                  # not counted: why; shared: with which cell

    @property
    def runs(self) -> int:
        return max(len(self.tasks), 1)

    @property
    def counted(self) -> bool:
        return self.report is not None and self.report.get("step_time_s") is not None

    @property
    def chip_hours(self) -> float:
        """Steps x runs x compute-bound step time x chips, in hours (0: not counted)."""
        if not self.counted:
            return 0.0
        r = self.report
        return self.steps * self.runs * r["step_time_s"] * r["chips"] / 3600.0

    @property
    def name(self) -> str:
        if self.stage == "pretrain":
            return "pretrain"
        if len(self.tasks) == 1:
            return f"fine-tune {self.tasks[0]}"
        return f"fine-tune x {len(self.tasks)} tasks"


@dataclasses.dataclass
class Plan:
    grid: str
    scale: str
    hardware: str
    seeds: int
    stages: List[StageCost]
    compiled: int = 0               # steps compiled in this call (the rest from the cache)

    @property
    def chip_hours_per_seed(self) -> float:
        return sum(s.chip_hours for s in self.stages)

    @property
    def chip_hours(self) -> float:
        return self.chip_hours_per_seed * self.seeds

    @property
    def topology(self) -> str:
        reports = [s.report for s in self.stages if s.report]
        return reports[0]["topology"] if reports else "?"

    @property
    def chips(self) -> int:
        reports = [s.report for s in self.stages if s.report]
        return reports[0]["chips"] if reports else 0

    def lines(self) -> List[str]:
        head = (f"{'cell':<40} {'stage':<24} {'fits':>4} {'GiB/chip':>9} {'step ms':>9} "
                f"{'steps':>11} {'chip-hours':>11}")
        out = [f"{self.grid} at scale {self.scale} on {self.topology} ({self.chips} chips); "
               f"compute-bound step times (XLA's FLOPs at the bf16 peak: a lower bound)",
               head, "-" * len(head)]
        previous = None
        for s in self.stages:
            cell = s.cell if s.cell != previous else ""
            previous = s.cell
            if not s.counted:
                out.append(f"{cell[:40]:<40} {s.name[:24]:<24} {s.note}")
                continue
            r = s.report
            steps = (f"{s.steps:,d}" if s.runs == 1 else f"{s.runs}x{s.steps:,d}")
            out.append(f"{cell[:40]:<40} {s.name[:24]:<24} {'yes' if r['fits'] else 'NO':>4} "
                       f"{r['bytes_per_chip']['total'] / 2**30:>9.2f} "
                       f"{r['step_time_s'] * 1e3:>9.3g} {steps:>11} {s.chip_hours:>11,.0f}"
                       + (f"  {s.note}" if s.note else ""))
        uncounted = sum(not s.counted and "shares" not in s.note for s in self.stages)
        unfit = sum(s.counted and not s.report["fits"] for s in self.stages)
        seeds = f" x {self.seeds} seeds" if self.seeds > 1 else ""
        hours = self.chip_hours / self.chips if self.chips else 0.0
        out.append(f"total: {self.chip_hours_per_seed:,.0f} chip-hours per seed{seeds} = "
                   f"{self.chip_hours:,.0f} chip-hours ({hours:,.1f} hours of the slice) at "
                   f"the compute-bound step time")
        if unfit:
            out.append(f"{unfit} stage(s) do not fit in HBM: `t2t compile` on their config "
                       "names the buffers and the knob that shrinks each")
        if uncounted:
            out.append(f"{uncounted} stage(s) not counted (see the rows): the total leaves "
                       "them out")
        return out

    def to_dict(self) -> Dict[str, Any]:
        return {"grid": self.grid, "scale": self.scale, "hardware": self.hardware,
                "topology": self.topology, "chips": self.chips, "seeds": self.seeds,
                "chip_hours_per_seed": self.chip_hours_per_seed,
                "chip_hours": self.chip_hours,
                "stages": [{"cell": s.cell, "stage": s.stage, "tasks": list(s.tasks),
                            "steps": s.steps, "chip_hours": s.chip_hours, "note": s.note,
                            "fits": s.report["fits"] if s.report else None,
                            "gib_per_chip": (s.report["bytes_per_chip"]["total"] / 2**30
                                             if s.report else None),
                            "step_time_s": s.report["step_time_s"] if s.report else None}
                           for s in self.stages]}


class ReportCache:
    """Compiled step reports by `step_key`, in one JSON file written after each compile."""

    def __init__(self, path: Optional[str]):
        self.path = path
        self.reports: Dict[str, Dict[str, Any]] = {}
        if path and os.path.exists(path):
            with open(path) as f:
                self.reports = json.load(f)

    def get(self, key: str) -> Optional[Dict[str, Any]]:
        return self.reports.get(key)

    def put(self, key: str, report: Dict[str, Any]) -> None:
        self.reports[key] = report
        if self.path:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            tmp = self.path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.reports, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)


def _compiled(step: str, lines: Sequence[str], bindings: Sequence[str], grid: Grid,
              cache: ReportCache, say: Callable[[str], None], what: str
              ) -> tuple[Optional[Dict[str, Any]], int, str, bool]:
    """(report dict or None, the stage's steps, why not counted, compiled now) of one stage
    configured by `lines` + `bindings` on the hardware its lines name."""
    from t2t.run import aot
    files, stage_bindings = runner.stage_config(grid, lines)
    aot.parse_gin(files, stage_bindings + list(grid.scale.plan) + list(bindings), check=False)
    topology, num_slices = aot.target_from_config(None, None)   # no TPU in the hardware: fails
    try:
        prepared = aot.prepare(topology, num_slices, step)
    except (BuildError, InputFileError, OSError) as e:   # data or a vocabulary not here
        return None, 0, f"not counted: {str(e).splitlines()[0][:160]}", False
    except TopologyError as e:                          # e.g. heads the tensor axis cannot split
        return None, 0, f"not counted, does not lay out: {str(e).splitlines()[0][:160]}", False
    steps = prepared.trainer.config.train_steps
    key = step_key(gin.operative_config_str(), prepared.signature())
    report = cache.get(key)
    if report is not None:
        return report, steps, "", False
    say(f"compiling {what} for {prepared.slice.name} ...")
    start = time.perf_counter()
    compiled = aot.compile_prepared(prepared)
    report = compiled.to_dict()
    report["compile_s"] = round(time.perf_counter() - start, 1)
    cache.put(key, report)
    say(f"  {compiled.verdict()}; {report['compile_s']:.0f} s")
    return report, steps, "", True


def plan_grid(grid: Grid, cells: Sequence[Cell], seeds: int, hardware: str,
              cache_path: Optional[str], out_dir: str,
              say: Callable[[str], None] = print) -> Plan:
    """The cost plan of `cells` of `grid` at its scale on `hardware` (a configs/hardware
    name with a TPU topology)."""
    if not cells:
        raise ConfigError("no cells to plan")
    cache = ReportCache(cache_path)
    scale = grid.scale
    stages: List[StageCost] = []
    pretrained_by: Dict[str, str] = {}
    compiled = 0
    for n, cell in enumerate(cells, 1):
        say(f"[{n}/{len(cells)}] {cell.label}")
        if cell.pretrained:
            shared = pretrained_by.get(runner.pretrain_dir(out_dir, grid, cell, 0))
            if shared:
                stages.append(StageCost(cell.label, "pretrain",
                                        note=f"shares {shared}'s pretraining"))
            else:
                pretrained_by[runner.pretrain_dir(out_dir, grid, cell, 0)] = cell.label
                report, steps, note, new = _compiled(
                    "train", on_hardware(scale.pretrain + cell.pretrain, hardware),
                    ["SEED = 0"], grid, cache, say, f"{cell.label} pretraining")
                compiled += new
                stages.append(StageCost(cell.label, "pretrain", (), steps, report, note))
        groups: Dict[str, StageCost] = {}
        for task, _ in scale.tasks:
            report, steps, note, new = _compiled(
                "finetune", on_hardware(scale.finetune_lines(task) + cell.finetune, hardware),
                [f"MIXTURE_OR_TASK_NAME = {task!r}", "SEED = 0"], grid, cache, say,
                f"{cell.label} fine-tuning on {task}")
            compiled += new
            group = (json.dumps(report, sort_keys=True) if report else note) + f"|{steps}"
            if group in groups:
                groups[group].tasks = list(groups[group].tasks) + [task]
            else:
                groups[group] = StageCost(cell.label, "finetune", [task], steps, report, note)
        stages += groups.values()
    return Plan(grid.name, scale.name, hardware, seeds, stages, compiled)
