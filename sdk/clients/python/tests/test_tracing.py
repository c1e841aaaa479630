"""The caller's OpenTelemetry trace context on every request (README, "Tracing"): with a span
active, session creation, steps and recorded replies carry its W3C ``traceparent`` (and
``tracestate`` when it has one), so the daemon's spans join the caller's trace; with none, no
trace header; with OpenTelemetry not importable, the client works as before.

These run against a local capture server (http.server in a thread) that answers like the daemon
and writes down each request's headers, as they came over the wire; no daemon is needed.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Iterator, List, Tuple

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

import promptd_client
from promptd_client import _tracing

# A real SDK tracer, used directly (the global tracer provider is left alone); its spans are
# made current through the OpenTelemetry context, which is what the client reads.
TRACER = TracerProvider().get_tracer("promptd-client-tests")
TOKEN = "secret-token"

Captured = List[Tuple[str, str, Dict[str, str]]]


class _Capture(BaseHTTPRequestHandler):
    """Answers the routes a session uses as the daemon would, and keeps every request's method,
    path and headers (names lowercased)."""

    captured: Captured

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        path = self.path.split("?")[0]
        self.captured.append((self.command, path, {k.lower(): v for k, v in self.headers.items()}))
        if path == "/v1/sessions":
            value: Any = {"id": "s1", "agent": "coder"}
        elif path.endswith("/steps"):
            value = {"step": 1, "request": {"messages": [{"role": "user", "content": "Hi"}]},
                     "usage": {}}
        elif path.endswith("/messages"):
            value = {"seq": 3, "tool_calls": []}
        else:
            value = {"status": "ok", "plugins": 0, "version": "test"}
        body = json.dumps(value).encode()
        self.send_response(201 if path == "/v1/sessions" else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def capture() -> Iterator[Tuple[str, Captured]]:
    captured: Captured = []
    handler = type("Handler", (_Capture,), {"captured": captured})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", captured
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def traceparent(span: trace.Span) -> str:
    """``00-{trace_id}-{span_id}-{flags}``. The flags are the sampled bit (01), plus, for a
    trace id the SDK made itself, W3C trace context level 2's random bit (02): 03."""
    ctx = span.get_span_context()
    assert ctx.is_valid and ctx.trace_flags.sampled, ctx
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def session_calls(url: str) -> None:
    """Session creation, a step and a recorded reply, with the blocking client."""
    with promptd_client.Client(url, TOKEN) as c:
        session = c.session("coder")
        session.step(user="Hi")
        session.record({"role": "assistant", "content": "Hello."})


async def async_session_calls(url: str) -> None:
    async with promptd_client.AsyncClient(url, TOKEN) as c:
        session = await c.session("coder")
        await session.step(user="Hi")
        await session.record({"role": "assistant", "content": "Hello."})


ROUTES = [("POST", "/v1/sessions"), ("POST", "/v1/sessions/s1/steps"),
          ("POST", "/v1/sessions/s1/messages")]


def routes(captured: Captured) -> List[Tuple[str, str]]:
    return [(method, path) for method, path, _ in captured]


def test_sync_requests_carry_the_active_spans_traceparent(capture):
    url, captured = capture
    with TRACER.start_as_current_span("agent turn") as span:
        assert span.get_span_context().is_valid
        session_calls(url)
    assert routes(captured) == ROUTES
    for method, path, headers in captured:
        assert headers.get("traceparent") == traceparent(span), (method, path, headers)
        # The client's own headers are still there, unchanged.
        assert headers.get("authorization") == f"Bearer {TOKEN}", (method, path, headers)
        assert headers.get("accept") == "application/json", (method, path, headers)
        assert "tracestate" not in headers, (method, path, headers)


def test_async_requests_carry_the_active_spans_traceparent(capture):
    url, captured = capture

    async def run() -> trace.Span:
        with TRACER.start_as_current_span("async agent turn") as span:
            await async_session_calls(url)
        return span

    span = asyncio.run(run())
    assert routes(captured) == ROUTES
    for method, path, headers in captured:
        assert headers.get("traceparent") == traceparent(span), (method, path, headers)
        assert headers.get("authorization") == f"Bearer {TOKEN}", (method, path, headers)


def test_tracestate_goes_along_when_the_trace_has_one(capture):
    url, captured = capture
    # A remote parent with a trace state, as a service that was called with one would have;
    # the SDK's child span inherits it.
    parent = SpanContext(trace_id=0x0AF7651916CD43DD8448EB211C80319C, span_id=0x00F067AA0BA902B7,
                         is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED),
                         trace_state=TraceState([("vendor", "opaque-value")]))
    with TRACER.start_as_current_span("child",
                                      context=trace.set_span_in_context(NonRecordingSpan(parent))) as span:
        session_calls(url)
    assert span.get_span_context().trace_id == parent.trace_id
    assert routes(captured) == ROUTES
    for method, path, headers in captured:
        assert headers.get("traceparent") == traceparent(span), (method, path, headers)
        assert headers["traceparent"] == (f"00-0af7651916cd43dd8448eb211c80319c-"
                                          f"{span.get_span_context().span_id:016x}-01")
        assert headers.get("tracestate") == "vendor=opaque-value", (method, path, headers)


def test_the_context_is_read_at_each_call_not_kept(capture):
    url, captured = capture
    with promptd_client.Client(url, TOKEN) as c:
        with TRACER.start_as_current_span("first") as first:
            session = c.session("coder")
        with TRACER.start_as_current_span("second") as second:
            session.step(user="Hi")
        session.record({"role": "assistant", "content": "Hello."})
    assert routes(captured) == ROUTES
    assert first.get_span_context().span_id != second.get_span_context().span_id
    sent = [headers.get("traceparent") for _, _, headers in captured]
    assert sent == [traceparent(first), traceparent(second), None], sent


def test_no_active_span_sends_no_trace_headers(capture):
    url, captured = capture
    assert not trace.get_current_span().get_span_context().is_valid
    session_calls(url)
    asyncio.run(async_session_calls(url))
    assert routes(captured) == ROUTES + ROUTES
    for method, path, headers in captured:
        assert "traceparent" not in headers, (method, path, headers)
        assert "tracestate" not in headers, (method, path, headers)
        assert headers.get("authorization") == f"Bearer {TOKEN}", (method, path, headers)


def test_without_opentelemetry_the_client_works_and_sends_no_trace_headers(capture, monkeypatch):
    url, captured = capture
    with TRACER.start_as_current_span("not seen") as span:
        assert span.get_span_context().is_valid
        with monkeypatch.context() as m:
            # As if OpenTelemetry were not installed: its import fails, and the client has not
            # tried it yet.
            m.setitem(sys.modules, "opentelemetry", None)
            m.setitem(sys.modules, "opentelemetry.propagate", None)
            m.setattr(_tracing, "_propagate", _tracing._UNSET)
            session_calls(url)
            asyncio.run(async_session_calls(url))
            # The failed import is remembered: later requests do not try it again.
            assert _tracing._propagate is None
    assert routes(captured) == ROUTES + ROUTES
    for method, path, headers in captured:
        assert "traceparent" not in headers, (method, path, headers)
        assert headers.get("authorization") == f"Bearer {TOKEN}", (method, path, headers)
