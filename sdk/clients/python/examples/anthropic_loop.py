#!/usr/bin/env python3
"""An agent loop with the official `anthropic` client (Messages API) and promptd.

    PROMPTD_URL=http://127.0.0.1:8417 ANTHROPIC_API_KEY=sk-ant-... \
        python anthropic_loop.py [QUESTION...]

The same loop as openai_loop.py, in Anthropic's format: promptd sends the thinking blocks of a
tool-use turn back exactly as they came (Anthropic requires it), puts tool results first in
their turn and sets the cache breakpoints. The SDK reads ANTHROPIC_BASE_URL and
ANTHROPIC_API_KEY; the model and max_tokens are promptd's config (`[model.anthropic]`).
"""

import os
import sys
from pathlib import Path

from anthropic import Anthropic

from promptd_client import Client

QUESTIONS = ["What is in this repository?", "Which file explains how to build it?"]


def list_dir(path="."):
    return "\n".join(sorted(p.name + ("/" if p.is_dir() else "") for p in Path(path).iterdir()))


def read_file(path, offset=1, limit=None):
    lines = Path(path).read_text().splitlines()[offset - 1:]
    return "\n".join(lines[:limit] if limit else lines)


TOOLS = {"list_dir": list_dir, "read_file": read_file}


def main(questions):
    llm = Anthropic()
    facts = {"cwd": os.getcwd(), "read_only": True}
    with Client(os.environ.get("PROMPTD_URL", "http://127.0.0.1:8417")) as promptd:
        session = promptd.session(os.environ.get("PROMPTD_AGENT", "coder"), format="anthropic")
        print(f"session {session.id}")
        for question in questions:
            user = question
            while True:  # until the model answers without calling a tool
                step = session.step(user=user, facts=facts)
                message = llm.messages.create(**step.body)
                calls = session.record(message).tool_calls
                if not calls:
                    break
                for call in calls:
                    try:
                        session.tool_result(call.id, TOOLS[call.name](**call.arguments))
                    except Exception as e:  # the model sees the failure and can recover
                        session.tool_result(call.id, f"{type(e).__name__}: {e}", is_error=True)
                user = None
            text = "".join(block.text for block in message.content if block.type == "text")
            print(f"step {step.step}: {text}")


if __name__ == "__main__":
    main(sys.argv[1:] or QUESTIONS)
