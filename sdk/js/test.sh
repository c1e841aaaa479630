#!/usr/bin/env bash
# Unit tests of the JavaScript SDK (promptd.js) under Node: esbuild bundles test/sdk.test.js
# with the host import replaced by test/host-stub.js, then `node --test` runs it. Needs
# sdk/js/install.sh first.
set -euo pipefail
SDK="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
[ -x "$SDK/node_modules/.bin/esbuild" ] || { echo "sdk/js/test.sh: run sdk/js/install.sh first" >&2; exit 1; }
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
"$SDK/node_modules/.bin/esbuild" "$SDK/test/sdk.test.js" --bundle --format=esm --platform=node \
  --log-level=warning \
  --alias:promptd-sdk="$SDK/promptd.js" \
  --alias:promptd:plugin/host@0.3.0="$SDK/test/host-stub.js" \
  --outfile="$TMP/sdk.test.mjs"
node --test "$TMP/sdk.test.mjs"
