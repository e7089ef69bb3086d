#!/usr/bin/env bash
# scripts/bench-shards --quick: every row of the table is there (MLP and
# CTR, without and with the straggler, fixed halves and shards of 16 and 64
# steps), each with sane figures: a final accuracy or AUC above chance, a
# job time, the fixed split's ratio to itself 1.00x, and where shards are
# handed out the two trainers' counts adding up to the epoch's examples.
. "$(dirname "$0")/lib.sh"
require_data
OUT="$SCRATCH/bench"
timeout 240 "$PY" "$(dirname "$0")/../scripts/bench-shards" --quick --runs 1 --bin "$BIN" \
  --out "$OUT" >"$SCRATCH/bench.log" 2>&1 || { fail "bench failed: $(tail -8 "$SCRATCH/bench.log")"; finish; }
"$PY" - "$OUT/shards.json" "$OUT/shards.md" <<'PY' || fail "shards.json check"
import json, sys
r = json.load(open(sys.argv[1]))
md = open(sys.argv[2]).read()
modes = ["fixed halves", "shards of 16 steps", "shards of 64 steps"]
want = [(w, s, m) for w in ("mlp", "ctr") for s in ("none", "trainer 1 3x") for m in modes]
got = [(x["workload"], x["straggler"], x["mode"]) for x in r]
assert got == want, got
epoch = {"mlp": 3000, "ctr": 12000}  # --quick: --train-samples 3000; 12,000 generated rows
for x in r:
    lo = 0.3 if x["workload"] == "mlp" else 0.6  # chance: 0.1 and 0.5
    assert lo < x["final_mean"] <= 1.0 and x["job_s_mean"] > 0, x
    if x["mode"] == "fixed halves":
        assert f"| {x['workload']} | {x['straggler']} | fixed halves | {x['job_s_mean']:.2f} | 1.00x |" in md, x
    else:
        assert sum(x["applied"]) == epoch[x["workload"]], x
print(f"{len(got)} rows")
PY
grep -q "^| workload | straggler | data | job (s) | vs fixed |" "$OUT/shards.md" || fail "no Markdown table"
finish
