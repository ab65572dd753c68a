#!/usr/bin/env bash
# Run ablation cell-seeds one at a time from a fixed code checkout and commit each finished
# one's small files, so a long grid survives the session that started it (tools/README.md).
#
#   tools/run_cells.sh GRID SEED KEY [KEY ...]      e.g. tools/run_cells.sh t5_table2 0 lm-prefix_lm
#
# CODE_REF (default HEAD when first run; kept in $STATE/code_ref) is the commit the cells
# run; it is checked out as a detached worktree at $WORKTREE whose runs/ links to this
# checkout's, so editing and committing here does not change a cell midway. A file
# $STATE/stop ends the loop before its next cell. Logs: $STATE/<grid>-<key>-seed<seed>.log.
set -u
GRID=$1; SEED=$2; shift 2
ROOT=$(cd "$(dirname "$0")/.." && pwd)
STATE=${STATE:-/tmp/grid}
WORKTREE=${WORKTREE:-$ROOT/../grid-code}
PY=${PY:-$ROOT/.venv/bin/python}
mkdir -p "$STATE"
cd "$ROOT"
[ -f "$STATE/code_ref" ] || git rev-parse "${CODE_REF:-HEAD}" > "$STATE/code_ref"

refresh_worktree() {
  local want; want=$(git rev-parse "$(cat "$STATE/code_ref")")
  [ "$(git -C "$WORKTREE" rev-parse HEAD 2>/dev/null)" = "$want" ] && return
  [ -L "$WORKTREE/runs" ] && rm "$WORKTREE/runs"
  git worktree remove --force "$WORKTREE" 2>/dev/null
  git worktree add -q --detach "$WORKTREE" "$want"
  rm -rf "$WORKTREE/runs" && ln -s "$ROOT/runs" "$WORKTREE/runs"
  echo "    $(date -u +%H:%M:%S) code at $(git -C "$WORKTREE" log --oneline -1)" >> "$STATE/progress.log"
}

for KEY in "$@"; do
  [ -f "$STATE/stop" ] && { echo "stopped before $GRID $KEY seed$SEED" >> "$STATE/progress.log"; exit 0; }
  refresh_worktree
  echo "=== $(date -u +%H:%M:%S) $GRID $KEY seed$SEED" >> "$STATE/progress.log"
  (cd "$WORKTREE" && "$PY" -m t2t.cli ablate "configs/ablations/$GRID.gin" --scale=micro \
      --seeds "$SEED" --cells "^$KEY\$" --docs_dir "$STATE/docs") \
      > "$STATE/$GRID-$KEY-seed$SEED.log" 2>&1
  rc=$?
  echo "    $(date -u +%H:%M:%S) rc=$rc" >> "$STATE/progress.log"
  D=runs/ablations/$GRID/micro/$KEY/seed$SEED
  [ $rc -eq 0 ] && [ -f "$D/result.json" ] || continue
  FILES=$(find "$D" \( -name config.gin -o -name config.sha256 -o -name metrics.json \
      -o -name stage.json -o -name result.json -o -name early.json \) | sort)
  SUMMARY=$("$PY" - "$D/result.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
parts = [f"{t} {v['metrics'].get('f1', v['metrics'].get('accuracy')):.1f}"
         for t, v in sorted(r["finetune"].items())]
pre = r.get("pretrain") or {}
loss = f"pretrain loss {pre['final_loss']:.3f}, " if pre.get("final_loss") else ""
print(f"{r['label']} - {loss}{', '.join(parts)} (seed {r['seed']})")
PY
)
  said="not committed (git busy?)"
  for _ in 1 2 3 4 5 6; do      # another commit may hold the index for a moment
    if git add -f $FILES; then
      if git diff --cached --quiet -- $FILES; then said="already committed"; break; fi
      git commit -q -m "$GRID at micro: $SUMMARY" -- $FILES && { said="committed"; break; }
    fi
    sleep 5
  done
  echo "    $said: $SUMMARY" >> "$STATE/progress.log"
done
