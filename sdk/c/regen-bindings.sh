#!/usr/bin/env bash
# Regenerates sdk/c/generated/ from wit/ with wit-bindgen (sdk/c/install.sh --wit-bindgen
# installs it). Run it when the WIT changes; commit the result.
set -euo pipefail
SDK="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WB="${WIT_BINDGEN:-$SDK/.tools/bin/wit-bindgen}"
[ -x "$WB" ] || { echo "sdk/c/regen-bindings.sh: wit-bindgen not found: run sdk/c/install.sh --wit-bindgen" >&2; exit 1; }
rm -rf "$SDK/generated"
"$WB" c --world plugin --out-dir "$SDK/generated" "$SDK/../../wit"
