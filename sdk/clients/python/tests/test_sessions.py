"""Sessions: steps in every format, their rebuilds, the log, replies and tool results in the
neutral and OpenAI shapes, open tool calls, reopening, usage and compaction."""

import json
import re
import time

import httpx
import pytest

from promptd_client import OpenToolCalls, ToolCall, Unprocessable

FACTS = {"cwd": "/src/app", "git_branch": "main"}
PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAQAAAADCAIAAAA7ljmRAAAAEElEQVR4nGM4oaEBRww4OQAHpg0hlLAT/AAAAABJR"
       "U5ErkJggg==")
# The top-level keys each format's body has with the example config (model settings included).
SHAPES = {
    "neutral": {"model", "system", "tools", "messages"},
    "openai": {"model", "max_tokens", "messages", "tools", "prompt_cache_key"},
    "anthropic": {"model", "max_tokens", "system", "messages", "tools"},
    "openai-responses": {"model", "max_output_tokens", "instructions", "input", "tools",
                         "prompt_cache_key"},
}


def kinds(session):
    return [e.kind for e in session.events()]


def test_a_step_in_every_format_and_its_rebuild(client):
    session = client.session("coder")
    assert (session.agent, len(session.id) > 0) == ("coder", True)
    first = session.step(user="What is here?", facts=FACTS)
    assert (first.step, first.format) == (1, "neutral")
    assert set(first.body) == SHAPES["neutral"], sorted(first.body)
    assert first.body["messages"][0] == {"role": "user", "content": "What is here?"}
    assert "Working directory: /src/app" in first.body["messages"][1]["content"]
    assert first.usage["total"]["tokens"] > 0 and first.usage["tokenizer"] == "chars", first.usage
    assert session.request(1) == first.body
    for n, fmt in enumerate(["openai", "anthropic", "openai-responses"], start=2):
        assert set(session.request(1, format=fmt)) == SHAPES[fmt], fmt
        result = session.step(user=f"Question {n}.", facts=FACTS, format=fmt)
        assert (result.step, result.format) == (n, fmt)
        assert set(result.body) == SHAPES[fmt], (fmt, sorted(result.body))
        assert session.request(n, format=fmt) == result.body, fmt
    rebuilt = session.request(4, format="openai-responses")
    assert rebuilt["prompt_cache_key"] == f"promptd-{session.agent}"  # K6: the agent's key


def test_a_sessions_format_is_the_default_of_its_steps(client):
    session = client.session("reviewer", format="anthropic")
    result = session.step(user="Review this.")
    assert result.format == "anthropic" and set(result.body) == SHAPES["anthropic"]
    # reviewer's own max_tokens merges over the global one.
    assert result.body["max_tokens"] == 2048, result.body["max_tokens"]
    assert session.request(1) == result.body
    assert set(session.request(1, format="neutral")) == SHAPES["neutral"]


def test_the_log_holds_what_a_step_added(client):
    session = client.session("coder")
    session.step(user="Hello.", facts=FACTS)
    events = session.events()
    assert [e.kind for e in events] == ["session/created", "user/message", "context/snapshot",
                                        "request/header", "step"], events
    assert [e.seq for e in events] == [1, 2, 3, 4, 5]
    # The session's agent, and the secret its data blocks are keyed with (contract T8).
    assert events[0].body["agent"] == "coder"
    assert sorted(events[0].body) == ["agent", "data_secret"]
    assert re.fullmatch(r"[0-9a-f]{32}", events[0].body["data_secret"])
    assert events[1].body == {"role": "user", "content": "Hello."}
    assert events[3].body["reason"] == "initial"
    assert events[4].body["step"] == 1 and events[4].body["facts"] == FACTS
    assert all(isinstance(e.at_ms, int) and e.at_ms > 0 for e in events)


def test_facts_that_are_not_strings_go_as_the_plugins_read_them(client):
    session = client.session("coder")
    documents = [{"source": "a.md", "date": "2026-12-01", "text": "A"}]
    result = session.step(user="Read only.", facts={"read_only": True, "git_dirty": False,
                                                    "documents": documents, "os": None})
    tools = sorted(t["name"] for t in result.body["tools"])
    assert tools == ["list_dir", "read_file"], tools  # read_only=true hides write and bash
    step = session.events()[-1]
    assert step.body["facts"] == {"read_only": "true", "git_dirty": "false",
                                  "documents": json.dumps(documents)}, step.body


def test_a_tool_round_in_the_neutral_shape(client):
    session = client.session("coder", format="openai")
    session.step(user="Read the README.", facts=FACTS)
    reply = {"role": "assistant", "content": "Reading it.",
             "tool_calls": [{"id": "c1", "name": "read_file", "arguments": {"path": "README.md"}}]}
    stale = client.reopen(session.id, format="openai")  # reopened before the call is recorded
    recorded = session.record(reply)
    call = ToolCall("c1", "read_file", {"path": "README.md"})
    assert recorded.tool_calls == [call] and recorded.seq == len(session.events())
    assert session.open_tool_calls == [call]

    # A step or another reply while the call is open is refused before anything is sent.
    logged = len(session.events())
    with pytest.raises(OpenToolCalls) as e:
        session.step(user="And now?")
    assert (e.value.code, e.value.status, e.value.call_ids) == ("open_tool_calls", None, ["c1"])
    assert "`c1` (read_file)" in e.value.message and "tool_result" in e.value.message
    with pytest.raises(OpenToolCalls):
        session.record({"role": "assistant", "content": "Again."})
    assert len(session.events()) == logged, "nothing was sent"
    # `stale` does not know the call: the daemon refuses its step, and the error body's
    # `call_ids` names the call.
    with pytest.raises(OpenToolCalls) as e:
        stale.step(user="And now?")
    assert (e.value.status, e.value.call_ids) == (422, ["c1"])
    assert len(session.events()) == logged, "the refused step recorded nothing"

    result_seq = session.tool_result("c1", "# promptd\n").seq
    assert result_seq == logged + 1 and session.open_tool_calls == []
    body = session.step(facts=FACTS).body
    assistant = next(m for m in body["messages"] if m["role"] == "assistant")
    # Encoded once: the arguments are the JSON text of the object, not of a string.
    arguments = assistant["tool_calls"][0]["function"]["arguments"]
    assert json.loads(arguments) == {"path": "README.md"}, arguments
    tool = next(m for m in body["messages"] if m["role"] == "tool")
    assert tool == {"role": "tool", "tool_call_id": "c1", "content": "# promptd\n"}, tool
    assert kinds(session)[-3:] == ["assistant/message", "tool/result", "step"]


def test_arguments_as_the_model_wrote_them_go_back_byte_for_byte(client):
    session = client.session("coder", format="openai")
    session.step(user="List it.")
    written = '{ "path" : "src" }'
    openai_message = {"role": "assistant", "content": None, "refusal": None,
                      "tool_calls": [{"id": "call_9", "type": "function",
                                      "function": {"name": "list_dir", "arguments": written}}]}
    assert session.record(openai_message).tool_calls == [ToolCall("call_9", "list_dir",
                                                                  {"path": "src"})]
    session.tool_result("call_9", "a.rs\nb.rs")
    body = session.step().body
    assistant = next(m for m in body["messages"] if m["role"] == "assistant")
    assert assistant["tool_calls"][0]["function"]["arguments"] == written
    neutral = session.request(2, format="neutral")
    assert next(m for m in neutral["messages"] if m["role"] == "assistant")[
        "tool_calls"][0]["arguments"] == {"path": "src"}


def test_tool_results_of_every_kind(client):
    session = client.session("coder", format="anthropic")
    session.step(user="Do three things.")
    calls = [{"id": f"t{i}", "name": "read_file", "arguments": {"path": f"{i}.txt"}}
             for i in range(3)]
    session.record({"role": "assistant", "content": "", "tool_calls": calls})
    session.tool_result("t0", {"lines": 3, "ok": True})  # JSON, sent as its text once
    session.tool_result("t1", [{"type": "text", "text": "a screenshot:"},
                               {"type": "image", "media_type": "image/png", "data": PNG}])
    session.tool_result("t2", "no such file", is_error=True)
    events = session.events()[-3:]
    assert [e.body["tool_call_id"] for e in events] == ["t0", "t1", "t2"]
    assert events[0].body["content"] == '{"lines": 3, "ok": true}'
    assert events[2].body["is_error"] is True and "is_error" not in events[0].body
    body = session.step().body
    results = [b for b in body["messages"][-1]["content"] if b["type"] == "tool_result"]
    assert [r["tool_use_id"] for r in results] == ["t0", "t1", "t2"]
    assert results[2]["is_error"] is True
    assert any(b.get("type") == "image" and b["source"]["data"] == PNG
               for b in results[1]["content"]), results[1]


def test_a_step_may_carry_the_tool_results_itself(client):
    session = client.session("coder")
    session.step(user="Go.")
    session.record({"role": "assistant", "content": "",
                    "tool_calls": [{"id": "k1", "name": "list_dir", "arguments": {}}]})
    result = session.step(messages=[{"role": "tool", "tool_call_id": "k1", "content": "x"}],
                          user="Then this.")
    assert session.open_tool_calls == []
    assert [m["role"] for m in result.body["messages"]][-3:] == ["assistant", "tool", "user"]


def test_the_daemon_refuses_a_step_over_open_calls_too(client):
    session = client.session("coder")
    session.step(user="Go.")
    # A second handle made before the reply knows of no open call; the daemon does.
    stale = client.reopen(session.id)
    session.record({"role": "assistant", "content": "",
                    "tool_calls": [{"id": "z1", "name": "list_dir", "arguments": {}}]})
    with pytest.raises(OpenToolCalls) as e:
        stale.step(user="Next?")
    assert (e.value.code, e.value.status) == ("open_tool_calls", 422), e.value
    assert "z1" in e.value.message


def test_reopen_rebuilds_the_agent_and_the_open_calls(client):
    session = client.session("reviewer")
    session.step(user="Go.")
    calls = [{"id": "r1", "name": "list_dir", "arguments": {}},
             {"id": "r2", "name": "read_file", "arguments": {"path": "x"}}]
    session.record({"role": "assistant", "content": "Two.", "tool_calls": calls})
    session.tool_result("r1", "listing")
    again = client.reopen(session.id, format="openai")
    assert (again.id, again.agent, again.format) == (session.id, "reviewer", "openai")
    assert again.open_tool_calls == [ToolCall("r2", "read_file", {"path": "x"})]
    again.tool_result("r2", "text")
    assert again.step().step == 2


def test_usage_sets_the_providers_counts_against_the_estimate(client):
    session = client.session("coder")
    step = session.step(user="Count.")
    completion = {"id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-4.1",
                  "choices": [{"index": 0, "finish_reason": "stop",
                               "message": {"role": "assistant", "content": "Done."}}],
                  "usage": {"prompt_tokens": 321, "completion_tokens": 12, "total_tokens": 333,
                            "prompt_tokens_details": {"cached_tokens": 100}}}
    assert session.record(completion).tool_calls == []
    report = session.usage()
    [row] = report["steps"]
    assert row["step"] == 1 and row["estimate"] == step.usage["total"]["tokens"], row
    assert row["actual"] == {"input_tokens": 321, "output_tokens": 12, "cached_tokens": 100}, row
    totals = report["totals"]
    assert (totals["actual"], totals["compared_steps"]) == (321, 1), totals
    assert totals["actual_per_estimate"] == pytest.approx(321 / row["estimate"]), totals
    assert totals["cached_share"] == pytest.approx(100 / 321), totals
    # The completion's usage judged the request's cache: the session's first, so `cold`.
    assert row["cache"]["outcome"] in ("cold", "uncacheable"), row
    assert report["ledger"]["replies"] == 1, report["ledger"]


def test_usage_across_sessions_sums_each_agents_ledger(client):
    session = client.session("coder")
    session.step(user="Count.")
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
               "content": [{"type": "text", "text": "Done."}], "stop_reason": "end_turn",
               "usage": {"input_tokens": 10, "output_tokens": 5,
                         "cache_creation_input_tokens": 3000, "cache_read_input_tokens": 0}}
    session.record(message, sent_at=1_764_633_600_000)
    summary = client.usage(agent="coder", since=1_764_633_600_000)
    coder = summary["agents"]["coder"]
    assert summary["since_ms"] == 1_764_633_600_000 and list(summary["agents"]) == ["coder"]
    assert coder["replies"] >= 1 and coder["cache_write_tokens"] >= 3000, coder
    assert summary["total"]["replies"] == coder["replies"] and summary["sessions"] >= 1


def test_compaction_shows_the_summary_in_place_of_the_messages(client):
    session = client.session("coder")
    session.step(user="First: how is the build set up?")
    session.record({"role": "assistant", "content": "With cargo."})
    session.step(user="Second: and the tests?")
    before = session.request(2)
    messages = [e for e in session.events() if e.kind in ("user/message", "assistant/message")]
    first, reply = messages[0], messages[1]
    compacted = session.compact(first.seq, reply.seq, "Summary: the build uses cargo.")
    assert compacted.seq == session.events()[-1].seq
    body = session.step(user="Third.").body
    text = json.dumps(body["messages"])
    assert "Summary: the build uses cargo." in text and "First: how is" not in text, text
    assert "Second: and the tests?" in text
    assert session.request(2) == before, "a past step rebuilds unchanged"


def test_user_blocks_and_several_messages(client):
    session = client.session("coder", format="openai")
    result = session.step(messages=[{"role": "user", "content": "One."}],
                          user=[{"type": "text", "text": "Two, with a picture."},
                                {"type": "image", "media_type": "image/png", "data": PNG}])
    users = [m for m in result.body["messages"] if m["role"] == "user"]
    assert users[0]["content"] == "One."
    assert users[1]["content"][1] == {"type": "image_url", "image_url": {
        "url": f"data:image/png;base64,{PNG}"}}, users[1]



def test_the_session_list_most_recent_first(client):
    first = client.session("coder")
    first.step(user="A.")
    second = client.session("reviewer")
    second.step(user="B.")
    time.sleep(0.01)  # activity is ordered by millisecond
    first.record({"role": "assistant", "content": "Answered."})
    [found] = client.sessions(q=first.id)
    assert (found.id, found.agent, found.steps) == (first.id, "coder", 1), found
    assert found.events == len(first.events()) and found.created_ms <= found.last_ms, found
    assert [s.id for s in client.sessions(limit=2)] == [first.id, second.id]
    reviewers = client.sessions(q="reviewer")
    assert second.id in [s.id for s in reviewers] and {s.agent for s in reviewers} == {"reviewer"}


def test_explain_says_who_gave_each_part(client):
    session = client.session("coder", format="openai")
    step = session.step(user="Who wrote this?", facts=FACTS)
    explained = session.explain(1)
    assert (explained.step, explained.format, explained.request) == (1, "openai", step.body)
    provenance = explained.provenance
    serving = {p.id: p.sha256 for p in client.plugins() if p.state == "loaded"}
    # Every plugin serving at the step, by the version that served.
    assert provenance["plugins"] == serving, provenance["plugins"]
    sections = {s["name"]: (s["plugin"], s["scope"]) for s in provenance["sections"]}
    assert sections["identity"] == ("identity", "global") and sections["persona"][0] == "persona"
    tools = {t["name"]: t["plugin"] for t in provenance["tools"]}
    assert set(tools) == {t["function"]["name"] for t in step.body["tools"]}, tools
    assert set(tools.values()) == {"tools"}
    assert session.explain(1, format="anthropic").request == session.request(1, format="anthropic")


def test_diff_when_only_messages_were_added(client):
    session = client.session("coder", format="anthropic")
    session.step(user="One.", facts=FACTS)
    session.record({"role": "assistant", "content": "Yes."})
    session.step(user="Two.", facts=FACTS)
    first, second = session.diff(1), session.diff(2)
    assert (first.step, first.previous, second.step, second.format) == (1, None, 2, "anthropic")
    previous = second.previous
    assert previous["step"] == 1 and previous["prefix_kept"] is True, second
    assert previous["first_divergence"] is None and second.causes, second
    assert (first.breaks_cache, second.breaks_cache) == (False, False), second
    assert second.cached_share["bytes"] == pytest.approx(previous["shared_bytes"] / second.bytes)


def test_replay_with_the_plugins_that_serve_finds_no_difference_and_writes_nothing(
        client, replay_plugins):
    session = client.session("coder")
    session.step(user="List the files.")
    session.step(user="And the tests.")
    before = [e.seq for e in session.events()]
    # The daemon's own folder holds `slow`, which it refused: a replay refuses it by name.
    with pytest.raises(Unprocessable) as refused:
        client.replay([session.id], format="anthropic")
    assert "slow" in str(refused.value), refused.value
    report = client.replay([session.id], plugins=replay_plugins, format="anthropic")
    [replayed] = report["sessions"]
    assert report["candidate"]["plugins"] and report["candidate"]["loaded"], report["candidate"]
    assert report["totals"]["differing_steps"] == 0, report["totals"]
    assert replayed["session"] == session.id and len(replayed["steps"]) == 2, replayed
    assert [e.seq for e in session.events()] == before, "a replay writes nothing"


def test_a_session_keeps_each_formats_body_from_the_parts_the_daemon_sends(client, url, token):
    # Issue 31: a step asks for what changed since the body the session keeps, and the kept
    # body is the whole body's bytes, whatever the format, through tool rounds and replies.
    session = client.session("coder")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    for fmt in ["neutral", "openai", "anthropic", "openai-responses"]:
        for turn in range(3):
            result = session.step(user=f"{fmt} turn {turn}: \"é\" \\ </data>", facts=FACTS,
                                  format=fmt)
            raw = httpx.get(f"{url}/v1/sessions/{session.id}/steps/{result.step}/request",
                            params={"format": fmt}, headers=headers, timeout=30)
            assert raw.status_code == 200, raw.text
            assert result.text == raw.text, (fmt, turn)
            assert json.loads(result.text) == result.body
            call = f"c-{fmt}-{turn}"
            session.record({"role": "assistant", "content": "",
                            "tool_calls": [{"id": call, "name": "read_file",
                                            "arguments": {"path": "README.md"}}]})
            session.tool_result(call, "# promptd\n")
            after = session.step(facts=FACTS, format=fmt)
            assert after.text is not None
            assert json.loads(after.text) == session.request(after.step, format=fmt)
            session.record({"role": "assistant", "content": f"Done {turn}."})


def test_a_step_may_ask_for_the_whole_body(client):
    session = client.session("coder", format="anthropic")
    kept = session.step(user="One.", facts=FACTS)
    whole = session.step(user="Two.", facts=FACTS, whole=True)
    assert whole.text is None and whole.body == session.request(2)
    # The next step starts the kept body again from nothing, and it is whole.
    session.record({"role": "assistant", "content": "Noted."})
    third = session.step(user="Three.", facts=FACTS)
    assert json.loads(third.text) == session.request(3) == third.body
    assert kept.step == 1
