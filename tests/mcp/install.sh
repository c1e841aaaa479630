#!/usr/bin/env bash
# Installs the real MCP servers tests/mcp.rs runs, pinned: PyPI's mcp-server-time into
# tests/mcp/.venv and npm's @modelcontextprotocol/server-everything into tests/mcp/js
# (from the committed package-lock.json). Idempotent: a stamp holding the pins' hash skips
# a second run.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"

MCP_SERVER_TIME_VERSION="2026.10.19"
stamp_key="$( { cat install.sh requirements.txt js/package.json; cat js/package-lock.json 2>/dev/null || true; } | sha256sum | cut -d' ' -f1)"
stamp=".installed"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$stamp_key" && -x .venv/bin/mcp-server-time \
      && -d js/node_modules/@modelcontextprotocol/server-everything ]]; then
  echo "MCP test servers already installed"
  exit 0
fi

python3 -m venv .venv
# requirements.txt pins mcp-server-time and every package under it, so a new release of any
# of them cannot change what the tests run.
.venv/bin/pip install --quiet --disable-pip-version-check -r requirements.txt
grep -qx "mcp-server-time==${MCP_SERVER_TIME_VERSION}" requirements.txt

if [[ -f js/package-lock.json ]]; then
  (cd js && npm ci --no-audit --no-fund --loglevel=error)
else
  # Only when the lock is being created (then commit js/package-lock.json).
  (cd js && npm install --no-audit --no-fund --loglevel=error)
fi

echo "$stamp_key" > "$stamp"
echo "MCP test servers installed in $here"
