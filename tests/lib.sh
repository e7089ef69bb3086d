# Helpers for pstrain's shell tests: checks that count failures and a
# scratch folder removed on exit. Source it; pass the build's bin folder as $1.
set -u
BIN=${1:?usage: test.sh BUILD_BIN_DIR}
failures=0
SCRATCH=$(mktemp -d /tmp/pstrain-test.XXXXXX)
PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  # PSTRAIN_TEST_KEEP=DIR: the scratch folder (logs) is kept there, for a failure's post-mortem.
  if [ -n "${PSTRAIN_TEST_KEEP:-}" ]; then rm -rf "$PSTRAIN_TEST_KEEP"; cp -r "$SCRATCH" "$PSTRAIN_TEST_KEEP"; fi
  rm -rf "$SCRATCH"
}
trap cleanup EXIT
# Open MPI's session folder, private to this test: jobs of concurrent tests
# sharing /tmp/ompi.HOST.UID race on its creation and removal.
export OMPI_MCA_orte_tmpdir_base="$SCRATCH"
DATA=${PSTRAIN_TEST_DATA:-/usr/share/datasets/fashion-mnist}
# PSTRAIN_TEST_TIER=MB: every pserver the test starts (start_pservers,
# scripts/launch) keeps its sparse tables within MB MiB and the rest on disk
# (--table-dir): the "tier" copies of the CTR tests run their checks so.
PSERVER_EXTRA=()
if [ -n "${PSTRAIN_TEST_TIER:-}" ]; then
  PSERVER_EXTRA=(--table-dir "$SCRATCH/tier" --table-memory-mb "$PSTRAIN_TEST_TIER")
  export PSTRAIN_PSERVER_ARGS="${PSERVER_EXTRA[*]}"
fi
# Debian's python3, which scripts/setup gives numpy; another python3 may come first on PATH.
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3

fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# require_data: the real data set is installed by scripts/setup; without it the
# test cannot say anything, and that is a failure, not a skip.
require_data() {
  [ -f "$DATA/train-images-idx3-ubyte.gz" ] || { echo "FAIL: no data set in $DATA (run scripts/setup)" >&2; exit 1; }
}

# expect_exit STATUS MESSAGE -- COMMAND...: runs COMMAND and checks its exit
# status and that its stderr contains MESSAGE.
expect_exit() {
  local want=$1 message=$2
  shift 3
  local out="$SCRATCH/stderr" status=0
  "$@" >"$SCRATCH/stdout" 2>"$out" || status=$?
  if [ "$status" -ne "$want" ]; then
    fail "'$*' exited $status, expected $want; stderr: $(tail -c 400 "$out")"
  elif ! grep -qF -- "$message" "$out"; then
    fail "'$*' stderr lacks '$message': $(tail -c 400 "$out")"
  fi
}

# flip_bit FILE OFFSET [BIT]: flips one bit (default the lowest) of the byte
# at OFFSET in place, so the file differs from the original whatever the
# byte was (writing a fixed value changes nothing when the byte had it).
flip_bit() {
  "$PY" -c 'import sys
path, at, bit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(path, "r+b") as f:
    f.seek(at); b = f.read(1)
    assert len(b) == 1, f"{path} has no byte at {at}"
    f.seek(at); f.write(bytes([b[0] ^ (1 << bit)]))' "$1" "$2" "${3:-0}"
}

# free_ports N: N TCP ports on 127.0.0.1 for a daemon that cannot take port
# 0 (its port must be known before it starts). They lie below the kernel's
# ephemeral range, so no connect() or bind to port 0 of any process takes
# one before the daemon binds it (a port from bind(0), released, was once
# taken that way under load), and they are reserved for 30 minutes in a
# file shared by the tests (under flock), so two tests never get the same.
free_ports() {
  "$PY" - "$1" <<'PY'
import fcntl, json, os, random, socket, sys, time
want = int(sys.argv[1])
with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
    ephemeral_low = int(f.read().split()[0])
low, high = 10000, ephemeral_low - 1
assert high - low > 1000, f"ephemeral ports start at {ephemeral_low}: no room below"
path = f"/tmp/pstrain-test-ports-{os.getuid()}.json"
with open(path, "a+") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    f.seek(0)
    try:
        reserved = {int(p): t for p, t in json.loads(f.read() or "{}").items()}
    except ValueError:
        reserved = {}
    now = time.time()
    reserved = {p: t for p, t in reserved.items() if now - t < 1800}
    picked = []
    while len(picked) < want:
        port = random.randint(low, high)
        if port in reserved or port in picked:
            continue
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            s.close()
        picked.append(port)
    for port in picked:
        reserved[port] = now
    f.seek(0)
    f.truncate()
    f.write(json.dumps(reserved))
print(" ".join(map(str, picked)))
PY
}

# start_pservers PREFIX COUNT [PSERVER FLAGS...]: starts COUNT pservers (logs
# PREFIX-s0.log ...) on ports the kernel picks, waits for each one's "ready"
# line and reads its port from it, so no port is bound, released and hoped
# to be still free. Sets PS (the list for trainers) and SPIDS (their pids).
# A pserver takes only its own entry and the count from --pservers, and
# --listen overrides the entry, so the list it gets holds placeholders.
start_pservers() {
  local prefix=$1 count=$2 i port placeholders=""
  shift 2
  for ((i = 0; i < count; i++)); do placeholders+="${placeholders:+,}127.0.0.1:$((i + 1))"; done
  SPIDS=()
  PS=""
  for ((i = 0; i < count; i++)); do
    start "$prefix-s$i" "$BIN/pserver" --pservers "$placeholders" --id "$i" --listen 127.0.0.1:0 "$@" \
      "${PSERVER_EXTRA[@]}"
    SPIDS+=("$LAST_PID")
  done
  for ((i = 0; i < count; i++)); do
    port=$(ready_port "$SCRATCH/$prefix-s$i.log" "${SPIDS[$i]}") ||
      { fail "pserver $prefix-s$i did not get ready: $(tail -3 "$SCRATCH/$prefix-s$i.log")"; return 1; }
    PS+="${PS:+,}127.0.0.1:$port"
  done
}

# ready_port LOG PID: the port in LOG's "ready:" line, waiting up to 30 s
# while PID runs; fails when it exits or time is up.
ready_port() {
  local log=$1 pid=$2 port
  for _ in $(seq 300); do
    port=$(sed -n 's/.* ready: .*(port \([0-9][0-9]*\),.*/\1/p' "$log" 2>/dev/null | head -1)
    [ -n "$port" ] && { echo "$port"; return 0; }
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# wait_log LOG PATTERN PID [SECONDS]: waits (default 60 s) until LOG has a
# line matching PATTERN (grep -E); fails at once when PID exits first. Loaded
# CI machines (sanitizers, parallel tests) start daemons in seconds, not tenths.
wait_log() {
  local log=$1 pattern=$2 pid=$3 limit=${4:-60} i
  for ((i = 0; i < limit * 10; i++)); do
    grep -qE "$pattern" "$log" 2>/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || { grep -qE "$pattern" "$log" 2>/dev/null; return; }
    sleep 0.1
  done
  return 1
}

# restart_trainer_1 PREFIX PSERVER-PID ARGS...: trainers 0 and 1 of a 2-trainer
# job on $PS (logs PREFIX-t0, PREFIX-t1), trainer 1 SIGKILLed once training
# and started again (PREFIX-t1b); waits for both trainers and the pserver,
# each of which must exit 0 within 60 s.
restart_trainer_1() {
  local prefix=$1 server=$2 t0 t1 pid status
  shift 2
  start "$prefix-t0" "$BIN/trainer" --mode pserver --pservers "$PS" --trainers 2 --id 0 "$@"; t0=$LAST_PID
  start "$prefix-t1" "$BIN/trainer" --mode pserver --pservers "$PS" --trainers 2 --id 1 "$@"; t1=$LAST_PID
  wait_log "$SCRATCH/$prefix-t1.log" "training mlp" "$t1" 10 || fail "trainer restart: trainer 1 did not start"
  sleep 0.5
  kill -9 "$t1"
  start "$prefix-t1b" "$BIN/trainer" --mode pserver --pservers "$PS" --trainers 2 --id 1 "$@"; t1=$LAST_PID
  # 1500 steps under ASan take ~50 s alone (main's build and this one alike), more beside
  # another test: 60 s timed out in CI.
  for pid in "$t0" "$t1" "$server"; do
    status=0; wait_for "$pid" 240 || status=$?
    [ "$status" -eq 0 ] || fail "trainer restart: process $pid exited $status"
  done
}

# start NAME COMMAND...: runs COMMAND in the background, output in
# $SCRATCH/NAME.log; its pid is recorded (killed at exit) and left in $LAST_PID.
start() {
  local name=$1
  shift
  "$@" >"$SCRATCH/$name.log" 2>&1 &
  LAST_PID=$!
  PIDS+=("$LAST_PID")
}

# wait_for PID SECONDS: the exit status of PID, or 124 after killing it when
# it runs longer than SECONDS.
wait_for() {
  local pid=$1 limit=$2 waited=0
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$waited" -ge $((limit * 10)) ]; then
      kill -9 "$pid" 2>/dev/null
      wait "$pid" 2>/dev/null
      return 124
    fi
    sleep 0.1
    waited=$((waited + 1))
  done
  wait "$pid"
}

finish() {
  # A tier copy proves nothing unless rows went to disk and came back (read
  # by a request, or by a prefetch ahead of it).
  if [ -n "${PSTRAIN_TEST_TIER:-}" ]; then
    grep -rqE "disk tier: .* [1-9][0-9]* on disk .* ([0-9.]*[1-9][0-9.]*% brought in ahead|[0-9.]*[1-9][0-9.]*% read from disk)" "$SCRATCH" ||
      fail "PSTRAIN_TEST_TIER=$PSTRAIN_TEST_TIER: no pserver read rows back from disk (statistics lines with --log-every)"
  fi
  if [ "$failures" -ne 0 ]; then
    echo "$(basename "$0"): $failures check(s) failed" >&2
    exit 1
  fi
  echo "$(basename "$0"): all checks passed" >&2
  exit 0
}

# memory_cgroup BYTES: a cgroup limited to BYTES with a child the pserver
# goes into; sets CG (the limited one), CG_CHILD and CG_OOM (the file
# counting OOM kills); returns 1 with WHY where none can be made.
memory_cgroup() {
  local bytes=$1 mounts v1 v2
  [ "$(id -u)" = 0 ] || { WHY="not root"; return 1; }
  mounts=$(awk '{for (i = 7; i <= NF; i++) if ($i == "-") { print $(i + 1), $5, $(i + 3); break }}' \
    /proc/self/mountinfo)
  v1=$(awk '$1 == "cgroup" && $3 ~ /(^|,)memory(,|$)/ {print $2; exit}' <<<"$mounts")
  v2=$(awk '$1 == "cgroup2" {print $2; exit}' <<<"$mounts")
  if [ -n "$v1" ] && [ -w "$v1" ]; then
    CG="$v1/pstrain-test-$$"
    mkdir "$CG" 2>/dev/null && mkdir "$CG/pserver" &&
      echo "$bytes" >"$CG/memory.limit_in_bytes" ||
      { WHY="cannot make a v1 memory cgroup in $v1"; rmdir "$CG/pserver" "$CG" 2>/dev/null; return 1; }
    CG_OOM="$CG/memory.oom_control"
  elif [ -n "$v2" ] && grep -qw memory "$v2/cgroup.controllers" 2>/dev/null; then
    CG="$v2/pstrain-test-$$"
    echo +memory >"$v2/cgroup.subtree_control" 2>/dev/null && mkdir "$CG" 2>/dev/null &&
      echo +memory >"$CG/cgroup.subtree_control" && mkdir "$CG/pserver" &&
      echo "$bytes" >"$CG/memory.max" ||
      { WHY="cannot make a v2 memory cgroup in $v2"; rmdir "$CG/pserver" "$CG" 2>/dev/null; return 1; }
    CG_OOM="$CG/memory.events"
  else
    WHY="no memory cgroup controller mounted"
    return 1
  fi
  CG_CHILD="$CG/pserver"
}
remove_cgroup() { # once its processes are gone (killed ones take a moment)
  for _ in $(seq 100); do
    rmdir "$CG_CHILD" "$CG" 2>/dev/null && return 0
    [ -d "$CG" ] || return 0
    sleep 0.05
  done
  echo "could not remove the cgroup $CG" >&2
}

# shards_counted WHAT PSERVER0_LOG EXAMPLES EPOCHS ROWS...: handed-out data
# (--shard-steps): pserver 0 counted each epoch's examples once, and the
# trainers' metrics rows plus the gone processes' counts say the same.
shards_counted() {
  local what=$1 log=$2 examples=$3 epochs=$4 e
  shift 4
  for ((e = 1; e <= epochs; e++)); do
    grep -qF "shards: epoch $e trained: $examples examples of $examples " "$log" ||
      fail "$what: pserver 0 did not count epoch $e's $examples examples once: $(grep -F "epoch $e trained" "$log")"
  done
  "$PY" "$(dirname "${BASH_SOURCE[0]}")/shard_counts.py" "$log" "$examples" "$epochs" "$@" ||
    fail "$what: the trainers' examples_applied plus the gone processes' do not add up per epoch"
}

# fixed_two METRIC NAME TRAINER_FLAGS...: a fixed job of 2 pservers and 2
# trainers (--id 0 and 1 added); prints trainer 0's last METRIC (the
# baseline an elastic job is held to), or fails.
fixed_two() {
  local metric=$1 name=$2 pid status
  shift 2
  start_pservers "$name" 2 --trainers 2 || return 1
  start "$name-t0" "$BIN/trainer" --pservers "$PS" --trainers 2 --id 0 "$@" \
    --metrics "$SCRATCH/$name.jsonl"
  local t0=$LAST_PID
  start "$name-t1" "$BIN/trainer" --pservers "$PS" --trainers 2 --id 1 "$@"
  for pid in "$t0" "$LAST_PID" "${SPIDS[@]}"; do
    status=0; wait_for "$pid" 240 || status=$?
    [ "$status" -eq 0 ] || { fail "$name: process $pid exited $status"; return 1; }
  done
  "$PY" -c 'import json,sys; print(json.loads(open(sys.argv[1]).readlines()[-1])[sys.argv[2]])' \
    "$SCRATCH/$name.jsonl" "$metric"
}

# within A B BOUND: |A - B| <= BOUND.
within() { "$PY" -c 'import sys; a, b, d = map(float, sys.argv[1:]); sys.exit(abs(a - b) > d)' "$@"; }
