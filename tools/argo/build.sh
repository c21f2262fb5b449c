#!/usr/bin/env bash
# Builds Argo's workflow-controller (for the end-to-end tests) and the "peer"
# (Argo's own retry code, tools/peer) from Go modules, once per pin.
#
# Usage: build.sh [v4|v3|peer|peer-v3|cli|cli-ui]...   (default: the first four)
# Prints one binary path per requested name, in the order asked. A controller's
# directory also holds its version's CRDs (crds/, from manifests/base/crds/minimal).
#
# cli is Argo's own `argo` binary (the CLI and `argo server`) of the v4 pin.
# cmd/argo embeds ui/dist/app, which Argo's module zip lacks and the module
# cache may not be written (nor overlaid), so the module is copied to the
# cache and built there, with a placeholder UI as Argo's Makefile makes one.
# cli-ui is the same binary with Argo's UI built (tools/argo/ui.sh: its
# webpack build from the module's ui/ sources, with npm), for the UI test.
#
# Binaries land in $REWIND_CACHE/bin/<name>-<argo version>-<hash>/ (default
# ~/.cache/rewind); the hash covers go.mod, go.sum, the Go sources and the Go
# version, so a warm run only checks that they exist. Built without -trimpath, like
# tools/oracle, so both share Go's build cache.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${REWIND_CACHE:-$HOME/.cache/rewind}

log() { echo "argo: $*" >&2; }

command -v go >/dev/null || { log "go is not on PATH; install Go 1.26+ to build Argo's workflow-controller"; exit 1; }
gover=$(go env GOVERSION)
mkdir -p "$cache/bin"

# build NAME MODULE_DIR BINARY PACKAGE
build() {
  local name=$1 mod=$2 bin=$3 pkg=$4
  local version hash dir tmp start
  version=$(awk '/github.com\/argoproj\/argo-workflows\/v[0-9]+ v/ {for (i = 1; i < NF; i++) if ($i ~ /argo-workflows/) print $(i + 1)}' "$mod/go.mod" | head -n1)
  # Sources are hashed too: a changed main.go must not reuse an old binary.
  hash=$(cat "$mod/go.mod" "$mod/go.sum" $(ls "$mod"/*.go 2>/dev/null) | { cat; echo "$gover"; } | sha256sum | cut -c1-12)
  dir="$cache/bin/$name-$version-$hash"
  if [ ! -f "$dir/.complete" ]; then
    # Build into a temp dir and rename, so an interrupted build never leaves a
    # half-written binary; a concurrent build that renamed first wins.
    tmp=$(mktemp -d "$cache/bin/.build.XXXXXX")
    start=$SECONDS
    log "go build $pkg ($version)"
    (cd "$mod" && go build -ldflags=-s -o "$tmp/$bin" "$pkg")
    if [ "$bin" = workflow-controller ]; then
      # The CRDs the controller watches, from the same module version.
      mkdir "$tmp/crds"
      cp "$(cd "$mod" && go list -m -f '{{.Dir}}' "${pkg%/cmd/*}")"/manifests/base/crds/minimal/argoproj.io_*.yaml "$tmp/crds/"
      chmod u+w "$tmp"/crds/*
    fi
    touch "$tmp/.complete"
    [ -e "$dir" ] && [ ! -f "$dir/.complete" ] && rm -rf "$dir"
    mv -T "$tmp" "$dir" 2>/dev/null || rm -rf "$tmp"
    log "built $(basename "$dir") in $((SECONDS - start))s"
  fi
  echo "$dir/$bin"
}

# build_cli NAME WITH_UI: Argo's `argo` binary from a writable copy of the v4 pin's module.
build_cli() {
  local name=$1 with_ui=$2
  local mod="$here/v4" version hash dir tmp start src ui_hash=""
  version=$(awk '/github.com\/argoproj\/argo-workflows\/v[0-9]+ v/ {for (i = 1; i < NF; i++) if ($i ~ /argo-workflows/) print $(i + 1)}' "$mod/go.mod" | head -n1)
  [ "$with_ui" = yes ] && ui_hash=$(sha256sum "$here/ui.sh" | cut -c1-12)
  hash=$(cat "$mod/go.mod" "$0" | { cat; echo "$gover $ui_hash"; } | sha256sum | cut -c1-12)
  dir="$cache/bin/$name-$version-$hash"
  if [ ! -f "$dir/.complete" ]; then
    tmp=$(mktemp -d "$cache/bin/.build.XXXXXX")
    start=$SECONDS
    src=$(cd "$mod" && go mod download -json "github.com/argoproj/argo-workflows/v4@$version" | awk -F'"' '/"Dir"/ {print $4}')
    [ -d "$src" ] || { log "cannot find the module of argo-workflows $version"; exit 1; }
    cp -r "$src" "$tmp/src"
    chmod -R u+w "$tmp/src"
    if [ "$with_ui" = yes ]; then
      "$here/ui.sh" "$tmp/src/ui"
    else
      mkdir -p "$tmp/src/ui/dist/app"
      touch "$tmp/src/ui/dist/app/placeholder"
    fi
    log "go build cmd/argo ($version, UI: $with_ui)"
    (cd "$tmp/src" && go build -ldflags="-s -X github.com/argoproj/argo-workflows/v4.version=$version" -o "$tmp/argo" ./cmd/argo)
    rm -rf "$tmp/src"
    touch "$tmp/.complete"
    [ -e "$dir" ] && [ ! -f "$dir/.complete" ] && rm -rf "$dir"
    mv -T "$tmp" "$dir" 2>/dev/null || rm -rf "$tmp"
    log "built $(basename "$dir") in $((SECONDS - start))s"
  fi
  echo "$dir/argo"
}

[ $# -gt 0 ] || set -- v4 v3 peer peer-v3
for what in "$@"; do
  case $what in
    v4) build workflow-controller "$here/v4" workflow-controller github.com/argoproj/argo-workflows/v4/cmd/workflow-controller ;;
    v3) build workflow-controller "$here/v3" workflow-controller github.com/argoproj/argo-workflows/v3/cmd/workflow-controller ;;
    peer) build peer "$here/../peer" peer . ;;
    peer-v3) build peer "$here/../peer/v3" peer . ;;
    cli) build_cli argo no ;;
    cli-ui) build_cli argo-ui yes ;;
    *) log "unknown target '$what' (want v4, v3, peer, peer-v3, cli or cli-ui)"; exit 2 ;;
  esac
done
