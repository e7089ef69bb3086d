#!/usr/bin/env bash
# The straggler report and the job's ETA: a 2+2 sync job where trainer 1 is
# slowed (SIGSTOP/SIGCONT in slices: stopped 20 ms, running 2 ms) names trainer 1
# on each pserver's straggler line (in most intervals; it is last in most
# steps), once per --log-every interval beside a single statistics line;
# trainer 0's progress line carries the job's steps and ETA.
. "$(dirname "$0")/lib.sh"
require_data
FLAGS=(--mode pserver --trainers 2 --epochs 2 --train-samples 12800 --test-samples 500 --batch 32
       --progress-interval 0.2)

start_pservers s 2 --trainers 2 --log-every 50 || finish
start t0 "$BIN/trainer" --pservers "$PS" --id 0 "${FLAGS[@]}"; T0=$LAST_PID
start t1 "$BIN/trainer" --pservers "$PS" --id 1 "${FLAGS[@]}"; T1=$LAST_PID
slices=0
while kill -0 "$T1" 2>/dev/null && [ "$slices" -lt 6000 ]; do
  kill -STOP "$T1" 2>/dev/null || break
  sleep 0.02
  kill -CONT "$T1" 2>/dev/null || break
  sleep 0.002
  slices=$((slices + 1))
done
kill -CONT "$T1" 2>/dev/null
for pid in "$T0" "$T1" "${SPIDS[@]}"; do
  status=0; wait_for "$pid" 120 || status=$?
  [ "$status" -eq 0 ] || fail "process $pid exited $status"
done

for p in 0 1; do
  log="$SCRATCH/s-s$p.log"
  "$PY" - "$log" <<'PY' || fail "pserver $p: straggler report"
import collections, re, sys
stats, strag = collections.Counter(), {}
for line in open(sys.argv[1]):
    m = re.search(r" step (\d+): [0-9.]+ pushes/s", line)
    if m:
        stats[int(m.group(1))] += 1
    m = re.search(r" step (\d+): straggler trainer (\d+), last in (\d+) of (\d+) steps; "
                  r"mean wait for the last push ([0-9.]+) ms", line)
    if m:
        step = int(m.group(1))
        assert step not in strag, f"two straggler lines at step {step}"
        strag[step] = tuple(int(g) for g in m.group(2, 3, 4)) + (float(m.group(5)),)
assert stats, "no statistics lines"
twice = [s for s, n in stats.items() if n > 1]
assert not twice, f"statistics lines printed twice at steps {twice}"
assert sorted(strag) == sorted(stats), (sorted(strag), sorted(stats))
named = collections.Counter(v[0] for v in strag.values())
last, waits = sum(v[1] for v in strag.values() if v[0] == 1), [v[3] for v in strag.values()]
assert all(v[2] == 50 for v in strag.values()), strag
assert named[1] >= 0.75 * len(strag) and last > 0.55 * 50 * len(strag), \
    f"trainer 1 named in {named[1]} of {len(strag)} lines, last in {last} steps: {named}"

print(f"{sys.argv[1].rsplit('/', 1)[-1]}: straggler trainer 1 in {named[1]} of {len(strag)} "
      f"intervals, last in {last} of {50 * len(strag)} steps, mean wait {sum(waits) / len(waits):.1f} ms")
PY
done
grep -h "pushes/s\|straggler" "$SCRATCH/s-s0.log" | head -2 >&2

# The progress line: the job's steps (2 epochs of 200) and its ETA.
line=$(grep "job step" "$SCRATCH/t0.log" | tail -1)
echo "$line" >&2
[[ "$line" =~ epoch\ [12]/2\ step\ [0-9]+/200\ job\ step\ [0-9]+/400\ .*ETA\ [0-9]+s\ \(job\) ]] ||
  fail "trainer 0's progress line has no job step and ETA: '$line'"
finish
