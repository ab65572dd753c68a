"""Self-attention memory and time vs length: full softmax attention against Linformer.

One t2t `MultiHeadAttention` layer (d_model 256, 4 heads of 64, batch 1, float32, learned
positions) at lengths 128 -> 4096, as the encoder runs it, forward and backward (the
gradient of its summed output with respect to the parameters and the input). Linformer
(Wang et al. 2020; t2t/nn/linformer.py) projects keys and values to k = 128 slots. Memory is
XLA's compiled temporary buffer size for that step (`memory_analysis().temp_size_in_bytes`:
what the step allocates besides its inputs and outputs), time the median of interleaved
rounds (A, B, A, B, ...).

    python benchmarks/linformer_attention.py [--rounds 3] [--k 128] [--no-write]
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402

LENGTHS = (128, 256, 512, 1024, 2048, 4096)


def step(n: int, k: int):
    """(run, temp bytes) of one forward + backward of the attention at length n (k = 0: full)."""
    import jax
    import jax.numpy as jnp

    from t2t.nn.attention import MultiHeadAttention
    from t2t.nn.config import TransformerConfig

    cfg = TransformerConfig(d_model=256, num_heads=4, head_dim=64, dropout_rate=0.0,
                            position_embedding="learned", max_length=max(LENGTHS),
                            linformer_k=k)
    attn = MultiHeadAttention(cfg, low_rank=k > 0)
    x = jax.random.normal(jax.random.PRNGKey(0), (1, n, cfg.d_model))
    params = attn.init(jax.random.PRNGKey(1), x, x)["params"]

    def loss(p, x):
        return jnp.sum(attn.apply({"params": p}, x, x))

    grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
    compiled = grad.lower(params, x).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes

    def run():
        jax.block_until_ready(compiled(params, x))
    return run, temp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--k", type=int, default=128)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    rows = []
    for n in LENGTHS:
        full, full_mem = step(n, 0)
        low, low_mem = step(n, args.k)
        times = _common.interleaved({f"full n={n}": full, f"linformer n={n}": low},
                                    args.rounds, warmup=1)
        t_full, t_low = (_common.median(t) for t in times.values())
        rows.append([str(n), f"{full_mem / 2**20:.1f}", f"{low_mem / 2**20:.1f}",
                     f"{t_full * 1e3:.1f}", f"{t_low * 1e3:.1f}", f"{t_full / t_low:.2f}x"])
    table = _common.markdown_table(
        ["length n", "full: temp MiB", f"Linformer k={args.k}: temp MiB", "full: ms",
         f"Linformer k={args.k}: ms", "speed-up"], rows)
    print(table)
    if not args.no_write:
        _common.append_results(
            "Linformer vs full self-attention: memory and time vs length",
            f"{_common.machine_line('jax', 'flax')} Load: {_common.loadavg()}.\n"
            f"`python benchmarks/linformer_attention.py --rounds {args.rounds} --k {args.k}`: "
            "one MultiHeadAttention (d_model 256, 4 heads of 64, batch 1, float32), forward + "
            "backward; temp = XLA's compiled temporary buffers; median of "
            f"{args.rounds} interleaved rounds.\n\n{table}")


if __name__ == "__main__":
    main()
