#!/usr/bin/env bash
# A real Prometheus scrapes a live 2 pserver + 2 trainer sync MLP job, every
# daemon with --metrics-listen: each endpoint's text passes `promtool check
# metrics` and names the expected families, Prometheus's HTTP API shows the
# pservers' pushes counter rising during the job, and the endpoint serves
# only GET /metrics. Skipped (77) where prometheus or promtool is missing or
# Prometheus cannot start.
. "$(dirname "$0")/lib.sh"
require_data
for tool in prometheus promtool curl; do
  command -v "$tool" >/dev/null || { echo "SKIP: no $tool (Debian: apt-get install prometheus curl)" >&2; exit 77; }
done

read -r PROM_PORT PM0 PM1 TM0 TM1 <<<"$(free_ports 5)"
PROM="http://127.0.0.1:$PROM_PORT"
cat >"$SCRATCH/prometheus.yml" <<YML
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: pstrain
    static_configs:
      - targets: ['127.0.0.1:$PM0', '127.0.0.1:$PM1']
        labels: {role: pserver}
      - targets: ['127.0.0.1:$TM0', '127.0.0.1:$TM1']
        labels: {role: trainer}
YML
start prometheus prometheus --config.file "$SCRATCH/prometheus.yml" \
  --storage.tsdb.path "$SCRATCH/tsdb" --web.listen-address "127.0.0.1:$PROM_PORT"
PROM_PID=$LAST_PID
ready=0
for _ in $(seq 300); do
  curl -sf "$PROM/-/ready" >/dev/null 2>&1 && { ready=1; break; }
  kill -0 "$PROM_PID" 2>/dev/null || break
  sleep 0.1
done
[ "$ready" -eq 1 ] || { echo "SKIP: prometheus did not start: $(tail -3 "$SCRATCH/prometheus.log")" >&2; exit 77; }

# query PROMQL: the first result's value, "" when none.
query() {
  curl -sf "$PROM/api/v1/query" --data-urlencode "query=$1" |
    "$PY" -c 'import json,sys
r = json.load(sys.stdin)["data"]["result"]
print(r[0]["value"][1] if r else "")'
}

# Prometheus takes up to 5 s to start scraping new targets: wait until it has
# tried all four (down until the job starts), so the whole job is scraped.
seen=""
for _ in $(seq 150); do
  seen=$(query 'count(up{job="pstrain"})')
  [ "$seen" = 4 ] && break
  sleep 0.1
done
[ "$seen" = 4 ] || { fail "Prometheus did not take up the 4 targets (saw '$seen')"; finish; }

PS=""
for i in 0 1; do
  pm=PM$i
  start "s$i" "$BIN/pserver" --pservers 127.0.0.1:1,127.0.0.1:2 --id "$i" --listen 127.0.0.1:0 \
    --trainers 2 --metrics-listen "${!pm}"
  SP[$i]=$LAST_PID
done
for i in 0 1; do
  port=$(ready_port "$SCRATCH/s$i.log" "${SP[$i]}") || { fail "pserver $i: $(tail -3 "$SCRATCH/s$i.log")"; finish; }
  PS+="${PS:+,}127.0.0.1:$port"
  pm=PM$i
  grep -q "metrics: http://127.0.0.1:${!pm}/metrics" "$SCRATCH/s$i.log" ||
    fail "pserver $i's log does not say where its metrics are"
done
for i in 0 1; do
  tm=TM$i
  start "t$i" "$BIN/trainer" --mode pserver --pservers "$PS" --trainers 2 --id "$i" \
    --epochs 3 --train-samples 30000 --test-samples 1000 --progress-interval 0 \
    --metrics-listen "127.0.0.1:${!tm}"
  TP[$i]=$LAST_PID
done

# While the job runs: every endpoint's text, once it has counted a step.
# (a pserver's text once trainer 1's first push is counted: under load it may come late)
for target in "s0 $PM0 pstrain_pserver_bytes_total{trainer=\"1\",direction=\"in\"} [1-9]" \
              "s1 $PM1 pstrain_pserver_bytes_total{trainer=\"1\",direction=\"in\"} [1-9]" \
              "t0 $TM0 pstrain_trainer_examples_total [1-9]" "t1 $TM1 pstrain_trainer_examples_total [1-9]"; do
  read -r name port pattern <<<"$target"
  got=0
  for _ in $(seq 400); do
    curl -sf "http://127.0.0.1:$port/metrics" >"$SCRATCH/$name.txt" 2>/dev/null &&
      grep -q "^$pattern" "$SCRATCH/$name.txt" && { got=1; break; }
    sleep 0.05
  done
  [ "$got" -eq 1 ] || { fail "$name: no '$pattern' at port $port: $(head -c 300 "$SCRATCH/$name.txt")"; continue; }
  promtool check metrics <"$SCRATCH/$name.txt" >"$SCRATCH/$name.promtool" 2>&1 ||
    fail "$name: promtool check metrics: $(cat "$SCRATCH/$name.promtool")"
done
for fam in pstrain_pserver_bytes_total pstrain_pserver_step pstrain_pserver_rpc_duration_seconds_bucket \
           pstrain_pserver_sync_wait_seconds_count pstrain_pserver_sync_last_trainer \
           pstrain_pserver_checkpoint_failures_total; do
  grep -q "^$fam" "$SCRATCH/s0.txt" || fail "pserver 0's metrics lack $fam"
done
grep -q '^pstrain_pserver_bytes_total{trainer="1",direction="in"} [1-9]' "$SCRATCH/s0.txt" ||
  fail "pserver 0 counted no bytes in from trainer 1"
for fam in pstrain_trainer_loss pstrain_trainer_step pstrain_trainer_compute_seconds_total \
           pstrain_trainer_communication_seconds_total; do
  grep -q "^$fam" "$SCRATCH/t0.txt" || fail "trainer 0's metrics lack $fam"
done
# Only GET /metrics; and no parameter in the text (no float arrays, no tensor names).
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PM0/params")
[ "$code" = 404 ] || fail "GET /params answered $code, not 404"
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST "http://127.0.0.1:$PM0/metrics")
[ "$code" = 405 ] || fail "POST /metrics answered $code, not 405"
grep -q "fc[0-9]\|\.weight\|\.bias" "$SCRATCH/s0.txt" && fail "pserver 0's metrics name parameters"

# Prometheus saw the pushes counter rise during the job.
rose=""
for _ in $(seq 100); do
  rose=$(query 'sum(max_over_time(pstrain_pserver_pushes_total[10m]) - min_over_time(pstrain_pserver_pushes_total[10m]))')
  [ -n "$rose" ] && "$PY" -c "import sys; sys.exit(0 if float('$rose') > 0 else 1)" && break
  rose=""
  sleep 0.2
done
[ -n "$rose" ] || fail "Prometheus saw no rise of pstrain_pserver_pushes_total: $(query 'count(up)') targets"
echo "pushes counted by Prometheus during the job: $rose" >&2
up=$(query 'sum(max_over_time(up{job="pstrain"}[10m]))')
[ "$up" = 4 ] || fail "Prometheus scraped $up of 4 targets"

for i in 0 1; do
  wait_for "${TP[$i]}" 300 || fail "trainer $i exited non-zero: $(tail -3 "$SCRATCH/t$i.log")"
done
for i in 0 1; do
  wait_for "${SP[$i]}" 60 || fail "pserver $i exited non-zero: $(tail -3 "$SCRATCH/s$i.log")"
done
finish
