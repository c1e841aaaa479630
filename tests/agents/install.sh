#!/usr/bin/env bash
# Installs the coding agent CLI the agent tests drive through promptd's gateway: Claude Code
# (`@anthropic-ai/claude-code`) into tests/agents/node_modules, exactly as pinned by
# package-lock.json. Its native linux binary comes from the per-platform optional dependency
# (`@anthropic-ai/claude-code-linux-x64` here) and the wrapper's postinstall links it over
# bin/claude.exe; node_modules/.bin/claude then runs it with no Node.js process in between.
# Does nothing when that install is in place. Needs Node.js with npm (Debian: apt-get install
# nodejs npm); the package asks for Node 22+, but Node runs only its small postinstall, which
# works on 20, so the engine check is a warning, not a stop.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
die() { echo "tests/agents/install.sh: $*" >&2; exit 1; }
command -v node >/dev/null || die "node not found: apt-get install nodejs npm"
command -v npm >/dev/null || die "npm not found: apt-get install nodejs npm"

# A stamp holding the pins it was installed from, so an unchanged install costs no npm run, and
# a changed pin reinstalls.
pins="$(cat package.json package-lock.json | sha256sum | cut -d' ' -f1)"
if [ -x node_modules/.bin/claude ] && [ "$(cat node_modules/.pins 2>/dev/null)" = "$pins" ]; then
    exit 0
fi
npm ci --no-audit --no-fund --loglevel=error --engine-strict=false --include=optional \
    || die "npm ci failed (package.json and package-lock.json must agree; the npm registry must be reachable)"

wrapper=node_modules/@anthropic-ai/claude-code
version="$(node -p 'require("./package-lock.json").packages["node_modules/@anthropic-ai/claude-code"].version')"
ls -d node_modules/@anthropic-ai/claude-code-*/ >/dev/null 2>&1 \
    || die "npm installed no native package of @anthropic-ai/claude-code for $(node -p 'process.platform + "-" + process.arch') (is --omit=optional or os/cpu set in the npm config?)"
# An npm that ran no install scripts (ignore-scripts, or scripts not allowed) leaves a stub in
# bin/claude.exe: run the wrapper's postinstall by hand, which links the native binary over it.
if ! node_modules/.bin/claude --version >/dev/null 2>&1; then
    (cd "$wrapper" && node install.cjs) || die "the postinstall of @anthropic-ai/claude-code could not put the native binary in place"
fi
got="$(node_modules/.bin/claude --version 2>&1)" || die "node_modules/.bin/claude --version failed: $got"
case "$got" in
    "$version "*) ;;
    *) die "node_modules/.bin/claude --version says '$got', not version $version from package-lock.json" ;;
esac
echo "$pins" > node_modules/.pins
echo "claude-code $got"
