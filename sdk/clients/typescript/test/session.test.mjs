// Sessions against the real daemon: steps, replies in every provider shape, tool results, the
// open-call bookkeeping, rebuilds, usage and compaction.
import { test } from "node:test";
import assert from "node:assert/strict";
import { OpenToolCallsError, PromptdError, converseInput } from "promptd-client";
import { client, FACTS, openaiToolCall } from "./daemon.mjs";

const kinds = async (session) => (await session.events()).map((e) => e.kind);

test("a step, an OpenAI reply with a tool call, its result, and the next step", async () => {
  const session = await client.session("default", { format: "openai" });
  assert.equal(session.agent, "default");
  assert.ok(session.id.length > 0);

  const first = await session.step({ user: "Read the README.", facts: FACTS });
  assert.equal(first.step, 1);
  assert.equal(first.body.model, "gpt-test");
  assert.deepEqual(first.body.messages[0], { role: "system", content: "Hi Ada" });
  assert.deepEqual(first.body.messages.at(-1), { role: "user", content: "Read the README." });
  assert.equal(first.body.tools[0].function.name, "read_file");
  assert.equal(first.body.prompt_cache_key, `promptd-${session.agent}`); // K6: the agent's key
  assert.equal(typeof first.usage.total.tokens, "number");
  assert.equal(first.usage.message_count, 1);

  // The arguments as a model writes them (a space after the colon): kept byte for byte.
  const args = '{"path": "README.md"}';
  const recorded = await session.record(openaiToolCall("call_1", args));
  assert.deepEqual(recorded.toolCalls, [{ id: "call_1", name: "read_file", arguments: { path: "README.md" } }]);
  assert.ok(Number.isInteger(recorded.seq));
  assert.deepEqual(session.openToolCalls.map((c) => c.id), ["call_1"]);

  // A step now would leave call_1 open: refused before anything is sent.
  const before = await kinds(session);
  await assert.rejects(session.step({ user: "And then?", facts: FACTS }), (e) => {
    assert.ok(e instanceof OpenToolCallsError, `${e}`);
    assert.equal(e.code, "open_tool_calls");
    assert.equal(e.status, 0);
    assert.deepEqual(e.callIds, ["call_1"]);
    assert.match(e.message, /`call_1`/);
    assert.match(e.message, /toolResult/);
    return true;
  });
  assert.deepEqual(await kinds(session), before, "the refused step sent nothing");

  const result = await session.toolResult("call_1", "# promptd");
  assert.equal(result.seq, recorded.seq + 1);
  assert.deepEqual(session.openToolCalls, []);

  const second = await session.step({ facts: FACTS });
  assert.equal(second.step, 2);
  const assistant = second.body.messages.find((m) => m.role === "assistant");
  assert.equal(assistant.tool_calls[0].id, "call_1");
  assert.equal(assistant.tool_calls[0].function.arguments, args, "the model's own string, not encoded again");
  const tool = second.body.messages.find((m) => m.role === "tool");
  assert.equal(tool.tool_call_id, "call_1");
  assert.equal(tool.content, "# promptd");

  // Rebuilds from the log are the bodies the steps returned.
  assert.deepEqual(await session.request(1), first.body);
  assert.deepEqual(await session.request(2), second.body);
  const neutral = await session.request(2, { format: "neutral" });
  assert.equal(neutral.system, "Hi Ada");
  assert.deepEqual(neutral.messages.find((m) => m.role === "assistant").tool_calls[0].arguments, { path: "README.md" });

  assert.deepEqual(await kinds(session), [
    "session/created",
    "user/message",
    "request/header",
    "step",
    "assistant/message",
    "tool/result",
    "step",
  ]);
});

test("every reply shape the SDKs return gives its tool calls; results in a step's messages answer them", async () => {
  const session = await client.session(undefined, { format: "anthropic" });
  assert.equal(session.agent, "default", "the daemon's default agent");
  await session.step({ user: "Look around.", facts: FACTS });

  // Anthropic: the whole message object, as messages.create returns it.
  const message = {
    id: "msg_1",
    type: "message",
    role: "assistant",
    model: "claude-test",
    content: [
      { type: "text", text: "Let me look." },
      { type: "tool_use", id: "toolu_1", name: "read_file", input: { path: "a.txt" } },
    ],
    stop_reason: "tool_use",
    stop_sequence: null,
    usage: { input_tokens: 40, output_tokens: 9, cache_creation_input_tokens: 0, cache_read_input_tokens: 30 },
  };
  let r = await session.record(message);
  assert.deepEqual(r.toolCalls, [{ id: "toolu_1", name: "read_file", arguments: { path: "a.txt" } }]);
  // The result goes with the next step instead of toolResult: the step answers the call.
  const step2 = await session.step({
    messages: [{ role: "tool", tool_call_id: "toolu_1", content: "alpha" }],
    user: "Now the next one.",
    facts: FACTS,
  });
  assert.deepEqual(session.openToolCalls, []);
  const turn = step2.body.messages.find((m) => m.role === "user" && m.content.some((b) => b.type === "tool_result"));
  assert.equal(turn.content[0].tool_use_id, "toolu_1", "tool results first in their turn");
  assert.deepEqual(
    step2.body.messages.find((m) => m.role === "assistant").content.map((b) => b.type),
    ["text", "tool_use"],
  );

  // OpenAI Chat Completions: the whole completion.
  const completion = {
    id: "chatcmpl-1",
    object: "chat.completion",
    created: 1767225600,
    model: "gpt-test",
    choices: [{ index: 0, finish_reason: "tool_calls", logprobs: null, message: openaiToolCall("call_2", '{"path":"b.txt"}') }],
    usage: { prompt_tokens: 50, completion_tokens: 7, total_tokens: 57 },
  };
  r = await session.record(completion);
  assert.deepEqual(r.toolCalls, [{ id: "call_2", name: "read_file", arguments: { path: "b.txt" } }]);
  await session.toolResult("call_2", "beta");
  await session.step({ facts: FACTS });

  // OpenAI Responses: the response's output items.
  r = await session.record({
    id: "resp_1",
    object: "response",
    output: [
      { type: "reasoning", id: "rs_1", summary: [] },
      { type: "function_call", id: "fc_1", call_id: "call_3", name: "read_file", arguments: '{"path":"c.txt"}', status: "completed" },
    ],
    output_text: "",
  });
  assert.deepEqual(r.toolCalls, [{ id: "call_3", name: "read_file", arguments: { path: "c.txt" } }]);
  await session.toolResult("call_3", "gamma");
  await session.step({ facts: FACTS });

  // promptd's neutral shape, arguments as an object.
  r = await session.record({ role: "assistant", content: "", tool_calls: [{ id: "n_4", name: "read_file", arguments: { path: "d.txt" } }] });
  assert.deepEqual(r.toolCalls, [{ id: "n_4", name: "read_file", arguments: { path: "d.txt" } }]);
  await session.toolResult("n_4", "delta");
  await session.step({ facts: FACTS });

  // A reply without calls opens none.
  r = await session.record({ role: "assistant", content: [{ type: "text", text: "Done." }] });
  assert.deepEqual(r.toolCalls, []);
  assert.deepEqual(session.openToolCalls, []);

  // Every call was recorded once and answered once, in order.
  const events = await session.events();
  const calls = events.filter((e) => e.kind === "assistant/message").flatMap((e) => (e.body.tool_calls ?? []).map((c) => c.id));
  const results = events.filter((e) => e.kind === "tool/result").map((e) => e.body.tool_call_id);
  assert.deepEqual(calls, ["toolu_1", "call_2", "call_3", "n_4"]);
  assert.deepEqual(results, calls);

  // The provider usage of the whole message and the whole completion was kept.
  const usage = await session.usage();
  assert.equal(usage.steps.length, 5);
  assert.ok(usage.totals.compared_steps >= 2, JSON.stringify(usage));
  assert.ok(usage.totals.actual > 0, JSON.stringify(usage));
  // Each reply recorded with its usage carries its cache outcome; the ledger counts them.
  const judged = usage.steps.filter((s) => s.cache).map((s) => s.cache.outcome);
  assert.ok(judged.length >= 2 && !judged.includes("unexplained"), JSON.stringify(judged));
  assert.ok(usage.ledger.replies >= usage.totals.compared_steps, JSON.stringify(usage.ledger));
  const summary = await client.usage({ agent: "default" });
  assert.deepEqual(Object.keys(summary.agents), ["default"]);
  assert.ok(summary.agents.default.replies >= usage.ledger.replies, JSON.stringify(summary));
});

test("a Gemini response's calls without ids come back named by the daemon; a Bedrock response's keep theirs", async () => {
  const session = await client.session(undefined, { format: "anthropic" });
  await session.step({ user: "Look.", facts: FACTS });
  // google-genai's GenerateContentResponse: a call without an id, with its thought signature.
  const gemini = {
    candidates: [{
      content: { role: "model", parts: [
        { functionCall: { name: "read_file", args: { path: "a.txt" } }, thoughtSignature: "+/8Ac2ln" },
      ] },
      finishReason: "STOP",
    }],
    modelVersion: "gemini-3-pro-preview",
    usageMetadata: { promptTokenCount: 40, candidatesTokenCount: 5, totalTokenCount: 45 },
  };
  let r = await session.record(gemini);
  const named = `call_${r.seq}_0`;
  assert.deepEqual(r.toolCalls, [{ id: named, name: "read_file", arguments: { path: "a.txt" } }]);
  assert.deepEqual(session.openToolCalls.map((c) => c.id), [named]);
  await session.toolResult(named, "alpha");
  await session.step({ facts: FACTS });
  // boto3's / the AWS SDK's ConverseResponse.
  r = await session.record({
    output: { message: { role: "assistant", content: [
      { toolUse: { toolUseId: "tooluse_1", name: "read_file", input: { path: "b.txt" } } },
    ] } },
    stopReason: "tool_use",
    usage: { inputTokens: 3, outputTokens: 2, totalTokens: 5 },
    metrics: { latencyMs: 1 },
  });
  assert.deepEqual(r.toolCalls, [{ id: "tooluse_1", name: "read_file", arguments: { path: "b.txt" } }]);
  await session.toolResult("tooluse_1", "beta");
  await session.step({ facts: FACTS });
  assert.deepEqual(session.openToolCalls, []);
});

test("converseInput hands the AWS SDK a bedrock body's media as bytes, the body keeping its base64", async () => {
  const png = "iVBORw0KGgoAAAANSUhEUgAAAAQAAAADCAIAAAA7ljmRAAAAEElEQVR4nGM4oaEBRww4OQAHpg0hlLAT/AAAAABJRU5ErkJggg==";
  const session = await client.session(undefined, { format: "bedrock" });
  const { body } = await session.step({
    user: [{ type: "text", text: "Look." }, { type: "image", media_type: "image/png", data: png }],
    facts: FACTS,
  });
  const block = body.messages[0].content[1].image;
  assert.equal(block.format, "png");
  assert.equal(block.source.bytes, png, "the body keeps the REST API's base64");
  const input = converseInput(body);
  const sent = input.messages[0].content[1].image.source.bytes;
  assert.ok(sent instanceof Uint8Array);
  assert.deepEqual(Buffer.from(sent), Buffer.from(png, "base64"));
  assert.equal(body.messages[0].content[1].image.source.bytes, png, "a copy: the body is unchanged");
  assert.equal(input.modelId, "gpt-test");
});

test("toolResult sends text as it is, other values as their JSON text once, and isError", async () => {
  const session = await client.session("default");
  await session.step({ user: "Go.", facts: FACTS });
  await session.record(openaiToolCall("c_a", "{}"));
  await session.record({ role: "tool", tool_call_id: "c_a", content: "via record" });
  assert.deepEqual(session.openToolCalls, [], "a tool message through record() answers its call too");
  await session.step({ facts: FACTS });
  await session.record({ role: "assistant", content: "", tool_calls: [
    { id: "c_b", name: "read_file", arguments: {} },
    { id: "c_c", name: "read_file", arguments: {} },
    { id: "c_d", name: "read_file", arguments: {} },
  ] });
  await session.toolResult("c_b", '{"already": "json text"}');
  await session.toolResult("c_c", { lines: 3, files: ["a", "b"] });
  await session.toolResult("c_d", "no such file", { isError: true });
  const results = (await session.events()).filter((e) => e.kind === "tool/result").map((e) => e.body);
  assert.equal(results[1].content, '{"already": "json text"}', "a string is never encoded again");
  assert.equal(results[2].content, '{"lines":3,"files":["a","b"]}');
  assert.equal(results[2].is_error, undefined);
  assert.equal(results[3].is_error, true);
  assert.equal(results[3].content, "no such file");
});

test("arguments encoded twice are refused before they are sent", async () => {
  const session = await client.session("default");
  await session.step({ user: "Go.", facts: FACTS });
  const before = await kinds(session);
  const twice = JSON.stringify(JSON.stringify({ path: "a" }));
  for (const reply of [
    openaiToolCall("c_2x", twice),
    { role: "assistant", content: "", tool_calls: [{ id: "c_2x", name: "read_file", arguments: twice }] },
  ]) {
    await assert.rejects(session.record(reply), (e) => {
      assert.ok(e instanceof PromptdError, `${e}`);
      assert.equal(e.code, "invalid_arguments");
      assert.equal(e.status, 0);
      assert.match(e.message, /`c_2x`.*encoded twice/);
      return true;
    });
  }
  assert.deepEqual(await kinds(session), before, "nothing reached the daemon");
  assert.deepEqual(session.openToolCalls, []);
});

test("sessionOf reads a session back from its log; the daemon's open_tool_calls is typed too", async () => {
  const writer = await client.session("default", { format: "openai" });
  await writer.step({ user: "Go.", facts: FACTS });
  const reader = await client.sessionOf(writer.id, { format: "openai" });
  assert.equal(reader.agent, "default");
  assert.deepEqual(reader.openToolCalls, []);

  await writer.record(openaiToolCall("c_open", '{"path":"x"}'));
  // `reader` has not seen the call: the daemon refuses the step, and the error names it.
  await assert.rejects(reader.step({ user: "More.", facts: FACTS }), (e) => {
    assert.ok(e instanceof OpenToolCallsError, `${e}`);
    assert.equal(e.status, 422);
    assert.equal(e.code, "open_tool_calls");
    assert.deepEqual(e.callIds, ["c_open"]);
    assert.equal(e.request, `POST /v1/sessions/${writer.id}/steps`);
    return true;
  });
  assert.deepEqual(reader.openToolCalls, [{ id: "c_open", name: "read_file", arguments: { path: "x" } }], "read back after the refusal");

  const again = await client.sessionOf(writer.id);
  assert.deepEqual(again.openToolCalls.map((c) => c.id), ["c_open"]);
  await again.toolResult("c_open", "x's text");
  // `writer` still counts c_open as open (another object answered it) until it reads the log.
  assert.deepEqual(writer.openToolCalls.map((c) => c.id), ["c_open"]);
  await writer.sync();
  assert.deepEqual(writer.openToolCalls, []);
  const next = await writer.step({ facts: FACTS });
  assert.equal(next.step, 2);
});

test("compact shows a summary in place of a range of messages in later requests", async () => {
  const session = await client.session("default", { format: "neutral" });
  await session.step({ user: "First question, long ago.", facts: FACTS });
  await session.record({ role: "assistant", content: "First answer." });
  await session.step({ user: "Second question.", facts: FACTS });
  const events = await session.events();
  const from = events.find((e) => e.kind === "user/message").seq;
  const to = events.find((e) => e.kind === "assistant/message").seq;
  const seq = await session.compact(from, to, "We talked about the first question.");
  assert.ok(seq > to);
  await session.record({ role: "assistant", content: "Second answer." });
  const third = await session.step({ user: "Third.", facts: FACTS });
  const texts = third.body.messages.map((m) => (typeof m.content === "string" ? m.content : JSON.stringify(m.content)));
  assert.ok(texts.some((t) => t.includes("We talked about the first question.")), texts.join("\n"));
  assert.ok(!texts.some((t) => t.includes("First answer.")), texts.join("\n"));
  // Past steps rebuild unchanged.
  const first = await session.request(1);
  assert.deepEqual(first.messages.map((m) => m.content), ["First question, long ago."]);
});

test("sessions lists them; explain and diff say who gave each part and what a cache could reuse", async () => {
  const agent = `lister${process.pid}`;
  const session = await client.session(agent, { format: "openai" });
  await session.step({ user: "One.", facts: FACTS });
  await session.record({ role: "assistant", content: "Reply one." });
  await session.step({ user: "Two.", facts: FACTS });

  const mine = await client.sessions({ q: agent });
  assert.deepEqual(mine.map((s) => [s.id, s.agent, s.steps]), [[session.id, agent, 2]]);
  assert.ok(mine[0].events > 0 && mine[0].last_ms >= mine[0].created_ms, JSON.stringify(mine[0]));
  assert.equal((await client.sessions({ limit: 1 })).length, 1);
  assert.ok((await client.sessions()).some((s) => s.id === session.id));

  const explained = await session.explain(1);
  assert.equal(explained.step, 1);
  assert.equal(explained.format, "openai");
  assert.deepEqual(explained.request, await session.request(1), "the request as the step returned it");
  const given = (list) => list.map((g) => [g.name, g.plugin, g.scope]);
  assert.deepEqual(given(explained.provenance.sections), [["text", "echo", "global"]]);
  assert.deepEqual(given(explained.provenance.tools), [["read_file", "echo", "global"]]);
  assert.match(explained.provenance.plugins.echo, /^[0-9a-f]{64}$/);

  const diff = await session.diff(2);
  assert.equal(diff.step, 2);
  assert.equal(diff.previous.step, 1);
  assert.equal(diff.previous.prefix_kept, true, JSON.stringify(diff));
  assert.ok(diff.previous.shared_bytes > 0 && diff.previous.shared_bytes <= diff.bytes, JSON.stringify(diff));
  assert.ok(Array.isArray(diff.causes) && diff.cached_share.bytes > 0, JSON.stringify(diff));
  assert.equal((await session.diff(1)).previous, null, "nothing before the first step");
});

test("a session keeps each format's body from the parts the daemon sends, byte for byte", async () => {
  // Issue 31: a step asks for what changed since the body the session keeps.
  const { url, token } = await import("./daemon.mjs");
  const session = await client.session("default");
  for (const format of ["neutral", "openai", "anthropic", "openai-responses"]) {
    for (let turn = 0; turn < 3; turn++) {
      const result = await session.step({ user: `${format} turn ${turn}: "é" \\ </data>`, facts: FACTS, format });
      const raw = await fetch(`${url}/v1/sessions/${session.id}/steps/${result.step}/request?format=${format}`, {
        headers: { Authorization: `Bearer ${token}` },
      });
      assert.equal(raw.status, 200);
      assert.equal(result.text, await raw.text(), `${format} turn ${turn}`);
      assert.deepEqual(JSON.parse(result.text), result.body);
      const id = `c-${format}-${turn}`;
      await session.record(openaiToolCall(id, '{"path":"README.md"}'));
      await session.toolResult(id, "# promptd\n");
      const after = await session.step({ facts: FACTS, format });
      assert.deepEqual(JSON.parse(after.text), await session.request(after.step, { format }));
      await session.record({ role: "assistant", content: `Done ${turn}.` });
    }
  }
});
