"""XLA's and PyTorch's float32 matmul kernels on the products of T5.1.1-base's train step.

Each Dense of the step (`train_step.py`'s T5.1.1-base, batch 2 x (512 + 114)) is three
products: forward X·W, the input gradient dY·Wᵀ and the kernel gradient Xᵀ·dY. This times
each distinct product as a jitted `jnp.dot` and as `torch.matmul` on the same host, interleaved,
and weights them by how often the step runs them (12 + 12 layers; the attention-score products
and everything that is not a matmul are left out), so the last row says how much of a gap
between whole steps the kernels alone explain. Both run row-major operands as given; XLA may
lay out a real step's operands otherwise.

    python benchmarks/matmul_shapes.py [--rounds 7] [--no-write]
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402

D_MODEL, D_FF, VOCAB, LAYERS = 768, 2048, 32128, 12
ENC, DEC = 2 * 512, 2 * 114          # tokens per step (rows of the products)


def dense_uses() -> dict:
    """{(rows, in, out): Dense layers of that shape in one step}."""
    uses: dict = {}

    def add(rows, d_in, d_out, n):
        uses[(rows, d_in, d_out)] = uses.get((rows, d_in, d_out), 0) + n

    add(ENC, D_MODEL, D_MODEL, 4 * LAYERS)       # encoder self-attention q, k, v, o
    add(ENC, D_MODEL, D_FF, 2 * LAYERS)          # gated-GeLU wi_0, wi_1
    add(ENC, D_FF, D_MODEL, LAYERS)              # wo
    add(DEC, D_MODEL, D_MODEL, 6 * LAYERS)       # decoder self q, k, v, o; cross q, o
    add(ENC, D_MODEL, D_MODEL, 2 * LAYERS)       # cross-attention k, v of the encoder output
    add(DEC, D_MODEL, D_FF, 2 * LAYERS)
    add(DEC, D_FF, D_MODEL, LAYERS)
    add(DEC, D_MODEL, VOCAB, 1)                  # lm_head (untied in T5.1.1)
    return uses


def products(uses: dict) -> dict:
    """{(m, k, n): uses} of the forward and both backward products of every Dense."""
    out: dict = {}
    for (rows, d_in, d_out), n in uses.items():
        for shape in ((rows, d_in, d_out),     # X·W
                      (rows, d_out, d_in),     # dY·Wᵀ
                      (d_in, rows, d_out)):    # Xᵀ·dY
            out[shape] = out.get(shape, 0) + n
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    shapes = products(dense_uses())
    fns = {}
    for m, k, n in shapes:
        rng = np.random.default_rng(0)
        a, b = (rng.standard_normal(s, dtype=np.float32) for s in ((m, k), (k, n)))
        ja, jb = jnp.asarray(a), jnp.asarray(b)
        dot = jax.jit(jnp.dot)
        dot(ja, jb).block_until_ready()
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        torch.matmul(ta, tb)
        fns[f"xla {m}x{k}x{n}"] = lambda dot=dot, ja=ja, jb=jb: dot(ja, jb).block_until_ready()
        fns[f"torch {m}x{k}x{n}"] = lambda ta=ta, tb=tb: torch.matmul(ta, tb)
    load0 = _common.loadavg()
    times = _common.interleaved(fns, args.rounds, log=lambda _: None)
    rows, total = [], {"xla": 0.0, "torch": 0.0}
    for (m, k, n), uses in shapes.items():
        flop = 2.0 * m * k * n
        best = {impl: min(times[f"{impl} {m}x{k}x{n}"]) for impl in total}
        med = {impl: _common.median(times[f"{impl} {m}x{k}x{n}"]) for impl in total}
        for impl in total:
            total[impl] += uses * med[impl]
        rows.append([f"{m} x {k} x {n}", str(uses)]
                    + [f"{flop / best[i] / 1e9:,.0f} / {flop / med[i] / 1e9:,.0f}" for i in total]
                    + [f"{med['xla'] / med['torch']:.2f}"])
    step_flop = sum(2.0 * m * k * n * u for (m, k, n), u in shapes.items())
    rows.append(["all, weighted by uses", f"{step_flop / 1e12:.2f} TFLOP"]
                + [f"{step_flop / total[i] / 1e9:,.0f} (median)" for i in total]
                + [f"**{total['xla'] / total['torch']:.2f}**"])
    table = _common.markdown_table(
        ["product m x k x n", "uses per step", "XLA GFLOP/s best / median",
         "torch GFLOP/s best / median", "XLA time / torch time"], rows)
    print(table)
    line = _common.machine_line("jax", "jaxlib", "torch")
    if not args.no_write:
        body = (f"{line}\nCommand: `python benchmarks/matmul_shapes.py --rounds {args.rounds}`; "
                "float32, a jitted jnp.dot against torch.matmul, interleaved; the Dense products "
                "of T5.1.1-base's step (2 x (512 + 114) tokens), weighted by their uses. "
                f"Load average: {load0} -> {_common.loadavg()}.\n\n" + table)
        _common.append_results("Matmul kernels: XLA vs PyTorch on T5.1.1-base's products",
                               body)


if __name__ == "__main__":
    main()
