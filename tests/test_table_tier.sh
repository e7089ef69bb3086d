#!/usr/bin/env bash
# The disk tier (--table-dir) end to end, one pserver and one trainer on a
# CTR job whose tables outgrow the budget (8,700 ids, --table-memory-mb 0.5):
# 1. exports byte-equal to the job with every row in memory and the same
#    test AUC (the evaluation is served rows from disk without bringing them
#    in), the statistics line showing rows on disk, rows read back and the
#    hit rate;
# 2. with --evict-after: rows forgotten in memory and on disk alike (byte-equal
#    to the job without a tier);
# 3. a full disk (root: a 1 MiB tmpfs in the pserver's own mount namespace):
#    the job stops at once with a clear error (trainer and pserver exit 1, no
#    checkpoint after it), and its last checkpoint resumed with room on disk
#    ends byte-equal to run 1;
# 4. a pserver in a 128 MiB memory cgroup (root, a memory controller; not the
#    sanitizer build) without a memory flag trains a job whose tables (57,000
#    ids of rows of 1 KiB: about 60 MiB) pass its budget (40% of the cgroup's
#    limit) to the end: rows on disk, no OOM kill.
# The CTR tests' tier copies (PSTRAIN_TEST_TIER) cover sync = local,
# recovery, re-sharding, GEO, SSP and the storm.
. "$(dirname "$0")/lib.sh"
D="$SCRATCH/data"
"$BIN/gen_ctr" --out "$D" --train-rows 20000 --test-rows 2000 --scale 0.0005 --seed 5 \
  >"$SCRATCH/gen.json" || { fail "gen_ctr failed"; finish; }
T=(--mode pserver --trainers 1 --data "$D/train.tsv" --test-data "$D/test.tsv" --epochs 1
   --seed 3 --threads 1 --batch 256 --progress-interval 0)
TIER=(--table-memory-mb 0.5 --log-every 20)

# job NAME TRAINER_FLAGS -- PSERVER_FLAGS...: one pserver, one trainer; the
# exit statuses in T_STATUS and S_STATUS. PSERVER_WRAP (an array) runs the
# pserver under a command (a mount namespace, a cgroup).
PSERVER_WRAP=()
job() {
  local name=$1 tflags=()
  shift
  while [ "$1" != "--" ]; do tflags+=("$1"); shift; done
  shift
  start "$name-s0" "${PSERVER_WRAP[@]}" "$BIN/pserver" --pservers 127.0.0.1:1 --id 0 \
    --listen 127.0.0.1:0 --trainers 1 "$@"
  local pid=$LAST_PID port
  port=$(ready_port "$SCRATCH/$name-s0.log" "$pid") ||
    { fail "$name: the pserver did not start: $(tail -n 3 "$SCRATCH/$name-s0.log")"; return 1; }
  T_STATUS=0
  timeout 120 "$BIN/trainer" --pservers "127.0.0.1:$port" "${T[@]}" "${tflags[@]}" \
    2>"$SCRATCH/$name-t.log" || T_STATUS=$?
  S_STATUS=0
  wait_for "$pid" 60 || S_STATUS=$?
}
# tier_line LOG: the last statistics line of the tier.
tier_line() { grep "disk tier: .* rows in memory" "$1" | tail -n 1 | sed 's/.*disk tier: //'; }

# 1. All in memory, then the tier.
job free --model ctr:8:32,16 --export "$SCRATCH/free.safetensors" -- --log-every 20
[ "$T_STATUS$S_STATUS" = 00 ] || fail "in memory: trainer $T_STATUS, pserver $S_STATUS"
job tier --model ctr:8:32,16 --export "$SCRATCH/tier.safetensors" \
  --metrics "$SCRATCH/tier-metrics.jsonl" -- "${TIER[@]}" --table-dir "$SCRATCH/tables"
[ "$T_STATUS$S_STATUS" = 00 ] || fail "tier: trainer $T_STATUS, pserver $S_STATUS: $(tail -n 2 "$SCRATCH/tier-t.log")"
cmp -s "$SCRATCH/free.safetensors" "$SCRATCH/tier.safetensors" ||
  fail "the tier's export differs from the in-memory job's"
# The evaluation's lookups are served rows from disk without bringing them in: the same AUC.
auc() { grep -o "done: .*test AUC [0-9.]*" "$1" | grep -o "[0-9.]*$"; }
[ -n "$(auc "$SCRATCH/free-t.log")" ] && [ "$(auc "$SCRATCH/free-t.log")" = "$(auc "$SCRATCH/tier-t.log")" ] ||
  fail "test AUC in memory $(auc "$SCRATCH/free-t.log"), with the tier $(auc "$SCRATCH/tier-t.log")"
grep -q "disk tier: rows past 0.4 MiB in memory move to $SCRATCH/tables/pserver-0" "$SCRATCH/tier-s0.log" ||
  fail "the tier's start is not logged: $(grep 'disk tier' "$SCRATCH/tier-s0.log" | head -n 1)"
line=$(tier_line "$SCRATCH/tier-s0.log")
echo "tier: $line" >&2
grep -qE "^[0-9]+ rows in memory, [0-9]+ buffered, [1-9][0-9]* on disk \([0-9.]+ MiB of files, [1-9][0-9]* bytes a row\); of [0-9]+ rows asked for since the last line [0-9.]+% were in memory, [0-9.]+% brought in ahead, [0-9.]+% buffered, [0-9.]+% read from disk, [0-9.]+% new; disk [0-9.]+ MB/s read, [0-9.]+ MB/s written; since the start [0-9.]+% in memory, [0-9.]+ MB read, [0-9.]+ MB written" <<<"$line" ||
  fail "the tier's statistics line: '$line'"
# The trainer's metrics rows carry the tier's figures (from the prefetches' answers).
"$PY" - "$SCRATCH/tier-metrics.jsonl" <<'PYEOF' || fail "the trainer's metrics rows lack the tier's figures"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
last = rows[-1]
assert 50 < last["tier_hit_pct"] < 100 and last["tier_ahead_pct"] > 0, last
assert last["tier_disk_read_mb"] > 0 and last["tier_disk_written_mb"] > 0, last
assert last["tier_rows_in_memory"] > 0, last
PYEOF
# The trainer sent each step's keys ahead (PULL_PREFETCH): rows came in
# from disk before their push asked (the exports above are equal all the same).
grep -qE "disk tier: .* [0-9.]*[1-9][0-9.]*% brought in ahead" "$SCRATCH/tier-s0.log" ||
  fail "no rows were brought in ahead of their step: $(grep 'asked for' "$SCRATCH/tier-s0.log" | tail -1)"
[ -z "$(ls -A "$SCRATCH/tables/pserver-0" 2>/dev/null)" ] ||
  fail "the tier's files outlived the pserver: $(ls "$SCRATCH/tables/pserver-0")"

# 2. Eviction forgets rows wherever they are (and the trainer's prefetch off:
# its pushes bring every row back themselves).
job evict --model ctr:8:32,16 --evict-after 20 --export "$SCRATCH/evict.safetensors" -- \
  --log-every 20
job evict-tier --model ctr:8:32,16 --evict-after 20 --export "$SCRATCH/evict-tier.safetensors" \
  --prefetch=false -- "${TIER[@]}" --table-dir "$SCRATCH/tables"
[ "$T_STATUS$S_STATUS" = 00 ] || fail "evict tier: trainer $T_STATUS, pserver $S_STATUS"
cmp -s "$SCRATCH/evict.safetensors" "$SCRATCH/evict-tier.safetensors" ||
  fail "--evict-after with the tier differs from without"
grep -q "table embedding: .* [1-9][0-9]* evicted" "$SCRATCH/evict-tier-s0.log" ||
  fail "--evict-after evicted nothing"
! grep -qE "[0-9.]*[1-9][0-9.]*% brought in ahead" "$SCRATCH/evict-tier-s0.log" &&
  grep -qE "[0-9.]*[1-9][0-9.]*% read from disk" "$SCRATCH/evict-tier-s0.log" ||
  fail "--prefetch=false: rows were still brought in ahead, or none read by the pushes: $(tier_line "$SCRATCH/evict-tier-s0.log")"

# 3. A full disk.
if [ "$(id -u)" != 0 ] || ! unshare -m true 2>/dev/null; then
  echo "SKIP (full disk): needs root and mount namespaces (unshare -m)" >&2
else
  CK="$SCRATCH/ck"
  mkdir -p "$SCRATCH/small"
  # The pserver's own mount namespace: the tmpfs is gone with it.
  PSERVER_WRAP=(unshare -m bash -c 'mount -t tmpfs -o size=1m tmpfs "$0" && exec "$@"'
                "$SCRATCH/small")
  job full --model ctr:8:32,16 -- --table-memory-mb 0.5 --table-dir "$SCRATCH/small" \
    --checkpoint-dir "$CK" --checkpoint-every 10
  PSERVER_WRAP=()
  [ "$T_STATUS" = 1 ] || fail "full disk: the trainer exited $T_STATUS, not 1"
  [ "$S_STATUS" = 1 ] || fail "full disk: the pserver exited $S_STATUS, not 1"
  grep -q "ERROR stopping the job: disk tier: writing rows failed: .*disk full" "$SCRATCH/full-s0.log" ||
    fail "full disk: the pserver's error: $(grep ERROR "$SCRATCH/full-s0.log" | tail -n 1)"
  grep -q "training failed: .*disk full" "$SCRATCH/full-t.log" ||
    fail "full disk: the trainer's error: $(grep ERROR "$SCRATCH/full-t.log" | tail -n 1)"
  grep -q "final checkpoint" "$SCRATCH/full-s0.log" && fail "full disk: a final checkpoint was written"
  ls "$CK" | grep -q "step-0*[1-9]" || fail "full disk: no checkpoint before the failure: $(ls "$CK")"
  job resumed --model ctr:8:32,16 --export "$SCRATCH/resumed.safetensors" -- "${TIER[@]}" \
    --table-dir "$SCRATCH/tables" --checkpoint-dir "$CK" --resume
  [ "$T_STATUS$S_STATUS" = 00 ] || fail "resumed after the full disk: trainer $T_STATUS, pserver $S_STATUS: $(tail -n 2 "$SCRATCH/resumed-t.log")"
  cmp -s "$SCRATCH/free.safetensors" "$SCRATCH/resumed.safetensors" ||
    fail "resumed after the full disk: the export differs from the uninterrupted job's"
fi

# 4. In a memory cgroup.
if ldd "$BIN/pserver" | grep -q libasan; then
  echo "SKIP (cgroup): the sanitizer build's shadow memory and quarantine are not the pserver's" >&2
elif ! memory_cgroup $((128 << 20)); then
  echo "SKIP (cgroup): $WHY" >&2
else
  trap 'cleanup; remove_cgroup' EXIT
  "$BIN/gen_ctr" --out "$SCRATCH/big" --train-rows 60000 --test-rows 2000 --scale 0.05 --seed 5 \
    >"$SCRATCH/big.json" || fail "gen_ctr failed"
  PSERVER_WRAP=(bash -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$CG_CHILD")
  T=(--mode pserver --trainers 1 --data "$SCRATCH/big/train.tsv" --test-data "$SCRATCH/big/test.tsv"
     --epochs 1 --seed 3 --threads 1 --batch 256 --progress-interval 0)
  job cg --model ctr:256:8 -- --table-dir "$SCRATCH/tables" --log-every 40
  PSERVER_WRAP=()
  [ "$T_STATUS$S_STATUS" = 00 ] ||
    fail "cgroup: trainer $T_STATUS, pserver $S_STATUS (137: killed): $(tail -n 2 "$SCRATCH/cg-s0.log")"
  line=$(tier_line "$SCRATCH/cg-s0.log")
  grep -qE " [1-9][0-9]* on disk " <<<"$line" || fail "cgroup: no rows on disk: '$line'"
  ooms=$(awk '$1 == "oom_kill" {print $2}' "$CG_OOM")
  echo "cgroup: $line; oom_kill ${ooms:-?}, peak $(cat "$CG/memory.max_usage_in_bytes" "$CG/memory.peak" 2>/dev/null | head -n 1) bytes" >&2
  [ "${ooms:-x}" = 0 ] || fail "cgroup: oom_kill is '${ooms:-unread}'"
fi
finish
