#!/usr/bin/env bash
# Installs what tests/inspector.rs needs to drive the web inspector in a real browser: Debian's
# `chromium` and `chromium-driver` (apt-get, when either is missing) and the Python `selenium`
# client in the venv tests/inspector/.venv (pinned in requirements.txt). Does nothing when all
# are in place. Needs root for apt-get (or the two packages already installed) and Python 3.10+
# with venv (Debian: apt-get install python3-venv).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
die() { echo "tests/inspector/install.sh: $*" >&2; exit 1; }
command -v python3 >/dev/null || die "python3 not found: apt-get install python3 python3-venv"

if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
    command -v apt-get >/dev/null || die "chromium or chromedriver missing and no apt-get: install Debian's chromium and chromium-driver"
    as_root=()
    [ "$(id -u)" = 0 ] || as_root=(sudo)
    "${as_root[@]}" apt-get update -qq || die "apt-get update failed"
    # With its recommends (fonts among them): the screenshot's text needs them.
    DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq \
        chromium chromium-driver >/dev/null || die "apt-get install chromium chromium-driver failed"
fi

# A stamp holding the pins it was installed from, so an unchanged install costs no pip run, and
# a changed pin reinstalls.
pins="$(sha256sum requirements.txt | cut -d' ' -f1)"
if [ -x .venv/bin/python ] && [ "$(cat .venv/.pins 2>/dev/null)" = "$pins" ]; then
    exit 0
fi
[ -x .venv/bin/pip ] || python3 -m venv .venv || die "python3 -m venv failed: apt-get install python3-venv"
.venv/bin/pip install -q --disable-pip-version-check -r requirements.txt
echo "$pins" > .venv/.pins
.venv/bin/python -c 'import selenium; print("selenium", selenium.__version__)'
/usr/bin/chromium --version 2>/dev/null | grep -i chromium || true
/usr/bin/chromedriver --version
