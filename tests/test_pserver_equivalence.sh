#!/usr/bin/env bash
# Sync pserver mode is data-parallel SGD exactly: 2 trainers x batch 32 on 2
# pservers give, after 40 steps, the parameters of local training with batch
# 64 on the same seed and data order, to within 2e-6 (float sums in another
# order); and two sync runs give bitwise-identical parameters, overlapped
# (--overlap: a push per layer as backward produces it) or not (the
# default: one push per pserver at the end of the step), in float32 and with
# --wire-dtype bf16 alike.
. "$(dirname "$0")/lib.sh"
require_data
LAUNCH="$(dirname "$0")/../scripts/launch"
COMMON=(--train-samples 6400 --test-samples 500 --max-steps 40 --optimizer momentum --lr 0.05
        --lr-schedule constant --seed 3 --progress-interval 0)

"$BIN/trainer" "${COMMON[@]}" --batch 64 --export "$SCRATCH/local.safetensors" \
  2>"$SCRATCH/local.log" || fail "local run failed: $(tail -3 "$SCRATCH/local.log")"
for run in a b whole bf16 bf16-whole; do
  case $run in
    whole) extra=() ;;
    bf16) extra=(--overlap --wire-dtype bf16) ;;
    bf16-whole) extra=(--wire-dtype bf16) ;;
    *) extra=(--overlap) ;;
  esac
  timeout 300 "$LAUNCH" --bin "$BIN" --pservers 2 --trainers 2 --quiet \
    --log-dir "$SCRATCH/logs-$run" -- "${COMMON[@]}" --batch 32 "${extra[@]}" \
    --export "$SCRATCH/sync-$run.safetensors" >"$SCRATCH/launch-$run.log" 2>&1 ||
    fail "sync run $run failed: $(tail -5 "$SCRATCH/launch-$run.log")"
done
cmp -s "$SCRATCH/sync-a.safetensors" "$SCRATCH/sync-b.safetensors" ||
  fail "two sync runs gave different parameters"
cmp -s "$SCRATCH/sync-a.safetensors" "$SCRATCH/sync-whole.safetensors" ||
  fail "the overlapped step gave other parameters than one push per step"
cmp -s "$SCRATCH/sync-bf16.safetensors" "$SCRATCH/sync-bf16-whole.safetensors" ||
  fail "with --wire-dtype bf16 the overlapped step gave other parameters than one push per step"
cmp -s "$SCRATCH/sync-a.safetensors" "$SCRATCH/sync-bf16.safetensors" &&
  fail "--wire-dtype bf16 gave the float32 run's parameters: nothing was converted"

PYTHONPATH="$(dirname "$0")" "$PY" - "$SCRATCH/local.safetensors" "$SCRATCH/sync-a.safetensors" <<'PY' || fail "local vs sync"
import sys
import numpy as np
from safetensors_read import load, max_difference
local, sync = load(sys.argv[1]), load(sys.argv[2])
worst = max_difference(local, sync)
print(f"max |local - sync| = {worst:.3g} over {len(local)} tensors")
assert worst <= 2e-6, f"parameters differ by {worst}"
assert max(float(np.abs(v).max()) for v in local.values()) > 0.01
PY
finish
