#!/usr/bin/env bash
# --tensorboard (label "integration"): a 2 pserver + 2 trainer sync job on
# Fashion-MNIST with --tensorboard DIR on every process and --metrics on the
# trainers. The tensorboard package (PyPI, in a venv scripts/tensorboard-venv
# makes; skipped, exit 77, when it cannot be installed) then
#  1. reads every event file with its own record reader (CRCs) and
#     EventAccumulator: runs trainer-0, trainer-1, pserver-0, pserver-1;
#     trainer 0's scalars equal the metrics file's rows, every row there;
#     each pserver's equal its statistics lines (tests/tensorboard_check.py);
#  2. serves DIR: `tensorboard --logdir DIR --host 127.0.0.1 --port 0`
#     answers, and its scalars plugin's HTTP API gives trainer 0's accuracy
#     and loss series, equal to the metrics file's.
. "$(dirname "$0")/lib.sh"
require_data
HERE=$(cd "$(dirname "$0")" && pwd)
VENV=$("$HERE/../scripts/tensorboard-venv" 2>"$SCRATCH/venv.log") || {
  echo "SKIP: the tensorboard package could not be installed: $(tail -3 "$SCRATCH/venv.log")" >&2
  exit 77
}
TBPY=$VENV/bin/python

# 2048 samples, 2 trainers, batch 32: 32 steps an epoch, 3 epochs; the
# pservers write a statistics line every 16 steps.
TB=$SCRATCH/tb
M=$SCRATCH/metrics.jsonl
EPOCHS=3 STEPS=32 LOG_EVERY=16
start_pservers tb 2 --trainers 2 --log-every "$LOG_EVERY" --tensorboard "$TB" || finish
TPIDS=()
for i in 0 1; do
  start "tb-t$i" "$BIN/trainer" --mode pserver --pservers "$PS" --trainers 2 --id "$i" \
    --epochs "$EPOCHS" --train-samples 2048 --test-samples 500 --batch 32 --progress-interval 0 \
    --seed 3 --metrics "$M" --tensorboard "$TB"
  TPIDS+=("$LAST_PID")
done
for pid in "${TPIDS[@]}" "${SPIDS[@]}"; do
  status=0
  wait_for "$pid" 120 || status=$?
  [ "$status" -eq 0 ] || fail "process $pid exited $status"
done
[ "$failures" -eq 0 ] || { tail -5 "$SCRATCH"/tb-*.log >&2; finish; }
grep -q "tensorboard: writing $TB/trainer-1/events.out.tfevents." "$SCRATCH/tb-t1.log" ||
  fail "trainer 1 does not name its events file"

"$TBPY" "$HERE/tensorboard_check.py" files "$TB" "$M" "$STEPS" "$EPOCHS" "$LOG_EVERY" \
  "$SCRATCH/tb-s0.log" "$SCRATCH/tb-s1.log" || fail "the event files (above)"

# A real TensorBoard on a port the kernel picks, read from its start-up line.
start tensorboard "$VENV/bin/tensorboard" --logdir "$TB" --host 127.0.0.1 --port 0 \
  --load_fast=false --reload_interval 1
TBPID=$LAST_PID
url=""
for _ in $(seq 300); do # 30 s
  url=$(sed -n 's|.*TensorBoard .* at \(http://127\.0\.0\.1:[0-9]*\)/.*|\1|p' \
    "$SCRATCH/tensorboard.log" | head -1)
  [ -n "$url" ] && break
  kill -0 "$TBPID" 2>/dev/null || break
  sleep 0.1
done
if [ -z "$url" ]; then
  fail "tensorboard did not start: $(tail -5 "$SCRATCH/tensorboard.log")"
else
  # It loads the runs after it starts listening: ask until all four are there.
  ok=0
  for _ in $(seq 150); do # 30 s
    if "$TBPY" "$HERE/tensorboard_check.py" http "$url" "$M" >"$SCRATCH/http.log" 2>&1; then
      ok=1
      break
    fi
    kill -0 "$TBPID" 2>/dev/null || break
    sleep 0.2
  done
  cat "$SCRATCH/http.log" >&2
  [ "$ok" -eq 1 ] || fail "TensorBoard's HTTP API at $url (above; its log: $(tail -3 "$SCRATCH/tensorboard.log"))"
fi
kill "$TBPID" 2>/dev/null
status=0
wait_for "$TBPID" 20 || status=$?
# SIGTERM ends it with 143 (or 0); 124: it had to be killed.
[ "$status" -ne 124 ] || fail "tensorboard did not stop on SIGTERM"
finish
