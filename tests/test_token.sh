#!/usr/bin/env bash
# Shared-secret tokens and the bind rule (label "security"): a pserver with
# --token-file answers calls without the token, or with a wrong one, with
# UNAUTHENTICATED before any handler runs; the right token trains; the token
# never appears in a log; behind a token a refused trainer is told the job's
# differing values; a pserver refuses to listen beyond loopback without
# a token unless --insecure, which it warns about.
. "$(dirname "$0")/lib.sh"
require_data
SHORT=(--train-samples 2000 --test-samples 200 --max-steps 20 --progress-interval 0 --connect-timeout 10)
TOKEN="s3cret-token-$(date +%s%N)"
printf '%s\n' "$TOKEN" >"$SCRATCH/token"
printf 'wrong-token-0123456789\n' >"$SCRATCH/wrong"
printf 'short\n' >"$SCRATCH/short"
chmod 600 "$SCRATCH/token" "$SCRATCH/wrong" "$SCRATCH/short"

start_pservers ps 1 --trainers 1 --token-file "$SCRATCH/token"
S0=${SPIDS[0]}
expect_exit 1 "UNAUTHENTICATED" -- "$BIN/trainer" --mode pserver --pservers "$PS" "${SHORT[@]}"
cp "$SCRATCH/stderr" "$SCRATCH/none.log"
expect_exit 1 "missing or wrong token" -- "$BIN/trainer" --mode pserver --pservers "$PS" "${SHORT[@]}" \
  --token-file "$SCRATCH/wrong"
grep -q "registered" "$SCRATCH/ps-s0.log" && fail "a handler ran for an unauthenticated call"
expect_exit 0 "done: 1 epochs (20 steps)" -- "$BIN/trainer" --mode pserver --pservers "$PS" "${SHORT[@]}" \
  --token-file "$SCRATCH/token"
cp "$SCRATCH/stderr" "$SCRATCH/good.log"
status=0; wait_for "$S0" 20 || status=$?
[ "$status" -eq 0 ] || fail "the pserver exited $status"
grep -q "refused .*missing or wrong token" "$SCRATCH/ps-s0.log" || fail "the pserver did not log the refusals"
for log in ps-s0.log none.log good.log; do
  grep -qF "$TOKEN" "$SCRATCH/$log" && fail "the token appears in $log"
done
"$BIN/pserver" --help | grep -qF "$TOKEN" && fail "the token appears in --help"
expect_exit 2 "the token must be 16 to 255 characters" -- "$BIN/pserver" --pservers 127.0.0.1:1 --id 0 \
  --token-file "$SCRATCH/short"

# Behind a token a refused trainer is one of the job's: it is told the values that differ.
start_pservers tps 1 --trainers 2 --token-file "$SCRATCH/token" --step-timeout 60
S1=${SPIDS[0]}
start tt0 "$BIN/trainer" --mode pserver --pservers "$PS" --trainers 2 --id 0 "${SHORT[@]}" \
  --token-file "$SCRATCH/token"; T0=$LAST_PID
wait_log "$SCRATCH/tps-s0.log" "trainer 0 registered" "$S1" || fail "trainer 0 did not register: $(tail -3 "$SCRATCH/tps-s0.log")"
expect_exit 2 "; batch 32 vs 64" -- "$BIN/trainer" --mode pserver \
  --pservers "$PS" --trainers 2 --id 1 "${SHORT[@]}" --token-file "$SCRATCH/token" --batch 32
kill "$T0" "$S1" 2>/dev/null
wait_for "$T0" 10 >/dev/null 2>&1 || true
wait_for "$S1" 10 >/dev/null 2>&1 || true

# Beyond loopback: refused without a token, allowed (with a warning) by --insecure or a token.
expect_exit 2 "refusing to listen on 0.0.0.0:0" -- "$BIN/pserver" --pservers 127.0.0.1:1 \
  --id 0 --listen 0.0.0.0:0
for extra in "--insecure" "--token-file $SCRATCH/token"; do
  # shellcheck disable=SC2086
  start open "$BIN/pserver" --pservers 127.0.0.1:1 --id 0 --listen 0.0.0.0:0 $extra; pid=$LAST_PID
  wait_log "$SCRATCH/open.log" "ready:" "$pid" || fail "$extra: the pserver did not start: $(tail -3 "$SCRATCH/open.log")"
  if [ "$extra" = "--insecure" ]; then
    grep -q "with neither a token nor TLS (--insecure)" "$SCRATCH/open.log" || fail "--insecure gave no warning"
  fi
  kill "$pid"
  wait_for "$pid" 10 >/dev/null || true
done
finish
