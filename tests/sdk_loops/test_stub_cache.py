#!/usr/bin/env python3
"""Self-test of stub_provider.py's prompt-cache model, over HTTP with scripted time.

    python3 -m unittest tests/sdk_loops/test_stub_cache.py -v

Starts the stub as a subprocess (stdin kept open, so it exits with this test), drives it with
bodies its own strict checks accept and `X-Stub-Now-Ms` headers, and checks the usage it reports
and its /stub/ledger. Standard library only.
"""

import json
import os
import subprocess
import sys
import unittest
import urllib.error
import urllib.request

STUB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stub_provider.py")
START_MS = 10_000_000  # scripted "now", in ms
SECOND = 1000
MINUTE = 60 * SECOND


def tokens(value):
    """What the stub charges for one block: its canonical JSON's length // 4."""
    return len(json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)) // 4


def text_of(n_tokens, seed="a"):
    """Filler text of about `n_tokens` tokens (4 characters each)."""
    unit = seed + " lorem ipsum dolor "
    return (unit * (n_tokens * 4 // len(unit) + 1))[: n_tokens * 4]


class StubCache(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.proc = subprocess.Popen([sys.executable, STUB, "--max-seconds", "300"],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        cls.base = f"http://127.0.0.1:{int(cls.proc.stdout.readline())}"

    @classmethod
    def tearDownClass(cls):
        cls.proc.stdin.close()
        cls.proc.wait(timeout=10)
        cls.proc.stdout.close()

    def setUp(self):
        self.assertEqual(self.call("POST", "/stub/reset", {}), {})

    def call(self, method, path, body=None, now=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if now is not None:
            req.add_header("X-Stub-Now-Ms", str(now))
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            self.fail(f"{method} {path}: {e.code} {e.read().decode()}")

    def ledger(self):
        return self.call("GET", "/stub/ledger")["requests"]

    # --- Anthropic ---------------------------------------------------------------------------

    def messages(self, now, system, model="claude-sonnet-4-5", tools=None):
        body = {"model": model, "max_tokens": 64, "system": system,
                "messages": [{"role": "user", "content": "Hello there."}]}
        if tools is not None:
            body["tools"] = tools
        return self.call("POST", "/v1/messages", body, now)["usage"]

    @staticmethod
    def system(n_tokens, ttl=None, seed="a"):
        control = {"type": "ephemeral"} if ttl is None else {"type": "ephemeral", "ttl": ttl}
        return [{"type": "text", "text": text_of(n_tokens, seed), "cache_control": control}]

    def test_anthropic_5m_write_read_expire(self):
        system = self.system(5000)
        prefix = tokens([{"type": "text", "text": system[0]["text"]}])
        rest = tokens({"role": "user", "content": "Hello there."})
        self.assertGreaterEqual(prefix, 5000)

        first = self.messages(START_MS, system)
        self.assertEqual(first["cache_read_input_tokens"], 0)
        self.assertEqual(first["cache_creation_input_tokens"], prefix)
        self.assertEqual(first["cache_creation"], {"ephemeral_5m_input_tokens": prefix,
                                                   "ephemeral_1h_input_tokens": 0})
        self.assertEqual(first["input_tokens"], rest)
        self.assertEqual(first["output_tokens"], 12)

        hit = self.messages(START_MS + 60 * SECOND, system)
        self.assertEqual(hit["cache_read_input_tokens"], prefix)
        self.assertEqual(hit["cache_creation_input_tokens"], 0)
        self.assertEqual(hit["input_tokens"], rest)

        # The hit refreshed the entry: 301 s after it (361 s after the write) it has expired.
        late = self.messages(START_MS + 60 * SECOND + 301 * SECOND, system)
        self.assertEqual(late["cache_read_input_tokens"], 0)
        self.assertEqual(late["cache_creation_input_tokens"], prefix)

        rows = self.ledger()
        self.assertEqual([(r["read"], r["written_5m"], r["written_1h"]) for r in rows],
                         [(0, prefix, 0), (prefix, 0, 0), (0, prefix, 0)])
        self.assertEqual([r["now_ms"] for r in rows], [START_MS, START_MS + 60_000, START_MS + 361_000])
        for r in rows:
            self.assertEqual(r["path"], "/v1/messages")
            self.assertEqual(r["input_tokens"], prefix + rest)
            self.assertEqual(r["uncached"], rest)
            self.assertIsNone(r["machine"])
            self.assertIsNone(r["prompt_cache_key"])

    def test_anthropic_1h_survives_30_minutes(self):
        system = self.system(5000, ttl="1h")
        prefix = tokens([{"type": "text", "text": system[0]["text"]}])
        first = self.messages(START_MS, system)
        self.assertEqual(first["cache_creation"], {"ephemeral_5m_input_tokens": 0,
                                                   "ephemeral_1h_input_tokens": prefix})
        later = self.messages(START_MS + 30 * MINUTE, system)
        self.assertEqual(later["cache_read_input_tokens"], prefix)
        self.assertEqual(later["cache_creation_input_tokens"], 0)
        # The same gap expires a 5-minute entry.
        short = self.system(5000, seed="b")
        self.messages(START_MS, short)
        self.assertEqual(self.messages(START_MS + 30 * MINUTE, short)["cache_read_input_tokens"], 0)

    def test_anthropic_below_minimum_writes_nothing(self):
        for model, n in (("claude-sonnet-4-5", 500), ("claude-haiku-4-5", 3000),
                         ("claude-3-5-haiku-latest", 1500)):
            system = self.system(n, seed=model)
            for now in (START_MS, START_MS + SECOND):
                usage = self.messages(now, system, model=model)
                self.assertEqual(usage["cache_read_input_tokens"], 0, model)
                self.assertEqual(usage["cache_creation_input_tokens"], 0, model)
                self.assertEqual(usage["input_tokens"],
                                 tokens([{"type": "text", "text": system[0]["text"]}])
                                 + tokens({"role": "user", "content": "Hello there."}), model)
        # Above the haiku-4-5 minimum it is written.
        usage = self.messages(START_MS, self.system(4500), model="claude-haiku-4-5")
        self.assertGreater(usage["cache_creation_input_tokens"], 4096)

    def test_anthropic_system_change_reads_back_to_tools(self):
        tools = [{"name": "look", "description": text_of(1500, "tool"),
                  "input_schema": {"type": "object", "properties": {}},
                  "cache_control": {"type": "ephemeral"}}]
        stripped = {k: v for k, v in tools[0].items() if k != "cache_control"}
        tool_tokens = tokens(stripped)
        system_a, system_b = self.system(2000, seed="a"), self.system(2000, seed="b")
        sys_a = tokens([{"type": "text", "text": system_a[0]["text"]}])
        sys_b = tokens([{"type": "text", "text": system_b[0]["text"]}])

        first = self.messages(START_MS, system_a, tools=tools)
        self.assertEqual(first["cache_read_input_tokens"], 0)
        self.assertEqual(first["cache_creation_input_tokens"], tool_tokens + sys_a)
        same = self.messages(START_MS + SECOND, system_a, tools=tools)
        self.assertEqual(same["cache_read_input_tokens"], tool_tokens + sys_a)
        changed = self.messages(START_MS + 2 * SECOND, system_b, tools=tools)
        self.assertEqual(changed["cache_read_input_tokens"], tool_tokens)
        self.assertEqual(changed["cache_creation_input_tokens"], sys_b)

    def test_anthropic_lookback_reads_a_breakpoint_moved_later(self):
        # A conversation that grew: the breakpoint moves to the newest turn; the entry written at
        # the earlier breakpoint is found within the lookback.
        marked = [{"role": "user", "content": [{"type": "text", "text": text_of(1200),
                                                 "cache_control": {"type": "ephemeral"}}]}]
        body = {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": marked}
        first = self.call("POST", "/v1/messages", body, START_MS)["usage"]
        written = first["cache_creation_input_tokens"]
        self.assertGreater(written, 1024)
        grown = {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": [
            {"role": "user", "content": [{"type": "text", "text": text_of(1200)}]},
            {"role": "assistant", "content": "Sure."},
            {"role": "user", "content": [{"type": "text", "text": "And then?",
                                          "cache_control": {"type": "ephemeral"}}]}]}
        usage = self.call("POST", "/v1/messages", grown, START_MS + SECOND)["usage"]
        self.assertEqual(usage["cache_read_input_tokens"], written)
        self.assertEqual(usage["cache_creation_input_tokens"],
                         tokens(grown["messages"][1]) + tokens(
                             {"role": "user", "content": [{"type": "text", "text": "And then?"}]}))

    def test_anthropic_a_read_through_a_longer_breakpoint_refreshes_the_shorter_entry(self):
        # The system's entry is written at 0; at 4 minutes a grown conversation reads the longer
        # entry, through the system's; at 7 minutes (3 after that read) another conversation on
        # the same system still reads it: the read refreshed every entry it went through.
        system = self.system(2000, seed="r")
        prefix = tokens([{"type": "text", "text": system[0]["text"]}])

        def turn(*texts):
            messages = []
            for i, text in enumerate(texts):
                role = "user" if i % 2 == 0 else "assistant"
                block = {"type": "text", "text": text}
                if i + 1 == len(texts):
                    block["cache_control"] = {"type": "ephemeral"}
                messages.append({"role": role, "content": [block]})
            return {"model": "claude-sonnet-4-5", "max_tokens": 64, "system": system,
                    "messages": messages}

        first = self.call("POST", "/v1/messages", turn(text_of(300)), START_MS)["usage"]
        self.assertEqual(first["cache_read_input_tokens"], 0)
        grown = self.call("POST", "/v1/messages", turn(text_of(300), "Sure.", "Go on."),
                          START_MS + 4 * MINUTE)["usage"]
        self.assertEqual(grown["cache_read_input_tokens"], first["cache_creation_input_tokens"])
        other = self.call("POST", "/v1/messages", turn(text_of(300, seed="z")),
                          START_MS + 7 * MINUTE)["usage"]
        self.assertEqual(other["cache_read_input_tokens"], prefix)

    # --- OpenAI --------------------------------------------------------------------------------

    def chat_body(self, n_tokens, key=None, seed="a", model="gpt-5", retention=None):
        body = {"model": model, "messages": [
            {"role": "system", "content": text_of(n_tokens, seed)},
            {"role": "user", "content": "Hello there."}]}
        if key is not None:
            body["prompt_cache_key"] = key
        if retention is not None:
            body["prompt_cache_retention"] = retention
        return body

    def chat(self, now, n_tokens, key=None, seed="a", model="gpt-5", retention="in_memory"):
        body = self.chat_body(n_tokens, key, seed, model, retention)
        return self.call("POST", "/v1/chat/completions", body, now)["usage"]

    def test_chat_extended_retention_keeps_a_prefix_for_24_hours(self):
        cached = lambda usage: usage["prompt_tokens_details"]["cached_tokens"]
        # gpt-4.1 offers both; not said, an organisation without ZDR gets 24h.
        self.assertEqual(cached(self.chat(START_MS, 2000, model="gpt-4.1", retention=None)), 0)
        later = self.chat(START_MS + 20 * MINUTE, 2000, model="gpt-4.1", retention=None)
        self.assertGreater(cached(later), 0)
        # A day and more of silence lets it go.
        gone = self.chat(START_MS + 20 * MINUTE + 25 * 60 * MINUTE, 2000, model="gpt-4.1",
                         retention=None)
        self.assertEqual(cached(gone), 0)
        # gpt-4o offers only in_memory: 20 minutes expire it, and 24h is refused.
        self.assertEqual(cached(self.chat(START_MS, 2000, model="gpt-4o", retention=None)), 0)
        late = self.chat(START_MS + 20 * MINUTE, 2000, model="gpt-4o", retention=None)
        self.assertEqual(cached(late), 0)
        rule = "param.prompt_cache_retention"
        self.assertEqual(self.refused("/v1/chat/completions",
                                      self.chat_body(2000, model="gpt-4o", retention="24h")), rule)
        # gpt-5.5 offers only 24h; and there is no third retention.
        for model, retention in (("gpt-5.5", "in_memory"), ("gpt-5", "1h")):
            body = {"model": model, "input": "Hi.", "prompt_cache_retention": retention}
            self.assertEqual(self.refused("/v1/responses", body), rule)
        ok = {"model": "gpt-5.5", "input": "Hi.", "prompt_cache_retention": "24h"}
        self.assertEqual(self.call("POST", "/v1/responses", ok, START_MS)["model"], "gpt-5.5")

    def test_chat_below_minimum_caches_nothing(self):
        for now in (START_MS, START_MS + SECOND, START_MS + 2 * SECOND):
            usage = self.chat(now, 700)
            self.assertLess(usage["prompt_tokens"], 1024)
            self.assertEqual(usage["prompt_tokens_details"], {"cached_tokens": 0})

    def test_chat_reads_in_128_token_steps(self):
        first = self.chat(START_MS, 2000)
        total = first["prompt_tokens"]
        self.assertGreater(total, 2000)
        self.assertEqual(first["prompt_tokens_details"]["cached_tokens"], 0)
        self.assertEqual(first["total_tokens"], total + first["completion_tokens"])
        second = self.chat(START_MS + 4 * MINUTE, 2000)
        cached = second["prompt_tokens_details"]["cached_tokens"]
        self.assertEqual(second["prompt_tokens"], total)
        self.assertGreater(cached, 0)
        self.assertEqual(cached % 128, 0)
        self.assertLessEqual(cached, total)
        self.assertGreater(cached, total - 128 - tokens({"role": "user", "content": "Hello there."}))
        # The hit refreshed it; 301 s of silence expires it.
        third = self.chat(START_MS + 4 * MINUTE + 301 * SECOND, 2000)
        self.assertEqual(third["prompt_tokens_details"]["cached_tokens"], 0)

    def test_chat_16th_request_a_minute_goes_to_a_new_machine(self):
        reads = [self.chat(START_MS + i * SECOND, 2000, key="alpha")["prompt_tokens_details"]
                 ["cached_tokens"] for i in range(16)]
        self.assertEqual(reads[0], 0)
        self.assertTrue(all(r > 0 for r in reads[1:15]), reads)
        self.assertEqual(reads[15], 0)
        # Another key is another route, with its own machines and load.
        beta = [self.chat(START_MS + (16 + i) * SECOND, 2000, key="beta")["prompt_tokens_details"]
                ["cached_tokens"] for i in range(2)]
        self.assertEqual(beta[0], 0)
        self.assertGreater(beta[1], 0)
        # A minute after the first requests, alpha's load has fallen back to machine 0.
        again = self.chat(START_MS + 75 * SECOND, 2000, key="alpha")
        self.assertGreater(again["prompt_tokens_details"]["cached_tokens"], 0)

        rows = self.ledger()
        self.assertEqual(len(rows), 19)
        self.assertEqual([r["machine"] for r in rows], [0] * 15 + [1] + [0, 0] + [0])
        self.assertEqual([r["prompt_cache_key"] for r in rows],
                         ["alpha"] * 16 + ["beta"] * 2 + ["alpha"])
        self.assertEqual([r["read"] for r in rows[:18]], reads + beta)
        for r in rows:
            self.assertEqual(r["path"], "/v1/chat/completions")
            self.assertEqual(r["model"], "gpt-5")
            self.assertEqual(r["written_5m"] + r["written_1h"], 0)
            self.assertEqual(r["uncached"], r["input_tokens"] - r["read"])
            self.assertEqual(r["output_tokens"], 12)
        self.assertEqual(set(rows[0]), {"path", "model", "now_ms", "input_tokens", "read",
                                        "written_5m", "written_1h", "uncached", "output_tokens",
                                        "prompt_cache_key", "machine"})

    def test_responses_usage(self):
        body = {"model": "gpt-5", "instructions": text_of(1500), "input": "Hello there."}
        first = self.call("POST", "/v1/responses", body, START_MS)["usage"]
        self.assertEqual(first["input_tokens"], tokens(body["instructions"]) + tokens("Hello there."))
        self.assertEqual(first["input_tokens_details"], {"cached_tokens": 0})
        self.assertEqual(first["output_tokens_details"], {"reasoning_tokens": 0})
        self.assertEqual(first["total_tokens"], first["input_tokens"] + first["output_tokens"])
        second = self.call("POST", "/v1/responses", body, START_MS + SECOND)["usage"]
        cached = second["input_tokens_details"]["cached_tokens"]
        self.assertGreater(cached, 1024)
        self.assertEqual(cached % 128, 0)
        # Chat's cache is another one.
        self.assertEqual(self.chat(START_MS + 2 * SECOND, 2000)["prompt_tokens_details"]
                         ["cached_tokens"], 0)

    # --- Deferred tools (tool search) ----------------------------------------------------------

    def refused(self, path, body):
        """The rule a refused body names, from the provider's error message."""
        data = json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method="POST")
        req.add_header("Content-Type", "application/json")
        try:
            urllib.request.urlopen(req, timeout=10)
        except urllib.error.HTTPError as e:
            self.assertEqual(e.code, 400)
            return json.loads(e.read())["error"]["message"].split("]")[0].lstrip("[")
        self.fail(f"{path} accepted {body}")

    def test_anthropic_deferred_tools_need_a_search_tool_and_stay_out_of_the_prefix(self):
        big = {"type": "object", "properties": {"q": {"type": "string", "description": text_of(300)}}}
        search = {"type": "tool_search_tool_regex_20251119", "name": "tool_search_tool_regex"}
        deferred = {"name": "lookup", "description": "Looks up.", "input_schema": big,
                    "defer_loading": True}
        plain = {"name": "read", "description": "Reads.", "input_schema": {"type": "object"}}
        base = {"model": "claude-sonnet-4-5", "max_tokens": 64,
                "messages": [{"role": "user", "content": "Hello there."}]}
        self.assertEqual(self.refused("/v1/messages", {**base, "tools": [plain, deferred]}),
                         "messages.defer_without_search")
        self.assertEqual(self.refused("/v1/messages", {**base, "tools": [
            plain, dict(search, defer_loading=True), deferred]}), "messages.tool_search")
        self.assertEqual(self.refused("/v1/messages", {**base, "tools": [
            plain, search, dict(deferred, cache_control={"type": "ephemeral"})]}),
            "messages.deferred_breakpoint")
        # A deferred tool costs nothing in the prompt, and its change breaks no prefix.
        system = self.system(3000)
        usage = self.messages(START_MS, system, tools=[plain, search, deferred])
        self.assertEqual(usage["cache_creation_input_tokens"],
                         tokens(plain) + tokens(search) + tokens([{"type": "text", "text": system[0]["text"]}]))
        changed = dict(deferred, description="Looks up, better.")
        again = self.messages(START_MS + SECOND, system, tools=[plain, search, changed])
        self.assertEqual(again["cache_read_input_tokens"], usage["cache_creation_input_tokens"])

    def test_responses_deferred_functions_in_a_namespace_need_tool_search(self):
        fn = {"type": "function", "name": "lookup", "description": "Looks up.",
              "parameters": {"type": "object", "properties": {}, "additionalProperties": False,
                             "required": []}, "strict": False, "defer_loading": True}
        space = {"type": "namespace", "name": "docs", "description": "Documentation tools.",
                 "tools": [fn]}
        base = {"model": "gpt-5.4", "input": "Hello there."}
        self.assertEqual(self.refused("/v1/responses", {**base, "tools": [space]}),
                         "responses.defer_without_search")
        self.assertEqual(self.refused("/v1/responses", {**base, "tools": [
            {"type": "tool_search"}, dict(space, defer_loading=True)]}), "responses.namespace")
        reply = self.call("POST", "/v1/responses",
                          {**base, "tools": [{"type": "tool_search"}, space]}, START_MS)
        self.assertEqual(reply["status"], "completed")

    # --- The ledger and the clock --------------------------------------------------------------

    def test_reset_and_clock(self):
        self.chat(None, 2000)  # no header: the monotonic clock
        self.assertGreater(self.chat(None, 2000)["prompt_tokens_details"]["cached_tokens"], 0)
        self.assertEqual(len(self.ledger()), 2)
        self.call("POST", "/stub/reset", {})
        self.assertEqual(self.ledger(), [])
        self.assertEqual(self.chat(None, 2000)["prompt_tokens_details"]["cached_tokens"], 0)


if __name__ == "__main__":
    unittest.main()
