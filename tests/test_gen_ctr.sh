#!/usr/bin/env bash
# gen_ctr (scripts/gen-ctr): the same seed gives the same bytes, another seed
# others; every line is Criteo's format; about 25% positives; the printed Bayes
# AUC matches numpy's AUC of the written probabilities; ids per field grow with
# --scale; bad flags exit non-zero with a reason and write nothing.
. "$(dirname "$0")/lib.sh"
G="$BIN/gen_ctr"
[ -x "$G" ] || { echo "FAIL: no $G" >&2; exit 1; }
small=(--train-rows 20000 --test-rows 20000)

"$G" --help | grep -qF -- "--train-rows" || fail "--help lacks --train-rows"

"$G" --out "$SCRATCH/a" "${small[@]}" --seed 5 --write-probs >"$SCRATCH/a.json" || fail "run a failed"
"$G" --out "$SCRATCH/b" "${small[@]}" --seed 5 >"$SCRATCH/b.json" || fail "run b failed"
"$G" --out "$SCRATCH/c" "${small[@]}" --seed 6 >"$SCRATCH/c.json" || fail "run c failed"
for f in train.tsv test.tsv; do
  cmp -s "$SCRATCH/a/$f" "$SCRATCH/b/$f" || fail "$f differs between two runs with seed 5"
  cmp -s "$SCRATCH/a/$f" "$SCRATCH/c/$f" && fail "$f is the same for seeds 5 and 6"
done
"$G" --out "$SCRATCH/z" "${small[@]}" --seed 5 --gzip >/dev/null || fail "gzip run failed"
for f in train test; do
  gzip -dc "$SCRATCH/z/$f.tsv.gz" | cmp -s - "$SCRATCH/a/$f.tsv" || fail "$f.tsv.gz does not hold $f.tsv"
done
ls -A "$SCRATCH/a" | grep -q '\.tmp' && fail "temp files left in the output folder"

# Format, labels, positive fraction, Bayes AUC against numpy.
"$PY" - "$SCRATCH/a" "$SCRATCH/a.json" <<'PY' || fail "format or statistics check failed"
import json, re, sys
import numpy as np
d, summary = sys.argv[1], json.load(open(sys.argv[2]))
hexre, intre = re.compile(r"^([0-9a-f]{8})?$"), re.compile(r"^(-?[0-9]+)?$")
bad = []
for name in ("train", "test"):
    labels = []
    for n, line in enumerate(open(f"{d}/{name}.tsv"), 1):
        f = line.rstrip("\n").split("\t")
        if len(f) != 40 or f[0] not in ("0", "1") or not all(intre.match(x) for x in f[1:14]) \
                or not all(hexre.match(x) for x in f[14:]):
            bad.append(f"{name}:{n}: {line[:80]!r}")
        labels.append(f[0] == "1")
    frac = np.mean(labels)
    if not 0.2 <= frac <= 0.3:
        bad.append(f"{name}: positive fraction {frac:.3f} outside [0.2, 0.3]")
    if len(labels) != summary[f"{name}_rows"]:
        bad.append(f"{name}: {len(labels)} rows, summary says {summary[name + '_rows']}")
y = np.array([line.startswith("1") for line in open(f"{d}/test.tsv")], dtype=float)
p = np.loadtxt(f"{d}/test.probs")
order = np.argsort(p, kind="mergesort")
s, yy = p[order], y[order]
_, first, counts = np.unique(s, return_index=True, return_counts=True)
ranks = np.repeat(first + (counts + 1) / 2.0, counts)
pos = yy.sum()
auc = (ranks[yy == 1].sum() - pos * (pos + 1) / 2) / (pos * (len(yy) - pos))
if abs(auc - summary["bayes_auc"]) > 0.005:
    bad.append(f"numpy AUC {auc:.5f} vs printed bayes_auc {summary['bayes_auc']}")
ll = -np.mean(y * np.log(p) + (1 - y) * np.log1p(-p))
if abs(ll - summary["bayes_logloss"]) > 0.005:
    bad.append(f"numpy logloss {ll:.5f} vs printed {summary['bayes_logloss']}")
if not 0.75 <= auc <= 0.9:
    bad.append(f"Bayes AUC {auc:.4f} outside a Criteo-like range")
for b in bad[:10]:
    print(b, file=sys.stderr)
sys.exit(1 if bad else 0)
PY

# Distinct ids per field scale with --scale (C3, the largest field).
"$G" --out "$SCRATCH/s" "${small[@]}" --scale 0.001 >"$SCRATCH/s.json" || fail "--scale 0.001 failed"
"$PY" - "$SCRATCH/s.json" "$SCRATCH/a.json" <<'PY' || fail "ids per field do not scale with --scale"
import json, sys
lo, hi = (json.load(open(p)) for p in sys.argv[1:3])
assert lo["ids_per_field"][2] * 5 < hi["ids_per_field"][2], (lo["ids_per_field"], hi["ids_per_field"])
assert lo["distinct_ids_train"][2] < hi["distinct_ids_train"][2], (lo["distinct_ids_train"], hi["distinct_ids_train"])
assert all(n >= 3 for n in lo["ids_per_field"]), lo["ids_per_field"]
PY

# Bad flags: non-zero exit, a reason, nothing written.
bad_run() {
  local message=$1
  shift
  local status=0
  "$G" "$@" >"$SCRATCH/stdout" 2>"$SCRATCH/stderr" || status=$?
  [ "$status" -ne 0 ] || fail "'$*' exited 0"
  grep -qF -- "$message" "$SCRATCH/stderr" || fail "'$*' stderr lacks '$message': $(cat "$SCRATCH/stderr")"
}
bad_run "--scale: '-1' is not a number" --out "$SCRATCH/n1" --scale -1
bad_run "--train-rows: 'x' is not" --out "$SCRATCH/n2" --train-rows x
bad_run "--train-rows: 0 is outside" --out "$SCRATCH/n3" --train-rows 0
bad_run "unknown option '--bogus'" --out "$SCRATCH/n4" --bogus
bad_run "--out DIR is required" --train-rows 10
for n in n1 n2 n3 n4; do [ -e "$SCRATCH/$n" ] && fail "a bad flag created $SCRATCH/$n"; done
mkdir "$SCRATCH/ro" && chmod 555 "$SCRATCH/ro"
if [ "$(id -u)" -ne 0 ]; then
  bad_run "cannot write to output folder" --out "$SCRATCH/ro" "${small[@]}"
fi
bad_run "cannot create output folder" --out /proc/gen-ctr-test "${small[@]}"
bad_run "cannot create output folder" --out "$SCRATCH/missing/parent" "${small[@]}"
[ -z "$(ls -A "$SCRATCH/ro")" ] || fail "files left in the read-only folder"

[ "$failures" -eq 0 ] || exit 1
echo "test_gen_ctr: all checks passed"
