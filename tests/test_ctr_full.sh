#!/usr/bin/env bash
# The issue's bar for the CTR models (label "long"): on 2M rows of
# scripts/gen-ctr data (scale 0.01), Wide&Deep ctr:16:256,128 with one BLAS
# thread reaches a test AUC within 0.01 of the generator's Bayes AUC in at
# most 2 epochs, and LR stays visibly (>= 0.02) below it.
. "$(dirname "$0")/lib.sh"
D="$SCRATCH/data"
"$BIN/gen_ctr" --out "$D" --train-rows 2000000 --test-rows 200000 --scale 0.01 --seed 1 \
  >"$SCRATCH/gen.json" || { fail "gen_ctr failed"; finish; }
for model in ctr:16:256,128 lr; do
  "$BIN/trainer" --model "$model" --data "$D/train.tsv" --test-data "$D/test.tsv" --epochs 2 \
    --threads 1 --progress-interval 0 --metrics "$SCRATCH/${model%%:*}.jsonl" \
    2>"$SCRATCH/${model%%:*}.log" || { fail "$model failed: $(tail -3 "$SCRATCH/${model%%:*}.log")"; finish; }
done
"$PY" - "$SCRATCH/gen.json" "$SCRATCH/ctr.jsonl" "$SCRATCH/lr.jsonl" <<'PY' || fail "AUC check"
import json, sys
bayes = json.load(open(sys.argv[1]))["bayes_auc"]
wd = max(json.loads(l)["auc"] for l in open(sys.argv[2]))
lr = max(json.loads(l)["auc"] for l in open(sys.argv[3]))
print(f"Bayes AUC {bayes:.4f}; Wide&Deep best of 2 epochs {wd:.4f} ({bayes - wd:.4f} below); "
      f"LR {lr:.4f}")
assert bayes - wd <= 0.01, f"Wide&Deep {wd} is more than 0.01 below the Bayes AUC {bayes}"
assert wd - lr >= 0.02, f"LR {lr} is not visibly below Wide&Deep {wd}"
PY
finish
