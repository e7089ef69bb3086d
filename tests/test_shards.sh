#!/usr/bin/env bash
# Data handed out in shards by pserver 0 (--shard-steps, async): a trainer
# killed in the middle of a push (pserver 0 applied it, pserver 1 never saw
# it) has its shard handed out again from the batch that push carried, after
# its lease (the MLP) or at once when it registers again (a CTR model); each
# epoch's examples are counted exactly once, by pserver 0 from applied pushes
# and by the trainers' metrics rows ("examples_applied") plus what the killed
# process had applied (pserver 0's log); the model trains as a fixed split's
# does. --shard-steps outside pserver mode is refused.
. "$(dirname "$0")/lib.sh"
require_data
metric() { "$PY" -c 'import json,sys; print(json.loads(open(sys.argv[1]).readlines()[-1])[sys.argv[2]])' "$1" "$2"; }

# handed_again NAME TRAINER_LOG: seconds from the trainer's death (its last
# log line) to another grant of its shard, printed (docs/elastic.md).
handed_again() {
  "$PY" - "$SCRATCH/$1-s0.log" "$SCRATCH/$2.log" "$1" <<'PY' || fail "$1: the dead trainer's shard was not handed out again"
import datetime, re, sys
def when(line):
    return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S.%f")
died = when(next(l for l in open(sys.argv[2]) if "killing this trainer" in l))
grant = next(l for l in open(sys.argv[1]) if "after it went back to the queue" in l)
print(f"{sys.argv[3]}: the dead trainer's shard handed out again {(when(grant) - died).total_seconds():.2f} s after its death: {grant[24:].strip()}", file=sys.stderr)
PY
}

# 1. The MLP: trainer 1 dies in its 13th push (the 5th batch of its second
# shard), stays dead past its lease, then comes back.
start_pservers mlp 2 --trainers 2 --trainer-lease 4
MLP=(--mode pserver --update async --trainers 2 --train-samples 12000 --test-samples 10000 --epochs 2
     --progress-interval 0 --seed 4 --pservers)
MLP_HANDED=("${MLP[@]}" "$PS" --shard-steps 8)
start mlp-t0 "$BIN/trainer" "${MLP_HANDED[@]}" --id 0 --metrics "$SCRATCH/mlp.jsonl"; t0=$LAST_PID
PSTRAIN_TEST_KILL_MID_PUSH=13 start mlp-t1 "$BIN/trainer" "${MLP_HANDED[@]}" --id 1 --metrics "$SCRATCH/mlp.jsonl"
status=0; wait_for "$LAST_PID" 60 || status=$?
[ "$status" -eq 137 ] || fail "mlp: the trainer to kill exited $status, not 137 (SIGKILL)"
grep -q "pserver 0 answered the push (OK); killing this trainer" "$SCRATCH/mlp-t1.log" ||
  fail "mlp: trainer 1 did not die after pserver 0 answered: $(tail -2 "$SCRATCH/mlp-t1.log")"
wait_log "$SCRATCH/mlp-s0.log" "goes back to the queue" "${SPIDS[0]}" 30 ||
  fail "mlp: the killed trainer's shard did not go back to the queue"
grep -qE "trainer 1 sent nothing for its lease of 4.0 s .*: shard [0-9]+ of epoch 1 goes back to the queue at example 256 of 512" \
  "$SCRATCH/mlp-s0.log" || fail "mlp: not handed out again from the push's batch: $(grep -F "goes back" "$SCRATCH/mlp-s0.log")"
wait_log "$SCRATCH/mlp-s0.log" "after it went back to the queue" "${SPIDS[0]}" 30 ||
  fail "mlp: the dead trainer's shard was not handed out again"
handed_again mlp mlp-t1
start mlp-t1b "$BIN/trainer" "${MLP_HANDED[@]}" --id 1 --metrics "$SCRATCH/mlp.jsonl"; t1=$LAST_PID
for pid in "$t0" "$t1" "${SPIDS[@]}"; do
  status=0; wait_for "$pid" 120 || status=$?
  [ "$status" -eq 0 ] || fail "mlp: process $pid exited $status"
done
shards_counted mlp "$SCRATCH/mlp-s0.log" 12000 2 "$SCRATCH/mlp.jsonl"*
# The same job with each trainer's fixed half, no one killed: the accuracy is alike.
start_pservers fixed 2 --trainers 2
start fixed-t0 "$BIN/trainer" "${MLP[@]}" "$PS" --id 0 --metrics "$SCRATCH/fixed.jsonl"; f0=$LAST_PID
start fixed-t1 "$BIN/trainer" "${MLP[@]}" "$PS" --id 1; f1=$LAST_PID
for pid in "$f0" "$f1" "${SPIDS[@]}"; do
  status=0; wait_for "$pid" 120 || status=$?
  [ "$status" -eq 0 ] || fail "fixed: process $pid exited $status"
done
a=$(metric "$SCRATCH/mlp.jsonl" test_accuracy) b=$(metric "$SCRATCH/fixed.jsonl" test_accuracy)
echo "test accuracy: handed out with a kill $a, fixed halves $b" >&2
"$PY" -c 'import sys; a,b=map(float,sys.argv[1:]); sys.exit(0 if a > 0.7 and abs(a-b) <= 0.03 else 1)' "$a" "$b" ||
  fail "mlp: accuracy $a (handed out, a trainer killed) vs $b (fixed halves)"

# 2. A CTR model: trainer 1 dies in its 7th push and comes back at once; its
# registration gives the shard back (the lease is far off).
D="$SCRATCH/data"
"$BIN/gen_ctr" --out "$D" --train-rows 20000 --test-rows 4000 --scale 0.0005 --seed 5 \
  >"$SCRATCH/gen.json" || fail "gen_ctr failed"
start_pservers ctr 2 --trainers 2 --trainer-lease 60
CTR=(--mode pserver --update async --pservers "$PS" --trainers 2 --data "$D/train.tsv"
     --test-data "$D/test.tsv" --model ctr:8:32,16 --batch 128 --epochs 2 --seed 3 --threads 1
     --progress-interval 0 --shard-steps 4)
start ctr-t0 "$BIN/trainer" "${CTR[@]}" --id 0 --metrics "$SCRATCH/ctr.jsonl"; t0=$LAST_PID
PSTRAIN_TEST_KILL_MID_PUSH=7 start ctr-t1 "$BIN/trainer" "${CTR[@]}" --id 1 --metrics "$SCRATCH/ctr.jsonl"
status=0; wait_for "$LAST_PID" 60 || status=$?
[ "$status" -eq 137 ] || fail "ctr: the trainer to kill exited $status, not 137"
start ctr-t1b "$BIN/trainer" "${CTR[@]}" --id 1 --metrics "$SCRATCH/ctr.jsonl"; t1=$LAST_PID
for pid in "$t0" "$t1" "${SPIDS[@]}"; do
  status=0; wait_for "$pid" 120 || status=$?
  [ "$status" -eq 0 ] || fail "ctr: process $pid exited $status"
done
grep -qE "trainer 1 registered again \(a new process\): shard [0-9]+ of epoch 1 goes back to the queue at example 256 of 512" \
  "$SCRATCH/ctr-s0.log" || fail "ctr: the shard did not go back at registration: $(grep -F "goes back" "$SCRATCH/ctr-s0.log")"
handed_again ctr ctr-t1
shards_counted ctr "$SCRATCH/ctr-s0.log" 20000 2 "$SCRATCH/ctr.jsonl"*
auc=$(metric "$SCRATCH/ctr.jsonl" auc)
"$PY" -c 'import sys; sys.exit(0 if float(sys.argv[1]) > 0.6 else 1)' "$auc" || fail "ctr: test AUC $auc"

# 3. Pserver 0 killed after its checkpoint of step 40 and started again from
# it: the queue comes back from the checkpoint, the trainers go on with
# their shards, every epoch's examples are counted once.
CK="$SCRATCH/ck"
start_pservers ck 2 --trainers 2 --checkpoint-dir "$CK" --checkpoint-every 20
s0=${SPIDS[0]} s1=${SPIDS[1]}
port0=${PS%%,*}
port0=${port0##*:}
CKJOB=("${MLP[@]}" "$PS" --shard-steps 8 --train-samples 12000 --slowdown 4)
start ck-t0 "$BIN/trainer" "${CKJOB[@]}" --id 0; t0=$LAST_PID
start ck-t1 "$BIN/trainer" "${CKJOB[@]}" --id 1; t1=$LAST_PID
wait_log "$SCRATCH/ck-s0.log" "checkpoint at step 40: " "$s0" 60 || fail "ck: pserver 0 wrote no checkpoint of step 40"
kill -9 "$s0"
start ck-s0b "$BIN/pserver" --pservers "127.0.0.1:1,127.0.0.1:2" --id 0 --listen "127.0.0.1:$port0" \
  --trainers 2 --checkpoint-dir "$CK" --checkpoint-every 20 --resume; s0=$LAST_PID
for pid in "$t0" "$t1" "$s0" "$s1"; do
  status=0; wait_for "$pid" 120 || status=$?
  [ "$status" -eq 0 ] || fail "ck: process $pid exited $status"
done
grep -qE "shards: epoch 1 resumed: [0-9]+ examples of 12000 trained" "$SCRATCH/ck-s0b.log" ||
  fail "ck: the queue did not come back: $(grep -F shards "$SCRATCH/ck-s0b.log" | head -3)"
for e in 1 2; do
  grep -qF "shards: epoch $e trained: 12000 examples of 12000 " "$SCRATCH/ck-s0b.log" ||
    fail "ck: epoch $e not counted once after the restart: $(grep -F "epoch $e trained" "$SCRATCH/ck-s0b.log")"
done

# 4. Refusals: handed-out data outside pserver mode, and with --max-steps.
expect_exit 2 "--shard-steps is for --mode pserver (here: --mode local)" -- \
  "$BIN/trainer" --mode local --shard-steps 4
expect_exit 2 "--shard-steps hands out whole epochs: not with --max-steps" -- \
  "$BIN/trainer" --mode pserver --update async --pservers 127.0.0.1:1 --shard-steps 4 --max-steps 9

finish
