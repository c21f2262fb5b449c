#!/usr/bin/env bash
# Builds cargo-deny (the dependency check `make test` runs with deny.toml:
# licenses, bans, sources) with `cargo install --locked` (its own Cargo.lock),
# once per pinned version and toolchain, and prints the directory holding it.
# Cached like the control plane (tools/controlplane/):
# $REWIND_CACHE/bin/cargo-deny-<version>-<pin hash>/, built in a temp dir and
# renamed.
set -euo pipefail

CARGO_DENY_VERSION=0.20.2
cache=${REWIND_CACHE:-$HOME/.cache/rewind}
command -v cargo >/dev/null || { echo "deny: cargo is not on PATH; install Rust 1.89+" >&2; exit 1; }
rustver=$(rustc --version)
dir="$cache/bin/cargo-deny-$CARGO_DENY_VERSION-$(echo "$CARGO_DENY_VERSION $rustver" | sha256sum | cut -c1-12)"

if [ ! -f "$dir/.complete" ]; then
  mkdir -p "$cache/bin"
  tmp=$(mktemp -d "$cache/bin/.build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  start=$SECONDS
  echo "deny: cargo install --locked cargo-deny@$CARGO_DENY_VERSION" >&2
  # Its own target dir, so a CARGO_TARGET_DIR set for the project is left alone.
  cargo install --quiet --locked --root "$tmp/root" --target-dir "$tmp/target" "cargo-deny@$CARGO_DENY_VERSION"
  mv "$tmp/root/bin/cargo-deny" "$tmp/"
  rm -rf "$tmp/root" "$tmp/target"
  touch "$tmp/.complete"
  rm -rf "$dir"; mv "$tmp" "$dir"
  trap - EXIT
  echo "deny: built $(basename "$dir") in $((SECONDS - start))s" >&2
fi
echo "$dir"
