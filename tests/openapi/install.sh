#!/usr/bin/env bash
# Installs what tests/openapi.rs runs against the daemon's OpenAPI document, pinned:
# openapi-spec-validator (is it valid OpenAPI 3.1?) and schemathesis (does the daemon answer
# as the document says, and does the document say what the daemon accepts and refuses?),
# with every package under them at the exact versions of requirements.txt, into
# tests/openapi/.venv. Idempotent: a stamp holding the hash of this script and the pins skips
# a second run; any change makes the venv anew. Needs Python 3.10+ with venv (Debian:
# apt-get install python3 python3-venv).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
die() { echo "tests/openapi/install.sh: $*" >&2; exit 1; }

OPENAPI_SPEC_VALIDATOR_VERSION="0.9.0"
SCHEMATHESIS_VERSION="4.32.5"

command -v python3 >/dev/null || die "python3 not found: apt-get install python3 python3-venv"
python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
    || die "schemathesis needs Python 3.10 or newer, found $(python3 --version)"
python3 -c 'import venv, ensurepip' 2>/dev/null \
    || die "python3 has no venv/ensurepip: apt-get install python3-venv"
grep -qx "openapi-spec-validator==${OPENAPI_SPEC_VALIDATOR_VERSION}" requirements.txt \
    || die "requirements.txt does not pin openapi-spec-validator==${OPENAPI_SPEC_VALIDATOR_VERSION}"
grep -qx "schemathesis==${SCHEMATHESIS_VERSION}" requirements.txt \
    || die "requirements.txt does not pin schemathesis==${SCHEMATHESIS_VERSION}"

stamp="$(cat install.sh requirements.txt | sha256sum | cut -d' ' -f1)"
if [ -x .venv/bin/schemathesis ] && [ -x .venv/bin/openapi-spec-validator ] \
    && [ "$(cat .venv/.stamp 2>/dev/null)" = "$stamp" ]; then
    exit 0
fi

rm -rf .venv
python3 -m venv .venv
# --no-deps: requirements.txt lists every package, so nothing unpinned comes in; pip check
# then proves the set is complete and consistent.
.venv/bin/pip install -q --disable-pip-version-check --no-input --no-deps -r requirements.txt
.venv/bin/pip check --disable-pip-version-check >/dev/null \
    || { .venv/bin/pip check --disable-pip-version-check >&2; die "the pinned set is inconsistent (above)"; }
[ "$(.venv/bin/schemathesis --version)" = "schemathesis, version ${SCHEMATHESIS_VERSION}" ] \
    || die "schemathesis is not ${SCHEMATHESIS_VERSION}: $(.venv/bin/schemathesis --version)"
echo "$stamp" > .venv/.stamp
echo "tests/openapi/install.sh: installed openapi-spec-validator ${OPENAPI_SPEC_VALIDATOR_VERSION} and schemathesis ${SCHEMATHESIS_VERSION} into $here/.venv"
