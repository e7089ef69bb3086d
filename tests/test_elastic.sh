#!/usr/bin/env bash
# Elastic async jobs (--elastic MIN:MAX with --shard-steps): trainers get
# their ids from pserver 0; an MLP job of 2 trainers grows to 4 and shrinks
# to 1 (three SIGKILLed, one of them in the middle of a push) with no
# pserver restarted, a CTR job 2 -> 3 -> 1 likewise (elastic_lib.sh: within
# 0.01 accuracy and 0.005 AUC of fixed 2-trainer jobs), and each epoch's
# examples are still counted once, by pserver 0 and by the trainers' rows
# plus the gone processes' counts; the job ends when the last trainer is
# done. Pserver 0 killed and resumed from its checkpoint mid-epoch: the
# queue comes back and it counts each epoch once. Below MIN the job waits
# for a trainer; scripts/launch --elastic adds and removes trainers through
# its control FIFO (a removed one says it stops). Bad flags are refused.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/elastic_lib.sh"
require_data

# 1. 2 -> 4 -> 1 trainers, MLP, 20000 examples x 2 epochs: a killed
# trainer's shard goes back from its push's batch after its lease.
mlp_2_4_1 async 10
grep -qE "goes back to the queue at example [0-9]+ of 256" "$SCRATCH/el-s0.log" ||
  fail "no shard of a killed trainer went back to the queue"

# 2. A CTR model, 2 -> 3 -> 1: the joiner's shard goes back from the batch
# of the push it died in.
ctr_2_3_1 async 10
grep -qE "trainer 2 sent nothing for its lease .* goes back to the queue at example 128 of 512" \
  "$SCRATCH/ctr-s0.log" || fail "ctr: the joiner's shard did not go back from its push's batch"

# 3. Pserver 0 of an elastic job killed after its checkpoint of step 40 and
# started again from it: the queue comes back, the trainers (ids from the
# first pserver 0) go on, and pserver 0 counts each epoch once (the
# trainers' rows count the shards finished since the checkpoint twice:
# docs/elastic.md, Pserver 0 restarts).
CK="$SCRATCH/ck"
start_pservers ck 2 --trainers 2 --checkpoint-dir "$CK" --checkpoint-every 20 --trainer-lease 10
s0=${SPIDS[0]} s1=${SPIDS[1]}
port0=${PS%%,*}
port0=${port0##*:}
CKJOB=(--mode pserver --update async --pservers "$PS" --elastic 1:2 --shard-steps 8
       --train-samples 12000 --test-samples 2000 --epochs 2 --seed 4 --slowdown 4
       --progress-interval 0)
start ck-a "$BIN/trainer" "${CKJOB[@]}"; a=$LAST_PID
wait_log "$SCRATCH/ck-a.log" "gave this trainer id 0" "$a" 60 ||
  fail "ck: the first trainer got no id 0"
start ck-b "$BIN/trainer" "${CKJOB[@]}"; b=$LAST_PID
wait_log "$SCRATCH/ck-s0.log" "checkpoint at step 40: " "$s0" 60 ||
  fail "ck: pserver 0 wrote no checkpoint of step 40"
kill -9 "$s0"
start ck-s0b "$BIN/pserver" --pservers "127.0.0.1:1,127.0.0.1:2" --id 0 \
  --listen "127.0.0.1:$port0" --trainers 2 --checkpoint-dir "$CK" --checkpoint-every 20 \
  --trainer-lease 10 --resume; s0=$LAST_PID
for pid in "$a" "$b" "$s0" "$s1"; do
  status=0; wait_for "$pid" 120 || status=$?
  [ "$status" -eq 0 ] || fail "ck: process $pid exited $status"
done
grep -qE "shards: epoch 1 resumed: [0-9]+ examples of 12000 trained" "$SCRATCH/ck-s0b.log" ||
  fail "ck: the queue did not come back: $(grep -F shards "$SCRATCH/ck-s0b.log" | head -3)"
for e in 1 2; do
  grep -qF "shards: epoch $e trained: 12000 examples of 12000 " "$SCRATCH/ck-s0b.log" ||
    fail "ck: epoch $e not counted once: $(grep -F "epoch $e trained" "$SCRATCH/ck-s0b.log")"
done

# 4. MIN 2: one trainer waits for a second.
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

# 5. scripts/launch --elastic: 1 trainer, 2 added and 1 removed through the
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
# SIGTERM: the removed trainer ended its step and said it stops.
grep -qE "trainer [0-9]+ stops at its step [0-9]+ \(asked to\)" "$SCRATCH/l/pserver0.log" ||
  fail "launch: the removed trainer did not say it stops: $(grep -F stopped "$SCRATCH/launch.log")"
shards_counted launch "$SCRATCH/l/pserver0.log" 20000 2 "$SCRATCH/l.jsonl"*

# 6. Refusals.
expect_exit 2 "--id with --elastic: pserver 0 gives each joining trainer its id" -- \
  "$BIN/trainer" --mode pserver --update async --pservers 127.0.0.1:1 --elastic 1:4 --shard-steps 4 --id 1
expect_exit 2 "--elastic needs --shard-steps" -- \
  "$BIN/trainer" --mode pserver --update async --pservers 127.0.0.1:1 --elastic 1:4
expect_exit 2 "--elastic '3:2' is not MIN:MAX" -- \
  "$BIN/trainer" --mode pserver --update async --pservers 127.0.0.1:1 --elastic 3:2 --shard-steps 4
finish
