#!/usr/bin/env bash
# Builds Argo's UI from the module's ui/ sources into UI_DIR/dist/app (webpack,
# production), for `tools/argo/build.sh cli-ui`, which embeds it in the argo
# binary as Argo's Makefile does.
#
# Usage: ui.sh UI_DIR   (a writable copy of the module's ui/)
#
# Argo pins argo-ui, its component library, to a commit of its source
# repository, which nothing here reaches; the npm registry's argo-ui 1.0.0
# stands in for it. yarn is not installed, so npm resolves package.json's
# ranges (not Argo's yarn.lock), with --legacy-peer-deps as some of those
# ranges disagree on peers; ajv 8 is installed at the top because npm's
# hoisting otherwise puts eslint's ajv 6 where webpack's schema-utils looks.
# That argo-ui is older than the pinned commit in two places the build
# meets: it imports xterm's stylesheet from xterm 3's dist/ (xterm 4, which
# Argo's UI uses, keeps it in css/) and uuid's removed `uuid/v1` path; both
# lines are rewritten to what the newer packages export.
set -euo pipefail

ui=$1
log() { echo "argo-ui: $*" >&2; }
command -v npm >/dev/null || { log "npm is not on PATH; install Node.js 20+"; exit 1; }
cd "$ui"
sed -i 's|"argo-ui": "git+[^"]*"|"argo-ui": "1.0.0"|' package.json
start=$SECONDS
log "npm install ($(grep -c '"' package.json) lines of package.json; about 1,500 packages)"
npm install --legacy-peer-deps --ignore-scripts --no-audit --no-fund >&2
npm install --legacy-peer-deps --ignore-scripts --no-audit --no-fund --no-save 'ajv@^8' >&2
sed -i "s|@import 'node_modules/xterm/dist/xterm';|@import 'node_modules/xterm/css/xterm';|" \
  node_modules/argo-ui/src/components/logs-viewer/logs-viewer.scss
sed -i "s|const uuid = require('uuid/v1');|const {v1: uuid} = require('uuid');|" \
  node_modules/argo-ui/src/components/form-field/form-field.tsx
log "installed in $((SECONDS - start))s; webpack --mode production"
NODE_ENV=production NODE_OPTIONS=--max-old-space-size=4096 npx --no-install webpack --mode production >&2
[ -f dist/app/index.html ] || { log "webpack wrote no dist/app/index.html"; exit 1; }
rm -rf node_modules
log "built Argo's UI in $((SECONDS - start))s"
