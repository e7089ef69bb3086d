#!/usr/bin/env bash
# Malformed-message storm (label "security"): a 2-pserver, 2-trainer sync job
# runs once undisturbed and once while storm_client sends 12,000 mutated
# requests (bit flips, truncation, wrong ids, steps and hashes,
# huge lengths, duplicated fields, ...) to both pservers. Every storm request
# must be answered with an error status (none accepted, none timing out),
# the pservers and trainers exit 0, and the stormed run's exported
# parameters are bitwise those of the undisturbed run. The pservers run with
# --max-registrations 1, so once the trainers registered, a registration of
# theirs made by the storm is refused (RESOURCE_EXHAUSTED), not a takeover.
# Twice: an MLP job, then a CTR job (ctr:8:32,16 on gen_ctr data) whose
# storm pushes and pulls carry sparse rows and get sparse mutations (too
# many keys, duplicate keys, a key of another pserver, wrong widths, counts
# of 0, tables out of range or twice, rows in the wrong field). Before the
# CTR storm, storm_client --storm-register shows on spare pservers that each
# sparse mutation is refused by the pserver's sparse checks themselves. The
# CTR job sends its dense blocks as bf16 (--wire-dtype), the storm's too.
. "$(dirname "$0")/lib.sh"
require_data
STORM="$BIN/tests/storm_client"
[ -x "$STORM" ] || { echo "FAIL: $STORM is not built" >&2; exit 1; }
COMMON=(--train-samples 60000 --test-samples 200 --max-steps 3000 --optimizer momentum --lr 0.05
        --lr-schedule constant --seed 5 --batch 32 --progress-interval 0 --model mlp:784,64,10)

run_job() { # run_job TAG FLAGS...: 2 pservers and 2 trainers; trainer 0 exports TAG.safetensors
  local tag=$1
  shift
  start_pservers "$tag" 2 --trainers 2 --max-registrations 1 --log-every 1000
  S0=${SPIDS[0]} S1=${SPIDS[1]}
  start "$tag-t0" "$BIN/trainer" --mode pserver --pservers "$PS" --trainers 2 --id 0 "$@" \
    --export "$SCRATCH/$tag.safetensors"; T0=$LAST_PID
  start "$tag-t1" "$BIN/trainer" --mode pserver --pservers "$PS" --trainers 2 --id 1 "$@"; T1=$LAST_PID
}
wait_job() { # wait_job TAG: every process exits 0
  local who status
  for who in T0 T1 S0 S1; do
    status=0; wait_for "${!who}" 300 || status=$?
    [ "$status" -eq 0 ] || fail "$1: $who exited $status: $(tail -n 2 "$SCRATCH/$1-$(echo "$who" | tr 'TS' 'ts').log")"
  done
}
# storm_job TAG SECONDS MAX MIN_SENT FLAGS...: runs job TAG under the storm
# once both trainers registered with both pservers; checks the storm's
# counts, the processes' exits and that the export equals calm-TAG's. The
# storm ends at MAX requests (or when the job ends); SECONDS is only a bound
# for a hung pserver: a loaded machine slows the storm and the job alike,
# so a count holds where a time window does not (under ASan beside other
# tests the CTR storm sent 7,872 requests in 15 s, 30,784 on a quiet machine).
storm_job() {
  local tag=$1 seconds=$2 max=$3 min_sent=$4 status=0 i
  shift 4
  run_job "$tag" "$@"
  for _ in $(seq 600); do
    [ "$(cat "$SCRATCH/$tag-s0.log" "$SCRATCH/$tag-s1.log" | grep -c "trainer [01] registered")" -ge 4 ] && break
    sleep 0.1
  done
  timeout $((seconds + 60)) "$STORM" --storm-seconds "$seconds" --storm-max "$max" --storm-seed 7 --mode pserver \
    --pservers "$PS" --trainers 2 --id 0 "$@" >"$SCRATCH/$tag.out" 2>&1 || status=$?
  sed "s/^/$tag: /" "$SCRATCH/$tag.out" >&2
  [ "$status" -eq 0 ] || fail "$tag: storm_client exited $status"
  wait_job "$tag"

  local result sent errors ok timeouts ended
  result=$(grep "^storm-result" "$SCRATCH/$tag.out")
  value() { sed -n "s/.* $1=\([0-9.]*\).*/\1/p" <<<"$result"; }
  sent=$(value sent) errors=$(value errors) ok=$(value ok) timeouts=$(value timeout)
  [ -n "$sent" ] || { fail "$tag: no storm result"; return; }
  ended=$(( $(value unavailable) + $(value cancelled) ))
  [ "$sent" -ge "$min_sent" ] || fail "$tag: only $sent storm requests were sent (expected $min_sent or more)"
  [ "$ok" -eq 0 ] || fail "$tag: $ok storm requests were accepted"
  [ "$timeouts" -eq 0 ] || fail "$tag: $timeouts storm requests timed out: a pserver hung"
  # UNAVAILABLE/CANCELLED only for the calls in flight when the job ended (at most one batch).
  [ "$ended" -le 32 ] || fail "$tag: $ended storm requests got UNAVAILABLE or CANCELLED"
  [ $((errors + ended)) -eq "$sent" ] || fail "$tag: $sent sent but $errors error answers and $ended at the end"
  for i in 0 1; do
    grep -q "every trainer is done" "$SCRATCH/$tag-s$i.log" || fail "$tag: pserver $i did not finish the job"
    grep -q "refused PushPull" "$SCRATCH/$tag-s$i.log" || fail "$tag: pserver $i logged no refusal of a PushPull"
  done
  cmp -s "$SCRATCH/calm-$tag.safetensors" "$SCRATCH/$tag.safetensors" ||
    fail "the stormed $tag run's parameters differ from the undisturbed run's"
}

# 1. An MLP job.
run_job calm-storm "${COMMON[@]}"
wait_job calm-storm
storm_job storm 240 12000 10000 "${COMMON[@]}"

# 2. A CTR job: sparse rows in every push and pull.
D="$SCRATCH/ctr-data"
"$BIN/gen_ctr" --out "$D" --train-rows 20000 --test-rows 1000 --scale 0.0005 --seed 5 \
  >"$SCRATCH/gen.json" || { fail "gen_ctr failed"; finish; }
CTR=(--data "$D/train.tsv" --test-data "$D/test.tsv" --model ctr:8:32,16 --epochs 10 --batch 64
     --seed 3 --threads 1 --progress-interval 0 --wire-dtype bf16)
# The storm itself first: registered on spare (async) pservers, its plain
# CTR requests are accepted and each sparse mutation gets INVALID_ARGUMENT.
start_pservers check 2 --trainers 2
status=0
timeout 60 "$STORM" --storm-register 1 --storm-max 3000 --storm-seed 3 --mode pserver --pservers "$PS" \
  --trainers 2 --id 0 --update async "${CTR[@]}" >"$SCRATCH/check.out" 2>&1 || status=$?
sed "s/^/check: /" "$SCRATCH/check.out" >&2
[ "$status" -eq 0 ] || fail "storm_client --storm-register exited $status: a sparse mutation was not refused by the sparse checks, or a plain request was refused"
for name in "too many keys" "duplicate key" "key of another pserver" "wrong values width" \
  "wrong counts width" "count of 0" "table out of range" "table twice" "rows in the wrong field"; do
  grep -q "mutation $name: INVALID_ARGUMENT [0-9]* (" "$SCRATCH/check.out" || fail "the check sent no '$name'"
done
for i in 0 1; do
  kill -0 "${SPIDS[$i]}" 2>/dev/null || fail "check: pserver $i died: $(tail -n 2 "$SCRATCH/check-s$i.log")"
  kill -9 "${SPIDS[$i]}" 2>/dev/null; wait "${SPIDS[$i]}" 2>/dev/null
done

run_job calm-ctr "${CTR[@]}"
wait_job calm-ctr
storm_job ctr 240 12000 10000 "${CTR[@]}"
for i in 0 1; do
  grep -q "refused Pull" "$SCRATCH/ctr-s$i.log" || fail "ctr: pserver $i logged no refusal of a Pull"
done
grep -q "mutation too many keys: FAILED_PRECONDITION" "$SCRATCH/ctr.out" || fail "ctr: the storm sent no sparse mutations"
finish
