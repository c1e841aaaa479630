#!/usr/bin/env python3
"""An agent loop with the official `boto3` client (Bedrock `Converse`) and promptd.

    PROMPTD_URL=http://127.0.0.1:8417 AWS_DEFAULT_REGION=us-east-1 python bedrock_loop.py [QUESTION...]

The same loop as openai_loop.py, in Bedrock's format: `converse(**step.sdk_kwargs())` — the
body, with images and documents as the raw bytes boto3 wants (it base64-encodes them itself).
promptd places the `cachePoint` blocks (without them Bedrock caches nothing) and sends each
reply's blocks back as they came. boto3 reads the usual AWS credentials, region and
AWS_ENDPOINT_URL_BEDROCK_RUNTIME; the model is promptd's config (`[model.bedrock]`).
"""

import os
import sys
from pathlib import Path

import boto3

from promptd_client import Client

QUESTIONS = ["What is in this repository?", "Which file explains how to build it?"]


def list_dir(path="."):
    return "\n".join(sorted(p.name + ("/" if p.is_dir() else "") for p in Path(path).iterdir()))


def read_file(path, offset=1, limit=None):
    lines = Path(path).read_text().splitlines()[offset - 1:]
    return "\n".join(lines[:limit] if limit else lines)


TOOLS = {"list_dir": list_dir, "read_file": read_file}


def main(questions):
    llm = boto3.client("bedrock-runtime")
    facts = {"cwd": os.getcwd(), "read_only": True}
    with Client(os.environ.get("PROMPTD_URL", "http://127.0.0.1:8417")) as promptd:
        session = promptd.session(os.environ.get("PROMPTD_AGENT", "coder"), format="bedrock")
        print(f"session {session.id}")
        for question in questions:
            user = question
            while True:  # until the model answers without calling a tool
                step = session.step(user=user, facts=facts)
                response = llm.converse(**step.sdk_kwargs())
                calls = session.record(response).tool_calls
                if not calls:
                    break
                for call in calls:
                    try:
                        session.tool_result(call.id, TOOLS[call.name](**call.arguments))
                    except Exception as e:  # the model sees the failure and can recover
                        session.tool_result(call.id, f"{type(e).__name__}: {e}", is_error=True)
                user = None
            content = response["output"]["message"]["content"]
            print(f"step {step.step}: " + "".join(b.get("text", "") for b in content))


if __name__ == "__main__":
    main(sys.argv[1:] or QUESTIONS)
