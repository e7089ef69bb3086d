#!/usr/bin/env bash
# Pserver mode for the CTR models (scripts/launch on 127.0.0.1): sync with
# 2 pservers x 2 trainers and --batch 128 trains what local mode does with
# --batch 256 (exports within 1e-5 relative, same key sets, test AUCs within
# 1e-4), for DeepFM too, with --admit-after 2 too and on 1 pserver; two sync runs give
# byte-equal exports; async trains (AUC within 0.01 of local's, above 0.6);
# the metrics row says pserver mode; a trainer whose job differs from the
# one the pservers hold is refused by name.
. "$(dirname "$0")/lib.sh"
LAUNCH="$(dirname "$0")/../scripts/launch"
D="$SCRATCH/data"
"$BIN/gen_ctr" --out "$D" --train-rows 20000 --test-rows 4000 --scale 0.0005 --seed 5 \
  >"$SCRATCH/gen.json" || { fail "gen_ctr failed"; finish; }
COMMON=(--data "$D/train.tsv" --test-data "$D/test.tsv" --model ctr:8:32,16 --epochs 2 --seed 3
        --threads 1 --progress-interval 0)
metric() { "$PY" -c 'import json,sys; print(json.loads(open(sys.argv[1]).readlines()[-1])[sys.argv[2]])' "$1" "$2"; }
pserver() { # NAME LAUNCH_FLAGS -- TRAINER_FLAGS...: a run exporting NAME.safetensors
  local name=$1 flags=()
  shift
  while [ "$1" != "--" ]; do flags+=("$1"); shift; done
  shift
  timeout 120 "$LAUNCH" --bin "$BIN" "${flags[@]}" --trainers 2 --quiet --log-dir "$SCRATCH/$name" \
    -- "${COMMON[@]}" --batch 128 --export "$SCRATCH/$name.safetensors" \
    --metrics "$SCRATCH/$name.jsonl" "$@" >"$SCRATCH/$name.log" 2>&1 ||
    fail "pserver run $name failed: $(tail -3 "$SCRATCH/$name.log"; grep -h ERROR "$SCRATCH/$name"/*.log | head -2)"
}
local_run() { # NAME FLAGS...: local mode with the global batch
  local name=$1
  shift
  "$BIN/trainer" "${COMMON[@]}" --batch 256 --export "$SCRATCH/$name.safetensors" \
    --metrics "$SCRATCH/$name.jsonl" "$@" 2>"$SCRATCH/$name.log" ||
    fail "local run $name failed: $(tail -3 "$SCRATCH/$name.log")"
}
compare() { # A B: exports within 1e-5 relative, the same key sets
  "$PY" "$(dirname "$0")/safetensors_read.py" compare-ctr "$1" "$2" 1e-5
}
auc_near() { # A B TOLERANCE WHAT
  local a b
  a=$(metric "$SCRATCH/$1.jsonl" auc) b=$(metric "$SCRATCH/$2.jsonl" auc)
  echo "test AUC: $1 $a, $2 $b" >&2
  "$PY" -c 'import sys; a,b,t=map(float,sys.argv[1:]); sys.exit(0 if abs(a-b) <= t else 1)' "$a" "$b" "$3" ||
    fail "$4: test AUCs $a and $b differ by more than $3"
}

# 1. Sync, 2 pservers x 2 trainers x 128 = local x 256; deterministic.
local_run local
pserver sync --pservers 2 --
pserver again --pservers 2 --
compare "$SCRATCH/sync.safetensors" "$SCRATCH/local.safetensors" || fail "sync export vs local export"
auc_near sync local 1e-4 "sync vs local"
cmp -s "$SCRATCH/sync.safetensors" "$SCRATCH/again.safetensors" || fail "two sync runs differ"
grep -q '"mode":"pserver".*"trainers":2.*"update":"sync".*"bytes_per_step":[1-9]' "$SCRATCH/sync.jsonl" ||
  fail "metrics row: $(tail -1 "$SCRATCH/sync.jsonl")"
grep -q "bytes sent + received per step" "$SCRATCH/sync/trainer1.log" || fail "no bytes in trainer 1's log"
# 1b. DeepFM, the same equivalence: a model is a file, the replicas do not know which.
local_run local-deepfm --model deepfm:8:32,16
pserver sync-deepfm --pservers 2 -- --model deepfm:8:32,16 --timeline "$SCRATCH/fm-tl.json" \
  --timeline-steps 3:7
for tl in "$SCRATCH/fm-tl.json" "$SCRATCH/fm-tl.json.rank1"; do
  "$PY" "$(dirname "$0")/ctr_timeline_check.py" "$tl" 3 7 pull,forward,backward,push ||
    fail "DeepFM pserver timeline $tl"
done
compare "$SCRATCH/sync-deepfm.safetensors" "$SCRATCH/local-deepfm.safetensors" ||
  fail "DeepFM: sync export vs local export"
auc_near sync-deepfm local-deepfm 1e-4 "DeepFM: sync vs local"

# 2. Admission on the pservers' rows; one pserver.
local_run local-admit --admit-after 2
if [ -n "${PSTRAIN_TEST_TIER:-}" ]; then # the two tables' admission filters (4 MiB each) on top
  saved=$PSTRAIN_PSERVER_ARGS
  PSTRAIN_PSERVER_ARGS="--table-dir $SCRATCH/tier --table-memory-mb $("$PY" -c "print($PSTRAIN_TEST_TIER + 8)")"
fi
pserver admit --pservers 2 -- --admit-after 2
[ -n "${PSTRAIN_TEST_TIER:-}" ] && PSTRAIN_PSERVER_ARGS=$saved
compare "$SCRATCH/admit.safetensors" "$SCRATCH/local-admit.safetensors" || fail "--admit-after 2: sync vs local"
pserver one --pservers 1 --
compare "$SCRATCH/one.safetensors" "$SCRATCH/local.safetensors" || fail "1 pserver vs local"

# 3. Async trains.
pserver async --pservers 2 --mode async --
auc_near async local 0.01 "async vs local"
"$PY" -c 'import sys; sys.exit(0 if float(sys.argv[1]) > 0.6 else 1)' "$(metric "$SCRATCH/async.jsonl" auc)" ||
  fail "async AUC $(metric "$SCRATCH/async.jsonl" auc) is not clearly above 0.5"

# 4. A trainer whose job differs from the pservers' is refused by name.
start_pservers ref 1 --trainers 2
start t0 "$BIN/trainer" --mode pserver --pservers "$PS" --trainers 2 --id 0 "${COMMON[@]}" --batch 128
T0=$LAST_PID
wait_log "$SCRATCH/t0.log" "registered with" "$T0" || fail "trainer 0 did not register: $(tail -3 "$SCRATCH/t0.log")"
expect_exit 2 "differs" -- timeout 60 "$BIN/trainer" --mode pserver --pservers "$PS" --trainers 2 \
  --id 1 "${COMMON[@]}" --batch 128 --sparse-lr 0.2
grep -q "sparse" "$SCRATCH/stderr" || fail "the refusal does not name the sparse settings: $(tail -c 300 "$SCRATCH/stderr")"
{ kill -9 "$T0" "${SPIDS[@]}"; wait "$T0" "${SPIDS[@]}"; } 2>/dev/null
finish
