#!/usr/bin/env python3
"""The agent loop through the official `openai` Python client, Chat Completions.

    openai_chat.py PROMPTD_URL STUB_URL AGENT [--steps N]     (see agent_loop.py)
"""

import agent_loop
from openai import OpenAI


def reply_of(completion):
    """The reply as the SDK gives it, recorded as is: the whole completion, so its usage
    (cached tokens included) is recorded with it."""
    return completion.model_dump(exclude_none=True)


def factory(args):
    client = OpenAI(base_url=args.stub + "/v1", api_key="sk-stub", max_retries=0,
                    timeout=agent_loop.TIMEOUT_S)

    def call(body):
        completion = client.chat.completions.create(**body)
        message = completion.choices[0].message
        calls = [(c.id, c.function.name) for c in message.tool_calls or []]
        return agent_loop.Turn(reply_of(completion), calls, message.content or "")

    return call


if __name__ == "__main__":
    agent_loop.main("openai-python", "openai", factory)
