#!/usr/bin/env bash
# Issue 21's accelerator run: T5.1.1-large (and friends) train steps on one NVIDIA GPU, t2t
# in bfloat16 with cuDNN attention and with XLA attention, then PyTorch (HF, bf16 autocast)
# on the same GPU in a second process (two frameworks' caching allocators in one process
# would starve each other at these batch sizes). MFU is against a bf16 matmul peak measured
# in the same run.
#
#   bash benchmarks/gpu_step.sh [BATCH] [MODELS] [T2T_IMPLS] [PEER_IMPLS]
#   e.g. bash benchmarks/gpu_step.sh 64 t5 t2t_bf16_scan,t2t_bf16_xla torch_bf16
#   PROFILE=t2t_bf16_scan bash benchmarks/gpu_step.sh 64 t5 t2t_bf16_scan ""   # + a profile
#
# On a machine whose Python lacks t2t's pure-Python pins, put their wheels in .whl/ first;
# they are installed to /tmp/site here. For a Python 3.12 machine with its own jax:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux2014_x86_64 -d .whl flax==0.12.8 optax==0.2.8 \
#     orbax-checkpoint==0.12.8 gin-config==0.5.0
# Logs and the appended benchmarks/RESULTS.md go to $OUT when it is set.
set -u
BATCH=${1:-64}
MODELS=${2:-t5}
T2T=${3:-t2t_bf16,t2t_bf16_xla}
PEERS=${4-torch_bf16}
OUT=${OUT:-/tmp/gpu_step}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,driver_version --format=csv
python3 -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__,
 'optax', optax.__version__, jax.devices())"
run() {   # run NAME TIMEOUT ARGS...: one benchmark process, its log under $OUT
  local name=$1 limit=$2; shift 2
  echo "=== $name (timeout ${limit}s)"
  timeout "$limit" python3 benchmarks/train_step.py --size large --batch "$BATCH" \
    --models "$MODELS" "$@" 2>&1 | grep -v "^\[transformers\]" | tee "$OUT/$name.log"
}
run t2t "${T2T_TIMEOUT:-330}" --impls "$T2T" --rounds "${ROUNDS:-5}"
# the peers' process uses JAX only for the peak matmul: keep it from taking the GPU's memory
[ -n "$PEERS" ] && XLA_PYTHON_CLIENT_PREALLOCATE=false run peers "${PEER_TIMEOUT:-150}" --impls "$PEERS" --rounds "${ROUNDS:-5}"
# PROFILE=IMPL: where that impl's step goes on the device, by HLO op (profile_step.py)
if [ -n "${PROFILE:-}" ]; then
  echo "=== profile $PROFILE"
  timeout "${PROFILE_TIMEOUT:-200}" python3 benchmarks/profile_step.py --model "${MODELS%%,*}" \
    --impl "$PROFILE" --size large --batch "$BATCH" --top 40 2>&1 | tee "$OUT/profile.log"
fi
cp benchmarks/RESULTS.md "$OUT/RESULTS.md"
