"""Train-step time of a dropout-0.1 T5 with dropout masks from each PRNG implementation.

The threefry2x32 rows compare t2t's masks (`t2t.nn.dropout.keep_mask`: the same bits with
Threefry's 20 rounds written out) with `jax.random.bernoulli`, whose CPU lowering runs the
rounds as a loop of 5 (the variant patches t2t to fall back to it while the step compiles),
and with t2t's masks as they were before 2026-12-04, hashed again in every fusion that reads
them (the variant patches out the lookup that ends the hash in one fusion).

The T5 1.0 architecture at the `tiny` ablation size (d_model 128, 2+2 layers, 4 heads of 32,
d_ff 512, the 8k Bible vocabulary) or, with `--scale micro`, the `micro` one (d_model 256,
4+4 layers, the micro corpus's 16k vocabulary: `t2t data build micro_corpus`),
span-corruption batch 32 x (inputs + targets), the full t2t
train step (Trainer: forward, backward, Adafactor, donation). ``TrainConfig.dropout_rng_impl``
picks the generator of the dropout masks; parameter init is the same for all. Timed
interleaved (A, B, C, A, B, C, ...) so machine load hits every variant alike.

    python benchmarks/dropout_rng.py [--rounds 5] [--scale micro --inputs 128 --targets 64]
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402

IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")


SCALES = {"tiny": ("ablations/scales/t5_tiny_model.gin", "bible_web"),
          "micro": ("ablations/scales/t5_micro_model.gin", "micro")}


MASKS = ("t2t", "jax", "t2t_per_reader")


def step_fn(impl: str, dropout: float, inputs: int, targets: int, masks: str = "t2t",
            scale: str = "tiny"):
    """A zero-argument function running one train step (state carried between calls);
    `masks` (one of MASKS): t2t's, jax.random.bernoulli's, or t2t's hashed in every reader."""
    import contextlib
    from unittest import mock

    import jax
    from t2t.nn import dropout as t2t_dropout
    from t2t.run import gin_utils
    from t2t.run import experiment
    gin_utils.parse(
        ["runs/pretrain.gin", "hardware/cpu.gin", SCALES[scale][0],
         "objectives/iid_15_u_u.gin"],
        ["MODEL_DIR = '/tmp/t2t_dropout_rng'", "BATCH_SIZE = 32", f"CORPUS = {SCALES[scale][1]!r}",
         f"TASK_FEATURE_LENGTHS = {{'inputs': {inputs}, 'targets': {targets}}}",
         f"TransformerConfig.dropout_rate = {dropout}",
         f"TransformerConfig.mlp_dropout_rate = {dropout}",
         f"TrainConfig.dropout_rng_impl = {impl!r}"])
    exp = experiment.experiment()
    batch = next(exp.data())
    box = [exp.trainer.init_state(batch)]

    def run():
        box[0], metrics = exp.trainer.train_step(box[0], batch)
        jax.block_until_ready(metrics["loss"])
    patches = {"jax": ("_threefry_words", lambda key: None),
               "t2t_per_reader": ("_hashed_once", lambda keep: keep)}
    with (mock.patch.object(t2t_dropout, *patches[masks]) if masks in patches
          else contextlib.nullcontext()):
        run()                                        # compiles the step
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--inputs", type=int, default=64)
    parser.add_argument("--targets", type=int, default=32)
    parser.add_argument("--scale", choices=sorted(SCALES), default="tiny")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    shape = (args.inputs, args.targets)
    scale = {"scale": args.scale}
    fns = {f"{impl}, dropout 0.1": step_fn(impl, 0.1, *shape, **scale) for impl in IMPLS}
    fns["threefry2x32 via jax.random.bernoulli, dropout 0.1"] = step_fn(
        "threefry2x32", 0.1, *shape, masks="jax", **scale)
    fns["threefry2x32 hashed in every reader (before 2026-12-04), dropout 0.1"] = step_fn(
        "threefry2x32", 0.1, *shape, masks="t2t_per_reader", **scale)
    fns["no dropout"] = step_fn("threefry2x32", 0.0, *shape, **scale)
    times = _common.interleaved(fns, args.rounds, warmup=2)
    base = _common.median(times["threefry2x32 via jax.random.bernoulli, dropout 0.1"])
    rows = [[name, f"{_common.median(t):.3f}", f"{base / _common.median(t):.2f}x"]
            for name, t in times.items()]
    table = _common.markdown_table(["dropout masks", "median step (s)", "speed-up"], rows)
    print(table)
    if not args.no_write:
        _common.append_results(
            f"Dropout PRNG: train step of the {args.scale}-ablation T5 (dropout 0.1)",
            f"{_common.machine_line('jax', 'flax')} Load: {_common.loadavg()}.\n"
            f"`python benchmarks/dropout_rng.py --rounds {args.rounds} --scale {args.scale} "
            f"--inputs {args.inputs} --targets {args.targets}`: batch 32 x ({args.inputs} + "
            f"{args.targets}), median "
            f"of {args.rounds} interleaved rounds.\n\n{table}")


if __name__ == "__main__":
    main()
