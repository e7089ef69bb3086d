#!/usr/bin/env bash
# Malformed-message storm (label "security"): a 2-pserver, 2-trainer sync job
# runs once undisturbed and once while storm_client sends tens of thousands
# of mutated requests (bit flips, truncation, wrong ids, steps and hashes,
# huge lengths, duplicated fields, ...) to both pservers. Every storm request
# must be answered with an error status (none accepted, none timing out),
# the pservers and trainers exit 0, and the stormed run's exported
# parameters are bitwise those of the undisturbed run. The pservers run with
# --max-registrations 1, so once the trainers registered, a registration of
# theirs made by the storm is refused (RESOURCE_EXHAUSTED), not a takeover.
. "$(dirname "$0")/lib.sh"
require_data
STORM="$BIN/tests/storm_client"
[ -x "$STORM" ] || { echo "FAIL: $STORM is not built" >&2; exit 1; }
COMMON=(--train-samples 60000 --test-samples 200 --max-steps 6000 --optimizer momentum --lr 0.05
        --lr-schedule constant --seed 5 --batch 32 --progress-interval 0 --model mlp:784,64,10)

run_job() { # run_job TAG: 2 pservers and 2 trainers; trainer 0 exports TAG.safetensors
  local tag=$1
  start_pservers "$tag" 2 --trainers 2 --max-registrations 1 --log-every 1000
  S0=${SPIDS[0]} S1=${SPIDS[1]}
  start "$tag-t0" "$BIN/trainer" --mode pserver --pservers "$PS" --trainers 2 --id 0 "${COMMON[@]}" \
    --export "$SCRATCH/$tag.safetensors"; T0=$LAST_PID
  start "$tag-t1" "$BIN/trainer" --mode pserver --pservers "$PS" --trainers 2 --id 1 "${COMMON[@]}"; T1=$LAST_PID
}
wait_job() { # wait_job TAG: every process exits 0
  local who status
  for who in T0 T1 S0 S1; do
    status=0; wait_for "${!who}" 300 || status=$?
    [ "$status" -eq 0 ] || fail "$1: $who exited $status: $(tail -n 2 "$SCRATCH/$1-$(echo "$who" | tr 'TS' 'ts').log")"
  done
}

run_job calm
wait_job calm

run_job storm
# The storm starts once both trainers registered with both pservers.
for _ in $(seq 600); do
  [ "$(cat "$SCRATCH/storm-s0.log" "$SCRATCH/storm-s1.log" | grep -c "trainer [01] registered")" -ge 4 ] && break
  sleep 0.1
done
status=0
timeout 120 "$STORM" --storm-seconds 45 --storm-max 40000 --storm-seed 7 --mode pserver --pservers "$PS" \
  --trainers 2 --id 0 "${COMMON[@]}" >"$SCRATCH/storm.out" 2>&1 || status=$?
cat "$SCRATCH/storm.out" >&2
[ "$status" -eq 0 ] || fail "storm_client exited $status"
wait_job storm

result=$(grep "^storm-result" "$SCRATCH/storm.out")
value() { sed -n "s/.* $1=\([0-9.]*\).*/\1/p" <<<"$result"; }
sent=$(value sent) errors=$(value errors) ok=$(value ok) timeouts=$(value timeout)
ended=$(( $(value unavailable) + $(value cancelled) ))
[ -n "$sent" ] || { fail "no storm result"; finish; }
[ "$sent" -ge 10000 ] || fail "only $sent storm requests were sent (expected tens of thousands)"
[ "$ok" -eq 0 ] || fail "$ok storm requests were accepted"
[ "$timeouts" -eq 0 ] || fail "$timeouts storm requests timed out: a pserver hung"
# UNAVAILABLE/CANCELLED only for the calls in flight when the job ended (at most one batch).
[ "$ended" -le 32 ] || fail "$ended storm requests got UNAVAILABLE or CANCELLED"
[ $((errors + ended)) -eq "$sent" ] || fail "$sent sent but $errors error answers and $ended at the end"
for i in 0 1; do
  grep -q "every trainer is done" "$SCRATCH/storm-s$i.log" || fail "pserver $i did not finish the job"
  grep -q "refused PushPull" "$SCRATCH/storm-s$i.log" || fail "pserver $i logged no refusal"
done
cmp -s "$SCRATCH/calm.safetensors" "$SCRATCH/storm.safetensors" ||
  fail "the stormed run's parameters differ from the undisturbed run's"
finish
