"""Matmul peak of one CPU device: a jitted 2048^3 product, GFLOP/s.

  float32                 f32 x f32 -> f32
  bfloat16 -> float32     bf16 x bf16 with preferred_element_type=float32 (what t2t's
                          Dense does with TransformerConfig.dtype="bfloat16")
  bfloat16 -> bfloat16    plain bf16 dot (for reference)

Variants are timed interleaved; best and median of ``--repeats`` rounds. The header
records the CPU's bf16 flags (avx512_bf16, amx_bf16): without them bf16 is emulated.

    python benchmarks/peak.py [--size 2048] [--repeats 7] [--no-write]
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)

    import jax
    import jax.numpy as jnp
    from t2t.train import flops

    n = args.size
    print(_common.machine_line("jax", "jaxlib"), flush=True)
    variants = {
        "float32": (jnp.float32, jnp.float32),
        "bfloat16 -> float32": (jnp.bfloat16, jnp.float32),
        "bfloat16 -> bfloat16": (jnp.bfloat16, jnp.bfloat16),
    }
    fns = {}
    for name, (dt, out) in variants.items():
        a = jax.random.normal(jax.random.PRNGKey(0), (n, n), dt)
        f = jax.jit(lambda x, out=out: jnp.matmul(x, x, preferred_element_type=out))
        f(a).block_until_ready()
        fns[name] = (lambda f=f, a=a: f(a).block_until_ready())
    load0 = _common.loadavg()
    times = _common.interleaved(fns, args.repeats)
    lib = {"float32": flops.measure_peak_flops("float32", n),
           "bfloat16 -> float32": flops.measure_peak_flops("bfloat16", n)}
    rows = []
    for name, ts in times.items():
        f = 2.0 * n ** 3
        rows.append([name, f"{f / min(ts) / 1e9:,.0f}", f"{f / _common.median(ts) / 1e9:,.0f}",
                     f"{lib[name] / 1e9:,.0f}" if name in lib else "-"])
    table = _common.markdown_table(
        ["matmul (inputs -> accumulation/output)", "best GFLOP/s", "median GFLOP/s",
         "t2t measure_peak_flops GFLOP/s"], rows)
    print(table)
    if not args.no_write:
        body = (_common.machine_line("jax", "jaxlib") + f"\nCommand: `python benchmarks/peak.py "
                f"--size {n} --repeats {args.repeats}`; {n}^3 matmul, 2*n^3 FLOPs, one "
                f"device. Load average: {load0} -> {_common.loadavg()}.\n\n" + table)
        _common.append_results("Matmul peak (CPU)", body)


if __name__ == "__main__":
    main()
