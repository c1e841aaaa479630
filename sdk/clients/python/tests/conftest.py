"""Fixtures for the client's tests, which run against real daemons that tests/client_python.rs
starts (with the bundled plugins and the repository's promptd.toml plus the lines below) and
describes in the environment:

    PROMPTD_TEST_URL     the main daemon. It needs the bearer token PROMPTD_TEST_TOKEN; it was
                         started unready, with a plugin `slow` whose declare loops until its
                         deadline (so the first test sees it `loading`, then it is `refused`),
                         `[limits] max_body_mb = 1`, and an agent `broken` whose persona says
                         `{{nobody}}` (a plugin `persona_broken` scoped to it), whose steps
                         fail assembly with 422 unknown_variable, and an MCP server
                         `[mcp.stub]` (tests/mcp_stub.py) whose tools agent `runner` sees
    PROMPTD_DOOMED_URL   a second daemon whose session database the store-failure test deletes
    PROMPTD_DOOMED_STATE its --state folder
    STUB_URL             tests/sdk_loops/stub_provider.py, the local OpenAI and Anthropic stand-in
    PROMPTD_REPLAY_PLUGINS a folder of the bundled plugins (without `slow`), a replay candidate
    PROMPTD_GATEWAY_URL  a third daemon with the gateway on ([gateway] enabled, agent `gw`
                         forwarding to STUB_URL; no token), for the gateway's route of the API
    PROMPTD_CALLS_LOG    where every call the tests make through the `client` fixtures is
                         written (one JSON line each), for openapi_coverage.py

The client under test is the installed wheel (sdk/clients/python/install.sh), never src/.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterator, List

import httpx
import pytest

import promptd_client

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[3]


def env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"${name} is not set: run these tests through `cargo test -p promptd "
                    "--test e2e client_python::`, which starts the daemons and the stub", pytrace=False)
    return value


# --- Recording every call, for the OpenAPI coverage check ---------------------------------------

CALLS: List[dict] = []
_LOCK = threading.Lock()


def _record(request: httpx.Request, status: int, content_type: str, value: Any,
            sse: bool = False) -> None:
    fields = sorted(value) if isinstance(value, dict) else []
    with _LOCK:
        CALLS.append({"method": request.method, "path": request.url.path, "status": status,
                      "content_type": content_type, "sse": sse, "fields": fields})


def _json_or_none(content: bytes) -> Any:
    try:
        return json.loads(content)
    except ValueError:
        return None


class _SseTee:
    """Passes a stream's bytes through unchanged, recording each event's data fields."""

    def __init__(self, request: httpx.Request) -> None:
        self.request = request
        self.buffer = b""
        self.parser = promptd_client._core.SSEParser()

    def feed(self, chunk: bytes) -> None:
        self.buffer += chunk
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            event = self.parser.feed(line.decode("utf-8", "replace"))
            if event is not None:
                _record(self.request, 200, "text/event-stream", event.raw, sse=True)


class _TeeStream(httpx.SyncByteStream):
    def __init__(self, inner: httpx.SyncByteStream, tee: _SseTee) -> None:
        self.inner, self.tee = inner, tee

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.inner:
            self.tee.feed(chunk)
            yield chunk

    def close(self) -> None:
        self.inner.close()


class _AsyncTeeStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, tee: _SseTee) -> None:
        self.inner, self.tee = inner, tee

    async def __aiter__(self):
        async for chunk in self.inner:
            self.tee.feed(chunk)
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


class RecordingTransport(httpx.BaseTransport):
    """The real transport, writing down each call's method, path, status and top-level JSON
    fields (each server-sent event's data fields for a stream)."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        content_type = response.headers.get("content-type", "").split(";")[0]
        if content_type == "text/event-stream":
            _record(request, response.status_code, content_type, None)
            response.stream = _TeeStream(response.stream, _SseTee(request))
            return response
        content = response.read()
        _record(request, response.status_code, content_type, _json_or_none(content))
        return httpx.Response(response.status_code, headers=response.headers, content=content,
                              request=request)

    def close(self) -> None:
        self.inner.close()


class AsyncRecordingTransport(httpx.AsyncBaseTransport):
    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        content_type = response.headers.get("content-type", "").split(";")[0]
        if content_type == "text/event-stream":
            _record(request, response.status_code, content_type, None)
            response.stream = _AsyncTeeStream(response.stream, _SseTee(request))
            return response
        content = await response.aread()
        _record(request, response.status_code, content_type, _json_or_none(content))
        return httpx.Response(response.status_code, headers=response.headers, content=content,
                              request=request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = os.environ.get("PROMPTD_CALLS_LOG")
    if path:
        # Appended: the loading check and the rest run as two pytest sessions.
        with open(path, "a", encoding="utf-8") as f:
            for call in CALLS:
                f.write(json.dumps(call) + "\n")


# --- Fixtures ----------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def url() -> str:
    return env("PROMPTD_TEST_URL")


@pytest.fixture(scope="session")
def token() -> str:
    return env("PROMPTD_TEST_TOKEN")


@pytest.fixture(scope="session")
def stub_url() -> str:
    return env("STUB_URL")


@pytest.fixture(scope="session")
def replay_plugins() -> str:
    return env("PROMPTD_REPLAY_PLUGINS")


@pytest.fixture(scope="session")
def make_client(url: str, token: str) -> Iterator[Callable[..., promptd_client.Client]]:
    """Clients of the main daemon whose calls are recorded; closed at the end."""
    made: List[promptd_client.Client] = []

    def make(**kwargs: Any) -> promptd_client.Client:
        kwargs.setdefault("token", token)
        http = httpx.Client(transport=RecordingTransport())
        client = promptd_client.Client(kwargs.pop("url", url), http_client=http, **kwargs)
        made.append(client)
        return client

    yield make
    for client in made:
        client._http.close()


@pytest.fixture(scope="session")
def ready(url: str, token: str) -> None:
    """The main daemon has published its first full registry (it was started unready), and
    its MCP server (connected in the background) serves its tools."""
    deadline = time.monotonic() + 120
    with promptd_client.Client(url, token) as c:
        while c.health().status != "ok" or not any(
                p.id == "mcp:stub" and p.state == "loaded" for p in c.plugins()):
            if time.monotonic() > deadline:
                pytest.fail("the daemon did not finish loading, and its MCP server "
                            f"connecting, in 120 s: {c.plugins()}")
            time.sleep(0.05)


@pytest.fixture
def client(make_client: Callable[..., promptd_client.Client], ready: None) -> promptd_client.Client:
    return make_client()


@pytest.fixture
def async_client(url: str, token: str, ready: None):
    """``async with async_client() as c:`` a recorded AsyncClient of the main daemon, made
    inside the test's own event loop and closed with it."""
    @contextlib.asynccontextmanager
    async def make(**kwargs: Any) -> AsyncIterator[promptd_client.AsyncClient]:
        kwargs.setdefault("token", token)
        async with httpx.AsyncClient(transport=AsyncRecordingTransport()) as http:
            yield promptd_client.AsyncClient(kwargs.pop("url", url), http_client=http, **kwargs)

    return make


@pytest.fixture
def free_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kinds(events: List[promptd_client.Event]) -> List[str]:
    return [e.kind for e in events]

