#!/usr/bin/env bash
# scripts/bench-elastic --quick, async and sync: every job of the table ran
# (the fixed split, handed-out shards, elastic with 2 trainers at MAX 2 and
# 4, and the job that grows to 4 and shrinks to 1), each with an accuracy
# above chance, and every elastic job counted each epoch's examples once.
. "$(dirname "$0")/lib.sh"
require_data
OUT="$SCRATCH/bench"
for update in async sync; do
  name=elastic; [ "$update" = sync ] && name=elastic-sync
  timeout 300 "$PY" "$(dirname "$0")/../scripts/bench-elastic" --update "$update" --quick --runs 1 \
    --bin "$BIN" --out "$OUT" >"$SCRATCH/bench-$update.log" 2>&1 ||
    { fail "$update: bench failed: $(tail -8 "$SCRATCH/bench-$update.log")"; continue; }
  "$PY" - "$OUT/$name.json" <<'PY' || fail "$name.json check"
import json, sys
r = json.load(open(sys.argv[1]))
assert list(r) == ["fixed split", "fixed, shards", "elastic 2", "elastic 2, MAX 4", "elastic 2-4-1"], list(r)
for mode, runs in r.items():
    for x in runs:
        assert 0.3 < x["accuracy"] <= 1 and x["job_s"] > 0, (mode, x)
        assert x["counted_once"] is (True if mode.startswith("elastic") else None), (mode, x)
print("5 jobs")
PY
  grep -q "^| elastic 2-4-1 | .* | yes |$" "$OUT/$name.md" || fail "$update: no Markdown row for the 2-4-1 job"
done
finish
