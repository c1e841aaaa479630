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
        messages += [{"role": "assistant", "content": "Done."},
                     {"role": "user", "content": "Now the next one."}]
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
        items += [{"role": "assistant", "content": "Done."},
                  {"role": "user", "content": "Now the next one."}]
    if answered:
        items.append({"type": "function_call", "call_id": "call_x", "name": "list_dir",
                      "arguments": '{"path": "."}'})
        items.append({"type": "function_call_output", "call_id": "call_x", "output": "a.txt"})
    body = {"model": "gpt-5.1", "instructions": text_of(1500), "input": items,
            "tools": [{"type": "function", "name": name, "parameters": TOOLS_SCHEMA,
                       "strict": False}
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



def chat_reassembled(frames):
    """The Chat message, finish_reason and usage a client rebuilds from `frames`, by the
    reassembly rules (a tool call's id and name only on its first fragment, by index)."""
    message, calls, finish, usage = {}, {}, None, None
    for _, chunk in frames[:-1]:
        if chunk.get("usage") is not None:
            usage = chunk["usage"]
        for choice in chunk["choices"]:
            delta = choice["delta"]
            for key in ("role", "content", "refusal"):
                if key in delta:
                    old = message.get(key)
                    message[key] = delta[key] if old is None or key == "role" else (
                        old + (delta[key] or ""))
            for frag in delta.get("tool_calls", []):
                call = calls.setdefault(frag["index"], {"function": {"arguments": ""}})
                for key in ("id", "type"):
                    if key in frag:
                        call[key] = frag[key]
                fn = frag.get("function", {})
                if "name" in fn:
                    call["function"]["name"] = fn["name"]
                call["function"]["arguments"] += fn.get("arguments") or ""
            finish = choice["finish_reason"] or finish
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message, finish, usage


def messages_reassembled(frames):
    """The Messages reply a client rebuilds from `frames` (usage from message_start, its
    counts then overwritten by message_delta's cumulative ones)."""
    message, partial = None, {}
    for event, data in frames:
        if event == "message_start":
            message = data["message"]
        elif event == "content_block_start":
            message["content"].append(dict(data["content_block"]))
        elif event == "content_block_delta":
            block, delta = message["content"][data["index"]], data["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            elif delta["type"] == "input_json_delta":
                partial[data["index"]] = partial.get(data["index"], "") + delta["partial_json"]
        elif event == "content_block_stop":
            if data["index"] in partial:
                message["content"][data["index"]]["input"] = json.loads(partial[data["index"]])
        elif event == "message_delta":
            message.update(data["delta"])
            message["usage"].update(data["usage"])
    return message


class Streams(StubServer):
    """Each route's stream, read frame by frame over HTTP."""

    def both(self, path, body, stream_keys):
        """The plain reply and the streamed frames of `body`, each served on an empty cache at
        the same time, then each served again a second later (a cache hit where the body
        allows one), with the ledger rows of both runs. Returns (plain, frames, plain hit,
        frames hit)."""
        self.request("POST", "/stub/reset", {})
        plain = self.plain(path, body)
        plain_hit = self.plain(path, body, START_MS + 1000)
        plain_rows = self.ledger()
        self.request("POST", "/stub/reset", {})
        frames = self.streamed(path, dict(body, **stream_keys))
        frames_hit = self.streamed(path, dict(body, **stream_keys), START_MS + 1000)
        self.assertEqual(self.ledger(), plain_rows, "a streamed request is accounted alike")
        return plain, frames, plain_hit, frames_hit

    def test_chat_stream_with_usage(self):
        for round_, answered in ((0, False), (1, False), (0, True)):
            body = chat_body(round_, answered)
            plain, frames, plain_hit, frames_hit = self.both(
                "/v1/chat/completions", body,
                {"stream": True, "stream_options": {"include_usage": True}})
            self.assertEqual(frames[-1], (None, "[DONE]"))
            chunks = [c for _, c in frames[:-1]]
            for c in chunks:
                self.assertEqual((c["id"], c["object"], c["created"], c["model"]),
                                 (plain["id"], "chat.completion.chunk", plain["created"],
                                  plain["model"]))
                self.assertIn("usage", c)
            self.assertTrue(all(c["usage"] is None for c in chunks[:-1]))
            self.assertEqual(chunks[-1]["choices"], [])
            self.assertEqual(chunks[-1]["usage"], plain["usage"])
            self.assertEqual(chunks[-2]["choices"][0]["finish_reason"],
                             plain["choices"][0]["finish_reason"])
            self.assertTrue(all(c["choices"][0]["finish_reason"] is None for c in chunks[:-2]))
            first = chunks[0]["choices"][0]["delta"]
            self.assertEqual(first["role"], "assistant")
            want = plain["choices"][0]["message"]
            self.assertEqual(first["content"], None if want["content"] is None else "")

            message, finish, usage = chat_reassembled(frames)
            self.assertEqual(message["content"], want["content"])
            self.assertEqual(message.get("tool_calls"), want.get("tool_calls"))
            self.assertEqual((finish, usage), (plain["choices"][0]["finish_reason"],
                                               plain["usage"]))
            self.assertEqual(chat_reassembled(frames_hit)[2], plain_hit["usage"])
            texts = [c["choices"][0]["delta"].get("content") for c in chunks[1:-2]]
            if want["content"]:
                self.assertGreater(len([t for t in texts if t]), 2, "text in several pieces")
        self.assertGreater(plain_hit["usage"]["prompt_tokens_details"]["cached_tokens"], 0)

    def test_chat_tool_calls_fragment_and_interleave(self):
        _, frames, _, _ = self.both("/v1/chat/completions", chat_body(1), {"stream": True})
        fragments = [f for _, c in frames[:-1] for f in c["choices"][0]["delta"].get(
            "tool_calls", [])]
        self.assertEqual([f["index"] for f in fragments[:4]], [0, 1, 0, 1])
        for index in (0, 1):
            mine = [f for f in fragments if f["index"] == index]
            self.assertEqual(set(mine[0]), {"index", "id", "type", "function"})
            self.assertEqual(mine[0]["type"], "function")
            self.assertEqual(mine[0]["function"]["arguments"], "")
            self.assertIn("name", mine[0]["function"])
            self.assertGreater(len(mine), 2, "arguments in several fragments")
            for later in mine[1:]:
                self.assertEqual(set(later), {"index", "function"})
                self.assertEqual(set(later["function"]), {"arguments"})
        # Without include_usage: no usage chunk, no usage key.
        chunks = [c for _, c in frames[:-1]]
        self.assertTrue(all("usage" not in c and c["choices"] for c in chunks))

    def test_responses_stream(self):
        for round_, answered in ((0, False), (1, False), (0, True)):
            plain, frames, plain_hit, frames_hit = self.both(
                "/v1/responses", responses_body(round_, answered), {"stream": True})
            self.assertEqual([d["sequence_number"] for _, d in frames], list(range(len(frames))))
            self.assertTrue(all(e == d["type"] for e, d in frames))
            names = [e for e, _ in frames]
            self.assertEqual(names[:2], ["response.created", "response.in_progress"])
            self.assertEqual(frames[0][1]["response"]["status"], "in_progress")
            self.assertEqual(frames[0][1]["response"]["output"], [])
            self.assertEqual(names[-1], "response.completed")
            self.assertEqual(frames[-1][1]["response"], plain)
            self.assertEqual(frames_hit[-1][1]["response"], plain_hit)
            expected = []
            for item in plain["output"]:
                if item["type"] == "message":
                    text = item["content"][0]["text"]
                    expected += (["response.output_item.added", "response.content_part.added"]
                                 + ["response.output_text.delta"] * len(text.split(" "))
                                 + ["response.output_text.done", "response.content_part.done",
                                    "response.output_item.done"])
                else:
                    n = -(-len(item["arguments"]) // 8)
                    expected += (["response.output_item.added"]
                                 + ["response.function_call_arguments.delta"] * n
                                 + ["response.function_call_arguments.done",
                                    "response.output_item.done"])
            self.assertEqual(names[2:-1], expected)
            # What a client rebuilds from the deltas is what the done events and the reply say.
            for i, item in enumerate(plain["output"]):
                mine = [d for _, d in frames if d.get("output_index") == i]
                self.assertEqual(mine[0]["item"]["status"], "in_progress")
                self.assertEqual(mine[-1]["item"], item)
                rebuilt = "".join(d["delta"] for d in mine if "delta" in d)
                if item["type"] == "message":
                    self.assertEqual(mine[0]["item"]["content"], [])
                    self.assertEqual(rebuilt, item["content"][0]["text"])
                else:
                    self.assertEqual(mine[0]["item"]["arguments"], "")
                    self.assertEqual(rebuilt, item["arguments"])
                    self.assertEqual(mine[-2]["arguments"], item["arguments"])

    def test_messages_stream(self):
        body = messages_body()
        plain, frames, plain_hit, frames_hit = self.both("/v1/messages", body, {"stream": True})
        self.assertEqual(plain_hit["usage"]["cache_read_input_tokens"],
                         plain["usage"]["cache_creation_input_tokens"])
        # The next round: the reply sent back with its tool results, a final answer and a new
        # question (thinking, redacted thinking, text and two parallel calls come back).
        follow = dict(body, messages=body["messages"] + [
            {"role": "assistant", "content": plain["content"]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": b["id"], "content": "ok"}
                for b in plain["content"] if b["type"] == "tool_use"]},
            {"role": "assistant", "content": "Done."},
            {"role": "user", "content": "Now the next one."}])
        plain2, frames2, plain2_hit, frames2_hit = self.both("/v1/messages", follow,
                                                              {"stream": True})
        self.assertIn("redacted_thinking", [b["type"] for b in plain2["content"]])
        done = dict(follow, messages=follow["messages"] + [
            {"role": "assistant", "content": plain2["content"]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": b["id"], "content": "ok"}
                for b in plain2["content"] if b["type"] == "tool_use"]}])
        plain3, frames3, plain3_hit, frames3_hit = self.both("/v1/messages", done,
                                                              {"stream": True})
        self.assertEqual(plain3["stop_reason"], "end_turn")
        for plain, frames in ((plain, frames), (plain_hit, frames_hit), (plain2, frames2),
                              (plain2_hit, frames2_hit), (plain3, frames3),
                              (plain3_hit, frames3_hit)):
            names = [e for e, _ in frames]
            self.assertTrue(all(e == d["type"] for e, d in frames))
            self.assertEqual(names[:3], ["message_start", "content_block_start", "ping"])
            self.assertEqual(names.count("ping"), 1)
            self.assertEqual(names[-2:], ["message_delta", "message_stop"])
            start = frames[0][1]["message"]
            self.assertEqual(start["content"], [])
            self.assertIsNone(start["stop_reason"])
            self.assertEqual(start["usage"], dict(plain["usage"], output_tokens=1))
            delta = frames[-2][1]
            self.assertEqual(delta["delta"], {"stop_reason": plain["stop_reason"],
                                              "stop_sequence": None})
            self.assertEqual(delta["usage"], {k: v for k, v in plain["usage"].items()
                                              if k != "cache_creation"})
            self.assertEqual(messages_reassembled(frames), plain)
            for event, data in frames:
                if event == "content_block_start" and data["content_block"]["type"] in (
                        "text", "thinking", "tool_use"):
                    block = data["content_block"]
                    self.assertIn(block.get("text", block.get("thinking", block.get("input"))),
                                  ("", {}))
                if event == "content_block_start" and data["content_block"]["type"] == \
                        "redacted_thinking":
                    self.assertEqual(data["content_block"], plain["content"][data["index"]])
            kinds = [d["delta"]["type"] for e, d in frames if e == "content_block_delta"]
            for block in plain["content"]:
                want = {"text": "text_delta", "thinking": "thinking_delta",
                        "tool_use": "input_json_delta"}.get(block["type"])
                if want is not None:
                    self.assertIn(want, kinds)
            if any(b["type"] == "thinking" for b in plain["content"]):
                self.assertIn("signature_delta", kinds)

    def test_each_frame_is_a_chunk_of_its_own(self):
        """The raw bytes: chunked framing, one SSE frame per chunk, the terminating chunk."""
        for path, body in (("/v1/chat/completions", chat_body(1, stream=True)),
                           ("/v1/responses", responses_body(1, stream=True)),
                           ("/v1/messages", messages_body(stream=True))):
            data = json.dumps(body).encode()
            with socket.create_connection(("127.0.0.1", self.port), timeout=10) as sock:
                sock.sendall(f"POST {path} HTTP/1.1\r\nHost: stub\r\nContent-Type: "
                             f"application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode()
                             + data)
                raw = b""
                while not raw.endswith(b"\r\n0\r\n\r\n"):
                    self.assertFalse(raw.startswith(b"HTTP/1.1 4"), raw)
                    got = sock.recv(65536)
                    self.assertTrue(got, "the stream ended before its terminating chunk")
                    raw += got
            head, rest = raw.split(b"\r\n\r\n", 1)
            self.assertIn(b"Content-Type: text/event-stream", head)
            chunks = []
            while True:
                size, rest = rest.split(b"\r\n", 1)
                if int(size, 16) == 0:
                    self.assertEqual(rest, b"\r\n")
                    break
                chunks.append(rest[:int(size, 16)])
                self.assertEqual(rest[int(size, 16):int(size, 16) + 2], b"\r\n")
                rest = rest[int(size, 16) + 2:]
            self.assertGreater(len(chunks), 5)
            for chunk in chunks:
                self.assertTrue(chunk.endswith(b"\n\n") and chunk.count(b"\n\n") == 1, chunk)

    def test_stream_keys_are_checked(self):
        def rule(path, body):
            status, _, data = self.post(path, body)
            self.assertEqual(status, 400, data)
            return json.loads(data)["error"]
        chat = "/v1/chat/completions"
        self.assertEqual(rule(chat, chat_body(stream="yes"))["code"], "chat.stream")
        self.assertEqual(rule(chat, chat_body(stream_options={"include_usage": True}))["code"],
                         "chat.stream")
        self.assertEqual(rule(chat, chat_body(stream=True, stream_options={
            "include_usage": True, "extra": 1}))["code"], "chat.stream")
        self.assertEqual(rule(chat, chat_body(stream=True, stream_options={
            "include_usage": "yes"}))["code"], "chat.stream")
        self.assertEqual(rule("/v1/responses", responses_body(stream=True, stream_options={
            "include_usage": True}))["code"], "responses.stream")
        self.assertIn("[messages.stream]", rule("/v1/messages", messages_body(
            stream=None))["message"])
        self.assertIn("[messages.metadata]", rule("/v1/messages", messages_body(
            metadata={"user_id": "u", "session": "s"}))["message"])
        # What the APIs take, a gateway forwards, and the stub accepts.
        self.plain(chat, chat_body(stream=False, prompt_cache_key="k", store=False, user="u",
                                   metadata={"a": "b"}))
        self.streamed(chat, chat_body(stream=True, stream_options={
            "include_usage": False, "include_obfuscation": False}))
        self.plain("/v1/responses", responses_body(stream=None, store=False,
                                                   previous_response_id="resp_1"))
        self.streamed("/v1/responses", responses_body(stream=True, stream_options={
            "include_obfuscation": True}))
        self.plain("/v1/messages", messages_body(stream=False, metadata={"user_id": "u"}))



@SDKS
class SdkStreams(StubServer):
    """The official SDKs rebuild each streamed reply to what the unstreamed call returns."""

    def openai(self, now=START_MS, **options):
        return openai.OpenAI(base_url=self.base + "/v1", api_key="sk-stub", timeout=10,
                             default_headers={"X-Stub-Now-Ms": str(now)},
                             **dict({"max_retries": 0}, **options))

    def anthropic(self, now=START_MS, **options):
        return anthropic.Anthropic(base_url=self.base, api_key="sk-ant-stub", timeout=10,
                                   default_headers={"X-Stub-Now-Ms": str(now)},
                                   **dict({"max_retries": 0}, **options))

    def test_openai_chat(self):
        for round_, answered in ((0, False), (1, False), (0, True)):
            body = chat_body(round_, answered)
            self.request("POST", "/stub/reset", {})
            plain = self.openai().chat.completions.create(**body)
            rows = self.ledger()
            self.request("POST", "/stub/reset", {})
            chunks = list(self.openai().chat.completions.create(
                **body, stream=True, stream_options={"include_usage": True}))
            self.assertEqual(self.ledger(), rows)
            self.assertEqual(chunks[-1].choices, [])
            self.assertEqual(chunks[-1].usage, plain.usage)
            self.request("POST", "/stub/reset", {})
            with self.openai().chat.completions.stream(
                    **body, stream_options={"include_usage": True}) as stream:
                for _ in stream:
                    pass
                final = stream.get_final_completion()
            want, got = plain.choices[0], final.choices[0]
            self.assertEqual(got.finish_reason, want.finish_reason)
            self.assertEqual(got.message.content, want.message.content)
            self.assertEqual([(c.id, c.type, c.function.name, c.function.arguments)
                              for c in got.message.tool_calls or []],
                             [(c.id, c.type, c.function.name, c.function.arguments)
                              for c in want.message.tool_calls or []])
            self.assertEqual((final.id, final.model, final.usage),
                             (plain.id, plain.model, plain.usage))
            if round_ == 1:
                self.assertEqual(len(got.message.tool_calls), 2)
                self.assertTrue(got.message.content)

    def test_openai_responses(self):
        for round_, answered in ((0, False), (1, False), (0, True)):
            body = responses_body(round_, answered)
            self.request("POST", "/stub/reset", {})
            plain = self.openai().responses.create(**body)
            self.request("POST", "/stub/reset", {})
            events = list(self.openai().responses.create(**body, stream=True))
            self.assertEqual(events[-1].type, "response.completed")
            self.assertEqual(events[-1].response.model_dump(), plain.model_dump())
            self.request("POST", "/stub/reset", {})
            with self.openai().responses.stream(**body) as stream:
                deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
                final = stream.get_final_response()
            self.assertEqual(final.output_text, plain.output_text)
            self.assertEqual("".join(deltas), plain.output_text)
            self.assertEqual([(i.type, getattr(i, "call_id", None), getattr(i, "arguments", None))
                              for i in final.output],
                             [(i.type, getattr(i, "call_id", None), getattr(i, "arguments", None))
                              for i in plain.output])
            self.assertEqual(final.usage, plain.usage)

    def test_anthropic_messages(self):
        body = messages_body()
        bodies, kinds = [], set()
        for _ in range(3):
            bodies.append(body)
            self.request("POST", "/stub/reset", {})
            plain = self.anthropic().messages.create(**body)
            rows = self.ledger()
            self.request("POST", "/stub/reset", {})
            with self.anthropic().messages.stream(**body) as stream:
                texts = list(stream.text_stream)
                final = stream.get_final_message()
            self.assertEqual(self.ledger(), rows)
            self.assertEqual([b.model_dump() for b in final.content],
                             [b.model_dump() for b in plain.content])
            self.assertEqual("".join(texts), "".join(b.text for b in plain.content
                                                     if b.type == "text"))
            self.assertEqual((final.id, final.stop_reason, final.stop_sequence),
                             (plain.id, plain.stop_reason, plain.stop_sequence))
            self.assertEqual(final.usage.model_dump(), plain.usage.model_dump())
            self.assertGreater(final.usage.cache_creation_input_tokens, 0)
            self.assertEqual(final.usage.output_tokens, 12)
            kinds.update(b.type for b in final.content)
            # The raw events, as `create(stream=True)` yields them.
            events = list(self.anthropic().messages.create(**body, stream=True))
            self.assertEqual(events[0].type, "message_start")
            self.assertEqual(events[0].message.usage.output_tokens, 1)
            self.assertEqual(events[-2].usage.output_tokens, 12)
            turn = [{"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                                      for b in plain.content]}]
            calls = [b.id for b in plain.content if b.type == "tool_use"]
            if not calls:
                break
            turn.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": c, "content": "ok"} for c in calls]})
            if len(bodies) == 1:  # a second round of calls: redacted thinking, text, two calls
                turn += [{"role": "assistant", "content": "Done."},
                         {"role": "user", "content": "Now the next one."}]
            body = dict(body, messages=body["messages"] + turn)
        self.assertEqual(len(bodies), 3)
        self.assertEqual(plain.stop_reason, "end_turn")
        self.assertEqual(kinds, {"thinking", "redacted_thinking", "text", "tool_use"})



GARBAGE = b"<html>stub invalid-sse garbage, not an event stream</html>\n"
GEMINI_BODY = {"contents": [{"role": "user", "parts": [{"text": "Hello."}]}]}
BEDROCK_BODY = {"messages": [{"role": "user", "content": [{"text": "Hello."}]}]}
ROUTES = {  # name -> (path, a valid body)
    "chat": ("/v1/chat/completions", chat_body(stream=True)),
    "responses": ("/v1/responses", responses_body(stream=True)),
    "messages": ("/v1/messages", messages_body(stream=True)),
    "gemini": ("/v1beta/models/gemini-2.5-flash:generateContent", GEMINI_BODY),
    "bedrock": ("/model/anthropic.claude-sonnet-4-5-20250929-v1%3A0/converse", BEDROCK_BODY),
}


def raw_exchange(port, path, body, fault, timeout=10):
    """Sends one POST with `x-stub-fault` on a bare socket; returns everything received until
    the stub closed the connection (or a reset, recorded as the exception)."""
    data = json.dumps(body).encode()
    got, error = b"", None
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: stub\r\nContent-Type: application/json\r\n"
                     f"x-stub-fault: {fault}\r\nContent-Length: {len(data)}\r\n\r\n".encode()
                     + data)
        try:
            while True:
                more = sock.recv(65536)
                if not more:
                    break
                got += more
        except ConnectionResetError as e:
            error = e
    return got, error


def dechunk(raw):
    """(head, [chunk bytes], finished): a chunked reply split, `finished` when its
    terminating chunk came."""
    head, rest = raw.split(b"\r\n\r\n", 1)
    chunks = []
    while rest:
        size, rest = rest.split(b"\r\n", 1)
        n = int(size, 16)
        if n == 0:
            return head, chunks, rest == b"\r\n"
        chunks.append(rest[:n])
        rest = rest[n + 2:]
    return head, chunks, False


class Faults(StubServer):
    """Each `x-stub-fault`, over HTTP."""

    def test_status_500_and_429_in_each_providers_shape(self):
        for name, (path, body) in ROUTES.items():
            for fault in ("status-500", "status-429"):
                status, headers, data = self.post(path, body, headers=[("x-stub-fault", fault)])
                self.assertEqual(status, int(fault[-3:]), (name, data))
                error = json.loads(data)
                self.assertEqual(headers.get("retry-after"), "1" if fault == "status-429" else None)
                if name in ("chat", "responses"):
                    self.assertEqual(error["error"]["type"], {"status-500": "server_error",
                                                              "status-429": "requests"}[fault])
                elif name == "messages":
                    self.assertEqual(error["type"], "error")
                    self.assertEqual(error["error"]["type"], {"status-500": "api_error",
                                                              "status-429": "rate_limit_error"}[fault])
                elif name == "gemini":
                    self.assertEqual(error["error"]["status"], {"status-500": "INTERNAL",
                                                                "status-429": "RESOURCE_EXHAUSTED"}[fault])
                else:
                    self.assertEqual(headers["x-amzn-errortype"], {
                        "status-500": "InternalServerException",
                        "status-429": "ThrottlingException"}[fault])
        # Neither checked nor served: an invalid body gets the fault, the ledger stays empty.
        status, _, _ = self.post("/v1/messages", {"nonsense": True},
                                 headers=[("x-stub-fault", "status-500")])
        self.assertEqual(status, 500)
        self.assertEqual(self.ledger(), [])
        self.assertEqual(len(self.captured()), 2 * len(ROUTES) + 1)

    def test_tool_loop_calls_a_tool_even_when_answered(self):
        answered = chat_body(answered=True)
        status, _, data = self.post("/v1/chat/completions", answered)
        self.assertEqual(json.loads(data)["choices"][0]["finish_reason"], "stop")
        status, _, data = self.post("/v1/chat/completions", answered,
                                    headers=[("x-stub-fault", "tool-loop")])
        self.assertEqual(status, 200, data)
        calls = json.loads(data)["choices"][0]["message"]["tool_calls"]
        self.assertEqual([c["function"]["name"] for c in calls], ["list_dir"])
        body = messages_body()
        body["messages"] += [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_x",
                                               "name": "read_file", "input": {"path": "."}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x",
                                          "content": "ok"}]}]
        status, _, data = self.post("/v1/messages", body, headers=[("x-stub-fault", "tool-loop")])
        self.assertEqual(status, 200, data)
        reply = json.loads(data)
        self.assertEqual(reply["stop_reason"], "tool_use")
        self.assertEqual([b["name"] for b in reply["content"] if b["type"] == "tool_use"],
                         ["list_dir"])

    def test_unknown_fault_is_refused(self):
        status, _, data = self.post("/v1/chat/completions", chat_body(),
                                    headers=[("x-stub-fault", "explode")])
        self.assertEqual(status, 400)
        self.assertEqual(json.loads(data)["error"]["code"], "stub.fault")

    def test_hang_sends_nothing_until_the_client_leaves(self):
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=1.5)
        data = json.dumps(chat_body()).encode()
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: stub\r\nx-stub-fault: hang\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
        started = time.monotonic()
        with self.assertRaises(socket.timeout):
            sock.recv(1)
        self.assertGreaterEqual(time.monotonic() - started, 1.4)
        sock.close()
        self.assertEqual(self.ledger(), [])
        self.assertEqual(self.plain("/v1/chat/completions", chat_body())["object"],
                         "chat.completion")

    def test_reset_closes_without_a_byte(self):
        for path, body in (ROUTES["chat"], ROUTES["messages"], ROUTES["gemini"]):
            got, error = raw_exchange(self.port, path, body, "reset")
            self.assertEqual(got, b"")
            self.assertIsInstance(error, ConnectionResetError)
        self.assertEqual(self.ledger(), [])

    def test_midstream_error(self):
        for name in ("chat", "responses", "messages"):
            path, body = ROUTES[name]
            raw, error = raw_exchange(self.port, path, body, "midstream-error")
            self.assertIsNone(error)
            head, chunks, finished = dechunk(raw)
            self.assertTrue(head.startswith(b"HTTP/1.1 200 "), head)
            self.assertIn(b"Connection: close", head)
            frames = parse_sse(b"".join(chunks))
            if name == "messages":
                self.assertTrue(finished)
                self.assertEqual(len(frames), 5)
                self.assertEqual(frames[-1][0], "error")
                self.assertEqual(json.loads(frames[-1][1])["error"]["type"], "overloaded_error")
            else:
                self.assertFalse(finished, "the chunked body is left unfinished")
                self.assertEqual(len(frames), 4)
                self.assertNotIn("[DONE]", [d for _, d in frames])
                self.assertNotIn("response.completed", [e for e, _ in frames])
            # Reading it with http.client: the truncated chunked body is an error.
            if name != "messages":
                with self.assertRaises(http.client.IncompleteRead):
                    self.post(path, body, headers=[("x-stub-fault", "midstream-error")])
        self.assertEqual(len(self.ledger()), 5)  # each body was served (then cut)
        # A reply not streamed: half the body, short of its Content-Length.
        for name in ("chat", "gemini", "bedrock"):
            path, body = ROUTES[name]
            body = {k: v for k, v in body.items() if k != "stream"}
            with self.assertRaises(http.client.IncompleteRead):
                self.post(path, body, headers=[("x-stub-fault", "midstream-error")])

    def test_invalid_sse(self):
        for name in ("chat", "responses", "messages"):
            path, body = ROUTES[name]
            raw, error = raw_exchange(self.port, path, body, "invalid-sse")
            self.assertIsNone(error)
            head, chunks, finished = dechunk(raw)
            self.assertTrue(finished)
            self.assertEqual(len(chunks), 5)
            self.assertEqual(chunks[-1], GARBAGE)
            self.assertTrue(all(c.endswith(b"\n\n") for c in chunks[:4]))
        status, _, data = self.post("/v1/chat/completions", chat_body(),
                                    headers=[("x-stub-fault", "invalid-sse")])
        self.assertEqual((status, data), (200, GARBAGE))

    def test_slow(self):
        started = time.monotonic()
        frames = self.streamed("/v1/messages", messages_body(stream=True),
                               headers=[("x-stub-fault", "slow")])
        self.assertGreaterEqual(time.monotonic() - started, 2.0)
        self.assertEqual(frames[-1][0], "message_stop")
        self.assertEqual(len(self.ledger()), 1)

    def test_drip(self):
        plain = self.streamed("/v1/messages", messages_body(stream=True))
        started = time.monotonic()
        frames = self.streamed("/v1/messages", messages_body(stream=True),
                               headers=[("x-stub-fault", "drip")])
        # The same stream (its cache figures aside: the first wrote what this one reads).
        self.assertEqual([e for e, _ in frames], [e for e, _ in plain])
        self.assertGreaterEqual(time.monotonic() - started, 0.5 * (len(frames) - 1))



@SDKS
class SdkFaults(StubServer):
    """What the official SDKs make of each fault (what a gateway in front of the stub should
    give its own clients instead, or pass on)."""

    def openai(self, fault, **options):
        return openai.OpenAI(base_url=self.base + "/v1", api_key="sk-stub",
                             default_headers={"x-stub-fault": fault},
                             **dict({"max_retries": 0, "timeout": 10}, **options))

    def anthropic(self, fault, **options):
        return anthropic.Anthropic(base_url=self.base, api_key="sk-ant-stub",
                                   default_headers={"x-stub-fault": fault},
                                   **dict({"max_retries": 0, "timeout": 10}, **options))

    def test_status_errors(self):
        for fault, oa, an in (("status-500", openai.InternalServerError,
                               anthropic.InternalServerError),
                              ("status-429", openai.RateLimitError, anthropic.RateLimitError)):
            with self.assertRaises(oa):
                list(self.openai(fault).chat.completions.create(**chat_body(), stream=True))
            with self.assertRaises(oa):
                self.openai(fault).responses.create(**responses_body())
            with self.assertRaises(an) as raised:
                with self.anthropic(fault).messages.stream(**messages_body()) as stream:
                    stream.get_final_message()
            self.assertEqual(raised.exception.body["error"]["type"],
                             {"status-500": "api_error", "status-429": "rate_limit_error"}[fault])
        # The SDK retries a 429 after its retry-after, sending the same header again.
        self.request("POST", "/stub/reset", {})
        started = time.monotonic()
        with self.assertRaises(openai.RateLimitError):
            self.openai("status-429", max_retries=1).chat.completions.create(**chat_body())
        self.assertGreaterEqual(time.monotonic() - started, 0.9)
        sent = [dict((k.lower(), v) for k, v in r["headers"]) for r in self.captured()]
        self.assertEqual([h["x-stub-fault"] for h in sent], ["status-429"] * 2)
        self.assertEqual([h.get("x-stainless-retry-count") for h in sent], ["0", "1"])

    def test_hang_times_out(self):
        with self.assertRaises(openai.APITimeoutError):
            self.openai("hang", timeout=1).chat.completions.create(**chat_body())
        with self.assertRaises(anthropic.APITimeoutError):
            self.anthropic("hang", timeout=1).messages.create(**messages_body())

    def test_reset_is_a_connection_error(self):
        with self.assertRaises(openai.APIConnectionError):
            self.openai("reset").responses.create(**responses_body(), stream=True)
        with self.assertRaises(anthropic.APIConnectionError):
            self.anthropic("reset").messages.create(**messages_body())

    def test_midstream_error(self):
        seen = []
        with self.assertRaises(openai.APIConnectionError):
            for chunk in self.openai("midstream-error").chat.completions.create(
                    **chat_body(), stream=True):
                seen.append(chunk)
        self.assertEqual(len(seen), 4)
        with self.assertRaises(openai.APIConnectionError):
            with self.openai("midstream-error").responses.stream(**responses_body()) as stream:
                stream.get_final_response()
        with self.assertRaises(anthropic.APIStatusError) as raised:
            with self.anthropic("midstream-error").messages.stream(**messages_body()) as stream:
                stream.get_final_message()
        self.assertEqual(raised.exception.body["error"]["type"], "overloaded_error")

    def test_invalid_sse(self):
        # The garbage line is no SSE field, so these SDKs skip it and see a stream that ends
        # early: the Responses helper raises, the others return an unfinished reply.
        with self.assertRaises(RuntimeError):
            with self.openai("invalid-sse").responses.stream(**responses_body()) as stream:
                stream.get_final_response()
        chunks = list(self.openai("invalid-sse").chat.completions.create(
            **chat_body(), stream=True))
        self.assertEqual(len(chunks), 4)
        self.assertIsNone(chunks[-1].choices[0].finish_reason)
        with self.anthropic("invalid-sse").messages.stream(**messages_body()) as stream:
            self.assertIsNone(stream.get_final_message().stop_reason)
        with self.assertRaises(ValueError):  # not streamed: the body is not JSON
            self.anthropic("invalid-sse").messages.create(**messages_body())


if __name__ == "__main__":
    unittest.main()
