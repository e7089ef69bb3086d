#!/usr/bin/env bash
# LeNet's default recipe (Adam 0.001, cosine, batch 64, 10 epochs) on all of
# Fashion-MNIST must reach >= 0.90 test accuracy (label "long": minutes; two
# threads, its two ctest slots).
. "$(dirname "$0")/lib.sh"
require_data
M="$SCRATCH/metrics.jsonl"
"$BIN/trainer" --model lenet --threads 2 --metrics "$M" --progress-interval 30 2>"$SCRATCH/log" ||
  { fail "trainer exited $?: $(tail -5 "$SCRATCH/log")"; finish; }
"$PY" - "$M" <<'PY' || fail "accuracy check"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
acc = rows[-1]["test_accuracy"]
print(f"lenet: {len(rows)} epochs, test accuracy {acc:.4f}, {rows[-1]['wall_s']:.0f} s")
assert len(rows) == 10 and acc >= 0.90, f"test accuracy {acc} < 0.90 after {len(rows)} epochs"
PY
finish
