#!/usr/bin/env python3
"""A local stand-in for the OpenAI, Anthropic, Gemini and Bedrock APIs, strict about bodies.

    stub_provider.py [--max-seconds N] [--log FILE] [--ignore-stdin]

Serves on 127.0.0.1, on a port the system picks, and prints that port alone on its first
stdout line. It exits when its stdin closes (so it never outlives the test that started it)
or after --max-seconds (120), whichever comes first; --ignore-stdin keeps only the bound, for
runs by hand from a shell that gives background jobs no stdin.

Routes, each checking the body against the provider's documented rules (../shared/GUIDE.md,
"Provider rules that bodies must respect", and the request types of the pinned SDKs):

    POST /v1/chat/completions                     OpenAI Chat Completions
    POST /v1/responses                            OpenAI Responses
    POST /v1/messages                             Anthropic Messages
    POST /v1/messages/count_tokens                Anthropic token count ({"input_tokens": N}; no cache)
    POST /v1beta/models/{model}:generateContent   Google Gemini (also /v1/..., which
                                                  google-genai 3.6.1 calls by default)
    POST /v1beta/models/{model}:streamGenerateContent?alt=sse
                                                  Gemini streamed (without alt=sse: one
                                                  JSON array of the same chunks)
    POST /model/{modelId}/converse-stream         Bedrock streamed: AWS event-stream frames
                                                  (CRC32s by zlib.crc32), see stream_bedrock
    POST /model/{modelId}/converse                Amazon Bedrock Converse (modelId
                                                  URL-encoded; SigV4 not checked)

A body that breaks a rule gets 400 with the provider's error shape (Gemini's
`{"error": {"code": 400, "message", "status": "INVALID_ARGUMENT"}}`; Bedrock's `{"message"}`
with `x-amzn-ErrorType: ValidationException`); the message starts with the rule's name in
brackets and says where, e.g. `[chat.tool_results_follow_calls] messages[3]: ...`, so the SDK
raises with it and the test that drove the SDK fails showing it. A valid body gets a canned,
deterministic reply in the provider's real response shape: a tool call (to the first tool by
name that `tool_choice` allows; every second round two in parallel, after some text) while the
conversation's newest turn holds no tool result, final text naming the answered call ids (for
Gemini, whose calls carry no id, the function names) once it does. Anthropic tool-use replies
start with a `thinking` block (and every second round also a
`redacted_thinking` block); the stub keeps what it returned, by tool_use id, and a body that
sends such a block back changed, or drops it from the turn that is still waiting on its tool
results, is refused.

Streaming (Chat Completions, Responses, Messages): a body with `"stream": true` gets 200
`Content-Type: text/event-stream`, chunked (over HTTP/1.0 unchunked, ended by the close), each
frame in a chunk of its own sent at once: the reply the same body gets unstreamed, split as the
provider streams it, and accounted in the caches and the ledger exactly like the unstreamed
call. Texts come word by word (each word with the whitespace before it), JSON arguments in
pieces of 8 characters. `stream` is a boolean (Chat and Responses also take null, as unset);
Chat's `stream_options` takes `include_usage` and `include_obfuscation` (booleans), only with
`stream` true; Responses' takes `include_obfuscation`; obfuscation is never sent. Messages'
`metadata` holds `user_id` alone (a string or null).
    Chat: `data: {chunk}` frames, `chat.completion.chunk`s with the reply's id, created and
    model: a role chunk (`content` "" before text, null for a reply of tool calls alone), the
    text, each tool call's first fragment `{index, id, type, function: {name, arguments: ""}}`
    and then `{index, function: {arguments}}` pieces, parallel calls interleaved by index (the
    first fragments of all, then the first pieces of all, ...); a chunk with `delta: {}` and the
    finish_reason; with `stream_options.include_usage` true a chunk with `choices: []` and the
    reply's usage, every earlier chunk then carrying `"usage": null`; `data: [DONE]`.
    Responses: `event: TYPE` and `data: {type, sequence_number (0, 1, ...), ...}` frames:
    response.created and response.in_progress (the response with status in_progress, output
    [], usage null); per output item response.output_item.added (status in_progress, a message
    without content, a function call with arguments ""), for a message's text
    response.content_part.added (text ""), response.output_text.delta pieces (logprobs []),
    response.output_text.done, response.content_part.done, for a function call
    response.function_call_arguments.delta pieces and .done, then response.output_item.done
    with the whole item; response.completed with the unstreamed reply, usage included.
    Messages: `event: TYPE` frames: message_start (the message with content [], stop_reason
    null, usage input_tokens, cache_creation_input_tokens, cache_read_input_tokens,
    cache_creation and output_tokens 1); per block content_block_start (text "", thinking "" and
    signature "", tool_use input {}, redacted_thinking whole), its content_block_deltas
    (text_delta; thinking_delta then one signature_delta; input_json_delta with partial_json
    pieces) and content_block_stop; one `ping` after the first content_block_start;
    message_delta with delta {stop_reason, stop_sequence} and the cumulative usage
    (input_tokens, cache_creation_input_tokens, cache_read_input_tokens as in message_start,
    output_tokens the final total); message_stop.
    Gemini (`:streamGenerateContent?alt=sse`, whatever the body says): `data: {chunk}` frames
    ended by a CRLF blank line (`\r\n\r\n`, as Google's servers send them), each chunk a
    GenerateContentResponse with one candidate (index 0) holding one part: texts word by word,
    a part's thoughtSignature on its last piece, each functionCall whole; every chunk carries
    `usageMetadata` with CUMULATIVE totals (promptTokenCount and cachedContentTokenCount as the
    unstreamed reply's, candidatesTokenCount growing to its final total on the last chunk),
    `modelVersion` and `responseId`; only the last chunk has `finishReason`. There is no end
    event: the stream ends with the reply.

Faults: a request header `x-stub-fault: NAME` (a test sets it on its client; a gateway passes it
on unchanged) makes a provider route misbehave as below; the request is captured (GET
/stub/requests) all the same. A name not listed gets a 400 `[stub.fault]` in the provider's
error shape. A faulted stream's headers carry `Connection: close`.
    status-500       500 with the provider's own error body (OpenAI `server_error`, Anthropic
                     `api_error`, Gemini INTERNAL, Bedrock InternalServerException); the body is
                     not checked, nothing cached, nothing in the ledger
    status-429       429 the same way (OpenAI `rate_limit_exceeded`, Anthropic
                     `rate_limit_error`, Gemini RESOURCE_EXHAUSTED, Bedrock ThrottlingException)
                     with `retry-after: 1`
    hang             no reply: not a byte is sent, the connection held until the client closes
                     it (or --max-seconds ends the stub); not checked, nothing cached
    reset            the connection closed at once by a TCP reset (SO_LINGER 0), no byte of
                     reply; not checked, nothing cached
    midstream-error  the body checked and accounted as usual, then a stream's first 4 frames;
                     Messages then sends `event: error` with {"type": "error", "error":
                     {"type": "overloaded_error", "message": ...}} and ends the stream properly
                     (the terminating chunk, then the close); Chat and Responses send nothing
                     more and close the connection with the chunked body unfinished (no
                     terminating chunk, no [DONE], no response.completed); Bedrock's
                     converse-stream sends half of a fifth frame first, so it ends inside a
                     frame. A reply not streamed
                     (and Gemini's, Bedrock's): its headers, half its body, the close, short of
                     the Content-Length announced
    invalid-sse      checked and accounted as usual; a stream's first 4 frames, then the line
                     `<html>stub invalid-sse garbage, not an event stream</html>` (no field,
                     no colon, not JSON), in a chunk of its own, then the terminating chunk and
                     the close; a reply not streamed: 200 application/json with that line as
                     its whole body
    slow             2 s of sleep before anything else (no status line meanwhile), then the
                     usual reply
    drip             checked and accounted as usual; a stream's frames each sent 0.5 s after
                     the one before (the first at once), so a test can act in the middle of a
                     stream (kill the gateway serving it); a reply not streamed is the usual reply
    tool-loop        checked and accounted as usual; Messages and Chat Completions then reply
                     with a call to the first tool by name that tool_choice allows, alone,
                     whatever the newest turn holds (a model that never stops calling: a loop
                     that runs its calls never ends)

Images and documents are checked as the APIs take them: Chat Completions `image_url` parts (an
https URL or a `data:image/(png|jpeg|gif|webp);base64,` URL) and `file` parts (a PDF data URL
with its filename) in user messages only, tool messages text only; Messages `image` and
`document` blocks (bare base64 of an allowed media type, or a URL), tool_result content of
text, image and document blocks; Responses `input_image` (with `detail` in a message) and
`input_file` (a data URL with its filename) parts, `function_call_output.output` a string or a
list of such parts. Base64 must decode, and to a file of the media type it claims (the APIs
sniff the bytes). `tool_choice` must name only tools the body's `tools` holds, in the API's own
shape (Chat's `allowed_tools` nests `{mode, tools}` under `allowed_tools`; Responses' is flat).

Gemini (`gemini.*`; a field is taken by its JSON or its proto snake_case name, as the API's
parser does, since google-genai sends nested messages such as inlineData snake_case): non-empty
`contents`, each of role user or model with non-empty `parts`; a part holds exactly one of text,
inlineData (base64 of a file of its mimeType), fileData (an https or `files/` URI),
functionCall (model contents only), functionResponse (user contents only, `response` an
object), beside `thought` and `thoughtSignature`; user text not empty. A model content with
calls comes right after a user content, and the next content is a user content whose
functionResponse parts answer exactly those calls (names in any order, ids when the calls carry
them). Tools are `{functionDeclarations}`: unique names matching
^[a-zA-Z_][a-zA-Z0-9_.:-]{0,127}$, each with `parameters` or `parametersJsonSchema`, not both;
`toolConfig.functionCallingConfig` mode AUTO, ANY, NONE or VALIDATED, `allowedFunctionNames`
(declared functions) only with ANY or VALIDATED; `systemInstruction` text parts;
`generationConfig` documented keys. Thought signatures on models `gemini-3*`: in the current
turn (from the last user content holding a part that is not a functionResponse) each model
content with calls carries a thoughtSignature on its first functionCall part; any signature
sent must decode (standard or URL-safe base64) to bytes the stub issued for this same model, or
to those of the documented dummies `skip_thought_signature_validator` and
`context_engineering_is_the_way_to_go` (the bytes the text decodes to, or its ASCII bytes as
SDK users pass it). Replies: function calls without `id` (as the Developer
API), the first carrying a signature; the final text part carries one too. Signatures are
standard base64 with padding of bytes starting 0xfb 0xff, so their URL-safe form (which the SDK
sends back) differs as text.

Bedrock (`bedrock.*`; botocore checks shapes, enums and required members before sending):
messages alternate from user, content non-empty, each block exactly one of text (not blank),
image, document, toolUse (assistant only), toolResult (user only), cachePoint, reasoningContent
(assistant only). Blobs are base64 on the wire, as boto3 encodes raw bytes: an image's
`source.bytes` must decode to a file of its format, so base64 text handed to boto3 (encoded
twice) is refused; the same for a document's (pdf, docx/xlsx, doc/xls by magic), whose `name`
is 1-200 letters, digits, hyphens, parentheses, brackets and single whitespace. The user
message after an assistant's toolUse blocks holds a toolResult for each toolUseId and no other
(status success or error; content text, image, document or json); toolUse or toolResult blocks
need `toolConfig`. toolConfig.tools: toolSpec (unique names, inputSchema.json an object) and
cachePoint entries; `toolChoice.tool` names a declared tool. cachePoint `{type: "default",
ttl?: "5m"|"1h"}`, never first in its list, at most 4 in system, tools and messages together.
Tool-use replies on `anthropic.` modelIds start with a reasoningContent block, kept by toolUseId
and checked on the way back like the Anthropic thinking blocks.

Usage reports a model of the providers' prompt caches. The cache reads a request as blocks in
the provider's order, every `cache_control` key removed: the model (0 tokens), each tool, then
Responses' `instructions` or Messages' `system` (one block), then each message or input item.
A block costs `len(canonical JSON) // 4` tokens; a prefix is identified by the hash chain of its
blocks' sha256. Time is the integer in a POST's `X-Stub-Now-Ms` header (milliseconds, scripted
by the test), else the monotonic clock. Gemini's blocks: the model, each function declaration,
`systemInstruction`, each content. Bedrock's: the model, each toolSpec, `system` (one block),
each message, cachePoints left out.

    Anthropic (/v1/messages, one cache): a tool, `system` or message holding a cache_control is
    a breakpoint (TTL 1 h with "ttl": "1h", else 5 min; the first 4 count). The read is the
    longest prefix, ending at a breakpoint or up to 20 blocks before one, with a live entry and
    at least the model's minimum (4096 tokens for opus-4-5/4-6/4-7 and haiku-4-5, 2048 for
    other haiku, 1024 else); a hit refreshes its TTL, and that of every live entry at a
    shorter prefix it read through. Each later breakpoint of at least the
    minimum is written, the tokens since the previous covered end counted at its TTL.
    `input_tokens` is what is neither read nor written; `cache_creation` splits the writes.
    OpenAI (Chat and Responses, one cache each): automatic. A request is routed by its first
    blocks reaching 256 tokens and its `prompt_cache_key`; each route's machine takes 15
    requests a minute, the next go to a new machine (with an empty cache). The read is the
    longest live prefix of at least 1024 tokens ending at a block boundary, rounded down to a
    multiple of 128; every such prefix of the request is written for 5 minutes (a hit's
    refreshed), or for 24 hours under extended retention: `prompt_cache_retention = "24h"`, or
    not said on a model that offers both (an organisation without Zero Data Retention), or a
    model that offers only 24h (gpt-5.5 and later). A retention the model does not offer is a
    400. `cached_tokens` reports the read; writes cost as plain input.
    Bedrock (Converse, one cache): explicit, as Anthropic's. A cachePoint makes the block before
    it (the tool before it, the system, its message) a breakpoint with its TTL (5 min, or 1 h
    with "ttl": "1h"); the read, writes, lookback and minimums (by the modelId's name, e.g.
    `us.anthropic.claude-haiku-4-5-...`) as above. No cachePoint: nothing read or written.
    Usage: `inputTokens` (neither read nor written), `cacheReadInputTokens`,
    `cacheWriteInputTokens`, `cacheDetails` (per TTL written), `totalTokens` (all of it).
    Gemini (generateContent, one cache): implicit. The read is the longest prefix, ending at a
    block boundary, of at least 1024 tokens (4096 on models whose name holds `pro`) that an
    earlier request to the same model wrote and that is still live; every such prefix of the
    request is written for 5 minutes (a hit's refreshed). `promptTokenCount` is all the input,
    `cachedContentTokenCount` the read (left out when 0); the ledger shows no writes.

    GET  /stub/ledger   {"requests": [...]}: per accepted request, in order (the last 100,000),
                        path, model, now_ms, input_tokens (all), read, written_5m, written_1h,
                        uncached, output_tokens, prompt_cache_key and (OpenAI) machine
    GET  /stub/requests {"requests": [{"method", "path", "headers": [[name, value], ...],
                        "body_b64"}, ...]}: the last 1,000 requests (every POST and GET but those
                        to /stub/), oldest first, as received: the request target with its query,
                        each header in the order sent with its name as spelt, the body bytes
                        in base64 (a chunked request body decoded)
    POST /stub/reset    empties the caches, the ledger and the captured requests

Standard library only.
"""

import argparse
import base64
import binascii
import collections
import hashlib
import json
import os
import re
import select
import socket
import struct
import sys
import threading
import time
import traceback
import urllib.parse
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
MAX_BREAKPOINTS = 4


class Broken(Exception):
    """A body breaks the provider rule `rule` at `where`."""

    def __init__(self, rule, where, detail):
        super().__init__(f"[{rule}] {where}: {detail}")
        self.rule = rule
        self.where = where


def canon(value):
    """Canonical JSON text, for hashing and for comparing JSON values exactly."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest(*parts):
    return hashlib.sha256(canon(parts).encode()).hexdigest()


def kind(value):
    """The JSON type name of a Python value, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def need(cond, rule, where, detail):
    if not cond:
        raise Broken(rule, where, detail)


def need_object(value, rule, where):
    need(isinstance(value, dict), rule, where, f"must be an object, got {kind(value)}")


def need_string(value, rule, where, nonempty=False):
    need(isinstance(value, str), rule, where, f"must be a string, got {kind(value)}")
    if nonempty:
        need(value != "", rule, where, "must not be empty")


def check_keys(obj, allowed, required, rule, where, nullable=()):
    """Refuses keys outside `allowed`, missing `required` keys, and null where not `nullable`
    (the providers reject extra inputs; a key typed without Optional takes no null)."""
    for key in required:
        need(key in obj, rule, where, f"missing required key `{key}`")
    for key, value in obj.items():
        need(key in allowed, rule, where, f"unknown key `{key}` (allowed: {', '.join(sorted(allowed))})")
        if value is None:
            need(key in nullable, rule, where, f"`{key}` must not be null")


def check_tool_name(name, where):
    need_string(name, "tool.name", where)
    need(TOOL_NAME.match(name) is not None, "tool.name", where,
         f"tool name {name!r} must match ^[a-zA-Z0-9_-]{{1,64}}$")


def check_schema(schema, where, strict, rule="tool.strict_schema"):
    """A tool's JSON Schema: an object schema; under strict mode every object schema in it must
    close its properties and require all of them (OpenAI's strict function calling)."""
    need_object(schema, "tool.schema", where)
    need(schema.get("type") == "object", "tool.schema", where,
         f"the schema's top level must be {{\"type\": \"object\"}}, got type {schema.get('type')!r}")
    if strict:
        check_strict(schema, where, rule)


STRICT_HOW = {
    "tool.strict_schema": "with \"strict\": true the API refuses a schema that",
    # OpenAI's function calling guide: when `strict` is omitted, Responses normalizes the schema
    # into strict mode (closing objects, marking every property required), so optional
    # parameters silently become mandatory; only an explicit `"strict": false` keeps them
    # optional. Accepted, but not the tool the plugin declared.
    "responses.strict_default": "`strict` is omitted, so Responses normalizes into strict mode "
                                "(send \"strict\": false to keep the schema as declared) a schema that",
}


def check_strict(schema, where, rule):
    if isinstance(schema, list):
        for i, item in enumerate(schema):
            check_strict(item, f"{where}[{i}]", rule)
        return
    if not isinstance(schema, dict):
        return
    if schema.get("type") == "object" or "properties" in schema:
        props = schema.get("properties", {})
        required = schema.get("required", [])
        need(schema.get("additionalProperties") is False, rule, where,
             f"{STRICT_HOW[rule]} lacks \"additionalProperties\": false")
        need(sorted(required) == sorted(props), rule, where,
             f"{STRICT_HOW[rule]} leaves properties {sorted(set(props) - set(required))} out "
             "of \"required\"")
    for key, value in schema.items():
        if isinstance(value, (dict, list)):
            check_strict(value, f"{where}.{key}", rule)


def tools_of(body):
    tools = body.get("tools", [])
    need(isinstance(tools, list), "param.tools", "tools", f"must be an array, got {kind(tools)}")
    return tools


def check_tools_unique(names, where):
    seen = set()
    for i, name in enumerate(names):
        need(name not in seen, "tool.unique", f"{where}[{i}]", f"tool name {name!r} is used twice")
        seen.add(name)


# --- Images and documents (shared by the three APIs) -------------------------------------------

IMAGE_TYPES = ("image/gif", "image/jpeg", "image/png", "image/webp")
PDF = "application/pdf"
DATA_URL = re.compile(r"^data:([a-z]+/[a-zA-Z0-9.+-]+);base64,(.*)$", re.S)
HTTPS_URL = re.compile(r"^https://[^\s/?#]+[^\s]*$")


def magic_ok(raw, media_type):
    """Whether the bytes are a file of `media_type` (the providers sniff the bytes and refuse an
    image that "does not match the provided media type")."""
    if media_type == "image/png":
        return raw.startswith(b"\x89PNG\r\n\x1a\n")
    if media_type == "image/jpeg":
        return raw.startswith(b"\xff\xd8\xff")
    if media_type == "image/gif":
        return raw.startswith((b"GIF87a", b"GIF89a"))
    if media_type == "image/webp":
        return raw[:4] == b"RIFF" and raw[8:12] == b"WEBP"
    if media_type == PDF:
        return raw.startswith(b"%PDF-")
    return True


def check_base64(data, media_type, rule, where):
    """Standard base64 (no data: prefix, no line breaks) of a file of `media_type`."""
    need_string(data, rule, where, nonempty=True)
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as e:
        raise Broken(rule, where, f"is not valid base64 ({e}): {data[:40]!r}") from None
    need(magic_ok(raw, media_type), rule, where,
         f"the decoded bytes are not a file of type {media_type} (they start {raw[:8]!r})")


def check_data_url(url, media_types, rule, where):
    """`data:TYPE;base64,DATA` with TYPE one of `media_types` (None: any) and valid DATA."""
    need_string(url, rule, where, nonempty=True)
    m = DATA_URL.match(url)
    need(m is not None, rule, where,
         f"must be a data URL `data:MEDIA_TYPE;base64,DATA`, got {url[:40]!r}")
    media_type = m.group(1)
    need(media_types is None or media_type in media_types, rule, where,
         f"the data URL's media type must be one of {', '.join(media_types or ())}, got "
         f"{media_type!r}")
    check_base64(m.group(2), media_type, rule, f"{where} (base64 after the comma)")


def check_image_url(url, rule, where):
    """An image by URL: https, or a data URL of a supported image type."""
    need_string(url, rule, where, nonempty=True)
    if url.startswith("data:"):
        check_data_url(url, IMAGE_TYPES, rule, where)
    else:
        need(HTTPS_URL.match(url) is not None, rule, where,
             "must be an https URL or a `data:image/(png|jpeg|gif|webp);base64,` URL, got "
             f"{url[:40]!r}")


def check_https(url, rule, where):
    need_string(url, rule, where, nonempty=True)
    need(HTTPS_URL.match(url) is not None, rule, where, f"must be an https URL, got {url[:40]!r}")


def parse_arguments(arguments, where, rule):
    """Function-call arguments: a JSON string that parses to an object."""
    need(isinstance(arguments, str), rule, where,
         f"arguments must be a JSON string, got {kind(arguments)}")
    try:
        parsed = json.loads(arguments)
    except ValueError as e:
        raise Broken(rule, where, f"arguments {arguments!r} are not JSON: {e}") from None
    need(isinstance(parsed, dict), rule, where,
         f"arguments must parse to a JSON object, got {kind(parsed)}")
    return parsed


def canned_arguments(schema):
    """Arguments that fit `schema`'s required properties, deterministically."""
    args = {}
    props = schema.get("properties", {}) if isinstance(schema, dict) else {}
    for name in schema.get("required", []) if isinstance(schema, dict) else []:
        kind_ = props.get(name, {}).get("type", "string")
        kind_ = kind_.lower() if isinstance(kind_, str) else "string"  # Gemini's Schema: "STRING"
        args[name] = {"string": "stub", "integer": 1, "number": 1, "boolean": False,
                      "array": [], "object": {}}.get(kind_, "stub")
    return args


def pick_tools(tools, round_):
    """The tools a tool-use reply calls: the first by name; the first two every second round, so
    parallel calls are exercised too. `tools` is a list of (name, schema)."""
    ordered = sorted(tools, key=lambda t: t[0])
    return ordered[: 2 if round_ % 2 == 1 and len(ordered) > 1 else 1]


def preamble(round_):
    """Text said along with the tool calls: none in even rounds (a tool-only reply), some in odd
    ones, as models do both."""
    return "Let me look around first." if round_ % 2 == 1 else None


# --- OpenAI Chat Completions -------------------------------------------------------------------

CHAT_PARAMS = {
    "model", "messages", "tools", "tool_choice", "parallel_tool_calls", "max_tokens",
    "max_completion_tokens", "temperature", "top_p", "n", "stop", "stream", "stream_options",
    "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "user",
    "seed", "response_format", "metadata", "store", "reasoning_effort", "service_tier",
    "modalities", "audio", "prediction", "web_search_options", "verbosity", "prompt_cache_key",
    "prompt_cache_retention", "safety_identifier",
}
CHAT_ROLES = {"system", "developer", "user", "assistant", "tool"}


def check_text_parts(content, rule, where):
    """Content as a string or a list of text parts."""
    if isinstance(content, str):
        return
    need(isinstance(content, list), rule, where,
         f"content must be a string or a list of text parts, got {kind(content)}")
    for i, part in enumerate(content):
        need_object(part, rule, f"{where}[{i}]")
        need(part.get("type") == "text", rule, f"{where}[{i}]",
             f"content part type must be \"text\" here, got {part.get('type')!r}")
        need_string(part.get("text"), rule, f"{where}[{i}].text")


# Per part type: (allowed keys, required keys), from the pinned SDK's ChatCompletionContentPart*
# params; only user messages take parts other than text.
CHAT_PARTS = {
    "text": ({"type", "text", "prompt_cache_breakpoint"}, ["text"]),
    "image_url": ({"type", "image_url", "prompt_cache_breakpoint"}, ["image_url"]),
    "file": ({"type", "file", "prompt_cache_breakpoint"}, ["file"]),
    "input_audio": ({"type", "input_audio", "prompt_cache_breakpoint"}, ["input_audio"]),
}
IMAGE_DETAIL = ("auto", "high", "low", "original")


def check_chat_content(content, role, where):
    """A system, developer, user or tool message's content: a string or a list of parts. Tool
    messages take text parts only (a tool's images must go into a user message)."""
    if isinstance(content, str):
        return
    rule = "chat.tool_content_text" if role == "tool" else "chat.content"
    need(isinstance(content, list), rule, where,
         f"content must be a string or a list of content parts, got {kind(content)}")
    allowed = set(CHAT_PARTS) if role == "user" else {"text"}
    for i, part in enumerate(content):
        pw = f"{where}[{i}]"
        need_object(part, rule, pw)
        ptype = part.get("type")
        if role == "tool":
            need(ptype == "text", rule, f"{pw}.type",
                 f"a tool message's content may only hold text parts, got {ptype!r} (images "
                 "from a tool go into a user message after the tool messages)")
        need(ptype in allowed, rule, f"{pw}.type",
             f"a {role} message's content parts are {', '.join(sorted(allowed))}, got {ptype!r}")
        part_rule = {"image_url": "chat.image_part", "file": "chat.file_part"}.get(ptype, rule)
        keys, required = CHAT_PARTS[ptype]
        check_keys(part, keys, required, part_rule, pw)
        if ptype == "text":
            need_string(part["text"], rule, f"{pw}.text")
        elif ptype == "image_url":
            image = part["image_url"]
            need_object(image, part_rule, f"{pw}.image_url")
            check_keys(image, {"url", "detail"}, ["url"], part_rule, f"{pw}.image_url")
            check_image_url(image["url"], part_rule, f"{pw}.image_url.url")
            if "detail" in image:
                need(image["detail"] in IMAGE_DETAIL, part_rule, f"{pw}.image_url.detail",
                     f"must be one of {', '.join(IMAGE_DETAIL)}, got {image['detail']!r}")
        elif ptype == "file":
            file = part["file"]
            need_object(file, part_rule, f"{pw}.file")
            check_keys(file, {"file_data", "file_id", "filename"}, [], part_rule, f"{pw}.file")
            need("file_data" in file or "file_id" in file, part_rule, f"{pw}.file",
                 "a file part needs file_data (a data URL) or file_id")
            if "file_data" in file:
                check_data_url(file["file_data"], (PDF,), part_rule, f"{pw}.file.file_data")
                need("filename" in file, part_rule, f"{pw}.file",
                     "a file sent as file_data needs its filename")
            if "filename" in file:
                need_string(file["filename"], part_rule, f"{pw}.file.filename", nonempty=True)
        else:
            need_object(part["input_audio"], rule, f"{pw}.input_audio")


def check_chat_tool_choice(body, tool_names):
    """`tool_choice`, when present: a mode string, one named function, or `allowed_tools`
    naming functions of `tools`. Returns the names the model may call."""
    if "tool_choice" not in body:
        return list(tool_names)
    rule, where = "chat.tool_choice", "tool_choice"
    choice = body["tool_choice"]
    need(bool(tool_names), rule, where, "tool_choice is only allowed when tools are specified")
    if isinstance(choice, str):
        need(choice in ("none", "auto", "required"), rule, where,
             f"must be none, auto, required or an object, got {choice!r}")
        return [] if choice == "none" else list(tool_names)
    need_object(choice, rule, where)
    ctype = choice.get("type")

    def function_name(fn, fw):
        need_object(fn, rule, fw)
        check_keys(fn, {"name"}, ["name"], rule, fw)
        need(fn["name"] in tool_names, rule, f"{fw}.name",
             f"names {fn['name']!r}, which is not a function in tools "
             f"({', '.join(tool_names)})")
        return fn["name"]

    if ctype == "function":
        check_keys(choice, {"type", "function"}, ["type", "function"], rule, where)
        return [function_name(choice["function"], f"{where}.function")]
    need(ctype == "allowed_tools", rule, f"{where}.type",
         f"must be \"function\", \"allowed_tools\" (or \"custom\" for a custom tool, of which "
         f"this body has none), got {ctype!r}")
    check_keys(choice, {"type", "allowed_tools"}, ["type", "allowed_tools"], rule, where)
    allowed = choice["allowed_tools"]
    aw = f"{where}.allowed_tools"
    need_object(allowed, rule, aw)
    check_keys(allowed, {"mode", "tools"}, ["mode", "tools"], rule, aw)
    need(allowed["mode"] in ("auto", "required"), rule, f"{aw}.mode",
         f"must be auto or required, got {allowed['mode']!r}")
    need(isinstance(allowed["tools"], list), rule, f"{aw}.tools",
         f"must be an array, got {kind(allowed['tools'])}")
    names = []
    for i, tool in enumerate(allowed["tools"]):
        tw = f"{aw}.tools[{i}]"
        need_object(tool, rule, tw)
        check_keys(tool, {"type", "function"}, ["type", "function"], rule, tw)
        need(tool["type"] == "function", rule, f"{tw}.type",
             f"must be \"function\", got {tool['type']!r}")
        names.append(function_name(tool["function"], f"{tw}.function"))
    return names


def check_stream(body, rule, options, nullable):
    """`stream` a boolean (or null where `nullable`: unset) and `stream_options`, when given
    and not null, an object of boolean `options`."""
    stream = body.get("stream")
    need(isinstance(stream, bool) or (stream is None and nullable), rule, "stream",
         f"must be a boolean, got {kind(stream)}")
    if body.get("stream_options") is not None:
        need_object(body["stream_options"], rule, "stream_options")
        check_keys(body["stream_options"], options, [], rule, "stream_options")
        for key, value in body["stream_options"].items():
            need(isinstance(value, bool), rule, f"stream_options.{key}",
                 f"must be a boolean, got {kind(value)}")


def check_chat(body):
    need_object(body, "body.json", "body")
    for key in body:
        need(key in CHAT_PARAMS, "param.unknown", key, "not a Chat Completions parameter")
    need("model" in body, "param.model", "model", "required")
    need_string(body["model"], "param.model", "model", nonempty=True)
    check_retention(body)
    check_stream(body, "chat.stream", {"include_usage", "include_obfuscation"}, nullable=True)
    need(body.get("stream_options") is None or body.get("stream") is True, "chat.stream",
         "stream_options", "The 'stream_options' parameter is only allowed when 'stream' is "
         "enabled.")

    tool_names = []
    for i, tool in enumerate(tools_of(body)):
        where = f"tools[{i}]"
        need_object(tool, "chat.tool_shape", where)
        check_keys(tool, {"type", "function"}, ["type", "function"], "chat.tool_shape", where)
        need(tool["type"] == "function", "chat.tool_shape", f"{where}.type",
             f"must be \"function\", got {tool['type']!r}")
        fn = tool["function"]
        need_object(fn, "chat.tool_shape", f"{where}.function")
        check_keys(fn, {"name", "description", "parameters", "strict"}, ["name"],
                   "chat.tool_shape", f"{where}.function", nullable={"strict"})
        check_tool_name(fn["name"], f"{where}.function.name")
        if "description" in fn:
            need_string(fn["description"], "chat.tool_shape", f"{where}.function.description")
        if "parameters" in fn:
            check_schema(fn["parameters"], f"{where}.function.parameters", fn.get("strict") is True)
        tool_names.append(fn["name"])
    check_tools_unique(tool_names, "tools")
    check_chat_tool_choice(body, tool_names)

    messages = body.get("messages")
    need(isinstance(messages, list) and messages, "param.messages", "messages",
         "required: a non-empty array of messages")
    pending = {}  # call id -> where it was made, while its tool message is still due
    seen_ids = set()
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        need_object(msg, "chat.role", where)
        role = msg.get("role")
        need(role in CHAT_ROLES, "chat.role", f"{where}.role",
             f"role {role!r} is not one of {', '.join(sorted(CHAT_ROLES))}")
        if pending and role != "tool":
            raise Broken("chat.tool_results_follow_calls", where,
                         f"a {role} message comes before the tool messages answering "
                         f"{', '.join(sorted(pending))}: an assistant message with tool_calls "
                         "must be followed by one tool message per call id before any other")
        if role in ("system", "developer", "user"):
            need("content" in msg, "chat.content", where, f"a {role} message needs content")
            check_chat_content(msg["content"], role, f"{where}.content")
        elif role == "tool":
            need_string(msg.get("tool_call_id"), "chat.tool_result_orphan", f"{where}.tool_call_id")
            call_id = msg["tool_call_id"]
            need(call_id in pending, "chat.tool_result_orphan", where,
                 f"tool message for {call_id!r} answers no call of the assistant message right "
                 "before it (or answers it twice)")
            del pending[call_id]
            need("content" in msg, "chat.content", where, "a tool message needs content")
            check_chat_content(msg["content"], "tool", f"{where}.content")
        else:
            calls = msg.get("tool_calls")
            content = msg.get("content")
            has_content = (isinstance(content, str) and content != "") or (
                isinstance(content, list) and content != [])
            need(has_content or bool(calls), "chat.assistant_empty", where,
                 "an assistant message needs content or tool_calls")
            if content is not None:
                check_text_parts(content, "chat.content", f"{where}.content")
            if calls is not None:
                need(isinstance(calls, list), "chat.tool_call_shape", f"{where}.tool_calls",
                     f"must be an array, got {kind(calls)}")
            for j, call in enumerate(calls or []):
                cw = f"{where}.tool_calls[{j}]"
                need_object(call, "chat.tool_call_shape", cw)
                check_keys(call, {"id", "type", "function"}, ["id", "type", "function"],
                           "chat.tool_call_shape", cw)
                need(call["type"] == "function", "chat.tool_call_shape", f"{cw}.type",
                     f"must be \"function\", got {call['type']!r}")
                need_string(call["id"], "chat.tool_call_shape", f"{cw}.id", nonempty=True)
                need(call["id"] not in seen_ids, "chat.call_id_unique", f"{cw}.id",
                     f"call id {call['id']!r} is used twice")
                seen_ids.add(call["id"])
                fn = call["function"]
                need_object(fn, "chat.tool_call_shape", f"{cw}.function")
                check_keys(fn, {"name", "arguments"}, ["name", "arguments"],
                           "chat.tool_call_shape", f"{cw}.function")
                check_tool_name(fn["name"], f"{cw}.function.name")
                parse_arguments(fn["arguments"], f"{cw}.function.arguments", "chat.arguments_json")
                pending[call["id"]] = cw
    need(not pending, "chat.tool_results_follow_calls", "messages",
         f"the conversation ends before the tool messages answering {', '.join(sorted(pending))}")


def reply_chat(body, served):
    messages = body["messages"]
    last_assistant = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
    answered = [m["tool_call_id"] for m in messages[last_assistant + 1:] if m["role"] == "tool"]
    callable_ = check_chat_tool_choice(body, [t["function"]["name"]
                                              for t in body.get("tools", [])])
    tools = [(t["function"]["name"], t["function"].get("parameters", {}))
             for t in body.get("tools", []) if t["function"]["name"] in callable_]
    rounds = sum(1 for m in messages if m["role"] == "assistant" and m.get("tool_calls"))
    key = digest(messages, body.get("tools"))
    message = {"role": "assistant", "content": None, "refusal": None, "annotations": []}
    if tool_loop() and tools:
        answered, rounds = [], 0  # never done; one call at a time
    if answered or not tools:
        message["content"] = final_text(answered)
        finish = "stop"
    else:
        message["content"] = preamble(rounds)
        message["tool_calls"] = [
            {"id": f"call_{key[:20]}_{n}", "type": "function",
             "function": {"name": name, "arguments": json.dumps(canned_arguments(schema))}}
            for n, (name, schema) in enumerate(pick_tools(tools, rounds))
        ]
        finish = "tool_calls"
    return {
        "id": f"chatcmpl-{key[:24]}",
        "object": "chat.completion",
        "created": 1767225600,
        "model": body["model"],
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": usage_chat(served),
        "service_tier": "default",
        "system_fingerprint": None,
    }


def final_text(answered):
    if not answered:
        return "Nothing to call; here is my answer."
    return "Read the results of " + ", ".join(answered) + "."


def usage_chat(served):
    total, out = served["input_tokens"], served["output_tokens"]
    return {"prompt_tokens": total, "completion_tokens": out, "total_tokens": total + out,
            "prompt_tokens_details": {"cached_tokens": served["read"]}}


# --- OpenAI Responses --------------------------------------------------------------------------

RESPONSES_PARAMS = {
    "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls",
    "max_output_tokens", "max_tool_calls", "temperature", "top_p", "top_logprobs", "store",
    "stream", "stream_options", "metadata", "reasoning", "text", "truncation", "user", "include",
    "service_tier", "background", "previous_response_id", "conversation", "prompt",
    "prompt_cache_key", "prompt_cache_retention", "safety_identifier",
}
INPUT_TEXT_TYPES = {"input_text"}
USER_INPUT_TYPES = {"input_text", "input_image", "input_file"}
OUTPUT_TEXT_TYPES = {"output_text", "refusal"}
# Per input part type: allowed keys, from the pinned SDK's ResponseInput{Text,Image,File}Param
# (message content) and ResponseInput*ContentParam (function_call_output parts).
RESPONSES_PARTS = {
    "input_text": {"type", "text", "prompt_cache_breakpoint"},
    "input_image": {"type", "detail", "file_id", "image_url", "prompt_cache_breakpoint"},
    "input_file": {"type", "detail", "file_data", "file_id", "file_url", "filename",
                   "prompt_cache_breakpoint"},
}


def check_input_part(part, where, in_output):
    """An input_text, input_image or input_file part of a message (`in_output` False) or of a
    function_call_output's list. A message's input_image must say its `detail`."""
    ptype = part["type"]
    rule = {"input_image": "responses.input_image", "input_file": "responses.input_file"}.get(
        ptype, "responses.message")
    nullable = {"file_id", "image_url"} | ({"detail"} if in_output else set())
    check_keys(part, RESPONSES_PARTS[ptype], ["text"] if ptype == "input_text" else [], rule,
               where, nullable=nullable)
    if ptype == "input_text":
        need_string(part["text"], rule, f"{where}.text")
    elif ptype == "input_image":
        if not in_output:
            need("detail" in part, rule, where,
                 "an input_image in a message needs `detail` (auto, low, high or original)")
        if part.get("detail") is not None:
            need(part["detail"] in IMAGE_DETAIL, rule, f"{where}.detail",
                 f"must be one of {', '.join(IMAGE_DETAIL)}, got {part['detail']!r}")
        need(part.get("image_url") is not None or part.get("file_id") is not None, rule, where,
             "an input_image needs image_url (https or a data URL) or file_id")
        if part.get("image_url") is not None:
            check_image_url(part["image_url"], rule, f"{where}.image_url")
    else:
        need(any(part.get(k) is not None for k in ("file_data", "file_id", "file_url")), rule,
             where, "an input_file needs file_data (a data URL), file_id or file_url")
        if "file_data" in part:
            check_data_url(part["file_data"], None, rule, f"{where}.file_data")
            need("filename" in part, rule, where, "an input_file sent as file_data needs its "
                 "filename")
        if "file_url" in part:
            check_https(part["file_url"], rule, f"{where}.file_url")
        if "filename" in part:
            need_string(part["filename"], rule, f"{where}.filename", nonempty=True)


def check_responses_tool_choice(body, tool_names):
    """`tool_choice`, when present: a mode string, one named function, or `allowed_tools`
    (flat: {type, mode, tools: [{type: "function", name}]}) naming functions of `tools`.
    Returns the names the model may call."""
    if "tool_choice" not in body:
        return list(tool_names)
    rule, where = "responses.tool_choice", "tool_choice"
    choice = body["tool_choice"]
    if isinstance(choice, str):
        need(choice in ("none", "auto", "required"), rule, where,
             f"must be none, auto, required or an object, got {choice!r}")
        return [] if choice == "none" else list(tool_names)
    need_object(choice, rule, where)

    def function(tool, tw):
        need_object(tool, rule, tw)
        need(tool.get("type") == "function", rule, f"{tw}.type",
             f"must be \"function\" (this body has no hosted or custom tools), got "
             f"{tool.get('type')!r}")
        check_keys(tool, {"type", "name"}, ["type", "name"], rule, tw)
        need(tool["name"] in tool_names, rule, f"{tw}.name",
             f"names {tool['name']!r}, which is not a function in tools "
             f"({', '.join(tool_names)})")
        return tool["name"]

    if choice.get("type") != "allowed_tools":
        return [function(choice, where)]
    check_keys(choice, {"type", "mode", "tools"}, ["type", "mode", "tools"], rule, where)
    need(choice["mode"] in ("auto", "required"), rule, f"{where}.mode",
         f"must be auto or required, got {choice['mode']!r}")
    need(isinstance(choice["tools"], list), rule, f"{where}.tools",
         f"must be an array, got {kind(choice['tools'])}")
    return [function(tool, f"{where}.tools[{i}]") for i, tool in enumerate(choice["tools"])]


def check_message_item(item, where):
    role = item.get("role")
    need(role in ("user", "assistant", "system", "developer"), "responses.message",
         f"{where}.role", f"role {role!r} is not one of assistant, developer, system, user")
    content = item.get("content")
    if isinstance(content, str):
        return
    need(isinstance(content, list), "responses.message", f"{where}.content",
         f"must be a string or a list of content parts, got {kind(content)}")
    allowed = {"assistant": OUTPUT_TEXT_TYPES, "user": USER_INPUT_TYPES}.get(role, INPUT_TEXT_TYPES)
    for j, part in enumerate(content):
        pw = f"{where}.content[{j}]"
        need_object(part, "responses.message", pw)
        need(part.get("type") in allowed, "responses.message", f"{pw}.type",
             f"a {role} message's parts are {', '.join(sorted(allowed))}, got {part.get('type')!r}")
        if part["type"] == "refusal":
            need_string(part.get("refusal"), "responses.message", f"{pw}.refusal")
        elif part["type"] == "output_text":
            need_string(part.get("text"), "responses.message", f"{pw}.text")
        else:
            check_input_part(part, pw, in_output=False)


def check_responses(body):
    need_object(body, "body.json", "body")
    for key in body:
        need(key in RESPONSES_PARAMS, "param.unknown", key, "not a Responses parameter")
    need("model" in body, "param.model", "model", "required")
    need_string(body["model"], "param.model", "model", nonempty=True)
    check_retention(body)
    check_stream(body, "responses.stream", {"include_obfuscation"}, nullable=True)
    if "instructions" in body:
        need_string(body["instructions"], "responses.instructions", "instructions")

    tool_names = []
    # Tool search: functions with defer_loading (at the top level or in a namespace) need a
    # `tool_search` tool; a namespace itself is never deferred, only the functions in it.
    flat = []
    has_search = False
    for i, tool in enumerate(tools_of(body)):
        where = f"tools[{i}]"
        need_object(tool, "responses.tool_shape", where)
        if tool.get("type") == "tool_search":
            check_keys(tool, {"type", "execution", "description", "parameters"}, ["type"],
                       "responses.tool_search", where)
            has_search = True
        elif tool.get("type") == "namespace":
            check_keys(tool, {"type", "name", "description", "tools"},
                       ["type", "name", "description", "tools"], "responses.namespace", where)
            need_string(tool["name"], "responses.namespace", f"{where}.name", nonempty=True)
            need(all(c.isalnum() or c in "_-" for c in tool["name"]), "responses.namespace",
                 f"{where}.name", "letters, digits, `_` and `-` only")
            need_string(tool["description"], "responses.namespace", f"{where}.description",
                        nonempty=True)
            need(isinstance(tool["tools"], list) and tool["tools"], "responses.namespace",
                 f"{where}.tools", "must be a non-empty array of functions")
            for j, inner in enumerate(tool["tools"]):
                flat.append((f"{where}.tools[{j}]", inner))
        else:
            flat.append((where, tool))
    deferred = [w for w, t in flat if isinstance(t, dict) and t.get("defer_loading") is True]
    need(not deferred or has_search, "responses.defer_without_search",
         deferred[0] if deferred else "tools",
         "a function with defer_loading needs a tool_search tool in tools")
    for where, tool in flat:
        need_object(tool, "responses.tool_shape", where)
        need("function" not in tool, "responses.tool_shape", where,
             "Responses tools are flat {type, name, description, parameters}, not nested under "
             "`function` as in Chat Completions")
        check_keys(tool, {"type", "name", "description", "parameters", "strict",
                          "defer_loading"},
                   ["type", "name"], "responses.tool_shape", where,
                   nullable={"description", "parameters", "strict"})
        if "defer_loading" in tool:
            need(isinstance(tool["defer_loading"], bool), "responses.tool_shape",
                 f"{where}.defer_loading", "must be a boolean")
        need(tool["type"] == "function", "responses.tool_shape", f"{where}.type",
             f"must be \"function\", got {tool['type']!r}")
        check_tool_name(tool["name"], f"{where}.name")
        if tool.get("description") is not None:
            need_string(tool["description"], "responses.tool_shape", f"{where}.description")
        if tool.get("parameters") is not None:
            strict = tool.get("strict")
            check_schema(tool["parameters"], f"{where}.parameters", strict is not False,
                         "tool.strict_schema" if strict is True else "responses.strict_default")
        tool_names.append(tool["name"])
    check_tools_unique(tool_names, "tools")
    check_responses_tool_choice(body, tool_names)

    items = body.get("input")
    if isinstance(items, str):
        return
    need(isinstance(items, list) and items, "param.input", "input",
         "required: a string or a non-empty array of input items")
    calls = {}  # call_id -> answered yet
    for i, item in enumerate(items):
        where = f"input[{i}]"
        need_object(item, "responses.item_type", where)
        itype = item.get("type", "message" if "role" in item else None)
        if itype == "message":
            check_message_item(item, where)
        elif itype == "function_call":
            check_keys(item, {"type", "id", "call_id", "name", "arguments", "status"},
                       ["type", "call_id", "name", "arguments"], "responses.function_call", where)
            need_string(item["call_id"], "responses.function_call", f"{where}.call_id", nonempty=True)
            need(item["call_id"] not in calls, "responses.function_call", f"{where}.call_id",
                 f"call_id {item['call_id']!r} is used twice")
            check_tool_name(item["name"], f"{where}.name")
            parse_arguments(item["arguments"], f"{where}.arguments", "responses.arguments_json")
            calls[item["call_id"]] = False
        elif itype == "function_call_output":
            check_keys(item, {"type", "id", "call_id", "output", "status"},
                       ["type", "call_id", "output"], "responses.function_call_output", where)
            call_id = item["call_id"]
            need(calls.get(call_id) is False, "responses.output_orphan", where,
                 f"function_call_output for {call_id!r} answers no earlier function_call "
                 "(or answers it twice)")
            calls[call_id] = True
            output = item["output"]
            if not isinstance(output, str):
                need(isinstance(output, list), "responses.function_call_output",
                     f"{where}.output", f"must be a string or a list of parts, got {kind(output)}")
                for j, part in enumerate(output):
                    need(isinstance(part, dict) and part.get("type") in RESPONSES_PARTS,
                         "responses.function_call_output", f"{where}.output[{j}]",
                         "output parts are input_text, input_image or input_file, got "
                         f"{canon(part)[:60]}")
                    check_input_part(part, f"{where}.output[{j}]", in_output=True)
        else:
            raise Broken("responses.item_type", f"{where}.type",
                         f"item type {itype!r} is not message, function_call or "
                         "function_call_output")
    unanswered = sorted(c for c, done in calls.items() if not done)
    need(not unanswered, "responses.call_unanswered", "input",
         f"no function_call_output for {', '.join(unanswered)}")


def reply_responses(body, served):
    items = body["input"] if isinstance(body["input"], list) else [
        {"role": "user", "content": body["input"]}]
    def is_assistant(item):
        return item.get("type") == "function_call" or item.get("role") == "assistant"
    last = max((i for i, it in enumerate(items) if is_assistant(it)), default=-1)
    answered = [it["call_id"] for it in items[last + 1:] if it.get("type") == "function_call_output"]
    # What the canned model calls: functions in the prompt (a deferred one is found first).
    present = [t for t in body.get("tools", [])
               if t.get("type") == "function" and t.get("defer_loading") is not True]
    callable_ = check_responses_tool_choice(body, [t["name"] for t in present])
    tools = [(t["name"], t.get("parameters") or {}) for t in present if t["name"] in callable_]
    # A round is one reply's worth of calls: consecutive function_call items.
    rounds = sum(1 for i, it in enumerate(items) if it.get("type") == "function_call"
                 and (i == 0 or items[i - 1].get("type") != "function_call"))
    key = digest(items, body.get("tools"))
    if answered or not tools:
        output = [{"type": "message", "id": f"msg_{key[:24]}", "status": "completed",
                   "role": "assistant",
                   "content": [{"type": "output_text", "text": final_text(answered),
                                "annotations": []}]}]
    else:
        said = preamble(rounds)
        output = [] if said is None else [
            {"type": "message", "id": f"msg_{key[:24]}", "status": "completed", "role": "assistant",
             "content": [{"type": "output_text", "text": said, "annotations": []}]}]
        output += [
            {"type": "function_call", "id": f"fc_{key[:20]}_{n}", "call_id": f"call_{key[:20]}_{n}",
             "name": name, "arguments": json.dumps(canned_arguments(schema)),
             "status": "completed"}
            for n, (name, schema) in enumerate(pick_tools(tools, rounds))
        ]
    return {
        "id": f"resp_{key[:24]}",
        "object": "response",
        "created_at": 1767225600,
        "status": "completed",
        "model": body["model"],
        "output": output,
        "instructions": body.get("instructions"),
        "tools": body.get("tools", []),
        "tool_choice": body.get("tool_choice", "auto"),
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "temperature": body.get("temperature", 1.0),
        "top_p": body.get("top_p", 1.0),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata", {}),
        "error": None,
        "incomplete_details": None,
        "usage": usage_responses(served),
    }


def usage_responses(served):
    total, out = served["input_tokens"], served["output_tokens"]
    return {"input_tokens": total, "input_tokens_details": {"cached_tokens": served["read"]},
            "output_tokens": out, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": total + out}


# --- Anthropic Messages ------------------------------------------------------------------------

MESSAGES_PARAMS = {
    "model", "messages", "max_tokens", "system", "tools", "tool_choice", "temperature", "top_p",
    "top_k", "stop_sequences", "stream", "metadata", "thinking", "service_tier", "container",
    "mcp_servers", "output_config", "inference_geo",
}
# Per block type: (allowed keys, required keys, keys that may be null), from the pinned SDK's
# *BlockParam types; the API refuses extra inputs.
BLOCKS = {
    "text": ({"type", "text", "cache_control", "citations"}, ["text"],
             {"cache_control", "citations"}),
    "image": ({"type", "source", "cache_control", "transformations"}, ["source"],
              {"cache_control", "transformations"}),
    "document": ({"type", "source", "title", "context", "citations", "cache_control"},
                 ["source"], {"title", "context", "citations", "cache_control"}),
    "tool_use": ({"type", "id", "name", "input", "cache_control", "caller", "toolset_name"},
                 ["id", "name", "input"], {"cache_control", "toolset_name"}),
    "tool_result": ({"type", "tool_use_id", "content", "is_error", "cache_control",
                     "toolset_name"}, ["tool_use_id"], {"cache_control", "toolset_name"}),
    "thinking": ({"type", "thinking", "signature"}, ["thinking", "signature"], set()),
    "redacted_thinking": ({"type", "data"}, ["data"], set()),
}
USER_BLOCKS = {"text", "image", "document", "tool_result"}
ASSISTANT_BLOCKS = {"text", "tool_use", "thinking", "redacted_thinking"}


class Thinking:
    """What the stub returned before each tool call (Anthropic's thinking blocks, Bedrock's
    reasoningContent), so a body sending it back can be checked."""

    def __init__(self):
        self.lock = threading.Lock()
        self.by_tool_use = {}  # tool_use id -> the thinking blocks returned before it
        self.returned = set()  # canonical JSON of every thinking block returned

    def remember(self, tool_use_ids, blocks):
        with self.lock:
            for i in tool_use_ids:
                self.by_tool_use[i] = blocks
            self.returned.update(canon(b) for b in blocks)

    def expected(self, tool_use_ids):
        with self.lock:
            for i in tool_use_ids:
                if i in self.by_tool_use:
                    return self.by_tool_use[i]
        return None

    def known(self, block):
        with self.lock:
            return canon(block) in self.returned


THINKING = Thinking()


def check_cache_control(value, where, count):
    need_object(value, "messages.cache_control", where)
    check_keys(value, {"type", "ttl"}, ["type"], "messages.cache_control", where)
    need(value["type"] == "ephemeral", "messages.cache_control", f"{where}.type",
         f"must be \"ephemeral\", got {value['type']!r}")
    count.append(where)
    need(len(count) <= MAX_BREAKPOINTS, "messages.cache_breakpoints", where,
         f"more than {MAX_BREAKPOINTS} cache_control breakpoints in tools, system and messages "
         f"together: {', '.join(count)}")


def check_block(block, role, where, breakpoints):
    need_object(block, "messages.block_type", where)
    btype = block.get("type")
    need(btype in BLOCKS, "messages.block_type", f"{where}.type", f"unknown block type {btype!r}")
    allowed_here = USER_BLOCKS if role == "user" else ASSISTANT_BLOCKS
    need(btype in allowed_here, "messages.block_type", f"{where}.type",
         f"a {btype} block cannot be in a {role} turn")
    allowed, required, nullable = BLOCKS[btype]
    check_keys(block, allowed, required, "messages.block_keys", where, nullable=nullable)
    if block.get("cache_control") is not None:
        check_cache_control(block["cache_control"], f"{where}.cache_control", breakpoints)
    if btype == "text":
        need_string(block["text"], "messages.block_keys", f"{where}.text")
        need(block["text"].strip() != "", "messages.empty_text", where,
             "text content blocks must contain non-whitespace text")
    elif btype == "tool_use":
        need_string(block["id"], "messages.block_keys", f"{where}.id", nonempty=True)
        check_tool_name(block["name"], f"{where}.name")
        need(isinstance(block["input"], dict), "messages.tool_use_input", f"{where}.input",
             f"tool_use input must be an object, got {kind(block['input'])}")
        if "caller" in block:
            need_object(block["caller"], "messages.block_keys", f"{where}.caller")
    elif btype == "tool_result":
        need_string(block["tool_use_id"], "messages.block_keys", f"{where}.tool_use_id")
        content = block.get("content")
        if isinstance(content, list):
            for k, inner in enumerate(content):
                iw = f"{where}.content[{k}]"
                need_object(inner, "messages.block_type", iw)
                need(inner.get("type") in ("text", "image", "document"), "messages.block_type",
                     f"{iw}.type", f"a tool_result holds text, image or document blocks, got "
                     f"{inner.get('type')!r}")
                check_block(inner, "user", iw, breakpoints)
        elif content is not None:
            need_string(content, "messages.block_keys", f"{where}.content")
        if "is_error" in block:
            need(isinstance(block["is_error"], bool), "messages.block_keys", f"{where}.is_error",
                 f"must be a boolean, got {kind(block['is_error'])}")
    elif btype == "image":
        check_image_source(block["source"], f"{where}.source")
    elif btype == "document":
        check_document_source(block["source"], f"{where}.source")
        for key in ("title", "context"):
            if block.get(key) is not None:
                need_string(block[key], "messages.block_keys", f"{where}.{key}")
    elif btype == "thinking":
        need_string(block["thinking"], "messages.block_keys", f"{where}.thinking")
        need_string(block["signature"], "messages.block_keys", f"{where}.signature")
    elif btype == "redacted_thinking":
        need_string(block["data"], "messages.block_keys", f"{where}.data")


def check_image_source(source, where):
    """An image block's source: base64 data (bare, not a data URL) of a supported type, an
    https URL, or an uploaded file."""
    rule = "messages.image_source"
    need_object(source, rule, where)
    stype = source.get("type")
    if stype == "base64":
        check_keys(source, {"type", "media_type", "data"}, ["type", "media_type", "data"], rule,
                   where)
        need(source["media_type"] in IMAGE_TYPES, rule, f"{where}.media_type",
             f"must be one of {', '.join(IMAGE_TYPES)}, got {source['media_type']!r}")
        check_base64(source["data"], source["media_type"], rule, f"{where}.data")
    elif stype == "url":
        check_keys(source, {"type", "url"}, ["type", "url"], rule, where)
        check_https(source["url"], rule, f"{where}.url")
    elif stype == "file":
        check_keys(source, {"type", "file_id"}, ["type", "file_id"], rule, where)
        need_string(source["file_id"], rule, f"{where}.file_id", nonempty=True)
    else:
        raise Broken(rule, f"{where}.type",
                     f"an image source is base64, url or file, got {stype!r}")


def check_document_source(source, where):
    """A document block's source: base64 PDF data, plain text, content blocks, an https URL or
    an uploaded file."""
    rule = "messages.document_source"
    need_object(source, rule, where)
    stype = source.get("type")
    if stype == "base64":
        check_keys(source, {"type", "media_type", "data"}, ["type", "media_type", "data"], rule,
                   where)
        need(source["media_type"] == PDF, rule, f"{where}.media_type",
             f"a base64 document source is {PDF}, got {source['media_type']!r}")
        check_base64(source["data"], PDF, rule, f"{where}.data")
    elif stype == "text":
        check_keys(source, {"type", "media_type", "data"}, ["type", "media_type", "data"], rule,
                   where)
        need(source["media_type"] == "text/plain", rule, f"{where}.media_type",
             f"a text document source is text/plain, got {source['media_type']!r}")
        need_string(source["data"], rule, f"{where}.data")
    elif stype == "content":
        check_keys(source, {"type", "content"}, ["type", "content"], rule, where)
        need(isinstance(source["content"], (str, list)), rule, f"{where}.content",
             f"must be a string or a list of text and image blocks, got {kind(source['content'])}")
    elif stype == "url":
        check_keys(source, {"type", "url"}, ["type", "url"], rule, where)
        check_https(source["url"], rule, f"{where}.url")
    elif stype == "file":
        check_keys(source, {"type", "file_id"}, ["type", "file_id"], rule, where)
        need_string(source["file_id"], rule, f"{where}.file_id", nonempty=True)
    else:
        raise Broken(rule, f"{where}.type",
                     f"a document source is base64, text, content, url or file, got {stype!r}")


def check_messages_tool_choice(body, tool_names):
    """`tool_choice`, when present: auto, any, none, or one named tool of `tools` (Messages has
    no allowed-tools subset: a subset is sent as the `tools` array). Returns the names the model
    may call."""
    if "tool_choice" not in body:
        return list(tool_names)
    rule, where = "messages.tool_choice", "tool_choice"
    choice = body["tool_choice"]
    need_object(choice, rule, where)
    ctype = choice.get("type")
    parallel = {"type", "disable_parallel_tool_use"}
    keys = {"auto": parallel, "any": parallel, "tool": parallel | {"name"}, "none": {"type"}}
    need(ctype in keys, rule, f"{where}.type",
         f"must be auto, any, tool or none, got {ctype!r}")
    check_keys(choice, keys[ctype], ["type", "name"] if ctype == "tool" else ["type"], rule, where)
    if "disable_parallel_tool_use" in choice:
        need(isinstance(choice["disable_parallel_tool_use"], bool), rule,
             f"{where}.disable_parallel_tool_use", "must be a boolean")
    if ctype == "tool":
        need(choice["name"] in tool_names, rule, f"{where}.name",
             f"names {choice['name']!r}, which is not in tools ({', '.join(tool_names)})")
        return [choice["name"]]
    return [] if ctype == "none" else list(tool_names)


def blocks_of(msg):
    content = msg["content"]
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def check_thinking(turns):
    """Thinking blocks sent back are the very ones returned; the assistant turn still waiting on
    its tool results keeps them, first, in order."""
    for i, msg in enumerate(turns):
        if msg["role"] != "assistant":
            continue
        blocks = blocks_of(msg)
        thinking = [b for b in blocks if b["type"] in ("thinking", "redacted_thinking")]
        uses = [b["id"] for b in blocks if b["type"] == "tool_use"]
        expected = THINKING.expected(uses)
        where = f"messages[{i}]"
        if expected is not None:
            waiting = i == len(turns) - 2  # the last user turn carries its tool results
            if thinking or waiting:
                need(canon(blocks[: len(expected)]) == canon(expected),
                     "messages.thinking_unchanged", where,
                     "the thinking and redacted_thinking blocks returned with tool_use "
                     f"{', '.join(uses)} must come back unchanged, first in the turn: expected "
                     f"{canon(expected)}, got {canon(thinking)}")
        for j, b in enumerate(thinking):
            need(THINKING.known(b), "messages.thinking_unchanged", f"{where}.content",
                 f"a {b['type']} block the stub never returned (changed?): {canon(b)}")


# Anthropic's tool search tools: type -> the name each must have.
SEARCH_TOOLS = {
    "tool_search_tool_regex_20251119": "tool_search_tool_regex",
    "tool_search_tool_bm25_20251119": "tool_search_tool_bm25",
}


def check_messages(body):
    need_object(body, "body.json", "body")
    for key in body:
        need(key in MESSAGES_PARAMS, "param.unknown", key, "not a Messages parameter")
    need("model" in body, "param.model", "model", "required")
    need_string(body["model"], "param.model", "model", nonempty=True)
    need("max_tokens" in body, "param.max_tokens", "max_tokens", "required")
    mt = body["max_tokens"]
    need(isinstance(mt, int) and not isinstance(mt, bool) and mt >= 1, "param.max_tokens",
         "max_tokens", f"must be a positive integer, got {mt!r}")
    if "stream" in body:
        need(isinstance(body["stream"], bool), "messages.stream", "stream",
             f"must be a boolean, got {kind(body['stream'])}")
    if "metadata" in body:
        need_object(body["metadata"], "messages.metadata", "metadata")
        check_keys(body["metadata"], {"user_id"}, [], "messages.metadata", "metadata",
                   nullable={"user_id"})
        if body["metadata"].get("user_id") is not None:
            need_string(body["metadata"]["user_id"], "messages.metadata", "metadata.user_id")
    breakpoints = []

    tool_names = []
    tools = tools_of(body)
    # Tool search (Anthropic's advanced tool use): a `defer_loading` tool is only found through
    # a tool search tool; the search tool itself is never deferred, at least one tool is not,
    # and a deferred tool, not being in the prompt, carries no breakpoint.
    searches = [t for t in tools if isinstance(t, dict) and t.get("type") in SEARCH_TOOLS]
    deferred = [t for t in tools if isinstance(t, dict) and t.get("defer_loading") is True]
    need(not deferred or searches, "messages.defer_without_search", "tools",
         "a tool with defer_loading needs a tool search tool (tool_search_tool_regex_20251119 "
         "or tool_search_tool_bm25_20251119) in tools")
    need(not deferred or len(deferred) < len(tools), "messages.all_deferred", "tools",
         "at least one tool must not be deferred")
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        need_object(tool, "messages.tool_shape", where)
        if tool.get("type") in SEARCH_TOOLS:
            check_keys(tool, {"type", "name", "cache_control", "defer_loading"}, ["type", "name"],
                       "messages.tool_search", where, nullable={"cache_control"})
            need(tool["name"] == SEARCH_TOOLS[tool["type"]], "messages.tool_search",
                 f"{where}.name", f"must be {SEARCH_TOOLS[tool['type']]!r}")
            need(tool.get("defer_loading") is not True, "messages.tool_search", where,
                 "the tool search tool cannot be deferred")
            if tool.get("cache_control") is not None:
                check_cache_control(tool["cache_control"], f"{where}.cache_control", breakpoints)
            continue
        check_keys(tool, {"type", "name", "description", "input_schema", "cache_control",
                          "strict", "defer_loading"}, ["name", "input_schema"],
                   "messages.tool_shape", where, nullable={"cache_control", "type"})
        if tool.get("defer_loading") is not None:
            need(isinstance(tool["defer_loading"], bool), "messages.tool_shape",
                 f"{where}.defer_loading", "must be a boolean")
            need(not (tool["defer_loading"] and tool.get("cache_control") is not None),
                 "messages.deferred_breakpoint", where,
                 "a deferred tool is not in the prompt and cannot carry cache_control")
        if tool.get("type") is not None:
            need(tool["type"] == "custom", "messages.tool_shape", f"{where}.type",
                 f"a client tool's type is \"custom\" or absent, got {tool['type']!r}")
        check_tool_name(tool["name"], f"{where}.name")
        if "description" in tool:
            need_string(tool["description"], "messages.tool_shape", f"{where}.description")
        check_schema(tool["input_schema"], f"{where}.input_schema", strict=False)
        if tool.get("cache_control") is not None:
            check_cache_control(tool["cache_control"], f"{where}.cache_control", breakpoints)
        tool_names.append(tool["name"])
    check_tools_unique(tool_names, "tools")
    check_messages_tool_choice(body, tool_names)

    if "system" in body:
        system = body["system"]
        if isinstance(system, list):
            for i, block in enumerate(system):
                where = f"system[{i}]"
                need_object(block, "messages.system", where)
                need(block.get("type") == "text", "messages.system", f"{where}.type",
                     f"system blocks are text blocks, got {block.get('type')!r}")
                check_block(block, "user", where, breakpoints)
        else:
            need_string(system, "messages.system", "system")

    turns = body.get("messages")
    need(isinstance(turns, list) and turns, "param.messages", "messages",
         "required: a non-empty array of messages")
    waiting = set()  # tool_use ids of the previous assistant turn
    for i, msg in enumerate(turns):
        where = f"messages[{i}]"
        need_object(msg, "messages.roles", where)
        check_keys(msg, {"role", "content"}, ["role", "content"], "messages.roles", where)
        role = msg["role"]
        need(role in ("user", "assistant"), "messages.roles", f"{where}.role",
             f"role {role!r} is not user or assistant")
        need(i > 0 or role == "user", "messages.roles", where, "the first message must be a user turn")
        need(i == 0 or turns[i - 1].get("role") != role, "messages.roles", where,
             f"two {role} turns in a row: roles must alternate user/assistant")
        content = msg["content"]
        if isinstance(content, str):
            need(content.strip() != "" or (role == "assistant" and i == len(turns) - 1),
                 "messages.empty_text", f"{where}.content", "message content must be non-empty")
        else:
            need(isinstance(content, list), "messages.roles", f"{where}.content",
                 f"must be a string or a list of content blocks, got {kind(content)}")
            need(content != [] or (role == "assistant" and i == len(turns) - 1),
                 "messages.empty_content", f"{where}.content", "message content must be non-empty")
            for j, block in enumerate(content):
                check_block(block, role, f"{where}.content[{j}]", breakpoints)
        blocks = blocks_of(msg)
        if role == "user":
            results = [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"]
            first_other = next((j for j, b in enumerate(blocks) if b["type"] != "tool_result"),
                               len(blocks))
            need(all(b["type"] != "tool_result" for b in blocks[first_other:]),
                 "messages.tool_results_first", where,
                 "tool_result blocks must come first in the user turn's content, before any "
                 "other block")
            for r in results:
                need(r in waiting, "messages.tool_result_orphan", where,
                     f"tool_result for {r!r} answers no tool_use of the assistant turn right "
                     "before it (or answers it twice)")
                waiting.discard(r)
            need(not waiting, "messages.tool_result_next_turn", where,
                 f"tool_use {', '.join(sorted(waiting))} got no tool_result in this, the very "
                 "next user turn")
        else:
            need(not waiting, "messages.tool_result_next_turn", where,
                 f"tool_use {', '.join(sorted(waiting))} got no tool_result before this turn")
            ids = [b["id"] for b in blocks if b["type"] == "tool_use"]
            need(len(set(ids)) == len(ids), "messages.tool_use_unique", where,
                 "a tool_use id is used twice")
            waiting = set(ids)
    need(not waiting, "messages.tool_result_next_turn", "messages",
         f"the conversation ends before the tool_result for {', '.join(sorted(waiting))}")
    check_thinking(turns)


def reply_messages(body, served):
    turns = body["messages"]
    last = turns[-1]
    answered = [b["tool_use_id"] for b in blocks_of(last)
                if last["role"] == "user" and b["type"] == "tool_result"]
    present = [t for t in body.get("tools", [])
               if "input_schema" in t and t.get("defer_loading") is not True]
    callable_ = check_messages_tool_choice(body, [t["name"] for t in present])
    tools = [(t["name"], t["input_schema"]) for t in present if t["name"] in callable_]
    rounds = sum(1 for t in turns if t["role"] == "assistant"
                 and any(b["type"] == "tool_use" for b in blocks_of(t)))
    key = digest(turns, body.get("tools"), body.get("system"))
    if tool_loop() and tools:
        answered, rounds = [], 0  # never done; one call at a time
    if answered or not tools:
        content = [{"type": "text", "text": final_text(answered)}]
        stop = "end_turn"
    else:
        picked = pick_tools(tools, rounds)
        content = [{"type": "thinking",
                    "thinking": f"The user wants something done; {picked[0][0]} should help.",
                    "signature": "sig_" + digest("thinking", key)}]
        if rounds % 2 == 1:
            content.append({"type": "redacted_thinking", "data": "redacted_" + digest("r", key)})
        if preamble(rounds) is not None:
            content.append({"type": "text", "text": preamble(rounds)})
        content += [{"type": "tool_use", "id": f"toolu_{key[:20]}_{n}", "name": name,
                     "input": canned_arguments(schema)}
                    for n, (name, schema) in enumerate(picked)]
        THINKING.remember([b["id"] for b in content if b["type"] == "tool_use"],
                          [b for b in content if b["type"] in ("thinking", "redacted_thinking")])
        stop = "tool_use"
    return {
        "id": f"msg_{key[:24]}",
        "type": "message",
        "role": "assistant",
        "model": body["model"],
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": usage_messages(served),
    }


def usage_messages(served):
    return {"input_tokens": served["uncached"], "output_tokens": served["output_tokens"],
            "cache_creation_input_tokens": served["written_5m"] + served["written_1h"],
            "cache_read_input_tokens": served["read"],
            "cache_creation": {"ephemeral_5m_input_tokens": served["written_5m"],
                               "ephemeral_1h_input_tokens": served["written_1h"]}}


# --- Google Gemini (generateContent) -----------------------------------------------------------

# The request is a protobuf message as JSON: the API's parser takes a field by its lowerCamelCase
# JSON name or by its proto name (snake_case), and google-genai sends some nested messages
# (inlineData, fileData, function declarations, thinkingConfig) with the snake_case names.
GEMINI_PARAMS = {
    "contents", "tools", "toolConfig", "safetySettings", "systemInstruction", "generationConfig",
    "cachedContent", "labels", "serviceTier", "store", "continuationToken",
}
GEMINI_GENERATION = {
    "temperature", "topP", "topK", "candidateCount", "maxOutputTokens", "stopSequences",
    "presencePenalty", "frequencyPenalty", "seed", "responseMimeType", "responseSchema",
    "responseJsonSchema", "responseModalities", "responseLogprobs", "logprobs", "thinkingConfig",
    "speechConfig", "imageConfig", "mediaResolution", "enableEnhancedCivicAnswers",
    "audioTranscriptionConfig",
}
GEMINI_THINKING = {"includeThoughts", "thinkingBudget", "thinkingLevel"}
GEMINI_DATA = ("text", "inlineData", "fileData", "functionCall", "functionResponse")
GEMINI_PART_EXTRA = {"thought", "thoughtSignature", "videoMetadata", "mediaResolution",
                     "partMetadata"}
GEMINI_DECLARATION = {"name", "description", "parameters", "parametersJsonSchema", "response",
                      "responseJsonSchema", "behavior"}
GEMINI_FUNCTION_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_.:-]{0,127}$")
GEMINI_MODES = ("AUTO", "ANY", "NONE", "VALIDATED")
GEMINI_FILE_URI = re.compile(r"^(https://[^\s/?#]+\S*|files/[a-zA-Z0-9_-]+)$")
# The thought-signatures guide's dummy values, for a history the model did not produce. They are
# valid URL-safe base64 themselves: sent as they are (REST), they stand for the bytes they decode
# to; SDK users also pass their ASCII bytes (b"skip_thought_signature_validator"), which the SDK
# sends base64-encoded. Both are taken, compared as bytes.
SIGNATURE_DUMMIES = ("skip_thought_signature_validator", "context_engineering_is_the_way_to_go")


def camel(name):
    """A proto field's JSON name from its proto (snake_case) name; a JSON name is unchanged."""
    return re.sub(r"_([a-z0-9])", lambda m: m.group(1).upper(), name)


def proto_fields(obj, allowed, rule, where, required=()):
    """A protobuf message's fields by JSON name (a null field is unset). Refuses an unknown
    field, a field given under both its names, and a missing required one."""
    need_object(obj, rule, where)
    fields = {}
    for key, value in obj.items():
        name = camel(key)
        need(name in allowed, rule, f"{where}.{key}",
             f"Invalid JSON payload received. Unknown name {key!r}: cannot find field (fields "
             f"here: {', '.join(sorted(allowed))})")
        need(name not in fields, rule, f"{where}.{key}",
             f"field `{name}` is given twice (as `{name}` and as its proto name)")
        if value is not None:
            fields[name] = value
    for name in required:
        need(name in fields, rule, where, f"missing required field `{name}`")
    return fields


def proto_bytes(text):
    """The bytes of a proto `bytes` field sent as JSON: base64, standard or URL-safe, padded or
    not. None when `text` is not that."""
    if not isinstance(text, str) or re.fullmatch(r"[A-Za-z0-9+/_-]*={0,2}", text) is None:
        return None
    body = text.rstrip("=").replace("-", "+").replace("_", "/")
    if len(body) % 4 == 1:
        return None
    try:
        return base64.b64decode(body + "=" * (-len(body) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None


DUMMY_SIGNATURES = {raw for d in SIGNATURE_DUMMIES for raw in (proto_bytes(d), d.encode())}


class Signatures:
    """The thought signatures the stub issued, each for one model (they do not carry across
    models)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.model_of = {}  # signature bytes -> the model it was issued for

    def issue(self, model, *seed):
        """New signature bytes for `model`, as standard base64 with padding (the API's form). They
        start 0xfb 0xff, so the standard and URL-safe encodings differ (`+/` against `-_`): a
        client that compares signatures as text, not as bytes, fails."""
        raw = b"\xfb\xff" + model.encode() + bytes.fromhex(digest("signature", model, *seed))
        if len(raw) % 3 == 0:
            raw += b"\x00"  # so the text has padding too
        with self.lock:
            self.model_of[raw] = model
        return base64.b64encode(raw).decode()

    def issued_for(self, raw):
        with self.lock:
            return self.model_of.get(raw)


SIGNATURES = Signatures()


def gemini_declarations(body):
    """(name, schema) of each function declaration, in order."""
    out = []
    for tool in body.get("tools", []):
        for decl in tool.get("functionDeclarations", tool.get("function_declarations", [])):
            d = {camel(k): v for k, v in decl.items() if v is not None}
            out.append((d["name"], d.get("parametersJsonSchema", d.get("parameters", {}))))
    return out


def check_gemini_tool_config(body, names):
    """`toolConfig.functionCallingConfig`, when present: a mode of AUTO, ANY, NONE, VALIDATED;
    `allowedFunctionNames` only with ANY or VALIDATED, naming declared functions. Returns the
    names the model may call."""
    config = {camel(k): v for k, v in body.items()}.get("toolConfig")
    if config is None:
        return list(names)
    rule = "gemini.tool_config"
    config = proto_fields(config, {"functionCallingConfig", "retrievalConfig",
                                   "includeServerSideToolInvocations"}, rule, "toolConfig")
    if "functionCallingConfig" not in config:
        return list(names)
    where = "toolConfig.functionCallingConfig"
    fcc = proto_fields(config["functionCallingConfig"],
                       {"mode", "allowedFunctionNames", "streamFunctionCallArguments"}, rule, where)
    mode = fcc.get("mode", "AUTO")
    need(mode in GEMINI_MODES, rule, f"{where}.mode",
         f"must be one of {', '.join(GEMINI_MODES)}, got {mode!r}")
    if "allowedFunctionNames" not in fcc:
        return [] if mode == "NONE" else list(names)
    allowed = fcc["allowedFunctionNames"]
    need(mode in ("ANY", "VALIDATED"), rule, f"{where}.allowedFunctionNames",
         f"allowed_function_names may be set only when the mode is ANY or VALIDATED, not {mode}")
    need(isinstance(allowed, list), rule, f"{where}.allowedFunctionNames",
         f"must be an array of function names, got {kind(allowed)}")
    for i, name in enumerate(allowed):
        need(name in names, rule, f"{where}.allowedFunctionNames[{i}]",
             f"names {name!r}, which is not a declared function ({', '.join(names)})")
    return list(allowed)


def check_gemini_part(part, role, where):
    """One part: exactly one data field (text, inlineData, fileData, functionCall,
    functionResponse) beside `thought` and `thoughtSignature`. Returns it by JSON names."""
    p = proto_fields(part, set(GEMINI_DATA) | GEMINI_PART_EXTRA, "gemini.part", where)
    data = [k for k in GEMINI_DATA if k in p]
    need(len(data) == 1, "gemini.part", where,
         f"a part holds exactly one of {', '.join(GEMINI_DATA)}, this one "
         + (f"holds {', '.join(data)}" if data else "none"))
    field = data[0]
    fw = f"{where}.{field}"
    if field == "text":
        need_string(p["text"], "gemini.part", fw)
        need(role != "user" or p["text"] != "", "gemini.empty_text", fw,
             "a user content's text part must not be empty")
    elif field == "inlineData":
        rule = "gemini.inline_data"
        blob = proto_fields(p["inlineData"], {"mimeType", "data", "displayName"}, rule, fw,
                            required=("mimeType", "data"))
        need_string(blob["mimeType"], rule, f"{fw}.mimeType", nonempty=True)
        raw = proto_bytes(blob["data"])
        need(raw is not None and raw != b"", rule, f"{fw}.data",
             f"must be non-empty base64 (standard or URL-safe), got {str(blob['data'])[:40]!r}")
        need(magic_ok(raw, blob["mimeType"]), rule, f"{fw}.data",
             f"the decoded bytes are not a file of type {blob['mimeType']} (they start "
             f"{raw[:8]!r})")
    elif field == "fileData":
        rule = "gemini.file_data"
        file = proto_fields(p["fileData"], {"fileUri", "mimeType", "displayName"}, rule, fw,
                            required=("fileUri",))
        need(isinstance(file["fileUri"], str) and GEMINI_FILE_URI.match(file["fileUri"]), rule,
             f"{fw}.fileUri", f"must be an https URL or a `files/NAME` URI, got "
             f"{str(file['fileUri'])[:60]!r}")
        if "mimeType" in file:
            need_string(file["mimeType"], rule, f"{fw}.mimeType", nonempty=True)
    elif field == "functionCall":
        need(role == "model", "gemini.function_call_role", fw,
             f"a functionCall part belongs in a model content, not a {role} one")
        rule = "gemini.function_call"
        call = proto_fields(p["functionCall"], {"id", "name", "args", "partialArgs",
                                                "willContinue"}, rule, fw, required=("name",))
        need(isinstance(call["name"], str) and GEMINI_FUNCTION_NAME.match(call["name"]), rule,
             f"{fw}.name", f"{call['name']!r} is not a function name")
        if "args" in call:
            need_object(call["args"], rule, f"{fw}.args")
        p["functionCall"] = call
    else:
        need(role == "user", "gemini.function_response_role", fw,
             f"a functionResponse part belongs in a user content, not a {role} one")
        rule = "gemini.function_response"
        answer = proto_fields(p["functionResponse"], {"id", "name", "response", "willContinue",
                                                      "scheduling", "parts"}, rule, fw,
                              required=("name", "response"))
        need_string(answer["name"], rule, f"{fw}.name", nonempty=True)
        need(isinstance(answer["response"], dict), rule, f"{fw}.response",
             f"must be an object (a google.protobuf.Struct), got {kind(answer['response'])}")
        p["functionResponse"] = answer
    if "thought" in p:
        need(isinstance(p["thought"], bool), "gemini.part", f"{where}.thought", "must be a boolean")
    if "thoughtSignature" in p:
        need(proto_bytes(p["thoughtSignature"]) is not None, "gemini.thought_signature_invalid",
             f"{where}.thoughtSignature",
             f"Invalid thought signature: not base64: {str(p['thoughtSignature'])[:40]!r}")
    return p


def check_gemini_calls(contents):
    """Function calls and their responses: a model content with calls comes right after a user
    content (a prompt or function responses); the very next content is a user content whose
    functionResponse parts answer exactly those calls (by name, any order; by id when the calls
    carry ids); no functionResponse answers anything else."""
    answered = set()  # indexes of contents whose function responses answer the one before
    for i, (role, parts) in enumerate(contents):
        calls = [p["functionCall"] for p in parts if "functionCall" in p]
        if role != "model" or not calls:
            continue
        where = f"contents[{i}]"
        need(i > 0 and contents[i - 1][0] == "user", "gemini.function_call_position", where,
             "a model content with function calls must come right after a user content or a "
             "function-response content")
        names = sorted(c["name"] for c in calls)
        need(i + 1 < len(contents), "gemini.function_responses", "contents",
             f"the conversation ends before the functionResponse parts answering the calls of "
             f"{where} ({', '.join(names)})")
        role_next, parts_next = contents[i + 1]
        answers = [p["functionResponse"] for p in parts_next if "functionResponse" in p]
        need(role_next == "user" and sorted(a["name"] for a in answers) == names,
             "gemini.function_responses", f"contents[{i + 1}]",
             f"must be a user content whose functionResponse parts answer exactly the calls of "
             f"{where} ({', '.join(names)}), got a {role_next} content answering "
             f"[{', '.join(sorted(a['name'] for a in answers))}]")
        ids = sorted(str(c["id"]) for c in calls if "id" in c)
        if ids:
            need(sorted(str(a.get("id")) for a in answers) == ids, "gemini.function_responses",
                 f"contents[{i + 1}]", f"the calls of {where} carry ids {', '.join(ids)}: each "
                 f"functionResponse must carry its call's id, got "
                 f"{', '.join(sorted(str(a.get('id')) for a in answers))}")
        answered.add(i + 1)
    for i, (role, parts) in enumerate(contents):
        if any("functionResponse" in p for p in parts):
            need(i in answered, "gemini.function_responses", f"contents[{i}]",
                 "functionResponse parts answer no function calls of the model content right "
                 "before them")


def check_gemini_signatures(contents, model):
    """Gemini 3's thought signatures. The current turn starts at the last user content holding a
    part that is not a functionResponse; in it, each model content with function calls carries a
    thoughtSignature on its first functionCall part. Every signature sent is one the stub issued
    for this very model, or a documented dummy (compared as bytes)."""
    if not model.startswith("gemini-3"):
        return
    start = max((i for i, (role, parts) in enumerate(contents)
                 if role == "user" and any("functionResponse" not in p for p in parts)), default=0)
    for i in range(start, len(contents)):
        role, parts = contents[i]
        first = next((j for j, p in enumerate(parts) if "functionCall" in p), None)
        if role == "model" and first is not None:
            need("thoughtSignature" in parts[first], "gemini.thought_signature_missing",
                 f"contents[{i}].parts[{first}]",
                 f"Function call `{parts[first]['functionCall']['name']}` (position {first}) is "
                 "missing a thought_signature in functionCall parts. Gemini 3 models need, in "
                 "the current turn, the thoughtSignature the model returned on the first "
                 "functionCall part of each step sent back unchanged")
    for i, (role, parts) in enumerate(contents):
        for j, p in enumerate(parts):
            if "thoughtSignature" not in p:
                continue
            where = f"contents[{i}].parts[{j}].thoughtSignature"
            raw = proto_bytes(p["thoughtSignature"])
            if raw in DUMMY_SIGNATURES:
                continue
            owner = SIGNATURES.issued_for(raw)
            need(owner is None or owner == model, "gemini.thought_signature_model", where,
                 f"the signature was issued by {owner}, and this request is to {model}: thought "
                 "signatures do not carry across models")
            need(owner is not None, "gemini.thought_signature_invalid", where,
                 "Invalid thought signature: the stub never issued these bytes (changed, made "
                 "up, or decoded/encoded as text?); send back the model's signature unchanged, "
                 f"or a documented dummy ({', '.join(SIGNATURE_DUMMIES)})")


def check_gemini(body, model):
    need_object(body, "body.json", "body")
    b = proto_fields(body, GEMINI_PARAMS, "gemini.param", "body")

    names = []
    tools = b.get("tools", [])
    need(isinstance(tools, list), "gemini.tools", "tools", f"must be an array, got {kind(tools)}")
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        need_object(tool, "gemini.tools", where)
        need([camel(k) for k in tool] == ["functionDeclarations"], "gemini.tools", where,
             "each tool here is {functionDeclarations: [...]} (the stub serves function tools "
             f"only), got keys {', '.join(tool) or 'none'}")
        decls = next(iter(tool.values()))
        need(isinstance(decls, list) and decls, "gemini.tools", f"{where}.functionDeclarations",
             "must be a non-empty array of function declarations")
        for j, decl in enumerate(decls):
            dw = f"{where}.functionDeclarations[{j}]"
            d = proto_fields(decl, GEMINI_DECLARATION, "gemini.function_declaration", dw,
                             required=("name",))
            need(isinstance(d["name"], str) and GEMINI_FUNCTION_NAME.match(d["name"]),
                 "gemini.function_name", f"{dw}.name",
                 f"{d['name']!r} must start with a letter or underscore and hold only letters, "
                 "digits, underscores, dots, colons and dashes, 128 at most")
            need(d["name"] not in names, "gemini.function_unique", f"{dw}.name",
                 f"function name {d['name']!r} is declared twice")
            names.append(d["name"])
            given = [k for k in ("parameters", "parametersJsonSchema") if k in d]
            need(len(given) == 1, "gemini.function_parameters", dw,
                 "a declaration takes its parameters as `parameters` (OpenAPI Schema) or "
                 "`parametersJsonSchema` (JSON Schema): one of the two, "
                 + ("not both" if given else "none given"))
            need_object(d[given[0]], "gemini.function_parameters", f"{dw}.{given[0]}")
            if "description" in d:
                need_string(d["description"], "gemini.function_declaration", f"{dw}.description")
    check_gemini_tool_config(body, names)

    if "systemInstruction" in b:
        rule, where = "gemini.system_instruction", "systemInstruction"
        si = proto_fields(b["systemInstruction"], {"parts", "role"}, rule, where,
                          required=("parts",))
        need(isinstance(si["parts"], list) and si["parts"], rule, f"{where}.parts",
             "must be a non-empty array of text parts")
        for j, part in enumerate(si["parts"]):
            p = proto_fields(part, {"text"}, rule, f"{where}.parts[{j}]", required=("text",))
            need_string(p["text"], rule, f"{where}.parts[{j}].text")

    if "generationConfig" in b:
        rule, where = "gemini.generation_config", "generationConfig"
        gc = proto_fields(b["generationConfig"], GEMINI_GENERATION, rule, where)
        if "thinkingConfig" in gc:
            proto_fields(gc["thinkingConfig"], GEMINI_THINKING, rule, f"{where}.thinkingConfig")
        if "stopSequences" in gc:
            need(isinstance(gc["stopSequences"], list) and len(gc["stopSequences"]) <= 5, rule,
                 f"{where}.stopSequences", "must be an array of at most 5 strings")

    contents = b.get("contents")
    need(isinstance(contents, list) and contents, "gemini.contents", "contents",
         "required: a non-empty array of contents")
    parsed = []  # (role, parts by JSON names)
    for i, content in enumerate(contents):
        where = f"contents[{i}]"
        c = proto_fields(content, {"role", "parts"}, "gemini.content", where)
        role = c.get("role")
        need(role in ("user", "model"), "gemini.role", f"{where}.role",
             f"must be \"user\" or \"model\", got {role!r}")
        parts = c.get("parts")
        need(isinstance(parts, list) and parts, "gemini.parts", f"{where}.parts",
             "must be a non-empty array of parts")
        parsed.append((role, [check_gemini_part(p, role, f"{where}.parts[{j}]")
                              for j, p in enumerate(parts)]))
    check_gemini_calls(parsed)
    check_gemini_signatures(parsed, model)


def gemini_contents(body):
    """The contents as (role, parts by JSON names, their functionCall/functionResponse too)."""
    out = []
    for content in body["contents"]:
        c = {camel(k): v for k, v in content.items()}
        parts = []
        for part in c["parts"]:
            p = {camel(k): v for k, v in part.items() if v is not None}
            for key in ("functionCall", "functionResponse"):
                if key in p:
                    p[key] = {camel(k): v for k, v in p[key].items() if v is not None}
            parts.append(p)
        out.append((c["role"], parts))
    return out


def reply_gemini(body, model, served):
    contents = gemini_contents(body)
    role, newest = contents[-1]
    answered = [a["name"] + (f" (id {a['id']})" if "id" in a else "")
                for a in (p["functionResponse"] for p in newest if "functionResponse" in p)]
    declared = gemini_declarations(body)
    callable_ = check_gemini_tool_config(body, [name for name, _ in declared])
    tools = [(name, schema) for name, schema in declared if name in callable_]
    rounds = sum(1 for r, parts in contents if r == "model"
                 and any("functionCall" in p for p in parts))
    key = digest(body["contents"], body.get("tools"), model)
    if answered or not tools:
        parts = [{"text": final_text(answered),
                  "thoughtSignature": SIGNATURES.issue(model, key, "final")}]
    else:
        said = preamble(rounds)
        parts = [] if said is None else [{"text": said}]
        # As the Gemini Developer API: no `id` on the calls; the signature on the first.
        calls = [{"functionCall": {"name": name, "args": canned_arguments(schema)}}
                 for name, schema in pick_tools(tools, rounds)]
        calls[0]["thoughtSignature"] = SIGNATURES.issue(model, key, "call")
        parts += calls
    return {
        "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP",
                        "index": 0}],
        "usageMetadata": usage_gemini(served),
        "modelVersion": model,
        "responseId": key[:22],
    }


def usage_gemini(served):
    total, out = served["input_tokens"], served["output_tokens"]
    usage = {"promptTokenCount": total, "candidatesTokenCount": out,
             "totalTokenCount": total + out}
    if served["read"]:
        usage["cachedContentTokenCount"] = served["read"]
    return usage


# --- Amazon Bedrock (Converse) -----------------------------------------------------------------

# botocore checks the request against the API's shapes (types, required members, enums) before
# it sends; these are the rules it cannot check. On the wire blobs are base64 text.
BEDROCK_PARAMS = {
    "messages", "system", "inferenceConfig", "toolConfig", "guardrailConfig",
    "additionalModelRequestFields", "promptVariables", "additionalModelResponseFieldPaths",
    "requestMetadata", "performanceConfig", "serviceTier", "outputConfig",
}
BEDROCK_BLOCKS = ("text", "image", "document", "toolUse", "toolResult", "cachePoint",
                  "reasoningContent")
BEDROCK_RESULT_BLOCKS = ("text", "image", "document", "json")
BEDROCK_IMAGE_FORMATS = ("png", "jpeg", "gif", "webp")
BEDROCK_DOCUMENT_FORMATS = ("pdf", "csv", "doc", "docx", "xls", "xlsx", "html", "txt", "md")
BEDROCK_DOCUMENT_NAME = re.compile(r"^(?!.*\s\s)[A-Za-z0-9\s()\[\]-]{1,200}$")
BEDROCK_TOOL_USE_ID = re.compile(r"^[a-zA-Z0-9_.:-]{1,64}$")
OLE = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"  # doc, xls
ZIP = b"PK\x03\x04"  # docx, xlsx


def bedrock_blob(value, rule, where):
    """A blob member's bytes: base64 text on the wire (boto3 encodes the raw bytes it is given)."""
    need(isinstance(value, str) and value != "", rule, where,
         f"must be non-empty base64 text, got {kind(value)}")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as e:
        raise Broken(rule, where, f"is not valid base64 ({e}): {value[:40]!r}") from None


def double_encoded(raw, ok):
    """Why bytes fail their check, when they are base64 text of bytes that pass it."""
    inner = proto_bytes(raw.decode("ascii", "replace"))
    if inner is not None and ok(inner):
        return ("; they are base64 TEXT of such a file: the client base64-encoded the file and "
                "boto3 encoded that text again. Pass the raw bytes to boto3")
    return ""


def check_bedrock_image(image, where):
    rule = "bedrock.image"
    need_object(image, rule, where)
    check_keys(image, {"format", "source"}, ["format", "source"], rule, where)
    fmt = image["format"]
    need(fmt in BEDROCK_IMAGE_FORMATS, rule, f"{where}.format",
         f"must be one of {', '.join(BEDROCK_IMAGE_FORMATS)}, got {fmt!r}")
    need_object(image["source"], rule, f"{where}.source")
    check_keys(image["source"], {"bytes"}, ["bytes"], rule, f"{where}.source")
    raw = bedrock_blob(image["source"]["bytes"], "bedrock.image_bytes", f"{where}.source.bytes")
    ok = lambda data: magic_ok(data, f"image/{fmt}")
    need(ok(raw), "bedrock.image_bytes", f"{where}.source.bytes",
         f"the bytes are not a {fmt} image (they start {raw[:8]!r}){double_encoded(raw, ok)}")


def document_ok(raw, fmt):
    if fmt == "pdf":
        return raw.startswith(b"%PDF-")
    if fmt in ("docx", "xlsx"):
        return raw.startswith(ZIP)
    if fmt in ("doc", "xls"):
        return raw.startswith(OLE) or raw.startswith(ZIP)
    return True


def check_bedrock_document(doc, where):
    rule = "bedrock.document"
    need_object(doc, rule, where)
    check_keys(doc, {"format", "name", "source", "context", "citations"}, ["name", "source"],
               rule, where)
    name = doc["name"]
    need(isinstance(name, str) and BEDROCK_DOCUMENT_NAME.match(name) is not None,
         "bedrock.document_name", f"{where}.name",
         f"{name!r}: a document name is 1 to 200 characters: letters, digits, hyphens, "
         "parentheses, square brackets and whitespace, never two whitespace characters in a row")
    need_object(doc["source"], rule, f"{where}.source")
    check_keys(doc["source"], {"bytes", "text"}, [], rule, f"{where}.source")
    need(len(doc["source"]) == 1, rule, f"{where}.source", "needs exactly one of bytes, text")
    if "text" in doc["source"]:
        need_string(doc["source"]["text"], rule, f"{where}.source.text", nonempty=True)
        return
    need("format" in doc, rule, where, "a document sent as bytes needs its format")
    fmt = doc["format"]
    need(fmt in BEDROCK_DOCUMENT_FORMATS, rule, f"{where}.format",
         f"must be one of {', '.join(BEDROCK_DOCUMENT_FORMATS)}, got {fmt!r}")
    raw = bedrock_blob(doc["source"]["bytes"], "bedrock.document_bytes", f"{where}.source.bytes")
    ok = lambda data: document_ok(data, fmt)
    need(ok(raw), "bedrock.document_bytes", f"{where}.source.bytes",
         f"the bytes are not a {fmt} file (they start {raw[:8]!r}){double_encoded(raw, ok)}")


def check_cache_point(value, where, points):
    rule = "bedrock.cache_point"
    need_object(value, rule, where)
    check_keys(value, {"type", "ttl"}, ["type"], rule, where)
    need(value["type"] == "default", rule, f"{where}.type",
         f"must be \"default\", got {value['type']!r}")
    if "ttl" in value:
        need(value["ttl"] in ("5m", "1h"), rule, f"{where}.ttl",
             f"must be \"5m\" or \"1h\", got {value['ttl']!r}")
    points.append(where)
    need(len(points) <= MAX_BREAKPOINTS, "bedrock.cache_points", where,
         f"more than {MAX_BREAKPOINTS} cachePoint blocks in system, toolConfig.tools and "
         f"messages together: {', '.join(points)}")


def one_member(block, allowed, rule, where):
    """A union: exactly one member, one of `allowed`. Returns its name."""
    need_object(block, rule, where)
    members = list(block)
    need(len(members) == 1 and members[0] in allowed, rule, where,
         f"a block holds exactly one of {', '.join(allowed)}, got "
         f"{', '.join(members) or 'none'}")
    return members[0]


def check_bedrock_text(text, where, what="ContentBlock"):
    need_string(text, "bedrock.blank_text", f"{where}.text")
    need(text.strip() != "", "bedrock.blank_text", where,
         f"The text field in the {what} object at {where} is blank. Add text to the text "
         "field, and try again.")


def check_bedrock_block(block, role, where, points):
    """One content block of a message. Returns its member name."""
    member = one_member(block, BEDROCK_BLOCKS, "bedrock.block", where)
    value = block[member]
    mw = f"{where}.{member}"
    if member == "text":
        check_bedrock_text(value, where)
    elif member == "image":
        check_bedrock_image(value, mw)
    elif member == "document":
        check_bedrock_document(value, mw)
    elif member == "cachePoint":
        check_cache_point(value, mw, points)
    elif member == "toolUse":
        need(role == "assistant", "bedrock.block_role", mw,
             "a toolUse block belongs in an assistant message")
        rule = "bedrock.tool_use"
        need_object(value, rule, mw)
        check_keys(value, {"toolUseId", "name", "input", "type"}, ["toolUseId", "name", "input"],
                   rule, mw)
        need(isinstance(value["toolUseId"], str) and BEDROCK_TOOL_USE_ID.match(value["toolUseId"]),
             rule, f"{mw}.toolUseId", f"{value['toolUseId']!r} must match [a-zA-Z0-9_.:-]{{1,64}}")
        need(isinstance(value["name"], str) and TOOL_NAME.match(value["name"]), rule,
             f"{mw}.name", f"{value['name']!r} must match ^[a-zA-Z0-9_-]{{1,64}}$")
        need_object(value["input"], rule, f"{mw}.input")
    elif member == "toolResult":
        need(role == "user", "bedrock.block_role", mw,
             "a toolResult block belongs in a user message")
        rule = "bedrock.tool_result"
        need_object(value, rule, mw)
        check_keys(value, {"toolUseId", "content", "status", "type"}, ["toolUseId", "content"],
                   rule, mw)
        need_string(value["toolUseId"], rule, f"{mw}.toolUseId", nonempty=True)
        if "status" in value:
            need(value["status"] in ("success", "error"), rule, f"{mw}.status",
                 f"must be success or error, got {value['status']!r}")
        need(isinstance(value["content"], list), rule, f"{mw}.content",
             f"must be an array of blocks, got {kind(value['content'])}")
        for k, inner in enumerate(value["content"]):
            iw = f"{mw}.content.{k}"
            im = one_member(inner, BEDROCK_RESULT_BLOCKS, rule, iw)
            if im == "text":
                check_bedrock_text(inner["text"], iw, "ToolResultContentBlock")
            elif im == "image":
                check_bedrock_image(inner["image"], f"{iw}.image")
            elif im == "document":
                check_bedrock_document(inner["document"], f"{iw}.document")
    else:
        need(role == "assistant", "bedrock.block_role", mw,
             "a reasoningContent block belongs in an assistant message")
        rule = "bedrock.reasoning"
        inner = one_member(value, ("reasoningText", "redactedContent"), rule, mw)
        if inner == "reasoningText":
            need_object(value["reasoningText"], rule, f"{mw}.reasoningText")
            check_keys(value["reasoningText"], {"text", "signature"}, ["text"], rule,
                       f"{mw}.reasoningText")
        else:
            bedrock_blob(value["redactedContent"], rule, f"{mw}.redactedContent")
    return member


def check_bedrock_tools(body, points):
    """`toolConfig`: toolSpec and cachePoint entries; `toolChoice` naming a declared tool.
    Returns the tools' names."""
    if "toolConfig" not in body:
        return []
    rule = "bedrock.tool_config"
    config = body["toolConfig"]
    need_object(config, rule, "toolConfig")
    check_keys(config, {"tools", "toolChoice"}, ["tools"], rule, "toolConfig")
    tools = config["tools"]
    need(isinstance(tools, list) and tools, rule, "toolConfig.tools",
         "must be a non-empty array of tools")
    names = []
    for i, tool in enumerate(tools):
        where = f"toolConfig.tools.{i}"
        member = one_member(tool, ("toolSpec", "cachePoint"), rule, where)
        if member == "cachePoint":
            need(i > 0, "bedrock.cache_point_position", where,
                 "a cachePoint marks the end of what comes before it: it cannot be the first tool")
            check_cache_point(tool["cachePoint"], f"{where}.cachePoint", points)
            continue
        spec = tool["toolSpec"]
        sw = f"{where}.toolSpec"
        need_object(spec, "bedrock.tool_spec", sw)
        check_keys(spec, {"name", "description", "inputSchema", "strict"},
                   ["name", "inputSchema"], "bedrock.tool_spec", sw)
        need(isinstance(spec["name"], str) and TOOL_NAME.match(spec["name"]), "bedrock.tool_spec",
             f"{sw}.name", f"tool name {spec['name']!r} must match ^[a-zA-Z0-9_-]{{1,64}}$")
        need(spec["name"] not in names, "bedrock.tool_unique", f"{sw}.name",
             f"tool name {spec['name']!r} is used twice")
        names.append(spec["name"])
        schema = spec["inputSchema"]
        need(isinstance(schema, dict) and list(schema) == ["json"] and isinstance(
            schema["json"], dict), "bedrock.tool_spec", f"{sw}.inputSchema",
             "must be {\"json\": {...}}, a JSON Schema object")
    if "toolChoice" in config:
        choice = config["toolChoice"]
        member = one_member(choice, ("auto", "any", "tool"), "bedrock.tool_choice",
                            "toolConfig.toolChoice")
        if member == "tool":
            need_object(choice["tool"], "bedrock.tool_choice", "toolConfig.toolChoice.tool")
            need(choice["tool"].get("name") in names, "bedrock.tool_choice",
                 "toolConfig.toolChoice.tool.name",
                 f"names {choice['tool'].get('name')!r}, which is not a tool in "
                 f"toolConfig.tools ({', '.join(names)})")
    return names


def check_bedrock_reasoning(messages):
    """reasoningContent blocks sent back are the very ones returned; the assistant message still
    waiting on its tool results keeps them, first, in order."""
    for i, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        blocks = msg["content"]
        reasoning = [b for b in blocks if "reasoningContent" in b]
        uses = [b["toolUse"]["toolUseId"] for b in blocks if "toolUse" in b]
        expected = REASONING.expected(uses)
        where = f"messages.{i}"
        if expected is not None and (reasoning or i == len(messages) - 2):
            need(canon(blocks[: len(expected)]) == canon(expected), "bedrock.reasoning", where,
                 f"the reasoningContent returned with toolUse {', '.join(uses)} must come back "
                 f"unchanged, first in the message: expected {canon(expected)}, got "
                 f"{canon(reasoning)}")
        for b in reasoning:
            need(REASONING.known(b), "bedrock.reasoning", f"{where}.content",
                 f"a reasoningContent block the stub never returned (changed?): {canon(b)}")


REASONING = Thinking()


def check_bedrock(body, model):
    need_object(body, "body.json", "body")
    for key in body:
        need(key in BEDROCK_PARAMS, "bedrock.param", key, "not a Converse parameter")
    need(model != "", "bedrock.param", "modelId", "required")
    points = []  # where each cachePoint is, in request order

    if "system" in body:
        system = body["system"]
        need(isinstance(system, list), "bedrock.system", "system",
             f"must be an array of blocks, got {kind(system)}")
        for i, block in enumerate(system):
            where = f"system.{i}"
            member = one_member(block, ("text", "cachePoint"), "bedrock.system", where)
            if member == "text":
                check_bedrock_text(block["text"], where, "SystemContentBlock")
            else:
                need(i > 0, "bedrock.cache_point_position", where,
                     "a cachePoint marks the end of what comes before it: it cannot be the "
                     "first system block")
                check_cache_point(block["cachePoint"], f"{where}.cachePoint", points)
    check_bedrock_tools(body, points)

    messages = body.get("messages")
    need(isinstance(messages, list) and messages, "bedrock.messages", "messages",
         "required: a non-empty array of messages")
    waiting = set()  # toolUseIds of the previous assistant message
    uses_tools = False
    for i, msg in enumerate(messages):
        where = f"messages.{i}"
        need_object(msg, "bedrock.roles", where)
        check_keys(msg, {"role", "content"}, ["role", "content"], "bedrock.roles", where)
        role = msg["role"]
        need(role in ("user", "assistant"), "bedrock.roles", f"{where}.role",
             f"must be user or assistant, got {role!r}")
        need(i > 0 or role == "user", "bedrock.roles", where,
             "A conversation must start with a user message. Try again with a conversation "
             "that starts with a user message.")
        need(i == 0 or messages[i - 1].get("role") != role, "bedrock.roles", where,
             "A conversation must alternate between user and assistant roles: two "
             f"{role} messages in a row")
        content = msg["content"]
        need(isinstance(content, list) and content, "bedrock.content", f"{where}.content",
             "must be a non-empty array of content blocks")
        members = []
        for j, block in enumerate(content):
            bw = f"{where}.content.{j}"
            member = check_bedrock_block(block, role, bw, points)
            need(member != "cachePoint" or j > 0, "bedrock.cache_point_position", bw,
                 "a cachePoint marks the end of what comes before it: it cannot be the first "
                 "block of a message")
            members.append(member)
        uses_tools = uses_tools or "toolUse" in members or "toolResult" in members
        if role == "user":
            results = [b["toolResult"]["toolUseId"] for b in content if "toolResult" in b]
            for r in results:
                need(r in waiting, "bedrock.tool_results", where,
                     f"toolResult for {r!r} answers no toolUse of the assistant message right "
                     "before it (or answers it twice)")
                waiting.discard(r)
            need(not waiting, "bedrock.tool_results", where,
                 f"The number of toolResult blocks at {where}.content is less than the number "
                 f"of toolUse blocks of the previous turn: no toolResult for "
                 f"{', '.join(sorted(waiting))}")
        else:
            need(not waiting, "bedrock.tool_results", where,
                 f"toolUse {', '.join(sorted(waiting))} got no toolResult before this message")
            ids = [b["toolUse"]["toolUseId"] for b in content if "toolUse" in b]
            need(len(set(ids)) == len(ids), "bedrock.tool_use", where, "a toolUseId is used twice")
            waiting = set(ids)
    need(not waiting, "bedrock.tool_results", "messages",
         f"the conversation ends before the toolResult for {', '.join(sorted(waiting))}")
    need(not uses_tools or "toolConfig" in body, "bedrock.tool_config", "toolConfig",
         "The toolConfig field must be defined when using toolUse and toolResult content blocks.")
    check_bedrock_reasoning(messages)


def reply_bedrock(body, model, served):
    messages = body["messages"]
    last = messages[-1]
    answered = [b["toolResult"]["toolUseId"] for b in last["content"]
                if last["role"] == "user" and "toolResult" in b]
    config = body.get("toolConfig", {})
    specs = [t["toolSpec"] for t in config.get("tools", []) if "toolSpec" in t]
    choice = config.get("toolChoice", {})
    tools = [(s["name"], s["inputSchema"]["json"]) for s in specs
             if "tool" not in choice or s["name"] == choice["tool"]["name"]]
    rounds = sum(1 for m in messages if m["role"] == "assistant"
                 and any("toolUse" in b for b in m["content"]))
    key = digest(messages, body.get("toolConfig"), body.get("system"), model)
    if answered or not tools:
        content = [{"text": final_text(answered)}]
        stop = "end_turn"
    else:
        picked = pick_tools(tools, rounds)
        content = []
        if "anthropic." in model:
            content.append({"reasoningContent": {"reasoningText": {
                "text": f"The user wants something done; {picked[0][0]} should help.",
                "signature": "sig_" + digest("reasoning", key)}}})
        if preamble(rounds) is not None:
            content.append({"text": preamble(rounds)})
        uses = [{"toolUse": {"toolUseId": f"tooluse_{key[:20]}_{n}", "name": name,
                             "input": canned_arguments(schema)}}
                for n, (name, schema) in enumerate(picked)]
        content += uses
        REASONING.remember([u["toolUse"]["toolUseId"] for u in uses],
                           [b for b in content if "reasoningContent" in b])
        stop = "tool_use"
    return {
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": stop,
        "usage": usage_bedrock(served),
        "metrics": {"latencyMs": 1},
    }


def usage_bedrock(served):
    total, out = served["input_tokens"], served["output_tokens"]
    usage = {"inputTokens": served["uncached"], "outputTokens": out,
             "totalTokens": total + out, "cacheReadInputTokens": served["read"],
             "cacheWriteInputTokens": served["written_5m"] + served["written_1h"]}
    details = [{"ttl": ttl, "inputTokens": served[f"written_{ttl}"]} for ttl in ("5m", "1h")
               if served[f"written_{ttl}"]]
    if details:
        usage["cacheDetails"] = details
    return usage


# --- Streamed replies --------------------------------------------------------------------------

ARGUMENT_PIECE = 8  # characters of a tool call's JSON arguments per streamed fragment


def text_pieces(text):
    """`text` as a model streams it: word by word, each word with the whitespace before it."""
    return re.findall(r"\s*\S+|\s+$", text)


def json_pieces(text):
    """A tool call's JSON arguments in fragments that are not JSON on their own."""
    return [text[i:i + ARGUMENT_PIECE] for i in range(0, len(text), ARGUMENT_PIECE)]


def sse_data(value):
    """One Chat Completions frame: `data: {json}`, then the blank line."""
    return b"data: " + json.dumps(value).encode() + b"\n\n"


def sse_event(name, value):
    """One named frame, as Responses and Messages send them."""
    return f"event: {name}\ndata: ".encode() + json.dumps(value).encode() + b"\n\n"


def stream_chat(body, answer):
    """The frames of `answer` (reply_chat's) streamed as Chat Completions does: a role chunk;
    the text word by word; each tool call's first fragment with index, id, type, name and empty
    arguments, the arguments after it in fragments holding only index and the piece, parallel
    calls interleaved by index; a chunk with finish_reason; the usage chunk (`choices: []`) only
    with `stream_options.include_usage`, when every other chunk carries `usage: null`;
    `data: [DONE]`."""
    with_usage = (body.get("stream_options") or {}).get("include_usage") is True
    choice = answer["choices"][0]
    message = choice["message"]
    head = {"id": answer["id"], "object": "chat.completion.chunk", "created": answer["created"],
            "model": answer["model"], "service_tier": answer["service_tier"],
            "system_fingerprint": answer["system_fingerprint"]}

    def chunk(delta, finish=None):
        value = dict(head, choices=[{"index": 0, "delta": delta, "logprobs": None,
                                     "finish_reason": finish}])
        if with_usage:
            value["usage"] = None
        return sse_data(value)

    # A reply of tool calls alone has content null from its first chunk on, as the API's does.
    frames = [chunk({"role": "assistant",
                     "content": None if message["content"] is None else "", "refusal": None})]
    frames += [chunk({"content": piece}) for piece in text_pieces(message["content"] or "")]
    calls = message.get("tool_calls") or []
    fragments = [
        [{"index": n, "id": c["id"], "type": "function",
          "function": {"name": c["function"]["name"], "arguments": ""}}]
        + [{"index": n, "function": {"arguments": piece}}
           for piece in json_pieces(c["function"]["arguments"])]
        for n, c in enumerate(calls)]
    for step in range(max((len(f) for f in fragments), default=0)):
        frames += [chunk({"tool_calls": [f[step]]}) for f in fragments if step < len(f)]
    frames.append(chunk({}, choice["finish_reason"]))
    if with_usage:
        frames.append(sse_data(dict(head, choices=[], usage=answer["usage"])))
    frames.append(b"data: [DONE]\n\n")
    return frames


def stream_responses(body, answer):
    """The frames of `answer` (reply_responses') as Responses streams it, each with its
    sequence_number: response.created and response.in_progress (the response in progress, no
    output, no usage); per output item its added event, a message's content part added, its
    text in output_text.delta pieces, output_text.done, content_part.done, a function call's
    arguments in function_call_arguments.delta pieces and .done, the item's done event;
    response.completed with the whole response, as the unstreamed reply has it."""
    frames = []

    def emit(name, **fields):
        frames.append(sse_event(name, {"type": name, "sequence_number": len(frames), **fields}))

    started = dict(answer, status="in_progress", output=[], usage=None)
    emit("response.created", response=started)
    emit("response.in_progress", response=started)
    for i, item in enumerate(answer["output"]):
        if item["type"] == "message":
            emit("response.output_item.added", output_index=i,
                 item=dict(item, status="in_progress", content=[]))
            for j, part in enumerate(item["content"]):
                at = {"item_id": item["id"], "output_index": i, "content_index": j}
                emit("response.content_part.added", **at, part=dict(part, text=""))
                for piece in text_pieces(part["text"]):
                    emit("response.output_text.delta", **at, delta=piece, logprobs=[])
                emit("response.output_text.done", **at, text=part["text"], logprobs=[])
                emit("response.content_part.done", **at, part=part)
        else:
            emit("response.output_item.added", output_index=i,
                 item=dict(item, arguments="", status="in_progress"))
            for piece in json_pieces(item["arguments"]):
                emit("response.function_call_arguments.delta", item_id=item["id"],
                     output_index=i, delta=piece)
            emit("response.function_call_arguments.done", item_id=item["id"], output_index=i,
                 arguments=item["arguments"])
        emit("response.output_item.done", output_index=i, item=item)
    emit("response.completed", response=answer)
    return frames


def stream_gemini(answer):
    """The chunks of `answer` (reply_gemini's) as streamGenerateContent sends them (see the
    docstring): GenerateContentResponse values, one part each, usage cumulative on each."""
    candidate = answer["candidates"][0]
    usage = answer["usageMetadata"]
    pieces = []
    for part in candidate["content"]["parts"]:
        if "text" not in part:
            pieces.append(part)  # a function call comes whole
            continue
        words = text_pieces(part["text"]) or [""]
        for j, word in enumerate(words):
            piece = {"text": word}
            if j == len(words) - 1 and "thoughtSignature" in part:
                piece["thoughtSignature"] = part["thoughtSignature"]
            pieces.append(piece)
    chunks = []
    for i, piece in enumerate(pieces):
        so_far = max(1, usage["candidatesTokenCount"] * (i + 1) // len(pieces))
        cand = {"content": {"role": "model", "parts": [piece]}, "index": 0}
        if i == len(pieces) - 1:
            cand["finishReason"] = candidate["finishReason"]
        chunks.append({"candidates": [cand],
                       "usageMetadata": dict(usage, candidatesTokenCount=so_far,
                                             totalTokenCount=usage["promptTokenCount"] + so_far),
                       "modelVersion": answer["modelVersion"],
                       "responseId": answer["responseId"]})
    return chunks


def gemini_frames(chunks):
    return [b"data: " + json.dumps(c).encode() + b"\r\n\r\n" for c in chunks]


def eventstream_frame(headers, payload):
    """One AWS event-stream message: prelude (total length, headers length, both u32
    big-endian, and their CRC32), string headers (type 7), the payload, the CRC32 of all
    before it."""
    head = b"".join(bytes([len(n)]) + n.encode() + b"\x07" + struct.pack(">H", len(v)) +
                    v.encode() for n, v in headers)
    prelude = struct.pack(">II", 16 + len(head) + len(payload), len(head))
    out = prelude + struct.pack(">I", zlib.crc32(prelude)) + head + payload
    return out + struct.pack(">I", zlib.crc32(out))


def bedrock_event(kind_, value):
    return eventstream_frame([(":event-type", kind_), (":content-type", "application/json"),
                              (":message-type", "event")], json.dumps(value).encode())


def stream_bedrock(answer):
    """The frames of `answer` (reply_bedrock's) as converse-stream sends them: messageStart;
    per block contentBlockStart (tool uses only: id and name), deltas (text word by word, a
    tool use's input JSON in pieces, reasoning text then its signature), contentBlockStop;
    messageStop with the stopReason; metadata with the usage and metrics."""
    frames = [bedrock_event("messageStart", {"role": "assistant"})]
    for i, block in enumerate(answer["output"]["message"]["content"]):
        if "toolUse" in block:
            use = block["toolUse"]
            frames.append(bedrock_event("contentBlockStart", {"contentBlockIndex": i, "start": {
                "toolUse": {"toolUseId": use["toolUseId"], "name": use["name"]}}}))
            for piece in json_pieces(json.dumps(use["input"])):
                frames.append(bedrock_event("contentBlockDelta", {"contentBlockIndex": i,
                                                                  "delta": {"toolUse": {"input": piece}}}))
        elif "reasoningContent" in block:
            text = block["reasoningContent"]["reasoningText"]
            for word in text_pieces(text["text"]):
                frames.append(bedrock_event("contentBlockDelta", {"contentBlockIndex": i, "delta": {
                    "reasoningContent": {"text": word}}}))
            frames.append(bedrock_event("contentBlockDelta", {"contentBlockIndex": i, "delta": {
                "reasoningContent": {"signature": text["signature"]}}}))
        else:
            for word in text_pieces(block["text"]) or [""]:
                frames.append(bedrock_event("contentBlockDelta", {"contentBlockIndex": i,
                                                                  "delta": {"text": word}}))
        frames.append(bedrock_event("contentBlockStop", {"contentBlockIndex": i}))
    frames.append(bedrock_event("messageStop", {"stopReason": answer["stopReason"]}))
    frames.append(bedrock_event("metadata", {"usage": answer["usage"],
                                             "metrics": answer["metrics"]}))
    return frames


def stream_messages(body, answer):
    """The frames of `answer` (reply_messages') as Messages streams it: message_start (no
    content, the input and cache usage, output_tokens 1); per block content_block_start (empty;
    redacted_thinking whole), its deltas (text_delta, thinking_delta then one signature_delta,
    input_json_delta with partial_json pieces) and content_block_stop, a ping after the first
    start; message_delta with the stop reason and the cumulative usage; message_stop."""
    usage = answer["usage"]
    started = dict(answer, content=[], stop_reason=None, stop_sequence=None,
                   usage={"input_tokens": usage["input_tokens"],
                          "cache_creation_input_tokens": usage["cache_creation_input_tokens"],
                          "cache_read_input_tokens": usage["cache_read_input_tokens"],
                          "cache_creation": usage["cache_creation"], "output_tokens": 1})
    frames = [sse_event("message_start", {"type": "message_start", "message": started})]

    def delta(i, value):
        frames.append(sse_event("content_block_delta",
                                {"type": "content_block_delta", "index": i, "delta": value}))

    for i, block in enumerate(answer["content"]):
        empty = {"text": {"type": "text", "text": ""},
                 "thinking": {"type": "thinking", "thinking": "", "signature": ""},
                 "tool_use": {"type": "tool_use", "id": block.get("id"),
                              "name": block.get("name"), "input": {}},
                 }.get(block["type"], block)
        frames.append(sse_event("content_block_start", {"type": "content_block_start",
                                                        "index": i, "content_block": empty}))
        if i == 0:
            frames.append(sse_event("ping", {"type": "ping"}))
        if block["type"] == "text":
            for piece in text_pieces(block["text"]):
                delta(i, {"type": "text_delta", "text": piece})
        elif block["type"] == "thinking":
            for piece in text_pieces(block["thinking"]):
                delta(i, {"type": "thinking_delta", "thinking": piece})
            delta(i, {"type": "signature_delta", "signature": block["signature"]})
        elif block["type"] == "tool_use":
            for piece in json_pieces(json.dumps(block["input"])):
                delta(i, {"type": "input_json_delta", "partial_json": piece})
        frames.append(sse_event("content_block_stop", {"type": "content_block_stop", "index": i}))
    frames.append(sse_event("message_delta", {
        "type": "message_delta",
        "delta": {"stop_reason": answer["stop_reason"], "stop_sequence": answer["stop_sequence"]},
        "usage": {"input_tokens": usage["input_tokens"],
                  "cache_creation_input_tokens": usage["cache_creation_input_tokens"],
                  "cache_read_input_tokens": usage["cache_read_input_tokens"],
                  "output_tokens": usage["output_tokens"]}}))
    frames.append(sse_event("message_stop", {"type": "message_stop"}))
    return frames


FAULTS = ("status-500", "status-429", "hang", "reset", "midstream-error", "invalid-sse", "slow",
          "drip", "tool-loop")
# The request being answered, per handler thread: what a reply function reads of its fault.
REQUEST = threading.local()


def tool_loop():
    """Whether the request being answered carries `x-stub-fault: tool-loop`."""
    return getattr(REQUEST, "fault", None) == "tool-loop"
FAULT_FRAMES = 4  # frames a midstream-error or invalid-sse stream sends before it fails
SLOW_S = 2
DRIP_S = 0.5  # between a drip stream's frames
GARBAGE = b"<html>stub invalid-sse garbage, not an event stream</html>\n"
OVERLOADED = {"type": "error", "error": {"type": "overloaded_error",
                                         "message": "Overloaded (x-stub-fault: midstream-error)"}}


def fault_reply(provider, status):
    """The provider's own 500 or 429 error: (body, extra headers)."""
    busy = status == 429
    headers = {"retry-after": "1"} if busy else {}
    note = f" (x-stub-fault: status-{status})"
    if provider == "anthropic":
        kind_, message = (("rate_limit_error", "This request would exceed your rate limit.")
                          if busy else ("api_error", "Internal server error"))
        return {"type": "error", "error": {"type": kind_, "message": message + note}}, headers
    if provider == "gemini":
        return {"error": {"code": status, "message": (
            "Resource has been exhausted (e.g. check quota)." if busy
            else "Internal error encountered.") + note,
            "status": "RESOURCE_EXHAUSTED" if busy else "INTERNAL"}}, headers
    if provider == "bedrock":
        kind_, message = (("ThrottlingException", "Too many requests, please wait before trying "
                           "again.") if busy else ("InternalServerException",
                                                   "The server encountered an internal error."))
        return {"message": message + note}, dict(headers, **{"x-amzn-ErrorType": kind_})
    if busy:
        return {"error": {"message": "Rate limit reached for requests." + note,
                          "type": "requests", "param": None, "code": "rate_limit_exceeded"}}, headers
    return {"error": {"message": "The server had an error while processing your request. Sorry "
                                 "about that!" + note,
                      "type": "server_error", "param": None, "code": None}}, headers


# Per route: the frames of its reply to a body with `"stream": true`.
STREAMS = {
    "/v1/chat/completions": stream_chat,
    "/v1/responses": stream_responses,
    "/v1/messages": stream_messages,
}


# --- Prompt caches -----------------------------------------------------------------------------

OUTPUT_TOKENS = 12
FIVE_MINUTES_MS = 5 * 60 * 1000
DAY_MS = 24 * 60 * 60 * 1000
# OpenAI's prompt-caching guide: the models that offer both retentions (a dated snapshot is its
# model); gpt-5.5 and later offer only 24h; the others only in_memory.
RETENTION_BOTH = {
    "gpt-5.4", "gpt-5.3-codex", "gpt-5.2", "gpt-5.1-codex-max", "gpt-5.1", "gpt-5.1-codex",
    "gpt-5.1-codex-mini", "gpt-5.1-chat-latest", "gpt-5.1-chat", "gpt-5", "gpt-5-codex",
    "gpt-4.1",
}


def retention_offer(model):
    """'both', '24h' or 'in_memory': what OpenAI's guide lists for `model`."""
    m = re.sub(r"-\d{4}-\d{2}-\d{2}$", "", model.strip().lower())
    if m in RETENTION_BOTH:
        return "both"
    minor = re.match(r"gpt-5\.(\d+)", m)
    major = re.match(r"gpt-(\d+)", m)
    if (minor and int(minor.group(1)) >= 5) or (major and int(major.group(1)) >= 6):
        return "24h"
    return "in_memory"


def check_retention(body):
    """`prompt_cache_retention`, when present: in_memory or 24h, and one the model offers.
    Returns the retention the request is served under."""
    offer = retention_offer(body["model"])
    asked = body.get("prompt_cache_retention")
    if asked is None:
        return "in_memory" if offer == "in_memory" else "24h"
    need(asked in ("in_memory", "24h"), "param.prompt_cache_retention", "prompt_cache_retention",
         f"must be in_memory or 24h, got {asked!r}")
    need(offer in ("both", asked), "param.prompt_cache_retention", "prompt_cache_retention",
         f"model {body['model']} is compatible only with {offer} prompt caching")
    return asked
ONE_HOUR_MS = 60 * 60 * 1000
LOOKBACK = 20  # blocks Anthropic looks back from a breakpoint for an earlier cache entry
OPENAI_MINIMUM = 1024
OPENAI_STEP = 128
OPENAI_ROUTE_TOKENS = 256  # the prefix OpenAI routes a request by
OPENAI_WINDOW_MS = 60_000
OPENAI_PER_MACHINE = 15  # requests a minute one machine takes for a route
LEDGER_MAX = 100_000
PRUNE_EVERY = 1000  # requests between drops of expired cache entries


def now_ms(headers):
    """"Now" for the caches: the test's `X-Stub-Now-Ms` header, else the monotonic clock."""
    value = headers.get("X-Stub-Now-Ms")
    if value is None:
        return int(time.monotonic() * 1000)
    need(re.fullmatch(r"-?[0-9]+", value.strip()) is not None, "stub.now", "X-Stub-Now-Ms",
         f"must be an integer number of milliseconds, got {value!r}")
    return int(value.strip())


def strip_cache_control(value):
    """`value` without any `cache_control` key, at any depth."""
    if isinstance(value, dict):
        return {k: strip_cache_control(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [strip_cache_control(v) for v in value]
    return value


def cache_controls(value):
    """The `cache_control` objects in `value`, at any depth, in document order."""
    found = []
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "cache_control" and isinstance(v, dict):
                found.append(v)
            else:
                found += cache_controls(v)
    elif isinstance(value, list):
        for v in value:
            found += cache_controls(v)
    return found


def prompt_tools(tools):
    """The tools as the prompt holds them: a deferred tool is not in it (tool search finds it),
    and a namespace shows its name and description only."""
    out = []
    for tool in tools:
        if isinstance(tool, dict) and tool.get("defer_loading") is True:
            continue
        if isinstance(tool, dict) and tool.get("type") == "namespace":
            tool = {k: v for k, v in tool.items() if k != "tools"}
        out.append(tool)
    return out


def cache_blocks(api, body, model):
    """The request as its prompt cache reads it, in the provider's order: the model, then the
    tools, then the instructions or system prompt, then each message or input item."""
    if api == "gemini":
        blocks = [model, *(decl for tool in body.get("tools", []) for decl in next(iter(
            tool.values())))]
        si = {camel(k): v for k, v in body.items()}.get("systemInstruction")
        return blocks + ([si] if si is not None else []) + body["contents"]
    blocks = [model, *prompt_tools(body.get("tools", []))]
    if api == "/v1/chat/completions":
        blocks += body["messages"]
    elif api == "/v1/responses":
        if "instructions" in body:
            blocks.append(body["instructions"])
        items = body["input"]
        blocks += items if isinstance(items, list) else [items]
    else:
        if "system" in body:
            blocks.append(body["system"])
        blocks += body["messages"]
    return blocks


def bedrock_prompt(body, model):
    """A Converse request as its cache reads it: the model, each toolSpec, `system` (one block),
    each message, every cachePoint left out; a cachePoint marks the end of the block before it
    (the tool before it, the system, its message) as a breakpoint with its TTL."""
    blocks, marks = [model], {}

    def mark(point):
        ttl = ONE_HOUR_MS if point.get("ttl") == "1h" else FIVE_MINUTES_MS
        marks[len(blocks) - 1] = max(marks.get(len(blocks) - 1, 0), ttl)

    for tool in body.get("toolConfig", {}).get("tools", []):
        if "cachePoint" in tool:
            mark(tool["cachePoint"])
        else:
            blocks.append(tool)
    system = [b for b in body.get("system", []) if "cachePoint" not in b]
    if system:
        blocks.append(system)
    for point in (b["cachePoint"] for b in body.get("system", []) if "cachePoint" in b):
        mark(point)
    for msg in body["messages"]:
        blocks.append({"role": msg["role"],
                       "content": [b for b in msg["content"] if "cachePoint" not in b]})
        for point in (b["cachePoint"] for b in msg["content"] if "cachePoint" in b):
            mark(point)
    return Prompt(blocks, sorted(marks.items()))


class Prompt:
    """A request's blocks as the cache sees them: `ends[i]`, the tokens of the prefix through
    block i; `hashes[i]`, that prefix's identity (a hash chain of the blocks' sha256 over
    canonical JSON, cache_control removed); `breakpoints`, (block index, TTL ms) of the first
    MAX_BREAKPOINTS blocks holding a cache_control (Anthropic's; the model is never one), or
    as given (Bedrock's cachePoints, the blocks then taken as they are)."""

    def __init__(self, blocks, breakpoints=None):
        self.ends, self.hashes, self.breakpoints = [], [], []
        total, chain = 0, ""
        for i, block in enumerate(blocks):
            text = canon(strip_cache_control(block) if breakpoints is None else block)
            total += 0 if i == 0 else len(text) // 4
            identity = hashlib.sha256(text.encode()).hexdigest()
            chain = hashlib.sha256((chain + identity).encode()).hexdigest()
            self.ends.append(total)
            self.hashes.append(chain)
            marks = cache_controls(block) if i > 0 and breakpoints is None else []
            if marks and len(self.breakpoints) < MAX_BREAKPOINTS:
                long_ = any(m.get("ttl") == "1h" for m in marks)
                self.breakpoints.append((i, ONE_HOUR_MS if long_ else FIVE_MINUTES_MS))
        if breakpoints is not None:
            self.breakpoints = list(breakpoints)

    @property
    def total(self):
        return self.ends[-1]

    def through(self, i):
        """Tokens of the prefix through block i (i = -1: the empty prefix)."""
        return self.ends[i] if i >= 0 else 0


def anthropic_minimum(model):
    """The shortest prefix, in tokens, Anthropic caches for `model` (a Bedrock modelId too)."""
    if any(m in model for m in ("opus-4-5", "opus-4-6", "opus-4-7", "haiku-4-5")):
        return 4096
    return 2048 if "haiku" in model else 1024


def gemini_minimum(model):
    """The shortest prefix, in tokens, Gemini's implicit cache reads for `model`."""
    return 4096 if "pro" in model else 1024


class Caches:
    """The providers' prompt caches as this stub models them, and the ledger of what each
    accepted request read and wrote. One lock guards it all (the server is threaded)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.clear()

    def clear(self):
        self.anthropic = {}  # (model, prefix hash) -> [expiry ms, ttl ms]
        self.bedrock = {}  # the same, for Converse
        self.gemini = {}  # (model, prefix hash) -> expiry ms
        self.openai = {path: {} for path in ("/v1/chat/completions", "/v1/responses")}
        # ^ per route: (route key, machine, model, prefix hash) -> expiry ms
        self.recent = {path: {} for path in self.openai}  # route key -> request times (ms)
        self.ledger = collections.deque(maxlen=LEDGER_MAX)
        self.served = 0

    def prune(self, now):
        """Drops expired entries, and routes with no request in the last minute."""
        self.anthropic = {k: v for k, v in self.anthropic.items() if v[0] >= now}
        self.bedrock = {k: v for k, v in self.bedrock.items() if v[0] >= now}
        self.gemini = {k: v for k, v in self.gemini.items() if v >= now}
        for path in self.openai:
            self.openai[path] = {k: v for k, v in self.openai[path].items() if v >= now}
            self.recent[path] = {r: ts for r, ts in self.recent[path].items()
                                 if ts[-1] > now - OPENAI_WINDOW_MS}

    def reset(self):
        with self.lock:
            self.clear()

    def requests(self):
        with self.lock:
            return list(self.ledger)

    def serve(self, api, path, body, model, now):
        """Looks the request up in its API's cache, writes what it may, appends its ledger
        entry and returns it (the reply's usage is built from it). `api` is the route's path,
        or "gemini" or "bedrock" for the routes whose path names the model."""
        if api == "bedrock":
            prompt = bedrock_prompt(body, model)
        else:
            prompt = Prompt(cache_blocks(api, body, model))
        with self.lock:
            key, machine = None, None
            if api == "/v1/messages":
                read, w5, w1h = self.serve_explicit(self.anthropic, prompt, model, now)
            elif api == "bedrock":
                read, w5, w1h = self.serve_explicit(self.bedrock, prompt, model, now)
            elif api == "gemini":
                read, w5, w1h = self.serve_gemini(prompt, model, now), 0, 0
            else:
                key = body.get("prompt_cache_key")
                ttl = DAY_MS if check_retention(body) == "24h" else FIVE_MINUTES_MS
                read, machine = self.serve_openai(api, prompt, model, key, now, ttl)
                w5 = w1h = 0
            entry = {"path": path, "model": model, "now_ms": now, "input_tokens": prompt.total,
                     "read": read, "written_5m": w5, "written_1h": w1h,
                     "uncached": prompt.total - read - w5 - w1h, "output_tokens": OUTPUT_TOKENS,
                     "prompt_cache_key": key, "machine": machine}
            self.ledger.append(entry)
            self.served += 1
            if self.served % PRUNE_EVERY == 0:
                self.prune(now)
            return entry

    def serve_explicit(self, cache, prompt, model, now):
        """Explicit breakpoints (Anthropic's, and Bedrock's cachePoints): the longest live entry
        at a breakpoint, or up to LOOKBACK blocks before one, is read (and refreshed, with every
        live entry at a shorter prefix of it); then each breakpoint past it is written, the
        tokens since the last covered one counted at its TTL. Returns (read, 5m, 1h)."""
        minimum = anthropic_minimum(model)
        candidates = sorted({j for p, _ in prompt.breakpoints
                             for j in range(max(0, p - LOOKBACK), p + 1)}, reverse=True)
        covered = -1
        for j in candidates:
            entry = cache.get((model, prompt.hashes[j]))
            if prompt.ends[j] >= minimum and entry is not None and entry[0] >= now:
                covered = j
                break
        # A read uses every block up to it: each live entry at a shorter prefix (a breakpoint
        # an earlier request wrote) is refreshed with the one read.
        for k in range(covered + 1):
            entry = cache.get((model, prompt.hashes[k]))
            if entry is not None and entry[0] >= now:
                entry[0] = now + entry[1]
        read = prompt.through(covered)
        written = {FIVE_MINUTES_MS: 0, ONE_HOUR_MS: 0}
        for p, ttl in prompt.breakpoints:
            if prompt.ends[p] >= minimum and p > covered:
                cache[(model, prompt.hashes[p])] = [now + ttl, ttl]
                written[ttl] += prompt.ends[p] - prompt.through(covered)
                covered = p
        return read, written[FIVE_MINUTES_MS], written[ONE_HOUR_MS]

    def serve_gemini(self, prompt, model, now):
        """Implicit caching: the longest prefix, ending at a block boundary, of at least the
        model's minimum that an earlier request to the model wrote and that is still live is
        read; every such prefix of the request is written (a hit's refreshed) for 5 minutes.
        Returns the read."""
        minimum = gemini_minimum(model)
        read = 0
        for i in reversed(range(len(prompt.ends))):
            if prompt.ends[i] < minimum:
                break
            if self.gemini.get((model, prompt.hashes[i]), now - 1) >= now:
                read = prompt.ends[i]
                break
        for i, end in enumerate(prompt.ends):
            if end >= minimum:
                self.gemini[(model, prompt.hashes[i])] = now + FIVE_MINUTES_MS
        return read

    def serve_openai(self, path, prompt, model, key, now, ttl):
        """Automatic caching: the request is routed by its first OPENAI_ROUTE_TOKENS tokens and
        `prompt_cache_key` to a machine (a new one for each OPENAI_PER_MACHINE requests a
        minute on the route); the longest live prefix of at least OPENAI_MINIMUM tokens ending
        at a block boundary is read there, in OPENAI_STEP steps, and every such prefix of the
        request is written for `ttl` ms. Returns (read, machine)."""
        first = next((i for i, end in enumerate(prompt.ends) if end >= OPENAI_ROUTE_TOKENS),
                     len(prompt.ends) - 1)
        route = digest(prompt.hashes[first], key if key is not None else "")
        recent = self.recent[path]
        times = [t for t in recent.get(route, []) if t > now - OPENAI_WINDOW_MS]
        machine = sum(1 for t in times if t <= now) // OPENAI_PER_MACHINE
        times.append(now)
        recent[route] = times
        cache = self.openai[path]
        read = 0
        for i in reversed(range(len(prompt.ends))):
            if prompt.ends[i] < OPENAI_MINIMUM:
                break
            if cache.get((route, machine, model, prompt.hashes[i]), now - 1) >= now:
                read = prompt.ends[i] // OPENAI_STEP * OPENAI_STEP
                break
        for i, end in enumerate(prompt.ends):
            if end >= OPENAI_MINIMUM:
                cache[(route, machine, model, prompt.hashes[i])] = now + ttl
        return read, machine


CACHES = Caches()


ROUTES = {
    "/v1/chat/completions": ("openai", check_chat, reply_chat),
    "/v1/responses": ("openai", check_responses, reply_responses),
    "/v1/messages": ("anthropic", check_messages, reply_messages),
}
# Routes whose path names the model: pattern -> (provider, check(body, model),
# reply(body, model, served)). google-genai 3.6.1 calls /v1/ by default, the REST docs /v1beta/;
# boto3 URL-encodes the modelId (`:` as %3A).
MODEL_ROUTES = {
    re.compile(r"^/v1(?:beta)?/models/([^/:]+):(?:generateContent|streamGenerateContent)$"):
        ("gemini", check_gemini, reply_gemini),
    re.compile(r"^/model/([^/]+)/converse(?:-stream)?$"): ("bedrock", check_bedrock, reply_bedrock),
}


def resolve(path):
    """(provider, api, model or None, check(body), reply(body, served)) for a POST path, or
    None. `api` names the cache: the path itself for the fixed routes."""
    if path in ROUTES:
        provider, check, reply = ROUTES[path]
        return provider, path, None, check, reply
    for pattern, (provider, check, reply) in MODEL_ROUTES.items():
        m = pattern.match(path)
        if m is not None:
            model = urllib.parse.unquote(m.group(1))
            return (provider, provider, model, lambda body: check(body, model),
                    lambda body, served: reply(body, model, served))
    return None


def error_reply(provider, status, message, where, rule):
    """The provider's error: (body, extra headers)."""
    if provider == "anthropic":
        return {"type": "error", "error": {"type": "invalid_request_error", "message": message}}, {}
    if provider == "gemini":
        return {"error": {"code": status, "message": message,
                          "status": "INVALID_ARGUMENT" if status == 400 else "INTERNAL"}}, {}
    if provider == "bedrock":
        # botocore raises the exception the header names, carrying `message`.
        kind_ = "ValidationException" if status == 400 else "InternalServerException"
        return {"message": message}, {"x-amzn-ErrorType": kind_}
    return {"error": {"message": message, "type": "invalid_request_error", "param": where,
                      "code": rule}}, {}


CAPTURE_MAX = 1000


class Capture:
    """The last CAPTURE_MAX requests as they came (the stub's own /stub/ routes left out):
    method, request target, every header in order with its name as sent, and the body."""

    def __init__(self):
        self.lock = threading.Lock()
        self.kept = collections.deque(maxlen=CAPTURE_MAX)

    def add(self, handler, raw):
        entry = {"method": handler.command, "path": handler.path,
                 "headers": [[name, value] for name, value in handler.headers.raw_items()],
                 "body_b64": base64.b64encode(raw).decode("ascii")}
        with self.lock:
            self.kept.append(entry)

    def reset(self):
        with self.lock:
            self.kept.clear()

    def requests(self):
        with self.lock:
            return list(self.kept)


CAPTURE = Capture()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    log_file = None

    def read_body(self):
        """The request body: Content-Length bytes, or a chunked body decoded."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def do_POST(self):
        path = self.path.split("?", 1)[0]
        raw = self.read_body()
        if path == "/stub/reset":
            CACHES.reset()
            CAPTURE.reset()
            self.send(200, {})
            return
        if not path.startswith("/stub/"):
            CAPTURE.add(self, raw)
        if path == "/v1/messages/count_tokens":
            self.count_tokens(path, raw)
            return
        route = resolve(path)
        if route is None:
            self.send(404, {"error": {"message": f"no route {path}", "type": "not_found"}})
            return
        provider, api, model, check, reply = route
        fault = self.headers.get("x-stub-fault")
        if fault is not None:
            fault = fault.strip()
            if self.early_fault(provider, path, fault, raw):
                return
        try:
            try:
                body = json.loads(raw)
            except ValueError as e:
                raise Broken("body.json", "body", f"not JSON: {e}") from None
            check(body)
            served = CACHES.serve(api, path, body, body["model"] if model is None else model,
                                  now_ms(self.headers))
            REQUEST.fault = fault
            answer = reply(body, served)
        except Broken as e:
            self.record(path, 400, str(e), raw)
            self.send(400, *error_reply(provider, 400, str(e), e.where, e.rule))
            return
        except Exception:  # a stub bug must fail the run, never pass a body unchecked
            detail = traceback.format_exc()
            self.record(path, 500, detail, raw)
            self.send(500, *error_reply(provider, 500, f"stub error: {detail}", None,
                                        "stub.error"))
            return
        self.record(path, 200, None, raw)
        if api in STREAMS and body.get("stream") is True:
            self.stream(STREAMS[api](body, answer), provider, fault)
        elif provider == "gemini" and path.endswith(":streamGenerateContent"):
            chunks = stream_gemini(answer)
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
            if query.get("alt") == ["sse"]:
                self.stream(gemini_frames(chunks), provider, fault)
            else:
                self.send(200, chunks, fault=fault)
        elif provider == "bedrock" and path.endswith("/converse-stream"):
            self.stream(stream_bedrock(answer), provider, fault,
                        "application/vnd.amazon.eventstream")
        else:
            self.send(200, answer, fault=fault)

    def count_tokens(self, path, raw):
        """Anthropic's token count: the body a Messages request would be (`max_tokens` not
        required), checked by the same rules, answered with its input tokens as that request
        would count them; no cache is read or written."""
        try:
            try:
                body = json.loads(raw)
            except ValueError as e:
                raise Broken("body.json", "body", f"not JSON: {e}") from None
            check_messages(dict(body, max_tokens=1) if isinstance(body, dict) else body)
            total = Prompt(cache_blocks("/v1/messages", body, body["model"])).total
        except Broken as e:
            self.record(path, 400, str(e), raw)
            self.send(400, *error_reply("anthropic", 400, str(e), e.where, e.rule))
            return
        self.record(path, 200, None, raw)
        self.send(200, {"input_tokens": total})

    def early_fault(self, provider, path, fault, raw):
        """Acts on the faults that come before the body is checked; True when the request is
        done with (answered, held until the client left, or reset)."""
        if fault not in FAULTS:
            message = (f"[stub.fault] x-stub-fault: {fault!r} is not one of "
                       f"{', '.join(FAULTS)}")
            self.record(path, 400, message, raw)
            self.send(400, *error_reply(provider, 400, message, "x-stub-fault", "stub.fault"))
            return True
        if fault == "slow":
            time.sleep(SLOW_S)
            return False
        if fault in ("status-500", "status-429"):
            status = int(fault[-3:])
            self.record(path, status, f"x-stub-fault: {fault}", raw)
            self.send(status, *fault_reply(provider, status))
            return True
        if fault not in ("hang", "reset"):
            return False
        self.record(path, None, f"x-stub-fault: {fault}", raw)
        self.close_connection = True
        if fault == "reset":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       struct.pack("ii", 1, 0))
            self.rfile.close()  # its reference would keep the socket open past close()
            self.connection.close()  # with linger 0: a reset, not a FIN
            return True
        while True:  # hang: read and drop whatever comes until the client closes
            readable, _, _ = select.select([self.connection], [], [], 1.0)
            try:
                if readable and not self.connection.recv(65536):
                    return True
            except OSError:
                return True

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        if path == "/stub/ledger":
            self.send(200, {"requests": CACHES.requests()})
            return
        if path == "/stub/requests":
            self.send(200, {"requests": CAPTURE.requests()})
            return
        if not path.startswith("/stub/"):
            CAPTURE.add(self, b"")
        self.send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

    def send(self, status, value, headers=None, fault=None):
        """A JSON reply; a midstream-error `fault` stops it halfway through the body and
        closes the connection, an invalid-sse one sends GARBAGE for the body."""
        data = GARBAGE if fault == "invalid-sse" else json.dumps(value).encode()
        self.send_response(status)
        for name, header in (headers or {}).items():
            self.send_header(name, header)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if fault == "midstream-error":
            self.send_header("Connection", "close")
            data = data[:len(data) // 2]
        self.end_headers()
        self.wfile.write(data)

    def stream(self, frames, provider, fault=None, content_type="text/event-stream"):
        """A 200 event stream of `frames`, each written (and sent: no Nagle delay) in a chunk
        of its own; over HTTP/1.0, unchunked and ended by closing the connection. A
        midstream-error or invalid-sse `fault` cuts it as the docstring says."""
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        chunked = self.request_version != "HTTP/1.0"
        cut = False
        if fault in ("midstream-error", "invalid-sse"):
            frames = frames[:FAULT_FRAMES]
            if fault == "invalid-sse" and provider == "bedrock":
                # A frame whose message CRC is off by one bit: an invalid event stream.
                bad = bytearray(bedrock_event("contentBlockStop", {"contentBlockIndex": 0}))
                bad[-1] ^= 1
                frames.append(bytes(bad))
            elif fault == "invalid-sse":
                frames.append(GARBAGE)
            elif provider == "anthropic":
                frames.append(sse_event("error", OVERLOADED))
            else:
                cut = True
                if provider == "bedrock":
                    # Cut inside a frame: its prelude and half its payload, then the close.
                    half = bedrock_event("contentBlockStop", {"contentBlockIndex": 0})
                    frames.append(half[:len(half) // 2])
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Cache-Control", "no-cache")
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        if fault is not None or not chunked:
            self.send_header("Connection", "close")
        self.end_headers()
        try:
            for i, frame in enumerate(frames):
                if fault == "drip" and i > 0:
                    time.sleep(DRIP_S)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(frame), frame) if chunked else frame)
            if chunked and not cut:
                self.wfile.write(b"0\r\n\r\n")
        except OSError:  # the client went away
            self.close_connection = True

    def record(self, path, status, error, raw):
        if Handler.log_file is None:
            return
        line = json.dumps({"path": path, "status": status, "error": error,
                           "body": raw.decode("utf-8", "replace")})
        with open(Handler.log_file, "a", encoding="utf-8") as f:
            f.write(line + "\n")

    def log_message(self, format, *args):
        pass  # the test shows what matters through the SDK's error; --log keeps the bodies


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        if isinstance(sys.exc_info()[1], ConnectionError):
            return  # a client that went away (or was reset) is no stub error
        super().handle_error(request, client_address)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-seconds", type=float, default=120.0)
    parser.add_argument("--log", help="append one JSON line per request (path, status, body)")
    parser.add_argument("--ignore-stdin", action="store_true")
    args = parser.parse_args()
    Handler.log_file = args.log
    server = Server(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)

    def stop_at_eof():
        while sys.stdin.buffer.read(4096):
            pass
        os._exit(0)

    if not args.ignore_stdin:
        threading.Thread(target=stop_at_eof, daemon=True).start()
    threading.Timer(args.max_seconds, lambda: os._exit(0)).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
