#!/usr/bin/env bash
# Issue 61: T5 Table 2's baseline (Denoising / Encoder-decoder) and its random-init control at
# the `gpu_micro` scale (micro x 64: t2t/configs/ablations/scales/t5_gpu_micro.gin, whose
# header has the estimate), seeds 0-2, in one call of a lent H200. Prepared and tested on the
# CPU (tests/ablations/test_gpu_table2.py runs this script at 2 steps); not yet run on a GPU.
#
# 1. Here, once, on a machine with pip (and, to build the data, the registries `t2t data
#    build` reads):
#      PYTHON=.venv/bin/python bash benchmarks/gpu_table2.sh --prepare
#    puts the wheels the device's Python lacks in .whl/ (ignored through .git/info/exclude:
#    6.7 MiB) and, unless runs/bundles/micro holds one, builds the data
#    (`t2t data build micro_corpus bbc spam`, then `t2t data bundle micro --tokens $TOKENS`:
#    29.2 MiB, ignored: /runs/ is in .gitignore); then verifies the bundle and prints the
#    sizes a call carries (64 MiB in all). The bundle is not committed: its size, and the
#    corpus holds GCIDE's text (GPL).
# 2. The device call (`run` tool):
#      command:   bash benchmarks/gpu_table2.sh
#      carry:     [".whl", "runs/bundles/micro"]
#      timeout_s: 600
#    BUDGET_S=480 s of the 600 go to the run itself (it is stopped there: SIGTERM saves the
#    stage's checkpoint and what finished stays); the rest is the wheels' install, the checks,
#    the table of what finished and the tar. $OUT gets 5 files: gpu_table2.log (every line
#    stamped with the seconds since the start), env.txt (GPU, driver, versions, the bundle),
#    gpu_micro_runs.tar.gz (each stage's result.json, stage.json, config.gin, config.sha256,
#    metrics.json and metrics.jsonl: no checkpoints), t5_table2_gpu_micro.md and .png (the
#    table rendered there).
# 3. Here, after it (FILES_AT: the `run` reply's files_at):
#      tar -xzf FILES_AT/gpu_micro_runs.tar.gz -C runs/ablations
#      t2t ablate configs/ablations/t5_table2.gin --scale=gpu_micro --render_only
#    renders docs/ablations/t5_table2_gpu_micro.md (+ .png) with the control margin.
#
# One `t2t ablate` process runs the six cell-seeds in the order seed 0 (baseline, control),
# seed 1, seed 2, printing each stage as it starts (pretraining, fine-tuning on each task)
# and ends (its wall time), and the loss every TrainConfig.log_every steps.
#
#   [OUT=...] [BUNDLE=...] [RUNS=...] [SEEDS="0 1 2"] [BUDGET_S=480] [PYTHON=python3] [WHL=.whl] \
#     bash benchmarks/gpu_table2.sh [T2T ABLATE ARGS...]
#   e.g. bash benchmarks/gpu_table2.sh --gin.T5_GPU_MICRO_PRETRAIN_STEPS=2000   # 32x, if slow
# The arguments go to every `t2t ablate` call (the test passes a tiny model and 2 steps).
set -u -o pipefail
OUT=${OUT:-/tmp/gpu_table2}
BUNDLE=${BUNDLE:-runs/bundles/micro}
RUNS=${RUNS:-runs/ablations}
SEEDS=${SEEDS:-0 1 2}
BUDGET_S=${BUDGET_S:-480}
TOKENS=${TOKENS:-34000000}
PY=${PYTHON:-python3}
WHL=${WHL-.whl}               # wheels for the device's Python 3.12 ("": install none)
GRID=configs/ablations/t5_table2.gin
CELLS='^denoising-encoder_decoder$,^random_init$'
WHEELS="flax==0.12.8 optax==0.2.8 orbax-checkpoint==0.12.8 gin-config==0.5.0 grain==0.2.18
        array-record==0.8.6 tensorboardX==2.6.5 portpicker==1.6.0"
export PYTHONUNBUFFERED=1 PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
start=$SECONDS

if [ "${1:-}" = "--prepare" ]; then          # here, not on the device
  mkdir -p .git/info && touch .git/info/exclude
  grep -qxF '/.whl/' .git/info/exclude || echo '/.whl/' >> .git/info/exclude
  # shellcheck disable=SC2086
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .whl $WHEELS || exit 1
  if [ ! -f "$BUNDLE/manifest.json" ]; then
    $PY -m t2t.cli data build micro_corpus bbc spam --no_progress || exit 1
    $PY -m t2t.cli data bundle micro --out "$BUNDLE" --tokens "$TOKENS" || exit 1
  fi
  $PY -m t2t.cli data bundle --verify "$BUNDLE" || exit 1
  du -sh .whl "$BUNDLE"
  echo "tracked and untracked-not-ignored files: $(git ls-files -co --exclude-standard -z |
    xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1) bytes; a call carries 64 MiB in all"
  exit 0
fi

mkdir -p "$OUT"
LOG=$OUT/gpu_table2.log
: > "$LOG"
stamp() { while IFS= read -r line; do printf '[%4ds] %s\n' $((SECONDS - start)) "$line"; done; }
say() { echo "=== $*" | stamp | tee -a "$LOG"; }

if [ -n "$WHL" ] && ls "$WHL"/*.whl >/dev/null 2>&1; then
  say "installing $(ls "$WHL"/*.whl | wc -l) wheels to /tmp/site"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$WHL"/*.whl || exit 1
  export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
{ command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv
  $PY - "$BUNDLE" <<'PY'
import sys, jax, flax, optax, grain
print("jax", jax.__version__, "flax", flax.__version__, "optax", optax.__version__, "grain",
      grain.__version__, jax.devices())
from t2t.data import bundle   # every file checked against the manifest's sha256
opened = bundle.open_bundle(sys.argv[1])
print("bundle", bundle.summary(opened.manifest, sys.argv[1]), "- decompressed:",
      f"{len(opened.arrays()['tokens']):,} tokens")
PY
} 2>&1 | tee "$OUT/env.txt" | stamp | tee -a "$LOG" || exit 1

bundle=()          # the scale's own path unless BUNDLE names another
[ "$BUNDLE" = runs/bundles/micro ] || bundle=("--gin.T5_GPU_MICRO_BUNDLE='$BUNDLE'")
# a pretraining's newest logged step (step, loss, step time, tokens/s), looked for every 15 s
running=$(mktemp)
( n=0 said=""
  while [ -e "$running" ]; do
    sleep 1 </dev/null >/dev/null 2>&1
    n=$((n + 1))
    [ $((n % 15)) -eq 0 ] || continue
    newest=$(ls -t "$RUNS"/t5_table2/gpu_micro/*/seed*/pretrain/metrics.jsonl 2>/dev/null | head -1)
    [ -s "$newest" ] || continue
    line="${newest#"$RUNS"/}: $(tail -n 1 "$newest" | grep -o \
      '"\(step\|loss\|step_time\|tokens_per_s\)": [0-9.e+-]*' | tr '\n' ' ')"
    [ "$line" = "$said" ] || echo "progress $line"
    said=$line
  done | stamp | tee -a "$LOG" ) &
watcher=$!
left=$((BUDGET_S - (SECONDS - start)))
say "baseline and control at seeds $SEEDS, stopped after $left s (BUDGET_S=$BUDGET_S)"
timeout -s TERM -k 60 "$left" $PY -m t2t.cli ablate "$GRID" --scale=gpu_micro \
  --cells "$CELLS" --seeds "${SEEDS// /,}" --out_dir "$RUNS" --docs_dir "$OUT" \
  "${bundle[@]}" "$@" 2>&1 | stamp | tee -a "$LOG"
status=$?
rm -f "$running"; wait "$watcher"
say "exit $status after $((SECONDS - start)) s"
if [ "$status" -ne 0 ]; then     # stopped or failed: the table of what finished
  $PY -m t2t.cli ablate "$GRID" --scale=gpu_micro --render_only --out_dir "$RUNS" \
    --docs_dir "$OUT" "${bundle[@]}" "$@" 2>&1 | stamp | tee -a "$LOG"
fi
(cd "$RUNS" && find t5_table2/gpu_micro -type f \( -name result.json -o -name stage.json \
   -o -name config.gin -o -name config.sha256 -o -name metrics.json -o -name metrics.jsonl \
   \) -print0 | sort -z |
 tar -czf "$OUT/gpu_micro_runs.tar.gz" --null -T -) 2>&1 | stamp | tee -a "$LOG"
say "done in $((SECONDS - start)) s; in \$OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
exit $status
