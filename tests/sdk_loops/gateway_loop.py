#!/usr/bin/env python3
"""An agent loop on an official SDK whose only change is its base URL: promptd's gateway.

    gateway_loop.py SDK BASE_URL [--stream] [--turns N] [--header NAME=VALUE ...]

SDK is `openai-chat`, `openai-responses`, `anthropic` or `gemini` (google-genai, its
`http_options.base_url` the gateway's; `--gemini-api-version` picks the path's version, the
SDK's default `v1` else) or `bedrock` (boto3's bedrock-runtime, its `endpoint_url` the gateway's,
`converse` or `converse_stream`; `--bedrock-model` the modelId). The loop is what an agent written
against the SDK does, with nothing of promptd in it: it keeps its own history, offers one tool
(`read_file`), answers each tool call with a result, and after each final answer sends the next
user message, for N user turns. Streamed (--stream), it folds the stream as an SDK user does
(text and tool-call fragments by index; Responses' `response.completed`; the anthropic
client's own stream helper; Gemini's chunks, each one's parts appended to the model content). --header adds a header to every request (e.g.
`x-promptd-fact-cwd=/repo`).

Prints one line of JSON: {"requests", "turns", "texts": [final text of each turn],
"calls": [tool call ids], "usage": [the usage each reply reported]}; exits 1 with the SDK's
error on any failure.
"""

import argparse
import json
import sys

TIMEOUT_S = 60
TOOL_SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}},
    "required": ["path"],
}


def args_of():
    p = argparse.ArgumentParser()
    p.add_argument("sdk", choices=["openai-chat", "openai-responses", "anthropic", "gemini",
                                        "bedrock"])
    p.add_argument("base")
    p.add_argument("--stream", action="store_true")
    p.add_argument("--turns", type=int, default=2)
    p.add_argument("--header", action="append", default=[])
    p.add_argument("--gemini-api-version")
    p.add_argument("--bedrock-model", default="amazon.nova-lite-v1:0")
    return p.parse_args()


def headers_of(args):
    out = {}
    for h in args.header:
        name, _, value = h.partition("=")
        out[name] = value
    return out


def dump(obj):
    return obj.model_dump(exclude_none=True) if hasattr(obj, "model_dump") else obj


class Log:
    def __init__(self):
        self.requests = 0
        self.texts = []
        self.calls = []
        self.usage = []


def chat(args, log):
    from openai import OpenAI

    client = OpenAI(base_url=args.base + "/v1", api_key="sk-client-key-chat",
                    max_retries=0, timeout=TIMEOUT_S, default_headers=headers_of(args))
    tools = [{"type": "function", "function": {"name": "read_file",
                                                "description": "Read a file.",
                                                "parameters": TOOL_SCHEMA}}]
    messages = [{"role": "system", "content": "You are the client's own agent."}]
    for turn in range(1, args.turns + 1):
        messages.append({"role": "user", "content": f"Turn {turn}: read a file, then answer."})
        while True:
            log.requests += 1
            body = dict(model="gpt-4.1", messages=messages, tools=tools)
            if args.stream:
                text, calls, usage = "", {}, None
                for chunk in client.chat.completions.create(stream=True, **body):
                    if chunk.usage is not None:
                        usage = dump(chunk.usage)
                    for choice in chunk.choices:
                        d = choice.delta
                        text += d.content or ""
                        for frag in d.tool_calls or []:
                            c = calls.setdefault(frag.index, {"id": None, "name": "", "args": ""})
                            if frag.id:
                                c["id"] = frag.id
                            if frag.function and frag.function.name:
                                c["name"] = frag.function.name
                            if frag.function and frag.function.arguments:
                                c["args"] += frag.function.arguments
                calls = [calls[i] for i in sorted(calls)]
            else:
                reply = client.chat.completions.create(**body)
                m = reply.choices[0].message
                text, usage = m.content or "", dump(reply.usage)
                calls = [{"id": c.id, "name": c.function.name, "args": c.function.arguments}
                         for c in m.tool_calls or []]
            log.usage.append(usage)
            assistant = {"role": "assistant", "content": text or None}
            if calls:
                assistant["tool_calls"] = [
                    {"id": c["id"], "type": "function",
                     "function": {"name": c["name"], "arguments": c["args"]}} for c in calls]
            messages.append(assistant)
            if not calls:
                log.texts.append(text)
                break
            for c in calls:
                log.calls.append(c["id"])
                messages.append({"role": "tool", "tool_call_id": c["id"],
                                 "content": f"contents of {c['id']}"})


def responses(args, log):
    from openai import OpenAI

    client = OpenAI(base_url=args.base + "/v1", api_key="sk-client-key-resp",
                    max_retries=0, timeout=TIMEOUT_S, default_headers=headers_of(args))
    tools = [{"type": "function", "name": "read_file", "description": "Read a file.",
              "parameters": TOOL_SCHEMA, "strict": False}]
    items = []
    for turn in range(1, args.turns + 1):
        items.append({"role": "user", "content": f"Turn {turn}: read a file, then answer."})
        while True:
            log.requests += 1
            body = dict(model="gpt-4.1", instructions="You are the client's own agent.",
                        input=items, tools=tools)
            if args.stream:
                response = None
                for event in client.responses.create(stream=True, **body):
                    if event.type == "response.completed":
                        response = event.response
                if response is None:
                    raise RuntimeError("the stream had no response.completed")
            else:
                response = client.responses.create(**body)
            log.usage.append(dump(response.usage))
            calls = [o for o in response.output if o.type == "function_call"]
            for o in response.output:
                if o.type in ("message", "function_call"):
                    items.append(dump(o))
            if not calls:
                log.texts.append(response.output_text)
                break
            for c in calls:
                log.calls.append(c.call_id)
                items.append({"type": "function_call_output", "call_id": c.call_id,
                              "output": f"contents of {c.call_id}"})


def anthropic(args, log):
    from anthropic import Anthropic

    client = Anthropic(base_url=args.base, api_key="sk-ant-client-key",
                       max_retries=0, timeout=TIMEOUT_S, default_headers=headers_of(args))
    tools = [{"name": "read_file", "description": "Read a file.", "input_schema": TOOL_SCHEMA}]
    system = [{"type": "text", "text": "You are the client's own agent.",
               "cache_control": {"type": "ephemeral"}}]
    messages = []
    for turn in range(1, args.turns + 1):
        messages.append({"role": "user", "content": f"Turn {turn}: read a file, then answer."})
        while True:
            log.requests += 1
            body = dict(model="claude-sonnet-4-5", max_tokens=1024, system=system,
                        messages=messages, tools=tools)
            if args.stream:
                with client.messages.stream(**body) as stream:
                    message = stream.get_final_message()
            else:
                message = client.messages.create(**body)
            log.usage.append(dump(message.usage))
            messages.append({"role": "assistant",
                             "content": [dump(b) for b in message.content]})
            calls = [b for b in message.content if b.type == "tool_use"]
            if not calls:
                log.texts.append("".join(b.text for b in message.content if b.type == "text"))
                break
            results = []
            for c in calls:
                log.calls.append(c.id)
                results.append({"type": "tool_result", "tool_use_id": c.id,
                                "content": f"contents of {c.id}"})
            messages.append({"role": "user", "content": results})


def gemini(args, log):
    from google import genai
    from google.genai import types

    options = dict(base_url=args.base, headers=headers_of(args), timeout=TIMEOUT_S * 1000)
    if args.gemini_api_version:
        options["api_version"] = args.gemini_api_version
    client = genai.Client(api_key="client-key-gemini", http_options=types.HttpOptions(**options))
    config = types.GenerateContentConfig(
        system_instruction="You are the client's own agent.",
        tools=[types.Tool(function_declarations=[types.FunctionDeclaration(
            name="read_file", description="Read a file.", parameters_json_schema=TOOL_SCHEMA)])])
    model = "gemini-3-flash-preview"  # the stub checks Gemini 3's thought signatures
    contents = []
    for turn in range(1, args.turns + 1):
        contents.append(types.Content(role="user", parts=[
            types.Part(text=f"Turn {turn}: read a file, then answer.")]))
        while True:
            log.requests += 1
            if args.stream:
                parts, usage = [], None
                for chunk in client.models.generate_content_stream(
                        model=model, contents=contents, config=config):
                    if chunk.usage_metadata is not None:
                        usage = dump(chunk.usage_metadata)
                    for candidate in chunk.candidates or []:
                        if candidate.content and candidate.content.parts:
                            parts.extend(candidate.content.parts)
                content = types.Content(role="model", parts=parts)
            else:
                reply = client.models.generate_content(model=model, contents=contents,
                                                       config=config)
                content, usage = reply.candidates[0].content, dump(reply.usage_metadata)
            log.usage.append(usage)
            contents.append(content)
            calls = [p.function_call for p in content.parts if p.function_call]
            if not calls:
                log.texts.append("".join(p.text or "" for p in content.parts if not p.thought))
                break
            for c in calls:
                log.calls.append(c.name)
            contents.append(types.Content(role="user", parts=[
                types.Part.from_function_response(name=c.name,
                                                  response={"output": f"contents of {c.name}"})
                for c in calls]))


def bedrock(args, log):
    import boto3
    from botocore.config import Config

    # The client signs with its own credentials; the gateway never forwards that signature.
    client = boto3.client(
        "bedrock-runtime", endpoint_url=args.base, region_name="us-east-1",
        aws_access_key_id="AKIDCLIENTEXAMPLE", aws_secret_access_key="client-secret-example",
        config=Config(retries={"max_attempts": 1}, read_timeout=TIMEOUT_S,
                      connect_timeout=TIMEOUT_S))
    extra = headers_of(args)

    def add_headers(request, **_):
        for name, value in extra.items():
            request.headers[name] = value

    client.meta.events.register("before-sign.bedrock-runtime.*", add_headers)
    model = args.bedrock_model
    system = [{"text": "You are the client's own agent."}]
    tools = {"tools": [{"toolSpec": {"name": "read_file", "description": "Read a file.",
                                     "inputSchema": {"json": TOOL_SCHEMA}}}]}
    messages = []
    for turn in range(1, args.turns + 1):
        messages.append({"role": "user", "content": [
            {"text": f"Turn {turn}: read a file, then answer."}]})
        while True:
            log.requests += 1
            body = dict(modelId=model, messages=messages, system=system, toolConfig=tools)
            if args.stream:
                blocks, inputs, usage = {}, {}, None
                for event in client.converse_stream(**body)["stream"]:
                    if "contentBlockStart" in event:
                        e = event["contentBlockStart"]
                        use = e["start"]["toolUse"]
                        blocks[e["contentBlockIndex"]] = {"toolUse": dict(use)}
                        inputs[e["contentBlockIndex"]] = ""
                    elif "contentBlockDelta" in event:
                        e = event["contentBlockDelta"]
                        i, delta = e["contentBlockIndex"], e["delta"]
                        if "text" in delta:
                            block = blocks.setdefault(i, {"text": ""})
                            block["text"] += delta["text"]
                        elif "toolUse" in delta:
                            inputs[i] += delta["toolUse"]["input"]
                    elif "metadata" in event:
                        usage = event["metadata"]["usage"]
                for i, text in inputs.items():
                    blocks[i]["toolUse"]["input"] = json.loads(text or "{}")
                content = [blocks[i] for i in sorted(blocks)]
            else:
                reply = client.converse(**body)
                content, usage = reply["output"]["message"]["content"], reply["usage"]
            log.usage.append(usage)
            messages.append({"role": "assistant", "content": content})
            uses = [b["toolUse"] for b in content if "toolUse" in b]
            if not uses:
                log.texts.append("".join(b.get("text", "") for b in content))
                break
            for u in uses:
                log.calls.append(u["toolUseId"])
            messages.append({"role": "user", "content": [
                {"toolResult": {"toolUseId": u["toolUseId"],
                                "content": [{"text": f"contents of {u['name']}"}]}}
                for u in uses]})


def main():
    args = args_of()
    log = Log()
    try:
        {"openai-chat": chat, "openai-responses": responses, "anthropic": anthropic,
         "gemini": gemini, "bedrock": bedrock}[args.sdk](args, log)
    except Exception as e:  # the SDK's typed error, printed for the test to show
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
    print(json.dumps({"requests": log.requests, "turns": len(log.texts), "texts": log.texts,
                      "calls": log.calls, "usage": log.usage}))


if __name__ == "__main__":
    main()
