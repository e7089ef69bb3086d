#!/usr/bin/env bash
# Nothing hangs silently: trainers started before their pservers still
# train; a trainer pointed at a dead address fails within --connect-timeout
# naming it; a sync step missing a trainer stops the job after
# --step-timeout naming the trainer; a trainer whose job differs is refused
# by name; the launcher stops everything when one process fails.
. "$(dirname "$0")/lib.sh"
require_data
LAUNCH="$(dirname "$0")/../scripts/launch"
SHORT=(--train-samples 3000 --test-samples 200 --max-steps 20 --progress-interval 0)

# 1. Trainers first, pservers 2 s later (so the ports must be chosen before
# the pservers bind them).
read -r p0 p1 <<<"$(free_ports 2)"
PS="127.0.0.1:$p0,127.0.0.1:$p1"
start t0 "$BIN/trainer" --mode pserver --pservers "$PS" --trainers 2 --id 0 "${SHORT[@]}"; t0=$LAST_PID
start t1 "$BIN/trainer" --mode pserver --pservers "$PS" --trainers 2 --id 1 "${SHORT[@]}"; t1=$LAST_PID
sleep 2
start s0 "$BIN/pserver" --pservers "$PS" --id 0 --trainers 2; s0=$LAST_PID
start s1 "$BIN/pserver" --pservers "$PS" --id 1 --trainers 2; s1=$LAST_PID
for who in t0 t1 s0 s1; do
  status=0
  wait_for "${!who}" 60 || status=$?
  [ "$status" -eq 0 ] || fail "start order: $who exited $status: $(tail -3 "$SCRATCH/$who.log")"
done
grep -q "done: 1 epochs (20 steps)" "$SCRATCH/t0.log" || fail "start order: trainer 0 did not train 20 steps"

# 2. A dead address: a clear error within the timeout.
read -r dead <<<"$(free_ports 1)"
begin=$(date +%s)
status=0
"$BIN/trainer" --mode pserver --pservers "127.0.0.1:$dead" --connect-timeout 2 "${SHORT[@]}" \
  2>"$SCRATCH/dead.log" || status=$?
elapsed=$(( $(date +%s) - begin ))
[ "$status" -ne 0 ] || fail "dead address: trainer exited 0"
grep -qF "could not reach pserver 0 at 127.0.0.1:$dead within 2 s" "$SCRATCH/dead.log" ||
  fail "dead address: message: $(tail -2 "$SCRATCH/dead.log")"
[ "$elapsed" -le 12 ] || fail "dead address: took ${elapsed}s with --connect-timeout 2"

# 3. A sync step waiting for a trainer that never comes.
start_pservers lone 1 --trainers 2 --step-timeout 3
ps_pid=${SPIDS[0]}
start lone_t "$BIN/trainer" --mode pserver --pservers "$PS" --trainers 2 --id 0 "${SHORT[@]}"; t_pid=$LAST_PID
status=0; wait_for "$ps_pid" 30 || status=$?
[ "$status" -eq 1 ] || fail "step timeout: pserver exited $status, expected 1"
grep -q "waited 3 s (--step-timeout) for trainer(s) 1" "$SCRATCH/lone-s0.log" ||
  fail "step timeout: pserver message: $(tail -2 "$SCRATCH/lone-s0.log")"
status=0; wait_for "$t_pid" 30 || status=$?
[ "$status" -ne 0 ] || fail "step timeout: the waiting trainer exited 0"
grep -q "for trainer(s) 1" "$SCRATCH/lone_t.log" ||
  fail "step timeout: trainer message: $(tail -2 "$SCRATCH/lone_t.log")"

# 4. A trainer with another model is refused, naming the differing fields.
# The step timeout outlasts both refusals on a loaded machine (a timed-out
# job would refuse the second for another reason).
start_pservers diff 1 --trainers 2 --step-timeout 120
ps_pid=${SPIDS[0]}
start diff_t0 "$BIN/trainer" --mode pserver --pservers "$PS" --trainers 2 --id 0 "${SHORT[@]}"; t_pid=$LAST_PID
wait_log "$SCRATCH/diff-s0.log" "trainer 0 registered" "$ps_pid" ||
  fail "job mismatch: trainer 0 did not register: $(tail -2 "$SCRATCH/diff-s0.log")"
status=0
"$BIN/trainer" --mode pserver --pservers "$PS" --trainers 2 --id 1 "${SHORT[@]}" \
  --model mlp:784,64,10 2>"$SCRATCH/diff_t1.log" || status=$?
[ "$status" -eq 2 ] || fail "job mismatch: trainer 1 exited $status, expected 2"
# Without a token the trainer is told the fields; the values are in the pserver's log.
grep -qF "job differs from trainer 0's in: model (the values are in the pserver's log" "$SCRATCH/diff_t1.log" ||
  fail "job mismatch: message: $(tail -2 "$SCRATCH/diff_t1.log")"
grep -qF "mlp:784,256,128,10" "$SCRATCH/diff_t1.log" && fail "job mismatch: the job's model was sent to the trainer"
grep -qF "model mlp:784,64,10 vs mlp:784,256,128,10" "$SCRATCH/diff-s0.log" ||
  fail "job mismatch: the pserver did not log the difference"
status=0
"$BIN/trainer" --mode pserver --pservers "$PS" --trainers 2 --id 1 "${SHORT[@]}" \
  --batch 32 --lr-schedule constant 2>"$SCRATCH/diff_t1b.log" || status=$?
[ "$status" -eq 2 ] || fail "batch mismatch: trainer 1 exited $status, expected 2"
grep -qE "job differs from trainer 0's in: .*batch" "$SCRATCH/diff_t1b.log" ||
  fail "batch mismatch: message: $(tail -2 "$SCRATCH/diff_t1b.log")"
grep -qF "batch 32 vs 64" "$SCRATCH/diff-s0.log" || fail "batch mismatch: the pserver did not log the values"
kill "$ps_pid" "$t_pid" 2>/dev/null

# 5. The launcher stops the job when one process fails.
status=0
timeout 60 "$LAUNCH" --bin "$BIN" --pservers 2 --trainers 2 --quiet --log-dir "$SCRATCH/logs-bad" \
  -- --optimizer bogus >"$SCRATCH/launch-bad.log" 2>&1 || status=$?
[ "$status" -eq 1 ] || fail "launcher: exited $status, expected 1"
grep -q "exited with status 2; stopping the rest" "$SCRATCH/launch-bad.log" ||
  fail "launcher: message: $(tail -4 "$SCRATCH/launch-bad.log")"
finish
