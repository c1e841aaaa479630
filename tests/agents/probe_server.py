#!/usr/bin/env python3
"""A logging stand-in for the Anthropic API, to learn what a coding agent CLI sends.

Listens on loopback (an OS-chosen port unless --port), prints the port on the first line of
stdout, and appends one JSON line per request to --log: method, path (with its query string), the
headers in the order they came (name case kept, repeats kept), the body as text (so two requests
can be compared by eye), the raw body bytes in base64 (`body_b64`, for byte-for-byte checks) and
the body parsed when it is JSON. A request is logged before it is answered.

POST /v1/messages gets a minimal valid Messages reply, as one JSON object or, when the body has
"stream": true, as an SSE stream (message_start, content_block_start, content_block_delta,
content_block_stop, message_delta with usage, message_stop). The reply is a scripted step: a
request whose conversation holds N tool_result blocks is answered with a tool_use of the N-th
--tool (input: the N-th --tool-input, JSON) when the request offers a tool of that name, and
with text ("done" unless --text) otherwise. So `--tool Read --tool-input '{...}' --tool Bash
--tool-input '{...}'` gives two tool calls and then the final text, and a side request without
tools (a title, a check) gets text.

POST /v1/messages/count_tokens answers {"input_tokens": N}; any other request gets 200 and {}
(HEAD: no body), and is logged all the same. Standard library only.

`probe_server.py --summarize LOG` prints, for each logged request, its method, path and for a
Messages request the top-level keys, model, stream flag, system blocks, tools and messages with
their cache_control breakpoints; then, for each next Messages request, which earlier messages it
repeats byte for byte, and which only up to a moved breakpoint.
"""
import argparse
import base64
import copy
import itertools
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ARGS = None
LOCK = threading.Lock()
IDS = itertools.count(1)


def log(entry):
    with LOCK, open(ARGS.log, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


def tool_results(body):
    """How many tool_result blocks the conversation holds: the step it is at."""
    return sum(1 for m in body.get("messages") or [] if isinstance(m.get("content"), list)
               for b in m["content"] if isinstance(b, dict) and b.get("type") == "tool_result")


def reply_blocks(body):
    """The content blocks to answer with, and the stop reason."""
    offered = {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)}
    step = tool_results(body)
    if step < len(ARGS.tool) and ARGS.tool[step] in offered:
        block = {"type": "tool_use", "id": f"toolu_probe{next(IDS):04d}", "name": ARGS.tool[step],
                 "input": json.loads(ARGS.tool_input[step])}
        return [block], "tool_use"
    return [{"type": "text", "text": ARGS.text}], "end_turn"


def input_tokens(body):
    return max(1, len(json.dumps(body)) // 4)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "probe"

    def log_message(self, fmt, *args):  # the JSON log is the record; keep stderr quiet
        pass

    def read_body(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            raw = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    self.rfile.readline()
                    break
                raw += self.rfile.read(size)
                self.rfile.readline()
        return raw

    def record(self, raw):
        text = raw.decode("utf-8", "replace")
        try:
            parsed = json.loads(text) if text else None
        except ValueError:
            parsed = None
        log({"method": self.command, "path": self.path,
             "headers": [[k, v] for k, v in self.headers.items()],
             "body": text, "body_b64": base64.b64encode(raw).decode("ascii"), "json": parsed})
        return parsed

    def send_json(self, obj, status=200, head=False):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("request-id", f"req_probe{next(IDS):04d}")
        self.end_headers()
        if not head:
            self.wfile.write(data)

    def do_HEAD(self):
        self.record(b"")
        self.send_json({}, head=True)

    def do_GET(self):
        self.record(b"")
        self.send_json({})

    def do_POST(self):
        body = self.record(self.read_body())
        path = self.path.split("?")[0]
        if path == "/v1/messages/count_tokens":
            return self.send_json({"input_tokens": input_tokens(body or {})})
        if path != "/v1/messages" or not isinstance(body, dict):
            return self.send_json({})
        blocks, stop = reply_blocks(body)
        usage = {"input_tokens": input_tokens(body), "output_tokens": 5,
                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        message = {"id": f"msg_probe{next(IDS):04d}", "type": "message", "role": "assistant",
                   "model": body.get("model", "probe"), "content": blocks,
                   "stop_reason": stop, "stop_sequence": None, "usage": usage}
        if not body.get("stream"):
            return self.send_json(message)
        self.stream(message, blocks, stop, usage)

    def stream(self, message, blocks, stop, usage):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("request-id", f"req_probe{next(IDS):04d}")
        self.end_headers()

        def event(kind, data):
            chunk = f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()
            self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            self.wfile.flush()

        start = dict(message, content=[], stop_reason=None,
                     usage=dict(usage, output_tokens=1))
        event("message_start", {"type": "message_start", "message": start})
        for i, block in enumerate(blocks):
            if block["type"] == "text":
                event("content_block_start", {"type": "content_block_start", "index": i,
                                              "content_block": {"type": "text", "text": ""}})
                delta = {"type": "text_delta", "text": block["text"]}
            else:
                event("content_block_start", {"type": "content_block_start", "index": i,
                                              "content_block": dict(block, input={})})
                delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            event("content_block_delta", {"type": "content_block_delta", "index": i,
                                          "delta": delta})
            event("content_block_stop", {"type": "content_block_stop", "index": i})
        event("message_delta", {"type": "message_delta",
                                "delta": {"stop_reason": stop, "stop_sequence": None},
                                "usage": {"output_tokens": usage["output_tokens"]}})
        event("message_stop", {"type": "message_stop"})
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def compact(obj):
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def without_breakpoints(msg):
    """A message without cache_control, a lone plain text block read as its string."""
    msg = copy.deepcopy(msg)
    content = msg.get("content")
    if isinstance(content, list):
        for block in content:
            if isinstance(block, dict):
                block.pop("cache_control", None)
        if len(content) == 1 and content[0].get("type") == "text" and set(content[0]) == {"type", "text"}:
            msg["content"] = content[0]["text"]
    return msg


def summarize(path):
    entries = [json.loads(line) for line in open(path, encoding="utf-8")]
    bodies = []
    for i, e in enumerate(entries):
        b = e["json"]
        print(f"#{i} {e['method']} {e['path']} ({len(e['body'].encode())} bytes)")
        if not isinstance(b, dict) or "messages" not in b:
            continue
        bodies.append((i, b))
        print(f"   keys: {', '.join(b)}")
        print(f"   model={b.get('model')} stream={b.get('stream')} max_tokens={b.get('max_tokens')}")
        system = b.get("system")
        if isinstance(system, list):
            for j, s in enumerate(system):
                print(f"   system[{j}] {len(s.get('text', ''))} chars cache_control={s.get('cache_control')}")
        cached = [t["name"] for t in b.get("tools") or [] if "cache_control" in t]
        print(f"   tools: {len(b.get('tools') or [])}, with cache_control: {cached or 'none'}")
        for j, m in enumerate(b["messages"]):
            c = m.get("content")
            if isinstance(c, str):
                print(f"   messages[{j}] {m['role']}: string ({len(c)} chars)")
            else:
                kinds = [blk.get("type") + ("+cache_control" if "cache_control" in blk else "") for blk in c]
                print(f"   messages[{j}] {m['role']}: {kinds}")
    for (i, a), (k, b) in zip(bodies, bodies[1:]):
        print(f"#{i} -> #{k}:")
        for j, m in enumerate(a["messages"]):
            n = b["messages"][j] if j < len(b["messages"]) else None
            if n is None:
                verdict = "dropped"
            elif compact(m) == compact(n):
                verdict = "same bytes"
            elif without_breakpoints(m) == without_breakpoints(n):
                verdict = "same but for cache_control (and a lone text block <-> string)"
            else:
                verdict = "CHANGED"
            print(f"   messages[{j}] {m['role']}: {verdict}")


def main():
    global ARGS
    if sys.argv[1:2] == ["--summarize"] and len(sys.argv) == 3:
        return summarize(sys.argv[2])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--log", required=True, help="file to append one JSON line per request to")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--text", default="done", help="the text of a text reply")
    p.add_argument("--tool", action="append", default=[],
                   help="answer step N (N tool results so far) with a tool_use of the N-th --tool")
    p.add_argument("--tool-input", action="append", default=[],
                   help="the input of the N-th --tool, as JSON")
    ARGS = p.parse_args()
    if len(ARGS.tool) != len(ARGS.tool_input):
        p.error("give one --tool-input for each --tool")
    for text in ARGS.tool_input:
        json.loads(text)
    server = ThreadingHTTPServer(("127.0.0.1", ARGS.port), Handler)
    print(server.server_address[1], flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
