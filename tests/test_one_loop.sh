#!/usr/bin/env bash
# One training loop (issue 25): the loop (train.c, evaluate.c, report.c),
# the replicas (trainer/replica/, but replica.c, which chooses one from the
# flags) and the pservers' update modes (server/mode/) name no model and
# test no replica mode: a new model or a new way of staying in step is a
# file of its own, never a branch there. The check is a grep; it fails
# naming the line.
set -u
SRC=$(cd "$(dirname "$0")/.." && pwd)
fail() { echo "FAIL: $*" >&2; exit 1; }
cd "$SRC" || fail "no source tree at $SRC"
loop=(trainer/train.c trainer/evaluate.c trainer/report.c)
replicas=()
for f in trainer/replica/*.c trainer/replica/*.h; do
  [ "$f" = trainer/replica/replica.c ] || replicas+=("$f")
done
modes=(server/mode/*.c server/mode/*.h)
[ ${#replicas[@]} -ge 6 ] || fail "expected the replicas in trainer/replica/, found ${replicas[*]}"
[ ${#modes[@]} -ge 4 ] || fail "expected the update modes in server/mode/, found ${modes[*]}"

# Model names and kinds, in code (comments stripped).
models='\b(mlp_[a-z_]+|wide_deep|deepfm|MODEL_(MLP|CTR|LR)|model_is_ctr|desc\.kind|desc->kind)\b'
# Replica modes: the flags' mode and update, the old per-mode pointers.
mode_tests='\b(pserver_mode|collective_mode|UPDATE_(SYNC|ASYNC|SSP|GEO)|settings\.update|->update\b)'
code() { sed -e 's://.*$::' -e 's:/\*.*\*/::g' "$1" | grep -v '^\s*\*' | grep -v '^\s*/\*'; }
bad=0
for f in "${loop[@]}" "${replicas[@]}"; do
  hits=$(code "$f" | grep -nE "$models|$mode_tests") && { echo "$f: $hits" >&2; bad=1; }
done
for f in "${modes[@]}"; do
  hits=$(code "$f" | grep -nE "$models|\bmodel_is_ctr\b|tables? ?== ?0|table_count ?== ?0") &&
    { echo "$f: $hits" >&2; bad=1; }
done
[ $bad -eq 0 ] || fail "model names or mode tests in the loop, a replica or a pserver mode (above)"
# The check must be able to fail: a planted branch is found.
planted=$(printf 'if (t->settings.pserver_mode) x();\nmlp_forward(m);\n' |
  grep -cE "$models|$mode_tests")
[ "$planted" -eq 2 ] || fail "the grep missed a planted branch ($planted of 2)"
echo "PASS: no model names or mode tests in ${#loop[@]} loop, ${#replicas[@]} replica and ${#modes[@]} mode files"
