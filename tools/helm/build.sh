#!/usr/bin/env bash
# Builds the Helm CLI from its Go module, once per pinned version, and prints
# the directory holding it. Cached like the control plane (tools/controlplane/):
# $REWIND_CACHE/bin/helm-<version>-<pin hash>/, built in a temp dir and renamed.
set -euo pipefail

HELM_VERSION=v4.3.2
cache=${REWIND_CACHE:-$HOME/.cache/rewind}
command -v go >/dev/null || { echo "helm: go is not on PATH; install Go 1.25+" >&2; exit 1; }
gover=$(go env GOVERSION)
dir="$cache/bin/helm-$HELM_VERSION-$(echo "$HELM_VERSION $gover" | sha256sum | cut -c1-12)"

if [ ! -f "$dir/.complete" ]; then
  mkdir -p "$cache/bin"
  tmp=$(mktemp -d "$cache/bin/.build.XXXXXX")
  start=$SECONDS
  echo "helm: go install helm.sh/helm/v4/cmd/helm@$HELM_VERSION" >&2
  GOBIN="$tmp" go install -trimpath -ldflags=-s "helm.sh/helm/v4/cmd/helm@$HELM_VERSION"
  touch "$tmp/.complete"
  rm -rf "$dir"; mv "$tmp" "$dir"
  echo "helm: built $(basename "$dir") in $((SECONDS - start))s" >&2
fi
echo "$dir"
