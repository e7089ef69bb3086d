#!/usr/bin/env bash
# scripts/bench --hosts: on test hosts at 1 Gbit/s, a short run of every mode
# with 1 and 2 trainers writes its table, and the bytes each host moved per
# step are within 10% of the theory (pserver mode: the model each way per
# trainer, trainers x model / pservers per pserver; ring: 2(n-1)/n x model),
# the pserver rows once more with --wire-dtype bf16 at half those bytes;
# each row's link floor is the busiest host's theory bytes over the rate.
# Then --model lenet briefly (2 trainers, 1 and 2 pservers and collective):
# its parameter count (20,350) comes from the network's text.
source "$(dirname "$0")/lib.sh"
require_data
[ "$(id -u)" -eq 0 ] && ip netns list >/dev/null 2>&1 || { echo "SKIP: test hosts need root" >&2; exit 77; }
OUT="$SCRATCH/bench"
status=0
timeout 600 "$PY" "$(dirname "$0")/../scripts/bench" --hosts --gbit 1 --steps 20 --trainers 1,2 \
  --wire-dtype f32,bf16 --bin "$BIN" --out "$OUT" >"$SCRATCH/bench.log" 2>&1 || status=$?
if [ "$status" -ne 0 ]; then
  grep -q "cannot make network namespaces" "$SCRATCH/bench.log" && { echo "SKIP: $(tail -1 "$SCRATCH/bench.log")" >&2; exit 77; }
  fail "bench --hosts exited $status: $(tail -8 "$SCRATCH/bench.log")"
  finish
fi
# The checks every table gets (imported): argv[1] the table, argv[2] the least samples/s.
cat >"$SCRATCH/rows.py" <<'PY'
import re, sys
rows = [l for l in open(sys.argv[1]) if l.startswith("| ") and not l.startswith("| mode")]
seen, cells = set(), {}
for r in rows:
    c = [x.strip() for x in r.split("|")[1:-1]]
    mode, trainers, gbit, rate = c[0], int(c[1]), float(c[2]), float(c[3].replace(",", ""))
    seen.add((mode, trainers))
    cells[(mode, trainers)] = c
    assert rate > float(sys.argv[2]), r
    # The scaling efficiency, from the table's own rates (a bound on it would
    # fail whenever load slowed one run more than the other).
    assert float(c[4]) > 0, r
    theories = []
    for cell in c[5:7]:
        if cell == "-":
            continue
        got, theory = map(float, re.match(r"([\d.]+) \(([\d.]+)\)", cell).groups())
        assert abs(got - theory) <= 0.1 * theory + 0.02, f"{cell}: not within 10% of theory: {r}"
        theories.append(theory)
    # The floor: the busiest host's MB each way over gbit x 125 MB/s.
    floor_ms = float(c[7])
    assert abs(floor_ms - max(theories) * 8 / gbit) <= 0.06 + 0.01 * floor_ms, f"floor: {r}"
    if floor_ms > 0:
        ratio = rate / float(c[8].replace(",", ""))
        assert abs(ratio - float(c[9])) <= 0.01 + 0.01 * ratio, f"measured/floor: {r}"
# Efficiency: rate / (trainers x the per-trainer rate of the mode's fewest trainers at that speed).
for (mode, trainers), c in cells.items():
    gbit = c[2]
    base_t = min(t for (m, t), b in cells.items() if m == mode and b[2] == gbit)
    base_rate = float(cells[(mode, base_t)][3].replace(",", "")) / base_t
    want = float(c[3].replace(",", "")) / (trainers * base_rate)
    assert abs(float(c[4]) - want) <= 0.006 + 0.01 * want, f"scaling efficiency {c[4]}, not {want:.3f}: {c}"
PY
"$PY" - "$SCRATCH" "$OUT/hosts-table.md" <<'PY' || fail "table check"
import re, sys
sys.path.insert(0, sys.argv[1])
sys.argv[1:] = [sys.argv[2], "100"]
from rows import rows, seen, cells
want = {(m, t) for m in ("pserver sync, 1 pserver", "pserver sync, 2 pservers", "collective (MPI, TCP)",
                         "pserver sync, 1 pserver, bf16", "pserver sync, 2 pservers, bf16")
        for t in (1, 2)}
assert want <= seen, f"missing rows: {want - seen}"
# bf16's theory (which the bytes counted met) is half of f32's.
theory = lambda mode: float(re.search(r"\(([\d.]+)\)", cells[(mode, 2)][5]).group(1))
f32, bf16 = theory("pserver sync, 2 pservers"), theory("pserver sync, 2 pservers, bf16")
assert abs(bf16 - f32 / 2) <= 0.01, f"bf16 theory {bf16} MB, f32 {f32} MB"
print(f"{len(rows)} rows checked")
PY

# LeNet: 20,350 float32 parameters, 0.08 MB each way per trainer.
status=0
timeout 300 "$PY" "$(dirname "$0")/../scripts/bench" --hosts --model lenet --gbit 1 --steps 10 \
  --trainers 2 --test-samples 200 --bin "$BIN" --out "$OUT/lenet" >"$SCRATCH/lenet.log" 2>&1 || status=$?
if [ "$status" -ne 0 ]; then
  fail "bench --hosts --model lenet exited $status: $(tail -8 "$SCRATCH/lenet.log")"
  finish
fi
"$PY" - "$SCRATCH" "$OUT/lenet/hosts-table.md" <<'PY' || fail "lenet table check"
import sys
sys.path.insert(0, sys.argv[1])
table = sys.argv[2]
sys.argv[1:] = [table, "10"]
from rows import rows, seen, cells
assert "lenet (20,350 parameters" in open(table).read(), "lenet's parameter count"
want = {("pserver sync, 1 pserver", 2), ("pserver sync, 2 pservers", 2), ("collective (MPI, TCP)", 2)}
assert want <= seen, f"missing rows: {want - seen}"
assert cells[("pserver sync, 1 pserver", 2)][5].endswith("(0.08)"), cells[("pserver sync, 1 pserver", 2)]
print(f"lenet: {len(rows)} rows checked")
PY
finish
