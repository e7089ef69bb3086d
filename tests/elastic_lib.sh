# The elastic jobs test_elastic (async) and test_elastic_sync run alike,
# with no pserver restarted; each test then checks what its update logs.
# Source after lib.sh.

metric() { "$PY" -c 'import json,sys; print(json.loads(open(sys.argv[1]).readlines()[-1])[sys.argv[2]])' "$1" "$2"; }

# mlp_2_4_1 UPDATE LEASE: an MLP job (pservers el-s0, el-s1) of 2 trainers
# grows to 4 in its last epoch (of 4) and shrinks to 1: the third dies in
# its 12th push (pserver 0 answered it, pserver 1 never saw it), the fourth
# and second are killed; each epoch counted once, the test accuracy (the
# whole test set) within 0.005 of a fixed 2-trainer job's. The job is short
# of converged: grown in the first of 2 epochs, most of it was one
# trainer's, in twice the fixed job's steps, and ended up to 0.008 away.
mlp_2_4_1() {
  local update=$1 lease=$2 a b c d who status pid fixed acc
  local common=(--mode pserver --update "$update" --train-samples 20000 --test-samples 10000
                --epochs 4 --seed 4 --progress-interval 0.2)
  fixed=$(fixed_two test_accuracy fx "${common[@]}")
  start_pservers el 2 --trainers 4 --trainer-lease "$lease"
  local job=("${common[@]}" --pservers "$PS" --elastic 1:4 --shard-steps 4 --slowdown 8
             --metrics "$SCRATCH/el.jsonl")
  start el-a "$BIN/trainer" "${job[@]}"; a=$LAST_PID
  # a takes id 0 (it evaluates and survives), then b comes.
  wait_log "$SCRATCH/el-a.log" "gave this trainer id 0" "$a" 60 || fail "the first trainer got no id 0"
  start el-b "$BIN/trainer" "${job[@]}"; b=$LAST_PID
  for who in a b; do
    wait_log "$SCRATCH/el-$who.log" "epoch 1/4 step" "${!who}" 60 || fail "trainer $who did not train"
  done
  wait_log "$SCRATCH/el-s0.log" "shards: epoch 3 trained" "${SPIDS[0]}" 240 ||
    fail "pserver 0 did not end epoch 3"
  PSTRAIN_TEST_KILL_MID_PUSH=12 start el-c "$BIN/trainer" "${job[@]}"; c=$LAST_PID
  start el-d "$BIN/trainer" "${job[@]}"; d=$LAST_PID
  wait_log "$SCRATCH/el-d.log" "epoch 4/4 step" "$d" 60 || fail "the fourth trainer did not train"
  grep -q "trainer id 3 given to a joining trainer" "$SCRATCH/el-s0.log" ||
    fail "pserver 0 did not give out id 3: $(grep -F "given to" "$SCRATCH/el-s0.log")"
  status=0; wait_for "$c" 60 || status=$?
  [ "$status" -eq 137 ] || fail "the trainer killed mid-push exited $status"
  kill -9 "$d" "$b"
  wait_for "$d" 10; wait_for "$b" 10
  status=0; wait_for "$a" 240 || status=$?
  [ "$status" -eq 0 ] || fail "the last trainer exited $status: $(tail -3 "$SCRATCH/el-a.log")"
  for pid in "${SPIDS[@]}"; do
    status=0; wait_for "$pid" 60 || status=$?
    [ "$status" -eq 0 ] || fail "pserver $pid exited $status"
  done
  grep -q "every trainer that joined is done or gone" "$SCRATCH/el-s1.log" ||
    fail "pserver 1 did not end the job: $(tail -2 "$SCRATCH/el-s1.log")"
  shards_counted "$update 2-4-1" "$SCRATCH/el-s0.log" 20000 4 "$SCRATCH/el.jsonl"*
  acc=$(metric "$SCRATCH/el.jsonl" test_accuracy)
  echo "$update 2-4-1: test accuracy $acc; fixed 2 trainers: $fixed"
  within "$acc" "$fixed" 0.005 || fail "$update 2-4-1: test accuracy $acc, the fixed job's $fixed"
}

# ctr_2_3_1 UPDATE LEASE: a CTR model on 60,000 generated rows (pservers
# ctr-s0, ctr-s1), 2 -> 3 -> 1 trainers: the joiner dies in its 10th push,
# another is killed; each epoch counted once, the AUC within 0.005 of a
# fixed 2-trainer job's.
ctr_2_3_1() {
  local update=$1 lease=$2 a b c status pid fixed auc
  local d="$SCRATCH/data"
  "$BIN/gen_ctr" --out "$d" --train-rows 60000 --test-rows 4000 --scale 0.0005 --seed 5 \
    >"$SCRATCH/gen.json" || fail "gen_ctr failed"
  local common=(--mode pserver --update "$update" --data "$d/train.tsv" --test-data "$d/test.tsv"
                --model ctr:8:32,16 --batch 128 --epochs 2 --seed 3 --threads 1
                --progress-interval 0.2)
  fixed=$(fixed_two auc ctr-fx "${common[@]}")
  start_pservers ctr 2 --trainers 3 --trainer-lease "$lease"
  local job=("${common[@]}" --pservers "$PS" --elastic 1:3 --shard-steps 4 --slowdown 30
             --metrics "$SCRATCH/ctr.jsonl")
  start ctr-a "$BIN/trainer" "${job[@]}"; a=$LAST_PID
  wait_log "$SCRATCH/ctr-a.log" "gave this trainer id 0" "$a" 60 || fail "ctr: the first trainer got no id 0"
  start ctr-b "$BIN/trainer" "${job[@]}"; b=$LAST_PID
  wait_log "$SCRATCH/ctr-b.log" "epoch 1/2 step" "$b" 60 || fail "ctr: the second trainer did not train"
  PSTRAIN_TEST_KILL_MID_PUSH=10 start ctr-c "$BIN/trainer" "${job[@]}"; c=$LAST_PID
  status=0; wait_for "$c" 60 || status=$?
  [ "$status" -eq 137 ] || fail "ctr: the joiner killed mid-push exited $status"
  kill -9 "$b"
  wait_for "$b" 10
  status=0; wait_for "$a" 240 || status=$?
  [ "$status" -eq 0 ] || fail "ctr: the last trainer exited $status: $(tail -3 "$SCRATCH/ctr-a.log")"
  for pid in "${SPIDS[@]}"; do
    status=0; wait_for "$pid" 60 || status=$?
    [ "$status" -eq 0 ] || fail "ctr: pserver $pid exited $status"
  done
  shards_counted "$update ctr" "$SCRATCH/ctr-s0.log" 60000 2 "$SCRATCH/ctr.jsonl"*
  auc=$(metric "$SCRATCH/ctr.jsonl" auc)
  echo "$update ctr 2-3-1: AUC $auc; fixed 2 trainers: $fixed"
  within "$auc" "$fixed" 0.005 || fail "ctr: test AUC $auc, the fixed job's $fixed"
}
