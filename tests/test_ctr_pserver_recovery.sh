#!/usr/bin/env bash
# Recovery of CTR jobs on pservers, end to end (label "fault"): sync jobs of
# 2 pservers x 2 trainers (ctr:8:32,16, 314 steps) whose final exports must
# be byte-equal to an uninterrupted run's:
# 1. pserver 1 SIGKILLed at a random step, restarted by scripts/launch from
#    its newest checkpoint (--checkpoint-every 20): every pserver rolls back
#    to that step and the trainers rewind their readers to it and pull its
#    keys again;
# 2. pserver 1 SIGKILLed at a step that is exactly its newest checkpoint's
#    (--checkpoint-every 1): nothing rolls back, the trainers resend the push;
# 3. the job stopped (every process SIGKILLed) after step K and resumed with
#    --resume onto 3 pservers: the rows are re-sharded (each row once) and the
#    trainers start at the pservers' step;
# 4. trainer 1 SIGKILLed and started again with the same flags: it registers
#    again, starts at the pservers' step and the job goes on.
# --admit-after 1: admission counts are not in the checkpoints (a row's
# count before admission is lost with its pserver), so a job that admits at
# the N-th occurrence may admit later after a restart; with 1 every key is
# admitted at its first pull and a restart changes nothing.
# To stop or kill at a known step the test runs the trainers in short slices
# (SIGSTOP/SIGCONT) and reads the pservers' step lines (--log-every 1).
. "$(dirname "$0")/lib.sh"
LAUNCH="$(dirname "$0")/../scripts/launch"
D="$SCRATCH/data"
"$BIN/gen_ctr" --out "$D" --train-rows 20000 --test-rows 2000 --scale 0.0005 --seed 5 \
  >"$SCRATCH/gen.json" || { fail "gen_ctr failed"; finish; }
TRAIN=(--data "$D/train.tsv" --test-data "$D/test.tsv" --model ctr:8:32,16 --epochs 2 --seed 3
       --threads 1 --progress-interval 0 --batch 64 --admit-after 1 --recover-timeout 30)
STEPS=314
begin=$(date +%s.%N)
elapsed() { "$PY" -c 'import sys, time; print(f"{time.time() - float(sys.argv[1]):.1f}")' "$1"; }

# job NAME LAUNCH_FLAGS...: starts a job in the background (logs in NAME/,
# export NAME.safetensors); LAUNCHER is its pid, TRAINERS its trainers'.
job() {
  local name=$1
  shift
  timeout 120 "$LAUNCH" --bin "$BIN" --trainers 2 --quiet --log-dir "$SCRATCH/$name" "$@" \
    -- "${TRAIN[@]}" --export "$SCRATCH/$name.safetensors" >"$SCRATCH/$name.log" 2>&1 &
  LAUNCHER=$!
  PIDS+=("$LAUNCHER")
  TRAINERS=""
  for _ in $(seq 300); do
    TRAINERS=$(trainer_pids "$name")
    [ "$(echo "$TRAINERS" | wc -w)" -eq 2 ] && return 0
    sleep 0.02
  done
  fail "$name: the trainers did not start: $(tail -3 "$SCRATCH/$name.log")"
  return 1
}
# trainer_pids NAME: the pids of the trainers exporting NAME.safetensors.
trainer_pids() {
  ps -eo pid=,comm=,args= | awk -v want="--export $SCRATCH/$1.safetensors" \
    '$2 == "trainer" && index($0, want) {print $1}' | tr '\n' ' '
}
pserver_pid() { # NAME ID: pserver ID's pid, as the launcher printed it (the first one)
  sed -n "s/^launch: pserver $2 started (pid \([0-9]*\))\$/\1/p" "$SCRATCH/$1.log" | head -1
}
# last_step LOG: the newest step a pserver logged (--log-every 1).
last_step() { grep -o " INFO step [0-9]*: " "$1" 2>/dev/null | tail -1 | grep -o "[0-9]*"; }
# run_until PIDS COMMAND...: lets the processes run in slices of a few
# steps until COMMAND succeeds while they are stopped; they stay stopped.
# Fails when the job ends first.
run_until() {
  local pids=$1
  shift
  for _ in $(seq 4000); do
    # shellcheck disable=SC2086
    kill -STOP $pids 2>/dev/null || return 1
    sleep 0.03 # replies in flight arrive, steps complete
    "$@" && return 0
    # shellcheck disable=SC2086
    kill -CONT $pids 2>/dev/null || return 1
    sleep 0.003
  done
  return 1
}
finish_job() { # NAME: waits for the launcher, fails with the logs' tails if it failed
  local status=0
  wait_for "$LAUNCHER" 120 || status=$?
  if [ "$status" -ne 0 ]; then
    fail "$1: the job exited $status: $(tail -4 "$SCRATCH/$1.log")"
    for log in "$SCRATCH/$1"/*.log; do echo "== $log" >&2; grep -v " INFO step " "$log" | tail -8 >&2; done
    return 1
  fi
}
same_as_uninterrupted() { # NAME WHAT
  cmp -s "$SCRATCH/a.safetensors" "$SCRATCH/$1.safetensors" ||
    fail "$2: the export differs from the uninterrupted run's"
}

# The uninterrupted run.
t0=$(date +%s.%N)
job a --pservers 2 --pserver-args "--log-every 0" && finish_job a
[ -s "$SCRATCH/a.safetensors" ] || { fail "the uninterrupted run exported nothing"; finish; }
echo "uninterrupted run: $(elapsed "$t0") s" >&2

# 1. pserver 1 killed at a step, back from its checkpoint of --checkpoint-every 20:
# kill_pserver_1 NAME KILL_AT LABEL.
above() { local s; s=$(last_step "$1"); [ -n "$s" ] && [ "$s" -ge "$2" ]; }
kill_pserver_1() {
  local name=$1 kill_at=$2 label=$3 killed resumed t
  t0=$(date +%s.%N)
  job "$name" --pservers 2 --restart-pservers 1 --restart-delay 0.5 \
    --pserver-args "--checkpoint-dir $SCRATCH/$name.ck --checkpoint-every 20 --log-every 1"
  victim=$(pserver_pid "$name" 1)
  if ! run_until "$TRAINERS" above "$SCRATCH/$name/pserver1.log" "$kill_at"; then
    fail "$label: the job ended before step $kill_at: $(tail -3 "$SCRATCH/$name.log")"
    return
  fi
  killed=$(last_step "$SCRATCH/$name/pserver1.log")
  kill -KILL "$victim"
  # shellcheck disable=SC2086
  kill -CONT $TRAINERS
  finish_job "$name" || return
  resumed=$(grep -o "resumed from .* at step [0-9]*" "$SCRATCH/$name/pserver1.log" | grep -o "[0-9]*$")
  echo "$label. pserver 1 killed at step $killed (aimed at $kill_at), resumed at step ${resumed:-?}; " \
       "$(grep -ho "recovered in .*" "$SCRATCH/$name/trainer0.log" | head -1); $(elapsed "$t0") s" >&2
  grep -q "pserver 1 was killed by signal 9; restarting it" "$SCRATCH/$name.log" ||
    fail "$label: the launcher did not restart pserver 1"
  # Its newest checkpoint: of step killed / 20 * 20, or an older one if the
  # writer (which yields to the steps) was not done with it.
  [ -n "$resumed" ] && [ $((resumed % 20)) -eq 0 ] && [ "$resumed" -le "$killed" ] ||
    fail "$label: pserver 1 resumed at step ${resumed:-?}, not at a checkpoint before $killed"
  for t in 0 1; do
    grep -q "step [0-9]*: recovered in" "$SCRATCH/$name/trainer$t.log" ||
      fail "$label: trainer $t did not recover"
  done
  if [ "$resumed" -lt "$killed" ]; then
    grep -q "rolled back from step [0-9]* to $resumed" "$SCRATCH/$name/pserver0.log" ||
      fail "$label: pserver 0 did not roll back to step $resumed"
    grep -q "every pserver rolled back to step $resumed" "$SCRATCH/$name/trainer1.log" ||
      fail "$label: trainer 1 did not go back to step $resumed"
  fi
  same_as_uninterrupted "$name" "$label (killed at step $killed)"
}
kill_pserver_1 b $((30 + RANDOM % 230)) 1
# At the first epoch's last step (157): trainer 0 is evaluating, its lookups
# fail; it recovers, goes back with the job and evaluates again later.
kill_pserver_1 b2 157 1b
grep -q "pulling (kind 1) at step 157: .*recovering" "$SCRATCH/b2/trainer0.log" ||
  echo "1b: trainer 0 was not evaluating when pserver 1 died (the kill came before or after)" >&2

# 2. Killed right after its checkpoint of the step it is at: the push is resent.
kill_at=$((30 + RANDOM % 230))
# checkpointed LOG CK_DIR MIN: at step >= MIN (and short of the job's last
# steps: a kill as the trainers say Done is not recovered; not the first
# epoch's end either, where trainer 0 evaluates and recovers its lookup, as
# in 1b, instead of resending a push) with that step's checkpoint written.
# The trainers are stopped: the checkpoint thread gets up to 2 s to write it
# (a slow build's writes outlast the slices).
checkpointed() {
  local s i
  for i in $(seq 100); do
    s=$(last_step "$1")
    [ -n "$s" ] && [ "$s" -ge "$3" ] && [ "$s" -lt $((STEPS - 20)) ] || return 1
    [ "$s" -ne $((STEPS / 2)) ] || return 1
    [ -f "$2/pserver-1-of-2-step-$(printf %09d "$s").safetensors" ] && return 0
    sleep 0.02
  done
  return 1
}
t0=$(date +%s.%N)
job c --pservers 2 --restart-pservers 1 --restart-delay 0.5 \
  --pserver-args "--checkpoint-dir $SCRATCH/c.ck --checkpoint-every 1 --log-every 1"
victim=$(pserver_pid c 1)
if run_until "$TRAINERS" checkpointed "$SCRATCH/c/pserver1.log" "$SCRATCH/c.ck" "$kill_at"; then
  killed=$(last_step "$SCRATCH/c/pserver1.log")
  kill -KILL "$victim"
  # shellcheck disable=SC2086
  kill -CONT $TRAINERS
  if finish_job c; then
    resumed=$(grep -o "resumed from .* at step [0-9]*" "$SCRATCH/c/pserver1.log" | grep -o "[0-9]*$")
    echo "2. pserver 1 killed at step $killed, its checkpoint's; resumed at step ${resumed:-?}; " \
         "$(grep -ho "recovered in .*" "$SCRATCH/c/trainer0.log" | head -1); $(elapsed "$t0") s" >&2
    [ "$resumed" = "$killed" ] || fail "2: pserver 1 resumed at step ${resumed:-?}, not $killed"
    for t in 0 1; do
      grep -q "step $killed: recovered in .*push resent" "$SCRATCH/c/trainer$t.log" ||
        fail "2: trainer $t did not resend step $killed: $(grep -h "recover" "$SCRATCH/c/trainer$t.log" | tail -2)"
    done
    same_as_uninterrupted c "2 (killed at checkpoint step $killed)"
  fi
else
  fail "2: the job ended before step $kill_at: $(tail -3 "$SCRATCH/c.log")"
fi

# 3. Stopped after step K, resumed onto 3 pservers.
stop_at=$((40 + RANDOM % 200))
CK="$SCRATCH/d.ck"
t0=$(date +%s.%N)
job d --pservers 2 --pserver-args "--checkpoint-dir $CK --checkpoint-every 20 --log-every 1"
ps0=$(pserver_pid d 0) ps1=$(pserver_pid d 1)
if run_until "$TRAINERS" above "$SCRATCH/d/pserver1.log" "$stop_at"; then
  stopped=$(last_step "$SCRATCH/d/pserver1.log")
  K=$((stopped / 20 * 20))
  f=$(printf %09d "$K")
  for _ in $(seq 100); do # the writer thread yields to the steps: it may lag
    [ -f "$CK/pserver-0-of-2-step-$f.safetensors" ] && [ -f "$CK/pserver-1-of-2-step-$f.safetensors" ] && break
    sleep 0.05
  done
  kill -KILL "$LAUNCHER" "$ps0" "$ps1" $TRAINERS
  wait "$LAUNCHER" 2>/dev/null
  job e --pservers 3 --pserver-args "--checkpoint-dir $CK --resume --resume-step $K --log-every 0"
  if finish_job e; then
    echo "3. stopped at step $stopped, resumed from step $K onto 3 pservers; $(elapsed "$t0") s" >&2
    grep -h "re-sharded" "$SCRATCH"/e/pserver*.log | sed 's/.* INFO /   /' >&2
    for t in 0 1; do
      grep -q "resuming at step $K " "$SCRATCH/e/trainer$t.log" || fail "3: trainer $t did not start at step $K"
    done
    # Every row once: the new shards' rows add up to the old shards' total.
    "$PY" - "$K" "$SCRATCH"/e/pserver{0,1,2}.log <<'PY' || fail "3: the rows were not re-sharded once each"
import re, sys
k, logs = sys.argv[1], sys.argv[2:]
pat = re.compile(rf"re-sharded step {k} from the 2 files of 2 pservers onto pserver (\d) of 3: .*")
seen = {}
for log in logs:
    for line in open(log):
        m = pat.search(line)
        if m:
            for name, mine, total in re.findall(r"table (\w+): (\d+) of (\d+) rows", line):
                seen.setdefault(name, []).append((int(m.group(1)), int(mine), int(total)))
assert sorted(seen) == ["embedding", "wide"], seen
for name, parts in seen.items():
    assert sorted(p for p, _, _ in parts) == [0, 1, 2], (name, parts)
    totals = {t for _, _, t in parts}
    assert len(totals) == 1 and sum(m for _, m, _ in parts) == totals.pop(), (name, parts)
PY
    same_as_uninterrupted e "3 (re-sharded 2 -> 3 at step $K)"
  fi
else
  fail "3: the job ended before step $stop_at: $(tail -3 "$SCRATCH/d.log")"
fi

# 4. Trainer 1 killed and started again with the same flags (sync): it
# registers again, starts at the pservers' step and pulls its rows of that
# step read-only (its old incarnation's keys were in the step's merged pull).
# It is killed while it waits for trainer 0 at a step it pushed to both
# pservers: killed between its pushes to one pserver and to the other, it
# would leave one pserver a step ahead, which a new trainer cannot join
# (the dense path neither).
kill_at=$((30 + RANDOM % 230))
t0=$(date +%s.%N)
start_pservers f 2 --trainers 2 --log-every 1 --step-timeout 30
F=(--mode pserver --pservers "$PS" --trainers 2 "${TRAIN[@]}" --export "$SCRATCH/f.safetensors")
start f-t0 "$BIN/trainer" "${F[@]}" --id 0; T0=$LAST_PID
start f-t1 "$BIN/trainer" "${F[@]}" --id 1; T1=$LAST_PID
at_least() { local s; s=$(last_step "$1"); [ -n "$s" ] && [ "$s" -ge "$2" ]; }
if run_until "$T0 $T1" at_least "$SCRATCH/f-s1.log" "$kill_at"; then
  killed=$(last_step "$SCRATCH/f-s1.log")
  kill -CONT "$T1" # it pushes step $killed and waits for trainer 0
  sleep 0.3
  kill -KILL "$T1"
  wait "$T1" 2>/dev/null
  kill -CONT "$T0"
  for _ in $(seq 100); do
    at_least "$SCRATCH/f-s0.log" $((killed + 1)) && at_least "$SCRATCH/f-s1.log" $((killed + 1)) && break
    sleep 0.05
  done
  start f-t1b "$BIN/trainer" "${F[@]}" --id 1; T1=$LAST_PID
  for who in T0 T1 "SPIDS[0]" "SPIDS[1]"; do
    status=0
    wait_for "${!who}" 60 || status=$?
    [ "$status" -eq 0 ] || fail "4: $who exited $status"
  done
  resumed=$(grep -o "resuming at step [0-9]*" "$SCRATCH/f-t1b.log" | grep -o "[0-9]*$")
  echo "4. trainer 1 killed at step $killed, started again at step ${resumed:-?}; $(elapsed "$t0") s" >&2
  # Its last push may have completed step killed+1 already when the stop
  # landed (the log line of a step trails its reply): killed+1 or +2.
  [ "$resumed" = $((killed + 1)) ] || [ "$resumed" = $((killed + 2)) ] ||
    fail "4: trainer 1 started again at step ${resumed:-?}, not $((killed + 1)) or $((killed + 2))"
  grep -q "trainer 1 registered again with a new incarnation" "$SCRATCH/f-s0.log" ||
    fail "4: pserver 0 did not see trainer 1 register again"
  grep -q "(314 steps)" "$SCRATCH/f-t0.log" || fail "4: trainer 0 did not finish: $(tail -2 "$SCRATCH/f-t0.log")"
  same_as_uninterrupted f "4 (trainer 1 restarted at step ${resumed:-?})"
else
  fail "4: the job ended before step $kill_at: $(tail -3 "$SCRATCH/f-t0.log")"
fi

echo "all runs: $(elapsed "$begin") s" >&2
finish
