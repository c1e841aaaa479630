#!/usr/bin/env python3
"""Self-test of stub_provider.py's streamed replies, its faults and its request capture.

    cd tests/sdk_loops && .venv/bin/python -m unittest -v test_stub_stream

Starts the stub as a subprocess (stdin kept open, so it exits with this test) and reads its
streams over plain HTTP (http.client, so every frame and the chunked framing can be checked),
then through the pinned official SDKs when the venv has them (openai's
`chat.completions.create(stream=True)` and `responses.create(stream=True)`, anthropic's
`messages.stream`): each reassembles the streamed reply to the same content, tool calls and
usage as the unstreamed one, and each `x-stub-fault` behaves as the stub's docstring says.
The SDK tests are skipped when the SDKs are not installed (python3 alone runs the rest).
"""

import base64
import http.client
import json
import os
import socket
import subprocess
import sys
import time
import unittest

try:
    import anthropic
    import httpx2
    import openai
except ImportError:  # plain python3: the HTTP-level tests still run
    anthropic = openai = httpx2 = None

STUB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stub_provider.py")
START_MS = 10_000_000  # scripted "now", in ms
SDKS = unittest.skipUnless(openai is not None and anthropic is not None,
                           "the pinned openai and anthropic SDKs are not installed")


def text_of(n_tokens, seed="a"):
    """Filler text of about `n_tokens` tokens (4 characters each)."""
    unit = seed + " lorem ipsum dolor "
    return (unit * (n_tokens * 4 // len(unit) + 1))[: n_tokens * 4]


TOOLS_SCHEMA = {"type": "object", "properties": {"path": {"type": "string"},
                                                  "depth": {"type": "integer"}},
                "required": ["path"]}


def chat_body(round_=0, answered=False, **extra):
    """A Chat Completions body: round 0 gets one tool call, round 1 text and two parallel
    calls, `answered` the final text."""
    messages = [{"role": "system", "content": text_of(1500)},
                {"role": "user", "content": "List the files."}]
    for r in range(round_):
        calls = [{"id": f"call_{r}_{n}", "type": "function",
                  "function": {"name": name, "arguments": '{"path": "."}'}}
                 for n, name in enumerate(["list_dir", "read_file"])]
        messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in calls]
    if answered:
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_x", "type": "function",
             "function": {"name": "list_dir", "arguments": '{"path": "."}'}}]})
        messages.append({"role": "tool", "tool_call_id": "call_x", "content": "a.txt"})
    body = {"model": "gpt-5.1", "messages": messages,
            "tools": [{"type": "function", "function": {"name": name, "parameters": TOOLS_SCHEMA}}
                      for name in ("list_dir", "read_file")]}
    body.update(extra)
    return body


def responses_body(round_=0, answered=False, **extra):
    items = [{"role": "user", "content": "List the files."}]
    for r in range(round_):
        for n, name in enumerate(["list_dir", "read_file"]):
            items.append({"type": "function_call", "call_id": f"call_{r}_{n}", "name": name,
                          "arguments": '{"path": "."}'})
        for n in range(2):
            items.append({"type": "function_call_output", "call_id": f"call_{r}_{n}",
                          "output": "ok"})
    if answered:
        items.append({"type": "function_call", "call_id": "call_x", "name": "list_dir",
                      "arguments": '{"path": "."}'})
        items.append({"type": "function_call_output", "call_id": "call_x", "output": "a.txt"})
    body = {"model": "gpt-5.1", "instructions": text_of(1500), "input": items,
            "tools": [{"type": "function", "name": name, "parameters": TOOLS_SCHEMA}
                      for name in ("list_dir", "read_file")]}
    body.update(extra)
    return body


def messages_body(answered=False, **extra):
    """A Messages body; the stub's first reply is thinking, text-less tool use; with an
    assistant tool-use turn already in it (round 1) it adds redacted thinking and text."""
    body = {"model": "claude-sonnet-4-5", "max_tokens": 256,
            "system": [{"type": "text", "text": text_of(1500),
                        "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": "List the files."}],
            "tools": [{"name": name, "input_schema": TOOLS_SCHEMA}
                      for name in ("list_dir", "read_file")]}
    body.update(extra)
    return body


def parse_sse(data):
    """[(event or None, data text)] of an event stream, by the SSE rules."""
    events = []
    for block in data.decode("utf-8").split("\n\n"):
        if not block:
            continue
        event, lines = None, []
        for line in block.split("\n"):
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "event":
                event = value
            elif name == "data":
                lines.append(value)
        events.append((event, "\n".join(lines)))
    return events


class StubServer(unittest.TestCase):
    """The stub on a free port, and plain-HTTP helpers."""

    @classmethod
    def setUpClass(cls):
        cls.proc = subprocess.Popen([sys.executable, STUB, "--max-seconds", "300"],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        cls.port = int(cls.proc.stdout.readline())
        cls.base = f"http://127.0.0.1:{cls.port}"

    @classmethod
    def tearDownClass(cls):
        cls.proc.stdin.close()
        cls.proc.wait(timeout=10)
        cls.proc.stdout.close()

    def setUp(self):
        status, _, data = self.request("POST", "/stub/reset", {})
        self.assertEqual((status, json.loads(data)), (200, {}))

    def request(self, method, path, body=None, headers=(), timeout=10):
        """(status, [(header, value)], body bytes) of one request on a fresh connection."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = None if body is None else json.dumps(body).encode()
            conn.putrequest(method, path, skip_accept_encoding=True)
            sent = [("Content-Type", "application/json"), *headers]
            if data is not None:
                sent.append(("Content-Length", str(len(data))))
            for name, value in sent:
                conn.putheader(name, value)
            conn.endheaders(data)
            resp = conn.getresponse()
            return resp.status, resp.getheaders(), resp.read()
        finally:
            conn.close()

    def post(self, path, body, now=START_MS, headers=()):
        status, got, data = self.request("POST", path, body,
                                         [("X-Stub-Now-Ms", str(now)), *headers])
        return status, dict((k.lower(), v) for k, v in got), data

    def plain(self, path, body, now=START_MS):
        status, _, data = self.post(path, body, now)
        self.assertEqual(status, 200, data)
        return json.loads(data)

    def streamed(self, path, body, now=START_MS, headers=()):
        """The (event, parsed JSON or raw text) frames of a streamed reply."""
        status, got, data = self.post(path, body, now, headers)
        self.assertEqual(status, 200, data)
        self.assertEqual(got["content-type"], "text/event-stream")
        self.assertEqual(got.get("transfer-encoding"), "chunked")
        return [(e, d if d == "[DONE]" else json.loads(d)) for e, d in parse_sse(data)]

    def captured(self):
        status, _, data = self.request("GET", "/stub/requests")
        self.assertEqual(status, 200)
        return json.loads(data)["requests"]

    def ledger(self):
        status, _, data = self.request("GET", "/stub/ledger")
        self.assertEqual(status, 200)
        return json.loads(data)["requests"]


class Capture(StubServer):
    def test_requests_are_kept_as_received(self):
        body = messages_body()
        raw = json.dumps(body).encode()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        conn.putrequest("POST", "/v1/messages?beta=true", skip_host=True,
                        skip_accept_encoding=True)
        sent = [("Host", f"127.0.0.1:{self.port}"), ("x-api-key", "sk-ant-stub"),
                ("Anthropic-Version", "2023-06-01"), ("X-Dup", "one"), ("X-Dup", "two"),
                ("content-type", "application/json"), ("Content-Length", str(len(raw)))]
        for name, value in sent:
            conn.putheader(name, value)
        conn.endheaders(raw)
        resp = conn.getresponse()
        data = resp.read()
        self.assertEqual(resp.status, 200, data)
        conn.close()
        self.request("GET", "/v1/models")
        self.ledger()  # the stub's own routes are not captured

        got = self.captured()
        self.assertEqual([(r["method"], r["path"]) for r in got],
                         [("POST", "/v1/messages?beta=true"), ("GET", "/v1/models")])
        self.assertEqual(got[0]["headers"], [list(h) for h in sent])
        self.assertEqual(base64.b64decode(got[0]["body_b64"]), raw)
        self.assertEqual(got[1]["body_b64"], "")

        self.request("POST", "/stub/reset", {})
        self.assertEqual(self.captured(), [])

    def test_chunked_request_body_is_decoded(self):
        raw = json.dumps(messages_body()).encode()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        conn.request("POST", "/v1/messages", body=iter([raw[:50], raw[50:]]),
                     headers={"Content-Type": "application/json"}, encode_chunked=True)
        resp = conn.getresponse()
        data = resp.read()
        self.assertEqual(resp.status, 200, data)
        conn.close()
        got = self.captured()
        self.assertIn(["Transfer-Encoding", "chunked"], got[0]["headers"])
        self.assertEqual(base64.b64decode(got[0]["body_b64"]), raw)

    def test_only_the_last_1000_are_kept(self):
        for i in range(1003):
            status, _, _ = self.request("GET", f"/nowhere/{i}")
            self.assertEqual(status, 404)
        got = self.captured()
        self.assertEqual(len(got), 1000)
        self.assertEqual(got[0]["path"], "/nowhere/3")
        self.assertEqual(got[-1]["path"], "/nowhere/1002")


if __name__ == "__main__":
    unittest.main()
