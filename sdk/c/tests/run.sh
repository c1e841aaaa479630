#!/usr/bin/env bash
# Native unit tests of the C SDK (sdk_test.c): compiles src/promptd.c and the generated bindings
# for the machine itself (not wasm) with the test plugin and runs them, under AddressSanitizer,
# LeakSanitizer and UBSan when the compiler supports them (gcc on Debian does), which checks the
# ownership rules of the exports: what the callee frees, what the post-return functions free.
#
#   sdk/c/tests/run.sh          # CC_NATIVE=gcc by default (cc if there is no gcc)
set -euo pipefail
SDK="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CC_NATIVE="${CC_NATIVE:-$(command -v gcc || command -v cc)}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
SAN=(-fsanitize=address,undefined -fno-omit-frame-pointer)
printf 'int main(void){return 0;}\n' >"$TMP/probe.c"
"$CC_NATIVE" "${SAN[@]}" "$TMP/probe.c" -o "$TMP/probe" 2>/dev/null || {
  echo "sdk/c/tests/run.sh: $CC_NATIVE has no sanitizers; running without them" >&2
  SAN=()
}
# The generated file's wasm-only attributes (import/export names) mean nothing natively;
# gcc's -Wformat-truncation misreads vformat's measuring vsnprintf(NULL, 0, ...).
"$CC_NATIVE" -std=c11 -D_GNU_SOURCE -g -O1 -Wall -Wextra -Wno-attributes -Wno-format-truncation "${SAN[@]}" \
  -I"$SDK/include" -I"$SDK/generated" \
  "$SDK/tests/sdk_test.c" "$SDK/src/promptd.c" "$SDK/generated/plugin.c" -o "$TMP/sdk_test"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1 "$TMP/sdk_test"
