#!/usr/bin/env bash
# scripts/bench --staleness --quick: every row of the table is there (MLP and
# CTR, without and with the straggler, sync, async, SSP S=1 and 4, GEO K=10
# and 100), each with sane figures: a final accuracy or AUC above chance,
# bytes per example, sync's ratio to itself 1.00x, a time to target where it
# was reached; GEO rows are "not built" exactly when the trainer refuses
# --update geo; the Markdown table and the plots are written.
. "$(dirname "$0")/lib.sh"
require_data
OUT="$SCRATCH/bench"
timeout 240 "$PY" "$(dirname "$0")/../scripts/bench" --staleness --quick --bin "$BIN" --out "$OUT" \
  >"$SCRATCH/bench.log" 2>&1 || { fail "bench failed: $(tail -8 "$SCRATCH/bench.log")"; finish; }
geo=0
"$BIN/trainer" --mode pserver --pservers 127.0.0.1:1 --update geo --geo-steps 10 --check-config \
  >/dev/null 2>&1 && geo=1
"$PY" - "$OUT/staleness.json" "$OUT/staleness.md" "$geo" <<'PY' || fail "staleness.json check"
import json, sys
r = json.load(open(sys.argv[1]))
md = open(sys.argv[2]).read()
geo = sys.argv[3] == "1"
modes = ["sync", "async", "ssp S=1", "ssp S=4", "geo K=10", "geo K=100"]
want = [(w, s, m) for w in ("mlp", "ctr") for s in ("none", "trainer 1 3x") for m in modes]
got = [(x["workload"], x["straggler"], x["mode"]) for x in r["results"]]
assert got == want, got
for x in r["results"]:
    if x["mode"].startswith("geo") and not geo:
        assert x.get("skipped") == "not built", x
        assert f"| {x['workload']} | {x['straggler']} | {x['mode']} | not built |" in md, x
        continue
    lo = 0.3 if x["workload"] == "mlp" else 0.6  # chance: 0.1 and 0.5
    assert lo < x["final"] <= 1.0 and x["job_s"] > 0 and x["bytes_per_example"] > 100, x
    assert x["curve"] and all(t >= 0 for t, _ in x["curve"]), x
    if x["time_to_target"] is not None:
        assert 0 <= x["time_to_target"] <= x["curve"][-1][0], x
    if x["mode"] == "sync":
        assert x["time_to_target"] is not None, x  # the CTR target comes from sync itself
        assert f"| {x['workload']} | {x['straggler']} | sync | {x['time_to_target']:.2f} | 1.00x |" in md, x
ctr = r["targets"]["ctr"]
assert ctr[0] == "AUC" and 0.6 < ctr[1] < 1, ctr
print(f"{len(got)} rows; targets {r['targets']}")
PY
for w in mlp ctr; do
  if command -v gnuplot >/dev/null; then
    [ -s "$OUT/staleness-$w.png" ] || fail "no plot staleness-$w.png"
  fi
done
grep -q "^| workload | straggler | mode | time to target (s) |" "$OUT/staleness.md" || fail "no Markdown table"
finish
