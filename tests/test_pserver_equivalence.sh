#!/usr/bin/env bash
# Sync pserver mode is data-parallel SGD exactly: 2 trainers x batch 32 on 2
# pservers give, after 40 steps, the parameters of local training with batch
# 64 on the same seed and data order, to within 2e-6 (float sums in another
# order); and two sync runs give bitwise-identical parameters.
. "$(dirname "$0")/lib.sh"
require_data
LAUNCH="$(dirname "$0")/../scripts/launch"
COMMON=(--train-samples 6400 --test-samples 500 --max-steps 40 --optimizer momentum --lr 0.05
        --lr-schedule constant --seed 3 --progress-interval 0)

"$BIN/trainer" "${COMMON[@]}" --batch 64 --export "$SCRATCH/local.safetensors" \
  2>"$SCRATCH/local.log" || fail "local run failed: $(tail -3 "$SCRATCH/local.log")"
for run in a b; do
  timeout 300 "$LAUNCH" --bin "$BIN" --pservers 2 --trainers 2 --quiet \
    --log-dir "$SCRATCH/logs-$run" -- "${COMMON[@]}" --batch 32 \
    --export "$SCRATCH/sync-$run.safetensors" >"$SCRATCH/launch-$run.log" 2>&1 ||
    fail "sync run $run failed: $(tail -5 "$SCRATCH/launch-$run.log")"
done
cmp -s "$SCRATCH/sync-a.safetensors" "$SCRATCH/sync-b.safetensors" ||
  fail "two sync runs gave different parameters"

"$PY" - "$SCRATCH/local.safetensors" "$SCRATCH/sync-a.safetensors" <<'PY' || fail "local vs sync"
import json, struct, sys
import numpy as np

def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype="<f4").reshape(t["shape"])
    return out

local, sync = load(sys.argv[1]), load(sys.argv[2])
assert local.keys() == sync.keys(), (local.keys(), sync.keys())
worst = max(float(np.abs(local[k] - sync[k]).max()) for k in local)
moved = max(float(np.abs(local[k]).max()) for k in local)
print(f"max |local - sync| = {worst:.3g} over {len(local)} tensors")
assert worst <= 2e-6, f"parameters differ by {worst}"
assert moved > 0.01
PY
finish
