#!/usr/bin/env bash
# The 3-minute soak (label "soak"; it may run beside other tests: its calm
# and loaded runs go side by side, so other work slows both alike):
# scripts/soak 3 must pass every check it makes (flat RSS, open files and
# threads after warm-up; step p99 within 1.5x of the calm run's, window by
# window; checkpoints bitwise equal to the calm run's;
# every unknown-method call UNIMPLEMENTED and every storm request refused;
# SIGTERM under load ends both pservers within 5 s) and write its table,
# JSON and plot.
. "$(dirname "$0")/lib.sh"
require_data
command -v gnuplot >/dev/null || { echo "FAIL: gnuplot is not installed (scripts/setup)" >&2; exit 1; }
status=0
"$PY" "$(dirname "$0")/../scripts/soak" 3 --out "$SCRATCH/soak" --bin "$BIN" >&2 || status=$?
[ "$status" -eq 0 ] || fail "scripts/soak 3 exited $status"
for f in soak.md soak.json soak.png; do
  [ -s "$SCRATCH/soak/$f" ] || fail "scripts/soak wrote no $f"
done
finish
