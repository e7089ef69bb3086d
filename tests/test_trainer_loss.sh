#!/usr/bin/env bash
# A trainer killed (SIGKILL) in sync mode (label "fault"): by default the job
# stops within --step-timeout, the pserver exiting 1 and the other trainer
# non-zero, both naming the dead trainer; with --on-trainer-loss continue the
# pserver drops it and the job completes with the other trainer.
. "$(dirname "$0")/lib.sh"
require_data
FLAGS=(--train-samples 30000 --test-samples 200 --max-steps 1500 --batch 32 --progress-interval 0)

kill_trainer1_when_training() {
  for _ in $(seq 200); do
    grep -q "training mlp" "$SCRATCH/$1-t1.log" 2>/dev/null && break
    sleep 0.05
  done
  sleep 0.3
  kill -9 "$T1"
}

for policy in stop continue; do
  start_pservers "$policy" 1 --trainers 2 --step-timeout 2 --on-trainer-loss "$policy"
  S0=${SPIDS[0]}
  start "$policy-t0" "$BIN/trainer" --mode pserver --pservers "$PS" --trainers 2 --id 0 "${FLAGS[@]}"; T0=$LAST_PID
  start "$policy-t1" "$BIN/trainer" --mode pserver --pservers "$PS" --trainers 2 --id 1 "${FLAGS[@]}"; T1=$LAST_PID
  kill_trainer1_when_training "$policy"
  ps_status=0; wait_for "$S0" 60 || ps_status=$?
  t_status=0; wait_for "$T0" 60 || t_status=$?
  if [ "$policy" = stop ]; then
    [ "$ps_status" -eq 1 ] || fail "stop: pserver exited $ps_status, expected 1"
    grep -q "for trainer(s) 1" "$SCRATCH/stop-s0.log" || fail "stop: pserver did not name trainer 1"
    [ "$t_status" -ne 0 ] && [ "$t_status" -ne 124 ] || fail "stop: trainer 0 exited $t_status"
    grep -q "for trainer(s) 1" "$SCRATCH/stop-t0.log" || fail "stop: trainer 0 did not name trainer 1"
  else
    [ "$ps_status" -eq 0 ] || fail "continue: pserver exited $ps_status: $(tail -2 "$SCRATCH/continue-s0.log")"
    [ "$t_status" -eq 0 ] || fail "continue: trainer 0 exited $t_status: $(tail -2 "$SCRATCH/continue-t0.log")"
    grep -q "trainer 1 missed step .* continuing with 1 trainer" "$SCRATCH/continue-s0.log" ||
      fail "continue: the pserver did not say it dropped trainer 1"
    grep -q "(1500 steps)" "$SCRATCH/continue-t0.log" || fail "continue: trainer 0 did not finish its steps"
  fi
done
finish
