#!/usr/bin/env bash
# Builds the local control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, kwok) from Go modules, once per pinned version.
#
# Binaries land in $REWIND_CACHE/bin/<component>-<version>-<pin hash>/ (default
# ~/.cache/rewind), outside the repo, so a warm run only checks they exist.
# Prints the directory holding all binaries (a stable symlink farm) on stdout.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${REWIND_CACHE:-$HOME/.cache/rewind}
KWOK_VERSION=v0.8.0

gover=$(go env GOVERSION)
pin_hash() { cat "$@" | { cat; echo "$gover"; } | sha256sum | cut -c1-12; }
k8s_version=$(awk '$1=="require" && $2=="k8s.io/kubernetes" {print $3}' "$here/kubernetes/go.mod")
etcd_version=$(awk '$1=="require" && $2=="go.etcd.io/etcd/server/v3" {print $3}' "$here/etcd/go.mod")
k8s_dir="$cache/bin/kubernetes-$k8s_version-$(pin_hash "$here/kubernetes/go.mod" "$here/kubernetes/go.sum")"
etcd_dir="$cache/bin/etcd-$etcd_version-$(pin_hash "$here/etcd/go.mod" "$here/etcd/go.sum")"
kwok_dir="$cache/bin/kwok-$KWOK_VERSION-$(echo "$KWOK_VERSION $gover" | sha256sum | cut -c1-12)"

log() { echo "controlplane: $*" >&2; }

# Build into a temp dir and rename, so an interrupted build never leaves a
# half-written binary that a later run would trust.
build_into() {
  local dir=$1; shift
  if [ -f "$dir/.complete" ]; then return 0; fi
  local tmp; tmp=$(mktemp -d "$cache/bin/.build.XXXXXX")
  local start=$SECONDS
  "$@" "$tmp"
  touch "$tmp/.complete"
  rm -rf "$dir"; mv "$tmp" "$dir"
  log "built $(basename "$dir") in $((SECONDS - start))s"
}

build_k8s() {
  (cd "$here/kubernetes" && for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    log "go build k8s.io/kubernetes/cmd/$cmd@$k8s_version"
    go build -trimpath -ldflags=-s -o "$1/$cmd" "k8s.io/kubernetes/cmd/$cmd"
  done)
}
build_etcd() {
  log "go build go.etcd.io/etcd/server/v3@$etcd_version"
  (cd "$here/etcd" && go build -trimpath -ldflags=-s -o "$1/etcd" go.etcd.io/etcd/server/v3)
}
build_kwok() {
  log "go install sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  GOBIN="$1" go install -trimpath -ldflags=-s "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
}

mkdir -p "$cache/bin"
command -v go >/dev/null || { log "go is not on PATH; install Go 1.25+ to build the control plane"; exit 1; }
build_into "$etcd_dir" build_etcd
build_into "$kwok_dir" build_kwok
build_into "$k8s_dir" build_k8s

# One directory with every binary, for REWIND_BIN_DIR and PATH.
farm="$cache/bin/current-$(echo "$k8s_dir $etcd_dir $kwok_dir" | sha256sum | cut -c1-12)"
mkdir -p "$farm"
for f in "$k8s_dir"/* "$etcd_dir"/etcd "$kwok_dir"/kwok; do ln -sf "$f" "$farm/"; done
echo "$farm"
