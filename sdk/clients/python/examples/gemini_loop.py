#!/usr/bin/env python3
"""An agent loop with the official `google-genai` client (Gemini `generateContent`) and promptd.

    PROMPTD_URL=http://127.0.0.1:8417 GEMINI_API_KEY=... python gemini_loop.py [QUESTION...]

The same loop as openai_loop.py, in Gemini's format: `generate_content(**step.body)` takes
promptd's body unchanged. Gemini 3 refuses a request whose earlier function calls lack the
thought signatures it returned with them; promptd keeps each reply's parts as recorded and
sends every signature back exactly (to the model that wrote it). Gemini may leave a call's id
out: promptd names it, and `record(...).tool_calls` carries the names. The SDK reads
GEMINI_API_KEY (and GOOGLE_GEMINI_BASE_URL); the model is promptd's config (`[model.gemini]`).
"""

import os
import sys
from pathlib import Path

from google import genai

from promptd_client import Client

QUESTIONS = ["What is in this repository?", "Which file explains how to build it?"]


def list_dir(path="."):
    return "\n".join(sorted(p.name + ("/" if p.is_dir() else "") for p in Path(path).iterdir()))


def read_file(path, offset=1, limit=None):
    lines = Path(path).read_text().splitlines()[offset - 1:]
    return "\n".join(lines[:limit] if limit else lines)


TOOLS = {"list_dir": list_dir, "read_file": read_file}


def main(questions):
    llm = genai.Client()
    facts = {"cwd": os.getcwd(), "read_only": True}
    with Client(os.environ.get("PROMPTD_URL", "http://127.0.0.1:8417")) as promptd:
        session = promptd.session(os.environ.get("PROMPTD_AGENT", "coder"), format="gemini")
        print(f"session {session.id}")
        for question in questions:
            user = question
            while True:  # until the model answers without calling a tool
                step = session.step(user=user, facts=facts)
                response = llm.models.generate_content(**step.body)
                calls = session.record(response).tool_calls
                if not calls:
                    break
                for call in calls:
                    try:
                        session.tool_result(call.id, TOOLS[call.name](**call.arguments))
                    except Exception as e:  # the model sees the failure and can recover
                        session.tool_result(call.id, f"{type(e).__name__}: {e}", is_error=True)
                user = None
            print(f"step {step.step}: {response.text}")


if __name__ == "__main__":
    main(sys.argv[1:] or QUESTIONS)
