#!/usr/bin/env bash
# Installs the JavaScript SDK's build tools (componentize-js, esbuild) into sdk/js/node_modules,
# exactly as pinned by sdk/js/package-lock.json. Needs Node.js 18+ and npm
# (Debian: apt-get install nodejs npm).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
command -v npm >/dev/null || { echo "sdk/js/install.sh: npm not found: apt-get install nodejs npm" >&2; exit 1; }
npm ci --no-audit --no-fund
