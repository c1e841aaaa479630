#!/usr/bin/env python3
"""A minimal MCP server over stdio (newline-delimited JSON-RPC 2.0), standard library only, for
the client's `session.run_tool` tests: the daemon under test runs it as `[mcp.stub]`.

Tools: `shout` ({"text": string}) answers the text in capitals; `fail` ({}) answers a tool
error (`isError: true`), which the daemon records with `is_error`. Deterministic, no clock,
no network; it exits when its stdin closes.
"""

import json
import sys

TOOLS = [
    {"name": "shout", "description": "Say the text in capitals.",
     "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}},
                     "required": ["text"], "additionalProperties": False}},
    {"name": "fail", "description": "Always fails.",
     "inputSchema": {"type": "object", "properties": {}, "additionalProperties": False}},
]


def call(params):
    name, arguments = params.get("name"), params.get("arguments") or {}
    if name == "shout":
        return {"content": [{"type": "text", "text": str(arguments.get("text", "")).upper()}],
                "isError": False}
    if name == "fail":
        return {"content": [{"type": "text", "text": "it failed, as it always does"}],
                "isError": True}
    raise LookupError(f"no tool {name!r}")


def answer(request):
    method, params = request.get("method"), request.get("params") or {}
    if method == "initialize":
        # The version the client asked for: this server speaks whichever it is.
        return {"protocolVersion": params.get("protocolVersion", "2025-06-18"),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "promptd-client-test-stub", "version": "1.0.0"}}
    if method == "ping":
        return {}
    if method == "tools/list":
        return {"tools": TOOLS}
    if method == "tools/call":
        return call(params)
    raise NotImplementedError(method)


def main():
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        if "id" not in request:
            continue  # a notification (initialized, cancelled): nothing to answer
        try:
            reply = {"jsonrpc": "2.0", "id": request["id"], "result": answer(request)}
        except NotImplementedError as e:
            reply = {"jsonrpc": "2.0", "id": request["id"],
                     "error": {"code": -32601, "message": f"method not found: {e}"}}
        except LookupError as e:
            reply = {"jsonrpc": "2.0", "id": request["id"],
                     "error": {"code": -32602, "message": str(e)}}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
