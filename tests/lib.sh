# Helpers for pstrain's shell tests: checks that count failures and a
# scratch folder removed on exit. Source it; pass the build's bin folder as $1.
set -u
BIN=${1:?usage: test.sh BUILD_BIN_DIR}
failures=0
SCRATCH=$(mktemp -d /tmp/pstrain-test.XXXXXX)
trap 'rm -rf "$SCRATCH"' EXIT
DATA=${PSTRAIN_TEST_DATA:-/usr/share/datasets/fashion-mnist}

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

finish() {
  if [ "$failures" -ne 0 ]; then
    echo "$(basename "$0"): $failures check(s) failed" >&2
    exit 1
  fi
  echo "$(basename "$0"): all checks passed" >&2
  exit 0
}
