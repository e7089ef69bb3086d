#!/usr/bin/env bash
# A short training run on the GPU (label "gpu"): 2 epochs on 12,000 samples
# with --device cuda must reach >= 0.80 test accuracy on 2,000. Skipped (77)
# where the build has no CUDA backend or no GPU is visible.
. "$(dirname "$0")/lib.sh"
require_data
M="$SCRATCH/metrics.jsonl"
status=0
"$BIN/trainer" --device cuda --epochs 2 --train-samples 12000 --test-samples 2000 --metrics "$M" \
  2>"$SCRATCH/log" || status=$?
if [ "$status" -eq 2 ] && grep -qE "no GPU is visible|no CUDA backend" "$SCRATCH/log"; then
  echo "SKIP: $(grep -oE "no GPU is visible.*|this build has no CUDA backend.*" "$SCRATCH/log" | head -1)" >&2
  exit 77
fi
[ "$status" -eq 0 ] || { fail "trainer --device cuda exited $status: $(tail -3 "$SCRATCH/log")"; finish; }
grep -q "device cuda: using GPU" "$SCRATCH/log" || fail "the run did not say it used the GPU"
"$PY" - "$M" <<'PY' || fail "accuracy check"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
acc = rows[-1]["test_accuracy"]
print(f"GPU short run: test accuracy {acc:.4f}, {rows[-1]['samples_per_s']:.0f} samples/s")
assert acc >= 0.80, f"test accuracy {acc} < 0.80"
PY
finish
