#!/usr/bin/env bash
# Issue 60's accelerator run, one command on one GPU in under 9 minutes: the bf16 matmul
# peak, then T5.1.1-large span corruption, BERT-large MLM+NSP and GPT-2 medium LM, each at
# the largest batch that fits, with t2t's levers ("best") and as before ("previous"); the
# table is appended to benchmarks/RESULTS.md under a heading naming the GPU
# (benchmarks/gpu_mfu.py has the details; benchmarks/README.md the device command).
#
#   bash benchmarks/gpu_mfu.sh [gpu_mfu.py arguments]
#   XLA_VARIANT=maxtext bash benchmarks/gpu_mfu.sh --models t5 --configs best   # a flag set
#
# Environment: OUT (default /tmp/gpu_mfu: the files that come back, six of them: gpu_mfu.log,
# stages.log, table.md, results.json, results.jsonl, RESULTS.md), BUDGET (seconds for the
# Python run, default 500), XLA_VARIANT (default, lhs, no_triton_gemm, no_command_buffer,
# while_double_buffer, no_xla_remat, maxtext), XLA_PYTHON_CLIENT_MEM_FRACTION (default
# 0.95 here: the batch search may use the GPU's memory; JAX's own default is 0.75).
# On a machine whose Python lacks t2t's pins, put their wheels in .whl/ first (the command
# is in benchmarks/README.md); they are installed to /tmp/site. What the stages import is
# checked first, in seconds, and a missing module ends the run with its name.
set -u
OUT=${OUT:-/tmp/gpu_mfu}
mkdir -p "$OUT"
export OUT PYTHONUNBUFFERED=1 PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.95}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
PREFLIGHT='
import importlib, sys
missing = []
for name in ("jax", "flax", "optax", "orbax.checkpoint", "gin", "grain", "sentencepiece",
             "t2t.train.trainer", "t2t.models.families"):
    try:
        importlib.import_module(name)
    except Exception as e:
        missing.append(f"{name}: {type(e).__name__}: {e}")
if missing:
    print("gpu_mfu.sh: cannot import (put their wheels in .whl/, benchmarks/README.md):")
    print("\n".join("  " + line for line in missing))
    sys.exit(2)
'
{
  nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,driver_version --format=csv
  python3 -c "$PREFLIGHT" &&
  timeout "$(( ${BUDGET:-500} + 40 ))" python3 benchmarks/gpu_mfu.py --out "$OUT" \
    --budget "${BUDGET:-500}" --xla-variant "${XLA_VARIANT:-default}" "$@"
} 2>&1 | grep -v "^\[transformers\]" | tee "$OUT/gpu_mfu.log"
cp benchmarks/RESULTS.md "$OUT/RESULTS.md"
