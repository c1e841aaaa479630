"""AsyncClient and AsyncSession: the same surface as the blocking client, awaited."""

import asyncio
import json
import re

import openai
import pytest

import promptd_client
from promptd_client import DaemonUnreachable, NotFound, OpenToolCalls, ToolCall

FACTS = {"cwd": "/src/app", "read_only": True}


def run(coroutine):
    return asyncio.run(coroutine)


def test_an_async_agent_loop_with_the_async_openai_client(async_client, stub_url):
    async def loop():
        llm = openai.AsyncOpenAI(base_url=f"{stub_url}/v1", api_key="sk-stub", max_retries=0)
        async with async_client() as c:
            session = await c.session("coder", format="openai")
            calls_per_step, user = [], "Look around."
            for _ in range(4):
                step = await session.step(user=user, facts=FACTS)
                completion = await llm.chat.completions.create(**step.body)
                calls = (await session.record(completion)).tool_calls
                calls_per_step.append(len(calls))
                for call in calls:
                    await session.tool_result(call.id, f"ran {call.name}")
                user = None if calls else "More."
            rebuilt = await session.request(4)
            explained = await session.explain(4)
            diff = await session.diff(4)
            [listed] = await c.sessions(q=session.id, limit=5)
            events = await session.events()
            usage = await session.usage()
        await llm.close()
        return step, rebuilt, events, usage, calls_per_step, explained, diff, listed

    step, rebuilt, events, usage, calls_per_step, explained, diff, listed = run(loop())
    assert calls_per_step == [1, 0, 2, 0], calls_per_step
    assert step.step == 4 and rebuilt == step.body
    assert [e.kind for e in events].count("tool/result") == 3
    assert usage["totals"]["compared_steps"] == 4, usage
    assert (explained.step, explained.format, explained.request) == (4, "openai", step.body)
    assert diff.step == 4 and diff.previous["step"] == 3, diff
    assert (listed.agent, listed.steps, listed.events) == ("coder", 4, len(events)), listed


def test_async_open_calls_reopen_and_compaction(async_client):
    async def flow():
        async with async_client() as c:
            session = await c.session("coder")
            await session.step(user="First.")
            await session.record({"role": "assistant", "content": "One."})
            await session.step(user="Second.")
            recorded = await session.record({"role": "assistant", "content": "",
                                             "tool_calls": [{"id": "a1", "name": "list_dir",
                                                             "arguments": {}}]})
            with pytest.raises(OpenToolCalls) as refused:
                await session.step(user="Third.")
            again = await c.reopen(session.id)
            await again.tool_result("a1", "listing")
            events = await again.events()
            first, reply = [e for e in events if e.kind in ("user/message",
                                                             "assistant/message")][:2]
            compacted = await again.compact(first.seq, reply.seq, "Summary of the start.")
            body = (await again.step(user="Third.")).body
            return recorded, refused.value, again, compacted, body

    recorded, refused, again, compacted, body = run(flow())
    assert recorded.tool_calls == [ToolCall("a1", "list_dir", {})]
    assert refused.call_ids == ["a1"] and refused.status is None
    assert again.agent == "coder" and again.open_tool_calls == []
    assert compacted.seq > 0
    text = json.dumps(body["messages"])
    assert "Summary of the start." in text and "First." not in text


def test_async_daemon_routes_and_the_event_stream(async_client):
    async def flow():
        async with async_client() as c:
            health = await c.health()
            plugins = await c.plugins()
            metrics = await c.metrics()
            document = await c.openapi()
            assert await c.enable("tools") == []
            try:
                [unloaded] = await c.unload("workspace")
            finally:
                applied = await c.reload()
            stream = c.registry_events(since=unloaded.seq - 1, timeout=10)
            seen = [await stream.__anext__(), await stream.__anext__()]
            await stream.aclose()
            with pytest.raises(NotFound) as missing:
                await c.reopen("no-such-session")
            return health, plugins, metrics, document, unloaded, applied, seen, missing.value

    health, plugins, metrics, document, unloaded, applied, seen, missing = run(flow())
    assert health.status == "ok" and health.plugins == sum(p.state == "loaded" for p in plugins)
    assert re.search(r"^promptd_plugins_loaded \d+$", metrics, re.M), metrics[:300]
    assert "/v1/sessions/{id}/steps" in document["paths"]
    assert (unloaded.kind, unloaded.plugin) == ("unload", "workspace")
    assert [(e.kind, e.plugin) for e in applied] == [("load", "workspace")]
    assert [(e.seq, e.kind) for e in seen] == [(unloaded.seq, "unload"),
                                               (applied[0].seq, "load")], seen
    assert missing.code == "unknown_session"


def test_async_unreachable(free_port):
    async def flow():
        async with promptd_client.AsyncClient(f"http://127.0.0.1:{free_port}") as c:
            await c.health()

    with pytest.raises(DaemonUnreachable) as e:
        run(flow())
    assert e.value.code == "unreachable"
