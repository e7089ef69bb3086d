#!/usr/bin/env bash
# --wire-dtype in a real job (2 pservers, 2 sync trainers, the default Adam
# recipe on all of Fashion-MNIST): bf16 and fp16 reach the test accuracy of
# f32 within 0.3 points, send half the bytes per step (the trainer's
# --metrics bytes_per_step, sent + received), and two bf16 runs export
# byte-equal models. Other modes refuse the flag. WIRE_EPOCHS sets the epochs
# (2 here; test_wire_dtype_full runs the default 12 and leaves out the second
# bf16 run: whether two runs are equal does not depend on their length).
. "$(dirname "$0")/lib.sh"
require_data
LAUNCH="$(dirname "$0")/../scripts/launch"
EPOCHS=${WIRE_EPOCHS:-2}
COMMON=(--epochs "$EPOCHS" --seed 3 --progress-interval 0)

expect_exit 2 "--wire-dtype bf16 is for pserver mode; --mode local sends nothing" -- \
  "$BIN/trainer" --wire-dtype bf16
expect_exit 2 "--wire-dtype fp16 is for pserver mode; --mode collective all-reduces float32" -- \
  "$BIN/trainer" --mode collective --wire-dtype fp16
expect_exit 2 "'int8' is not one of f32|bf16|fp16" -- "$BIN/trainer" --mode pserver --wire-dtype int8

runs=(f32 bf16 bf16-again fp16)
[ "$EPOCHS" -gt 2 ] && runs=(f32 bf16 fp16)
for run in "${runs[@]}"; do
  dtype=${run%-again}
  timeout 600 "$LAUNCH" --bin "$BIN" --pservers 2 --trainers 2 --quiet \
    --log-dir "$SCRATCH/logs-$run" -- "${COMMON[@]}" --wire-dtype "$dtype" \
    --metrics "$SCRATCH/$run.jsonl" --export "$SCRATCH/$run.safetensors" \
    >"$SCRATCH/launch-$run.log" 2>&1 || fail "$run run failed: $(tail -5 "$SCRATCH/launch-$run.log")"
done
if [ -f "$SCRATCH/bf16-again.safetensors" ]; then
  cmp -s "$SCRATCH/bf16.safetensors" "$SCRATCH/bf16-again.safetensors" ||
    fail "two bf16 sync runs exported different models"
fi
# The pservers' job line names the dtype (the job hash covers it).
grep -q "wire_dtype=bf16" "$SCRATCH/logs-bf16"/pserver0.log ||
  fail "pserver 0 of the bf16 run does not log wire_dtype=bf16 in its job"
if grep -q "wire_dtype" "$SCRATCH/logs-f32"/pserver0.log; then
  fail "an f32 job's text names its wire dtype (its hash would change)"
fi

"$PY" - "$SCRATCH" "$EPOCHS" <<'PY' || fail "accuracy or bytes per step"
import json, sys
scratch, epochs = sys.argv[1], int(sys.argv[2])
def last(run):
    rows = [json.loads(l) for l in open(f"{scratch}/{run}.jsonl")]
    assert len(rows) == epochs, f"{run}: {len(rows)} epochs written"
    return rows[-1]
f32 = last("f32")
assert f32["test_accuracy"] > 0.84, f"f32 reached only {f32['test_accuracy']}"
for run in ("bf16", "fp16"):
    r = last(run)
    gap = 100 * (r["test_accuracy"] - f32["test_accuracy"])
    ratio = r["bytes_per_step"] / f32["bytes_per_step"]
    print(f"{run}: accuracy {r['test_accuracy']:.4f} (f32 {f32['test_accuracy']:.4f}, "
          f"{gap:+.2f} points), bytes per step {r['bytes_per_step']:.0f} "
          f"(f32 {f32['bytes_per_step']:.0f}, ratio {ratio:.4f})")
    assert abs(gap) <= 0.3, f"{run} accuracy {gap:+.2f} points from f32"
    assert 0.49 <= ratio <= 0.51, f"{run} moves {ratio:.4f} of f32's bytes per step"
PY
finish
