#!/usr/bin/env bash
# scripts/bench --hosts: on test hosts at 1 Gbit/s, a short run of every mode
# with 1 and 2 trainers writes its table, and the bytes each host moved per
# step are within 10% of the theory (pserver mode: the model each way per
# trainer, trainers x model / pservers per pserver; ring: 2(n-1)/n x model),
# the pserver rows once more with --wire-dtype bf16 at half those bytes.
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
want = {(m, t) for m in ("pserver sync, 1 pserver", "pserver sync, 2 pservers", "collective (MPI, TCP)",
                         "pserver sync, 1 pserver, bf16", "pserver sync, 2 pservers, bf16")
        for t in (1, 2)}
assert want <= seen, f"missing rows: {want - seen}"
# bf16's theory (which the bytes counted met) is half of f32's.
cells = {(c[0], int(c[1])): c for c in ([x.strip() for x in r.split("|")[1:-1]] for r in rows)}
theory = lambda mode: float(re.search(r"\(([\d.]+)\)", cells[(mode, 2)][4]).group(1))
f32, bf16 = theory("pserver sync, 2 pservers"), theory("pserver sync, 2 pservers, bf16")
assert abs(bf16 - f32 / 2) <= 0.01, f"bf16 theory {bf16} MB, f32 {f32} MB"
print(f"{len(rows)} rows checked")
PY
finish
