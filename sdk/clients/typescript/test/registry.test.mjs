// The daemon-wide routes: health, plugins, reload/unload/enable, metrics, the OpenAPI document,
// and the registry's event stream (against the daemon, and against a stand-in that splits
// the stream at awkward places).
import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { Client } from "promptd-client";
import { client } from "./daemon.mjs";

test("health, plugins and metrics", async () => {
  const health = await client.health();
  assert.equal(health.status, "ok");
  assert.match(health.version, /^\d+\.\d+\.\d+/);
  const plugins = await client.plugins();
  assert.equal(health.plugins, plugins.filter((p) => p.state === "loaded").length, "health counts the serving plugins");
  assert.deepEqual(plugins.map((p) => p.id).sort(), ["echo", "trapper"]);
  const echo = plugins.find((p) => p.id === "echo");
  assert.match(echo.sha256, /^[0-9a-f]{64}$/);
  assert.equal(echo.serving_sha256, echo.sha256);
  assert.deepEqual(echo.declares.tools.map((t) => t.name), ["read_file"]);
  const metrics = await client.metrics();
  assert.match(metrics, /^# HELP promptd_steps_total /m);
  assert.match(metrics, /^promptd_steps_total\{outcome="ok"\} \d+$/m);
});

test("the OpenAPI document describes every route the client uses", async () => {
  const doc = await client.openapi();
  assert.match(doc.openapi, /^3\.1\./);
  const used = [
    ["get", "/v1/health"],
    ["get", "/v1/plugins"],
    ["post", "/v1/plugins/reload"],
    ["delete", "/v1/plugins/{id}"],
    ["post", "/v1/plugins/{id}/enable"],
    ["post", "/v1/sessions"],
    ["get", "/v1/sessions"],
    ["get", "/v1/sessions/{id}/steps/{n}/explain"],
    ["get", "/v1/sessions/{id}/steps/{n}/diff"],
    ["post", "/v1/sessions/{id}/steps"],
    ["post", "/v1/sessions/{id}/messages"],
    ["post", "/v1/sessions/{id}/compact"],
    ["get", "/v1/sessions/{id}/usage"],
    ["get", "/v1/sessions/{id}/events"],
    ["get", "/v1/sessions/{id}/steps/{n}/request"],
    ["get", "/v1/events"],
    ["get", "/v1/openapi.json"],
    ["get", "/metrics"],
  ];
  const missing = used.filter(([method, path]) => !doc.paths?.[path]?.[method]);
  assert.deepEqual(missing, [], "routes the client calls that the document lacks");
});

test("the event stream replays the loads, then streams unload and reload live", async () => {
  const controller = new AbortController();
  const stream = client.registryEvents({ since: 0, signal: controller.signal });
  const seen = [];
  const next = async () => {
    const { value, done } = await stream.next();
    assert.equal(done, false, "the stream ended early");
    seen.push(value);
    return value;
  };
  // The first load of each plugin, in load (file name) order.
  const first = [await next(), await next()];
  assert.deepEqual(first.map((e) => [e.event, e.data.plugin]), [["load", "echo"], ["load", "trapper"]]);
  assert.deepEqual(first.map((e) => e.id), [1, 2]);
  assert.equal(first[0].data.seq, 1);
  assert.match(first[0].data.sha256, /^[0-9a-f]{64}$/);

  // Catch up with whatever the other test files changed, by resuming from the last event.
  const last = await lastEvent();
  while (seen.at(-1).id < last) await next();

  const unloaded = await client.unload("echo");
  assert.deepEqual(unloaded.map((e) => [e.kind, e.plugin]), [["unload", "echo"]]);
  const live = await next();
  assert.deepEqual([live.event, live.data.plugin, live.id], ["unload", "echo", unloaded[0].seq]);
  assert.deepEqual((await client.plugins()).map((p) => p.id), ["trapper"]);

  // The file is still there: a rescan loads it again.
  const reloaded = await client.reload();
  assert.deepEqual(reloaded.map((e) => [e.kind, e.plugin]), [["load", "echo"]]);
  const back = await next();
  assert.deepEqual([back.event, back.data.plugin, back.id], ["load", "echo", reloaded[0].seq]);
  assert.deepEqual(await client.reload(), [], "nothing changed since");

  // Aborting ends the iteration quietly.
  const pending = stream.next();
  controller.abort();
  assert.deepEqual(await pending, { value: undefined, done: true });

  // Resuming after an id replays only what came later.
  const resumed = client.registryEvents({ since: unloaded[0].seq, signal: AbortSignal.timeout(5000) });
  const after = (await resumed.next()).value;
  assert.deepEqual([after.event, after.id], ["load", reloaded[0].seq]);
  await resumed.return();
});

/** The id of the newest registry event: the last one a short-lived stream replays. */
async function lastEvent() {
  const controller = new AbortController();
  let last = 0;
  const timer = setTimeout(() => controller.abort(), 500); // the replay arrives at once
  for await (const e of client.registryEvents({ since: 0, signal: controller.signal })) last = e.id;
  clearTimeout(timer);
  return last;
}

test("a plugin quarantined after traps comes back with enable", async () => {
  const session = await client.session("crashy");
  let state;
  for (let i = 0; i < 10 && state !== "quarantined"; i++) {
    await session.step({ user: "hi" }).catch(() => {});
    state = (await client.plugins()).find((p) => p.id === "trapper").state;
  }
  assert.equal(state, "quarantined");
  const quarantined = (await client.plugins()).find((p) => p.id === "trapper");
  assert.equal(quarantined.last_error.code, "quarantined");
  assert.match(quarantined.last_error.message, /trap_section called/);
  const applied = await client.enable("trapper");
  assert.deepEqual(applied.map((e) => [e.kind, e.plugin]), [["load", "trapper"]]);
  assert.equal((await client.plugins()).find((p) => p.id === "trapper").state, "loaded");
  assert.deepEqual(await client.enable("trapper"), [], "enabling a loaded plugin does nothing");
});

test("the stream parser: split lines, CRLF, comments, multi-line data, then lagged ends it", async () => {
  const event = (id, kind, plugin) => ({ seq: id, kind, plugin, file: `${plugin}.wasm`, sha256: "00", error: null });
  const data1 = JSON.stringify(event(7, "load", "a"));
  const data2 = JSON.stringify(event(8, "refused", "b"), null, 1); // pretty: three data lines
  const wire =
    ": keep-alive\r\n\r\n" +
    `id: 7\r\nevent: load\r\ndata: ${data1}\r\n\r\n` +
    `id:8\nevent:refused\n${data2.split("\n").map((l) => `data: ${l}`).join("\n")}\n\n` +
    'event: lagged\rdata: {"missed": 3}\r\r';
  let path;
  const server = createServer((req, res) => {
    path = req.url;
    res.writeHead(200, { "Content-Type": "text/event-stream" });
    // Chunks that cut a CRLF, a field name and a UTF-8-free JSON line in the middle.
    const cuts = [3, 14, 15, 40, 41, 90, wire.length - 1];
    let from = 0;
    for (const at of cuts) {
      res.write(wire.slice(from, at));
      from = at;
    }
    res.end(wire.slice(from));
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  try {
    const stand = new Client(`http://127.0.0.1:${server.address().port}`);
    const got = [];
    for await (const e of stand.registryEvents({ since: 6 })) got.push(e);
    assert.equal(path, "/v1/events?since=6");
    assert.deepEqual(got, [
      { event: "load", id: 7, data: event(7, "load", "a") },
      { event: "refused", id: 8, data: event(8, "refused", "b") },
      { event: "lagged", id: null, data: { missed: 3 } },
    ]);
  } finally {
    await new Promise((resolve) => server.close(resolve));
  }
});
