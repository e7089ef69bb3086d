#!/usr/bin/env bash
# A pserver lost mid-run comes back (label "fault"): scripts/launch
# --restart-pservers restarts pserver 1 of 2 after a SIGKILL at a random
# step, 2 s later, with --resume from its newest checkpoint; the trainers wait for it,
# register again, every pserver rolls back to that checkpoint's step, and
# the job ends with parameters bitwise equal to an uninterrupted run's (sync
# mode sums in trainer order and every state a step needs is in the
# checkpoints, so all parameters must match, not only the accuracy); the
# metrics rows of epochs taken again carry "repeat":true. Prints
# the kill step and the time from the restarted pserver's "ready" to the
# trainers' recovery.
. "$(dirname "$0")/lib.sh"
require_data
LAUNCH="$(dirname "$0")/../scripts/launch"
COMMON=(--train-samples 12800 --test-samples 1000 --max-steps 1500 --optimizer adam --lr 0.002
        --seed 11 --batch 32 --progress-interval 0)

timeout 400 "$LAUNCH" --bin "$BIN" --pservers 2 --trainers 2 --quiet --log-dir "$SCRATCH/a" \
  -- "${COMMON[@]}" --export "$SCRATCH/a.safetensors" --metrics "$SCRATCH/a.jsonl" >"$SCRATCH/a.log" 2>&1 ||
  { fail "uninterrupted run failed: $(tail -5 "$SCRATCH/a.log")"; finish; }

CK="$SCRATCH/ck"
# Epochs are 200 steps and checkpoints every 150: a kill just after an
# epoch's end (steps 210-229 past 200, 400, 800 or 1000) mostly rolls back
# across it, so that epoch's metrics row is written again as a repeat.
ends=(200 400 800 1000)
kill_at=$((ends[RANDOM % 4] + 10 + RANDOM % 20))
timeout 400 "$LAUNCH" --bin "$BIN" --pservers 2 --trainers 2 --quiet --log-dir "$SCRATCH/b" \
  --restart-pservers 2 --restart-delay 2 --pserver-args "--checkpoint-dir $CK --checkpoint-every 150 --log-every 10" \
  -- "${COMMON[@]}" --export "$SCRATCH/b.safetensors" --metrics "$SCRATCH/b.jsonl" >"$SCRATCH/b.log" 2>&1 &
launcher=$!
PIDS+=("$launcher")
victim=""
for _ in $(seq 600); do
  victim=$(sed -n 's/^launch: pserver 1 started (pid \([0-9]*\))$/\1/p' "$SCRATCH/b.log" | head -1)
  [ -n "$victim" ] && break
  sleep 0.05
done
[ -n "$victim" ] || { fail "the launcher did not start pserver 1: $(tail -3 "$SCRATCH/b.log")"; finish; }
killed=""
for _ in $(seq 3000); do
  step=$(grep -o "step [0-9]*: " "$SCRATCH/b/pserver1.log" 2>/dev/null | tail -1 | grep -o "[0-9]*")
  if [ -n "$step" ] && [ "$step" -ge "$kill_at" ]; then
    sleep "0.0$((RANDOM % 10))"
    kill -KILL "$victim" && killed=$step
    break
  fi
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.02
done
[ -n "$killed" ] || { fail "pserver 1 never reached step $kill_at: $(tail -3 "$SCRATCH/b.log")"; finish; }
# Steps go on between the read above and the signal: the last step it logged
# before dying (the launcher restarts it 2 s later) bounds its checkpoints.
sleep 0.5
last=$(grep -o "step [0-9]*: " "$SCRATCH/b/pserver1.log" | tail -1 | grep -o "[0-9]*")
status=0; wait_for "$launcher" 400 || status=$?
if [ "$status" -ne 0 ]; then
  fail "the job with a restart exited $status: $(tail -8 "$SCRATCH/b.log")"
  for log in "$SCRATCH"/b/*.log; do echo "== $log" >&2; grep -v " INFO step " "$log" | tail -15 >&2; done
fi
grep -q "pserver 1 was killed by signal 9; restarting it from its checkpoint in 2 s" "$SCRATCH/b.log" ||
  fail "the launcher did not restart pserver 1"
resumed=$(grep -o "resumed from .* at step [0-9]*" "$SCRATCH/b/pserver1.log" | grep -o "[0-9]*$")
echo "pserver 1 killed at step $killed or a little after (last logged: $last); resumed at step ${resumed:-?}" >&2
[ -n "$resumed" ] && [ "$resumed" -le "$last" ] || fail "pserver 1 did not resume at a step it had reached"
for t in 0 1; do
  grep -q "recovered in" "$SCRATCH/b/trainer$t.log" || fail "trainer $t did not recover"
done
grep -h "recovered in\|rolled back from" "$SCRATCH/b/trainer0.log" "$SCRATCH/b/pserver0.log" >&2
cmp -s "$SCRATCH/a.safetensors" "$SCRATCH/b.safetensors" ||
  fail "the parameters after the restart differ from the uninterrupted run's"
# Metrics rows: epochs the rollback took again are written again with
# "repeat":true; without the repeats each epoch appears once, in order, and
# each epoch's last row (the state the job went on from) has the accuracy of
# the uninterrupted run's (the parameters are equal at every step).
$PY - "$SCRATCH/a.jsonl" "$SCRATCH/b.jsonl" "${resumed:-0}" "$last" <<'PYEOF' >&2 || fail "metrics rows after the restart"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
resumed, reached = int(sys.argv[3]), int(sys.argv[4])
# An epoch ending in (resumed, reached] was written, then taken again (200
# steps an epoch, the job stops at --max-steps 1500).
crossed = sum(1 for r in a if resumed < min(r["epoch"] * 200, 1500) <= reached)
assert sum(1 for r in b if r.get("repeat")) >= crossed, (crossed, b)
assert not any("repeat" in r for r in a), "a repeat row without a restart"
first = [r["epoch"] for r in b if not r.get("repeat")]
assert first == [r["epoch"] for r in a], (first, [r["epoch"] for r in a])
seen = set()
for r in b:
    assert r.get("repeat", False) == (r["epoch"] in seen), r
    seen.add(r["epoch"])
last = {r["epoch"]: r["test_accuracy"] for r in b}
assert last == {r["epoch"]: r["test_accuracy"] for r in a}, (last, a)
print(f"metrics: {len(b)} rows for {len(a)} epochs, {len(b) - len(a)} marked repeat "
      f"(rolled back from step {reached} or later to {resumed}: {crossed} epoch end(s) crossed)")
PYEOF
acc() { grep -o "test accuracy [0-9.]*" "$1" | tail -1 | grep -o "[0-9.]*$"; }
echo "test accuracy: uninterrupted $(acc "$SCRATCH/a/trainer0.log"), with the restart $(acc "$SCRATCH/b/trainer0.log")" >&2

# Reconnect time: the restarted pserver's "ready" to trainer 0's recovery.
$PY - "$SCRATCH/b/pserver1.log" "$SCRATCH/b/trainer0.log" <<'PYEOF' >&2 || fail "no reconnect time"
import re, sys
from datetime import datetime
def stamp(line):
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S.%f")
ready = [stamp(l) for l in open(sys.argv[1]) if " ready: " in l]
back = [stamp(l) for l in open(sys.argv[2]) if "recovered in" in l]
assert len(ready) == 2 and back, (len(ready), len(back))
print(f"reconnect: trainer 0 recovered {(back[0] - ready[1]).total_seconds() * 1000:.0f} ms "
      f"after the restarted pserver was ready")
PYEOF
finish
