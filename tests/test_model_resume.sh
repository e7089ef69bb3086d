#!/usr/bin/env bash
# Whole-model checkpoints in local and collective mode (label "fault"):
# trainer 0 writes them every --checkpoint-every steps; a run killed mid-way
# and started again with --resume ends with parameters bitwise equal to an
# uninterrupted run's (the optimizer state, step and data position all come
# back). A corrupted byte, another job and a missing checkpoint are refused
# by name.
. "$(dirname "$0")/lib.sh"
require_data
COMMON=(--train-samples 12800 --test-samples 500 --epochs 3 --batch 32 --optimizer adam
        --lr 0.002 --seed 9 --progress-interval 0)

# kill_after_checkpoint LOG PID STEP DIR: SIGKILLs PID once LOG shows a checkpoint at STEP or
# later; prints the newest checkpoint's step in DIR then (on a loaded machine the trainer
# may have written another between the log line and the kill).
kill_after_checkpoint() {
  local log=$1 pid=$2 at=$3 dir=$4 step
  for _ in $(seq 3000); do
    step=$(grep -o "checkpoint at step [0-9]*" "$log" 2>/dev/null | tail -1 | grep -o "[0-9]*$")
    if [ -n "$step" ] && [ "$step" -ge "$at" ]; then
      kill -KILL "$pid" 2>/dev/null
      wait "$pid" 2>/dev/null
      step=$(ls "$dir" | grep -o "step-[0-9]*\.safetensors$" | grep -o "[0-9]*" | sort -n | tail -1)
      echo "$((10#$step))"
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.02
  done
  return 1
}

# 1. Local mode.
"$BIN/trainer" "${COMMON[@]}" --export "$SCRATCH/local-a.safetensors" 2>"$SCRATCH/local-a.log" ||
  { fail "local run failed: $(tail -3 "$SCRATCH/local-a.log")"; finish; }
CK="$SCRATCH/ck-local"
start local-b "$BIN/trainer" "${COMMON[@]}" --checkpoint-dir "$CK" --checkpoint-every 50
killed=$(kill_after_checkpoint "$SCRATCH/local-b.log" "$LAST_PID" 200 "$CK") ||
  { fail "local: no checkpoint at step 200 or later before the end"; finish; }
echo "local: killed after the checkpoint at step $killed" >&2
grep -q "done:" "$SCRATCH/local-b.log" && fail "local: the run ended before the kill"
cp -r "$CK" "$SCRATCH/ck-copy"
"$BIN/trainer" "${COMMON[@]}" --checkpoint-dir "$CK" --checkpoint-every 50 --resume \
  --export "$SCRATCH/local-c.safetensors" 2>"$SCRATCH/local-c.log" ||
  fail "local resume failed: $(tail -3 "$SCRATCH/local-c.log")"
grep -q "resuming from .*model-step-0*$killed.safetensors at step $killed" "$SCRATCH/local-c.log" ||
  fail "local: did not resume at step $killed: $(grep resum "$SCRATCH/local-c.log")"
cmp -s "$SCRATCH/local-a.safetensors" "$SCRATCH/local-c.safetensors" ||
  fail "local: the resumed run's parameters differ from the uninterrupted run's"
ls "$CK" | grep -c "^model-step-.*\.safetensors$" | grep -qx 3 || fail "local: not exactly 3 checkpoints kept"

# Refusals, each naming the file and the reason.
file="$SCRATCH/ck-copy/$(printf 'model-step-%09d.safetensors' "$killed")"
expect_exit 2 "is another job's (this job vs the file's: optimizer adam lr=0.001" -- "$BIN/trainer" "${COMMON[@]}" --lr 0.001 \
  --checkpoint-dir "$SCRATCH/ck-copy" --resume --resume-step "$killed"
size=$(stat -c %s "$file")
flip_bit "$file" $((size - 7))
expect_exit 2 "CRC-32C" -- "$BIN/trainer" "${COMMON[@]}" --checkpoint-dir "$SCRATCH/ck-copy" \
  --resume --resume-step "$killed"
mkdir -p "$SCRATCH/empty"
expect_exit 2 "no model checkpoint" -- "$BIN/trainer" "${COMMON[@]}" --checkpoint-dir "$SCRATCH/empty" --resume
expect_exit 2 "in pserver mode the pservers write checkpoints" -- "$BIN/trainer" --mode pserver \
  --pservers 127.0.0.1:1 --checkpoint-dir "$SCRATCH/empty"

# 2. Collective mode, 2 ranks: rank 0 writes and reads, MPI sends the rest.
if "$BIN/trainer" --mode collective --train-samples 10 2>&1 | grep -q "this build has no MPI"; then
  echo "collective part skipped: this build has no MPI" >&2
  finish
fi
MPIRUN=(mpirun -np 2 --oversubscribe --mca btl tcp,self)
[ "$(id -u)" -eq 0 ] && MPIRUN+=(--allow-run-as-root)
timeout 300 "${MPIRUN[@]}" "$BIN/trainer" --mode collective "${COMMON[@]}" \
  --export "$SCRATCH/coll-a.safetensors" >"$SCRATCH/coll-a.log" 2>&1 ||
  { fail "collective run failed: $(tail -3 "$SCRATCH/coll-a.log")"; finish; }
CK="$SCRATCH/ck-coll"
start coll-b "${MPIRUN[@]}" "$BIN/trainer" --mode collective "${COMMON[@]}" --checkpoint-dir "$CK" \
  --checkpoint-every 50
killed=$(kill_after_checkpoint "$SCRATCH/coll-b.log" "$LAST_PID" 200 "$CK") ||
  { fail "collective: no checkpoint at step 200 or later before the end"; finish; }
echo "collective: killed after the checkpoint at step $killed" >&2
timeout 300 "${MPIRUN[@]}" "$BIN/trainer" --mode collective "${COMMON[@]}" --checkpoint-dir "$CK" \
  --resume --resume-step "$killed" --export "$SCRATCH/coll-c.safetensors" >"$SCRATCH/coll-c.log" 2>&1 ||
  fail "collective resume failed: $(tail -3 "$SCRATCH/coll-c.log")"
grep -q "resuming at step $killed" "$SCRATCH/coll-c.log" || fail "collective: did not resume at $killed"
cmp -s "$SCRATCH/coll-a.safetensors" "$SCRATCH/coll-c.safetensors" ||
  fail "collective: the resumed run's parameters differ from the uninterrupted run's"
finish
