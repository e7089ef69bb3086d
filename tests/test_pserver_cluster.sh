#!/usr/bin/env bash
# 2 pservers + 2 trainers on 127.0.0.1 through scripts/launch learn in sync
# and in async mode: 2 epochs on 12,000 samples reach >= 0.80 (sync) and
# >= 0.78 (async) test accuracy on 2,000, every process exits 0, and trainer
# 0's metrics name the mode.
. "$(dirname "$0")/lib.sh"
require_data
LAUNCH="$(dirname "$0")/../scripts/launch"

for mode in sync async; do
  M="$SCRATCH/$mode.jsonl"
  status=0
  timeout 300 "$LAUNCH" --bin "$BIN" --pservers 2 --trainers 2 --mode "$mode" --quiet \
    --log-dir "$SCRATCH/logs-$mode" -- --epochs 2 --train-samples 12000 --test-samples 2000 \
    --metrics "$M" >"$SCRATCH/launch-$mode.log" 2>&1 || status=$?
  [ "$status" -eq 0 ] || { fail "$mode: launch exited $status: $(tail -8 "$SCRATCH/launch-$mode.log")"; continue; }
  for i in 0 1; do
    grep -q "every trainer is done" "$SCRATCH/logs-$mode/pserver$i.log" ||
      fail "$mode: pserver $i did not see every trainer finish"
  done
  grep -q "done: 2 epochs" "$SCRATCH/logs-$mode/trainer1.log" || fail "$mode: trainer 1 did not finish"
  want=0.80
  [ "$mode" = async ] && want=0.78
  "$PY" - "$M" "$mode" "$want" <<'PY' || fail "$mode: metrics check"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
mode, want = sys.argv[2], float(sys.argv[3])
assert len(rows) == 2, f"{len(rows)} metrics lines (only trainer 0 writes them)"
assert all(r["mode"] == f"pserver-{mode}" for r in rows), rows
acc = rows[-1]["test_accuracy"]
print(f"{mode}: test accuracy {acc:.4f}")
assert acc >= want, f"{mode}: test accuracy {acc} < {want}"
PY
done
finish
