#!/usr/bin/env bash
# GEO-SGD (--update geo --geo-steps K), end to end:
# - MLP, 2 pservers + 2 trainers, K = 10, a short run: a sane test accuracy;
#   every trainer exchanges ceil(steps / K) times (the last step too), the
#   pservers merge every exchange, and a trainer moves about 1/K of what a
#   sync step moves (bytes per step from the metrics);
# - the same with --wire-dtype bf16: changes and fresh values travel in bf16
#   (half the bytes), the pservers' weights stay float32, accuracy as sane;
# - CTR (generated Criteo-like data), 2 pservers + 2 trainers: geo K = 10
#   reaches sync's AUC within 0.005 while sending a fraction of its bytes;
# - a pserver SIGKILLed mid-run and restarted from its checkpoint: trainers
#   resend their change, the job finishes and trains;
# - a trainer killed and started again goes on from its last exchange with
#   the pservers' values;
# - flags: --check-config takes geo (what scripts/bench-staleness asks);
#   --geo-steps without geo, geo without it, K < 1, geo with row admission
#   or eviction, and a pserver given another K are refused with the reason.
. "$(dirname "$0")/lib.sh"
require_data
LAUNCH="$(dirname "$0")/../scripts/launch"

# jq-less field of a metrics file's last row.
last() { "$PY" -c 'import json,sys; print(json.loads(open(sys.argv[1]).readlines()[-1])[sys.argv[2]])' "$1" "$2"; }

# 1. MLP: 6000 samples a trainer, batch 64: 94 steps an epoch, 188 in all,
# so 19 exchanges each (18 of K steps and the last 8).
MLP=(--train-samples 12000 --test-samples 2000 --epochs 2 --batch 64 --optimizer momentum --lr 0.05
     --lr-schedule constant --progress-interval 0)
timeout 120 "$LAUNCH" --bin "$BIN" --pservers 2 --trainers 2 --quiet --log-dir "$SCRATCH/mlp" -- \
  "${MLP[@]}" --update geo --geo-steps 10 --metrics "$SCRATCH/mlp.jsonl" >"$SCRATCH/mlp.log" 2>&1 ||
  fail "MLP geo job failed: $(tail -3 "$SCRATCH/mlp.log")"
if [ -s "$SCRATCH/mlp.jsonl" ]; then
  acc=$(last "$SCRATCH/mlp.jsonl" test_accuracy)
  bytes=$(last "$SCRATCH/mlp.jsonl" bytes_per_step)
  echo "MLP geo K=10: test accuracy $acc, $bytes bytes per step" >&2
  [ "$(last "$SCRATCH/mlp.jsonl" mode)" = pserver-geo ] || fail "MLP: metrics mode is not pserver-geo"
  "$PY" -c "import sys; sys.exit(0 if float('$acc') >= 0.78 else 1)" || fail "MLP geo: test accuracy $acc < 0.78"
  # A sync step sends and receives the 235,146 floats: 1,881,168 bytes.
  "$PY" -c "import sys; b = float('$bytes'); sys.exit(0 if 1881168 / 12 < b < 1881168 / 8 else 1)" ||
    fail "MLP geo: $bytes bytes per step, not about a tenth of sync's 1,881,168"
  for i in 0 1; do
    grep -q "communication: 19 GEO exchanges (--geo-steps 10)" "$SCRATCH/mlp/trainer$i.log" ||
      fail "MLP: trainer $i did not make 19 exchanges: $(grep 'GEO exchanges' "$SCRATCH/mlp/trainer$i.log")"
  done
  for p in 0 1; do
    grep -q "job: geo: 38 pushes merged (--geo-steps 10)" "$SCRATCH/mlp/pserver$p.log" ||
      fail "MLP: pserver $p did not merge 38 pushes: $(grep 'geo:' "$SCRATCH/mlp/pserver$p.log" | tail -1)"
    grep -q " update=geo geo_steps=10 trainers=2 " "$SCRATCH/mlp/pserver$p.log" ||
      fail "MLP: pserver $p's job line lacks geo_steps=10"
  done
fi

# 1b. The same job with changes and fresh values in bf16.
timeout 120 "$LAUNCH" --bin "$BIN" --pservers 2 --trainers 2 --quiet --log-dir "$SCRATCH/bf16" -- \
  "${MLP[@]}" --update geo --geo-steps 10 --wire-dtype bf16 --metrics "$SCRATCH/bf16.jsonl" \
  >"$SCRATCH/bf16.log" 2>&1 || fail "MLP geo bf16 job failed: $(tail -3 "$SCRATCH/bf16.log")"
if [ -s "$SCRATCH/bf16.jsonl" ] && [ -s "$SCRATCH/mlp.jsonl" ]; then
  acc=$(last "$SCRATCH/bf16.jsonl" test_accuracy)
  bytes=$(last "$SCRATCH/bf16.jsonl" bytes_per_step)
  echo "MLP geo K=10 bf16: test accuracy $acc, $bytes bytes per step" >&2
  "$PY" -c "import sys; sys.exit(0 if float('$acc') >= 0.78 else 1)" || fail "MLP geo bf16: test accuracy $acc < 0.78"
  "$PY" -c "import sys; r = float('$bytes') / float('$(last "$SCRATCH/mlp.jsonl" bytes_per_step)')
sys.exit(0 if 0.45 < r < 0.55 else 1)" || fail "MLP geo bf16: $bytes bytes per step, not half of float32's"
  grep -q " update=geo geo_steps=10 .* wire_dtype=bf16;" "$SCRATCH/bf16/pserver0.log" ||
    fail "MLP geo bf16: pserver 0's job line lacks wire_dtype=bf16"
fi

# 2. CTR: the same data and seed, sync and geo K = 10.
D="$SCRATCH/ctr"
"$BIN/gen_ctr" --out "$D" --train-rows 40000 --test-rows 8000 --scale 0.0005 --seed 5 \
  >"$SCRATCH/gen.json" || fail "gen_ctr failed"
CTR=(--data "$D/train.tsv" --test-data "$D/test.tsv" --model ctr:8:32,16 --epochs 2 --seed 3
     --threads 1 --progress-interval 0 --batch 128)
for m in sync geo; do
  extra=()
  [ "$m" = geo ] && extra=(--update geo --geo-steps 10)
  timeout 120 "$LAUNCH" --bin "$BIN" --pservers 2 --trainers 2 --quiet --log-dir "$SCRATCH/ctr-$m" \
    -- "${CTR[@]}" --metrics "$SCRATCH/ctr-$m.jsonl" "${extra[@]}" >"$SCRATCH/ctr-$m.log" 2>&1 ||
    fail "CTR $m failed: $(tail -3 "$SCRATCH/ctr-$m.log")"
done
"$PY" - "$SCRATCH/ctr-sync.jsonl" "$SCRATCH/ctr-geo.jsonl" <<'PY' || fail "CTR geo AUC"
import json, sys
a, b = (json.loads(open(p).readlines()[-1]) for p in sys.argv[1:])
assert b["update"] == "geo", b
print(f"CTR: sync AUC {a['auc']:.4f} ({a['bytes_per_step']} bytes/step), geo K=10 AUC "
      f"{b['auc']:.4f} ({b['bytes_per_step']} bytes/step)", file=sys.stderr)
assert a["auc"] > 0.7 and abs(a["auc"] - b["auc"]) <= 0.005, (a["auc"], b["auc"])
assert b["bytes_per_step"] < a["bytes_per_step"] / 2, (a["bytes_per_step"], b["bytes_per_step"])
PY
for p in 0 1; do
  rows=$(sed -n 's/.* job: geo: 64 pushes merged (--geo-steps 10), \([0-9]*\) rows/\1/p' \
    "$SCRATCH/ctr-geo/pserver$p.log")
  [ "${rows:-0}" -gt 0 ] || fail "CTR: pserver $p did not merge 64 pushes with rows: $(grep 'geo:' "$SCRATCH/ctr-geo/pserver$p.log" | tail -1)"
done

# 3. A pserver SIGKILLed mid-run and restarted from its checkpoint.
CK="$SCRATCH/ck"
(timeout 200 "$LAUNCH" --bin "$BIN" --pservers 2 --trainers 2 --quiet --log-dir "$SCRATCH/restart" \
   --pserver-args "--checkpoint-dir $CK --checkpoint-every 50" --restart-pservers 1 -- \
   --train-samples 30000 --test-samples 1000 --max-steps 3000 --batch 32 --progress-interval 0 \
   --update geo --geo-steps 10 --metrics "$SCRATCH/restart.jsonl" \
   >"$SCRATCH/restart.log" 2>&1; echo "$?" >"$SCRATCH/restart.rc") &
LAUNCHER=$!
PIDS+=("$LAUNCHER")
# Its checkpoints are named by merged trainer steps (2 per job step): wait for one past 400.
for _ in $(seq 400); do
  ls "$CK"/pserver-1-of-2-step-000000[4-9]*.safetensors >/dev/null 2>&1 && break
  sleep 0.05
done
victim=$(sed -n 's/^launch: pserver 1 started (pid \([0-9]*\)).*/\1/p' "$SCRATCH/restart.log" | head -1)
[ -n "$victim" ] && kill -9 "$victim" || fail "restart: no pserver 1 to kill"
wait_for "$LAUNCHER" 200 >/dev/null || true
[ "$(cat "$SCRATCH/restart.rc" 2>/dev/null)" = 0 ] || fail "restart: launch failed: $(tail -3 "$SCRATCH/restart.log")"
grep -q "resumed from .* at step" "$SCRATCH/restart/pserver1.log" || fail "restart: pserver 1 did not resume"
grep -q "recovered in" "$SCRATCH/restart/trainer0.log" "$SCRATCH/restart/trainer1.log" ||
  fail "restart: no trainer recovered"
if [ -s "$SCRATCH/restart.jsonl" ]; then
  acc=$(last "$SCRATCH/restart.jsonl" test_accuracy)
  echo "pserver restart: final test accuracy $acc" >&2
  "$PY" -c "import sys; sys.exit(0 if float('$acc') > 0.78 else 1)" || fail "restart: final accuracy $acc"
fi

# 4. A trainer killed and started again: it takes the pservers' values and
# goes on from its last exchange.
AGAIN=(--train-samples 30000 --test-samples 500 --max-steps 1500 --batch 32 --progress-interval 0
       --update geo --geo-steps 10)
start_pservers again 1 --trainers 2 || finish
restart_trainer_1 again "${SPIDS[0]}" "${AGAIN[@]}"
step=$(sed -n 's/.*resuming at step \([0-9]*\) .*where the pservers are.*/\1/p' "$SCRATCH/again-t1b.log")
[ -n "$step" ] && [ $((step % 10)) -eq 0 ] && [ "$step" -gt 0 ] ||
  fail "trainer restart: trainer 1 did not resume at an exchange: '$step' $(grep resum "$SCRATCH/again-t1b.log")"
grep -q "(1500 steps)" "$SCRATCH/again-t1b.log" || fail "trainer restart: trainer 1 did not finish"

# 5. Flags.
T="$BIN/trainer"
P=(--mode pserver --pservers 127.0.0.1:1)
"$T" "${P[@]}" --update geo --geo-steps 10 --check-config >/dev/null 2>&1 ||
  fail "--check-config refuses --update geo --geo-steps 10"
expect_exit 2 "--geo-steps is for --update geo (this job's update is sync)" -- "$T" "${P[@]}" --geo-steps 10
expect_exit 2 "--update geo needs --geo-steps K" -- "$T" "${P[@]}" --update geo
expect_exit 2 "--geo-steps '0' is not an integer 1..1000000" -- "$T" "${P[@]}" --update geo --geo-steps 0
expect_exit 2 "--geo-steps '3x' is not an integer 1..1000000" -- "$T" "${P[@]}" --update geo --geo-steps 3x
expect_exit 2 "--update geo: --admit-after and --evict-after are for sync, async and ssp" -- \
  "$T" "${P[@]}" --update geo --geo-steps 10 --admit-after 2
start_pservers other 1 --trainers 2 || finish
start other-t0 "$T" --mode pserver --pservers "$PS" --trainers 2 --id 0 "${AGAIN[@]}"
for _ in $(seq 200); do
  grep -q "registered with 1 pserver" "$SCRATCH/other-t0.log" 2>/dev/null && break
  sleep 0.05
done
expect_exit 2 "job differs from trainer 0's in: geo steps" -- "$T" --mode pserver --pservers "$PS" \
  --trainers 2 --id 1 --train-samples 30000 --test-samples 500 --max-steps 1500 --batch 32 \
  --progress-interval 0 --update geo --geo-steps 5
grep -q "trainer 1's job differs from trainer 0's: geo steps 5 vs 10" "$SCRATCH/other-s0.log" ||
  fail "the pserver's log does not name geo steps 5 vs 10"
finish
