#!/usr/bin/env bash
# Rebuilds plotly-icicle-bar.min.js from the npm registry (plotly.js and esbuild at the exact
# versions of package-lock.json) and checks it against SHA256SUMS; --write replaces the
# committed file and its sum (after a version bump in package.json and `npm install
# --package-lock-only`).  Needs node and npm.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=plotly-icicle-bar.min.js
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$here/package.json" "$here/package-lock.json" "$here/entry.js" "$work/"
cd "$work"
npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
# two passes, as plotly's own widget bundle is made: the bundle keeps each module's path
# as its key (icicle_patch finds plotly's icicle code by it), then the minifier
npx esbuild entry.js --bundle --format=iife --global-name=__ddprofPlotly --target=es2016 \
  --define:global=window --define:define.amd=false --loader:.css=empty --legal-comments=inline \
  --log-level=warning --outfile=bundled.js
version=$(node -p 'require("plotly.js/package.json").version')
npx esbuild bundled.js --minify --target=es2016 --legal-comments=eof --log-level=warning --outfile="$out" \
  --banner:js="/*! plotly.js v$version, icicle and bar traces only (ddprof_nb/explorer/plotly_js/build.sh); MIT License, Plotly Technologies Inc.; bundled packages and their licences: README.md */"
if [ "${1:-}" = "--write" ]; then
  cp "$out" "$here/$out"
  sha256sum "$out" > "$here/SHA256SUMS"
  echo "wrote $here/$out"
else
  (cd "$work" && sha256sum -c "$here/SHA256SUMS")
fi
