#!/usr/bin/env python3
"""An agent loop with the official `openai` client (Chat Completions) and promptd.

    PROMPTD_URL=http://127.0.0.1:8417 OPENAI_API_KEY=sk-... python openai_loop.py [QUESTION...]

promptd assembles every request (system prompt, tools, runtime context, history) from its
plugins; the loop hands the body to the SDK unchanged, records the SDK's reply object as it is,
runs the tools the model called and records their output. The tools here are two read-only
ones over the working directory, so the steps are read-only (the `tools` plugin then shows the
model only `list_dir` and `read_file`). The SDK reads OPENAI_BASE_URL and OPENAI_API_KEY; the
model is promptd's config (`[model.openai]`).
"""

import os
import sys
from pathlib import Path

from openai import OpenAI

from promptd_client import Client

QUESTIONS = ["What is in this repository?", "Which file explains how to build it?"]


def list_dir(path="."):
    return "\n".join(sorted(p.name + ("/" if p.is_dir() else "") for p in Path(path).iterdir()))


def read_file(path, offset=1, limit=None):
    lines = Path(path).read_text().splitlines()[offset - 1:]
    return "\n".join(lines[:limit] if limit else lines)


TOOLS = {"list_dir": list_dir, "read_file": read_file}


def main(questions):
    llm = OpenAI()
    facts = {"cwd": os.getcwd(), "read_only": True}
    with Client(os.environ.get("PROMPTD_URL", "http://127.0.0.1:8417")) as promptd:
        session = promptd.session(os.environ.get("PROMPTD_AGENT", "coder"), format="openai")
        print(f"session {session.id}")
        for question in questions:
            user = question
            while True:  # until the model answers without calling a tool
                step = session.step(user=user, facts=facts)
                completion = llm.chat.completions.create(**step.body)
                calls = session.record(completion).tool_calls
                if not calls:
                    break
                for call in calls:
                    try:
                        session.tool_result(call.id, TOOLS[call.name](**call.arguments))
                    except Exception as e:  # the model sees the failure and can recover
                        session.tool_result(call.id, f"{type(e).__name__}: {e}", is_error=True)
                user = None
            print(f"step {step.step}: {completion.choices[0].message.content}")


if __name__ == "__main__":
    main(sys.argv[1:] or QUESTIONS)
