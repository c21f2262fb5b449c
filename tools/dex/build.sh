#!/usr/bin/env bash
# Builds dex, the OpenID Connect provider the SSO cluster test logs in
# through (argo server --auth-mode sso, tests/cluster/argoapi.rs), from its Go
# module (pinned in go.mod beside this script; tools.go says why it is built
# from a module that requires it), once per pin, and prints the binary's path.
# Cached like the other tools: $REWIND_CACHE/bin/dex-<hash>/ (default
# ~/.cache/rewind), the hash over go.mod, go.sum and the Go version; built in a
# temp dir and renamed.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${REWIND_CACHE:-$HOME/.cache/rewind}
log() { echo "dex: $*" >&2; }
command -v go >/dev/null || { log "go is not on PATH; install Go 1.26+ to build dex"; exit 1; }
gover=$(go env GOVERSION)
version=$(awk '$1 == "require" && $2 == "github.com/dexidp/dex" {print $3}' "$here/go.mod")
dir="$cache/bin/dex-$(cat "$here/go.mod" "$here/go.sum" | { cat; echo "$gover"; } | sha256sum | cut -c1-12)"

if [ ! -f "$dir/.complete" ]; then
  mkdir -p "$cache/bin"
  tmp=$(mktemp -d "$cache/bin/.build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  start=$SECONDS
  log "go build github.com/dexidp/dex/cmd/dex ($version)"
  (cd "$here" && go build -trimpath -ldflags=-s -o "$tmp/dex" github.com/dexidp/dex/cmd/dex)
  touch "$tmp/.complete"
  rm -rf "$dir"; mv "$tmp" "$dir"
  trap - EXIT
  log "built $(basename "$dir") in $((SECONDS - start))s"
fi
echo "$dir/dex"
