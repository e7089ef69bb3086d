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
# --elastic adds and removes a trainer (SIGTERM: it says it stops, and no
# step waits its lease). A pserver killed and resumed: the trainers reset
# the steps to its checkpoint and join again. A member stopped past its
# lease joins again.
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
# SIGTERM: the removed trainer ended its step and said it stops; no step
# waited its lease for it.
for s in 0 1; do
  grep -qE "trainer 1 stops at its step [0-9]+ \(asked to\)" "$SCRATCH/l/pserver$s.log" ||
    fail "launch: pserver $s did not hear the removed trainer stop"
  ! grep -q "leaves (silent" "$SCRATCH/l/pserver$s.log" ||
    fail "launch: pserver $s waited a lease: $(grep -F "leaves (silent" "$SCRATCH/l/pserver$s.log")"
done

# 4. A pserver killed mid-epoch and started again from its checkpoint: the
# trainers reset the steps (every pserver reloads its checkpoint of the
# restarted one's step, pserver 0's queue with it) and join them again;
# pserver 0 counts each epoch once (the trainers' rows count what the
# reset took back twice: docs/elastic.md). restarted NAME KILL EVERY WAIT
# JOB...: pserver KILL is killed once pserver 0's log says WAIT, with
# checkpoints every EVERY steps; prints trainer 0's last metrics row.
restarted() {
  local name=$1 kill=$2 every=$3 wait=$4 a b pid status port victim
  shift 4
  start_pservers "$name" 2 --trainers 2 --checkpoint-dir "$SCRATCH/$name-ck" \
    --checkpoint-every "$every" --trainer-lease 10
  local pids=("${SPIDS[@]}")
  victim=${pids[$kill]}
  port=$(echo "$PS" | cut -d, -f$((kill + 1))); port=${port##*:}
  local job=(--mode pserver --update sync --pservers "$PS" --elastic 1:2 --progress-interval 0
             --metrics "$SCRATCH/$name.jsonl" "$@")
  start "$name-a" "$BIN/trainer" "${job[@]}"; a=$LAST_PID
  wait_log "$SCRATCH/$name-a.log" "gave this trainer id 0" "$a" 60 || fail "$name: no trainer id 0"
  start "$name-b" "$BIN/trainer" "${job[@]}"; b=$LAST_PID
  wait_log "$SCRATCH/$name-s0.log" "$wait" "${pids[0]}" 120 || fail "$name: pserver 0 never logged $wait"
  kill -9 "$victim"
  start "$name-s${kill}b" "$BIN/pserver" --pservers "127.0.0.1:1,127.0.0.1:2" --id "$kill" \
    --listen "127.0.0.1:$port" --trainers 2 --checkpoint-dir "$SCRATCH/$name-ck" \
    --checkpoint-every "$every" --trainer-lease 10 --resume
  pids[$kill]=$LAST_PID
  for pid in "$a" "$b" "${pids[@]}"; do
    status=0; wait_for "$pid" 240 || status=$?
    [ "$status" -eq 0 ] || { fail "$name: process $pid exited $status"; return; }
  done
  local s0log="$SCRATCH/$name-s0.log"
  [ "$kill" -eq 0 ] && s0log="$SCRATCH/$name-s0b.log"
  grep -qE "shards: epoch [12] resumed: [0-9]+ examples of [0-9]+ trained" "$s0log" ||
    fail "$name: pserver 0's queue did not come back from its checkpoint"
  for log in "$SCRATCH/$name-s0.log" "$SCRATCH/$name-s1.log"; do
    case "$log" in *"-s$kill.log") log="${log%.log}b.log" ;; esac
    # Both trainers asked for the reset: each pserver reloaded once.
    local reloads
    reloads=$(grep -cE "rolled back from step [0-9]+ to [0-9]+, .*every trainer joins the steps again" "$log")
    [ "$reloads" -eq 1 ] || fail "$name: $(basename "$log") reloaded its checkpoint $reloads times for one reset"
  done
  for who in a b; do
    grep -qE "every pserver went back to step [0-9]+ " "$SCRATCH/$name-$who.log" ||
      fail "$name: trainer $who did not reset the steps: $(grep -E "WARN|ERROR" "$SCRATCH/$name-$who.log" | tail -2)"
  done
  local examples
  examples=$(grep -oE "shards: [0-9]+ examples per epoch" "$s0log" | head -1 | grep -oE "[0-9]+")
  for e in 1 2; do
    grep -qF "shards: epoch $e trained: $examples examples of $examples " "$s0log" ||
      fail "$name: pserver 0 did not count epoch $e once: $(grep -F "epoch $e trained" "$s0log")"
  done
  tail -1 "$SCRATCH/$name.jsonl"
}

# 4a. An MLP job, pserver 0 killed after its checkpoint of step 40.
row=$(restarted rs-mlp 0 20 "checkpoint at step 40: " --shard-steps 8 --train-samples 12000 \
  --test-samples 2000 --epochs 2 --seed 4 --slowdown 4)
acc=$(echo "$row" | "$PY" -c 'import json,sys; print(json.loads(sys.stdin.read())["test_accuracy"])')
echo "sync, pserver 0 restarted: test accuracy $acc"
within "$acc" 0.85 0.05 || fail "rs-mlp: test accuracy $acc after the reset"

# 4b. A CTR model, pserver 1 killed once epoch 1 is trained: its checkpoint
# (step 100 of about 118 per epoch) is of epoch 1, so the trainers go back
# to it from epoch 2.
d="$SCRATCH/rs-data"
"$BIN/gen_ctr" --out "$d" --train-rows 30000 --test-rows 4000 --scale 0.0005 --seed 5 \
  >"$SCRATCH/rs-gen.json" || fail "gen_ctr failed"
row=$(restarted rs-ctr 1 100 "shards: epoch 1 trained" --shard-steps 8 --data "$d/train.tsv" \
  --test-data "$d/test.tsv" --model ctr:8:32,16 --batch 128 --epochs 2 --seed 3 --threads 1 \
  --slowdown 30)
auc=$(echo "$row" | "$PY" -c 'import json,sys; print(json.loads(sys.stdin.read())["auc"])')
echo "sync ctr, pserver 1 restarted: AUC $auc"
within "$auc" 0.83 0.03 || fail "rs-ctr: AUC $auc after the reset"
for who in a b; do
  grep -qF "the job went back to epoch 1 (a pserver restarted from a checkpoint of it): epoch 2 ends here" \
    "$SCRATCH/rs-ctr-$who.log" || fail "rs-ctr: trainer $who did not go back to epoch 1"
done

# 5. A member stopped (SIGSTOP) past its lease: the steps go on without it;
# continued, its push of a step completed without it is refused and it
# joins the steps again with a new shard; each epoch counted once.
start_pservers st 2 --trainers 2 --trainer-lease 3
ST=(--mode pserver --update sync --pservers "$PS" --elastic 1:2 --shard-steps 8
    --train-samples 12000 --test-samples 1000 --epochs 2 --seed 4 --progress-interval 0.2)
# The first is slowed (the job lasts, the second waits for its pushes most
# of each step); the stopped one is not (--slowdown would sleep its
# multiple of a stop that falls in its compute).
start st-a "$BIN/trainer" "${ST[@]}" --slowdown 8; a=$LAST_PID
wait_log "$SCRATCH/st-a.log" "gave this trainer id 0" "$a" 60 || fail "st: no trainer id 0"
start st-b "$BIN/trainer" "${ST[@]}"; b=$LAST_PID
wait_log "$SCRATCH/st-b.log" "epoch 1/2 step" "$b" 60 || fail "st: the second trainer did not train"
kill -STOP "$b"
wait_log "$SCRATCH/st-s0.log" "trainer 1 leaves \\(silent" "${SPIDS[0]}" 60 ||
  fail "st: pserver 0 kept waiting for the stopped trainer"
kill -CONT "$b"
for pid in "$a" "$b" "${SPIDS[@]}"; do
  status=0; wait_for "$pid" 240 || status=$?
  [ "$status" -eq 0 ] || fail "st: process $pid exited $status"
done
# Back in a step after it left: its stale push refused, it joined again
# (or, stopped between shards with none free, it had left the steps and
# joined with its next shard).
awk '/trainer 1 leaves \(silent/ { left = 1 } left && /\(joined: ([0-9]+,)*1[,;]/ { back = 1 }
     END { exit !back }' "$SCRATCH/st-s0.log" ||
  fail "st: the continued trainer never stepped again: pserver 0: $(grep -E "trainer 1 |members" "$SCRATCH/st-s0.log" | tail -4); the trainer: $(tail -3 "$SCRATCH/st-b.log")"
for e in 1 2; do
  grep -qF "shards: epoch $e trained: 12000 examples of 12000 " "$SCRATCH/st-s0.log" ||
    fail "st: epoch $e not counted once: $(grep -F "epoch $e trained" "$SCRATCH/st-s0.log")"
done

# 6. Refusals: a sync push in parts cannot carry its step's members.
expect_exit 2 "--overlap pushes a sync step in parts: not with --shard-steps" -- \
  "$BIN/trainer" --mode pserver --update sync --pservers 127.0.0.1:1 --elastic 1:4 --shard-steps 4 \
  --overlap
finish
