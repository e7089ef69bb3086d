#!/usr/bin/env bash
# scripts/bench --hosts: on test hosts at 1 Gbit/s, a short run of every mode
# with 1 and 2 trainers writes its table, and the bytes each host moved per
# step are within 10% of the theory (pserver mode: the model each way per
# trainer, trainers x model / pservers per pserver; ring: 2(n-1)/n x model).
source "$(dirname "$0")/lib.sh"
require_data
[ "$(id -u)" -eq 0 ] && ip netns list >/dev/null 2>&1 || { echo "SKIP: test hosts need root" >&2; exit 77; }
OUT="$SCRATCH/bench"
status=0
timeout 600 "$PY" "$(dirname "$0")/../scripts/bench" --hosts --gbit 1 --steps 20 --trainers 1,2 \
  --bin "$BIN" --out "$OUT" >"$SCRATCH/bench.log" 2>&1 || status=$?
if [ "$status" -ne 0 ]; then
  grep -q "cannot make network namespaces" "$SCRATCH/bench.log" && { echo "SKIP: $(tail -1 "$SCRATCH/bench.log")" >&2; exit 77; }
  fail "bench --hosts exited $status: $(tail -8 "$SCRATCH/bench.log")"
  finish
fi
"$PY" - "$OUT/hosts-table.md" <<'PY' || fail "table check"
import re, sys
rows = [l for l in open(sys.argv[1]) if l.startswith("| ") and not l.startswith("| mode")]
seen = set()
for r in rows:
    cells = [c.strip() for c in r.split("|")[1:-1]]
    mode, trainers = cells[0], int(cells[1])
    seen.add((mode, trainers))
    assert float(cells[2].replace(",", "")) > 100, r
    assert 0 < float(cells[3]) <= 1.5, r
    for cell in cells[4:6]:
        if cell == "-":
            continue
        got, theory = map(float, re.match(r"([\d.]+) \(([\d.]+)\)", cell).groups())
        assert abs(got - theory) <= 0.1 * theory + 0.02, f"{cell}: not within 10% of theory: {r}"
want = {(m, t) for m in ("pserver sync, 1 pserver", "pserver sync, 2 pservers", "collective (MPI, TCP)")
        for t in (1, 2)}
assert want <= seen, f"missing rows: {want - seen}"
print(f"{len(rows)} rows checked")
PY
finish
