#!/usr/bin/env bash
# scripts/bench --workload ctr --quick: generated data, the reader alone and
# Wide&Deep, DeepFM and LR trained locally; the table holds a row per run with sane
# figures (AUC above chance and at most the Bayes AUC, bytes per row, RSS).
# Then --workload ctr-modes --quick: every mode on one data set; sync and
# collective reach local's AUC exactly (4 decimals of 6), the pserver runs
# report bytes per step, pserver RSS and the table MiB each pserver holds
# (two pservers hold about half of one's rows each). Where the build has no
# MPI, the collective row's absence is all that is skipped. Its memory row
# (--memory-mb, root): every mode trains a small table with each process in
# a memory cgroup of its own, and the cgroups are gone afterwards.
# Then --workload ctr-tier --quick: the pserver's disk tier with its tables 4x
# and 8x its budget beside the run with every row in memory: three rows, the
# tier's hit rates strictly between 0 and 100%, rows written to disk, and the
# same test AUC as in memory (the tier trains the same bytes).
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
assert r["reader"]["lines_per_s"] > 10000, r["reader"]  # a sane figure, not a speed claim: ASan on a busy machine read 92k/s
runs = {x["name"]: x for x in r["results"]}
wd = runs["pstrain Wide&Deep ctr:16:256,128"]
fm = runs["pstrain DeepFM deepfm:16:256,128 --sparse-lr 0.01"]
lr = runs["pstrain LR"]
for x in (wd, fm, lr):
    assert 0.6 < x["auc"] <= bayes + 0.01 and x["examples_per_s"] > 1000 and x["rss_mib"] > 1, x
    assert x["rows"] > 1000 and 4 < x["bytes_per_row"] < 1000, x
print(f"Bayes {bayes:.4f}, Wide&Deep {wd['auc']:.4f} at {wd['examples_per_s']:.0f}/s, "
      f"DeepFM {fm['auc']:.4f}, LR {lr['auc']:.4f}")
PY
grep -q "| pstrain Wide&Deep" "$OUT/ctr.md" || fail "no Markdown table"

timeout 600 "$PY" "$(dirname "$0")/../scripts/bench" --workload ctr-modes --quick \
  --bin "$BIN" --out "$OUT" >"$SCRATCH/modes.log" 2>&1 ||
  { fail "bench ctr-modes failed: $(tail -8 "$SCRATCH/modes.log")"; finish; }
"$PY" - "$OUT/ctr-modes.json" <<'PY' || fail "ctr-modes.json check"
import json, sys
results = list(json.load(open(sys.argv[1]))["results"].values())[0]
runs = {x["name"]: x for x in results}
local = runs["local"]
assert 0.6 < local["auc"] < 1.0 and local["examples_per_s"] > 1000, local
for name in ("pserver sync, 1 pserver(s)", "pserver sync, 2 pserver(s)"):
    r = runs[name]
    assert abs(r["auc"] - local["auc"]) < 1e-4, (name, r["auc"], local["auc"])
for name, r in runs.items():
    if not name.startswith("pserver"):
        continue
    assert r["bytes_per_step"] > 100000 and r["examples_per_s"] > 1000, r
    assert all(x and x > 1 for x in r["pserver_rss_mib"]), r
    assert all(x > 0 for x in r["pserver_table_mib"]), r
    # Async on 78 steps depends on how the trainers interleave (0.820-0.826 quiet,
    # 0.813 once under CI load); its accuracy is gated on real data by the bench.
    assert abs(r["auc"] - local["auc"]) < 0.03, (name, r["auc"], local["auc"])
one, two = runs["pserver sync, 1 pserver(s)"], runs["pserver sync, 2 pserver(s)"]
assert sum(two["pserver_rows"]) == one["pserver_rows"][0], (one, two)
assert max(two["pserver_rows"]) < 0.6 * one["pserver_rows"][0], (one, two)
if "collective" in runs:
    assert abs(runs["collective"]["auc"] - local["auc"]) < 1e-4, runs["collective"]
    assert runs["collective"]["bytes_per_step"] > 100000, runs["collective"]
print(", ".join(f"{n}: {r['examples_per_s']:.0f}/s AUC {r['auc']:.4f}" for n, r in runs.items()))
PY
grep -q "| pserver sync, 2 pserver(s)" "$OUT/ctr-modes.md" || fail "no ctr-modes table"

# The memory row's mechanics (root, memory cgroups): each process of each
# mode in a cgroup of its own; a table this small trains in every mode (the
# limit is generous: sanitizer builds take more memory).
if [ "$(id -u)" != 0 ]; then
  echo "SKIP: the ctr-modes memory row needs root for its cgroups" >&2
else
  status=0
  timeout 600 "$PY" "$(dirname "$0")/../scripts/bench" --workload ctr-modes --memory-mb 512 \
    --memory-only --memory-rows 20000 --memory-scales 0.001 --batch 128 --bin "$BIN" \
    --out "$SCRATCH/memory" >"$SCRATCH/memory.log" 2>&1 || status=$?
  if grep -q "no memory cgroups here" "$SCRATCH/memory.log"; then
    echo "SKIP: the ctr-modes memory row: $(grep -o 'no memory cgroups here.*' "$SCRATCH/memory.log")" >&2
  elif [ "$status" != 0 ]; then
    fail "bench ctr-modes --memory-mb failed ($status): $(tail -8 "$SCRATCH/memory.log")"
  else
    "$PY" - "$SCRATCH/memory/ctr-modes-memory.json" <<'PY' || fail "ctr-modes-memory.json check"
import json, sys
runs = json.load(open(sys.argv[1]))["runs"]
assert set(runs) == {"collective", "pserver sync, 2 pservers",
                     "pserver sync, 2 pservers, disk tier"}, list(runs)
for name, rs in runs.items():
    assert len(rs) == 1 and rs[0]["trained"] and rs[0]["oom_kills"] == 0, (name, rs)
    assert rs[0]["examples_per_s"] > 100 and 0.5 < rs[0]["auc"] < 1.0, (name, rs)
print(", ".join(f"{n}: {rs[0]['examples_per_s']:.0f}/s" for n, rs in runs.items()))
PY
    grep -q "| pserver sync, 2 pservers, disk tier | 0.001 (" "$SCRATCH/memory/ctr-modes-memory.md" ||
      fail "ctr-modes-memory.md lacks the tier's row: $(cat "$SCRATCH/memory/ctr-modes-memory.md")"
    [ -z "$(ls -d /sys/fs/cgroup/memory/pstrain-bench-modes-* /sys/fs/cgroup/pstrain-bench-modes-* 2>/dev/null)" ] ||
      fail "the memory row left its cgroups behind"
  fi
fi

timeout 300 "$PY" "$(dirname "$0")/../scripts/bench" --workload ctr-tier --quick \
  --bin "$BIN" --out "$SCRATCH/tier" >"$SCRATCH/tier.log" 2>&1 ||
  { fail "bench ctr-tier failed: $(tail -8 "$SCRATCH/tier.log")"; finish; }
"$PY" - "$SCRATCH/tier/ctr-tier.json" <<'PY' || fail "ctr-tier.json check"
import json, sys
r = json.load(open(sys.argv[1]))
runs = {x["name"]: x for x in r["results"]}
assert list(runs) == ["memory", "4x", "8x"], list(runs)
memory = runs["memory"]
assert 0.6 < memory["auc"] < 1.0 and memory["examples_per_s"] > 100, memory
assert r["tables_mib"] > 1, r["tables_mib"]
for name in ("4x", "8x"):
    x = runs[name]
    assert 0 < x["hit_pct"] < 100 and x["mb_written"] > 0, x
    assert x["budget_mib"] < r["tables_mib"] / 3, x
    # The tier trains the same bytes: the exports are equal, so are the AUCs.
    assert f"{x['auc']:.4f}" == f"{memory['auc']:.4f}", (name, x["auc"], memory["auc"])
print(", ".join(f"{n}: {x['examples_per_s']:.0f}/s AUC {x['auc']:.4f}"
                + (f" hit {x['hit_pct']:.1f}%" if "hit_pct" in x else "") for n, x in runs.items()))
PY
for row in memory 4x 8x; do
  grep -q "^| $row |" "$SCRATCH/tier/ctr-tier.md" || fail "ctr-tier.md has no $row row"
done
finish
