#!/usr/bin/env bash
# scripts/bench --workload ctr --quick: generated data, the reader alone and
# Wide&Deep and LR trained locally; the table holds a row per run with sane
# figures (AUC above chance and at most the Bayes AUC, bytes per row, RSS).
. "$(dirname "$0")/lib.sh"
OUT="$SCRATCH/bench"
timeout 600 "$PY" "$(dirname "$0")/../scripts/bench" --workload ctr --quick --no-torch \
  --bin "$BIN" --out "$OUT" >"$SCRATCH/bench.log" 2>&1 ||
  { fail "bench failed: $(tail -8 "$SCRATCH/bench.log")"; finish; }
"$PY" - "$OUT/ctr.json" <<'PY' || fail "ctr.json check"
import json, sys
r = json.load(open(sys.argv[1]))
bayes = r["bayes_auc"]
assert 0.6 < bayes < 1.0, bayes
assert r["reader"]["lines_per_s"] > 100000, r["reader"]
runs = {x["name"]: x for x in r["results"]}
wd = runs["pstrain Wide&Deep ctr:16:256,128"]
lr = runs["pstrain LR"]
for x in (wd, lr):
    assert 0.6 < x["auc"] <= bayes + 0.01 and x["examples_per_s"] > 1000 and x["rss_mib"] > 1, x
    assert x["rows"] > 1000 and 4 < x["bytes_per_row"] < 1000, x
print(f"Bayes {bayes:.4f}, Wide&Deep {wd['auc']:.4f} at {wd['examples_per_s']:.0f}/s, "
      f"LR {lr['auc']:.4f}")
PY
grep -q "| pstrain Wide&Deep" "$OUT/ctr.md" || fail "no Markdown table"
finish
