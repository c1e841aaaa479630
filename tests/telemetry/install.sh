#!/usr/bin/env bash
# Installs what tests/telemetry.rs exports the daemon's spans to and reads them back from: Arize
# Phoenix (`phoenix serve`: an OTLP/HTTP and OTLP/gRPC trace collector with a REST API and a web
# UI, on SQLite), with every package under it at the exact versions of requirements.txt, into
# tests/telemetry/.venv. Idempotent: a stamp holding the hash of this script and the pins skips
# a second run; any change makes the venv anew. Needs Python 3.11+ with venv (Debian:
# apt-get install python3 python3-venv).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
die() { echo "tests/telemetry/install.sh: $*" >&2; exit 1; }

PHOENIX_VERSION="20.26.1"

command -v python3 >/dev/null || die "python3 not found: apt-get install python3 python3-venv"
python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || die "arize-phoenix needs Python 3.11 or newer, found $(python3 --version)"
python3 -c 'import venv, ensurepip' 2>/dev/null \
    || die "python3 has no venv/ensurepip: apt-get install python3-venv"
grep -qx "arize-phoenix==${PHOENIX_VERSION}" requirements.txt \
    || die "requirements.txt does not pin arize-phoenix==${PHOENIX_VERSION}"

stamp="$(cat install.sh requirements.txt | sha256sum | cut -d' ' -f1)"
if [ -x .venv/bin/phoenix ] && [ "$(cat .venv/.stamp 2>/dev/null)" = "$stamp" ]; then
    exit 0
fi

rm -rf .venv
python3 -m venv .venv
# --no-deps: requirements.txt lists every package, so nothing unpinned comes in; pip check
# then proves the set is complete and consistent.
.venv/bin/pip install -q --disable-pip-version-check --no-input --no-deps -r requirements.txt
.venv/bin/pip check --disable-pip-version-check >/dev/null \
    || { .venv/bin/pip check --disable-pip-version-check >&2; die "the pinned set is inconsistent (above)"; }
# `phoenix` has no --version, and importing the phoenix package creates its working directory
# (~/.phoenix unless PHOENIX_WORKING_DIR is set): ask the installed metadata instead.
[ -x .venv/bin/phoenix ] || die "the phoenix command is missing from .venv/bin"
installed="$(.venv/bin/python -c 'from importlib.metadata import version; print(version("arize-phoenix"))')"
[ "$installed" = "${PHOENIX_VERSION}" ] || die "arize-phoenix is not ${PHOENIX_VERSION}: ${installed}"
echo "$stamp" > .venv/.stamp
echo "tests/telemetry/install.sh: installed arize-phoenix ${PHOENIX_VERSION} into $here/.venv"
