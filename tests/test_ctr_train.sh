#!/usr/bin/env bash
# The CTR models in one process (label "train"), on scripts/gen-ctr data:
# Wide&Deep learns (test AUC well above chance and above LR's), DeepFM as
# well as it (AUC >= Wide&Deep's - 0.003), its export
# read by numpy gives the AUC the trainer reported, a run resumed from a
# checkpoint ends bitwise equal to an uninterrupted one, and bad data, a
# table over its --max-table-mb and another job's checkpoint are refused by
# name. Admission and eviction show in the table statistics.
. "$(dirname "$0")/lib.sh"
D="$SCRATCH/data"
"$BIN/gen_ctr" --out "$D" --train-rows 40000 --test-rows 8000 --scale 0.0005 --seed 5 \
  >"$SCRATCH/gen.json" || { fail "gen_ctr failed"; finish; }
BAYES=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["bayes_auc"])' "$SCRATCH/gen.json")
COMMON=(--data "$D/train.tsv" --test-data "$D/test.tsv" --batch 256 --seed 3 --threads 1
        --progress-interval 0)
metric() { "$PY" -c 'import json,sys; print(json.loads(open(sys.argv[1]).readlines()[-1])[sys.argv[2]])' "$1" "$2"; }

# 1. Wide&Deep and LR learn; Wide&Deep beats LR.
"$BIN/trainer" "${COMMON[@]}" --model ctr:8:32,16 --epochs 2 --metrics "$SCRATCH/wd.jsonl" \
  --export "$SCRATCH/wd.safetensors" 2>"$SCRATCH/wd.log" ||
  { fail "ctr run failed: $(tail -3 "$SCRATCH/wd.log")"; finish; }
"$BIN/trainer" "${COMMON[@]}" --model lr --epochs 2 --metrics "$SCRATCH/lr.jsonl" \
  2>"$SCRATCH/lr.log" || { fail "lr run failed: $(tail -3 "$SCRATCH/lr.log")"; finish; }
WD=$(metric "$SCRATCH/wd.jsonl" auc); LR=$(metric "$SCRATCH/lr.jsonl" auc)
echo "Bayes AUC $BAYES, Wide&Deep $WD, LR $LR" >&2
"$PY" -c "import sys; b,w,l=map(float,sys.argv[1:]); sys.exit(0 if w > 0.65 and w > l and w <= b + 0.01 else 1)" \
  "$BAYES" "$WD" "$LR" || fail "AUCs out of order: Bayes $BAYES, Wide&Deep $WD, LR $LR"
# DeepFM on the same data: an AUC at least Wide&Deep's - 0.003. Its rows take a
# smaller --sparse-lr: a row's FM gradient sums the other 25 fields' rows (at
# the default 0.05 it overfits these 40,000 rows: 0.820 vs 0.835).
"$BIN/trainer" "${COMMON[@]}" --model deepfm:8:32,16 --epochs 2 --sparse-lr 0.01 \
  --metrics "$SCRATCH/fm.jsonl" \
  2>"$SCRATCH/fm.log" || fail "deepfm run failed: $(tail -3 "$SCRATCH/fm.log")"
FM=$(metric "$SCRATCH/fm.jsonl" auc)
echo "DeepFM $FM" >&2
"$PY" -c "import sys; w,f=map(float,sys.argv[1:]); sys.exit(0 if f >= w - 0.003 else 1)" "$WD" "$FM" ||
  fail "DeepFM's AUC $FM is below Wide&Deep's $WD - 0.003"
[ "$(wc -l <"$SCRATCH/wd.jsonl")" -eq 2 ] || fail "expected one metrics row per epoch"
grep -q '"examples_per_s"' "$SCRATCH/wd.jsonl" || fail "metrics rows lack examples_per_s"
grep -q "table embedding: [0-9]* rows" "$SCRATCH/wd.log" || fail "no table statistics in the log"

# 2. numpy recomputes the reported AUC from the export.
out=$(cd "$(dirname "$0")" && "$PY" ctr_forward.py "$SCRATCH/wd.safetensors" "$D/test.tsv") ||
  fail "numpy could not read the export"
"$PY" -c 'import json,sys; a=json.loads(sys.argv[1]); b=float(sys.argv[2]); ll=float(sys.argv[3])
sys.exit(0 if abs(a["auc"]-b) < 1e-3 and abs(a["logloss"]-ll) < 1e-3 else 1)' \
  "$out" "$WD" "$(metric "$SCRATCH/wd.jsonl" logloss)" ||
  fail "numpy on the export: $out; the trainer reported AUC $WD"

# 3. Resume: from a mid-run checkpoint to the end, bitwise equal to the uninterrupted run.
CK="$SCRATCH/ck"
"$BIN/trainer" "${COMMON[@]}" --model ctr:8:32,16 --epochs 2 --checkpoint-dir "$CK" \
  --checkpoint-every 40 --export "$SCRATCH/a.safetensors" 2>"$SCRATCH/a.log" ||
  fail "checkpointing run failed: $(tail -3 "$SCRATCH/a.log")"
cmp -s "$SCRATCH/a.safetensors" "$SCRATCH/wd.safetensors" || fail "checkpoints changed the result"
mid=$(ls "$CK" | grep -o "[0-9]*" | sort -n | head -1)
mid=$((10#$mid))
[ "$mid" -gt 0 ] && [ "$mid" -lt 313 ] || fail "no mid-run checkpoint kept (oldest: step $mid)"
"$BIN/trainer" "${COMMON[@]}" --model ctr:8:32,16 --epochs 2 --checkpoint-dir "$CK" \
  --checkpoint-every 40 --resume --resume-step "$mid" --export "$SCRATCH/b.safetensors" \
  2>"$SCRATCH/b.log" || fail "resume failed: $(tail -3 "$SCRATCH/b.log")"
grep -q "resuming from .* at step $mid" "$SCRATCH/b.log" || fail "did not resume at step $mid"
cmp -s "$SCRATCH/a.safetensors" "$SCRATCH/b.safetensors" ||
  fail "the resumed run's model and tables differ from the uninterrupted run's"
expect_exit 2 "is another job's (this job vs the file's: sparse tables adagrad lr=0.10000000000000001" -- "$BIN/trainer" "${COMMON[@]}" --model ctr:8:32,16 \
  --epochs 2 --checkpoint-dir "$CK" --resume --sparse-lr 0.1
expect_exit 2 "is another job's" -- "$BIN/trainer" "${COMMON[@]}" --model ctr:8:16 --epochs 2 \
  --checkpoint-dir "$CK" --resume

# 4. Bad data: stopped at the line, or skipped and counted.
head -100 "$D/train.tsv" >"$SCRATCH/bad.tsv"
sed -n 101p "$D/train.tsv" | cut -f1-39 >>"$SCRATCH/bad.tsv"
sed -n 102,300p "$D/train.tsv" >>"$SCRATCH/bad.tsv"
expect_exit 1 "bad.tsv:101: 39 fields" -- "$BIN/trainer" --data "$SCRATCH/bad.tsv" --model lr \
  --batch 50 --progress-interval 0
"$BIN/trainer" --data "$SCRATCH/bad.tsv" --model lr --batch 50 --skip-bad-lines \
  --progress-interval 0 2>"$SCRATCH/skip.log" || fail "--skip-bad-lines run failed: $(tail -2 "$SCRATCH/skip.log")"
grep -q "skipped 1 malformed line" "$SCRATCH/skip.log" || fail "the skipped line was not reported"
# A bad line in an epoch's last, partial batch stops the job too (it was dropped
# with every line after it, exit 0); skipped, the rest trains: the export equals
# that of the file without the line.
bad_label_at() { # bad_label_at LINES AT OUT: the first LINES of train.tsv, label 2 at line AT
  head -"$1" "$D/train.tsv" | awk -F'\t' -v OFS='\t' -v at="$2" 'NR == at { $1 = "2" } { print }' >"$3"
}
for c in "3000 2900 512" "100 60 512"; do
  read -r lines at batch <<<"$c"
  bad_label_at "$lines" "$at" "$SCRATCH/late.tsv"
  sed "${at}d" "$SCRATCH/late.tsv" >"$SCRATCH/late-clean.tsv"
  expect_exit 1 "late.tsv:$at: label '2'" -- "$BIN/trainer" --data "$SCRATCH/late.tsv" \
    --model ctr:4:8 --batch "$batch" --progress-interval 0
  "$BIN/trainer" --data "$SCRATCH/late.tsv" --model ctr:4:8 --batch "$batch" --skip-bad-lines \
    --progress-interval 0 --export "$SCRATCH/late.safetensors" 2>"$SCRATCH/late.log" ||
    fail "--skip-bad-lines, bad line $at of $lines: $(tail -2 "$SCRATCH/late.log")"
  grep -q "skipped 1 malformed line" "$SCRATCH/late.log" ||
    fail "bad line $at of $lines: the skipped line was not reported"
  "$BIN/trainer" --data "$SCRATCH/late-clean.tsv" --model ctr:4:8 --batch "$batch" \
    --progress-interval 0 --export "$SCRATCH/late-clean.safetensors" 2>"$SCRATCH/late-clean.log" ||
    fail "the file without line $at: $(tail -2 "$SCRATCH/late-clean.log")"
  cmp -s "$SCRATCH/late.safetensors" "$SCRATCH/late-clean.safetensors" ||
    fail "bad line $at of $lines skipped: the model differs from training without the line"
done
# Skipped lines that empty an epoch's last step: every epoch still takes its
# steps (the empty one does nothing), so a resume finds the data by its step
# (it resumed at the wrong place when an epoch ended early).
bad_label_at 2561 100 "$SCRATCH/short.tsv"
SHORT=(--data "$SCRATCH/short.tsv" --model ctr:4:8 --batch 512 --epochs 2 --skip-bad-lines
       --progress-interval 0 --checkpoint-dir "$SCRATCH/short-ck")
"$BIN/trainer" "${SHORT[@]}" --checkpoint-every 4 --export "$SCRATCH/short-a.safetensors" \
  2>"$SCRATCH/short-a.log" || fail "short epochs: $(tail -2 "$SCRATCH/short-a.log")"
grep -q "done: 2 epochs (12 steps)" "$SCRATCH/short-a.log" ||
  fail "short epochs: not 6 steps an epoch: $(grep -o 'done: .*steps)' "$SCRATCH/short-a.log")"
"$BIN/trainer" "${SHORT[@]}" --resume --resume-step 8 --export "$SCRATCH/short-b.safetensors" \
  2>"$SCRATCH/short-b.log" || fail "short epochs, resumed: $(tail -2 "$SCRATCH/short-b.log")"
cmp -s "$SCRATCH/short-a.safetensors" "$SCRATCH/short-b.safetensors" ||
  fail "short epochs: the run resumed at step 8 differs from the uninterrupted one"
expect_exit 2 "not a Criteo TSV file" -- "$BIN/trainer" --model lr --data "$DATA"
expect_exit 2 "--test-data $SCRATCH/none.tsv: cannot read: No such file" -- "$BIN/trainer" --model lr \
  --data "$D/train.tsv" --test-data "$SCRATCH/none.tsv"
# Pserver mode (tests/test_ctr_pserver.sh): a pserver that is not there is named.
expect_exit 1 "could not reach pserver 0 at 127.0.0.1:1 within 1 s" -- "$BIN/trainer" --model lr \
  --data "$D/train.tsv" --mode pserver --pservers 127.0.0.1:1 --connect-timeout 1

# --timeline: every step's pull, forward, backward and apply, in that order.
"$BIN/trainer" "${COMMON[@]}" --model deepfm:8:32,16 --max-steps 12 --timeline "$SCRATCH/tl.json" \
  --timeline-steps 3:7 2>"$SCRATCH/tl.log" || fail "--timeline run failed: $(tail -2 "$SCRATCH/tl.log")"
"$PY" "$(dirname "$0")/ctr_timeline_check.py" "$SCRATCH/tl.json" 3 7 pull,forward,backward,apply ||
  fail "CTR timeline: $(head -c 300 "$SCRATCH/tl.json")"

# --eval-every: rows mid-epoch too, each with its step.
"$BIN/trainer" "${COMMON[@]}" --model lr --eval-every 50 --metrics "$SCRATCH/ee.jsonl" \
  2>"$SCRATCH/ee.log" || fail "--eval-every run failed: $(tail -2 "$SCRATCH/ee.log")"
steps=$("$PY" -c 'import json,sys; print(",".join(str(json.loads(l)["step"]) for l in open(sys.argv[1])))' "$SCRATCH/ee.jsonl")
[ "$steps" = "50,100,150,157" ] || fail "--eval-every 50: metrics rows at steps $steps, expected 50,100,150,157"

# 5. Table limit, admission and eviction.
expect_exit 1 "table 'embedding'" -- "$BIN/trainer" "${COMMON[@]}" --model ctr:8:32,16 \
  --max-table-mb 0.05
"$BIN/trainer" "${COMMON[@]}" --model ctr:8:32,16 --admit-after 3 --evict-after 20 \
  --metrics "$SCRATCH/ae.jsonl" 2>"$SCRATCH/ae.log" || fail "admission/eviction run failed: $(tail -3 "$SCRATCH/ae.log")"
"$PY" -c 'import json,sys; r=json.loads(open(sys.argv[1]).readlines()[-1])
sys.exit(0 if r["embedding_refused"] > 0 and r["embedding_evicted"] > 0 and r["embedding_admitted"] > r["embedding_rows"] and r["auc"] > 0.6 else 1)' \
  "$SCRATCH/ae.jsonl" || fail "admission/eviction: $(tail -1 "$SCRATCH/ae.jsonl")"
finish
