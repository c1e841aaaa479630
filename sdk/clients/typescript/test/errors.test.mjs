// promptd's errors as typed exceptions: from the real daemon (unknown session, 422 from
// assembly, 400, 401, 404, 413, 502), from nothing listening, and from a local stand-in for
// what a proxy in between may answer (non-JSON bodies, every status family, a hang).
import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import {
  BadRequestError,
  Client,
  ConflictError,
  DaemonUnreachableError,
  InternalError,
  MethodNotAllowedError,
  NotFoundError,
  PayloadTooLargeError,
  PluginFailedError,
  PromptdError,
  TimeoutError,
  UnauthorizedError,
  UnavailableError,
  UnprocessableError,
} from "promptd-client";
import { client, FACTS, token, url } from "./daemon.mjs";

/** Expects `promise` to reject with an instance of `Class` carrying `code` and `status`;
 * returns the error for further checks. */
async function fails(promise, Class, code, status) {
  let error;
  await assert.rejects(promise, (e) => {
    error = e;
    return true;
  });
  assert.ok(error instanceof Class, `expected ${Class.name}, got ${error?.name}: ${error?.message}`);
  assert.ok(error instanceof PromptdError);
  assert.equal(error.name, Class.name);
  assert.equal(error.code, code, error.message);
  assert.equal(error.status, status, error.message);
  assert.ok(error.message.length > 0);
  return error;
}

test("an unknown session is a NotFoundError with code unknown_session", async () => {
  const e = await fails(client.sessionOf("no-such-session"), NotFoundError, "unknown_session", 404);
  assert.equal(e.message, "no session `no-such-session`");
  assert.equal(e.request, "GET /v1/sessions/no-such-session/events");
});

test("a 422 from assembly is an UnprocessableError with the daemon's code and message; the session goes on", async () => {
  const session = await client.session("default");
  const e = await fails(
    session.step({ user: "hi", facts: { text: "Hi {{nobody}}" } }),
    UnprocessableError,
    "unknown_variable",
    422,
  );
  assert.match(e.message, /`nobody`/);
  assert.match(e.message, /section `text` \(plugin `echo`\)/);
  assert.deepEqual((await session.events()).map((x) => x.kind), ["session/created"], "a failed step records nothing");
  const ok = await session.step({ user: "hi", facts: FACTS });
  assert.equal(ok.step, 1);
  assert.equal(ok.body.system, "Hi Ada");
  // Other 422s: blank user text, and a result for a call nobody made.
  await fails(session.step({ user: "   ", facts: FACTS }), UnprocessableError, "empty_message", 422);
  await fails(session.toolResult("ghost", "x"), UnprocessableError, "unknown_tool_call", 422);
});

test("malformed input is a BadRequestError; an unknown step, plugin or route a NotFoundError", async () => {
  const session = await client.session("default");
  await fails(session.step({ user: "hi", format: "yaml" }), BadRequestError, "bad_request", 400);
  await fails(client.session("not an agent!"), BadRequestError, "invalid_agent", 400);
  await session.step({ user: "hi", facts: FACTS });
  const e = await fails(session.request(9), NotFoundError, "unknown_step", 404);
  assert.match(e.message, /has no step 9 \(it has 1\)/);
  await fails(client.unload("nope"), NotFoundError, "unknown_plugin", 404);
  await fails(client.enable("nope"), NotFoundError, "unknown_plugin", 404);
});

test("without the token every route but health is an UnauthorizedError", async () => {
  const anonymous = new Client(url);
  assert.equal((await anonymous.health()).status, "ok");
  const e = await fails(anonymous.session("default"), UnauthorizedError, "unauthorized", 401);
  assert.match(e.message, /Authorization: Bearer/);
  await fails(new Client(url, { token: `${token}-wrong` }).plugins(), UnauthorizedError, "unauthorized", 401);
});

test("a body over [limits] max_body_mb is a PayloadTooLargeError", async () => {
  const session = await client.session("default");
  const e = await fails(
    session.step({ user: "x".repeat(2 << 20), facts: FACTS }),
    PayloadTooLargeError,
    "body_too_large",
    413,
  );
  assert.match(e.message, /limits\.max_body_mb/);
});

test("a plugin that traps is a PluginFailedError", async () => {
  const session = await client.session("crashy");
  const e = await fails(session.step({ user: "hi" }), PluginFailedError, "plugin_trap", 502);
  assert.match(e.message, /plugin `trapper`/);
});

/** A port nothing listens on: bound by the system, then closed. */
async function closedPort() {
  const server = createServer();
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve));
  return port;
}

test("a daemon that is not running is a DaemonUnreachableError with code unreachable", async () => {
  const dead = `http://127.0.0.1:${await closedPort()}`;
  const gone = new Client(dead, { token });
  const e = await fails(gone.health(), DaemonUnreachableError, "unreachable", 0);
  assert.match(e.message, /ECONNREFUSED/);
  assert.ok(e.message.includes(dead), e.message);
  assert.match(e.message, /promptd serve/);
  await fails(gone.session("default"), DaemonUnreachableError, "unreachable", 0);
  // The event stream too, before any event.
  await fails(gone.registryEvents().next(), DaemonUnreachableError, "unreachable", 0);
});

test("a malformed address is refused at once", () => {
  assert.throws(() => new Client("not a url"), TypeError);
  assert.throws(() => new Client("unix:/tmp/promptd.sock"), /http:\/\/ or https:\/\//);
});

/** A local HTTP server whose answers `handle(req, res)` writes; the requests it got. */
async function standIn(handle) {
  const seen = [];
  const server = createServer((req, res) => {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", () => {
      seen.push({ method: req.method, url: req.url, headers: req.headers, body });
      handle(req, res);
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const stop = () => {
    server.closeAllConnections();
    return new Promise((resolve) => server.close(resolve));
  };
  return { url: `http://127.0.0.1:${server.address().port}`, seen, stop };
}

test("each status family is its own class, with the daemon's code; the token goes as a bearer header", async () => {
  const families = [
    [400, BadRequestError],
    [401, UnauthorizedError],
    [404, NotFoundError],
    [405, MethodNotAllowedError],
    [409, ConflictError],
    [413, PayloadTooLargeError],
    [422, UnprocessableError],
    [500, InternalError],
    [502, PluginFailedError],
    [503, UnavailableError],
    [418, PromptdError],
  ];
  let status = 0;
  const server = await standIn((req, res) => {
    res.writeHead(status, { "Content-Type": "application/json" });
    res.end(JSON.stringify({ error: { code: `code_${status}`, message: `message ${status}` } }));
  });
  try {
    const stand = new Client(server.url, { token: "s3cret" });
    for (const [s, Class] of families) {
      status = s;
      const e = await fails(stand.plugins(), Class, `code_${s}`, s);
      assert.equal(e.message, `message ${s}`);
    }
    assert.ok(server.seen.every((r) => r.headers.authorization === "Bearer s3cret"));
  } finally {
    await server.stop();
  }
});

test("an answer that is not promptd's JSON still gives a typed error naming the status", async () => {
  let answer = () => {};
  const server = await standIn((req, res) => answer(res));
  try {
    const stand = new Client(server.url);
    answer = (res) => {
      res.writeHead(503, { "Content-Type": "text/html" });
      res.end("<html><body>503 Service Temporarily Unavailable</body></html>");
    };
    let e = await fails(stand.health(), UnavailableError, "invalid_response", 503);
    assert.match(e.message, /HTTP 503/);
    assert.match(e.message, /Service Temporarily Unavailable/);
    answer = (res) => {
      res.writeHead(502);
      res.end();
    };
    e = await fails(stand.plugins(), PluginFailedError, "invalid_response", 502);
    assert.match(e.message, /GET \/v1\/plugins answered HTTP 502/);
    answer = (res) => {
      res.writeHead(200, { "Content-Type": "application/json" });
      res.end("{not json");
    };
    e = await fails(stand.plugins(), PromptdError, "invalid_response", 200);
    assert.match(e.message, /not JSON/);
  } finally {
    await server.stop();
  }
});

test("a daemon that does not answer within timeoutMs is a TimeoutError", async () => {
  const server = await standIn(() => {}); // never answers
  try {
    const started = Date.now();
    const e = await fails(new Client(server.url, { timeoutMs: 300 }).health(), TimeoutError, "timeout", 0);
    assert.match(e.message, /within 300 ms/);
    assert.ok(Date.now() - started < 5000);
    await fails(new Client(server.url, { timeoutMs: 300 }).registryEvents().next(), TimeoutError, "timeout", 0);
  } finally {
    await server.stop();
  }
});
