"""A small MCP server over stdio (JSON-RPC, one message a line) that misbehaves on purpose.

Usage: fixture_server.py MODE
  exit        exits at start, saying why on stderr
  hang_list   answers initialize, never answers tools/list
  bad_schema  lists a tool whose inputSchema is not a JSON object
  collide     lists `a.b` and `a_b`, which map to one provider name
  grow        lists `grow`; calling it adds the tool `grown` and announces list_changed
  same        lists `same` and `crash`; calling `same` announces list_changed with an
              unchanged list; calling `crash` exits (the daemon restarts it)
  slow_list   lists `slow_tool`, 2 s after it is asked
  bounds      lists `big`, whose call answers 2 MiB of text, `huge`, 100 MiB, `medium`,
              8 KiB, and `slow`, whose call answers after 5 s (a gateway's tool bounds, G13)
Each start appends a line to the file named by $FIXTURE_STARTS, when set; while the file
named by $FIXTURE_DOWN exists, a start exits at once (the server stays down).
"""
import json
import os
import sys

mode = sys.argv[1]
if os.environ.get("FIXTURE_STARTS"):
    with open(os.environ["FIXTURE_STARTS"], "a") as f:
        f.write("start\n")
if os.environ.get("FIXTURE_DOWN") and os.path.exists(os.environ["FIXTURE_DOWN"]):
    print("fixture: kept down", file=sys.stderr)
    sys.exit(4)
if mode == "exit":
    print("fixture: refusing to start", file=sys.stderr)
    sys.exit(3)

SCHEMA = {"type": "object", "properties": {}}
tools = {
    "grow": [{"name": "grow", "description": "Adds a tool.", "inputSchema": SCHEMA}],
    "same": [
        {"name": "same", "description": "Announces an unchanged list.", "inputSchema": SCHEMA},
        {"name": "crash", "description": "Exits.", "inputSchema": SCHEMA},
    ],
    "bad_schema": [{"name": "bad", "description": "Broken.", "inputSchema": 42}],
    "hang_list": [],
    "slow_list": [{"name": "slow_tool", "description": "Listed late.", "inputSchema": SCHEMA}],
    "collide": [{"name": n, "description": "", "inputSchema": SCHEMA} for n in ("a.b", "a_b")],
    "bounds": [
        {"name": "big", "description": "Answers 2 MiB of text.", "inputSchema": SCHEMA},
        {"name": "huge", "description": "Answers 100 MiB of text.", "inputSchema": SCHEMA},
        {"name": "medium", "description": "Answers 8 KiB of text.", "inputSchema": SCHEMA},
        {"name": "slow", "description": "Answers after 5 s.", "inputSchema": SCHEMA},
    ],
}[mode]
BIG_BYTES = 2 << 20
HUGE_BYTES = 100 << 20
SIZES = {"big": BIG_BYTES, "huge": HUGE_BYTES, "medium": 8 << 10}
SLOW_S = 5


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    message = json.loads(line)
    method, id_ = message.get("method"), message.get("id")
    if id_ is None:
        continue  # a notification
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": id_, "result": {
            "protocolVersion": "2025-06-18",
            "capabilities": {"tools": {"listChanged": True}},
            "serverInfo": {"name": "fixture", "version": "1"},
            "instructions": f"Fixture server in mode {mode}.",
        }})
    elif method == "tools/list":
        if mode == "slow_list":
            import time
            time.sleep(2)
        if mode != "hang_list":
            send({"jsonrpc": "2.0", "id": id_, "result": {"tools": tools}})
    elif method == "tools/call":
        name = message["params"]["name"]
        if name == "crash":
            sys.exit(1)
        if name in SIZES:
            size = SIZES[name]
            send({"jsonrpc": "2.0", "id": id_, "result": {
                "content": [{"type": "text", "text": "x" * size}]}})
            continue
        if name == "slow":
            import time
            time.sleep(SLOW_S)
            send({"jsonrpc": "2.0", "id": id_, "result": {
                "content": [{"type": "text", "text": "slow done"}]}})
            continue
        if name == "grow":
            tools.append({"name": "grown", "description": "Grown.", "inputSchema": SCHEMA})
        send({"jsonrpc": "2.0", "id": id_, "result": {
            "content": [{"type": "text", "text": f"{name} done"}]}})
        send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
    elif method == "ping":
        send({"jsonrpc": "2.0", "id": id_, "result": {}})
    else:
        send({"jsonrpc": "2.0", "id": id_,
              "error": {"code": -32601, "message": f"no method {method}"}})
