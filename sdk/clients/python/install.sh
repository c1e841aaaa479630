#!/usr/bin/env bash
# Builds the client's wheel and installs it the way a user would, into a fresh test venv:
#
#   .venv-build/   build, hatchling and their dependencies, exactly as pinned in
#                  build-requirements.txt (the wheel is built with --no-isolation from it, so
#                  no unpinned build tool is fetched)
#   dist/          promptd_client-VERSION-py3-none-any.whl, from `python -m build --wheel`
#   .venv-test/    made anew, holding that wheel file (not the source tree: no `pip install
#                  -e`) and the pinned test requirements (tests/requirements.txt: httpx, the
#                  official openai and anthropic clients at tests/sdk_loops' pins, pytest)
#
# tests/client_python.rs runs the examples, the client's tests and the README's loop with
# .venv-test/bin/python. Does nothing when the stamp of the pins and of the package's sources
# matches, so an unchanged tree costs no pip run; any change rebuilds and reinstalls. Needs
# Python 3.11+ with venv (Debian: apt-get install python3 python3-venv).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
die() { echo "sdk/clients/python/install.sh: $*" >&2; exit 1; }
command -v python3 >/dev/null || die "python3 not found: apt-get install python3 python3-venv"
python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || die "the client's tests need Python 3.11 or newer (google-genai's minimum; the client itself takes 3.10), found $(python3 --version)"
python3 -c 'import venv, ensurepip' 2>/dev/null \
    || die "python3 has no venv/ensurepip: apt-get install python3-venv"

pip_quiet=(-q --disable-pip-version-check --no-input)

# What the wheel and the venv are made from: the pins, and every file the wheel holds.
stamp="$( { cat install.sh build-requirements.txt tests/requirements.txt pyproject.toml README.md;
            find src -type f -not -name '*.pyc' -not -path '*/__pycache__/*' | LC_ALL=C sort \
              | while read -r f; do echo "$f"; cat "$f"; done; } | sha256sum | cut -d' ' -f1)"
if [ -x .venv-test/bin/python ] && [ "$(cat .venv-test/.stamp 2>/dev/null)" = "$stamp" ]; then
    exit 0
fi

build_pins="$(sha256sum build-requirements.txt | cut -d' ' -f1)"
if [ ! -x .venv-build/bin/python ] || [ "$(cat .venv-build/.pins 2>/dev/null)" != "$build_pins" ]; then
    rm -rf .venv-build
    python3 -m venv .venv-build
    .venv-build/bin/pip install "${pip_quiet[@]}" -r build-requirements.txt
    echo "$build_pins" > .venv-build/.pins
fi

rm -rf dist
build_log="$(mktemp)"
trap 'rm -f "$build_log"' EXIT
.venv-build/bin/python -m build --wheel --no-isolation --outdir dist . >"$build_log" 2>&1 \
    || { cat "$build_log" >&2; die "building the wheel failed (above)"; }
wheels=(dist/*.whl)
[ "${#wheels[@]}" -eq 1 ] && [ -f "${wheels[0]}" ] || die "expected one wheel in dist/, got: ${wheels[*]}"
wheel="${wheels[0]}"

# A fresh venv each time, so nothing of an earlier install (or of the source tree) is in it.
rm -rf .venv-test
python3 -m venv .venv-test
.venv-test/bin/pip install "${pip_quiet[@]}" -r tests/requirements.txt "$wheel"
# The package must come from the venv's site-packages, never from src/.
.venv-test/bin/python -I -c '
import pathlib, sys, promptd_client
where = pathlib.Path(promptd_client.__file__).resolve()
if "site-packages" not in where.parts:
    sys.exit(f"promptd_client was imported from {where}, not from the installed wheel")
'
echo "$stamp" > .venv-test/.stamp
echo "sdk/clients/python/install.sh: built $wheel; installed into .venv-test:"
.venv-test/bin/pip list --disable-pip-version-check --format=freeze | sed 's/^/    /'
