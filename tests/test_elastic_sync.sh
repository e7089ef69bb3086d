#!/usr/bin/env bash
# Elastic sync jobs (--update sync --elastic MIN:MAX --shard-steps): trainers
# join the steps at a step boundary (pserver 0 names each step's members,
# logged on every pserver) and leave them (no data for now, done, killed:
# not waited for past their lease). An MLP job of 2 trainers grows to 4 and
# shrinks to 1 (three SIGKILLed, one in the middle of a push) with no
# pserver restarted, and a CTR job 2 -> 3 -> 1 likewise: each epoch's
# examples are counted once by pserver 0 and by the trainers' rows plus
# the gone processes' counts; the MLP's accuracy is within 0.01 of a fixed
# 2-trainer sync job's (bench-elastic measures it closer, over runs), the
# CTR model's AUC within 0.005.
. "$(dirname "$0")/lib.sh"
require_data
metric() { "$PY" -c 'import json,sys; print(json.loads(open(sys.argv[1]).readlines()[-1])[sys.argv[2]])' "$1" "$2"; }

# 1. 2 -> 4 -> 1 trainers, MLP, 20000 examples x 2 epochs, against a fixed 2-trainer job.
COMMON=(--mode pserver --update sync --train-samples 20000 --test-samples 2000 --epochs 2 --seed 4
        --progress-interval 0.2)
fixed=$(fixed_two test_accuracy fx "${COMMON[@]}")

start_pservers el 2 --trainers 4 --trainer-lease 6
JOB=("${COMMON[@]}" --pservers "$PS" --elastic 1:4 --shard-steps 4 --slowdown 8
     --metrics "$SCRATCH/el.jsonl")
start el-a "$BIN/trainer" "${JOB[@]}"; a=$LAST_PID
wait_log "$SCRATCH/el-a.log" "gave this trainer id 0" "$a" 60 || fail "the first trainer got no id 0"
start el-b "$BIN/trainer" "${JOB[@]}"; b=$LAST_PID
for who in a b; do
  wait_log "$SCRATCH/el-$who.log" "epoch 1/2 step" "${!who}" 60 || fail "trainer $who did not train"
done
# Two join; c dies in its 12th push (after pserver 0 answered it), d and b are killed.
PSTRAIN_TEST_KILL_MID_PUSH=12 start el-c "$BIN/trainer" "${JOB[@]}"; c=$LAST_PID
start el-d "$BIN/trainer" "${JOB[@]}"; d=$LAST_PID
wait_log "$SCRATCH/el-d.log" "epoch 1/2 step" "$d" 60 || fail "the fourth trainer did not train"
wait_log "$SCRATCH/el-s1.log" "members 0,1,2,3 " "${SPIDS[1]}" 60 ||
  fail "pserver 1 never had four members in a step: $(grep -F members "$SCRATCH/el-s1.log" | tail -3)"
status=0; wait_for "$c" 60 || status=$?
[ "$status" -eq 137 ] || fail "the trainer killed mid-push exited $status"
kill -9 "$d" "$b"
wait_for "$d" 10; wait_for "$b" 10
status=0; wait_for "$a" 240 || status=$?
[ "$status" -eq 0 ] || fail "the last trainer exited $status: $(tail -3 "$SCRATCH/el-a.log")"
for pid in "${SPIDS[@]}"; do
  status=0; wait_for "$pid" 60 || status=$?
  [ "$status" -eq 0 ] || fail "pserver $pid exited $status"
done
shards_counted sync-2-4-1 "$SCRATCH/el-s0.log" 20000 2 "$SCRATCH/el.jsonl"*
for s in 0 1; do
  grep -qE "step [0-9]+: trainer [123] leaves \(silent for [0-9.]+ s after the step.s first push" "$SCRATCH/el-s$s.log" ||
    fail "pserver $s did not stop waiting for a killed trainer"
  grep -qE "step [0-9]+: members 0 \(" "$SCRATCH/el-s$s.log" ||
    fail "pserver $s never stepped with trainer 0 alone"
done
acc=$(metric "$SCRATCH/el.jsonl" test_accuracy)
echo "sync 2-4-1: test accuracy $acc; fixed 2 trainers: $fixed"
within "$acc" "$fixed" 0.01 || fail "sync 2-4-1: test accuracy $acc, the fixed job's $fixed"

# 2. A CTR model (60,000 rows), 2 -> 3 -> 1: a joiner dies in its 10th push,
# another is killed.
D="$SCRATCH/data"
"$BIN/gen_ctr" --out "$D" --train-rows 60000 --test-rows 4000 --scale 0.0005 --seed 5 \
  >"$SCRATCH/gen.json" || fail "gen_ctr failed"
CTR_COMMON=(--mode pserver --update sync --data "$D/train.tsv" --test-data "$D/test.tsv"
            --model ctr:8:32,16 --batch 128 --epochs 2 --seed 3 --threads 1 --progress-interval 0.2)
fixed_auc=$(fixed_two auc ctr-fx "${CTR_COMMON[@]}")
start_pservers ctr 2 --trainers 3 --trainer-lease 6
CTR=("${CTR_COMMON[@]}" --pservers "$PS" --elastic 1:3 --shard-steps 4 --slowdown 30
     --metrics "$SCRATCH/ctr.jsonl")
start ctr-a "$BIN/trainer" "${CTR[@]}"; a=$LAST_PID
wait_log "$SCRATCH/ctr-a.log" "gave this trainer id 0" "$a" 60 || fail "ctr: the first trainer got no id 0"
start ctr-b "$BIN/trainer" "${CTR[@]}"; b=$LAST_PID
wait_log "$SCRATCH/ctr-b.log" "epoch 1/2 step" "$b" 60 || fail "ctr: the second trainer did not train"
PSTRAIN_TEST_KILL_MID_PUSH=10 start ctr-c "$BIN/trainer" "${CTR[@]}"; c=$LAST_PID
status=0; wait_for "$c" 60 || status=$?
[ "$status" -eq 137 ] || fail "ctr: the joiner killed mid-push exited $status"
kill -9 "$b"
wait_for "$b" 10
status=0; wait_for "$a" 240 || status=$?
[ "$status" -eq 0 ] || fail "ctr: the last trainer exited $status: $(tail -3 "$SCRATCH/ctr-a.log")"
for pid in "${SPIDS[@]}"; do
  status=0; wait_for "$pid" 60 || status=$?
  [ "$status" -eq 0 ] || fail "ctr: pserver $pid exited $status"
done
shards_counted sync-ctr "$SCRATCH/ctr-s0.log" 60000 2 "$SCRATCH/ctr.jsonl"*
grep -qE "step [0-9]+: members 0,1,2 \(joined: 2;" "$SCRATCH/ctr-s0.log" ||
  fail "ctr: the joiner never stepped with the others"
auc=$(metric "$SCRATCH/ctr.jsonl" auc)
echo "sync ctr 2-3-1: AUC $auc; fixed 2 trainers: $fixed_auc"
within "$auc" "$fixed_auc" 0.005 || fail "ctr: test AUC $auc, the fixed job's $fixed_auc"

# 3. Refusals: a sync push in parts cannot carry its step's members.
expect_exit 2 "--overlap pushes a sync step in parts: not with --shard-steps" -- \
  "$BIN/trainer" --mode pserver --update sync --pservers 127.0.0.1:1 --elastic 1:4 --shard-steps 4 \
  --overlap
finish
