#!/usr/bin/env bash
# The default recipe on all of Fashion-MNIST must reach >= 0.88 test accuracy
# (label "long": minutes, not seconds).
. "$(dirname "$0")/lib.sh"
require_data
M="$SCRATCH/metrics.jsonl"
"$BIN/trainer" --metrics "$M" --progress-interval 10 2>"$SCRATCH/log" ||
  { fail "trainer exited $?: $(tail -5 "$SCRATCH/log")"; finish; }
"$PY" - "$M" <<'PY' || fail "accuracy check"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
acc = rows[-1]["test_accuracy"]
print(f"full run: {len(rows)} epochs, final test accuracy {acc:.4f}, {rows[-1]['wall_s']:.0f} s")
assert acc >= 0.88, f"final test accuracy {acc} < 0.88"
PY
finish
