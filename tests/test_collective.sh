#!/usr/bin/env bash
# Collective mode under mpirun (2 ranks over TCP): after 40 steps its
# parameters equal sync pserver mode's (2 trainers, 2 pservers) and local
# training's with the global batch, to 2e-6; ranks that disagree on the job,
# or on PADDLE_TRAINER_ID/NUM, stop at start naming the rank and the field;
# a killed rank makes the job end (no hang); the launcher says when mpirun is
# missing. Skipped (77) where the build has no MPI.
. "$(dirname "$0")/lib.sh"
require_data
LAUNCH="$(dirname "$0")/../scripts/launch"
if "$BIN/trainer" --mode collective --train-samples 10 2>&1 | grep -q "this build has no MPI"; then
  echo "SKIP: this build has no MPI" >&2
  exit 77
fi
MPIRUN=(mpirun --oversubscribe --mca btl tcp,self)
[ "$(id -u)" -eq 0 ] && MPIRUN+=(--allow-run-as-root)
COMMON=(--train-samples 6400 --test-samples 500 --max-steps 40 --optimizer momentum --lr 0.05
        --lr-schedule constant --seed 3 --progress-interval 0)

# 1. Collective = sync pserver = local with the global batch.
timeout 120 "$LAUNCH" --bin "$BIN" --mode collective --trainers 2 --quiet --log-dir "$SCRATCH/coll" \
  -- "${COMMON[@]}" --batch 32 --export "$SCRATCH/collective.safetensors" >"$SCRATCH/coll.log" 2>&1 ||
  fail "collective run failed: $(tail -5 "$SCRATCH/coll.log")"
timeout 120 "$LAUNCH" --bin "$BIN" --pservers 2 --trainers 2 --quiet --log-dir "$SCRATCH/ps" \
  -- "${COMMON[@]}" --batch 32 --export "$SCRATCH/sync.safetensors" >"$SCRATCH/ps.log" 2>&1 ||
  fail "pserver run failed: $(tail -5 "$SCRATCH/ps.log")"
"$BIN/trainer" "${COMMON[@]}" --batch 64 --export "$SCRATCH/local.safetensors" 2>"$SCRATCH/local.log" ||
  fail "local run failed"
PYTHONPATH="$(dirname "$0")" "$PY" - "$SCRATCH" <<'PY' || fail "parameter comparison"
import sys
from safetensors_read import load, max_difference
d = sys.argv[1]
coll, sync, local = (load(f"{d}/{m}.safetensors") for m in ("collective", "sync", "local"))
for name, other in (("sync pserver", sync), ("local", local)):
    worst = max_difference(coll, other)
    print(f"max |collective - {name}| = {worst:.3g}")
    assert worst <= 2e-6, f"collective and {name} differ by {worst}"
PY

# 2. Ranks that disagree on the job.
status=0
timeout 60 "${MPIRUN[@]}" -np 1 "$BIN/trainer" --mode collective "${COMMON[@]}" --batch 64 : \
  -np 1 "$BIN/trainer" --mode collective "${COMMON[@]}" --batch 32 >"$SCRATCH/mismatch.log" 2>&1 || status=$?
[ "$status" -ne 0 ] || fail "mismatched ranks: mpirun exited 0"
grep -q "rank 1's configuration differs from rank 0's: batch 32 vs 64" "$SCRATCH/mismatch.log" ||
  fail "mismatched ranks: message: $(grep ERROR "$SCRATCH/mismatch.log" | head -2)"

# 3. Paddle variables that contradict mpirun.
status=0
PADDLE_TRAINERS_NUM=3 timeout 60 "${MPIRUN[@]}" -np 2 "$BIN/trainer" --mode collective "${COMMON[@]}" \
  >"$SCRATCH/env.log" 2>&1 || status=$?
[ "$status" -ne 0 ] || fail "PADDLE_TRAINERS_NUM=3 with 2 ranks: mpirun exited 0"
grep -q "PADDLE_TRAINERS_NUM=3 but the MPI launcher made this job's rank count 2" "$SCRATCH/env.log" ||
  fail "env mismatch: message: $(grep ERROR "$SCRATCH/env.log" | head -1)"

# 4. A rank that dies: the job ends instead of hanging.
timeout 120 "$LAUNCH" --bin "$BIN" --mode collective --trainers 2 --quiet --log-dir "$SCRATCH/kill" \
  -- --epochs 50 --train-samples 20000 --test-samples 100 --progress-interval 0 \
  >"$SCRATCH/kill.log" 2>&1 &
launch_pid=$!
PIDS+=("$launch_pid")
victim=""
for _ in $(seq 100); do
  victim=$(grep -o "trainer\[[0-9]*\] INFO training" "$SCRATCH/kill/trainer1.log" 2>/dev/null | grep -o "[0-9]*" | head -1)
  [ -n "$victim" ] && break
  sleep 0.1
done
if [ -z "$victim" ]; then
  fail "rank death: rank 1 never started"
else
  sleep 0.5
  kill -9 "$victim"
  status=0
  wait_for "$launch_pid" 60 || status=$?
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ] || fail "rank death: launcher status $status (124: hung)"
fi

# 5. No mpirun on the PATH.
status=0
PATH=/nonexistent "$PY" "$LAUNCH" --bin "$BIN" --mode collective --trainers 2 \
  >"$SCRATCH/nompi.log" 2>&1 || status=$?
[ "$status" -eq 2 ] || fail "no mpirun: launcher exited $status, expected 2"
grep -q "needs mpirun" "$SCRATCH/nompi.log" || fail "no mpirun: message: $(tail -1 "$SCRATCH/nompi.log")"
finish
