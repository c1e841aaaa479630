#!/usr/bin/env bash
# What tests/postgres.rs and host/store-postgres's tests need: Debian's PostgreSQL server and
# HAProxy, and an unprivileged user to run the server as (PostgreSQL refuses to run as root,
# and the tests run as root). Idempotent: installs only what is missing.
set -euo pipefail

USER_NAME=promptd-pg

missing=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
command -v haproxy >/dev/null 2>&1 || missing+=(haproxy)
if [ ${#missing[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# Debian starts a cluster of its own on 5432 when the package is installed; the tests start
# their own servers and do not need it.
if id "$USER_NAME" >/dev/null 2>&1; then
    :
else
    useradd --system --create-home --shell /usr/sbin/nologin "$USER_NAME"
fi

echo "postgres: $(ls -d /usr/lib/postgresql/*/bin | tail -n1); haproxy: $(command -v haproxy); user: $USER_NAME"
