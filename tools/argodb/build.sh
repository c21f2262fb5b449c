#!/usr/bin/env bash
# Builds the Argo DB helpers (see NOTES.md) once per pin, with the oracles'
# build script and cache. Usage: build.sh [v4|v3]... (default: v4 v3); prints
# one binary path per requested line.
set -euo pipefail
[ $# -gt 0 ] || set -- v4 v3
exec "$(dirname "$0")/../oracle/build.sh" "${@/#/argodb/}"
