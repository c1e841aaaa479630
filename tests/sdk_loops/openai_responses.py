#!/usr/bin/env python3
"""The agent loop through the official `openai` Python client, Responses API.

    openai_responses.py PROMPTD_URL STUB_URL AGENT [--steps N]     (see agent_loop.py)
"""

import agent_loop
from openai import OpenAI


def reply_of(response):
    """The reply as the SDK gives it: the response's output items and its usage. `to_dict()` is the SDK's
    wire shape (API names, only the fields the API sent); `model_dump()` would add Python-side
    keys such as `async_` and nulls for every absent field."""
    reply = {"type": "response", "output": [item.to_dict() for item in response.output]}
    if response.usage is not None:
        reply["usage"] = response.usage.to_dict()
    return reply


def factory(args):
    client = OpenAI(base_url=args.stub + "/v1", api_key="sk-stub", max_retries=0,
                    timeout=agent_loop.TIMEOUT_S)

    def call(body):
        response = client.responses.create(**body)
        calls = [(i.call_id, i.name) for i in response.output if i.type == "function_call"]
        return agent_loop.Turn(reply_of(response), calls, response.output_text)

    return call


if __name__ == "__main__":
    agent_loop.main("openai-python", "openai-responses", factory)
