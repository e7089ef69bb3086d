#!/usr/bin/env bash
# A short training run on a slice of the real data must learn: 2 epochs on
# 12,000 Fashion-MNIST samples reach >= 0.78 test accuracy on 2,000 test
# samples with the default recipe, the loss falls, and the metrics file has
# one well-formed line per epoch. The same seed gives the same result twice.
. "$(dirname "$0")/lib.sh"
require_data
T="$BIN/trainer"
M="$SCRATCH/metrics.jsonl"

"$T" --epochs 2 --train-samples 12000 --test-samples 2000 --metrics "$M" \
  2>"$SCRATCH/log" || { fail "trainer exited $?: $(tail -5 "$SCRATCH/log")"; finish; }
grep -q "epoch 2/2 done" "$SCRATCH/log" || fail "no epoch summary line"

"$PY" - "$M" <<'PY' || fail "metrics check"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
assert len(rows) == 2, f"{len(rows)} metrics lines, expected 2"
for i, r in enumerate(rows, 1):
    assert set(r) == {"epoch", "train_loss", "test_accuracy", "samples_per_s", "wall_s", "mode",
                      "trainers", "comm_share", "bytes_per_step"}, r
    assert r["trainers"] == 1 and r["comm_share"] == 0 and r["bytes_per_step"] == 0, r
    assert r["epoch"] == i and r["mode"] == "local", r
    assert r["samples_per_s"] > 0 and r["wall_s"] > 0, r
assert rows[1]["train_loss"] < rows[0]["train_loss"], "loss did not fall"
assert rows[1]["wall_s"] > rows[0]["wall_s"]
acc = rows[-1]["test_accuracy"]
assert acc >= 0.78, f"test accuracy {acc} < 0.78"
print(f"short run: test accuracy {acc:.4f}, train loss {rows[-1]['train_loss']:.4f}")
PY

# Same seed, same numbers; another seed, other numbers.
run_loss() {
  rm -f "$SCRATCH/m1"
  "$T" --epochs 1 --train-samples 3000 --test-samples 500 --seed "$1" --metrics "$SCRATCH/m1" \
    2>/dev/null || fail "trainer with seed $1 failed"
  "$PY" -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["train_loss"])' "$SCRATCH/m1"
}
a=$(run_loss 5); b=$(run_loss 5); c=$(run_loss 6)
[ "$a" = "$b" ] || fail "seed 5 gave train loss $a then $b"
[ "$a" != "$c" ] || fail "seeds 5 and 6 gave the same train loss $a"
finish
