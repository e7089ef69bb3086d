#!/usr/bin/env bash
# deploy/k8s and deploy/k8s-elastic: each container's environment is what
# the daemons read, checked by the daemons' own --check-config
# (tests/k8s_manifests.py says how).
source "$(dirname "$0")/lib.sh"
"$PY" -c 'import yaml' 2>/dev/null || { echo "FAIL: python3-yaml is missing (run scripts/setup)" >&2; exit 1; }
unshare --uts true 2>/dev/null || { echo "SKIP: cannot make a UTS namespace to set pod host names (needs root)" >&2; exit 77; }
here=$(cd "$(dirname "$0")" && pwd)
"$PY" "$here/k8s_manifests.py" "$BIN" "$here/../deploy/k8s" "$SCRATCH" || fail "deploy/k8s manifests"
mkdir -p "$SCRATCH/elastic"
"$PY" "$here/k8s_manifests.py" "$BIN" "$here/../deploy/k8s-elastic" "$SCRATCH/elastic" ||
  fail "deploy/k8s-elastic manifests"
finish
