#!/usr/bin/env bash
# scripts/bench --quick runs every mode on a slice of the data and writes a
# table with a row of numbers per mode and both plots as PNG files.
. "$(dirname "$0")/lib.sh"
require_data
OUT="$SCRATCH/bench"
timeout 900 "$PY" "$(dirname "$0")/../scripts/bench" --quick --bin "$BIN" --out "$OUT" \
  >"$SCRATCH/bench.log" 2>&1 || { fail "bench failed: $(tail -8 "$SCRATCH/bench.log")"; finish; }
"$PY" - "$OUT/table.md" <<'PY' || fail "table check"
import re, sys
rows = [l for l in open(sys.argv[1]) if l.startswith("| ") and not l.startswith("| mode")]
modes = [r.split("|")[1].strip() for r in rows]
want = ["local", "pserver sync, 1 pserver", "pserver sync, 2 pservers", "pserver async, 2 pservers"]
for m in want:
    assert m in modes, f"no row for {m}: {modes}"
assert any(m.startswith("collective") for m in modes) or "no mpirun" in open(sys.argv[1]).read(), modes
for r in rows:
    cells = [c.strip() for c in r.split("|")[2:-1]]
    rate = float(re.match(r"[\d,]+", cells[1]).group(0).replace(",", ""))
    acc = float(cells[3])
    assert rate > 1000 and 0.3 < acc <= 1.0, r
print(f"{len(rows)} modes: {', '.join(modes)}")
PY
for png in accuracy throughput; do
  head -c 8 "$OUT/$png.png" 2>/dev/null | od -An -c | grep -q "P   N   G" || fail "$png.png is not a PNG"
done
finish
