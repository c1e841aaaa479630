"""The daemon-wide routes: health, plugins, reload, unload, enable, metrics, the registry's
event stream and the OpenAPI document."""

import json
import re
import threading
from pathlib import Path

import pytest

import promptd_client
from promptd_client import NotFound, Unauthorized

REPO = Path(__file__).resolve().parents[4]
BUNDLED = {"identity", "persona", "persona_broken", "tools", "workspace"}
MCP = "mcp:stub"


def test_health_once_loaded(client):
    health = client.health()
    loaded = [p for p in client.plugins() if p.state == "loaded"]
    assert health.status == "ok", health.raw
    assert health.plugins == len(loaded) == len(BUNDLED | {MCP}), (health, loaded)
    assert health.loaded is None and health.total is None, health.raw
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", health.version), health.version


def test_plugins_list_every_file_with_its_state_and_declaration(client):
    plugins = {p.id: p for p in client.plugins()}
    assert set(plugins) == BUNDLED | {"slow", MCP}, sorted(plugins)
    for pid in BUNDLED:
        p = plugins[pid]
        assert p.state == "loaded" and p.last_error is None, p
        assert re.fullmatch(r"[0-9a-f]{64}", p.sha256) and p.serving_sha256 == p.sha256, p
        assert p.file.endswith(f"{pid}.wasm"), p
        assert isinstance(p.declares, dict), p
    tool_names = sorted(t["name"] for t in plugins["tools"].declares["tools"])
    assert tool_names == ["bash", "list_dir", "read_file", "write_file"], tool_names
    # The looping declare ran into its deadline: refused, and the error says why.
    slow = plugins["slow"]
    assert slow.state == "refused" and slow.declares is None, slow
    assert slow.last_error is not None and slow.last_error.code == "declare_failed", slow
    assert "deadline" in slow.last_error.message, slow.last_error
    # The MCP server is a contributor like the files: its tools under their names.
    mcp = plugins[MCP]
    assert mcp.state == "loaded" and mcp.file.endswith("mcp_stub.py"), mcp
    assert sorted(t["name"] for t in mcp.declares["tools"]) == ["fail", "shout"], mcp.declares


def test_metrics_count_steps(client):
    def ok_steps():
        text = client.metrics()
        found = re.search(r'^promptd_steps_total\{outcome="ok"\} (\d+)$', text, re.M)
        assert found, text[:500]
        return int(found.group(1))

    before = ok_steps()
    client.session("coder").step(user="Count me.")
    assert ok_steps() == before + 1


def operations(document):
    return sorted((method, path) for path, item in document["paths"].items()
                  for method in item if method in ("get", "post", "put", "patch", "delete"))


def test_the_served_openapi_document_has_the_committed_operations(client):
    # The daemon's own test keeps docs/openapi.json byte-identical to what it serves; the
    # client's concern is that it fetches the document, and that the coverage check
    # (openapi_coverage.py) reads the operations this daemon really has.
    served = client.openapi()
    committed = json.loads((REPO / "docs/openapi.json").read_text())
    assert served["openapi"].startswith("3.1"), served["openapi"]
    assert operations(served) == operations(committed)


def test_every_route_but_health_needs_the_token(url, make_client, ready):
    # An explicit empty token and no PROMPTD_TOKEN: no Authorization header at all.
    anonymous = make_client(token="")
    assert anonymous.health().status == "ok"
    for call in (anonymous.plugins, anonymous.metrics, lambda: anonymous.session("coder")):
        with pytest.raises(Unauthorized) as e:
            call()
        assert (e.value.code, e.value.status) == ("unauthorized", 401), e.value
        assert "Bearer" in e.value.message, e.value
    with pytest.raises(Unauthorized):
        make_client(token="not-the-token").plugins()


def test_the_registry_event_stream_replays_history(client):
    # Every load since the daemon started is kept: one `load` per bundled plugin and for the
    # MCP server, one `refused` (with its error) for the slow one, numbered from 1.
    events = []
    for event in client.registry_events(since=0, timeout=10):
        events.append(event)
        if len(events) == len(BUNDLED) + 2:
            break
    assert [e.seq for e in events] == list(range(1, len(events) + 1)), events
    by_plugin = {e.plugin: e for e in events}
    assert set(by_plugin) == BUNDLED | {"slow", MCP}, events
    assert all(by_plugin[p].kind == "load" and by_plugin[p].error is None
               for p in BUNDLED | {MCP})
    refused = by_plugin["slow"]
    assert refused.kind == "refused" and refused.error.code == "declare_failed", refused
    assert all(re.fullmatch(r"[0-9a-f]{64}", e.sha256) and e.file for e in events), events


def test_unload_reload_and_enable_and_the_live_stream(client):
    coder = client.session("coder")
    persona = "You are Ada's engineering side"
    assert persona in coder.step(user="Hello.").body["system"]
    seen, subscribed = [], threading.Event()

    def listen(since):
        # From just before the unload: the unload comes from the history (so the subscription
        # exists once it arrived), the reload's load live, after it.
        for event in client.registry_events(since=since, timeout=20):
            seen.append(event)
            subscribed.set()
            if len(seen) == 2:
                break

    try:
        [unloaded] = client.unload("persona")
        assert (unloaded.kind, unloaded.plugin) == ("unload", "persona"), unloaded
        assert persona not in coder.step(user="Still there?").body["system"]
        # Not quarantined: nothing to enable.
        assert client.enable("tools") == []
        listener = threading.Thread(target=listen, args=(unloaded.seq - 1,))
        listener.start()
        assert subscribed.wait(20), "the stream did not replay the unload"
    finally:
        applied = client.reload()
    assert [(e.kind, e.plugin) for e in applied] == [("load", "persona")], applied
    assert applied[0].seq == unloaded.seq + 1, (applied, unloaded)
    assert persona in coder.step(user="Back?").body["system"]
    # The unload broke the cache prefix; the reload brought step 1's header back.
    broken, back = coder.diff(2), coder.diff(3)
    assert broken.previous["step"] == 1 and broken.previous["prefix_kept"] is False, broken
    assert broken.previous["first_divergence"] is not None and broken.causes, broken
    assert broken.breaks_cache is True and back.breaks_cache is True, (broken, back)
    assert coder.diff(1).breaks_cache is False, "a first step breaks nothing"
    assert back.same_header is not None and back.same_header["step"] == 1, back
    assert "persona" not in coder.explain(2).provenance["plugins"]
    assert "persona" in coder.explain(3).provenance["plugins"]
    listener.join(30)
    assert not listener.is_alive(), "the live stream did not deliver the reload"
    assert [(e.seq, e.kind, e.plugin) for e in seen] == [
        (unloaded.seq, "unload", "persona"), (applied[0].seq, "load", "persona")], seen


def test_unknown_plugins_are_not_found(client):
    for call in (client.unload, client.enable):
        with pytest.raises(NotFound) as e:
            call("no-such-plugin")
        assert e.value.code == "unknown_plugin" and "no-such-plugin" in e.value.message, e.value


def test_the_context_manager_closes_the_pool(url, token, ready):
    with promptd_client.Client(url, token) as c:
        assert c.health().status == "ok"
    assert c._http.is_closed
