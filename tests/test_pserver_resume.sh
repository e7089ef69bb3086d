#!/usr/bin/env bash
# Checkpoints and resume (label "fault"): pservers stopped with SIGTERM mid-run
# exit 0 and leave checkpoints (one file per pserver and step); restarted
# with --resume at the newest step both have, with the trainers started
# again, the job continues at that step and ends with parameters bitwise
# equal to an uninterrupted run's (sync mode sums in a fixed order; data
# order, momentum state and step all resume exactly); so does the same
# checkpoint re-sharded onto 3 pservers. A corrupted byte, a missing
# checkpoint and a job of another shape are refused.
. "$(dirname "$0")/lib.sh"
require_data
LAUNCH="$(dirname "$0")/../scripts/launch"
COMMON=(--train-samples 12800 --test-samples 200 --max-steps 400 --optimizer momentum --lr 0.05
        --lr-schedule constant --seed 5 --batch 32 --progress-interval 0)

# The uninterrupted run.
timeout 300 "$LAUNCH" --bin "$BIN" --pservers 2 --trainers 2 --quiet --log-dir "$SCRATCH/a" \
  -- "${COMMON[@]}" --export "$SCRATCH/a.safetensors" >"$SCRATCH/a.log" 2>&1 ||
  { fail "uninterrupted run failed: $(tail -5 "$SCRATCH/a.log")"; finish; }

# The same job, its pservers stopped after a checkpoint at step 100 or later.
CK="$SCRATCH/ck"
mkdir -p "$CK"
run_job() { # run_job TAG [PSERVER FLAGS...]: starts 2 pservers and 2 trainers
  local tag=$1
  shift
  start_pservers "$tag" 2 --trainers 2 --checkpoint-dir "$CK" --checkpoint-every 50 --log-every 50 "$@"
  S0=${SPIDS[0]} S1=${SPIDS[1]}
  start "$tag-t0" "$BIN/trainer" --mode pserver --pservers "$PS" --trainers 2 --id 0 "${COMMON[@]}" --recover-timeout 2 \
    --export "$SCRATCH/$tag.safetensors"; T0=$LAST_PID
  start "$tag-t1" "$BIN/trainer" --mode pserver --pservers "$PS" --trainers 2 --id 1 "${COMMON[@]}" --recover-timeout 2; T1=$LAST_PID
}
run_job b
for _ in $(seq 300); do
  grep -qE "checkpoint at step (1[0-9]{2}|[2-9][0-9]{2})" "$SCRATCH/b-s0.log" 2>/dev/null && break
  sleep 0.05
done
kill -TERM "$S0" "$S1"
for who in S0 S1; do
  status=0; wait_for "${!who}" 20 || status=$?
  [ "$status" -eq 0 ] || fail "SIGTERM: pserver $who exited $status"
done
for who in T0 T1; do wait_for "${!who}" 30 >/dev/null 2>&1 || true; done
stopped=$(grep -o "stopping on SIGTERM at step [0-9]*" "$SCRATCH/b-s0.log" | grep -o "[0-9]*$")
echo "pservers stopped at step ${stopped:-?}" >&2
[ -n "$stopped" ] && [ "$stopped" -lt 400 ] || fail "the pservers were not stopped mid-run (step ${stopped:-?})"
steps_of() { ls "$CK" | sed -n "s/^pserver-$1-of-2-step-0*\([0-9][0-9]*\)\.safetensors$/\1/p" | sort -n; }
both=$(comm -12 <(steps_of 0 | sort) <(steps_of 1 | sort) | sort -n | tail -1)
echo "newest step both pservers hold: ${both:-none}" >&2
[ -n "$both" ] && [ "$both" -ge 100 ] || { fail "no common checkpoint step >= 100"; finish; }
steps_of 0 | grep -qx "$stopped" || fail "pserver 0 left no checkpoint at its stop step $stopped"

# Resume: the job continues where it stopped and ends bitwise equal to run a.
cp -r "$CK" "$SCRATCH/ck-copy"
stopped=$both
run_job c --resume --resume-step "$both"
for who in T0 T1 S0 S1; do
  status=0; wait_for "${!who}" 120 || status=$?
  [ "$status" -eq 0 ] || fail "resumed job: $who exited $status"
done
grep -q "resumed from .* at step $stopped" "$SCRATCH/c-s0.log" || fail "pserver 0 did not resume at $stopped"
grep -q "resuming at step $stopped" "$SCRATCH/c-t0.log" || fail "trainer 0 did not resume at $stopped"
cmp -s "$SCRATCH/a.safetensors" "$SCRATCH/c.safetensors" ||
  fail "the resumed run's parameters differ from the uninterrupted run's"

# --resume-if-present on 3 pservers with only 2 pservers' checkpoints there
# neither starts fresh (dropping them) nor re-shards unasked: it says so.
PS_OF_3="127.0.0.1:1,127.0.0.1:2,127.0.0.1:3"
expect_exit 2 "holds checkpoints of 2 pservers" -- "$BIN/pserver" --pservers "$PS_OF_3" --id 0 \
  --trainers 2 --checkpoint-dir "$SCRATCH/ck-copy" --resume-if-present
# Re-sharding: the same checkpoint resumed on 3 pservers ends bitwise equal
# too (each parameter's update is the same whichever pserver holds it).
cp -r "$SCRATCH/ck-copy" "$SCRATCH/ck-reshard"
PS_OF_2=$PS
start_pservers d 3 --trainers 2 --checkpoint-dir "$SCRATCH/ck-reshard" --checkpoint-every 50 \
  --resume --resume-step "$both"
D=("${SPIDS[@]}")
start d-t0 "$BIN/trainer" --mode pserver --pservers "$PS" --trainers 2 --id 0 "${COMMON[@]}" \
  --recover-timeout 2 --export "$SCRATCH/d.safetensors"; T0=$LAST_PID
start d-t1 "$BIN/trainer" --mode pserver --pservers "$PS" --trainers 2 --id 1 "${COMMON[@]}" \
  --recover-timeout 2; T1=$LAST_PID
for pid in "$T0" "$T1" "${D[@]}"; do
  status=0; wait_for "$pid" 120 || status=$?
  [ "$status" -eq 0 ] || fail "re-sharded job: process $pid exited $status"
done
grep -q "re-sharded step $both from the 2 files of 2 pservers onto pserver 2 of 3" "$SCRATCH/d-s2.log" ||
  fail "pserver 2 of 3 did not re-shard step $both: $(grep -m1 ERROR "$SCRATCH/d-s2.log")"
cmp -s "$SCRATCH/a.safetensors" "$SCRATCH/d.safetensors" ||
  fail "the re-sharded run's parameters differ from the uninterrupted run's"
PS=$PS_OF_2

# Refusals: a corrupted byte, a missing file, another layout.
BAD="$SCRATCH/bad"
cp -r "$SCRATCH/ck-copy" "$BAD"
file="$BAD/$(printf 'pserver-0-of-2-step-%09d.safetensors' "$both")"
size=$(stat -c %s "$file")
flip_bit "$file" $((size - 100))
expect_exit 2 "CRC-32C" -- "$BIN/pserver" --pservers "$PS" --id 0 --trainers 2 --checkpoint-dir "$BAD" \
  --resume --resume-step "$both"
expect_exit 2 "no checkpoint of pserver 0 of 2" -- "$BIN/pserver" --pservers "$PS" --id 0 --trainers 2 \
  --checkpoint-dir "$SCRATCH" --resume
expect_exit 2 "was written for 2 trainers; --trainers is 3" -- "$BIN/pserver" --pservers "$PS" --id 0 \
  --trainers 3 --checkpoint-dir "$SCRATCH/ck-copy" --resume --resume-step "$both"
finish
