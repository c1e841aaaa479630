#!/usr/bin/env python3
"""The agent loop through promptd's Python client package and an official SDK: `google-genai`
(format gemini) or `boto3` (format bedrock). Run with the client's test venv
(sdk/clients/python/.venv-test), which holds the promptd_client wheel and both SDKs.

    client_loop.py gemini|bedrock PROMPTD_URL STUB_URL AGENT [--steps N] [--media none|first]
                   [--switch-model CONFIG OLD NEW]

For each step: `session.step(messages=..., facts=..., format=F)`, the body to the SDK
(`client.models.generate_content(**step.body)`; `client.converse(**step.sdk_kwargs())`),
`session.record(response)` with the SDK's own object, the tool results by the ids
`record(...).tool_calls` names (Gemini's calls come without ids: the daemon names them). After
each step the body promptd returned is compared, byte for byte, with its rebuild from the log
(`GET …/steps/N/request?format=F`).

--switch-model: after step 1 (a tool call, whose results step 2 sends), the script rewrites
the daemon's config file CONFIG with model OLD replaced by NEW and waits until the daemon's
Gemini bodies ask for NEW: the model changes in the middle of a turn.

--media first: step 1's user message carries text, a PNG photo and a PDF (and, for Gemini, an
image by URL: Converse takes none), and the first result of every tool round a PNG screenshot.

Exits 1 with the error on any failure; on success prints one line of JSON: {"sdk", "format",
"agent", "session", "steps", "tool_calls", "tool_results", "rebuilt", "signatures",
"media"}; `signatures` are the thoughtSignature texts of the last Gemini body.
"""

import argparse
import json
import sys
import urllib.request

import agent_loop
from promptd_client import Client


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("format", choices=["gemini", "bedrock"])
    parser.add_argument("promptd")
    parser.add_argument("stub")
    parser.add_argument("agent")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--media", choices=["none", "first"], default="none")
    parser.add_argument("--switch-model", nargs=3, metavar=("CONFIG", "OLD", "NEW"))
    parser.set_defaults(toggle_read_only=False)
    return parser.parse_args()


def sdk_call(fmt, stub):
    """`call(step) -> (response, text)`: the official SDK's call for `fmt`."""
    if fmt == "gemini":
        from google import genai
        client = genai.Client(api_key="gemini-stub", http_options={"base_url": stub})

        def call(step):
            response = client.models.generate_content(**step.body)
            return response, response.text or ""
        return "google-genai", call
    import boto3
    client = boto3.client("bedrock-runtime", region_name="us-east-1", endpoint_url=stub,
                          aws_access_key_id="stub", aws_secret_access_key="stub")

    def call(step):
        response = client.converse(**step.sdk_kwargs())
        content = response["output"]["message"]["content"]
        return response, "".join(b.get("text", "") for b in content)
    return "boto3", call


def user_message(fmt, n, media):
    message = agent_loop.user_message(n, media)
    if fmt == "bedrock" and isinstance(message["content"], list):
        # Converse takes no image by URL (promptd refuses it in this format).
        message["content"] = [b for b in message["content"] if "url" not in b]
    return message


def switch_model(promptd, agent, config, old, new):
    """Rewrites `config` with model `old` replaced by `new`; returns once the daemon's steps
    ask for `new` (a probe session shows it)."""
    import time
    with open(config, encoding="utf-8") as f:
        text = f.read()
    with open(config, "w", encoding="utf-8") as f:
        f.write(text.replace(old, new))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        probe = promptd.session(agent, format="gemini").step(user="probe")
        if probe.body.get("model") == new:
            return
        time.sleep(0.1)
    raise agent_loop.Failed(f"the daemon did not take the config's model {new}")


def signatures(value):
    """Every thoughtSignature text in `value`, in order."""
    if isinstance(value, dict):
        found = [value["thoughtSignature"]] if "thoughtSignature" in value else []
        return found + [s for v in value.values() for s in signatures(v)]
    if isinstance(value, list):
        return [s for v in value for s in signatures(v)]
    return []


def main():
    args = parse_args()
    sdk, call = sdk_call(args.format, args.stub)
    stats = {"sdk": sdk, "format": args.format, "agent": args.agent, "steps": 0,
             "tool_calls": 0, "tool_results": 0, "rebuilt": 0}
    try:
        with Client(args.promptd) as promptd:
            session = promptd.session(args.agent, format=args.format)
            stats["session"] = session.id
            pending = [user_message(args.format, 1, args.media)]
            for n in range(1, args.steps + 1):
                step = session.step(messages=pending,
                                    facts=agent_loop.facts(stats["tool_calls"] > 0, n, args))
                url = (f"{args.promptd}/v1/sessions/{session.id}/steps/{step.step}/request"
                       f"?format={args.format}")
                with urllib.request.urlopen(url, timeout=agent_loop.TIMEOUT_S) as r:
                    rebuilt = r.read().decode()
                if step.text is None or rebuilt != step.text:
                    raise agent_loop.Failed(f"step {n}: the rebuild from the log differs from "
                                            "the body the step returned")
                stats["rebuilt"] += 1
                try:
                    response, text = call(step)
                except Exception as e:  # the SDK's own error, as it is
                    raise agent_loop.Failed(f"step {n}: the {sdk} client refused or failed: "
                                            f"{type(e).__name__}: {e}") from None
                calls = session.record(response).tool_calls
                stats["steps"] = n
                if n == 1 and args.switch_model:
                    switch_model(promptd, args.agent, *args.switch_model)
                if calls:
                    stats["tool_calls"] += len(calls)
                    pending = [agent_loop.tool_result(c.id, c.name, k, args.media)
                               for k, c in enumerate(calls)]
                    stats["tool_results"] += len(calls)
                else:
                    pending = [user_message(args.format, n + 1, args.media)]
            stats["signatures"] = signatures(step.body)
            if args.media != "none":
                stats["media"] = agent_loop.MEDIA
    except agent_loop.Failed as e:
        print(f"{sdk} loop through promptd_client, agent {args.agent}: {e}", file=sys.stderr)
        sys.exit(1)
    print(json.dumps(stats))


if __name__ == "__main__":
    main()
