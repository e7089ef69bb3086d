#!/usr/bin/env bash
# The CUDA module (libpstrain_cuda.so) is loaded only when a GPU is wanted:
# nothing CUDA is linked into the trainer or the pserver; --device cpu opens
# no CUDA library; --device auto, where the CUDA driver sees no GPU, neither
# (and says why it uses the CPU); --device cuda loads the module with every
# symbol resolved (RTLD_NOW) and says why no GPU can be used; the module is
# found beside the trainer or in ../lib/pstrain, and a missing or foreign
# one is named with the loader's reason. A build without CUDA has no module:
# only its refusal is checked.
. "$(dirname "$0")/lib.sh"
require_data
T="$BIN/trainer"
M="$BIN/libpstrain_cuda.so"
run=(--train-samples 64 --test-samples 64 --epochs 1 --max-steps 1 --progress-interval 0)

for b in trainer pserver; do
  if ldd "$BIN/$b" | grep -E "libcu|libnccl" >&2; then fail "$b links a CUDA library"; fi
done
if [ ! -f "$M" ]; then
  expect_exit 2 "this build has no CUDA backend" -- "$T" --device cuda "${run[@]}"
  finish
fi
ldd "$M" | grep -q libcublas || fail "the module does not link cuBLAS"

# LD_DEBUG=files: every library the dynamic loader opens, dlopen's included.
cuda_opened() {
  grep -oE "file=[^ ]*(libcudart|libcublas|libcudnn|libnccl|libpstrain_cuda)[^ ]*" "$SCRATCH/stderr" |
    sort -u | tr '\n' ' '
}

expect_exit 0 "done:" -- env LD_DEBUG=files "$T" --device cpu "${run[@]}"
libs=$(cuda_opened)
[ -z "$libs" ] || fail "--device cpu opened $libs"

expect_exit 0 "done:" -- env LD_DEBUG=files "$T" --device auto "${run[@]}"
if grep -q "device auto: using GPU" "$SCRATCH/stderr"; then
  echo "a GPU is visible: auto took it; the no-GPU checks are left to scripts/gpu-check" >&2
  finish
fi
grep -qE "device auto: no GPU is visible \(.+\): using the CPU" "$SCRATCH/stderr" ||
  fail "--device auto did not say why it used the CPU: $(grep "device auto" "$SCRATCH/stderr")"
# Decided by the driver alone (no driver, or cuInit or cuDeviceGetCount said
# so): then not even the module was loaded.
if ! grep -q "cudaGetDeviceCount" "$SCRATCH/stderr"; then
  libs=$(cuda_opened)
  [ -z "$libs" ] || fail "--device auto without a GPU opened $libs"
fi

# cuda: the module loads (every symbol resolves against the trainer) and its
# device count says why there is no GPU.
expect_exit 2 "--device cuda: no GPU is visible (cudaGetDeviceCount: " -- \
  env LD_DEBUG=files "$T" --device cuda "${run[@]}"
grep -q "file=$M " "$SCRATCH/stderr" || grep -q "file=.*libpstrain_cuda.so" "$SCRATCH/stderr" ||
  fail "--device cuda did not load the module"

# Where the module is looked for, and what a bad one says.
mkdir -p "$SCRATCH/bin" "$SCRATCH/lib/pstrain"
cp "$T" "$SCRATCH/bin/trainer"
expect_exit 2 "--device cuda: the CUDA module libpstrain_cuda.so is neither in $SCRATCH/bin nor in" -- \
  "$SCRATCH/bin/trainer" --device cuda "${run[@]}"
cp "$M" "$SCRATCH/lib/pstrain/"
expect_exit 2 "--device cuda: no GPU is visible (cudaGetDeviceCount: " -- \
  "$SCRATCH/bin/trainer" --device cuda "${run[@]}"
expect_exit 2 "the CUDA module failed to load: $SCRATCH/none.so: cannot open shared object file" -- \
  env PSTRAIN_CUDA_MODULE="$SCRATCH/none.so" "$T" --device cuda "${run[@]}"
libz=$(ldd "$T" | awk '/libz\.so/ {print $3; exit}')
expect_exit 2 "$libz is no pstrain CUDA module: " -- \
  env PSTRAIN_CUDA_MODULE="$libz" "$T" --device cuda "${run[@]}"
grep -q "undefined symbol: pstrain_cuda_module" "$SCRATCH/stderr" || fail "no dlerror text: $(tail -c 300 "$SCRATCH/stderr")"
finish
