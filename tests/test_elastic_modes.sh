#!/usr/bin/env bash
# SSP and GEO with handed-out data and elastic trainers (--elastic 1:3
# --shard-steps): 2 trainers start, a third joins, one leaves (SSP: killed,
# its shard back after its lease; GEO: SIGTERM, it ends its step and says it
# stops, its shard back at once); each epoch's
# examples are counted once (pserver 0, and the trainers' rows plus the gone
# process's count), SSP's bound holds across the joins and leaves (a trainer
# without data, or gone past its lease, holds no one back; one back with
# data stands level with the slowest), and the job trains.
. "$(dirname "$0")/lib.sh"
require_data
metric() { "$PY" -c 'import json,sys; print(json.loads(open(sys.argv[1]).readlines()[-1])[sys.argv[2]])' "$1" "$2"; }
max_lead() { sed -n 's/.* job: ssp: max lead \([0-9]*\) step(s).*/\1/p' "$1" | tail -1; }

# elastic NAME SIGNAL "FLAGS": 2 trainers, a third joins, the second is
# sent SIGNAL (KILL or TERM).
elastic() {
  local name=$1 sig=$2 flags=$3 a b c status pid
  start_pservers "$name" 2 --trainers 3 --trainer-lease 6 || return
  # shellcheck disable=SC2206
  local job=(--mode pserver --pservers "$PS" --elastic 1:3 --shard-steps 4 --train-samples 12000
             --test-samples 2000 --epochs 2 --seed 6 --slowdown 10 --progress-interval 0.2
             --metrics "$SCRATCH/$name.jsonl" $flags)
  start "$name-a" "$BIN/trainer" "${job[@]}"; a=$LAST_PID
  wait_log "$SCRATCH/$name-a.log" "gave this trainer id 0" "$a" 60 || fail "$name: no id 0"
  start "$name-b" "$BIN/trainer" "${job[@]}"; b=$LAST_PID
  wait_log "$SCRATCH/$name-b.log" "epoch 1/2 step" "$b" 60 || fail "$name: the second did not train"
  start "$name-c" "$BIN/trainer" "${job[@]}"; c=$LAST_PID
  wait_log "$SCRATCH/$name-c.log" "epoch 1/2 step" "$c" 60 || fail "$name: the joiner did not train"
  kill -"$sig" "$b"
  status=0; wait_for "$b" 60 || status=$?
  [ "$sig" = KILL ] || [ "$status" -eq 0 ] || fail "$name: the trainer sent SIG$sig exited $status"
  for pid in "$a" "$c" "${SPIDS[@]}"; do
    status=0; wait_for "$pid" 240 || status=$?
    [ "$status" -eq 0 ] || fail "$name: process $pid exited $status"
  done
  grep -q "trainer id 2 given to a joining trainer" "$SCRATCH/$name-s0.log" ||
    fail "$name: the joiner got no id 2"
  if [ "$sig" = KILL ]; then
    grep -qE "trainer 1 sent nothing for its lease .* goes back to the queue" "$SCRATCH/$name-s0.log" ||
      fail "$name: the killed trainer's shard did not go back"
  else
    grep -qE "trainer 1 stops at its step [0-9]+ \(asked to\)" "$SCRATCH/$name-s0.log" &&
      grep -qE "trainer 1 stopped: shard [0-9]+ of epoch 1 goes back to the queue" "$SCRATCH/$name-s0.log" ||
      fail "$name: the stopped trainer's shard did not go back: $(grep -F "trainer 1" "$SCRATCH/$name-s0.log" | tail -3)"
  fi
  shards_counted "$name" "$SCRATCH/$name-s0.log" 12000 2 "$SCRATCH/$name.jsonl"*
  local acc
  acc=$(metric "$SCRATCH/$name.jsonl" test_accuracy)
  "$PY" -c 'import sys; sys.exit(0 if float(sys.argv[1]) > 0.75 else 1)' "$acc" ||
    fail "$name: test accuracy $acc"
}

# 1. SSP, S = 2: the bound holds on both pservers.
elastic ssp KILL "--update ssp --staleness 2"
for s in 0 1; do
  lead=$(max_lead "$SCRATCH/ssp-s$s.log")
  [ -n "$lead" ] && [ "$lead" -le 2 ] || fail "ssp: pserver $s's max lead $lead, over --staleness 2"
done

# 2. GEO, a change every 4 steps and at each shard's end.
elastic geo TERM "--update geo --geo-steps 4"
finish
