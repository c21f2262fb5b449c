#!/usr/bin/env bash
# Builds helm-docs (the chart README's values table from values.yaml's `# --`
# comments) from its Go module, once per pinned version, and prints the
# directory holding it. Cached like Helm (tools/helm/):
# $REWIND_CACHE/bin/helm-docs-<version>-<pin hash>/, built in a temp dir and renamed.
set -euo pipefail

HELM_DOCS_VERSION=v1.14.2
cache=${REWIND_CACHE:-$HOME/.cache/rewind}
command -v go >/dev/null || { echo "helm-docs: go is not on PATH; install Go 1.25+" >&2; exit 1; }
gover=$(go env GOVERSION)
dir="$cache/bin/helm-docs-$HELM_DOCS_VERSION-$(echo "$HELM_DOCS_VERSION $gover" | sha256sum | cut -c1-12)"

if [ ! -f "$dir/.complete" ]; then
  mkdir -p "$cache/bin"
  tmp=$(mktemp -d "$cache/bin/.build.XXXXXX")
  start=$SECONDS
  echo "helm-docs: go install github.com/norwoodj/helm-docs/cmd/helm-docs@$HELM_DOCS_VERSION" >&2
  GOBIN="$tmp" go install -trimpath -ldflags=-s "github.com/norwoodj/helm-docs/cmd/helm-docs@$HELM_DOCS_VERSION"
  touch "$tmp/.complete"
  rm -rf "$dir"; mv "$tmp" "$dir"
  echo "helm-docs: built $(basename "$dir") in $((SECONDS - start))s" >&2
fi
echo "$dir"
