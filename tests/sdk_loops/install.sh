#!/usr/bin/env bash
# Installs the official provider clients the real-client tests drive: the Python `openai`,
# `anthropic`, `google-genai` and `boto3` packages into the venv tests/sdk_loops/.venv (pinned in
# requirements.txt) and the npm `openai` and `@anthropic-ai/sdk` packages into
# tests/sdk_loops/js/node_modules (exactly as pinned by js/package-lock.json). Does nothing when
# both are in place. Needs Python 3.11+ (google-genai's floor) with venv and Node.js 18+ with npm
# (Debian: apt-get install python3-venv nodejs npm).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
die() { echo "tests/sdk_loops/install.sh: $*" >&2; exit 1; }
command -v python3 >/dev/null || die "python3 not found: apt-get install python3 python3-venv"
command -v npm >/dev/null || die "npm not found: apt-get install nodejs npm"

# A stamp holding the pins it was installed from, so an unchanged install costs no pip or npm
# run, and a changed pin reinstalls.
pins="$(cat requirements.txt js/package-lock.json | sha256sum | cut -d' ' -f1)"
if [ -x .venv/bin/python ] && [ -d js/node_modules ] && [ "$(cat .venv/.pins 2>/dev/null)" = "$pins" ]; then
    exit 0
fi
[ -x .venv/bin/pip ] || python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -r requirements.txt
(cd js && npm ci --no-audit --no-fund --loglevel=error)
echo "$pins" > .venv/.pins
.venv/bin/python -c 'import openai, anthropic, google.genai, boto3; print("openai", openai.__version__, "anthropic", anthropic.__version__, "google-genai", google.genai.__version__, "boto3", boto3.__version__)'
