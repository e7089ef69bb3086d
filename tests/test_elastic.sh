#!/usr/bin/env bash
# Elastic async jobs (--elastic MIN:MAX with --shard-steps): trainers get
# their ids from pserver 0; an MLP job of 2 trainers grows to 4 and shrinks
# to 1 (three SIGKILLed, one of them in the middle of a push) with no
# pserver restarted, a CTR job 2 -> 3 -> 1 likewise (its AUC within 0.005
# of a fixed 2-trainer job's), and each epoch's examples are still counted
# once, by pserver 0 and by the trainers' rows plus the gone processes'
# counts; the job ends when the last trainer is
# done. Below MIN the job waits for a trainer; scripts/launch --elastic adds
# and removes trainers through its control FIFO. Bad flags are refused.
. "$(dirname "$0")/lib.sh"
require_data
metric() { "$PY" -c 'import json,sys; print(json.loads(open(sys.argv[1]).readlines()[-1])[sys.argv[2]])' "$1" "$2"; }

# 1. 2 -> 4 -> 1 trainers, MLP, 20000 examples x 2 epochs.
start_pservers el 2 --trainers 4 --trainer-lease 10
JOB=(--mode pserver --update async --pservers "$PS" --elastic 1:4 --shard-steps 4
     --train-samples 20000 --test-samples 2000 --epochs 2 --seed 4 --slowdown 8
     --progress-interval 0.2 --metrics "$SCRATCH/el.jsonl")
start el-a "$BIN/trainer" "${JOB[@]}"; a=$LAST_PID
# a takes id 0 (it evaluates and survives), then b comes.
wait_log "$SCRATCH/el-a.log" "gave this trainer id 0" "$a" 60 || fail "the first trainer got no id 0"
start el-b "$BIN/trainer" "${JOB[@]}"; b=$LAST_PID
for who in a b; do
  wait_log "$SCRATCH/el-$who.log" "epoch 1/2 step" "${!who}" 60 || fail "trainer $who did not train"
done
# Two join; c dies in its 12th push (after pserver 0 answered it), d and b are killed.
PSTRAIN_TEST_KILL_MID_PUSH=12 start el-c "$BIN/trainer" "${JOB[@]}"; c=$LAST_PID
start el-d "$BIN/trainer" "${JOB[@]}"; d=$LAST_PID
wait_log "$SCRATCH/el-d.log" "epoch 1/2 step" "$d" 60 || fail "the fourth trainer did not train"
grep -q "trainer id 3 given to a joining trainer" "$SCRATCH/el-s0.log" ||
  fail "pserver 0 did not give out id 3: $(grep -F "given to" "$SCRATCH/el-s0.log")"
status=0; wait_for "$c" 60 || status=$?
[ "$status" -eq 137 ] || fail "the trainer killed mid-push exited $status"
kill -9 "$d" "$b"
wait_for "$d" 10; wait_for "$b" 10
status=0; wait_for "$a" 180 || status=$?
[ "$status" -eq 0 ] || fail "the last trainer exited $status: $(tail -3 "$SCRATCH/el-a.log")"
for pid in "${SPIDS[@]}"; do
  status=0; wait_for "$pid" 60 || status=$?
  [ "$status" -eq 0 ] || fail "pserver $pid exited $status"
done
grep -q "every trainer that joined is done or gone" "$SCRATCH/el-s1.log" ||
  fail "pserver 1 did not end the job: $(tail -2 "$SCRATCH/el-s1.log")"
shards_counted "2-4-1" "$SCRATCH/el-s0.log" 20000 2 "$SCRATCH/el.jsonl"*
grep -qE "goes back to the queue at example [0-9]+ of 256" "$SCRATCH/el-s0.log" ||
  fail "no shard of a killed trainer went back to the queue"
acc=$(metric "$SCRATCH/el.jsonl" test_accuracy)
"$PY" -c 'import sys; sys.exit(0 if float(sys.argv[1]) > 0.75 else 1)' "$acc" || fail "test accuracy $acc"

# 2. A CTR model (60,000 rows), 2 -> 3 -> 1: a joiner dies in its 10th push,
# another is killed.
D="$SCRATCH/data"
"$BIN/gen_ctr" --out "$D" --train-rows 60000 --test-rows 4000 --scale 0.0005 --seed 5 \
  >"$SCRATCH/gen.json" || fail "gen_ctr failed"
CTR_COMMON=(--mode pserver --update async --data "$D/train.tsv" --test-data "$D/test.tsv"
            --model ctr:8:32,16 --batch 128 --epochs 2 --seed 3 --threads 1 --progress-interval 0.2)
fixed_auc=$(fixed_two auc ctr-fx "${CTR_COMMON[@]}")
start_pservers ctr 2 --trainers 3 --trainer-lease 10
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
status=0; wait_for "$a" 180 || status=$?
[ "$status" -eq 0 ] || fail "ctr: the last trainer exited $status: $(tail -3 "$SCRATCH/ctr-a.log")"
for pid in "${SPIDS[@]}"; do
  status=0; wait_for "$pid" 60 || status=$?
  [ "$status" -eq 0 ] || fail "ctr: pserver $pid exited $status"
done
shards_counted ctr "$SCRATCH/ctr-s0.log" 60000 2 "$SCRATCH/ctr.jsonl"*
grep -qE "trainer 2 sent nothing for its lease .* goes back to the queue at example 128 of 512" \
  "$SCRATCH/ctr-s0.log" || fail "ctr: the joiner's shard did not go back from its push's batch"
auc=$(metric "$SCRATCH/ctr.jsonl" auc)
echo "async ctr 2-3-1: AUC $auc; fixed 2 trainers: $fixed_auc"
within "$auc" "$fixed_auc" 0.005 || fail "ctr: test AUC $auc, the fixed job's $fixed_auc"

# 3. MIN 2: one trainer waits for a second.
start_pservers min 1 --trainers 2
MIN=(--mode pserver --update async --pservers "$PS" --elastic 2:2 --shard-steps 4
     --train-samples 2000 --test-samples 500 --epochs 1 --progress-interval 0)
start min-a "$BIN/trainer" "${MIN[@]}"; a=$LAST_PID
wait_log "$SCRATCH/min-s0.log" "fewer than the job's minimum 2: waiting" "${SPIDS[0]}" 60 ||
  fail "min: pserver 0 did not wait for a second trainer"
start min-b "$BIN/trainer" "${MIN[@]}"; b=$LAST_PID
for pid in "$a" "$b" "${SPIDS[0]}"; do
  status=0; wait_for "$pid" 60 || status=$?
  [ "$status" -eq 0 ] || fail "min: process $pid exited $status"
done
grep -qF "shards: epoch 1 trained: 2000 examples of 2000 " "$SCRATCH/min-s0.log" || fail "min: epoch not trained"

# 4. scripts/launch --elastic: 1 trainer, 2 added and 1 removed through the
# control FIFO; the job ends when the others finish.
CTL="$SCRATCH/control"
start launch "$PY" "$(dirname "$0")/../scripts/launch" --bin "$BIN" --mode async --elastic 1:3 \
  --control "$CTL" --log-dir "$SCRATCH/l" --quiet --pserver-args "--trainer-lease 10" -- \
  --shard-steps 4 --train-samples 20000 --test-samples 1000 --epochs 2 --slowdown 20 \
  --progress-interval 0.2 --metrics "$SCRATCH/l.jsonl"; l=$LAST_PID
wait_log "$SCRATCH/launch.log" "trainer\(s\), async update" "$l" 60 || fail "launch: no start"
wait_log "$SCRATCH/l/trainer0.log" "epoch 1/2 step" "$l" 60 || fail "launch: trainer 0 did not train"
echo "add 2" >"$CTL"
wait_log "$SCRATCH/l/trainer2.log" "epoch [12]/2 step" "$l" 60 || fail "launch: the added trainers did not train"
echo remove >"$CTL"
wait_log "$SCRATCH/launch.log" "trainer 2 stopped" "$l" 30 || fail "launch: no trainer removed"
status=0; wait_for "$l" 240 || status=$?
[ "$status" -eq 0 ] || fail "launch exited $status: $(tail -3 "$SCRATCH/launch.log")"
grep -q "trainer id 2 given to a joining trainer" "$SCRATCH/l/pserver0.log" || fail "launch: no third id"
shards_counted launch "$SCRATCH/l/pserver0.log" 20000 2 "$SCRATCH/l.jsonl"*

# 5. Refusals.
expect_exit 2 "--id with --elastic: pserver 0 gives each joining trainer its id" -- \
  "$BIN/trainer" --mode pserver --update async --pservers 127.0.0.1:1 --elastic 1:4 --shard-steps 4 --id 1
expect_exit 2 "--elastic needs --shard-steps" -- \
  "$BIN/trainer" --mode pserver --update async --pservers 127.0.0.1:1 --elastic 1:4
expect_exit 2 "--elastic '3:2' is not MIN:MAX" -- \
  "$BIN/trainer" --mode pserver --update async --pservers 127.0.0.1:1 --elastic 3:2 --shard-steps 4
finish
