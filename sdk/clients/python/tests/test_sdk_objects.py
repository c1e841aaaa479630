"""The official SDKs' reply objects recorded as they are: an openai ChatCompletion (and its
message alone), a Responses Response, an anthropic Message, each through a few tool rounds
against the stub provider, which refuses any body breaking the provider's rules."""

import json

import anthropic
import openai

from promptd_client import ToolCall

FACTS = {"cwd": "/src/app", "read_only": True}


def test_openai_chat_completions(client, stub_url):
    llm = openai.OpenAI(base_url=f"{stub_url}/v1", api_key="sk-stub", max_retries=0)
    session = client.session("coder", format="openai")
    step = session.step(user="Look around.", facts=FACTS)
    completion = llm.chat.completions.create(**step.body)
    recorded = session.record(completion)  # the ChatCompletion object, unchanged
    [sdk_call] = completion.choices[0].message.tool_calls
    assert recorded.tool_calls == [ToolCall(sdk_call.id, sdk_call.function.name,
                                            json.loads(sdk_call.function.arguments))]
    session.tool_result(sdk_call.id, "README.md\nsrc")
    body = session.step(facts=FACTS).body
    sent = next(m for m in body["messages"] if m.get("tool_calls"))["tool_calls"][0]
    # The model's arguments string goes back exactly as it came: never encoded again.
    assert sent["function"]["arguments"] == sdk_call.function.arguments
    final = llm.chat.completions.create(**body)
    assert sdk_call.id in final.choices[0].message.content
    # The message alone is a reply too.
    assert session.record(final.choices[0].message).tool_calls == []
    assert [e.kind for e in session.events()][-2:] == ["step", "assistant/message"]


def test_openai_responses(client, stub_url):
    llm = openai.OpenAI(base_url=f"{stub_url}/v1", api_key="sk-stub", max_retries=0)
    session = client.session("coder", format="openai-responses")
    response = llm.responses.create(**session.step(user="Look.", facts=FACTS).body)
    calls = session.record(response).tool_calls  # the Response object
    items = [i for i in response.output if i.type == "function_call"]
    assert calls == [ToolCall(i.call_id, i.name, json.loads(i.arguments)) for i in items]
    for call in calls:
        session.tool_result(call.id, f"output of {call.name}")
    body = session.step(facts=FACTS).body
    sent = [i for i in body["input"] if i.get("type") == "function_call"]
    assert [i["arguments"] for i in sent] == [i.arguments for i in items]
    outputs = [i for i in body["input"] if i.get("type") == "function_call_output"]
    assert [o["call_id"] for o in outputs] == [c.id for c in calls]
    final = llm.responses.create(**body)
    assert session.record(final).tool_calls == []
    assert all(c.id in final.output_text for c in calls), final.output_text


def test_anthropic_messages_through_two_tool_rounds(client, stub_url):
    llm = anthropic.Anthropic(base_url=stub_url, api_key="sk-ant-stub", max_retries=0)
    session = client.session("reviewer", format="anthropic")
    rounds = []
    user = "Review the change."
    for _ in range(4):
        message = llm.messages.create(**session.step(user=user, facts=FACTS).body)
        calls = session.record(message).tool_calls  # the Message object
        uses = [b for b in message.content if b.type == "tool_use"]
        assert calls == [ToolCall(b.id, b.name, b.input) for b in uses]
        rounds.append(len(calls))
        for call in calls:
            session.tool_result(call.id, "fine")
        user = None if calls else "And the tests?"
    # One call, the answer, two parallel calls (the stub's rounds), the answer; the thinking
    # blocks went back unchanged (the stub refuses changed ones).
    assert rounds == [1, 0, 2, 0], rounds
    assert session.open_tool_calls == []


def test_gemini_generate_content_response(client, stub_url):
    """google-genai's GenerateContentResponse, recorded as it is: its calls come without ids
    (the daemon names them), its thought signatures are bytes in the object, sent as the
    standard base64 the API writes, and go back exactly (the stub refuses a call without the
    signature it issued)."""
    import base64

    from google import genai

    llm = genai.Client(api_key="gemini-stub", http_options={"base_url": stub_url})
    session = client.session("coder", format="gemini")
    response = llm.models.generate_content(**session.step(user="Look.", facts=FACTS).body)
    parts = response.candidates[0].content.parts
    signed = [p.thought_signature for p in parts if p.thought_signature]
    assert signed and isinstance(signed[0], bytes)
    calls = session.record(response).tool_calls
    sdk_calls = [p.function_call for p in parts if p.function_call]
    assert [(c.name, c.arguments) for c in calls] == [(f.name, f.args) for f in sdk_calls]
    assert all(c.id.startswith("call_") for c in calls), calls
    for call in calls:
        session.tool_result(call.id, "fine")
    body = session.step(facts=FACTS).body
    model_turn = next(c for c in body["contents"] if c["role"] == "model")
    kept = [p["thoughtSignature"] for p in model_turn["parts"] if "thoughtSignature" in p]
    assert [base64.b64decode(s) for s in kept] == signed
    assert kept == [base64.b64encode(s).decode() for s in signed], "standard base64, as the API"
    final = llm.models.generate_content(**body)
    assert session.record(final).tool_calls == []
    assert session.open_tool_calls == []


def test_bedrock_converse_response_and_raw_bytes(client, stub_url):
    """boto3's converse dict, recorded as it is; `sdk_kwargs()` hands boto3 an image as the raw
    bytes it wants (the body keeps base64 text, which boto3 would encode a second time)."""
    import base64

    import boto3

    png = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAQAAAADCAIAAAA7ljmRAAAAEElEQVR4nGM4oaEBRww4"
                           "OQAHpg0hlLAT/AAAAABJRU5ErkJggg==")
    llm = boto3.client("bedrock-runtime", region_name="us-east-1", endpoint_url=stub_url,
                       aws_access_key_id="stub", aws_secret_access_key="stub")
    session = client.session("coder", format="bedrock")
    image = {"type": "image", "media_type": "image/png", "data": base64.b64encode(png).decode()}
    step = session.step(user=[{"type": "text", "text": "Look."}, image], facts=FACTS)
    block = step.body["messages"][0]["content"][1]["image"]
    assert block["source"]["bytes"] == image["data"], "the body keeps the REST API's base64"
    kwargs = step.sdk_kwargs()
    assert kwargs["messages"][0]["content"][1]["image"]["source"]["bytes"] == png
    assert step.body["messages"][0]["content"][1]["image"]["source"]["bytes"] == image["data"]
    response = llm.converse(**kwargs)
    calls = session.record(response).tool_calls
    uses = [b["toolUse"] for b in response["output"]["message"]["content"] if "toolUse" in b]
    assert calls == [ToolCall(u["toolUseId"], u["name"], u["input"]) for u in uses]
    for call in calls:
        session.tool_result(call.id, "fine")
    final = llm.converse(**session.step(facts=FACTS).sdk_kwargs())
    assert session.record(final).tool_calls == []
