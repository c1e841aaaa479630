#!/usr/bin/env bash
# Installs the Python SDK's build tool (componentize-py, pinned in requirements.txt) into the
# venv sdk/python/.venv. Needs Python 3.10+ with venv (Debian: apt-get install python3-venv).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
command -v python3 >/dev/null || { echo "sdk/python/install.sh: python3 not found: apt-get install python3 python3-venv" >&2; exit 1; }
[ -x .venv/bin/pip ] || python3 -m venv .venv
.venv/bin/pip install -q -r requirements.txt
.venv/bin/componentize-py --version
