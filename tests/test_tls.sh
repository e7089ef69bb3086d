#!/usr/bin/env bash
# TLS and mutual TLS (label "security"), with certificates from
# scripts/make-certs: a 2+2 sync job over mutual TLS plus a token ends with
# bitwise the parameters (and accuracy) of the same job in plaintext; a
# trainer in plaintext, with another CA, with the wrong server name or
# without a client certificate cannot connect and says why; a trainer
# presenting trainer-1's certificate while claiming id 0 gets
# PERMISSION_DENIED and changes nothing; bad certificate flags are refused at
# start naming the file; TLS satisfies the bind rule.
. "$(dirname "$0")/lib.sh"
require_data
ROOT="$(dirname "$0")/.."
command -v openssl >/dev/null || { echo "FAIL: openssl is not installed (run scripts/setup)" >&2; exit 1; }
"$ROOT/scripts/make-certs" "$SCRATCH/certs" --trainers 2 2>"$SCRATCH/certs.log" &&
  "$ROOT/scripts/make-certs" "$SCRATCH/other" --trainers 1 2>>"$SCRATCH/certs.log" ||
  { echo "FAIL: scripts/make-certs: $(cat "$SCRATCH/certs.log")" >&2; exit 1; }
C=$SCRATCH/certs
SERVER_TLS=(--tls-cert "$C/server.pem" --tls-key "$C/server.key" --tls-ca "$C/ca.pem")
JOB=(--train-samples 2000 --test-samples 200 --max-steps 20 --progress-interval 0
     --optimizer momentum --lr 0.05 --lr-schedule constant --seed 3 --batch 32)
printf 'tls-test-token-%s\n' "$(date +%s%N)" >"$SCRATCH/token"
chmod 600 "$SCRATCH/token"

# 1. The same sync job in plaintext and over mutual TLS with a token.
for run in plain tls; do
  extra=()
  trainer_extra=()
  if [ "$run" = tls ]; then
    extra=(--tls "$C" --pserver-args "--token-file $SCRATCH/token")
    trainer_extra=(--token-file "$SCRATCH/token")
  fi
  timeout 300 "$ROOT/scripts/launch" --bin "$BIN" --pservers 2 --trainers 2 --quiet \
    --log-dir "$SCRATCH/logs-$run" "${extra[@]}" -- "${JOB[@]}" --connect-timeout 30 \
    "${trainer_extra[@]}" --export "$SCRATCH/$run.safetensors" >"$SCRATCH/launch-$run.log" 2>&1 ||
    fail "the $run job failed: $(tail -5 "$SCRATCH/launch-$run.log")"
done
cmp -s "$SCRATCH/plain.safetensors" "$SCRATCH/tls.safetensors" ||
  fail "the job over TLS ended with other parameters than in plaintext"
acc_plain=$(grep -o "test accuracy [0-9.]*" "$SCRATCH/logs-plain/trainer0.log")
acc_tls=$(grep -o "test accuracy [0-9.]*" "$SCRATCH/logs-tls/trainer0.log")
[ -n "$acc_plain" ] && [ "$acc_plain" = "$acc_tls" ] ||
  fail "accuracy over TLS '$acc_tls' differs from plaintext '$acc_plain'"
for i in 0 1; do
  grep -q "TLS, client certificates required naming the trainer id, token" \
    "$SCRATCH/logs-tls/pserver$i.log" || fail "pserver $i did not say it serves mutual TLS"
done

# 2. One pserver with mutual TLS; trainers that must fail, then the real one.
start_pservers base 1 --trainers 1
base_pid=${SPIDS[0]}
expect_exit 0 "done: 1 epochs (20 steps)" -- "$BIN/trainer" --mode pserver --pservers \
  "$PS" "${JOB[@]}" --connect-timeout 30 --export "$SCRATCH/base.safetensors"
wait_for "$base_pid" 20 >/dev/null || fail "the plaintext pserver did not exit 0"

start_pservers ps 1 --trainers 1 "${SERVER_TLS[@]}"
S0=${SPIDS[0]}
T=("$BIN/trainer" --mode pserver --pservers "$PS" "${JOB[@]}" --connect-timeout 3)
expect_exit 1 "could not reach pserver 0 at $PS within 3 s" -- "${T[@]}"
grep -qF "this trainer talks plaintext: if the pserver serves TLS, give --tls-ca" "$SCRATCH/stderr" ||
  fail "a plaintext trainer was not told about TLS: $(tail -c 400 "$SCRATCH/stderr")"
expect_exit 1 "certificate verify failed; the TLS handshake failed" -- "${T[@]}" \
  --tls-ca "$SCRATCH/other/ca.pem" --tls-cert "$SCRATCH/other/trainer-0.pem" \
  --tls-key "$SCRATCH/other/trainer-0.key"
expect_exit 1 "Peer name pserver.invalid is not in peer certificate" -- "${T[@]}" \
  --tls-ca "$C/ca.pem" --tls-server-name pserver.invalid --tls-cert "$C/trainer-0.pem" \
  --tls-key "$C/trainer-0.key"
expect_exit 1 "one with --tls-ca requires this trainer's --tls-cert and --tls-key" -- "${T[@]}" \
  --tls-ca "$C/ca.pem"
expect_exit 1 "the client certificate names trainer-1, not trainer-0" -- "${T[@]}" \
  --tls-ca "$C/ca.pem" --tls-cert "$C/trainer-1.pem" --tls-key "$C/trainer-1.key"
grep -q "(PERMISSION_DENIED)" "$SCRATCH/stderr" || fail "the impostor did not get PERMISSION_DENIED"
grep -q "registered" "$SCRATCH/ps-s0.log" && fail "a trainer registered with a refused certificate"
grep -q "refused RegisterTrainer .*names trainer-1, not trainer-0" "$SCRATCH/ps-s0.log" ||
  fail "the pserver did not log the impostor"
# The real trainer 0 (with --tls-server-name, as across hosts reached by IP):
# its result equals the plaintext run, so nothing above changed the pserver.
expect_exit 0 "done: 1 epochs (20 steps)" -- "${T[@]}" --tls-ca "$C/ca.pem" \
  --tls-cert "$C/trainer-0.pem" --tls-key "$C/trainer-0.key" --tls-server-name localhost \
  --export "$SCRATCH/mtls.safetensors"
cmp -s "$SCRATCH/base.safetensors" "$SCRATCH/mtls.safetensors" ||
  fail "the pserver's parameters differ after the refused trainers"
status=0; wait_for "$S0" 20 || status=$?
[ "$status" -eq 0 ] || fail "the mutual-TLS pserver exited $status"

# 3. Certificate flags checked at start, naming the file.
# Nothing below binds a fixed port: a pserver listens on port 0 (the kernel
# picks) and trainers that must fail before connecting get a placeholder.
port=1
P=(--pservers "127.0.0.1:$port" --id 0)
expect_exit 2 "--tls-cert $SCRATCH/missing.pem: No such file or directory" -- "$BIN/pserver" \
  "${P[@]}" --tls-cert "$SCRATCH/missing.pem" --tls-key "$C/server.key"
expect_exit 2 "--tls-cert $C/server.key: no PEM certificate in it" -- "$BIN/pserver" "${P[@]}" \
  --tls-cert "$C/server.key" --tls-key "$C/server.key"
expect_exit 2 "--tls-cert and --tls-key go together" -- "$BIN/pserver" "${P[@]}" \
  --tls-cert "$C/server.pem"
expect_exit 2 "--tls-ca needs --tls-cert and --tls-key" -- "$BIN/pserver" "${P[@]}" \
  --tls-ca "$C/ca.pem"
expect_exit 2 "gRPC refused the certificate $C/server.pem with the key $C/trainer-0.key" -- \
  "$BIN/pserver" "${P[@]}" --tls-cert "$C/server.pem" --tls-key "$C/trainer-0.key"
expect_exit 2 "--tls-ca $SCRATCH/missing.pem: No such file or directory" -- "$BIN/trainer" \
  --mode pserver --pservers "127.0.0.1:$port" --tls-ca "$SCRATCH/missing.pem"
expect_exit 2 "TLS needs --tls-ca" -- "$BIN/trainer" --mode pserver --pservers "127.0.0.1:$port" \
  --tls-cert "$C/trainer-0.pem" --tls-key "$C/trainer-0.key"
PSTRAIN_TLS_CA="$SCRATCH/missing-env.pem" expect_exit 2 "--tls-ca $SCRATCH/missing-env.pem" -- \
  "$BIN/trainer" --mode pserver --pservers "127.0.0.1:$port"

# 4. The bind rule: beyond loopback, TLS alone suffices; nothing is refused.
expect_exit 2 "with neither --token-file nor TLS" -- "$BIN/pserver" "${P[@]}" \
  --listen "0.0.0.0:0"
start open "$BIN/pserver" "${P[@]}" --listen "0.0.0.0:0" --tls-cert "$C/server.pem" \
  --tls-key "$C/server.key"; pid=$LAST_PID
wait_log "$SCRATCH/open.log" "ready:" "$pid" || true
grep -qE "ready: .*listening on 0.0.0.0:0 \(port [1-9][0-9]*, TLS\)" "$SCRATCH/open.log" || fail "a TLS pserver on 0.0.0.0 did not start"
grep -q "neither a token nor TLS" "$SCRATCH/open.log" && fail "a TLS pserver on 0.0.0.0 warned about --insecure"
kill "$pid"
wait_for "$pid" 10 >/dev/null || true
finish
