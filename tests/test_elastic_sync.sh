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
# CTR model's AUC within 0.005 (elastic_lib.sh). scripts/launch --mode sync
# --elastic adds and removes a trainer.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/elastic_lib.sh"
require_data

# 1. 2 -> 4 -> 1 trainers, MLP, 20000 examples x 2 epochs: every pserver
# stepped with the four, stopped waiting for the killed ones after their
# lease, and stepped with trainer 0 alone.
mlp_2_4_1 sync 6
for s in 0 1; do
  grep -qE "step [0-9]+: members 0,1,2,3 \(" "$SCRATCH/el-s$s.log" ||
    fail "pserver $s never had four members in a step"
  grep -qE "step [0-9]+: trainer [123] leaves \(silent for [0-9.]+ s after the step.s first push" \
    "$SCRATCH/el-s$s.log" || fail "pserver $s did not stop waiting for a killed trainer"
  grep -qE "step [0-9]+: members 0 \(" "$SCRATCH/el-s$s.log" ||
    fail "pserver $s never stepped with trainer 0 alone"
done

# 2. A CTR model, 2 -> 3 -> 1: the joiner stepped with the others.
ctr_2_3_1 sync 6
grep -qE "step [0-9]+: members 0,1,2 \(joined: 2;" "$SCRATCH/ctr-s0.log" ||
  fail "ctr: the joiner never stepped with the others"

# 3. scripts/launch --mode sync --elastic: 1 trainer, 1 added and then
# removed through the control FIFO; every pserver stepped with both.
CTL="$SCRATCH/control"
start launch "$PY" "$(dirname "$0")/../scripts/launch" --bin "$BIN" --mode sync --elastic 1:2 \
  --control "$CTL" --log-dir "$SCRATCH/l" --quiet --pserver-args "--trainer-lease 6" -- \
  --shard-steps 4 --train-samples 12000 --test-samples 1000 --epochs 2 --slowdown 20 \
  --progress-interval 0.2 --metrics "$SCRATCH/l.jsonl"; l=$LAST_PID
wait_log "$SCRATCH/launch.log" "trainer\(s\), sync update" "$l" 60 || fail "launch: no start"
wait_log "$SCRATCH/l/trainer0.log" "epoch 1/2 step" "$l" 60 || fail "launch: trainer 0 did not train"
echo add >"$CTL"
wait_log "$SCRATCH/l/pserver1.log" "members 0,1 " "$l" 60 || fail "launch: the added trainer never stepped"
echo remove >"$CTL"
wait_log "$SCRATCH/launch.log" "trainer 1 stopped" "$l" 30 || fail "launch: no trainer removed"
status=0; wait_for "$l" 240 || status=$?
[ "$status" -eq 0 ] || fail "launch exited $status: $(tail -3 "$SCRATCH/launch.log")"
shards_counted "sync launch" "$SCRATCH/l/pserver0.log" 12000 2 "$SCRATCH/l.jsonl"*

# 4. Refusals: a sync push in parts cannot carry its step's members.
expect_exit 2 "--overlap pushes a sync step in parts: not with --shard-steps" -- \
  "$BIN/trainer" --mode pserver --update sync --pservers 127.0.0.1:1 --elastic 1:4 --shard-steps 4 \
  --overlap
finish
