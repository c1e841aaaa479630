// The caller's OpenTelemetry trace context on every request (README, "Tracing"): once the app
// registered a propagator and a context manager with @opentelemetry/api, session creation,
// steps and recorded replies carry the active span's W3C `traceparent` (and `tracestate` when
// set); with nothing registered, or no span active, no trace header. The requests go to a local
// capture server that answers like the daemon and keeps each request's headers as they came
// over the wire; no daemon is needed.
//
// The OpenTelemetry packages are the client's pinned devDependencies (package.json and its
// lock), installed by install.sh's `npm ci` in sdk/clients/typescript: they are loaded from
// there by path, so all of them share that one copy of @opentelemetry/api, not the one
// @anthropic-ai/sdk brings into the install folder.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { createRequire } from "node:module";
import { Client } from "promptd-client";

const otel = createRequire(new URL("../../package.json", import.meta.url));
const api = otel("@opentelemetry/api");
const { AsyncLocalStorageContextManager } = otel("@opentelemetry/context-async-hooks");
const { W3CTraceContextPropagator } = otel("@opentelemetry/core");
const { BasicTracerProvider } = otel("@opentelemetry/sdk-trace-base");

const API_KEY = Symbol.for("opentelemetry.js.api.1");
const TOKEN = "secret-token";
const ROUTES = ["POST /v1/sessions", "POST /v1/sessions/s1/steps", "POST /v1/sessions/s1/messages"];

/** A server answering a session's routes as the daemon would; `captured` holds every request's
 * method, path and headers (Node lowercases their names). */
async function captureServer() {
  const captured = [];
  const server = createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      const path = req.url.split("?")[0];
      captured.push({ route: `${req.method} ${path}`, headers: req.headers });
      let value = { status: "ok", plugins: 0, version: "test" };
      if (path === "/v1/sessions") value = { id: "s1", agent: "coder" };
      else if (path.endsWith("/steps")) value = { step: 1, request: { messages: [{ role: "user", content: "Hi" }] }, usage: {} };
      else if (path.endsWith("/messages")) value = { seq: 3, tool_calls: [] };
      res.writeHead(path === "/v1/sessions" ? 201 : 200, { "Content-Type": "application/json" });
      res.end(JSON.stringify(value));
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const url = `http://127.0.0.1:${server.address().port}`;
  return { url, captured, close: () => new Promise((resolve) => server.close(resolve)) };
}

/** Session creation, a step and a recorded reply. */
async function sessionCalls(url) {
  const session = await new Client(url, { token: TOKEN }).session("coder");
  await session.step({ user: "Hi" });
  await session.record({ role: "assistant", content: "Hello." });
}

/** Runs `calls(url)` against a fresh capture server; the requests it received. */
async function captured(calls) {
  const server = await captureServer();
  try {
    await calls(server.url);
  } finally {
    await server.close();
  }
  return server.captured;
}

const traceparent = (span) => {
  const { traceId, spanId } = span.spanContext();
  return `00-${traceId}-${spanId}-01`;
};

function assertNoTraceHeaders(requests) {
  for (const { route, headers } of requests) {
    assert.equal(headers.traceparent, undefined, route);
    assert.equal(headers.tracestate, undefined, route);
    assert.equal(headers.authorization, `Bearer ${TOKEN}`, route);
  }
}

// These first two run before anything is registered (node:test runs a file's tests in order).

test("with no OpenTelemetry registered, no trace header is sent", async () => {
  assert.equal(globalThis[API_KEY], undefined, "nothing registered yet");
  const requests = await captured(sessionCalls);
  assert.deepEqual(requests.map((r) => r.route), ROUTES);
  assertNoTraceHeaders(requests);
});

test("a propagator that throws never fails a request", async () => {
  globalThis[API_KEY] = {
    version: api.VERSION,
    propagation: { inject() { throw new Error("broken propagator"); } },
    context: { active: () => api.ROOT_CONTEXT },
  };
  try {
    const requests = await captured(sessionCalls);
    assert.deepEqual(requests.map((r) => r.route), ROUTES);
    assertNoTraceHeaders(requests);
  } finally {
    delete globalThis[API_KEY];
  }
});

// From here on, the app's setup: a context manager and the W3C propagator, registered through
// the real @opentelemetry/api, and a real tracer.
test("registering through @opentelemetry/api", () => {
  assert.ok(api.context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable()));
  assert.ok(api.propagation.setGlobalPropagator(new W3CTraceContextPropagator()));
  assert.equal(typeof globalThis[API_KEY]?.propagation?.inject, "function");
});

const tracer = new BasicTracerProvider().getTracer("promptd-client-tests");

test("session creation, step and record carry the active span's traceparent", async () => {
  const span = tracer.startSpan("agent turn");
  const requests = await api.context.with(api.trace.setSpan(api.context.active(), span), () => captured(sessionCalls));
  span.end();
  assert.ok(api.isSpanContextValid(span.spanContext()));
  assert.deepEqual(requests.map((r) => r.route), ROUTES);
  for (const { route, headers } of requests) {
    assert.equal(headers.traceparent, traceparent(span), route);
    assert.equal(headers.tracestate, undefined, route);
    // The client's own headers are still there, unchanged.
    assert.equal(headers.authorization, `Bearer ${TOKEN}`, route);
    assert.equal(headers.accept, "application/json", route);
  }
});

test("inside startActiveSpan, across awaits, the requests carry that span", async () => {
  let span;
  const requests = await tracer.startActiveSpan("agent turn", async (s) => {
    span = s;
    try {
      return await captured(sessionCalls);
    } finally {
      s.end();
    }
  });
  assert.deepEqual(requests.map((r) => r.route), ROUTES);
  for (const { route, headers } of requests) assert.equal(headers.traceparent, traceparent(span), route);
});

test("tracestate goes along when the trace has one", async () => {
  // A remote parent with a trace state, as a service called with one would have; the child
  // span inherits it.
  const parent = api.trace.setSpanContext(api.ROOT_CONTEXT, {
    traceId: "0af7651916cd43dd8448eb211c80319c",
    spanId: "00f067aa0ba902b7",
    traceFlags: api.TraceFlags.SAMPLED,
    isRemote: true,
    traceState: api.createTraceState("vendor=opaque-value"),
  });
  const span = tracer.startSpan("child", {}, parent);
  const requests = await api.context.with(api.trace.setSpan(parent, span), () => captured(sessionCalls));
  span.end();
  assert.equal(span.spanContext().traceId, "0af7651916cd43dd8448eb211c80319c");
  assert.deepEqual(requests.map((r) => r.route), ROUTES);
  for (const { route, headers } of requests) {
    assert.equal(headers.traceparent, traceparent(span), route);
    assert.equal(headers.tracestate, "vendor=opaque-value", route);
  }
});

test("the context is read at each call, not kept", async () => {
  const first = tracer.startSpan("first");
  const second = tracer.startSpan("second");
  const requests = await captured(async (url) => {
    const client = new Client(url, { token: TOKEN });
    const session = await api.context.with(api.trace.setSpan(api.ROOT_CONTEXT, first), () => client.session("coder"));
    await api.context.with(api.trace.setSpan(api.ROOT_CONTEXT, second), () => session.step({ user: "Hi" }));
    await session.record({ role: "assistant", content: "Hello." });
  });
  first.end();
  second.end();
  assert.notEqual(first.spanContext().spanId, second.spanContext().spanId);
  assert.deepEqual(requests.map((r) => r.route), ROUTES);
  assert.deepEqual(requests.map((r) => r.headers.traceparent), [traceparent(first), traceparent(second), undefined]);
});

test("registered, but with no active span, no trace header is sent", async () => {
  assert.equal(api.trace.getSpan(api.context.active()), undefined);
  const requests = await captured(sessionCalls);
  assert.deepEqual(requests.map((r) => r.route), ROUTES);
  assertNoTraceHeaders(requests);
});
