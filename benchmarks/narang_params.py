"""Parameters of every cell of transformer_modifications.gin at the paper scale (Narang et
al. 2021's 223M vanilla model, narang_paper_model.gin) beside Table 1's Params column.

    .venv/bin/python benchmarks/narang_params.py [--rows 'Block sharing' ...]

Shapes only (jax.eval_shape): nothing is allocated, so the 1.1B-parameter rows run on a
laptop CPU.
"""
from __future__ import annotations

import argparse

import _common  # noqa: F401  (before JAX starts: the CPU, not a TPU probe)
import gin

from t2t.ablations import grid as grid_lib
from t2t.models.families import count_params
from t2t.run import configurables as configured
from t2t.run import gin_utils

GRID = "configs/ablations/transformer_modifications.gin"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="*", help="cell labels (default: all)")
    args = parser.parse_args()
    grid = grid_lib.load_grid(GRID, "paper", ["T5_VOCABULARY = 'v'"])
    print(f"| {'Model':45s} | {'t2t (M)':>8s} | {'paper (M)':>9s} |")
    print(f"|{'-' * 47}|{'-' * 10}|{'-' * 11}|")
    for cell in grid.cells:
        if args.rows and cell.label not in args.rows:
            continue
        gin.clear_config()
        gin_utils.parse(["ablations/scales/narang_paper_model.gin"],
                        ["T5_VOCABULARY = 'v'"] + list(cell.pretrain))
        millions = count_params("t5", configured.TransformerConfig()) / 1e6
        print(f"| {cell.label:45s} | {millions:8.1f} | {grid.paper[cell.label][0]:9g} |")


if __name__ == "__main__":
    main()
