"""Where a t2t train step's time goes, from XLA's optimized HLO: operation counts.

Compiles the same t2t train steps as ``train_step.py`` (BERT-base MLM+NSP 8x128,
T5.1.1-base 2x(512+114), GPT-2 small 8x128) and counts, outside fusions (ops that run as
their own kernels and move memory) and inside them, the matmuls (``dot``), ``transpose``,
``copy`` and fusions, with the megabytes the standalone transposes and copies write: the
layout changes XLA had to insert around the einsums. A step's excess over its matmul time
is mostly there on CPU.

    python benchmarks/hlo_ops.py [--models bert,t5,gpt] [--impls t2t,t2t_bf16] [--no-write]
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import _common  # noqa: E402
import train_step  # noqa: E402

INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+ = (\w+)\[([\d,]*)\][^ ]* ([\w\-]+)\(")
BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "pred": 1, "s8": 1, "u8": 1}
COUNTED = ("dot", "transpose", "copy", "fusion", "convolution")


def op_counts(hlo_text: str) -> dict:
    """{'top/<op>': n, 'fused/<op>': n, 'top/<op>_mb': MB written} of an HLO module."""
    counts: dict = collections.Counter()
    fused = False
    for line in hlo_text.splitlines():
        if line and not line[0].isspace():        # a computation header (or its end)
            fused = line.lstrip("%").startswith("fused_") or ".fused" in line.split("(")[0]
            continue
        m = INSTRUCTION.match(line)
        if not m:
            continue
        dtype, dims, op = m.groups()
        if op not in COUNTED:
            continue
        where = "fused" if fused else "top"
        counts[f"{where}/{op}"] += 1
        if where == "top" and op in ("transpose", "copy"):
            size = int(np.prod([int(d) for d in dims.split(",") if d])) if dims else 1
            counts[f"top/{op}_mb"] += size * BYTES.get(dtype, 4) / 1e6
    return counts


DOT = re.compile(r"%?([\w.\-]+) = (\w+)\[([\d,]*)\][^ ]* dot\(%?([\w.\-]+), %?([\w.\-]+)\)"
                 r".*lhs_contracting_dims=\{([\d,]*)\}")
VALUE = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = (\w+)\[([\d,]*)\]")
PARAMETER = re.compile(r"([\w.\-]+): (\w+)\[([\d,]*)\]")


def _dims(text: str) -> list:
    return [int(d) for d in text.split(",") if d]


def dot_flops(hlo_text: str, reductions: bool = True) -> list:
    """[(lhs dtype, rhs dtype, FLOPs)] of every dot of an optimized HLO module, inside
    fusions too: which matmuls XLA runs with bf16 operands and which it upcast.
    `reductions=False` leaves out the dots whose one operand is contracted whole (a vector
    of ones summing the other: `t2t.nn.dense.add_bias`'s bias gradients)."""
    out, values = [], {}
    for line in hlo_text.splitlines():
        if line and not line[0].isspace():        # a computation header: its parameters
            values = {n: (t, _dims(d)) for n, t, d in PARAMETER.findall(line)}
            continue
        m = VALUE.match(line)
        if m:
            values[m.group(1)] = (m.group(2), _dims(m.group(3)))
        d = DOT.search(line)
        if d:
            (lhs, lhs_shape), (rhs, rhs_shape) = values[d.group(4)], values[d.group(5)]
            k = int(np.prod([lhs_shape[i] for i in _dims(d.group(6))]))
            if not reductions and k in (int(np.prod(lhs_shape)), int(np.prod(rhs_shape))):
                continue
            out.append((lhs, rhs, 2 * int(np.prod(_dims(d.group(3)))) * k))
    return out


def compiled_hlo(model: str, impl: str) -> str:
    """The optimized HLO text of the t2t train step, as `Trainer.train_step` compiles it."""
    from t2t.train import partitioning
    overrides = {"t2t": {}, "t2t_bf16": {"dtype": "bfloat16"}}[impl]
    trainer = train_step.build_t2t(model, **overrides)[1]
    batch = train_step.make_batch(model)
    state = trainer.init_state(batch)
    trainer._compile()
    with partitioning.sharding_context(trainer.mesh, trainer.rules):
        return trainer._train_step.lower(state, batch).compile().as_text()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="bert,t5,gpt")
    parser.add_argument("--impls", default="t2t")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    rows = []
    for model in args.models.split(","):
        for impl in args.impls.split(","):
            c = op_counts(compiled_hlo(model, impl))
            rows.append([train_step.title(model), impl, c["top/dot"],
                         c["fused/dot"], c["top/fusion"], c["top/transpose"],
                         f"{c['top/transpose_mb']:.0f}",
                         c["top/copy"], f"{c['top/copy_mb']:.0f}", c["fused/transpose"],
                         c["fused/copy"]])
            print(rows[-1], flush=True)
    table = _common.markdown_table(
        ["model", "impl", "dots", "dots in fusions", "fusions", "transposes", "transpose MB",
         "copies",
         "copy MB", "transposes in fusions", "copies in fusions"], rows)
    print(table)
    if not args.no_write:
        _common.append_results(
            "XLA optimized HLO of the t2t train step: operation counts",
            f"{_common.machine_line('jax', 'jaxlib')}\n`python benchmarks/hlo_ops.py "
            f"--models {args.models} --impls {args.impls}`: standalone ops (own kernels) and "
            f"ops inside fusions; MB = bytes the standalone transposes/copies write per step."
            f"\n\n{table}")


if __name__ == "__main__":
    main()
