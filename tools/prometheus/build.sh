#!/usr/bin/env bash
# Builds Prometheus and promtool from Prometheus' Go module, once per pinned
# version, and prints the directory holding both. The chart's alert rules are
# checked and unit-tested with promtool (tests/monitoring.rs), and a cluster
# test runs the server on loopback to scrape a real controller and evaluate
# every dashboard query and alert expression (tests/cluster/monitoring.rs).
# Cached like the control plane (tools/controlplane/):
# $REWIND_CACHE/bin/prometheus-<version>-<pin hash>/, built in a temp dir and
# renamed. The web UI's assets are not built (its JavaScript build is not a Go
# module); the HTTP API the tests use needs none of them. Built with
# remove_all_sd, Prometheus' own tag for leaving out every service discovery
# (cloud SDKs, Kubernetes): the tests scrape a static loopback target, and the
# cloud SDKs were most of a cold build.
set -euo pipefail

# Prometheus v3.16.0: the module is versioned v0.3XX.Y for v3.XX.Y.
PROMETHEUS_VERSION=v0.316.0
cache=${REWIND_CACHE:-$HOME/.cache/rewind}
command -v go >/dev/null || { echo "prometheus: go is not on PATH; install Go 1.26+" >&2; exit 1; }
gover=$(go env GOVERSION)
dir="$cache/bin/prometheus-$PROMETHEUS_VERSION-$(echo "$PROMETHEUS_VERSION remove_all_sd $gover" | sha256sum | cut -c1-12)"

if [ ! -f "$dir/.complete" ]; then
  mkdir -p "$cache/bin"
  tmp=$(mktemp -d "$cache/bin/.build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  start=$SECONDS
  echo "prometheus: go install -tags remove_all_sd github.com/prometheus/prometheus/cmd/{prometheus,promtool}@$PROMETHEUS_VERSION" >&2
  GOBIN="$tmp" go install -trimpath -ldflags=-s -tags remove_all_sd \
    "github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS_VERSION" \
    "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_VERSION"
  touch "$tmp/.complete"
  rm -rf "$dir"; mv "$tmp" "$dir"
  trap - EXIT
  echo "prometheus: built $(basename "$dir") in $((SECONDS - start))s" >&2
fi
echo "$dir"
