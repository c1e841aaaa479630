"""The agent loop every Python SDK script runs; the scripts add only their SDK call.

A loop is what a real agent does with promptd: for each step, ask promptd for the request body
in the SDK's format, hand that body to the official client UNCHANGED (`create(**body)`), record
the client's reply back into the session in the SDK's own shape, and carry the tool results (in
promptd's neutral shape) into the next step. Standard library only, besides the SDK.

    SCRIPT PROMPTD_URL STUB_URL AGENT [--steps N] [--media first|every] [--toggle-read-only]
                                      [--dump DIR]

--media first: step 1's user message carries text, a small PNG "photo" (base64), an image by
https URL and a PDF; the first result of every tool round carries text and a PNG "screenshot"
(noise, over 1 KiB: promptd keeps media over 1 KiB once in its database, smaller ones inline).
--media every: every user message and every tool result carries text and the same screenshot.
Either way, every body promptd returns after a medium was sent must hold its base64 (history
keeps it).
--toggle-read-only: the step fact read_only is "true" in odd steps, "false" in even ones (the
bundled `tools` plugin hides write_file and bash in read-only steps). --dump DIR: promptd's raw
reply to step N goes to DIR/step-N.json, byte for byte.

Exits 1 with the SDK's (or promptd's) error on any failure; on success prints one line of JSON:
{"sdk", "format", "agent", "session", "steps", "tool_calls", "tool_results", "request_bytes",
"reply_bytes"}, and with --media also "media": {"photo", "screenshot", "pdf"} (base64).
"""

import argparse
import base64
import json
import os
import struct
import sys
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass, field

TIMEOUT_S = 30


@dataclass
class Turn:
    """What one SDK call gave: the reply to record, the tool calls it made, its text."""

    reply: dict
    calls: list = field(default_factory=list)  # (call id, tool name)
    text: str = ""


class Failed(Exception):
    pass


def parse_args(extra=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("promptd")
    parser.add_argument("stub")
    parser.add_argument("agent")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--media", choices=["none", "first", "every"], default="none")
    parser.add_argument("--toggle-read-only", action="store_true")
    parser.add_argument("--dump")
    if extra:
        extra(parser)
    return parser.parse_args()


def post_raw(base, path, body):
    """POSTs `body`; returns the reply's raw bytes and its JSON."""
    data = json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            raw = response.read()
            return raw, json.loads(raw)
    except urllib.error.HTTPError as e:
        raise Failed(f"promptd POST {path} -> {e.code}: {e.read().decode(errors='replace')}") from None


def post(base, path, body):
    return post_raw(base, path, body)[1]


def get(base, path):
    try:
        with urllib.request.urlopen(base + path, timeout=TIMEOUT_S) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as e:
        raise Failed(f"promptd GET {path} -> {e.code}: {e.read().decode(errors='replace')}") from None


def facts(dirty, n, args):
    # git_dirty flips after the first tool call, so a fresh runtime context snapshot lands right
    # after tool results, as it would in a real loop.
    facts = {"cwd": "/src/app", "git_branch": "main", "git_dirty": "true" if dirty else "false",
             "date": "2026-12-01"}
    if args.toggle_read_only:
        facts["read_only"] = "true" if n % 2 == 1 else "false"
    return facts


# --- Media: generated here, so every run sends the same valid files ----------------------------

def png(width, height, rgb=None, seed=None):
    """A valid 8-bit RGB PNG: of one colour `rgb`, or of deterministic noise from `seed`
    (which does not compress)."""
    def chunk(tag, data):
        return (struct.pack(">I", len(data)) + tag + data
                + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF))
    if seed is None:
        pixels = bytes(rgb) * (width * height)
    else:
        noise, x = bytearray(), seed
        for _ in range(width * height * 3):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF
            noise.append(x >> 16 & 0xFF)
        pixels = bytes(noise)
    stride = width * 3
    rows = b"".join(b"\x00" + pixels[y * stride:(y + 1) * stride]  # filter 0 per row
                    for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))
            + chunk(b"IEND", b""))


def pdf():
    """A minimal valid one-page PDF, with its cross-reference table."""
    objects = [b"<</Type/Catalog/Pages 2 0 R>>", b"<</Type/Pages/Kids[3 0 R]/Count 1>>",
               b"<</Type/Page/Parent 2 0 R/MediaBox[0 0 72 72]>>"]
    out, offsets = b"%PDF-1.4\n", []
    for number, obj in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, obj)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<</Size %d/Root 1 0 R>>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return out


def b64(data):
    return base64.b64encode(data).decode()


MEDIA = {"photo": b64(png(4, 3, rgb=(200, 40, 40))), "screenshot": b64(png(32, 24, seed=7)),
         "pdf": b64(pdf())}
IMAGE_URL = "https://example.com/diagram.png"


def image(name):
    return {"type": "image", "media_type": "image/png", "data": MEDIA[name]}


def user_message(n, media):
    text = ("Look around the repository and tell me what is here." if n == 1
            else f"Thanks. Now the next thing (question {n}).")
    if media == "first" and n == 1:
        return {"role": "user", "content": [
            {"type": "text", "text": text + " Here is a photo, a diagram and the spec."},
            image("photo"), {"type": "image", "url": IMAGE_URL},
            {"type": "document", "media_type": "application/pdf", "data": MEDIA["pdf"],
             "name": "spec.pdf"}]}
    if media == "every":
        return {"role": "user", "content": [{"type": "text", "text": text}, image("screenshot")]}
    return {"role": "user", "content": text}


def tool_result(call_id, name, k, media):
    text = f"{name}: output {k}"
    shot = {"first": "screenshot" if k == 0 else None, "every": "screenshot"}.get(media)
    if shot is None:
        return {"role": "tool", "tool_call_id": call_id, "content": text}
    return {"role": "tool", "tool_call_id": call_id,
            "content": [{"type": "text", "text": text}, image(shot)]}


def check_media_kept(where, body, sent):
    """Every medium sent so far is in the body (as base64, in whatever shape the format has)."""
    text = json.dumps(body)
    lost = [name for name in sent if MEDIA[name] not in text]
    if lost:
        raise Failed(f"{where}: the body promptd returned lacks the {', '.join(lost)} sent before "
                     "(its base64 is not in it)")


def run(sdk, fmt, args, call):
    """Runs the loop; `call(body) -> Turn` is the SDK part."""
    sid = post(args.promptd, "/v1/sessions", {"agent": args.agent})["id"]
    pending = [user_message(1, args.media)]
    awaiting = []  # call ids whose results `pending` carries
    stats = {"sdk": sdk, "format": fmt, "agent": args.agent, "session": sid, "steps": 0,
             "tool_calls": 0, "tool_results": 0, "request_bytes": 0, "reply_bytes": 0}
    sent = []  # the media sent so far, by name
    if args.dump:
        os.makedirs(args.dump, exist_ok=True)
    for n in range(1, args.steps + 1):
        where = f"step {n}"
        raw, step = post_raw(args.promptd, f"/v1/sessions/{sid}/steps",
                             {"format": fmt, "messages": pending,
                              "facts": facts(stats["tool_calls"] > 0, n, args)})
        if args.dump:
            with open(os.path.join(args.dump, f"step-{n}.json"), "wb") as f:
                f.write(raw)
        body = step["request"]
        sent += [name for name in MEDIA if MEDIA[name] in json.dumps(pending) and name not in sent]
        check_media_kept(where, body, sent)
        stats["request_bytes"] += len(json.dumps(body, separators=(",", ":")))
        try:
            turn = call(body)
        except Exception as e:  # the SDK's own error: show it as it is
            raise Failed(f"{where}: the {sdk} client refused or failed: {type(e).__name__}: {e}") from None
        if awaiting:
            # The stub names the call ids whose results it read: proof they arrived, answered.
            missing = [c for c in awaiting if c not in turn.text]
            if turn.calls or missing:
                raise Failed(f"{where}: the provider did not take the tool results for {missing or awaiting} "
                             f"(reply text {turn.text!r}, calls {turn.calls})")
            stats["tool_results"] += len(awaiting)
        recorded = json.dumps(turn.reply, separators=(",", ":"))
        stats["reply_bytes"] += len(recorded)
        post(args.promptd, f"/v1/sessions/{sid}/messages", turn.reply)
        stats["steps"] = n
        if turn.calls:
            stats["tool_calls"] += len(turn.calls)
            pending = [tool_result(call_id, name, k, args.media)
                       for k, (call_id, name) in enumerate(turn.calls)]
            awaiting = [call_id for call_id, _ in turn.calls]
        else:
            pending = [user_message(n + 1, args.media)]
            awaiting = []
    if args.media != "none":
        stats["media"] = MEDIA
    # How the stub's cache served each step, as the daemon recorded it with the reply (null
    # where the reply's shape carried no usage).
    report = get(args.promptd, f"/v1/sessions/{sid}/usage")
    stats["cache"] = [(s.get("cache") or {}).get("outcome") for s in report["steps"]]
    return stats


def main(sdk, fmt, call_factory, extra=None):
    """`call_factory(args) -> call`, building the SDK client from the arguments."""
    args = parse_args(extra)
    try:
        stats = run(sdk, fmt, args, call_factory(args))
    except Failed as e:
        print(f"{sdk} loop, agent {args.agent}: {e}", file=sys.stderr)
        sys.exit(1)
    print(json.dumps(stats))
