#!/usr/bin/env bash
# Builds a promptd plugin written in Python into a WebAssembly component.
#
#   sdk/python/build.sh PLUGIN_DIR OUT.wasm     # entry module: PLUGIN_DIR/app.py
#
# componentize-py generates the bindings from wit/ (module `wit_world`), pre-initialises the app
# (imports it, finds its `WitWorld`) and snapshots CPython into a component of world
# promptd:plugin/plugin@0.3.0 (wit/plugin.wit; the archived worlds in wit/0.1.0 and wit/0.2.0
# are not read). There is no build for an older world: the SDK's glue is written for 0.3.0, and
# a plugin written for the 0.2.0 (or 0.1.0) SDK builds unchanged into a 0.3.0 component that
# declares what it did. PLUGIN_DIR and sdk/python/src (the `promptd_sdk` package) are on the
# Python path; pure-Python dependencies can come from the venv in VIRTUAL_ENV or from the
# folders in PROMPTD_PYTHON_PATH (colon-separated). The plugin's id is OUT's file name without
# `.wasm`. Installs nothing: run sdk/python/install.sh first.
#
# Environment: PROMPTD_WIT overrides the WIT folder (default: the repository's wit/; it must
# hold world promptd:plugin@0.3.0, which the glue is written for);
# PROMPTD_APP overrides the entry module name (default: app); PROMPTD_PURE=1 builds a component
# that imports no WASI at all (componentize-py --stub-wasi: WASI calls such as print() trap, and
# the random seed is fixed at build time).
set -euo pipefail

die() { echo "sdk/python/build.sh: $*" >&2; exit 1; }

[ $# -eq 2 ] || die "usage: build.sh PLUGIN_DIR OUT.wasm"
SDK="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WIT="${PROMPTD_WIT:-$SDK/../../wit}"
DIR="$1"
OUT="$2"
APP="${PROMPTD_APP:-app}"
[ -f "$DIR/$APP.py" ] || [ -f "$DIR/$APP/__init__.py" ] || die "no entry module $APP in $DIR (a plugin folder needs an app.py)"
[ -d "$WIT" ] || die "no WIT folder at $WIT (set PROMPTD_WIT)"

CPY="$SDK/.venv/bin/componentize-py"
[ -x "$CPY" ] || CPY="$(command -v componentize-py || true)"
[ -n "$CPY" ] || die "componentize-py not found: run sdk/python/install.sh (it runs: python3 -m venv sdk/python/.venv && sdk/python/.venv/bin/pip install -r sdk/python/requirements.txt)"

PATHS=(-p "$DIR" -p "$SDK/src")
IFS=: read -r -a EXTRA <<<"${PROMPTD_PYTHON_PATH:-}"
for d in "${EXTRA[@]}"; do [ -n "$d" ] && PATHS+=(-p "$d"); done
# Without VIRTUAL_ENV, componentize-py would search the site-packages of whatever `python` is on
# PATH; point it at the SDK's own venv instead.
export VIRTUAL_ENV="${VIRTUAL_ENV:-$SDK/.venv}"

FLAGS=()
[ "${PROMPTD_PURE:-0}" = 1 ] && FLAGS+=(--stub-wasi)
mkdir -p "$(dirname "$OUT")"
"$CPY" -q -d "$WIT" -w plugin componentize "${PATHS[@]}" "$APP" "${FLAGS[@]}" -o "$OUT"
echo "built $OUT ($(wc -c <"$OUT") bytes)"
