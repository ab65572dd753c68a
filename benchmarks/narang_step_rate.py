"""Narang et al.'s Params, Ops and Step/s columns for every cell of
transformer_modifications.gin: parameters, training FLOPs per token and training steps per
second as a ratio to the Vanilla Transformer, all cells timed in one process in turns (cell
A, B, C, A, B, C, ...: the machine's drift hits every cell alike), beside the paper's ratio.

The grid's own wall clocks cannot give this column: its cells run hours apart, on a machine
whose load changes between them.

    .venv/bin/python benchmarks/narang_step_rate.py [--scale tiny] [--rows vanilla gelu ...]
                                                    [--steps 5] [--rounds 3] [--no-write]

Each cell's pretraining config as the grid builds it (batch, lengths, precision), on the
scale's first batch; a timed call is `--steps` training steps.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402

GRID = "configs/ablations/transformer_modifications.gin"
VANILLA = "vanilla"


class CellStep:
    """One cell's trainer, state and first batch; calling it trains `steps` steps."""

    def __init__(self, grid, cell, model_dir: str, steps: int):
        import gin

        import jax

        from t2t.ablations import runner
        from t2t.run import experiment as experiment_lib
        from t2t.run import gin_utils
        from t2t.train.trainer import step_cost

        files, bindings = runner.stage_config(grid, grid.scale.pretrain + cell.pretrain)
        gin.clear_config()
        gin_utils.parse(files, bindings + [f"MODEL_DIR = {model_dir!r}", "SEED = 0"])
        try:
            exp = experiment_lib.experiment()
        finally:
            gin.clear_config()
        self.trainer, self.steps = exp.trainer, steps
        self.batch = next(iter(exp.data()))
        self.state = self.trainer.init_state(self.batch)
        self.params = sum(x.size for x in jax.tree_util.tree_leaves(self.state.params))
        _, self.flops_per_step, self.tokens_per_step = step_cost(self.trainer.model, self.batch)
        self()                            # compiles: a cell that cannot train fails here

    def __call__(self) -> None:
        import jax
        for _ in range(self.steps):
            self.state, metrics = self.trainer.train_step(self.state, self.batch)
        jax.block_until_ready(metrics["loss"])


def table(grid, cells, built, times, steps: int) -> str:
    """Markdown: a row per cell, steps/s from the median timed call."""
    rate = {k: steps / _common.median(t) for k, t in times.items()}
    paper_vanilla = grid.paper[cells[VANILLA].label][2]
    rows = []
    for key, step in built.items():
        label = cells[key].label
        paper_rate = grid.paper[label][2]
        rows.append([
            label, f"{step.params:,}", f"{step.flops_per_step / step.tokens_per_step / 1e6:.1f}",
            f"{rate[key]:.2f}",
            f"{rate[key] / rate[VANILLA]:.2f}" if VANILLA in rate else "–",
            f"{paper_rate / paper_vanilla:.2f}"])
    return _common.markdown_table(
        ["Model", "params", "training MFLOPs / token", "steps/s", "steps/s ÷ vanilla",
         "paper: steps/s ÷ vanilla"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="tiny")
    parser.add_argument("--rows", nargs="*", help="cell keys (default: all; the vanilla cell "
                        "is always timed, as the ratio's reference)")
    parser.add_argument("--steps", type=int, default=5, help="training steps per timed call")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="print only, not RESULTS.md")
    args = parser.parse_args()

    from t2t.ablations import grid as grid_lib
    grid = grid_lib.load_grid(GRID, args.scale)
    cells = {c.key: c for c in grid.cells}
    keys = [VANILLA] + [k for k in (args.rows or cells) if k != VANILLA]
    unknown = [k for k in keys if k not in cells]
    if unknown:
        parser.error(f"unknown cells {unknown}: see t2t ablate {GRID} --list")
    built, failed = {}, {}
    with tempfile.TemporaryDirectory(prefix="narang-step-rate-") as tmp:
        for key in keys:
            print(f"building and compiling {cells[key].label}", flush=True)
            try:
                built[key] = CellStep(grid, cells[key], os.path.join(tmp, key), args.steps)
            except Exception as e:      # noqa: BLE001 -- reported as the row, not fatal
                failed[key] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                print(f"  FAILED: {failed[key]}", flush=True)
        times = _common.interleaved(built, args.rounds, warmup=0)
    body = "\n\n".join([
        _common.machine_line("jax", "flax"),
        f"`python benchmarks/narang_step_rate.py --scale {args.scale} --steps {args.steps} "
        f"--rounds {args.rounds}`: each cell's pretraining config at scale `{args.scale}`, "
        f"{args.steps} training steps a call, the median of {args.rounds} interleaved rounds; "
        "FLOPs are `t2t.train.flops.step_flops` (model FLOPs, forward and backward).",
        table(grid, cells, built, times, args.steps)]
        + (["Cells that could not train: " + "; ".join(
            f"{cells[k].label} ({why})" for k, why in failed.items())] if failed else []))
    print(body)
    if not args.no_write:
        _common.append_results(f"Narang et al. Table 1: steps/s at `{args.scale}`", body)


if __name__ == "__main__":
    main()
