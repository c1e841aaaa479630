#!/usr/bin/env python3
"""A client of a gateway fleet (G10): the official anthropic SDK, its base URL a load balancer
in front of several promptd daemons, keeping one conversation.

    gateway_fleet.py BASE_URL [--turns N]

Talks one JSON line per exchange on stdout (flushed), and waits on stdin where the test acts:

1. N turns, not streamed: {"turn": i, "session", "backend", "text"} each (`backend` is the
   load balancer's `x-promptd-test-backend` header: the daemon that served it).
2. A streamed turn with `x-stub-fault: drip` (the stub sends a frame every 0.5 s): once its
   first event came, {"streaming": true, "session", "backend"}; then it waits for a line on
   stdin (the test kills that daemon meanwhile) and reads on: {"cut": the error's class and
   message, or null when the stream ended cleanly, "events": how many came}.
3. The same request again, streamed, no fault (a client's retry): {"retry": true, "session",
   "backend", "text", "stop_reason"}.
4. One more turn, not streamed: {"turn": N + 1, ...}.

Exits 1 with the SDK's error on any failure but the cut it expects.
"""

import argparse
import json
import sys

MODEL = "claude-sonnet-4-5"
SYSTEM = "You are the client's own agent."


def say(**line):
    print(json.dumps(line), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("base")
    p.add_argument("--turns", type=int, default=4)
    args = p.parse_args()

    from anthropic import Anthropic

    client = Anthropic(base_url=args.base, api_key="sk-ant-fleet-client", max_retries=0,
                       timeout=60)
    messages = []

    def turn(i):
        messages.append({"role": "user", "content": f"Turn {i}: answer briefly."})
        raw = client.messages.with_raw_response.create(
            model=MODEL, max_tokens=64, system=SYSTEM, messages=messages)
        reply = raw.parse()
        text = "".join(b.text for b in reply.content if b.type == "text")
        messages.append({"role": "assistant", "content": text})
        say(turn=i, session=raw.headers.get("x-promptd-session"),
            backend=raw.headers.get("x-promptd-test-backend"), text=text)

    for i in range(1, args.turns + 1):
        turn(i)

    # The streamed turn the test cuts by killing its daemon.
    messages.append({"role": "user", "content": f"Turn {args.turns + 1}: stream it."})
    stream = client.messages.create(model=MODEL, max_tokens=64, system=SYSTEM,
                                    messages=messages, stream=True,
                                    extra_headers={"x-stub-fault": "drip"})
    events, cut = 0, None
    try:
        for _ in stream:
            events += 1
            if events == 1:
                say(streaming=True, session=stream.response.headers.get("x-promptd-session"),
                    backend=stream.response.headers.get("x-promptd-test-backend"))
                sys.stdin.readline()  # the test acts here
    except Exception as e:  # the cut: whatever the SDK and httpx raise for it
        cut = f"{type(e).__name__}: {e}"
    say(cut=cut, events=events)

    # The client's retry: the same messages, streamed.
    text, stop = [], None
    stream = client.messages.create(model=MODEL, max_tokens=64, system=SYSTEM,
                                    messages=messages, stream=True)
    for event in stream:
        if event.type == "content_block_delta" and event.delta.type == "text_delta":
            text.append(event.delta.text)
        elif event.type == "message_delta":
            stop = event.delta.stop_reason
    text = "".join(text)
    messages.append({"role": "assistant", "content": text})
    say(retry=True, session=stream.response.headers.get("x-promptd-session"),
        backend=stream.response.headers.get("x-promptd-test-backend"), text=text,
        stop_reason=stop)

    turn(args.turns + 2)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
