#!/usr/bin/env bash
# Bounded staleness (--update ssp), checked from what the pservers record:
# - the bound holds and is reached: 2 trainers, trainer 1 slowed 3x
#   (--slowdown 3), S = 1 and S = 4: every pserver's max lead is exactly S,
#   and it held pushes;
# - S = 0 is sync: with plain SGD the test accuracy equals sync's within
#   0.005 and the max lead is 0;
# - a trainer killed under ssp: stop names it and fails the job; continue
#   drops it and the other trainer finishes; one started again goes on from
#   the step it had reached;
# - a CTR job (sparse rows) under ssp keeps the bound and trains like async;
# - a pserver killed and restarted from its checkpoint: the job recovers;
# - bad flags are refused before any work.
. "$(dirname "$0")/lib.sh"
require_data

# max_lead LOG: the lead on the pserver's end-of-job ssp line.
max_lead() { sed -n 's/.* job: ssp: max lead \([0-9]*\) step(s).*/\1/p' "$1" | tail -1; }
held() { sed -n 's/.* job: ssp: .*; \([0-9]*\) of \([0-9]*\) pushes held.*/\1 \2/p' "$1" | tail -1; }
accuracy() { sed -n 's/.* done: .* test accuracy \([0-9.]*\),.*/\1/p' "$1" | tail -1; }

# run NAME PSERVERS "PSERVER FLAGS" "FLAGS" "TRAINER 1 FLAGS": a 2-trainer job; 0 if every process exits 0.
run() {
  local name=$1 count=$2 sflags=$3 flags=$4 t1flags=$5 pid status=0
  # shellcheck disable=SC2086
  start_pservers "$name" "$count" --trainers 2 $sflags || return 1
  # shellcheck disable=SC2086
  start "$name-t0" "$BIN/trainer" --mode pserver --pservers "$PS" --trainers 2 --id 0 $flags
  local t0=$LAST_PID
  # shellcheck disable=SC2086
  start "$name-t1" "$BIN/trainer" --mode pserver --pservers "$PS" --trainers 2 --id 1 $flags $t1flags
  for pid in "$t0" "$LAST_PID" "${SPIDS[@]}"; do
    wait_for "$pid" 120 || { status=$?; fail "$name: process $pid exited $status"; }
  done
  return "$status"
}

# 1. The bound holds and is reached: compute dominates the step (batch 256),
# so the unslowed trainer runs into the bound and waits there.
BOUND=(--train-samples 25600 --test-samples 200 --batch 256 --max-steps 60 --progress-interval 0
       --optimizer sgd --lr 0.05)
for s in 1 4; do
  run "s$s" 2 "" "${BOUND[*]} --update ssp --staleness $s" "--slowdown 3" || continue
  for p in 0 1; do
    log="$SCRATCH/s$s-s$p.log"
    lead=$(max_lead "$log")
    read -r h n <<<"$(held "$log")"
    [ "$lead" = "$s" ] || fail "S=$s pserver $p: max lead '$lead', expected $s: $(grep 'ssp:' "$log" | tail -1)"
    [ "${n:-0}" -eq 120 ] || fail "S=$s pserver $p: $n pushes applied, expected 120"
    [ "${h:-0}" -ge 10 ] || fail "S=$s pserver $p: only '$h' pushes held: the slowed trainer did not hold the other"
    echo "S=$s pserver $p: max lead $lead, $h of $n pushes held" >&2
  done
done

# 2. S = 0 is sync: plain SGD, the same data and steps.
EQUAL=(--train-samples 6400 --test-samples 1000 --batch 32 --epochs 1 --progress-interval 0
       --optimizer sgd --lr 0.05)
run sync 1 "" "${EQUAL[*]}" "" && run ssp0 1 "" "${EQUAL[*]} --update ssp --staleness 0" "--slowdown 2" && {
  a=$(accuracy "$SCRATCH/sync-t0.log"); b=$(accuracy "$SCRATCH/ssp0-t0.log")
  lead=$(max_lead "$SCRATCH/ssp0-s0.log")
  echo "sync accuracy $a, ssp S=0 accuracy $b, max lead $lead" >&2
  [ "$lead" = 0 ] || fail "S=0: max lead '$lead', expected 0"
  "$PY" -c "import sys; a, b = float('$a'), float('$b'); sys.exit(0 if abs(a - b) <= 0.005 else 1)" 2>/dev/null ||
    fail "S=0: test accuracy $b, sync's $a (more than 0.005 apart)"
  grep -q "update=ssp staleness=0 " "$SCRATCH/ssp0-s0.log" || fail "S=0: the pserver's job line lacks staleness=0"
}

# 3. A trainer killed under ssp: as in sync, stop fails the job naming it,
# continue drops it from the slowest and the job completes.
DEATH=(--train-samples 30000 --test-samples 200 --max-steps 800 --batch 32 --progress-interval 0
       --update ssp --staleness 2)
for policy in stop continue; do
  start_pservers "$policy" 1 --trainers 2 --step-timeout 2 --on-trainer-loss "$policy" || continue
  S0=${SPIDS[0]}
  start "$policy-t0" "$BIN/trainer" --mode pserver --pservers "$PS" --trainers 2 --id 0 "${DEATH[@]}"; T0=$LAST_PID
  start "$policy-t1" "$BIN/trainer" --mode pserver --pservers "$PS" --trainers 2 --id 1 "${DEATH[@]}"; T1=$LAST_PID
  for _ in $(seq 200); do
    grep -q "training mlp" "$SCRATCH/$policy-t1.log" 2>/dev/null && break
    sleep 0.05
  done
  sleep 0.3
  kill -9 "$T1"
  ps_status=0; wait_for "$S0" 60 || ps_status=$?
  t_status=0; wait_for "$T0" 60 || t_status=$?
  if [ "$policy" = stop ]; then
    [ "$ps_status" -eq 1 ] || fail "stop: pserver exited $ps_status, expected 1"
    grep -q "waited 2 s (--step-timeout, --staleness 2) for trainer(s) 1 (at step" "$SCRATCH/stop-s0.log" ||
      fail "stop: pserver did not name trainer 1: $(grep ERROR "$SCRATCH/stop-s0.log" | tail -1)"
    [ "$t_status" -ne 0 ] && [ "$t_status" -ne 124 ] || fail "stop: trainer 0 exited $t_status"
    grep -q "for trainer(s) 1" "$SCRATCH/stop-t0.log" || fail "stop: trainer 0 did not name trainer 1"
  else
    [ "$ps_status" -eq 0 ] || fail "continue: pserver exited $ps_status: $(tail -2 "$SCRATCH/continue-s0.log")"
    [ "$t_status" -eq 0 ] || fail "continue: trainer 0 exited $t_status: $(tail -2 "$SCRATCH/continue-t0.log")"
    grep -q "trainer 1 has not pushed step .* continuing with 1 trainer" "$SCRATCH/continue-s0.log" ||
      fail "continue: the pserver did not say it dropped trainer 1"
    grep -q "(800 steps)" "$SCRATCH/continue-t0.log" || fail "continue: trainer 0 did not finish its steps"
    lead=$(max_lead "$SCRATCH/continue-s0.log")
    [ -n "$lead" ] && [ "$lead" -le 2 ] || fail "continue: max lead '$lead' above the staleness 2"
  fi
done

# A trainer killed and started again (a new incarnation) within
# --step-timeout: it is told the step it had reached and goes on from there,
# so every step of both trainers is pushed once (2 x 800).
start_pservers again 1 --trainers 2 --step-timeout 30 || finish
restart_trainer_1 again "${SPIDS[0]}" "${DEATH[@]}"
grep -q "resuming at step [1-9][0-9]* .*where the pservers are" "$SCRATCH/again-t1b.log" ||
  fail "trainer restart: trainer 1 did not resume where it was: $(grep resum "$SCRATCH/again-t1b.log")"
read -r h n <<<"$(held "$SCRATCH/again-s0.log")"
lead=$(max_lead "$SCRATCH/again-s0.log")
[ "${n:-0}" -eq 1600 ] && [ "${lead:-9}" -le 2 ] ||
  fail "trainer restart: $n pushes (expected 1600), max lead '$lead' (at most 2)"

# 4. CTR jobs: the sparse rows are applied on arrival as in async, the next
# keys' rows come back when a held push is let go; trains like sync.
D="$SCRATCH/ctr"
"$BIN/gen_ctr" --out "$D" --train-rows 20000 --test-rows 4000 --scale 0.0005 --seed 5 \
  >"$SCRATCH/gen.json" || fail "gen_ctr failed"
CTR=(--data "$D/train.tsv" --test-data "$D/test.tsv" --model ctr:8:32,16 --epochs 2 --seed 3
     --threads 1 --progress-interval 0 --batch 128)
# launch gives every trainer --update async; the flags after -- come later and win.
for m in async ssp; do
  extra=()
  [ "$m" = ssp ] && extra=(--update ssp --staleness 1)
  timeout 120 "$(dirname "$0")/../scripts/launch" --bin "$BIN" --mode async --pservers 2 \
    --trainers 2 --quiet --log-dir "$SCRATCH/ctr-$m" -- "${CTR[@]}" --metrics "$SCRATCH/ctr-$m.jsonl" \
    "${extra[@]}" >"$SCRATCH/ctr-$m.log" 2>&1 || fail "CTR $m failed: $(tail -3 "$SCRATCH/ctr-$m.log")"
done
for p in 0 1; do
  log="$SCRATCH/ctr-ssp/pserver$p.log"
  lead=$(max_lead "$log")
  read -r h n <<<"$(held "$log")"
  [ "$lead" = 1 ] && [ "${n:-0}" -eq 316 ] ||
    fail "CTR ssp pserver $p: max lead '$lead' (expected 1), $n pushes (expected 316)"
done
"$PY" - "$SCRATCH/ctr-async.jsonl" "$SCRATCH/ctr-ssp.jsonl" <<'PY' || fail "CTR ssp AUC"
import json, sys
a, b = (json.loads(open(p).readlines()[-1]) for p in sys.argv[1:])
assert b["update"] == "ssp", b
print(f"CTR: async AUC {a['auc']:.4f}, ssp S=1 AUC {b['auc']:.4f}", file=sys.stderr)
assert b["auc"] > 0.6 and abs(a["auc"] - b["auc"]) <= 0.01, (a["auc"], b["auc"])
PY

# 5. A pserver SIGKILLed mid-run and restarted from its checkpoint (launch
# --restart-pservers): the trainers resend their pushes, the bound holds on
# the restarted pserver, the job finishes and trains.
CK="$SCRATCH/ck"
(timeout 200 "$(dirname "$0")/../scripts/launch" --bin "$BIN" --mode async --pservers 2 --trainers 2 \
   --quiet --log-dir "$SCRATCH/restart" --pserver-args "--checkpoint-dir $CK --checkpoint-every 50" \
   --restart-pservers 1 -- --train-samples 30000 --test-samples 1000 --max-steps 2000 --batch 32 \
   --progress-interval 0 --update ssp --staleness 2 --metrics "$SCRATCH/restart.jsonl" \
   >"$SCRATCH/restart.log" 2>&1; echo "$?" >"$SCRATCH/restart.rc") &
LAUNCHER=$!
PIDS+=("$LAUNCHER")
for _ in $(seq 300); do
  ls "$CK"/pserver-1-of-2-step-0000008*.safetensors >/dev/null 2>&1 && break
  sleep 0.05
done
victim=$(sed -n 's/^launch: pserver 1 started (pid \([0-9]*\)).*/\1/p' "$SCRATCH/restart.log" | head -1)
[ -n "$victim" ] && kill -9 "$victim" || fail "restart: no pserver 1 to kill"
wait_for "$LAUNCHER" 200 >/dev/null || true
[ "$(cat "$SCRATCH/restart.rc" 2>/dev/null)" = 0 ] || fail "restart: launch failed: $(tail -3 "$SCRATCH/restart.log")"
grep -q "resumed from .* at step" "$SCRATCH/restart/pserver1.log" || fail "restart: pserver 1 did not resume"
grep -q "recovered in" "$SCRATCH/restart/trainer0.log" || fail "restart: trainer 0 did not recover"
lead=$(max_lead "$SCRATCH/restart/pserver1.log")
[ -n "$lead" ] && [ "$lead" -le 2 ] || fail "restart: the restarted pserver's max lead '$lead' is above 2"
"$PY" -c 'import json,sys; r=json.loads(open(sys.argv[1]).readlines()[-1]); sys.exit(0 if r["test_accuracy"] > 0.8 else 1)' \
  "$SCRATCH/restart.jsonl" || fail "restart: final accuracy $(tail -1 "$SCRATCH/restart.jsonl")"

# 6. Bad flags: refused before any work, with the reason.
T="$BIN/trainer"
P=(--mode pserver --pservers 127.0.0.1:1)
expect_exit 2 "--staleness is for --update ssp (this job's update is sync)" -- "$T" "${P[@]}" --staleness 2
expect_exit 2 "--staleness is for --update ssp (this job's update is async)" -- "$T" "${P[@]}" --update async --staleness 0
expect_exit 2 "--update ssp needs --staleness S" -- "$T" "${P[@]}" --update ssp
expect_exit 2 "--staleness '-1' is not an integer 0..1000000" -- "$T" "${P[@]}" --update ssp --staleness -1
expect_exit 2 "--staleness '2x' is not an integer" -- "$T" "${P[@]}" --update ssp --staleness 2x
expect_exit 2 "--slowdown: 0.5 is outside 1..1000" -- "$T" --slowdown 0.5
expect_exit 2 "--async-push whole is for --mode pserver with --update async or ssp (here: --mode pserver --update sync" -- \
  "$T" "${P[@]}" --async-push whole
expect_exit 2 "--async-push whole is for --mode pserver with --update async or ssp (here: --mode local --update sync" -- \
  "$T" --async-push whole
expect_exit 2 "--async-push whole is for --mode pserver with --update async or ssp (here: --mode pserver --update geo" -- \
  "$T" "${P[@]}" --update geo --geo-steps 4 --async-push whole
finish
