#!/usr/bin/env bash
# Builds the local control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, kwok) from Go modules, once per pinned version.
#
# Binaries land in $REWIND_CACHE/bin/<component>-<version>-<pin hash>/ (default
# ~/.cache/rewind), outside the repo, so a warm run only checks they exist.
# Prints the directory holding all binaries (a stable symlink farm) on stdout.
#
# REWIND_K8S_MINOR picks the Kubernetes minor (1.34 to 1.37, one pinned module
# each in kubernetes-<minor>/); the default is the newest, which the full test
# suite runs on. `make test-compat` runs the compatibility subset on the others.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${REWIND_CACHE:-$HOME/.cache/rewind}
KWOK_VERSION=v0.8.0
minor=${REWIND_K8S_MINOR:-1.37}
k8s_mod="$here/kubernetes-$minor"
if [ ! -f "$k8s_mod/go.mod" ]; then
  echo "controlplane: no pinned Kubernetes $minor; REWIND_K8S_MINOR must be one of:" \
    "$(cd "$here" && ls -d kubernetes-* | sed 's/kubernetes-//' | tr '\n' ' ')" >&2
  exit 2
fi

gover=$(go env GOVERSION)
pin_hash() { cat "$@" | { cat; echo "$gover"; } | sha256sum | cut -c1-12; }
k8s_version=$(awk '$1=="require" && $2=="k8s.io/kubernetes" {print $3}' "$k8s_mod/go.mod")
etcd_version=$(awk '$1=="require" && $2=="go.etcd.io/etcd/server/v3" {print $3}' "$here/etcd/go.mod")
# The version the binaries report (`kubectl version`, the server's /version,
# Helm's .Capabilities.KubeVersion), set as Kubernetes' own release build sets
# it (hack/lib/version.sh); built from a module they would say v0.0.0.
k8s_ldflags="-s"
for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
  k8s_ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=${minor#1.}"
  k8s_ldflags+=" -X $pkg.gitTreeState=clean"
done
k8s_dir="$cache/bin/kubernetes-$k8s_version-$(pin_hash "$k8s_mod/go.mod" "$k8s_mod/go.sum" <(echo "$k8s_ldflags"))"
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
  (cd "$k8s_mod" && for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    log "go build k8s.io/kubernetes/cmd/$cmd@$k8s_version"
    go build -trimpath -ldflags="$k8s_ldflags" -o "$1/$cmd" "k8s.io/kubernetes/cmd/$cmd"
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
command -v go >/dev/null || { log "go is not on PATH; install Go 1.26+ to build the control plane"; exit 1; }
build_into "$etcd_dir" build_etcd
build_into "$kwok_dir" build_kwok
build_into "$k8s_dir" build_k8s

# One directory with every binary, for REWIND_BIN_DIR and PATH.
farm="$cache/bin/current-$(echo "$k8s_dir $etcd_dir $kwok_dir" | sha256sum | cut -c1-12)"
mkdir -p "$farm"
for f in "$k8s_dir"/* "$etcd_dir"/etcd "$kwok_dir"/kwok; do ln -sf "$f" "$farm/"; done
echo "$farm"
