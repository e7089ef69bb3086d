#!/usr/bin/env bash
# --timeline (label "pserver"): a 1 pserver + 2 trainer sync job with
# --timeline on every process and --timeline-steps 3:7 writes files that
# python's json reads, holding only steps 3..7, each step with its events
# (trainers: forward, backward, push, in that order; pserver: a push from
# each trainer, the wait for the last, apply, reply), durations >= 0, and
# the pserver's checkpoint writes and trainer 0's evaluations. Then a
# longer job: a trainer and the pserver sent SIGTERM mid-run still leave
# valid JSON with the steps they took.
. "$(dirname "$0")/lib.sh"
require_data
# 256 samples, 2 trainers, batch 32: 4 steps an epoch, so trainer 0
# evaluates after steps 3 and 7, inside the window.
COMMON=(--mode pserver --trainers 2 --train-samples 256 --test-samples 200 --batch 32
        --progress-interval 0 --seed 5)

check_files() { # STEPS FIRST LAST FILE...: the events of each file, checked
  "$PY" - "$@" <<'PY'
import json, sys
full, first, last = sys.argv[1] == "full", int(sys.argv[2]), int(sys.argv[3])
for path in sys.argv[4:]:
    events = json.load(open(path))  # valid JSON, or this raises
    assert isinstance(events, list) and events, f"{path}: not a non-empty array"
    names = [e["args"]["name"] for e in events if e.get("name") == "process_name"]
    assert len(names) == 1, f"{path}: process_name {names}"
    spans = [e for e in events if e["ph"] == "X"]
    steps = {}
    for e in spans:
        for key in ("name", "pid", "tid", "ts", "dur"):
            assert key in e, f"{path}: event without {key}: {e}"
        assert e["dur"] >= 0, f"{path}: negative duration: {e}"
        s = e["args"]["step"]
        assert first <= s <= last, f"{path}: step {s} outside {first}:{last}: {e}"
        steps.setdefault(s, []).append(e)
    if not full:
        print(f"{path} ({names[0]}): {len(spans)} events, steps {min(steps)}..{max(steps)}")
        continue
    assert sorted(steps) == list(range(first, last + 1)), f"{path}: steps {sorted(steps)}"
    role = names[0].split()[0]
    for s, evs in sorted(steps.items()):
        by = {}
        for e in evs:
            by.setdefault(e["name"], []).append(e)
        if role == "trainer":
            for name in ("forward", "backward", "push"):
                assert len(by.get(name, [])) == 1, f"{path}: step {s}: {name}: {by.get(name)}"
            f, b, p = by["forward"][0], by["backward"][0], by["push"][0]
            assert f["ts"] <= b["ts"] <= p["ts"], f"{path}: step {s}: forward {f['ts']} " \
                f"backward {b['ts']} push {p['ts']} out of order"
        else:
            pushers = sorted(e["args"]["trainer"] for e in by.get("push", []))
            assert pushers == [0, 1], f"{path}: step {s}: pushes from {pushers}"
            for name in ("wait-for-last", "apply", "reply"):
                assert len(by.get(name, [])) == 1, f"{path}: step {s}: {name}: {by.get(name)}"
    every = sorted({e["name"] for e in spans})
    print(f"{path} ({names[0]}): {len(spans)} events, steps {first}..{last}: {', '.join(every)}")
    if names[0] == "trainer 0":
        evals = [e["args"]["step"] for e in spans if e["name"] == "evaluation"]
        assert evals == [3, 7], f"{path}: evaluations after steps {evals}, expected [3, 7]"
    if role == "pserver":
        writes = sorted(e["args"]["step"] for e in spans if e["name"] == "checkpoint-write")
        assert writes == [3, 5, 7], f"{path}: checkpoint writes after steps {writes}"
PY
}

# --- a whole job, steps 3..7 -------------------------------------------------------
start_pservers a 1 --trainers 2 --timeline "$SCRATCH/a-s0.json" --timeline-steps 3:7 \
  --checkpoint-dir "$SCRATCH/ck" --checkpoint-every 2 || finish
for i in 0 1; do
  start "a-t$i" "$BIN/trainer" "${COMMON[@]}" --pservers "$PS" --id "$i" --epochs 3 \
    --timeline "$SCRATCH/a-t$i.json" --timeline-steps 3:7
  tpid[$i]=$LAST_PID
done
for i in 0 1; do
  status=0; wait_for "${tpid[$i]}" 120 || status=$?
  [ "$status" -eq 0 ] || fail "trainer $i exited $status: $(tail -3 "$SCRATCH/a-t$i.log")"
done
status=0; wait_for "${SPIDS[0]}" 60 || status=$?
[ "$status" -eq 0 ] || fail "pserver exited $status: $(tail -3 "$SCRATCH/a-s0.log")"
check_files full 3 7 "$SCRATCH/a-s0.json" "$SCRATCH/a-t0.json" "$SCRATCH/a-t1.json" ||
  fail "the timelines of the whole job"

# --- SIGTERM mid-run: trainer 1 (default action), then the pserver -----------------
start_pservers b 1 --trainers 2 --timeline "$SCRATCH/b-s0.json" --step-timeout 30 || finish
for i in 0 1; do
  start "b-t$i" "$BIN/trainer" "${COMMON[@]}" --pservers "$PS" --id "$i" --epochs 100000 \
    --timeline "$SCRATCH/b-t$i.json" --recover-timeout 0
  tpid[$i]=$LAST_PID
done
# Until the pserver has written some steps (its file grows once per step).
for _ in $(seq 300); do
  [ "$(stat -c %s "$SCRATCH/b-s0.json" 2>/dev/null || echo 0)" -gt 20000 ] && break
  sleep 0.1
done
kill -TERM "${tpid[1]}"
wait_for "${tpid[1]}" 30 || true
kill -TERM "${SPIDS[0]}"
status=0; wait_for "${SPIDS[0]}" 60 || status=$?
grep -q "stopping on SIGTERM" "$SCRATCH/b-s0.log" ||
  fail "the pserver did not stop on SIGTERM (exit $status): $(tail -3 "$SCRATCH/b-s0.log")"
wait_for "${tpid[0]}" 60 || true
check_files part 0 1000000000 "$SCRATCH/b-s0.json" "$SCRATCH/b-t1.json" ||
  fail "the timelines after SIGTERM"
finish
