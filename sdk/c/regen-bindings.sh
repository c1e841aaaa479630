#!/usr/bin/env bash
# Regenerates sdk/c/generated/ from wit/ with wit-bindgen (sdk/c/install.sh --wit-bindgen
# installs it). Run it when the WIT changes; commit the result.
#
# It reads the top-level wit/*.wit (the current world, promptd:plugin@0.3.0); wit/0.1.0/ and
# wit/0.2.0/, the frozen published worlds that the host still serves, are subfolders and not read.
set -euo pipefail
SDK="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WIT_BINDGEN_VERSION=0.61.1 # as in install.sh; the generated files name it in their first line
WB="${WIT_BINDGEN:-$SDK/.tools/bin/wit-bindgen}"
[ -x "$WB" ] || { echo "sdk/c/regen-bindings.sh: wit-bindgen not found: run sdk/c/install.sh --wit-bindgen" >&2; exit 1; }
version="$("$WB" --version)"
case "$version" in
  *" $WIT_BINDGEN_VERSION"*) ;;
  *) echo "sdk/c/regen-bindings.sh: $WB is $version, not $WIT_BINDGEN_VERSION: run sdk/c/install.sh --wit-bindgen" >&2; exit 1 ;;
esac
rm -rf "$SDK/generated"
"$WB" c --world plugin --out-dir "$SDK/generated" "$SDK/../../wit"
