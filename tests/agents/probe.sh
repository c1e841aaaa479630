#!/usr/bin/env bash
# Runs Claude Code headless against probe_server.py and prints what it sent.
#
#   tests/agents/probe.sh OUT [probe_server.py options...] -- [claude options...]
#
# OUT (made anew) gets home/ (Claude Code's HOME), work/ (its working directory, holding
# notes.txt), log.jsonl (every request), out.json (its stdout), err.txt (its stderr). Claude Code
# runs with no environment but PATH, HOME, TERM, a fake key and the variables below, plus any
# given in PROBE_ENV ("NAME=value NAME=value"). As root with unshare(1) it all runs in a network
# namespace of its own with only loopback (needs unshare and ip), so nothing can leave the machine even when a flag is
# dropped (set PROBE_NETNS=0 to run in the machine's namespace). Example, one Read call then
# the final text:
#   tests/agents/probe.sh /tmp/probe --tool Read --tool-input '{"file_path":"/tmp/probe/work/notes.txt"}' \
#       -- -p "read notes.txt" --output-format json
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
die() { echo "tests/agents/probe.sh: $*" >&2; exit 1; }
[ $# -ge 1 ] || die "usage: probe.sh OUT [probe_server.py options...] -- [claude options...]"

if [ "${PROBE_NETNS:-1}" = 1 ] && [ -z "${PROBE_IN_NETNS:-}" ] && [ "$(id -u)" = 0 ] \
    && command -v unshare >/dev/null && command -v ip >/dev/null; then
    "$here/install.sh" >/dev/null
    exec env PROBE_IN_NETNS=1 unshare --net "$0" "$@"
fi
if [ -n "${PROBE_IN_NETNS:-}" ]; then
    ip link set lo up || die "could not bring up loopback in the new network namespace"
else
    "$here/install.sh" >/dev/null
fi

out="$(realpath -m "$1")"; shift
probe_args=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do probe_args+=("$1"); shift; done
[ $# -gt 0 ] || die "no -- before the claude options"
shift
rm -rf "$out" && mkdir -p "$out/home" "$out/work"
echo "hello from the probe" > "$out/work/notes.txt"

python3 "$here/probe_server.py" --log "$out/log.jsonl" "${probe_args[@]}" > "$out/port" &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -s "$out/port" ] && break; sleep 0.05; done
port="$(head -1 "$out/port")"
[ -n "$port" ] || die "probe_server.py printed no port"

rc=0
# shellcheck disable=SC2086 # PROBE_ENV is a list of NAME=value words
(cd "$out/work" && env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$out/home" TERM=dumb \
    ANTHROPIC_BASE_URL="http://127.0.0.1:$port" ANTHROPIC_API_KEY=sk-ant-test-0000000000000000 \
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 ${PROBE_ENV:-} \
    timeout 300 "$here/node_modules/.bin/claude" "$@" > "$out/out.json" 2> "$out/err.txt") || rc=$?
echo "claude exited $rc; stdout $out/out.json, stderr $out/err.txt, requests $out/log.jsonl"
python3 "$here/probe_server.py" --summarize "$out/log.jsonl"
exit $rc
