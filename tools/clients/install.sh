#!/usr/bin/env bash
# What the Argo-client end-to-end tests (tests/clients/) drive besides Argo's
# own binaries (tools/argo/build.sh cli): nginx from Debian's packages, routing
# as the chart's Ingress does, and Hera from PyPI in a virtual environment
# cached like the other tools: $REWIND_CACHE/bin/hera-<version>-<hash>/.
# Prints the venv's python.
set -euo pipefail

HERA_VERSION=7.1.0
cache=${REWIND_CACHE:-$HOME/.cache/rewind}
log() { echo "clients: $*" >&2; }

if ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ]; then
  log "installing nginx (Debian package) for the tests"
  sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  command -v apt-get >/dev/null || { log "no apt-get; install nginx yourself"; exit 1; }
  "${sudo[@]}" apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends nginx-light >&2 ||
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends nginx >&2
fi

python=$(command -v python3) || { log "python3 is not on PATH; install Python 3.9+ for Hera"; exit 1; }
dir="$cache/bin/hera-$HERA_VERSION-$( { echo "$HERA_VERSION"; "$python" --version; } | sha256sum | cut -c1-12)"
if [ ! -f "$dir/.complete" ]; then
  mkdir -p "$cache/bin"
  tmp=$(mktemp -d "$cache/bin/.build.XXXXXX")
  start=$SECONDS
  log "pip install hera==$HERA_VERSION into a venv"
  "$python" -m venv "$tmp/venv"
  "$tmp/venv/bin/python" -m pip install --quiet --disable-pip-version-check "hera==$HERA_VERSION" >&2
  touch "$tmp/.complete"
  rm -rf "$dir"
  # A venv records its path: build it where it will live.
  mv "$tmp" "$dir"
  log "built $(basename "$dir") in $((SECONDS - start))s"
fi
echo "$dir/venv/bin/python"
