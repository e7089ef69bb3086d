#!/usr/bin/env bash
# Collective mode on GPUs (label "gpu"): 2 ranks, one GPU each, all-reduce
# through NCCL; 40 steps give the parameters of the same run on CPUs within
# 1e-4 (relative to the largest). Skipped (77) without MPI, NCCL or 2 GPUs.
. "$(dirname "$0")/lib.sh"
require_data
LAUNCH="$(dirname "$0")/../scripts/launch"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU" || true)
if [ "${gpus:-0}" -lt 2 ]; then echo "SKIP: fewer than 2 GPUs are visible" >&2; exit 77; fi
if ! ldd "$BIN/trainer" | grep -q libnccl; then echo "SKIP: this build has no NCCL" >&2; exit 77; fi
COMMON=(--train-samples 6400 --test-samples 500 --max-steps 40 --optimizer momentum --lr 0.05
        --lr-schedule constant --seed 3 --progress-interval 0 --batch 32)
for device in cuda cpu; do
  timeout 300 "$LAUNCH" --bin "$BIN" --mode collective --trainers 2 --quiet \
    --log-dir "$SCRATCH/$device" -- "${COMMON[@]}" --device "$device" \
    --export "$SCRATCH/$device.safetensors" >"$SCRATCH/$device.log" 2>&1 ||
    { fail "$device run failed: $(tail -5 "$SCRATCH/$device.log")"; finish; }
done
grep -q "all-reduced by NCCL" "$SCRATCH/cuda/trainer0.log" || fail "the GPU run did not use NCCL"
PYTHONPATH="$(dirname "$0")" "$PY" - "$SCRATCH" <<'PY' || fail "GPU vs CPU parameters"
import sys
from safetensors_read import load, max_difference
worst = max_difference(load(sys.argv[1] + "/cuda.safetensors"), load(sys.argv[1] + "/cpu.safetensors"),
                       relative=True)
print(f"max relative |gpu - cpu| = {worst:.3g}")
assert worst <= 1e-4
PY
finish
