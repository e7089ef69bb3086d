# Test hosts for cross-host tests (scripts/testnet); source after lib.sh.
# net_up N [GBIT]: makes N hosts h0.. (10.88.0.1..) owned by this test and
# removed when it exits (also when killed: the next `testnet up` or `gc`
# removes nets whose owner is gone); exits 77 where namespaces cannot be made.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TESTNET="$ROOT/scripts/testnet"
net_down() {
  if [ -n "${PSTRAIN_TESTNET:-}" ]; then "$TESTNET" down || true; fi
  PSTRAIN_TESTNET=""
}
trap 'net_down; cleanup' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
net_up() {
  local out status=0
  out=$("$TESTNET" up "$1" ${2:+--gbit "$2"} --owner $$ 2>"$SCRATCH/testnet.err") || status=$?
  if [ "$status" -eq 77 ]; then
    echo "SKIP: $(cat "$SCRATCH/testnet.err")" >&2
    exit 77
  fi
  [ "$status" -eq 0 ] || { echo "FAIL: testnet up $*: $(cat "$SCRATCH/testnet.err")" >&2; exit 1; }
  eval "$out"
}
# on HOST CMD...: runs CMD on a test host.
on() { local h=$1; shift; "$TESTNET" run "$h" -- "$@"; }
