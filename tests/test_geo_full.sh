#!/usr/bin/env bash
# GEO-SGD on all of Fashion-MNIST (label "long"): 2 pservers + 2 trainers,
# --update geo --geo-steps 10 with the default recipe (Adam on each
# trainer, 12 epochs) reach >= 0.87 test accuracy, moving about a tenth of
# sync's bytes per step.
. "$(dirname "$0")/lib.sh"
require_data
M="$SCRATCH/metrics.jsonl"
timeout 900 "$(dirname "$0")/../scripts/launch" --bin "$BIN" --pservers 2 --trainers 2 --quiet \
  --log-dir "$SCRATCH/logs" -- --update geo --geo-steps 10 --metrics "$M" --progress-interval 10 \
  >"$SCRATCH/launch.log" 2>&1 || { fail "launch failed: $(tail -8 "$SCRATCH/launch.log")"; finish; }
"$PY" - "$M" <<'PY' || fail "accuracy check"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
last = rows[-1]
print(f"2+2 geo K=10: {len(rows)} epochs, final test accuracy {last['test_accuracy']:.4f}, "
      f"{last['bytes_per_step']:.0f} bytes per step, {last['wall_s']:.0f} s")
assert last["mode"] == "pserver-geo" and len(rows) == 12
assert last["test_accuracy"] >= 0.87, f"final test accuracy {last['test_accuracy']} < 0.87"
# A sync step moves 1,881,168 bytes (235,146 floats each way).
assert last["bytes_per_step"] < 1881168 / 8, last["bytes_per_step"]
PY
finish
