#!/usr/bin/env bash
# What the benches need beyond the Rust toolchain: `strace` for the syscalls bench (the
# allocs bench builds its counter with `cc`, which SQLite's build already needs), and
# PostgreSQL with `LOAD_STORE=postgres` (tests/postgres/install.sh). Debian's packages;
# idempotent: installs only what is missing.
set -euo pipefail

missing=()
command -v strace >/dev/null 2>&1 || missing+=(strace)
command -v cc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
if [ ${#missing[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
echo "strace: $(command -v strace); cc: $(command -v cc)"
