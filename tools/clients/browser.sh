#!/usr/bin/env bash
# What the UI test (tests/e2e, scenarios ui-*) drives: Debian's chromium, and
# playwright-core from the npm registry (no browser download of its own: it
# launches /usr/bin/chromium), cached like the other tools:
# $REWIND_CACHE/bin/playwright-core-<version>/. Prints that directory (it
# holds node_modules/playwright-core).
set -euo pipefail

PLAYWRIGHT_VERSION=1.65.2
cache=${REWIND_CACHE:-$HOME/.cache/rewind}
log() { echo "browser: $*" >&2; }

if [ ! -x /usr/bin/chromium ]; then
  log "installing chromium (Debian package) for the UI test"
  sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  "${sudo[@]}" apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends chromium >&2
fi
command -v npm >/dev/null || { log "npm is not on PATH; install Node.js 20+"; exit 1; }
dir="$cache/bin/playwright-core-$PLAYWRIGHT_VERSION"
if [ ! -f "$dir/.complete" ]; then
  mkdir -p "$cache/bin"
  tmp=$(mktemp -d "$cache/bin/.build.XXXXXX")
  log "npm install playwright-core@$PLAYWRIGHT_VERSION"
  # npm init names the package after the directory, and a temp dir's
  # leading dot is no valid name: the package.json is written instead.
  echo '{"name": "rewind-ui-test", "private": true}' >"$tmp/package.json"
  (cd "$tmp" && npm install --no-audit --no-fund "playwright-core@$PLAYWRIGHT_VERSION" >&2)
  touch "$tmp/.complete"
  rm -rf "$dir"
  mv "$tmp" "$dir"
fi
echo "$dir"
