#!/usr/bin/env python3
"""Self-test of stub_provider.py's Gemini and Bedrock routes, driven through the real SDKs.

    cd tests/sdk_loops && .venv/bin/python -m unittest -v test_stub_gemini_bedrock

Starts the stub as a subprocess (stdin kept open, so it exits with this test) and talks to it
with the pinned google-genai and boto3 clients, where what matters is what those SDKs put on
the wire (google-genai re-encodes thought signatures URL-safe; boto3 base64-encodes the bytes it
is given), and over plain HTTP for rules the SDKs would stop before sending. Checks the rules
the stub enforces (by the rule names its 400s carry), the replies' shapes and the usage its
cache model reports, with scripted time (`X-Stub-Now-Ms`). Needs the venv install.sh builds.
"""

import base64
import json
import os
import subprocess
import sys
import tempfile
import unittest
import urllib.error
import urllib.parse
import urllib.request

import boto3
import botocore.exceptions
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

STUB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stub_provider.py")
START_MS = 10_000_000  # scripted "now", in ms
SECOND = 1000
MINUTE = 60 * SECOND
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(24))
PDF = b"%PDF-1.4\n%stub\n"
FLASH = "gemini-3-flash-preview"
PRO = "gemini-3-pro-preview"
SONNET = "anthropic.claude-sonnet-4-5-20250929-v1:0"
HAIKU = "us.anthropic.claude-haiku-4-5-20251001-v1:0"


def tokens(value):
    """What the stub charges for one block: its canonical JSON's length // 4."""
    return len(json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)) // 4


def text_of(n_tokens, seed="a"):
    """Filler text of about `n_tokens` tokens (4 characters each)."""
    unit = seed + " lorem ipsum dolor "
    return (unit * (n_tokens * 4 // len(unit) + 1))[: n_tokens * 4]


def rule_of(message):
    """The rule name a stub error message starts with: `[rule] where: detail`."""
    return message.split("[", 1)[1].split("]", 1)[0]


class StubServer(unittest.TestCase):
    """The stub on a free port, its request log, and plain-HTTP helpers."""

    @classmethod
    def setUpClass(cls):
        cls.log = tempfile.NamedTemporaryFile(prefix="stub-", suffix=".jsonl", delete=False).name
        cls.proc = subprocess.Popen([sys.executable, STUB, "--max-seconds", "300", "--log",
                                     cls.log], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        cls.base = f"http://127.0.0.1:{int(cls.proc.stdout.readline())}"

    @classmethod
    def tearDownClass(cls):
        cls.proc.stdin.close()
        cls.proc.wait(timeout=10)
        cls.proc.stdout.close()
        os.unlink(cls.log)

    def setUp(self):
        self.post("/stub/reset", {})
        self.now = START_MS
        self.logged = len(self.read_log())

    def read_log(self):
        with open(self.log, encoding="utf-8") as f:
            return [json.loads(line) for line in f]

    def post(self, path, body, now=None):
        """(status, JSON reply, headers) of a plain POST."""
        req = urllib.request.Request(self.base + path, data=json.dumps(body).encode(),
                                     method="POST")
        req.add_header("Content-Type", "application/json")
        if now is not None:
            req.add_header("X-Stub-Now-Ms", str(now))
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read()), resp.headers
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read()), e.headers

    def ledger(self):
        with urllib.request.urlopen(self.base + "/stub/ledger", timeout=10) as resp:
            return json.loads(resp.read())["requests"]

    def sent(self):
        """The bodies the stub received in this test, parsed, from its log."""
        return [json.loads(row["body"]) for row in self.read_log()[self.logged:]
                if row["path"] != "/stub/reset"]


# --- Gemini ------------------------------------------------------------------------------------

READ_FILE = types.FunctionDeclaration(
    name="read_file", description="Reads a file.",
    parameters_json_schema={"type": "object", "properties": {"path": {"type": "string"}},
                            "required": ["path"]})
BASH = types.FunctionDeclaration(
    name="bash", description="Runs a command.",
    parameters=types.Schema(type="OBJECT", properties={"cmd": types.Schema(type="STRING"),
                                                       "timeout": types.Schema(type="INTEGER")},
                            required=["cmd", "timeout"]))


class Gemini(StubServer):
    def setUp(self):
        super().setUp()
        # Kept for the test: a client collected mid-call closes its connection pool.
        self.genai = genai.Client(api_key="stub", http_options={"base_url": self.base})
        self.addCleanup(self.genai.close)

    def config(self, system="Be brief.", tools=(READ_FILE, BASH), now=None, **kw):
        headers = {} if now is None else {"X-Stub-Now-Ms": str(now)}
        return types.GenerateContentConfig(
            system_instruction=system,
            tools=[types.Tool(function_declarations=list(tools))] if tools else None,
            http_options=types.HttpOptions(headers=headers), **kw)

    def generate(self, contents, model=FLASH, **kw):
        return self.genai.models.generate_content(model=model, contents=contents,
                                                  config=self.config(**kw))

    def refused(self, contents, model=FLASH, **kw):
        """The rule of the ClientError the SDK raises for the stub's 400."""
        with self.assertRaises(genai_errors.ClientError) as ctx:
            self.generate(contents, model=model, **kw)
        self.assertEqual(ctx.exception.code, 400)
        self.assertEqual(ctx.exception.status, "INVALID_ARGUMENT")
        return rule_of(ctx.exception.message)

    @staticmethod
    def user(text):
        return types.Content(role="user", parts=[types.Part(text=text)])

    @staticmethod
    def answers(content):
        """A user content answering every function call of a model content."""
        return types.Content(role="user", parts=[
            types.Part.from_function_response(name=p.function_call.name, response={"ok": True})
            for p in content.parts if p.function_call])

    def conversation(self, model=FLASH):
        """Prompt, a call (round 0), its answer: the history as the SDK would keep it."""
        contents = [self.user("Look around.")]
        reply = self.generate(contents, model=model)
        contents.append(reply.candidates[0].content)
        contents.append(self.answers(contents[-1]))
        return contents

    def test_tool_round_trip_sends_the_signature_back(self):
        contents = [self.user("Look around.")]
        first = self.generate(contents)
        content = first.candidates[0].content
        self.assertEqual(content.role, "model")
        self.assertEqual(first.candidates[0].finish_reason, types.FinishReason.STOP)
        self.assertEqual(first.model_version, FLASH)
        [part] = content.parts
        self.assertEqual(part.function_call.name, "bash")  # the first by name
        self.assertIsNone(part.function_call.id)  # as the Gemini Developer API
        self.assertEqual(part.function_call.args, {"cmd": "stub", "timeout": 1})
        self.assertTrue(part.thought_signature.startswith(b"\xfb\xff"))

        contents += [content, self.answers(content)]
        final = self.generate(contents)
        [text] = final.candidates[0].content.parts
        self.assertEqual(text.text, "Read the results of bash.")
        self.assertIsNotNone(text.thought_signature)

        # A new prompt: round 1 has a preamble and two parallel calls, the signature on the
        # first call only.
        contents += [final.candidates[0].content, self.user("And now?")]
        second = self.generate(contents)
        parts = second.candidates[0].content.parts
        self.assertEqual([p.text for p in parts[:1]], ["Let me look around first."])
        self.assertEqual([p.function_call.name for p in parts[1:]], ["bash", "read_file"])
        self.assertIsNone(parts[0].thought_signature)
        self.assertIsNotNone(parts[1].thought_signature)
        self.assertIsNone(parts[2].thought_signature)
        contents += [second.candidates[0].content, self.answers(second.candidates[0].content)]
        done = self.generate(contents)
        self.assertEqual(done.candidates[0].content.parts[0].text,
                         "Read the results of bash, read_file.")

        # On the wire: the stub sends standard base64 with padding; the SDK sends the same bytes
        # back URL-safe, so only a comparison of bytes matches them.
        status, raw, _ = self.post(f"/v1beta/models/{FLASH}:generateContent",
                                   {"contents": [{"role": "user", "parts": [{"text": "Hi."}]}],
                                    "tools": [{"functionDeclarations": [
                                        {"name": "look", "parametersJsonSchema": {
                                            "type": "object"}}]}]})
        self.assertEqual(status, 200)
        wire = raw["candidates"][0]["content"]["parts"][0]["thoughtSignature"]
        self.assertTrue(wire.startswith("+/") and wire.endswith("="), wire)
        bodies = self.sent()
        echoed = bodies[1]["contents"][1]["parts"][0]["thoughtSignature"]
        self.assertTrue(echoed.startswith("-_"), echoed)
        self.assertEqual(base64.urlsafe_b64decode(echoed), part.thought_signature)
        # The SDK's body: generation fields under generationConfig, the rest top-level.
        self.assertEqual(sorted(bodies[0]), ["contents", "generationConfig", "systemInstruction",
                                             "tools"])

    def test_stream_chunks_add_up_to_the_unstreamed_reply(self):
        """streamGenerateContent?alt=sse: GenerateContentResponse chunks, one part each, texts
        word by word with a part's signature on its last piece, calls whole, usageMetadata
        cumulative on every chunk (the last equals the unstreamed reply's), finishReason on the
        last chunk only; accounted like the unstreamed call."""
        contents = [self.user("Look around.")]
        whole = self.generate(contents, now=START_MS)
        self.post("/stub/reset", {})
        chunks = list(self.genai.models.generate_content_stream(
            model=FLASH, contents=contents, config=self.config(now=START_MS)))
        self.assertGreater(len(chunks), 0)
        counts = [c.usage_metadata.candidates_token_count for c in chunks]
        self.assertEqual(counts, sorted(counts))
        self.assertEqual(chunks[-1].usage_metadata, whole.usage_metadata)
        self.assertEqual([c.candidates[0].finish_reason for c in chunks[:-1]],
                         [None] * (len(chunks) - 1))
        self.assertEqual(chunks[-1].candidates[0].finish_reason, types.FinishReason.STOP)
        parts = [p for c in chunks for p in c.candidates[0].content.parts]
        self.assertEqual(parts, whole.candidates[0].content.parts)  # one call, whole
        self.assertEqual(self.ledger()[-1]["output_tokens"], whole.usage_metadata.candidates_token_count)

        # The final text streamed word by word, its signature on the last piece.
        contents += [whole.candidates[0].content, self.answers(whole.candidates[0].content)]
        final = self.generate(contents)
        chunks = list(self.genai.models.generate_content_stream(
            model=FLASH, contents=contents, config=self.config()))
        pieces = [c.candidates[0].content.parts[0] for c in chunks]
        self.assertGreater(len(pieces), 1)
        self.assertEqual("".join(p.text for p in pieces), final.candidates[0].content.parts[0].text)
        self.assertEqual([p.thought_signature is not None for p in pieces],
                         [False] * (len(pieces) - 1) + [True])

        # On the wire: `data:` frames ended by CRLF blank lines; without alt=sse one JSON array.
        path = f"/v1beta/models/{FLASH}:streamGenerateContent"
        body = {"contents": [{"role": "user", "parts": [{"text": "Hi."}]}]}
        req = urllib.request.Request(self.base + path + "?alt=sse",
                                     data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(req, timeout=10) as resp:
            self.assertEqual(resp.headers["Content-Type"], "text/event-stream")
            raw = resp.read()
        frames = raw.split(b"\r\n\r\n")
        self.assertEqual(frames[-1], b"")
        self.assertTrue(all(f.startswith(b"data: {") for f in frames[:-1]), raw[:200])
        status, array, _ = self.post(path, body)
        self.assertEqual(status, 200)
        self.assertEqual(array, [json.loads(f[len(b"data: "):]) for f in frames[:-1]])

    def test_signature_missing_in_the_current_turn_is_refused(self):
        contents = self.conversation()
        call = contents[1].parts[0].function_call
        stripped = [contents[0], types.Content(role="model", parts=[types.Part(
            function_call=call)]), contents[2]]
        self.assertEqual(self.refused(stripped), "gemini.thought_signature_missing")
        with self.assertRaises(genai_errors.ClientError) as ctx:
            self.generate(stripped)
        self.assertIn("contents[1].parts[0]: Function call `bash`", ctx.exception.message)
        self.assertIn("is missing a thought_signature", ctx.exception.message)
        # Before the current turn (an older prompt) a missing signature is not checked.
        older = stripped + [types.Content(role="model", parts=[types.Part(text="Done.")]),
                            self.user("Thanks, and now?")]
        self.assertEqual(self.generate(older).candidates[0].finish_reason, types.FinishReason.STOP)
        # Nor on models before Gemini 3.
        self.assertIsNotNone(self.generate(stripped, model="gemini-2.5-flash").candidates)

    def test_signature_of_another_model_or_unknown_is_refused(self):
        contents = self.conversation()
        self.assertEqual(self.refused(contents, model=PRO), "gemini.thought_signature_model")
        signature = contents[1].parts[0].thought_signature
        call = contents[1].parts[0].function_call

        def with_signature(value):
            return [contents[0], types.Content(role="model", parts=[types.Part(
                function_call=call, thought_signature=value)]), contents[2]]

        self.assertEqual(self.refused(with_signature(signature[:-1] + b"x")),
                         "gemini.thought_signature_invalid")
        # A client that keeps the signature as the text it received and hands the SDK that
        # text's bytes: the SDK encodes them once more.
        as_text = base64.b64encode(signature)
        self.assertEqual(self.refused(with_signature(as_text)), "gemini.thought_signature_invalid")
        self.assertIsNotNone(self.generate(with_signature(signature)).candidates)

    def test_dummy_signatures_accepted(self):
        call = types.FunctionCall(name="read_file", args={"path": "a"})
        for dummy in ("skip_thought_signature_validator", "context_engineering_is_the_way_to_go"):
            for value in (base64.urlsafe_b64decode(dummy), dummy.encode()):
                contents = [self.user("Read a."), types.Content(role="model", parts=[types.Part(
                    function_call=call, thought_signature=value)]), types.Content(
                    role="user", parts=[types.Part.from_function_response(
                        name="read_file", response={"text": "a"})])]
                reply = self.generate(contents, model=PRO)
                self.assertEqual(reply.candidates[0].content.parts[0].text,
                                 "Read the results of read_file.")
        # Sent as the REST docs show it: the string itself.
        body = {"contents": [
            {"role": "user", "parts": [{"text": "Read a."}]},
            {"role": "model", "parts": [{"functionCall": {"name": "read_file", "args": {}},
                                         "thoughtSignature": "skip_thought_signature_validator"}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "read_file",
                                                             "response": {}}}]}]}
        self.assertEqual(self.post(f"/v1beta/models/{PRO}:generateContent", body)[0], 200)

    def test_calls_and_responses_pair_up(self):
        contents = self.conversation()
        wrong = types.Content(role="user", parts=[types.Part.from_function_response(
            name="read_file", response={"ok": True})])
        self.assertEqual(self.refused(contents[:2] + [wrong]), "gemini.function_responses")
        self.assertEqual(self.refused(contents[:2]), "gemini.function_responses")
        self.assertEqual(self.refused(contents[:2] + [self.user("Never mind.")]),
                         "gemini.function_responses")
        # A call right after a model content.
        model_text = types.Content(role="model", parts=[types.Part(text="Hm.")])
        self.assertEqual(self.refused([contents[0], model_text] + contents[1:]),
                         "gemini.function_call_position")
        # Ids, when the calls carry them, come back on the responses.
        signature = contents[1].parts[0].thought_signature
        with_id = types.Content(role="model", parts=[types.Part(
            function_call=types.FunctionCall(name="bash", args={}, id="c1"),
            thought_signature=signature)])
        self.assertEqual(self.refused([contents[0], with_id, contents[2]]),
                         "gemini.function_responses")
        answered = types.Content(role="user", parts=[types.Part(
            function_response=types.FunctionResponse(name="bash", id="c1", response={}))])
        reply = self.generate([contents[0], with_id, answered])
        self.assertEqual(reply.candidates[0].content.parts[0].text,
                         "Read the results of bash (id c1).")

    def test_body_rules(self):
        path = f"/v1beta/models/{FLASH}:generateContent"
        user = {"role": "user", "parts": [{"text": "Hi."}]}

        def rule(body):
            status, reply, _ = self.post(path, body)
            self.assertEqual(status, 400, reply)
            self.assertEqual(reply["error"]["status"], "INVALID_ARGUMENT")
            return rule_of(reply["error"]["message"])

        fn = {"name": "look", "parametersJsonSchema": {"type": "object"}}
        cases = [
            ({"contents": []}, "gemini.contents"),
            ({"contents": [{"role": "system", "parts": [{"text": "x"}]}]}, "gemini.role"),
            ({"contents": [{"role": "user", "parts": []}]}, "gemini.parts"),
            ({"contents": [{"role": "user", "parts": [{"text": ""}]}]}, "gemini.empty_text"),
            ({"contents": [{"role": "user", "parts": [{"text": "a", "fileData": {
                "fileUri": "https://x.test/a"}}]}]}, "gemini.part"),
            ({"contents": [{"role": "user", "parts": [{"inlineData": {
                "mimeType": "image/png", "data": base64.b64encode(PDF).decode()}}]}]},
             "gemini.inline_data"),
            ({"contents": [{"role": "user", "parts": [{"fileData": {
                "fileUri": "gs://bucket/a.pdf"}}]}]}, "gemini.file_data"),
            ({"contents": [{"role": "user", "parts": [{"functionCall": {"name": "look"}}]}]},
             "gemini.function_call_role"),
            ({"contents": [user, {"role": "model", "parts": [{"functionResponse": {
                "name": "look", "response": {}}}]}]}, "gemini.function_response_role"),
            ({"contents": [user, {"role": "model", "parts": [{"functionCall": {
                "name": "look"}, "thoughtSignature": "skip_thought_signature_validator"}]},
                {"role": "user", "parts": [{"functionResponse": {"name": "look",
                                                                 "response": [1]}}]}]},
             "gemini.function_response"),
            ({"contents": [user], "tools": [{"googleSearch": {}}]}, "gemini.tools"),
            ({"contents": [user], "tools": [{"functionDeclarations": [
                dict(fn, name="9look")]}]}, "gemini.function_name"),
            ({"contents": [user], "tools": [{"functionDeclarations": [fn, fn]}]},
             "gemini.function_unique"),
            ({"contents": [user], "tools": [{"functionDeclarations": [
                dict(fn, parameters={"type": "OBJECT"})]}]}, "gemini.function_parameters"),
            ({"contents": [user], "tools": [{"functionDeclarations": [{"name": "look"}]}]},
             "gemini.function_parameters"),
            ({"contents": [user], "tools": [{"functionDeclarations": [fn]}], "toolConfig": {
                "functionCallingConfig": {"mode": "AUTO", "allowedFunctionNames": ["look"]}}},
             "gemini.tool_config"),
            ({"contents": [user], "tools": [{"functionDeclarations": [fn]}], "toolConfig": {
                "functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["see"]}}},
             "gemini.tool_config"),
            ({"contents": [user], "systemInstruction": {"parts": [{"inlineData": {
                "mimeType": "image/png", "data": base64.b64encode(PNG).decode()}}]}},
             "gemini.system_instruction"),
            ({"contents": [user], "generationConfig": {"maxTokens": 10}},
             "gemini.generation_config"),
            ({"contents": [user], "model": FLASH}, "gemini.param"),
        ]
        for body, expected in cases:
            with self.subTest(expected=expected, body=json.dumps(body)[:120]):
                self.assertEqual(rule(body), expected)
        # Proto names are taken as the JSON ones are (the SDK sends inlineData snake_case).
        ok = {"contents": [{"role": "user", "parts": [
            {"text": "See."}, {"inline_data": {"mime_type": "image/png",
                                               "data": base64.urlsafe_b64encode(PNG).decode()}}]}],
            "generation_config": {"thinking_config": {"thinking_budget": 0}}}
        self.assertEqual(self.post(path, ok)[0], 200)
        # Through the SDK, with the image as bytes, and on the SDK's default /v1/ path.
        image = types.Part.from_bytes(data=PNG, mime_type="image/png")
        reply = self.generate([types.Content(role="user", parts=[types.Part(text="See."), image])],
                              tools=())
        self.assertEqual(reply.candidates[0].content.parts[0].text,
                         "Nothing to call; here is my answer.")
        self.assertEqual(self.ledger()[-1]["path"], f"/v1/models/{FLASH}:generateContent")
        self.assertEqual(self.sent()[-1]["contents"][0]["parts"][1],
                         {"inlineData": {"data": base64.urlsafe_b64encode(PNG).decode(),
                                         "mime_type": "image/png"}})
        # ANY with allowedFunctionNames: only those are called.
        config = types.ToolConfig(function_calling_config=types.FunctionCallingConfig(
            mode="ANY", allowed_function_names=["read_file"]))
        reply = self.generate([self.user("Go.")], tool_config=config)
        self.assertEqual(reply.candidates[0].content.parts[0].function_call.name, "read_file")

    def test_implicit_cache_reads_a_repeated_long_prefix(self):
        system = text_of(3000)
        long_prompt = self.user(text_of(100, "b"))
        first = self.generate([long_prompt], system=system, now=self.now)
        usage = first.usage_metadata
        self.assertIsNone(usage.cached_content_token_count)
        self.assertEqual(usage.candidates_token_count, 12)
        self.assertEqual(usage.total_token_count, usage.prompt_token_count + 12)
        sent = self.sent()[-1]
        prefix = sum(tokens(d) for d in sent["tools"][0]["functionDeclarations"]) + tokens(
            sent["systemInstruction"])
        self.assertEqual(usage.prompt_token_count, prefix + tokens(sent["contents"][0]))

        # The conversation grows: the whole earlier request is the read.
        contents = [long_prompt, first.candidates[0].content, self.answers(
            first.candidates[0].content)]
        second = self.generate(contents, system=system, now=self.now + MINUTE)
        self.assertEqual(second.usage_metadata.cached_content_token_count,
                         usage.prompt_token_count)
        # A changed system instruction reads only the declarations' prefix, below the minimum:
        # nothing.
        other = self.generate(contents, system=text_of(3000, "c"), now=self.now + 2 * MINUTE)
        self.assertIsNone(other.usage_metadata.cached_content_token_count)
        # Five minutes of silence let it go; another model has its own cache.
        late = self.generate(contents, system=system, now=self.now + 8 * MINUTE)
        self.assertIsNone(late.usage_metadata.cached_content_token_count)
        self.assertIsNone(self.generate([long_prompt], model="gemini-3.1-flash-lite-preview",
                                        system=system, now=self.now + 8 * MINUTE)
                          .usage_metadata.cached_content_token_count)

        rows = self.ledger()
        self.assertEqual([r["read"] for r in rows],
                         [0, usage.prompt_token_count, 0, 0, 0])
        for r in rows:
            self.assertTrue(r["path"].endswith(":generateContent"), r)
            self.assertEqual((r["written_5m"], r["written_1h"]), (0, 0))
            self.assertEqual(r["uncached"], r["input_tokens"] - r["read"])
            self.assertIsNone(r["machine"])
        self.assertEqual(rows[0]["model"], FLASH)
        self.assertEqual(rows[0]["now_ms"], START_MS)

    def test_pro_models_need_4096_tokens(self):
        system = text_of(2500)
        for model, cached in ((PRO, False), (FLASH, True)):
            self.generate([self.user("Hi.")], model=model, system=system, now=self.now)
            again = self.generate([self.user("Hi."), types.Content(role="model", parts=[
                types.Part(text="Hello.")]), self.user("Bye.")], model=model, system=system,
                now=self.now + SECOND)
            self.assertEqual(again.usage_metadata.cached_content_token_count is not None,
                             cached, model)


# --- Bedrock -----------------------------------------------------------------------------------

READ_SPEC = {"toolSpec": {"name": "read_file", "description": "Reads a file.", "inputSchema": {
    "json": {"type": "object", "properties": {"path": {"type": "string"}},
             "required": ["path"]}}}}
BASH_SPEC = {"toolSpec": {"name": "bash", "description": "Runs a command.", "inputSchema": {
    "json": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}}}


class Bedrock(StubServer):
    def client(self):
        client = boto3.client("bedrock-runtime", region_name="us-east-1",
                              endpoint_url=self.base, aws_access_key_id="stub",
                              aws_secret_access_key="stub")

        def scripted_time(request, **_):
            request.headers["X-Stub-Now-Ms"] = str(self.now)

        client.meta.events.register("before-sign.bedrock-runtime.Converse", scripted_time)
        return client

    def converse(self, messages, model=SONNET, tools=(READ_SPEC, BASH_SPEC), **kw):
        if tools:
            kw["toolConfig"] = {"tools": list(tools)}
        reply = self.client().converse(modelId=model, messages=messages, **kw)
        self.assertEqual(reply["ResponseMetadata"]["HTTPStatusCode"], 200)
        return reply

    def refused(self, messages, **kw):
        """The rule of the ValidationException boto3 raises for the stub's 400."""
        with self.assertRaises(botocore.exceptions.ClientError) as ctx:
            self.converse(messages, **kw)
        error = ctx.exception.response["Error"]
        self.assertEqual(error["Code"], "ValidationException")
        self.assertEqual(type(ctx.exception).__name__, "ValidationException")
        return rule_of(error["Message"])

    @staticmethod
    def user(*blocks):
        return {"role": "user", "content": [{"text": b} if isinstance(b, str) else b
                                            for b in blocks]}

    @staticmethod
    def results(message):
        return {"role": "user", "content": [
            {"toolResult": {"toolUseId": b["toolUse"]["toolUseId"], "content": [{"text": "ok"}],
                            "status": "success"}} for b in message["content"] if "toolUse" in b]}

    def test_image_as_raw_bytes_accepted_as_base64_text_refused(self):
        image = {"image": {"format": "png", "source": {"bytes": PNG}}}
        reply = self.converse([self.user("What is this?", image)], tools=())
        self.assertEqual(reply["stopReason"], "end_turn")
        # boto3 sent the bytes base64-encoded once.
        wire = self.sent()[-1]["messages"][0]["content"][1]["image"]["source"]["bytes"]
        self.assertEqual(base64.b64decode(wire), PNG)
        as_text = {"image": {"format": "png", "source": {"bytes": base64.b64encode(PNG).decode()}}}
        self.assertEqual(self.refused([self.user("What is this?", as_text)], tools=()),
                         "bedrock.image_bytes")
        with self.assertRaises(botocore.exceptions.ClientError) as ctx:
            self.converse([self.user("What is this?", as_text)], tools=())
        self.assertIn("the bytes are not a png", ctx.exception.response["Error"]["Message"])
        self.assertIn("base64 TEXT", str(ctx.exception))
        jpeg_claimed = {"image": {"format": "jpeg", "source": {"bytes": PNG}}}
        self.assertEqual(self.refused([self.user("What?", jpeg_claimed)], tools=()),
                         "bedrock.image_bytes")
        # Documents: a pdf's bytes, and a name of the allowed characters.
        doc = {"document": {"format": "pdf", "name": "Report (v2) [draft]", "source": {
            "bytes": PDF}}}
        self.assertEqual(self.converse([self.user("Read.", doc)], tools=())["stopReason"],
                         "end_turn")
        for name in ("report.pdf", "two  spaces", "x" * 201):
            bad = {"document": dict(doc["document"], name=name)}
            self.assertEqual(self.refused([self.user("Read.", bad)], tools=()),
                             "bedrock.document_name", name)
        not_pdf = {"document": dict(doc["document"], source={"bytes": PNG})}
        self.assertEqual(self.refused([self.user("Read.", not_pdf)], tools=()),
                         "bedrock.document_bytes")

    def test_converse_stream_rebuilds_the_unstreamed_reply(self):
        """boto3 reads the stub's event-stream frames (it checks each frame's CRCs: a bad one
        raises), and the events add up to what converse answers for the same request."""
        messages = [self.user("Look around.")]
        whole = self.converse(messages)
        client = self.client()
        events = list(client.converse_stream(
            modelId=SONNET, messages=messages,
            toolConfig={"tools": [READ_SPEC, BASH_SPEC]})["stream"])
        kinds = [next(iter(e)) for e in events]
        self.assertEqual(kinds[0], "messageStart")
        self.assertEqual(kinds[-2:], ["messageStop", "metadata"])
        blocks = {}
        for e in events:
            if "contentBlockStart" in e:
                start = e["contentBlockStart"]
                blocks[start["contentBlockIndex"]] = {"toolUse": dict(
                    start["start"]["toolUse"], input="")}
            elif "contentBlockDelta" in e:
                d = e["contentBlockDelta"]
                delta, i = d["delta"], d["contentBlockIndex"]
                if "text" in delta:
                    blocks.setdefault(i, {"text": ""})["text"] += delta["text"]
                elif "toolUse" in delta:
                    blocks[i]["toolUse"]["input"] += delta["toolUse"]["input"]
                elif "reasoningContent" in delta:
                    r = blocks.setdefault(i, {"reasoningContent": {"reasoningText": {"text": ""}}})
                    text = r["reasoningContent"]["reasoningText"]
                    if "text" in delta["reasoningContent"]:
                        text["text"] += delta["reasoningContent"]["text"]
                    else:
                        text["signature"] = delta["reasoningContent"]["signature"]
        for block in blocks.values():
            if "toolUse" in block:
                block["toolUse"]["input"] = json.loads(block["toolUse"]["input"])
        self.assertEqual([blocks[i] for i in sorted(blocks)],
                         whole["output"]["message"]["content"])
        self.assertEqual(events[-2]["messageStop"]["stopReason"], whole["stopReason"])
        self.assertEqual(events[-1]["metadata"]["usage"]["outputTokens"],
                         whole["usage"]["outputTokens"])

    def test_converse_stream_frames_carry_correct_crcs(self):
        import struct
        import zlib
        body = json.dumps({"messages": [self.user("Look around.")]}).encode()
        request = urllib.request.Request(
            self.base + "/model/" + urllib.parse.quote(SONNET, safe="") + "/converse-stream",
            data=body, headers={"Content-Type": "application/json",
                                "X-Stub-Now-Ms": str(self.now)})
        with urllib.request.urlopen(request) as reply:
            self.assertEqual(reply.headers["Content-Type"], "application/vnd.amazon.eventstream")
            data = reply.read()
        at, frames = 0, 0
        while at < len(data):
            total, head = struct.unpack(">II", data[at:at + 8])
            self.assertEqual(struct.unpack(">I", data[at + 8:at + 12])[0],
                             zlib.crc32(data[at:at + 8]))
            self.assertEqual(struct.unpack(">I", data[at + total - 4:at + total])[0],
                             zlib.crc32(data[at:at + total - 4]))
            at, frames = at + total, frames + 1
        self.assertEqual(at, len(data))
        self.assertGreater(frames, 4)

    def test_tool_round_trip_with_reasoning_and_a_missing_result(self):
        messages = [self.user("Look around.")]
        first = self.converse(messages)
        self.assertEqual(first["stopReason"], "tool_use")
        content = first["output"]["message"]["content"]
        self.assertEqual(list(content[0]), ["reasoningContent"])
        self.assertEqual(sorted(content[0]["reasoningContent"]["reasoningText"]),
                         ["signature", "text"])
        use = content[1]["toolUse"]
        self.assertEqual(use["name"], "bash")
        self.assertEqual(use["input"], {"cmd": "stub"})
        self.assertTrue(use["toolUseId"].startswith("tooluse_"))
        self.assertEqual(first["metrics"], {"latencyMs": 1})

        messages.append(first["output"]["message"])
        self.assertEqual(self.refused(messages + [self.user("Well?")]), "bedrock.tool_results")
        self.assertEqual(self.refused(messages), "bedrock.tool_results")
        # The reasoning block goes back unchanged, or the turn is refused.
        dropped = {"role": "assistant", "content": content[1:]}
        self.assertEqual(self.refused(messages[:1] + [dropped, self.results(dropped)]),
                         "bedrock.reasoning")
        changed = {"role": "assistant", "content": [{"reasoningContent": {"reasoningText": {
            "text": "Something else.", "signature": content[0]["reasoningContent"]
            ["reasoningText"]["signature"]}}}] + content[1:]}
        self.assertEqual(self.refused(messages[:1] + [changed, self.results(changed)]),
                         "bedrock.reasoning")
        # Tool blocks need toolConfig.
        self.assertEqual(self.refused(messages + [self.results(messages[-1])], tools=()),
                         "bedrock.tool_config")

        messages.append(self.results(messages[-1]))
        final = self.converse(messages)
        self.assertEqual(final["stopReason"], "end_turn")
        self.assertEqual(final["output"]["message"]["content"],
                         [{"text": f"Read the results of {use['toolUseId']}."}])

        # Round 1: a preamble and two parallel calls, each answered.
        messages += [final["output"]["message"], self.user("And now?")]
        second = self.converse(messages)
        blocks = second["output"]["message"]["content"]
        self.assertEqual([next(iter(b)) for b in blocks],
                         ["reasoningContent", "text", "toolUse", "toolUse"])
        messages += [second["output"]["message"], self.results(second["output"]["message"])]
        self.assertEqual(self.converse(messages)["stopReason"], "end_turn")
        # A non-Anthropic model returns no reasoning.
        nova = self.converse([self.user("Look around.")], model="amazon.nova-pro-v1:0")
        self.assertEqual(list(nova["output"]["message"]["content"][0]), ["toolUse"])

    def test_block_rules(self):
        blank = self.user("   ")
        self.assertEqual(self.refused([blank]), "bedrock.blank_text")
        with self.assertRaises(botocore.exceptions.ClientError) as ctx:
            self.converse([self.user("Hi."), {"role": "assistant", "content": [{"text": "Yo."}]},
                           self.user("ok", {"text": " "})])
        self.assertIn("The text field in the ContentBlock object at messages.2.content.1 is "
                      "blank", str(ctx.exception))
        self.assertEqual(self.refused([{"role": "assistant", "content": [{"text": "Hi."}]}]),
                         "bedrock.roles")
        self.assertEqual(self.refused([self.user("Hi."), self.user("Again.")]), "bedrock.roles")
        self.assertEqual(self.refused([self.user("Hi.", {"toolUse": {
            "toolUseId": "t1", "name": "bash", "input": {}}})]), "bedrock.block_role")
        point = {"cachePoint": {"type": "default"}}
        self.assertEqual(self.refused([self.user(point, "Hi.")]),
                         "bedrock.cache_point_position")
        self.assertEqual(self.refused([self.user("Hi.")], tools=(point, READ_SPEC)),
                         "bedrock.cache_point_position")
        self.assertEqual(self.refused([self.user("Hi.")], tools=(READ_SPEC, READ_SPEC)),
                         "bedrock.tool_unique")
        with self.assertRaises(botocore.exceptions.ClientError) as ctx:
            self.client().converse(modelId=SONNET, messages=[self.user("Hi.")], toolConfig={
                "tools": [READ_SPEC], "toolChoice": {"tool": {"name": "bash"}}})
        self.assertEqual(rule_of(ctx.exception.response["Error"]["Message"]),
                         "bedrock.tool_choice")

    def test_too_many_cache_points_refused(self):
        point = {"cachePoint": {"type": "default"}}
        messages = [self.user("One.", point), {"role": "assistant", "content": [
            {"text": "Two."}, point]}, self.user("Three.", point)]
        # 3 in messages, 1 in system, 1 after the tools: 5.
        self.assertEqual(self.refused(messages, system=[{"text": "Sys."}, point],
                                      tools=(READ_SPEC, point)), "bedrock.cache_points")
        self.assertEqual(self.converse(messages, system=[{"text": "Sys."}, point])["stopReason"],
                         "tool_use")
        # botocore does not check enums: a TTL the API does not know reaches the stub.
        self.assertEqual(self.refused([self.user("Hi.", {"cachePoint": {
            "type": "default", "ttl": "2h"}})]), "bedrock.cache_point")

    def test_cache_reads_with_cache_points_and_none_without(self):
        point = {"cachePoint": {"type": "default"}}
        system = [{"text": text_of(3000)}, point]
        prefix = tokens(READ_SPEC) + tokens(BASH_SPEC) + tokens([{"text": text_of(3000)}])
        question = self.user("Hello there.")
        first = self.converse([question], system=system)["usage"]
        self.assertEqual(first["cacheReadInputTokens"], 0)
        self.assertEqual(first["cacheWriteInputTokens"], prefix)
        self.assertEqual(first["cacheDetails"], [{"ttl": "5m", "inputTokens": prefix}])
        self.assertEqual(first["inputTokens"], tokens(question))
        self.assertEqual(first["totalTokens"], prefix + tokens(question) + first["outputTokens"])

        self.now += MINUTE
        hit = self.converse([question], system=system)["usage"]
        self.assertEqual(hit["cacheReadInputTokens"], prefix)
        self.assertEqual(hit["cacheWriteInputTokens"], 0)
        self.assertNotIn("cacheDetails", hit)

        # Without cache points nothing is read or written, the same prefix notwithstanding.
        self.now += SECOND
        plain = self.converse([question], system=system[:1])["usage"]
        self.assertEqual((plain["cacheReadInputTokens"], plain["cacheWriteInputTokens"]), (0, 0))
        self.assertEqual(plain["inputTokens"], prefix + tokens(question))

        # 1 h on the message's point; 30 minutes later still there, the 5-minute one gone.
        marked = self.user("Hello there.", {"cachePoint": {"type": "default", "ttl": "1h"}})
        self.now += SECOND
        long_ = self.converse([marked], system=system)["usage"]
        self.assertEqual(long_["cacheReadInputTokens"], prefix)
        self.assertEqual(long_["cacheDetails"], [{"ttl": "1h", "inputTokens": tokens(question)}])
        self.now += 30 * MINUTE
        later = self.converse([marked], system=system)["usage"]
        self.assertEqual(later["cacheReadInputTokens"], prefix + tokens(question))
        self.assertEqual(later["cacheWriteInputTokens"], 0)

        # The minimum goes by the model: haiku 4.5 needs 4096 tokens.
        self.now += SECOND
        small = self.converse([question], model=HAIKU, system=system)["usage"]
        self.assertEqual(small["cacheWriteInputTokens"], 0)

        rows = self.ledger()
        self.assertEqual([(r["read"], r["written_5m"], r["written_1h"]) for r in rows],
                         [(0, prefix, 0), (prefix, 0, 0), (0, 0, 0),
                          (prefix, 0, tokens(question)), (prefix + tokens(question), 0, 0),
                          (0, 0, 0)])
        self.assertEqual(rows[0]["model"], SONNET)
        self.assertEqual(rows[0]["path"], "/model/anthropic.claude-sonnet-4-5-20250929-v1%3A0"
                                          "/converse")
        self.assertEqual(rows[0]["now_ms"], START_MS)


if __name__ == "__main__":
    unittest.main()
