"""promptd's errors as typed exceptions with the daemon's code and message: unknown sessions,
steps and agents, refused assembly, oversized bodies, a daemon that is not running or does not
answer, answers that are not promptd's JSON, and a store that lost its files."""

import socket
from pathlib import Path

import httpx
import pytest

import promptd_client
from conftest import env
from promptd_client import (BadRequest, BadResponse, DaemonUnreachable, NotFound,
                            PayloadTooLarge, PluginFailed, PromptdError, RequestTimeout,
                            ServerError, Unavailable, Unprocessable)


def test_an_unknown_session_is_not_found(client):
    with pytest.raises(NotFound) as e:
        client.reopen("no-such-session")
    assert (e.value.code, e.value.status) == ("unknown_session", 404), e.value
    assert "no-such-session" in e.value.message
    assert (e.value.method, e.value.path) == ("GET", "/v1/sessions/no-such-session/events")
    ghost = promptd_client.Session(client, "no-such-session", "coder")
    for call in (lambda: ghost.step(user="Hi."), ghost.usage, lambda: ghost.request(1),
                 lambda: ghost.record({"role": "assistant", "content": "x"}),
                 lambda: ghost.compact(1, 2, "s")):
        with pytest.raises(NotFound) as e:
            call()
        assert e.value.code == "unknown_session", e.value


def test_an_unknown_step_is_not_found(client):
    session = client.session("coder")
    session.step(user="One.")
    with pytest.raises(NotFound) as e:
        session.request(7)
    assert e.value.code == "unknown_step" and "7" in e.value.message, e.value


def test_a_refused_assembly_is_unprocessable_and_records_nothing(client):
    # Agent `broken` sees a persona that says {{nobody}}, a variable no plugin gives.
    session = client.session("broken")
    with pytest.raises(Unprocessable) as e:
        session.step(user="Hello.", facts={"cwd": "/src"})
    assert (e.value.code, e.value.status) == ("unknown_variable", 422), e.value
    assert "`nobody`" in e.value.message and "persona" in e.value.message, e.value
    assert [ev.kind for ev in session.events()] == ["session/created"]
    # Still usable: the same mistake again, the same answer; nothing half-done in between.
    with pytest.raises(Unprocessable):
        session.step(user="Hello.")


def test_other_refusals_carry_their_codes(client):
    session = client.session("coder")
    with pytest.raises(Unprocessable) as e:
        session.record({"role": "assistant", "content": "Too early."})
    assert e.value.code == "reply_before_step", e.value
    session.step(user="Hi.")
    with pytest.raises(Unprocessable) as e:
        session.tool_result("ghost", "x")
    assert e.value.code == "unknown_tool_call", e.value
    with pytest.raises(Unprocessable) as e:
        session.step(user="   ")
    assert e.value.code == "empty_message", e.value
    with pytest.raises(BadRequest) as e:
        session.request(1, format="bogus")
    assert (e.value.code, e.value.status) == ("bad_request", 400), e.value
    with pytest.raises(BadRequest) as e:
        client.session("not a name")
    assert e.value.code == "invalid_agent", e.value


def test_a_body_over_the_limit_is_payload_too_large(client):
    # The daemon under test has [limits] max_body_mb = 1.
    with pytest.raises(PayloadTooLarge) as e:
        client.session("coder").step(user="x" * (1 << 20))
    assert (e.value.code, e.value.status) == ("body_too_large", 413), e.value
    assert "max_body_mb" in e.value.message


def test_a_daemon_that_is_not_running_is_unreachable(free_port):
    url = f"http://127.0.0.1:{free_port}"
    with promptd_client.Client(url) as c:
        for call in (c.health, lambda: c.session("coder"),
                     lambda: next(iter(c.registry_events(since=0)))):
            with pytest.raises(DaemonUnreachable) as e:
                call()
            assert (e.value.code, e.value.status) == ("unreachable", None), e.value
            assert url in e.value.message and "promptd serve" in e.value.message, e.value
            assert isinstance(e.value, PromptdError)


def test_a_daemon_that_does_not_answer_times_out():
    # A socket that listens (connections complete in the backlog) but never answers.
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        url = "http://127.0.0.1:%d" % server.getsockname()[1]
        with promptd_client.Client(url, timeout=0.5) as c:
            with pytest.raises(RequestTimeout) as e:
                c.health()
    assert (e.value.code, e.value.status) == ("timeout", None), e.value


def fake(status, content, content_type="text/html"):
    """A client whose transport answers every request with this, like a proxy in front of
    the daemon might."""
    transport = httpx.MockTransport(lambda request: httpx.Response(
        status, content=content, headers={"content-type": content_type}))
    return promptd_client.Client("http://promptd.test", http_client=httpx.Client(
        transport=transport))


def test_an_answer_that_is_not_promptds_json_still_names_the_status():
    with pytest.raises(PluginFailed) as e:
        fake(502, b"<html>Bad Gateway</html>").health()
    assert (e.value.code, e.value.status) == ("http_502", 502), e.value
    assert "HTTP 502" in e.value.message and "Bad Gateway" in e.value.message, e.value
    with pytest.raises(PromptdError) as e:
        fake(418, b"").plugins()
    assert type(e.value) is PromptdError and e.value.code == "http_418", e.value
    assert "empty body" in e.value.message
    # JSON, but not promptd's error shape.
    with pytest.raises(NotFound) as e:
        fake(404, b'{"detail": "nope"}', "application/json").plugins()
    assert e.value.code == "http_404", e.value
    with pytest.raises(BadResponse) as e:
        fake(200, b"<html>a login page</html>").plugins()
    assert (e.value.code, e.value.status) == ("bad_response", 200), e.value


def test_a_store_that_lost_its_files_is_unavailable(make_client):
    url = env("PROMPTD_DOOMED_URL")
    state = Path(env("PROMPTD_DOOMED_STATE"))
    doomed = make_client(url=url, token="")
    session = doomed.session("coder")
    session.step(user="Before.")
    for suffix in ("", "-wal", "-shm"):
        (state / f"sessions.db{suffix}").unlink()
    with pytest.raises(Unavailable) as e:
        doomed.health()
    assert (e.value.code, e.value.status) == ("store", 503), e.value
    assert "sessions.db" in e.value.message, e.value
    with pytest.raises(ServerError) as e:
        session.step(user="After.")
    assert (e.value.code, e.value.status) == ("store", 500), e.value


