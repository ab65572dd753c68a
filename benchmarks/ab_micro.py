"""Two float32 micro levers of a GPT-2 small layer (8x128 tokens), process CPU time in A/B pairs.

  dw_layout  the MLP kernel gradient x^T g ([1024, 768] x [1024, 3072]): autodiff's dot,
             which contracts x's leading dim (XLA:CPU's generic dot kernel), vs
             `t2t.nn.mixed_einsum._product`'s explicit [768, 1024] x [1024, 3072] (YNNPACK)
  fused_qkv  forward + backward of the q, k, v projections: three [768, 12, 64] kernels vs
             one [768, 3, 12, 64] kernel stacked at run time (HF GPT-2's `c_attn`)

Prints medians and the median per-pair ratio B/A (> 1: A is cheaper); does not append to
RESULTS.md.

    python benchmarks/ab_micro.py [--rounds 15]
"""
from __future__ import annotations

import argparse
import statistics
import time

import _common  # noqa: F401  (before JAX starts: the CPU, not a TPU probe)
import jax
import jax.numpy as jnp

from t2t.nn import mixed_einsum
from t2t.nn.dense import matmul


def dw_layout():
    x = jax.random.normal(jax.random.PRNGKey(0), (8, 128, 768))
    g = jax.random.normal(jax.random.PRNGKey(1), (8, 128, 3072))
    w = jnp.zeros((768, 3072))
    autodiff = jax.jit(lambda x, w, g: jax.vjp(
        lambda x, w: jnp.einsum("abc,cd->abd", x, w), x, w)[1](g)[1])
    explicit = jax.jit(lambda x, w, g: mixed_einsum._product("abc", "abd", "cd", x, g))
    return ("explicit row-major", explicit), ("autodiff", autodiff), (x, w, g)


def fused_qkv():
    keys = [jax.random.PRNGKey(i) for i in range(7)]
    x = jax.random.normal(keys[0], (8, 128, 768))
    ws = [jax.random.normal(k, (768, 12, 64)) * 0.02 for k in keys[1:4]]
    probes = [jax.random.normal(k, (8, 128, 12, 64)) for k in keys[4:]]

    def separate(x, ws):
        return sum(jnp.sum(jnp.tanh(matmul(x, w, 1, jnp.float32)) * p)
                   for w, p in zip(ws, probes))

    def fused(x, ws):
        y = matmul(x, jnp.stack(ws, 1), 1, jnp.float32)          # [8, 128, 3, 12, 64]
        return sum(jnp.sum(jnp.tanh(y[:, :, i]) * p) for i, p in enumerate(probes))
    return (("fused", jax.jit(jax.grad(fused, (0, 1)))),
            ("separate", jax.jit(jax.grad(separate, (0, 1)))), (x, ws))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    for lever in (dw_layout, fused_qkv):
        (a_name, a), (b_name, b), inputs = lever()
        jax.block_until_ready((a(*inputs), b(*inputs)))
        cpu = {a_name: [], b_name: []}
        for _ in range(args.rounds):
            for name, fn in ((a_name, a), (b_name, b)):
                t0 = time.process_time()
                jax.block_until_ready(fn(*inputs))
                cpu[name].append(time.process_time() - t0)
        ratio = statistics.median(x / y for x, y in zip(cpu[b_name], cpu[a_name]))
        print(f"{lever.__name__}: A {a_name} {1e3 * statistics.median(cpu[a_name]):.1f} ms CPU, "
              f"B {b_name} {1e3 * statistics.median(cpu[b_name]):.1f} ms CPU, "
              f"B/A {ratio:.2f}x ({args.rounds} pairs)", flush=True)


if __name__ == "__main__":
    main()
