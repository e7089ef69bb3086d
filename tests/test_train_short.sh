#!/usr/bin/env bash
# A short training run on a slice of the real data must learn: 2 epochs on
# 12,000 Fashion-MNIST samples reach >= 0.78 test accuracy on 2,000 test
# samples with the default recipe, the loss falls, and the metrics file has
# one well-formed line per epoch. --export writes a safetensors file whose
# names and shapes are PyTorch's (fc1.weight (256, 784), ...) and whose
# weights, run through a forward pass in numpy on the same test samples,
# give the accuracy the trainer reported. The same seed gives the same
# result twice.
. "$(dirname "$0")/lib.sh"
require_data
T="$BIN/trainer"
M="$SCRATCH/metrics.jsonl"

"$T" --epochs 2 --train-samples 12000 --test-samples 2000 --metrics "$M" \
  --export "$SCRATCH/model.safetensors" 2>"$SCRATCH/log" ||
  { fail "trainer exited $?: $(tail -5 "$SCRATCH/log")"; finish; }
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

PYTHONPATH="$(dirname "$0")" "$PY" - "$SCRATCH/model.safetensors" "$M" "$DATA" <<'PY' || fail "export check"
import gzip, json, sys
import numpy as np
from safetensors_read import load
model = load(sys.argv[1])
want = {"fc1.weight": (256, 784), "fc1.bias": (256,), "fc2.weight": (128, 256), "fc2.bias": (128,),
        "fc3.weight": (10, 128), "fc3.bias": (10,)}
assert {k: v.shape for k, v in model.items()} == want, {k: v.shape for k, v in model.items()}
def idx(path, offset):
    return np.frombuffer(gzip.open(path).read(), np.uint8, offset=offset)
x = idx(sys.argv[3] + "/t10k-images-idx3-ubyte.gz", 16).reshape(-1, 784)[:2000].astype(np.float32) / 255
y = idx(sys.argv[3] + "/t10k-labels-idx1-ubyte.gz", 8)[:2000]
h = x
for layer in (1, 2, 3):
    h = h @ model[f"fc{layer}.weight"].T + model[f"fc{layer}.bias"]
    if layer < 3:
        h = np.maximum(h, 0)
numpy_acc = float((h.argmax(1) == y).mean())
trainer_acc = [json.loads(l) for l in open(sys.argv[2])][-1]["test_accuracy"]
print(f"numpy forward on the export: {numpy_acc:.4f}; the trainer reported {trainer_acc:.4f}")
assert abs(numpy_acc - trainer_acc) <= 0.001, (numpy_acc, trainer_acc)
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
