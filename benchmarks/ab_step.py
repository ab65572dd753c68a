"""A/B of one code lever on a t2t train step: optimized-HLO evidence and process CPU time.

On a shared machine wall time swings 2x, so each lever is judged by what does not depend
on the load: XLA's optimized HLO of the two compiled steps (matmul FLOPs by operand
dtype, dots, standalone transposes/copies, XLA's temporary buffer bytes) and the
process CPU time (``time.process_time``, all threads) of steps run in pairs, A then B,
in one process; the ratio is the median of the per-pair ratios B/A (> 1: A is faster).

Levers (A and B: the variants compared; a patch is applied while its variant is traced):

  bf16_backward        dtype="bfloat16" with the custom-VJP matmuls (t2t.nn.mixed_einsum)
                       vs plain autodiff of the bf16 forward (backward dots float32 x float32)
  f32_backward_layout  float32 as committed (Dense products through the custom VJP's
                       explicit backward layouts) vs plain autodiff (kernel gradients as
                       dots contracting a leading dim, the activation's backward written
                       out transposed)
  vs_hf_flax           not a lever: t2t float32 vs HF Flax float32, the CPU work of each step

  f32_layout_cost      float32 laid-out products transposing the fewest elements (an output
                       transpose, which XLA folds into the dot, counted) vs keeping each
                       product's output order as bf16 must (T5 micro's tied-embedding
                       gradient then writes the [tokens, vocab] logits gradient transposed)
  classic_emitter      XLA:CPU's default (MLIR) fusion emitter vs its classic one
                       (`xla_cpu_use_fusion_emitters=False`, what the test suite compiles
                       with because it compiles in a third of the CPU time): the same HLO,
                       other machine code

    python benchmarks/ab_step.py --model gpt --lever bf16_backward [--rounds 6]
    python benchmarks/ab_step.py --model t5 --size micro --lever f32_layout_cost
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402
import hlo_ops  # noqa: E402
import train_step  # noqa: E402


@contextlib.contextmanager
def _plain_autodiff_einsum():
    """t2t.nn.mixed_einsum.einsum as the plain product in the compute dtype, autodiff's
    backward: float32 x float32 backward dots under bf16, autodiff's layouts under float32."""
    import jax.numpy as jnp
    from t2t.nn import mixed_einsum
    saved = mixed_einsum.einsum

    def plain(spec, a, b, dtype, laid_out=False, float32_layout=False):
        return jnp.einsum(spec, a.astype(dtype), b.astype(dtype),
                          preferred_element_type=jnp.float32)
    mixed_einsum.einsum = plain
    try:
        yield
    finally:
        mixed_einsum.einsum = saved


@contextlib.contextmanager
def _keep_output_order():
    """Float32 laid-out products keep their output order, as bf16's must (mixed_einsum)."""
    from t2t.nn import mixed_einsum
    saved = mixed_einsum.FLOAT32_LAYOUT_COST
    mixed_einsum.FLOAT32_LAYOUT_COST = mixed_einsum.keep_output_order
    try:
        yield
    finally:
        mixed_einsum.FLOAT32_LAYOUT_COST = saved


# lever: (A: (config overrides, context[, XLA compiler options]), B: (the same), what A
# and B are)
LEVERS = {
    "bf16_backward": (({"dtype": "bfloat16"}, contextlib.nullcontext),
                      ({"dtype": "bfloat16"}, _plain_autodiff_einsum),
                      "A = bfloat16 as committed (custom-VJP bf16 backward), B = bf16 "
                      "forward with autodiff's float32 x float32 backward dots"),
    "f32_layout_cost": (({}, contextlib.nullcontext), ({}, _keep_output_order),
                        "A = float32 as committed (each laid-out product transposes the "
                        "fewest elements, an output transpose included), B = float32 laid "
                        "out keeping every product's output order (the bf16 rule)"),
    "f32_backward_layout": (({}, contextlib.nullcontext), ({}, _plain_autodiff_einsum),
                            "A = float32 as committed (Dense products: the custom VJP's "
                            "explicit backward layouts), B = float32 plain autodiff (kernel "
                            "gradients contract the first operand's leading dim)"),
    "classic_emitter": (({}, contextlib.nullcontext),
                        ({}, contextlib.nullcontext, {"xla_cpu_use_fusion_emitters": False}),
                        "A = float32 compiled as committed (XLA:CPU's MLIR fusion emitter), "
                        "B = the same HLO through XLA:CPU's classic fusion emitter"),
}


def build(model: str, overrides: dict, context, compiler_options=None):
    """(step function, compiled executable) of the t2t train step, traced under `context`
    and compiled with XLA `compiler_options`."""
    import jax
    trainer = train_step.build_t2t(model, **overrides)[1]
    batch = trainer.global_batch(train_step.make_batch(model))
    holder = {"state": trainer.init_state(train_step.make_batch(model))}
    with context():
        compiled = trainer.lower_train_step(holder["state"], batch).compile(
            compiler_options)

    def step():
        holder["state"], metrics = compiled(holder["state"], batch)
        jax.block_until_ready(metrics["loss"])
    return step, compiled


def evidence(compiled) -> dict:
    """Load-independent facts of one compiled step."""
    text = compiled.as_text()
    dots = hlo_ops.dot_flops(text)
    total = sum(f for *_, f in dots) or 1
    counts = hlo_ops.op_counts(text)
    return {"dots": len(dots), "dots outside fusions": counts["top/dot"],
            "f32-operand dot FLOPs": f"{sum(f for a, b, f in dots if 'f32' in (a, b)) / total:.0%}",
            "fusions": counts["top/fusion"],
            "transposes (MB)": f"{counts['top/transpose']} ({counts['top/transpose_mb']:.0f})",
            "copies (MB)": f"{counts['top/copy']} ({counts['top/copy_mb']:.0f})",
            "temp MB": f"{compiled.memory_analysis().temp_size_in_bytes / 2**20:.0f}"}


HLO_NOTE = (" HLO columns from XLA's optimized HLO of each step (all dots; those outside "
            "fusions run in XLA:CPU's generic dot kernel, not YNNPACK; standalone "
            "transposes/copies with the MB they write; `memory_analysis().temp_size_in_bytes`).")


def paired(a, b, rounds: int) -> dict:
    """Process CPU seconds and wall seconds of A and B steps, A B A B ..., after one warm-up."""
    a(), b()
    out = {"A cpu": [], "B cpu": [], "A wall": [], "B wall": []}
    for r in range(rounds):
        for name, fn in (("A", a), ("B", b)):
            c0, w0 = time.process_time(), time.perf_counter()
            fn()
            out[f"{name} cpu"].append(time.process_time() - c0)
            out[f"{name} wall"].append(time.perf_counter() - w0)
        print(f"  pair {r + 1}/{rounds}: A cpu {out['A cpu'][-1]:.2f} s, B cpu "
              f"{out['B cpu'][-1]:.2f} s (load {_common.loadavg()})", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="gpt", choices=["bert", "t5", "gpt"])
    parser.add_argument("--lever", default="bf16_backward",
                        choices=sorted(LEVERS) + ["vs_hf_flax"])
    parser.add_argument("--size", default="base", choices=train_step.SIZES)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    train_step.set_size(parser, args.size, args.model)
    load0 = _common.loadavg()
    if args.lever == "vs_hf_flax":      # no HLO facts for the peer: CPU work only
        what = "A = t2t float32, B = HF Flax float32 (train_step.py's two steps)"
        a_step, b_step = build(args.model, {}, contextlib.nullcontext)[0], \
            train_step.build_hf_flax(args.model)
        facts = {"A": {}, "B": {}}
    else:
        a_variant, b_variant, what = LEVERS[args.lever]
        a_step, a_compiled = build(args.model, *a_variant)
        b_step, b_compiled = build(args.model, *b_variant)
        facts = {"A": evidence(a_compiled), "B": evidence(b_compiled)}
    t = paired(a_step, b_step, args.rounds)
    ratios = [b / a for a, b in zip(t["A cpu"], t["B cpu"])]
    rows = [[name, *facts[name].values(), f"{statistics.median(t[name + ' cpu']):.2f}",
             f"{statistics.median(t[name + ' wall']):.2f}"] for name in ("A", "B")]
    table = _common.markdown_table(
        ["variant", *facts["A"], "CPU s/step", "wall s/step"], rows)
    summary = (f"B/A process CPU time, median of {args.rounds} pairs: "
               f"{statistics.median(ratios):.2f}x (pairs {min(ratios):.2f}-{max(ratios):.2f})")
    print(table, summary, sep="\n")
    if not args.no_write:
        _common.append_results(
            f"A/B lever `{args.lever}`: {train_step.title(args.model)}",
            f"{_common.machine_line('jax', 'jaxlib')} Load: {load0} -> {_common.loadavg()}.\n"
            f"`python benchmarks/ab_step.py --model {args.model} --size {args.size} "
            f"--lever {args.lever} "
            f"--rounds {args.rounds}`: {what}.{HLO_NOTE if facts['A'] else ''}"
            f"\n\n{table}\n\n{summary}.")


if __name__ == "__main__":
    main()
