#!/usr/bin/env bash
# The compatibility run (`make test-compat`): on each Kubernetes minor, the
# cluster tests' compatibility subset (tests/cluster/main.rs, COMPAT) and one
# end-to-end scenario with Argo's workflow-controller. The full suite runs on
# the default minor in `make test`.
#
# REWIND_K8S_MINORS picks the minors (default: all four). Each minor's row in
# tools/compat/results.tsv is replaced with what this run measured; README.md's
# table of tested versions is made from that file (tests/docs.rs checks it):
#   tools/compat/run.sh && tools/compat/run.sh table
set -euo pipefail
cd "$(dirname "$0")/../.."
results=tools/compat/results.tsv
header=$'minor\tkubernetes\tcluster tests passed\te2e scenarios passed\tseconds\tdate'

# The README table, made from the results; printed for README.md.
if [ "${1:-}" = table ]; then
  echo "| Kubernetes | compatibility subset | end to end with Argo v4.1.4 | seconds | run on |"
  echo "|---|---|---|---|---|"
  tail -n +2 "$results" | sort -V | while IFS=$'\t' read -r _ version cluster e2e secs day; do
    echo "| $version | $cluster passed | $e2e passed | $secs | $day |"
  done
  exit 0
fi

# Built first, so a minor's seconds are its tests' and its control plane's only.
cargo test --locked --features testenv --test cluster --test e2e --no-run
passed() { sed -n 's/^test result: ok\. \([0-9]*\) passed.*/\1/p' "$1" | tail -1; }
for minor in ${REWIND_K8S_MINORS:-1.34 1.35 1.36 1.37}; do
  bin=$(REWIND_K8S_MINOR=$minor tools/controlplane/build.sh)
  version=$("$bin/kube-apiserver" --version | awk '{print $2}')
  echo "compat: Kubernetes $version" >&2
  start=$SECONDS
  log=$(mktemp)
  REWIND_BIN_DIR=$bin REWIND_TEST_SUBSET=compat \
    cargo test --locked --features testenv --test cluster | tee "$log"
  cluster=$(passed "$log")
  REWIND_BIN_DIR=$bin cargo test --locked --features testenv --test e2e -- --exact dag-retry-strategy | tee "$log"
  e2e=$(passed "$log")
  rm -f "$log"
  row="$minor"$'\t'"$version"$'\t'"$cluster"$'\t'"$e2e"$'\t'"$((SECONDS - start))"$'\t'"$(date -u +%F)"
  { echo "$header"; { tail -n +2 "$results" 2>/dev/null || true; } | awk -F'\t' -v m="$minor" '$1 != m'; echo "$row"; } > "$results.new"
  mv "$results.new" "$results"
done
