#!/usr/bin/env bash
# Slurm: a private single-node Slurm (scripts/slurm/local-slurm) runs
# `srun -n 2`, then the sbatch example (scripts/slurm/pstrain.sbatch) with 2
# pservers and 2 trainers taking their ids from srun; the job ends bitwise
# equal to the same job under scripts/launch. Skipped, with the reason, where
# Slurm cannot start; everything started here is stopped.
source "$(dirname "$0")/lib.sh"
require_data
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$(cd "$BIN" && pwd)
SLURM_DIR="$SCRATCH/slurm"
trap '"$ROOT/scripts/slurm/local-slurm" stop "$SLURM_DIR" 2>/dev/null; cleanup' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
COMMON=(--train-samples 6400 --test-samples 500 --max-steps 40 --optimizer momentum --lr 0.05
        --lr-schedule constant --seed 3 --progress-interval 0 --batch 32)

status=0
out=$("$ROOT/scripts/slurm/local-slurm" start "$SLURM_DIR" 2>"$SCRATCH/slurm.err") || status=$?
if [ "$status" -eq 77 ]; then echo "SKIP: $(cat "$SCRATCH/slurm.err")" >&2; exit 77; fi
[ "$status" -eq 0 ] || { echo "FAIL: local-slurm start: $(cat "$SCRATCH/slurm.err")" >&2; exit 1; }
eval "$out"
pids=$(sed 's/.*=//' "$SLURM_DIR/pids")

tasks=$(timeout 60 srun -n 2 sh -c 'echo $SLURM_PROCID/$SLURM_NTASKS' | sort | tr '\n' ' ')
[ "$tasks" = "0/2 1/2 " ] || fail "srun -n 2 ran '$tasks'"

unset PADDLE_PSERVERS_IP_PORT_LIST PADDLE_TRAINER_ID PADDLE_PSERVER_ID PADDLE_TRAINERS_NUM TRAINING_ROLE
timeout 300 "$ROOT/scripts/launch" --bin "$BIN" --pservers 2 --trainers 2 --quiet \
  --log-dir "$SCRATCH/loopback" -- "${COMMON[@]}" --export "$SCRATCH/loopback.safetensors" \
  >"$SCRATCH/launch.log" 2>&1 || fail "loopback run failed: $(tail -5 "$SCRATCH/launch.log")"

mkdir -p "$SCRATCH/submit"
port=$(free_ports 1)
(cd "$SCRATCH/submit" && PSTRAIN_BIN=$BIN PSTRAIN_PORT=$port timeout 300 sbatch --wait --quiet \
  --nodes 1 --ntasks 4 --output="$SCRATCH/job.out" "$ROOT/scripts/slurm/pstrain.sbatch" \
  "${COMMON[@]}" --export "$SCRATCH/slurm.safetensors") || fail "sbatch job failed: $(tail -5 "$SCRATCH/job.out")"
for id in 0 1; do
  grep -q "starting pserver $id of 2 (id from SLURM_PROCID)" "$SCRATCH/job.out" ||
    fail "pserver $id did not take its id from srun"
  grep -q "registered with 2 pserver(s) as trainer $id of 2" "$SCRATCH/job.out" ||
    fail "trainer $id did not take its id and count from srun"
done
cmp -s "$SCRATCH/loopback.safetensors" "$SCRATCH/slurm.safetensors" ||
  fail "the Slurm job's model differs from the same job under scripts/launch"
[ -z "$(ls -A "$SCRATCH/submit")" ] || fail "the job left files in its submit folder: $(ls -A "$SCRATCH/submit")"

"$ROOT/scripts/slurm/local-slurm" stop "$SLURM_DIR"
for pid in $pids; do kill -0 "$pid" 2>/dev/null && fail "Slurm daemon $pid still runs after stop"; done
finish
