#!/usr/bin/env bash
# The trainer on a small CIFAR-10 folder this test writes (20 records in
# each of data_batch_1..5.bin and test_batch.bin): --data finds the format
# by itself, an MLP 3072 wide trains a few steps and exits 0, and the log
# gives the training set's channel statistics, the ones computed here. A
# model 784 wide is refused naming the 3x32x32 shape; a missing batch file
# and --data-format idx on the folder are refused naming the file; the
# statistics are part of the job (a pserver refuses other ones).
. "$(dirname "$0")/lib.sh"
T="$BIN/trainer"
D="$SCRATCH/cifar"
mkdir -p "$D"

"$PY" - "$D" >"$SCRATCH/want" <<'PY' || { fail "writing the CIFAR-10 folder"; finish; }
import math, random, sys
r = random.Random(7)
d = sys.argv[1]
sums, squares, n = [0] * 3, [0] * 3, 0
for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
    with open(f"{d}/{name}", "wb") as f:
        for _ in range(20):
            # Channels on different scales, so the statistics differ per channel.
            pixels = [r.randrange(0, 256 >> c) for c in range(3) for _ in range(1024)]
            f.write(bytes([r.randrange(10)] + pixels))
            if name != "test_batch.bin":
                n += 1024
                for c in range(3):
                    plane = pixels[c * 1024:(c + 1) * 1024]
                    sums[c] += sum(plane)
                    squares[c] += sum(p * p for p in plane)
mean = [s / n / 255 for s in sums]
std = [math.sqrt(q / n / 255 ** 2 - m * m) for q, m in zip(squares, mean)]
print("channel mean " + " ".join(f"{m:.4f}" for m in mean) + ", std " +
      " ".join(f"{s:.4f}" for s in std))
PY

"$T" --model mlp:3072,32,10 --data "$D" --epochs 1 --max-steps 5 2>"$SCRATCH/log" ||
  fail "trainer exited $?: $(tail -5 "$SCRATCH/log")"
grep -q "cifar $D: 100 training images 3x32x32, 20 test" "$SCRATCH/log" ||
  fail "no CIFAR-10 line in the log: $(head -5 "$SCRATCH/log")"
grep -qF "$(cat "$SCRATCH/want")" "$SCRATCH/log" ||
  fail "log lacks '$(cat "$SCRATCH/want")': $(grep cifar "$SCRATCH/log")"
grep -q "epoch 1/1 done" "$SCRATCH/log" || fail "no epoch summary line: $(tail -3 "$SCRATCH/log")"

# --train-samples and --test-samples limit as for IDX.
"$T" --model mlp:3072,32,10 --data "$D" --data-format cifar --epochs 1 --max-steps 2 \
  --train-samples 30 --test-samples 5 2>"$SCRATCH/log2" ||
  fail "trainer with limits exited $?: $(tail -5 "$SCRATCH/log2")"
grep -q "30 training images 3x32x32, 5 test" "$SCRATCH/log2" ||
  fail "limits not applied: $(grep cifar "$SCRATCH/log2")"

# The networks take the images' 3x32x32 shape: resnet20's stem reads three channels.
"$T" --model resnet20 --data "$D" --epochs 1 --max-steps 3 --batch 16 \
  --export "$SCRATCH/r20.safetensors" 2>"$SCRATCH/log3" ||
  fail "resnet20 on CIFAR-10 exited $?: $(tail -5 "$SCRATCH/log3")"
# The export says how images enter the model: the statistics above.
"$PY" - "$SCRATCH/r20.safetensors" "$(cat "$SCRATCH/want")" <<'PY' ||
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    meta = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))["__metadata__"]
mean, std = (list(map(float, p.split(","))) for p in meta["input_norm"].split("/"))
want = sys.argv[2].replace(",", "").split()
assert [f"{v:.4f}" for v in mean] == want[2:5] and [f"{v:.4f}" for v in std] == want[6:9], (meta, want)
PY
  fail "the export's input_norm is not the data's $(cat "$SCRATCH/want")"
grep -q "done: 1 epochs (3 steps)" "$SCRATCH/log3" || fail "resnet20 did not train: $(tail -3 "$SCRATCH/log3")"
grep -q "model=resnet20" "$SCRATCH/log3" || fail "no model in the log"
# The training set's normalization is part of the job: a pserver refuses a
# trainer whose folder has other statistics, naming the field and both
# values, trainer 0's being those computed above.
cp -r "$D" "$SCRATCH/other"
flip_bit "$SCRATCH/other/data_batch_2.bin" 500 6
JOB=(--model resnet20 --epochs 1 --max-steps 2 --batch 8 --progress-interval 0)
start_pservers norm 1 --trainers 2
start norm-t0 "$T" "${JOB[@]}" --data "$D" --mode pserver --pservers "$PS" --trainers 2 --id 0
wait_log "$SCRATCH/norm-t0.log" "training resnet20" "$LAST_PID" 60 || fail "trainer 0 did not start"
expect_exit 2 "trainer 1's job differs from trainer 0's in: input normalization" -- "$T" "${JOB[@]}" \
  --data "$SCRATCH/other" --mode pserver --pservers "$PS" --trainers 2 --id 1 --connect-timeout 20
norm=$(sed -n 's/.*job differs from trainer 0.s: input normalization [^ ]* vs \([^ ;]*\).*/\1/p' \
  "$SCRATCH/norm-s0.log" | head -1)
"$PY" - "$norm" "$(cat "$SCRATCH/want")" <<'PY' ||
import sys
mean, std = (list(map(float, p.split(","))) for p in sys.argv[1].split("/"))
want = sys.argv[2].replace(",", "").split()
assert [f"{v:.4f}" for v in mean] == want[2:5] and [f"{v:.4f}" for v in std] == want[6:9], (mean, std, want)
PY
  fail "trainer 0's input normalization '$norm' is not the data's $(cat "$SCRATCH/want")"

expect_exit 2 "network lenet takes 1x28x28 inputs but the images are 3x32x32" -- \
  "$T" --model-file "$(dirname "$0")/../docs/models/lenet.net" --data "$D"

expect_exit 2 "first layer takes 784 inputs but the images are 3x32x32" -- \
  "$T" --model mlp:784,32,10 --data "$D"
expect_exit 2 "train-images-idx3-ubyte" -- "$T" --model mlp:3072,10 --data "$D" --data-format idx
rm "$D/data_batch_3.bin"
expect_exit 2 "data_batch_3.bin" -- "$T" --model mlp:3072,10 --data "$D" --data-format cifar
finish
