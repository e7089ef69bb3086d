#!/usr/bin/env bash
# The demo's job: 2 pservers + 2 trainers in sync mode with the default
# recipe on all of Fashion-MNIST reach >= 0.88 test accuracy (label "long").
. "$(dirname "$0")/lib.sh"
require_data
M="$SCRATCH/metrics.jsonl"
timeout 900 "$(dirname "$0")/../scripts/launch" --bin "$BIN" --pservers 2 --trainers 2 --quiet \
  --log-dir "$SCRATCH/logs" -- --metrics "$M" --progress-interval 10 >"$SCRATCH/launch.log" 2>&1 ||
  { fail "launch failed: $(tail -8 "$SCRATCH/launch.log")"; finish; }
"$PY" - "$M" <<'PY' || fail "accuracy check"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
acc = rows[-1]["test_accuracy"]
print(f"2+2 sync: {len(rows)} epochs, final test accuracy {acc:.4f}, {rows[-1]['wall_s']:.0f} s")
assert rows[-1]["mode"] == "pserver-sync"
assert acc >= 0.88, f"final test accuracy {acc} < 0.88"
PY
finish
