#!/usr/bin/env bash
# Collective mode for the CTR models (2 ranks under mpirun over TCP): with
# --batch 128 it trains what local mode does with --batch 256 (exports within
# 1e-5 relative, same keys, test AUCs within 1e-4; DeepFM too), two runs give byte-equal
# exports, and rank 1's replica (--export-replicas: PATH.rank1) is
# byte-equal to rank 0's, with --admit-after 2 too; rank 0's checkpoints
# resume in local mode with the global batch. Skipped (77) where the
# build has no MPI.
. "$(dirname "$0")/lib.sh"
LAUNCH="$(dirname "$0")/../scripts/launch"
if "$BIN/trainer" --mode collective --train-samples 10 2>&1 | grep -q "this build has no MPI"; then
  echo "SKIP: this build has no MPI" >&2
  exit 77
fi
D="$SCRATCH/data"
"$BIN/gen_ctr" --out "$D" --train-rows 20000 --test-rows 4000 --scale 0.0005 --seed 5 \
  >"$SCRATCH/gen.json" || { fail "gen_ctr failed"; finish; }
COMMON=(--data "$D/train.tsv" --test-data "$D/test.tsv" --model ctr:8:32,16 --epochs 2 --seed 3
        --threads 1 --progress-interval 0)
metric() { "$PY" -c 'import json,sys; print(json.loads(open(sys.argv[1]).readlines()[-1])[sys.argv[2]])' "$1" "$2"; }
collective() { # NAME FLAGS...: a 2-rank run exporting NAME.safetensors (and .rank1)
  local name=$1
  shift
  timeout 120 "$LAUNCH" --bin "$BIN" --mode collective --trainers 2 \
    --quiet --log-dir "$SCRATCH/$name" -- "${COMMON[@]}" --batch 128 --export-replicas \
    --export "$SCRATCH/$name.safetensors" --metrics "$SCRATCH/$name.jsonl" "$@" \
    >"$SCRATCH/$name.log" 2>&1 ||
    fail "collective run $name failed: $(tail -3 "$SCRATCH/$name.log"; grep -h ERROR "$SCRATCH/$name"/*.log | head -2)"
}
same_bytes() { cmp -s "$1" "$2" || fail "$3: $1 and $2 differ"; }

# 1. Two ranks with --batch 128 = local with --batch 256.
collective coll
collective again
"$BIN/trainer" "${COMMON[@]}" --batch 256 --export "$SCRATCH/local.safetensors" \
  --metrics "$SCRATCH/local.jsonl" 2>"$SCRATCH/local.log" ||
  fail "local run failed: $(tail -3 "$SCRATCH/local.log")"
compare() { # A B: exports within 1e-5 relative, the same key sets
  "$PY" "$(dirname "$0")/safetensors_read.py" compare-ctr "$1" "$2" 1e-5
}
compare "$SCRATCH/coll.safetensors" "$SCRATCH/local.safetensors" || fail "collective export vs local export"
C=$(metric "$SCRATCH/coll.jsonl" auc); L=$(metric "$SCRATCH/local.jsonl" auc)
echo "test AUC: collective $C, local $L" >&2
"$PY" -c 'import sys; a,b=map(float,sys.argv[1:]); sys.exit(0 if abs(a-b) <= 1e-4 else 1)' "$C" "$L" ||
  fail "test AUCs differ: collective $C, local $L"
grep -q '"mode":"collective".*"trainers":2' "$SCRATCH/coll.jsonl" || fail "metrics row: $(tail -1 "$SCRATCH/coll.jsonl")"
# 1b. DeepFM, the same equivalence: the exchange does not know the model.
collective coll-deepfm --model deepfm:8:32,16
"$BIN/trainer" "${COMMON[@]}" --model deepfm:8:32,16 --batch 256 \
  --export "$SCRATCH/local-deepfm.safetensors" 2>"$SCRATCH/local-deepfm.log" ||
  fail "local DeepFM run failed: $(tail -3 "$SCRATCH/local-deepfm.log")"
compare "$SCRATCH/coll-deepfm.safetensors" "$SCRATCH/local-deepfm.safetensors" ||
  fail "DeepFM: collective export vs local export"
same_bytes "$SCRATCH/coll-deepfm.safetensors" "$SCRATCH/coll-deepfm.safetensors.rank1" \
  "DeepFM: rank 0's and rank 1's replicas"
grep -q "bytes sent + received per step" "$SCRATCH/coll/trainer1.log" || fail "no bytes in rank 1's log"

# 2. Deterministic, and every replica equal.
same_bytes "$SCRATCH/coll.safetensors" "$SCRATCH/again.safetensors" "two collective runs"
same_bytes "$SCRATCH/coll.safetensors" "$SCRATCH/coll.safetensors.rank1" "rank 0 and rank 1"

# 3. Admission: the ranks still agree.
collective admit --admit-after 2
same_bytes "$SCRATCH/admit.safetensors" "$SCRATCH/admit.safetensors.rank1" "--admit-after 2: rank 0 and rank 1"
grep -q "refused" "$SCRATCH/admit/trainer0.log" || fail "no table statistics with --admit-after"

# 4. Rank 0 checkpoints; local mode with the global batch resumes them. A
# collective --resume is refused by name (the rank exits 2; the launcher, 1).
collective ck --checkpoint-dir "$SCRATCH/ck" --checkpoint-every 100
[ -f "$SCRATCH/ck/ctr-step-000000100.safetensors" ] || fail "no checkpoint at step 100: $(ls "$SCRATCH/ck")"
"$BIN/trainer" "${COMMON[@]}" --batch 256 --checkpoint-dir "$SCRATCH/ck" --resume --resume-step 100 \
  --export "$SCRATCH/resumed.safetensors" 2>"$SCRATCH/resumed.log" ||
  fail "local resume of a collective checkpoint: $(grep ERROR "$SCRATCH/resumed.log")"
compare "$SCRATCH/resumed.safetensors" "$SCRATCH/ck.safetensors" || fail "resumed export vs collective"
expect_exit 1 "not in collective mode" -- timeout 60 "$LAUNCH" --bin "$BIN" --mode collective \
  --trainers 2 --quiet --log-dir "$SCRATCH/resume" -- "${COMMON[@]}" --batch 128 \
  --checkpoint-dir "$SCRATCH/ck" --resume
finish
