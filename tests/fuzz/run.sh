#!/usr/bin/env bash
# Runs one libFuzzer target for a bounded time from freshly made seeds:
#   run.sh TARGET_BIN FUZZ_CORPUS_BIN SEEDS SECONDS [CORPUS_DIR]
# SEEDS names the seed folder fuzz_corpus writes (pserver, wire, checkpoint, ctr).
# New inputs go to CORPUS_DIR (kept; default: a temporary folder), findings
# to $FUZZ_ARTIFACTS (default ./fuzz-artifacts). Prints the runs made and
# exits non-zero on any finding (crash, sanitizer report, leak, timeout).
set -euo pipefail
target=${1:?usage: run.sh TARGET_BIN FUZZ_CORPUS_BIN SEEDS SECONDS [CORPUS_DIR]}
corpus_bin=${2:?} seeds=${3:?} seconds=${4:?}
name=$(basename "$target")
scratch=$(mktemp -d /tmp/pstrain-fuzz.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
corpus=${5:-$scratch/corpus}
artifacts=${FUZZ_ARTIFACTS:-$PWD/fuzz-artifacts}
mkdir -p "$corpus" "$artifacts"
"$corpus_bin" "$scratch/seeds" >/dev/null
[ -d "$scratch/seeds/$seeds" ] || { echo "$name: no seeds named '$seeds'" >&2; exit 2; }
status=0
# Leaks are findings too; UBSan stops at the first report (-fno-sanitize-recover).
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1} \
  "$target" -max_total_time="$seconds" -max_len=8192 -timeout=20 -rss_limit_mb=2048 \
  -print_final_stats=1 -artifact_prefix="$artifacts/$name-" "$corpus" "$scratch/seeds/$seeds" \
  >"$scratch/log" 2>&1 || status=$?
runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$scratch/log")
if [ "$status" -ne 0 ]; then
  tail -n 60 "$scratch/log" >&2
  echo "$name: FINDING (exit $status) after ${runs:-?} runs; the input is in $artifacts" >&2
  exit 1
fi
echo "$name: ${runs:-?} runs in $seconds s, $(ls "$corpus" | wc -l) inputs in the corpus, no findings"
