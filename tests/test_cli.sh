#!/usr/bin/env bash
# The trainer's command line: --help, and every bad input refused with exit
# status 2 and a one-line reason before any training starts.
. "$(dirname "$0")/lib.sh"
require_data
T="$BIN/trainer"

# --help: exit 0, every flag with its default.
out=$("$T" --help) || fail "--help exited non-zero"
for want in "--data" "--model" "--epochs" "--batch" "--optimizer" "--lr" "--seed" "--threads" \
            "--device" "--metrics" "64 for mlp, 512 for ctr" "PSTRAIN_EPOCHS"; do
  grep -qF -- "$want" <<<"$out" || fail "--help lacks $want"
done

no_training() { grep -q "training mlp" "$SCRATCH/stderr" && fail "training started on bad input: $*"; true; }

expect_exit 2 "unknown option '--bogus'" -- "$T" --bogus 1
expect_exit 2 "'rmsprop' is not one of sgd|momentum|adam" -- "$T" --optimizer rmsprop
expect_exit 2 "--batch: -1 is outside" -- "$T" --batch -1
expect_exit 2 "--batch: -3 is outside" -- "$T" --batch -3
expect_exit 2 "--epochs: -3 is outside" -- "$T" --epochs -3
expect_exit 2 "--epochs: 'two' is not an integer" -- "$T" --epochs two
expect_exit 2 "environment variable PSTRAIN_BATCH: 70000 is outside" -- env PSTRAIN_BATCH=70000 "$T"

# Data problems, each naming the file.
expect_exit 2 "$SCRATCH/none/train-images-idx3-ubyte: No such file" -- "$T" --data "$SCRATCH/none"
mkdir -p "$SCRATCH/magic" "$SCRATCH/trunc" "$SCRATCH/count"
for d in magic trunc count; do
  cp "$DATA"/t10k-* "$SCRATCH/$d/"
done
# wrong magic: labels where the images should be
cp "$DATA/train-labels-idx1-ubyte.gz" "$SCRATCH/magic/train-images-idx3-ubyte.gz"
cp "$DATA/train-labels-idx1-ubyte.gz" "$SCRATCH/magic/"
expect_exit 2 "wrong magic number 0x00000801" -- "$T" --data "$SCRATCH/magic"
no_training magic
# truncated: the first 100000 bytes of the uncompressed images, plain
gzip -dc "$DATA/train-images-idx3-ubyte.gz" | head -c 100000 >"$SCRATCH/trunc/train-images-idx3-ubyte"
cp "$DATA/train-labels-idx1-ubyte.gz" "$SCRATCH/trunc/"
expect_exit 2 "file is truncated" -- "$T" --data "$SCRATCH/trunc"
# image and label counts that disagree: test labels beside training images
cp "$DATA/train-images-idx3-ubyte.gz" "$SCRATCH/count/"
cp "$DATA/t10k-labels-idx1-ubyte.gz" "$SCRATCH/count/train-labels-idx1-ubyte.gz"
expect_exit 2 "holds 60000 images but" -- "$T" --data "$SCRATCH/count"
# a corrupt gzip stream
mkdir -p "$SCRATCH/gz"
cp "$DATA"/t10k-* "$DATA/train-labels-idx1-ubyte.gz" "$SCRATCH/gz/"
head -c 300000 "$DATA/train-images-idx3-ubyte.gz" >"$SCRATCH/gz/train-images-idx3-ubyte.gz"
printf 'garbage-garbage-garbage' >>"$SCRATCH/gz/train-images-idx3-ubyte.gz"
expect_exit 2 "train-images-idx3-ubyte.gz" -- "$T" --data "$SCRATCH/gz"

# A model that does not fit the data.
expect_exit 2 "first layer takes 100 inputs but the images have 28 x 28 = 784" -- \
  "$T" --model mlp:100,10 --train-samples 10
expect_exit 2 "last layer has 7 outputs but the data has 10 classes" -- \
  "$T" --model mlp:784,7 --train-samples 10
expect_exit 2 "expected mlp:" -- "$T" --model resnet50
expect_exit 2 "--export-replicas is for the CTR models in collective mode" -- "$T" --export-replicas
expect_exit 2 "--overlap is for the MLP in pserver mode with --update sync" -- "$T" --overlap
expect_exit 2 "--overlap is for the MLP in pserver mode with --update sync (here: --mode pserver, --update async" \
  -- "$T" --mode pserver --pservers 127.0.0.1:1 --update async --overlap

# A device this build or machine cannot give: exit 2 saying which; auto falls
# back to the CPU and says why.
expect_exit 2 "--device cuda: " -- "$T" --device cuda --train-samples 10
if [ -n "$(command -v nvidia-smi)" ] && nvidia-smi -L >/dev/null 2>&1; then
  echo "a GPU is visible: the no-GPU checks of --device are left to scripts/gpu-check" >&2
else
  grep -qE "no GPU is visible|no CUDA backend" "$SCRATCH/stderr" ||
    fail "--device cuda did not say why: $(tail -c 300 "$SCRATCH/stderr")"
  expect_exit 0 "device auto: " -- "$T" --device auto --epochs 1 --train-samples 200 --test-samples 100
  grep -q "using the CPU" "$SCRATCH/stderr" || fail "--device auto did not say it used the CPU"
fi

# An unwritable metrics file is refused before training.
expect_exit 2 "--metrics $SCRATCH/none/m.jsonl: cannot open" -- \
  "$T" --metrics "$SCRATCH/none/m.jsonl" --train-samples 10
no_training metrics

# Flags beat the environment, which beats the defaults (seen in the start-up line).
expect_exit 0 "epochs=1 batch=50" -- env PSTRAIN_EPOCHS=4 PSTRAIN_BATCH=50 \
  "$T" --epochs 1 --train-samples 200 --test-samples 100
finish
