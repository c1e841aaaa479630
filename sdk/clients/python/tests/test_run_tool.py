"""session.run_tool: the daemon runs an open call on the MCP server whose tool it names
(tests/mcp_stub.py, configured as `[mcp.stub]` for agent `runner`) and records the outcome."""

import pytest

from promptd_client import Conflict, NotFound, ToolCall

STUB = "mcp:stub"


def test_the_daemon_runs_an_mcp_servers_tool(client):
    session = client.session("runner", format="openai")
    step = session.step(user="Shout, then fail.")
    names = sorted(t["function"]["name"] for t in step.body["tools"])
    assert {"shout", "fail"} <= set(names), names
    session.record({"role": "assistant", "content": "",
                    "tool_calls": [{"id": "m1", "name": "shout", "arguments": {"text": "hi"}},
                                   {"id": "m2", "name": "fail", "arguments": {}}]})
    shouted = session.run_tool("m1")
    assert (shouted.plugin, shouted.message["tool_call_id"]) == (STUB, "m1"), shouted
    assert shouted.message["content"] == "HI" and not shouted.message.get("is_error"), shouted
    assert session.open_tool_calls == [ToolCall("m2", "fail", {})]
    failed = session.run_tool("m2")
    assert failed.message["is_error"] is True, failed
    assert "it failed" in failed.message["content"], failed
    events = session.events()
    assert [(e.seq, e.kind) for e in events[-2:]] == [(shouted.seq, "tool/result"),
                                                      (failed.seq, "tool/result")]
    assert events[-1].body == failed.message
    assert session.open_tool_calls == []
    tools = [m for m in session.step().body["messages"] if m["role"] == "tool"]
    assert [(t["tool_call_id"], t["content"]) for t in tools][0] == ("m1", "HI"), tools


def test_a_tool_call_the_daemon_cannot_run(client):
    session = client.session("coder")
    session.step(user="Read it.")
    session.record({"role": "assistant", "content": "",
                    "tool_calls": [{"id": "p1", "name": "read_file", "arguments": {"path": "a"}}]})
    # read_file is a plugin's tool, which no MCP server runs: the loop runs it itself.
    with pytest.raises(Conflict) as e:
        session.run_tool("p1")
    assert (e.value.code, e.value.status) == ("tool_not_runnable", 409), e.value
    assert "read_file" in e.value.message, e.value
    assert [c.id for c in session.open_tool_calls] == ["p1"], "still open"
    with pytest.raises(NotFound) as e:
        session.run_tool("ghost")
    assert e.value.code == "unknown_tool_call", e.value
    session.tool_result("p1", "its text")
    with pytest.raises(Conflict) as e:
        session.run_tool("p1")
    assert e.value.code == "tool_call_answered", e.value
