#!/usr/bin/env bash
# Builds a promptd plugin written in JavaScript into a WebAssembly component.
#
#   sdk/js/build.sh PLUGIN_DIR OUT.wasm     # entry: PLUGIN_DIR/plugin.js
#   sdk/js/build.sh path/to/entry.js OUT.wasm
#
# The entry module imports the SDK as "promptd-sdk" (or by a relative path to promptd.js) and may
# import other local modules or npm packages: esbuild bundles them into one ES module, then
# componentize-js (SpiderMonkey) turns it into a component of world promptd:plugin/plugin@0.3.0
# (wit/plugin.wit; the archived worlds in wit/0.1.0 and wit/0.2.0 are not built against, but
# plugins written for them build unchanged, see 1. below).
# The plugin's id is OUT's file name without `.wasm`. Installs nothing: run sdk/js/install.sh first.
#
# Environment: PROMPTD_WIT overrides the WIT folder (default: the repository's wit/); its
# plugin.wit must be promptd:plugin@0.3.0, the version promptd.js imports the host at.
# PROMPTD_PURE=1 builds a component that imports no WASI at all (componentize-js
# --disable stdio random clocks: console output is dropped, Math.random and Date are fixed).
set -euo pipefail

die() { echo "sdk/js/build.sh: $*" >&2; exit 1; }

[ $# -eq 2 ] || die "usage: build.sh PLUGIN_DIR|ENTRY.js OUT.wasm"
SDK="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WIT="${PROMPTD_WIT:-$SDK/../../wit}"
if [ -d "$1" ]; then ENTRY="$1/plugin.js"; else ENTRY="$1"; fi
[ -f "$ENTRY" ] || die "no entry module: $ENTRY (a plugin folder needs a plugin.js)"
[ -d "$WIT" ] || die "no WIT folder at $WIT (set PROMPTD_WIT)"
ENTRY="$(cd "$(dirname "$ENTRY")" && pwd)/$(basename "$ENTRY")"
OUT_DIR="$(dirname "$2")"
mkdir -p "$OUT_DIR"
OUT="$(cd "$OUT_DIR" && pwd)/$(basename "$2")"

command -v node >/dev/null || die "node not found: install Node.js 18 or newer (Debian: apt-get install nodejs npm)"
BIN="$SDK/node_modules/.bin"
for tool in esbuild componentize-js; do
  [ -x "$BIN/$tool" ] || die "$tool not found in $BIN: run sdk/js/install.sh (it runs: cd sdk/js && npm ci)"
done

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

# 1. The bundle's entry: the three exports of the world promptd:plugin@0.3.0 (the same three
#    names as 0.2.0's), taken from the plugin's entry module (aliased below). A plugin written
#    for 0.1.0 with the SDK exports `declare, sectionText, contextText, variableValue,
#    shownTools` from exportPlugin; 0.2.0 and 0.3.0 have no per-item exports, and their
#    `evaluate` and `review` are not among the names such a plugin exports. exportPlugin puts all three on the `declare` it returns (promptd.js,
#    WORLD), so such a plugin builds unchanged.
cat >"$TMP/world.js" <<'EOF'
import * as plugin from "promptd-plugin-entry";

const sdk =
  (typeof plugin.declare === "function" && plugin.declare[Symbol.for("promptd-sdk.world")]) || {};

function world(name) {
  const f = typeof plugin[name] === "function" ? plugin[name] : sdk[name];
  if (typeof f !== "function") {
    throw new Error(
      `the plugin's entry module exports no \`${name}\` function; it must export the world's ` +
        "three, e.g. `export const { declare, evaluate, review } = exportPlugin(...)`",
    );
  }
  return f;
}

export const declare = world("declare");
export const evaluate = world("evaluate");
export const review = world("review");
EOF

# 2. One ES module: componentize-js only resolves imports below its working directory, and
#    knows nothing of node_modules. WIT imports (promptd:*, wasi:*) stay external.
"$BIN/esbuild" "$TMP/world.js" --bundle --format=esm --platform=neutral --log-level=warning \
  --alias:promptd-plugin-entry="$ENTRY" \
  --alias:promptd-sdk="$SDK/promptd.js" \
  '--external:promptd:*' '--external:wasi:*' \
  --outfile="$TMP/plugin.js"

# 3. The component. componentize-js reads the WIT through a sandbox that sees only its working
#    directory, so the WIT is copied beside the bundle. --disable http fetch-event: no wasi:http
#    imports (the host offers plain WASI p2).
cp -r "$WIT" "$TMP/wit"
DISABLE=(http fetch-event)
[ "${PROMPTD_PURE:-0}" = 1 ] && DISABLE+=(stdio random clocks)
( cd "$TMP" && "$BIN/componentize-js" --wit wit --world-name plugin \
    --disable "${DISABLE[@]}" --out "$OUT" plugin.js ) >"$TMP/log" 2>&1 \
  || { cat "$TMP/log" >&2; die "componentize-js failed"; }
echo "built $OUT ($(wc -c <"$OUT") bytes)"
