"""The agent loop every Python SDK script runs; the scripts add only their SDK call.

A loop is what a real agent does with promptd: for each step, ask promptd for the request body
in the SDK's format, hand that body to the official client UNCHANGED (`create(**body)`), record
the client's reply back into the session in the SDK's own shape, and carry the tool results (in
promptd's neutral shape) into the next step. Standard library only, besides the SDK.

    SCRIPT PROMPTD_URL STUB_URL AGENT [--steps N]

Exits 1 with the SDK's (or promptd's) error on any failure; on success prints one line of JSON:
{"sdk", "format", "agent", "steps", "tool_calls", "tool_results", "request_bytes", "reply_bytes"}.
"""

import argparse
import json
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field

TIMEOUT_S = 30


@dataclass
class Turn:
    """What one SDK call gave: the reply to record, the tool calls it made, its text."""

    reply: dict
    calls: list = field(default_factory=list)  # (call id, tool name)
    text: str = ""


class Failed(Exception):
    pass


def parse_args(extra=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("promptd")
    parser.add_argument("stub")
    parser.add_argument("agent")
    parser.add_argument("--steps", type=int, default=4)
    if extra:
        extra(parser)
    return parser.parse_args()


def post(base, path, body):
    data = json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as e:
        raise Failed(f"promptd POST {path} -> {e.code}: {e.read().decode(errors='replace')}") from None


def facts(dirty):
    # git_dirty flips after the first tool call, so a fresh runtime context snapshot lands right
    # after tool results, as it would in a real loop.
    return {"cwd": "/src/app", "git_branch": "main", "git_dirty": "true" if dirty else "false",
            "date": "2026-12-01"}


def run(sdk, fmt, args, call):
    """Runs the loop; `call(body) -> Turn` is the SDK part."""
    sid = post(args.promptd, "/v1/sessions", {"agent": args.agent})["id"]
    pending = [{"role": "user", "content": "Look around the repository and tell me what is here."}]
    awaiting = []  # call ids whose results `pending` carries
    stats = {"sdk": sdk, "format": fmt, "agent": args.agent, "steps": 0, "tool_calls": 0,
             "tool_results": 0, "request_bytes": 0, "reply_bytes": 0}
    for n in range(1, args.steps + 1):
        where = f"step {n}"
        step = post(args.promptd, f"/v1/sessions/{sid}/steps",
                    {"format": fmt, "messages": pending, "facts": facts(stats["tool_calls"] > 0)})
        body = step["request"]
        stats["request_bytes"] += len(json.dumps(body, separators=(",", ":")))
        try:
            turn = call(body)
        except Exception as e:  # the SDK's own error: show it as it is
            raise Failed(f"{where}: the {sdk} client refused or failed: {type(e).__name__}: {e}") from None
        if awaiting:
            # The stub names the call ids whose results it read: proof they arrived, answered.
            missing = [c for c in awaiting if c not in turn.text]
            if turn.calls or missing:
                raise Failed(f"{where}: the provider did not take the tool results for {missing or awaiting} "
                             f"(reply text {turn.text!r}, calls {turn.calls})")
            stats["tool_results"] += len(awaiting)
        recorded = json.dumps(turn.reply, separators=(",", ":"))
        stats["reply_bytes"] += len(recorded)
        post(args.promptd, f"/v1/sessions/{sid}/messages", turn.reply)
        stats["steps"] = n
        if turn.calls:
            stats["tool_calls"] += len(turn.calls)
            pending = [{"role": "tool", "tool_call_id": call_id, "content": f"{name}: output {k}"}
                       for k, (call_id, name) in enumerate(turn.calls)]
            awaiting = [call_id for call_id, _ in turn.calls]
        else:
            pending = [{"role": "user", "content": f"Thanks. Now the next thing (question {n + 1})."}]
            awaiting = []
    return stats


def main(sdk, fmt, call_factory, extra=None):
    """`call_factory(args) -> call`, building the SDK client from the arguments."""
    args = parse_args(extra)
    try:
        stats = run(sdk, fmt, args, call_factory(args))
    except Failed as e:
        print(f"{sdk} loop, agent {args.agent}: {e}", file=sys.stderr)
        sys.exit(1)
    print(json.dumps(stats))
