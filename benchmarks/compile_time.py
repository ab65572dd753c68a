"""Compile time of the T5 train step vs depth, with and without ``scan_layers``.

A narrow T5.1.1-style model (d_model 128, 2 heads of 64, d_ff 256, vocab 1024) with
``L`` encoder and ``L`` decoder layers, batch 2 x (64 + 16); the full t2t train step
(Trainer: forward, backward, AdamW, donation) is lowered and compiled ahead of time.
Reported: trace+lower seconds, XLA compile seconds, their sum, and the ratio to the
shallowest depth; also process CPU seconds (trace+lower+compile), which a shared,
loaded machine distorts far less than wall time. No persistent compilation cache is used.

    python benchmarks/compile_time.py [--depths 2,6,12,24] [--no-write]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import _common  # noqa: E402


def compile_seconds(layers: int, scan: bool) -> tuple[float, float, float]:
    import jax
    import optax
    from t2t.models.families import make_model
    from t2t.nn.config import TransformerConfig
    from t2t.train import partitioning
    from t2t.train.trainer import TrainConfig, Trainer

    cfg = TransformerConfig(vocab_size=1024, d_model=128, num_heads=2, head_dim=64, d_ff=256,
                            num_encoder_layers=layers, num_decoder_layers=layers,
                            tie_embeddings=False, dropout_rate=0.0, scan_layers=scan)
    mesh = partitioning.make_mesh(partitioning.MeshConfig(), devices=jax.devices()[:1])
    trainer = Trainer(make_model("t5", cfg), optax.adamw(1e-4, weight_decay=0.01), mesh,
                      TrainConfig(model_dir=tempfile.mkdtemp(), progress_bar=False))
    b, s, t = 2, 64, 16
    rng = np.random.default_rng(0)
    batch = {"encoder_input_tokens": rng.integers(2, 1000, (b, s), dtype=np.int32),
             "decoder_input_tokens": rng.integers(2, 1000, (b, t), dtype=np.int32),
             "decoder_target_tokens": rng.integers(2, 1000, (b, t), dtype=np.int32),
             "decoder_loss_weights": np.ones((b, t), np.float32)}
    state = trainer.init_state(batch)
    trainer._compile()
    with partitioning.sharding_context(mesh, trainer.rules):
        gbatch = trainer.global_batch(batch)
        t0, c0 = time.perf_counter(), time.process_time()
        lowered = trainer._train_step.lower(state, gbatch)
        t1, c1 = time.perf_counter(), time.process_time()
        lowered.compile()
        t2, c2 = time.perf_counter(), time.process_time()
    return t1 - t0, t2 - t1, (c1 - c0) + (c2 - c1)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depths", default="2,6,12,24")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    import jax
    jax.config.update("jax_enable_compilation_cache", False)

    depths = [int(d) for d in args.depths.split(",")]
    load0 = _common.loadavg()
    results = {}
    for depth in depths:                     # interleave scan on/off at each depth
        for scan in (True, False):
            results[(depth, scan)] = compile_seconds(depth, scan)
            lo, co, cpu = results[(depth, scan)]
            print(f"  layers {depth:2d} scan={scan!s:5}: lower {lo:.1f}s compile {co:.1f}s "
                  f"CPU {cpu:.1f}s "
                  f"(load {_common.loadavg()})", flush=True)
    rows = []
    for scan in (True, False):
        first = sum(results[(depths[0], scan)][:2])
        first_cpu = results[(depths[0], scan)][2]
        for depth in depths:
            lo, co, cpu = results[(depth, scan)]
            rows.append([f"{depth}+{depth}", "on" if scan else "off", f"{lo:.1f}", f"{co:.1f}",
                         f"{lo + co:.1f}", f"{(lo + co) / first:.2f}x", f"{cpu:.1f}",
                         f"{cpu / first_cpu:.2f}x"])
    table = _common.markdown_table(
        ["encoder+decoder layers", "scan_layers", "trace+lower s", "XLA compile s", "total s",
         f"vs {depths[0]}+{depths[0]}", "process CPU s", f"CPU vs {depths[0]}+{depths[0]}"],
        rows, "llrrrrrr")
    print(table)
    if not args.no_write:
        body = (_common.machine_line("jax", "jaxlib", "flax") +
                f"\nCommand: `python benchmarks/compile_time.py --depths {args.depths}`; T5.1.1 "
                "train step, d_model 128, 2x64 heads, d_ff 256, vocab 1024, batch 2x(64+16), "
                f"AdamW. Load average: {load0} -> {_common.loadavg()}.\n\n" + table)
        _common.append_results("Compile time: T5 train step vs depth", body)


if __name__ == "__main__":
    main()
