#!/usr/bin/env bash
# A pserver's sparse tables within a memory budget (--table-memory-mb; by
# default 40% of the memory limit, a cgroup's included). A CTR job whose
# tables outgrow it stops at once: the trainer's call fails
# RESOURCE_EXHAUSTED naming the table, its rows and bytes, the budget and
# where it came from, trainer and pserver exit 1, and the last checkpoint
# stays valid: resumed with a larger budget the job ends byte-equal to an
# uninterrupted run. Then, where a memory cgroup can be made (root, the
# memory controller mounted, v1 or v2; not in the sanitizer build, whose
# shadow and quarantine are not the pserver's memory), a pserver in a 128 MiB
# cgroup without the flag takes its budget from the cgroup's limit (a
# parent's: the pserver runs in a child cgroup), the job stops with the same
# error, and the cgroup counts no OOM kill.
. "$(dirname "$0")/lib.sh"
D="$SCRATCH/data"
"$BIN/gen_ctr" --out "$D" --train-rows 20000 --test-rows 2000 --scale 0.0005 --seed 5 \
  >"$SCRATCH/gen.json" || { fail "gen_ctr failed"; finish; }
T=(--mode pserver --trainers 1 --data "$D/train.tsv" --test-data "$D/test.tsv" --epochs 1
   --seed 3 --threads 1 --batch 256 --progress-interval 0)
CK="$SCRATCH/ck"

# job NAME TRAINER_FLAGS -- PSERVER_FLAGS...: one pserver, one trainer; the
# exit statuses in T_STATUS and S_STATUS.
job() {
  local name=$1 tflags=()
  shift
  while [ "$1" != "--" ]; do tflags+=("$1"); shift; done
  shift
  start_pservers "$name" 1 --trainers 1 "$@" || return 1
  T_STATUS=0
  timeout 120 "$BIN/trainer" --pservers "$PS" "${T[@]}" "${tflags[@]}" 2>"$SCRATCH/$name-t.log" ||
    T_STATUS=$?
  S_STATUS=0
  wait_for "${SPIDS[0]}" 60 || S_STATUS=$?
}

# 1. Uninterrupted, no budget to speak of.
job free --model ctr:8:32,16 --export "$SCRATCH/free.safetensors" -- --log-every 20
[ "$T_STATUS$S_STATUS" = 00 ] || fail "uninterrupted run: trainer $T_STATUS, pserver $S_STATUS"
grep -q "table memory: a CTR job's sparse tables may hold .* MiB here together (--table-memory-mb 0: 40% of" \
  "$SCRATCH/free-s0.log" || fail "the default budget is not logged: $(grep 'table memory' "$SCRATCH/free-s0.log")"
grep -q "step [0-9]*: tables: [0-9.]* MiB of their [0-9.]* MiB budget ([0-9]*%, --table-memory-mb 0: 40% of" \
  "$SCRATCH/free-s0.log" || fail "the statistics line does not show the budget's use"
last_mib() { # LOG TABLE: the table's MiB in the log's last statistics line
  sed -n "s/.*table $2: [0-9]* rows, \([0-9.]*\) MiB.*/\1/p" "$1" | tail -1
}
echo "tables at the end: wide $(last_mib "$SCRATCH/free-s0.log" wide) MiB," \
  "embedding $(last_mib "$SCRATCH/free-s0.log" embedding) MiB" >&2

# 2. A budget of 1 MiB: the tables pass it mid-epoch (about 1.3 MiB at the end).
job small --model ctr:8:32,16 -- --table-memory-mb 1 --checkpoint-dir "$CK" --checkpoint-every 20
[ "$T_STATUS" = 1 ] || fail "over the budget: the trainer exited $T_STATUS, not 1"
[ "$S_STATUS" = 1 ] || fail "over the budget: the pserver exited $S_STATUS, not 1"
want="table 'embedding' would hold [0-9]* rows in [0-9.]* MiB, and this pserver's tables together [0-9.]* MiB: past their budget of 1.0 MiB (--table-memory-mb 1) (RESOURCE_EXHAUSTED)"
grep -q "training failed: step [0-9]*: pserver 0 at .*: $want" "$SCRATCH/small-t.log" ||
  fail "the trainer's error: $(grep ERROR "$SCRATCH/small-t.log" | tail -1)"
grep -q "ERROR stopping the job: table 'embedding' would hold" "$SCRATCH/small-s0.log" ||
  fail "the pserver's error: $(grep ERROR "$SCRATCH/small-s0.log" | tail -1)"
grep -q "on disk after\|final checkpoint" "$SCRATCH/small-s0.log" &&
  fail "the failed pserver wrote a final checkpoint"
ls "$CK" | grep -q "step-0*[1-9]" || fail "no checkpoint before the failure: $(ls "$CK")"

# 3. The last checkpoint resumed with a larger budget: byte-equal to run 1.
job resumed --model ctr:8:32,16 --export "$SCRATCH/resumed.safetensors" -- \
  --table-memory-mb 4 --checkpoint-dir "$CK" --resume
[ "$T_STATUS$S_STATUS" = 00 ] || fail "resumed run: trainer $T_STATUS, pserver $S_STATUS: $(tail -2 "$SCRATCH/resumed-t.log")"
grep -q "resumed from .* at step [1-9]" "$SCRATCH/resumed-s0.log" || fail "the pserver did not resume"
cmp -s "$SCRATCH/free.safetensors" "$SCRATCH/resumed.safetensors" ||
  fail "the resumed job's export differs from the uninterrupted one's"

# 4. In a memory cgroup.
if ldd "$BIN/pserver" | grep -q libasan; then
  echo "SKIP (cgroup part): the sanitizer build's shadow memory and quarantine are not the pserver's" >&2
elif ! memory_cgroup $((128 << 20)); then
  echo "SKIP (cgroup part): $WHY" >&2
else
  trap 'cleanup; remove_cgroup' EXIT
  # Rows of 1024 floats and their state (4 KiB): the embedding's slabs double to 8192
  # rows (33.6 MB), then would double again (67 MB) past 40% of 128 MiB near the epoch's end.
  # The shell moves itself into the child cgroup, then becomes the pserver.
  start cg bash -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$CG_CHILD" "$BIN/pserver" \
    --pservers 127.0.0.1:1 --id 0 --listen 127.0.0.1:0 --trainers 1
  CGPID=$LAST_PID
  port=$(ready_port "$SCRATCH/cg.log" "$CGPID") || { fail "pserver in the cgroup: $(tail -3 "$SCRATCH/cg.log")"; finish; }
  status=0
  timeout 120 "$BIN/trainer" --pservers "127.0.0.1:$port" "${T[@]}" --model ctr:1024:8 \
    2>"$SCRATCH/cg-t.log" || status=$?
  s_status=0
  wait_for "$CGPID" 60 || s_status=$?
  source=$(grep -o "table memory: .*" "$SCRATCH/cg.log")
  echo "pserver in the cgroup: $source" >&2
  grep -q "may hold 51.2 MiB here together (--table-memory-mb 0: 40% of 128 MiB, cgroup v[12] memory[.a-z_]* of .*/pstrain-test-$$)" \
    <<<"$source" || fail "the budget does not come from the cgroup: $source"
  [ "$status" = 1 ] || fail "cgroup: the trainer exited $status, not 1"
  [ "$s_status" = 1 ] || fail "cgroup: the pserver exited $s_status, not 1 (137: killed): $(tail -2 "$SCRATCH/cg.log")"
  grep -q "past their budget of 51.2 MiB (--table-memory-mb 0: 40% of 128 MiB, cgroup" "$SCRATCH/cg-t.log" ||
    fail "cgroup: the trainer's error: $(grep ERROR "$SCRATCH/cg-t.log" | tail -1)"
  ooms=$(awk '$1 == "oom_kill" {print $2}' "$CG_OOM")
  echo "cgroup: oom_kill ${ooms:-?}, peak: $(cat "$CG/memory.max_usage_in_bytes" "$CG/memory.peak" 2>/dev/null | head -1) bytes" >&2
  [ "${ooms:-x}" = 0 ] || fail "cgroup: oom_kill is '${ooms:-unread}'"
fi
finish
