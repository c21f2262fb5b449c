#!/usr/bin/env bash
# Builds the retry oracles (Argo's own retry code, see NOTES.md) once per pin.
#
# Usage: build.sh [v4|v3|argodb/v4|argodb/v3]...   (default: v4 v3)
# Prints one binary path per requested line, in the order asked. A name with a
# slash is a sibling tool of the same kind (tools/argodb: Argo's DB code).
#
# Binaries land in $REWIND_CACHE/bin/<tool>-<argo version>-<hash>/ (default
# ~/.cache/rewind) where the hash covers go.mod, go.sum, the Go sources and the
# Go version, so a warm run only checks that they exist.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${REWIND_CACHE:-$HOME/.cache/rewind}

log() { echo "${tool:-oracle}: $*" >&2; }

command -v go >/dev/null || { log "go is not on PATH; install Go 1.26+ to build Argo's retry oracles"; exit 1; }
gover=$(go env GOVERSION)
mkdir -p "$cache/bin"

build_line() {
  local mod="$here/$1"
  case $1 in */*) mod="$here/../$1" ;; esac
  [ -f "$mod/go.mod" ] || { log "unknown Argo line '$1' (want v4, v3, argodb/v4 or argodb/v3)"; exit 2; }
  local tool version hash dir tmp start
  tool=$(basename "$(dirname "$mod")")
  version=$(awk '/github.com\/argoproj\/argo-workflows\/v[0-9]+ v/ {for (i = 1; i < NF; i++) if ($i ~ /argo-workflows/) print $(i + 1)}' "$mod/go.mod" | head -n1)
  # Sources are hashed too: a changed main.go must not reuse an old binary.
  hash=$(cat "$mod/go.mod" "$mod/go.sum" "$mod"/*.go | { cat; echo "$gover"; } | sha256sum | cut -c1-12)
  dir="$cache/bin/$tool-$version-$hash"
  if [ ! -f "$dir/.complete" ]; then
    # Build into a temp dir and rename, so an interrupted build never leaves a
    # half-written binary; a concurrent build that renamed first wins.
    tmp=$(mktemp -d "$cache/bin/.build.XXXXXX")
    start=$SECONDS
    log "go build argo-workflows $version $tool"
    (cd "$mod" && go build -ldflags=-s -o "$tmp/$tool" .)
    touch "$tmp/.complete"
    [ -e "$dir" ] && [ ! -f "$dir/.complete" ] && rm -rf "$dir"
    mv -T "$tmp" "$dir" 2>/dev/null || rm -rf "$tmp"
    log "built $(basename "$dir") in $((SECONDS - start))s"
  fi
  echo "$dir/$tool"
}

[ $# -gt 0 ] || set -- v4 v3
for line in "$@"; do build_line "$line"; done
