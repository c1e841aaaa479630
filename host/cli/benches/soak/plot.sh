#!/usr/bin/env bash
# Draws the soak's samples.csv as a PNG: steps/s, p99 and the daemon's RSS against time, a
# line where each daemon run starts. matplotlib comes from a venv here, pinned by
# requirements.txt (installed on first use; a stamp skips it after).
# Usage: plot.sh SAMPLES.csv OUT.png
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
stamp_key="$(sha256sum "$here/requirements.txt" | cut -d' ' -f1)"
if [[ ! -x "$here/.venv/bin/python" || "$(cat "$here/.venv/.installed" 2>/dev/null)" != "$stamp_key" ]]; then
  python3 -m venv "$here/.venv"
  "$here/.venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt"
  echo "$stamp_key" > "$here/.venv/.installed"
fi
exec "$here/.venv/bin/python" "$here/plot.py" "$@"
