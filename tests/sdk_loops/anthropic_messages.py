#!/usr/bin/env python3
"""The agent loop through the official `anthropic` Python client, Messages API.

    anthropic_messages.py PROMPTD_URL STUB_URL AGENT [--steps N] [--reply blocks|message]

--reply says how the reply is recorded: `blocks` (default) as
{"role": "assistant", "content": [block.model_dump() ...]}, `message` as the whole
`message.model_dump()` (id, type, role, content, model, stop_reason, usage...).
"""

import agent_loop
from anthropic import Anthropic


def reply_of(message, shape):
    if shape == "message":
        return message.model_dump()
    return {"role": "assistant", "content": [block.model_dump() for block in message.content]}


def factory(args):
    client = Anthropic(base_url=args.stub, api_key="sk-ant-stub", max_retries=0,
                       timeout=agent_loop.TIMEOUT_S)

    def call(body):
        message = client.messages.create(**body)
        calls = [(b.id, b.name) for b in message.content if b.type == "tool_use"]
        text = "".join(b.text for b in message.content if b.type == "text")
        return agent_loop.Turn(reply_of(message, args.reply), calls, text)

    return call


def options(parser):
    parser.add_argument("--reply", choices=["blocks", "message"], default="blocks")


if __name__ == "__main__":
    agent_loop.main("anthropic-python", "anthropic", factory, options)
