#!/usr/bin/env bash
# scripts/plot: a PNG (magic bytes, nonzero size) from a real MLP run's
# --metrics, from CTR rows (AUC, a repeat row), from both side by side; the
# text rendering; clear errors (exit 2, the file named) for a missing file,
# an empty file, a row without the fields and a line that is not JSON.
. "$(dirname "$0")/lib.sh"
require_data
PLOT="$(dirname "$0")/../scripts/plot"
command -v gnuplot >/dev/null || { echo "SKIP: no gnuplot (scripts/setup installs gnuplot-nox)" >&2; exit 77; }

"$BIN/trainer" --mode local --epochs 2 --train-samples 2000 --test-samples 500 --progress-interval 0 \
  --metrics "$SCRATCH/mlp.jsonl" >"$SCRATCH/mlp.log" 2>&1 || fail "MLP run: $(tail -2 "$SCRATCH/mlp.log")"
# CTR rows as ctr_train.c writes them (mid-epoch --eval-every rows, a repeat).
cat >"$SCRATCH/ctr.jsonl" <<'ROWS'
{"epoch":1,"step":50,"train_logloss":0.520000,"auc":0.700000,"logloss":0.510000,"examples_per_s":9000.0,"wall_s":1.000,"mode":"pserver","model":"ctr:8","trainers":2}
{"epoch":1,"step":100,"train_logloss":0.500000,"auc":0.720000,"logloss":0.500000,"examples_per_s":9000.0,"wall_s":2.000,"mode":"pserver","model":"ctr:8","trainers":2}
{"epoch":1,"step":100,"train_logloss":0.501000,"auc":0.721000,"logloss":0.500000,"examples_per_s":9000.0,"wall_s":3.500,"mode":"pserver","model":"ctr:8","trainers":2,"repeat":true}
{"epoch":2,"step":200,"train_logloss":0.480000,"auc":0.740000,"logloss":0.490000,"examples_per_s":9000.0,"wall_s":4.500,"mode":"pserver","model":"ctr:8","trainers":2}
ROWS

png() { # png FILE: PNG magic bytes and a nonzero size
  [ -s "$1" ] && [ "$(head -c 8 "$1" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ]
}
for set in mlp ctr both; do
  files=("$SCRATCH/$set.jsonl")
  [ "$set" = both ] && files=("$SCRATCH/mlp.jsonl" "$SCRATCH/ctr.jsonl")
  "$PLOT" "${files[@]}" --out "$SCRATCH/$set.png" 2>"$SCRATCH/$set.err" ||
    fail "$set: plot failed: $(cat "$SCRATCH/$set.err")"
  png "$SCRATCH/$set.png" || fail "$set: no PNG written"
done
"$PLOT" "$SCRATCH/mlp.jsonl" 2>/dev/null && png "$SCRATCH/mlp.png" || fail "default --out: no mlp.png"
"$PLOT" "$SCRATCH/mlp.jsonl" "$SCRATCH/ctr.jsonl" --text >"$SCRATCH/text" 2>&1 || fail "--text failed"
grep -q "wall time (s)" "$SCRATCH/text" && grep -q "mlp.jsonl" "$SCRATCH/text" &&
  grep -q "ctr.jsonl" "$SCRATCH/text" || fail "--text: no axes or legend: $(head -5 "$SCRATCH/text")"

: >"$SCRATCH/empty.jsonl"
echo '{"epoch":1,"test_accuracy":0.8}' >"$SCRATCH/nofields.jsonl"
echo 'not json' >"$SCRATCH/bad.jsonl"
check_error() { # check_error FILE PATTERN
  local status=0
  "$PLOT" "$1" --out "$SCRATCH/err.png" 2>"$SCRATCH/err" || status=$?
  [ "$status" -eq 2 ] || fail "$(basename "$1"): exit $status, expected 2"
  grep -q "$2" "$SCRATCH/err" || fail "$(basename "$1"): message '$(cat "$SCRATCH/err")' lacks '$2'"
}
check_error "$SCRATCH/missing.jsonl" "cannot read .*missing.jsonl: No such file"
check_error "$SCRATCH/empty.jsonl" "empty.jsonl is empty"
check_error "$SCRATCH/nofields.jsonl" "nofields.jsonl:1: the row has no train_loss or train_logloss, wall_s"
check_error "$SCRATCH/bad.jsonl" "bad.jsonl:1: not a JSON row"
[ ! -e "$SCRATCH/err.png" ] || fail "a PNG was written for a bad file"
finish
