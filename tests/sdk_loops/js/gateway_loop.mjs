// An agent loop on an official npm SDK whose only change is its base URL: promptd's gateway.
// The same loop as ../gateway_loop.py, on the `openai` and `@anthropic-ai/sdk` clients.
//
//     node gateway_loop.mjs SDK BASE_URL [--stream] [--turns N] [--header NAME=VALUE ...]
//
// SDK is `openai-chat`, `openai-responses` or `anthropic`. The loop is what an agent written
// against the SDK does, with nothing of promptd in it: it keeps its own history, offers one tool
// (`read_file`), answers each tool call with a result, and after each final answer sends the
// next user message, for N user turns. Streamed (--stream), it folds the stream as an SDK user
// does (text and tool-call fragments by index; Responses' `response.completed`; the anthropic
// client's own stream helper, `finalMessage()`). --header adds a header to every request (e.g.
// `x-promptd-fact-cwd=/repo`).
//
// Prints one line of JSON: {"requests", "turns", "texts": [final text of each turn],
// "calls": [tool call ids], "usage": [the usage each reply reported]}; exits 1 with the SDK's
// error on any failure.

import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";

const TIMEOUT_MS = 60_000;
const SDKS = ["openai-chat", "openai-responses", "anthropic"];
const TOOL_SCHEMA = {
  type: "object",
  properties: { path: { type: "string" } },
  required: ["path"],
};

function usage(message) {
  console.error(message);
  console.error(
    "usage: node gateway_loop.mjs SDK BASE_URL [--stream] [--turns N] [--header NAME=VALUE ...]",
  );
  process.exit(2);
}

function argsOf(argv = process.argv.slice(2)) {
  const positional = [];
  const args = { stream: false, turns: 2, headers: {} };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === "--stream") {
      args.stream = true;
    } else if (arg === "--turns") {
      args.turns = Number(argv[++i]);
      if (!Number.isInteger(args.turns)) usage(`--turns wants an integer, not ${argv[i]}`);
    } else if (arg === "--header") {
      const header = argv[++i];
      if (header === undefined) usage("--header wants NAME=VALUE");
      const at = header.indexOf("=");
      const [name, value] = at < 0 ? [header, ""] : [header.slice(0, at), header.slice(at + 1)];
      args.headers[name] = value;
    } else if (arg.startsWith("--")) {
      usage(`unknown option ${arg}`);
    } else {
      positional.push(arg);
    }
  }
  if (positional.length !== 2) usage("want SDK and BASE_URL");
  [args.sdk, args.base] = positional;
  if (!SDKS.includes(args.sdk)) usage(`SDK is one of ${SDKS.join(", ")}, not ${args.sdk}`);
  return args;
}

class Log {
  requests = 0;
  texts = [];
  calls = [];
  usage = [];
}

function userTurn(turn) {
  return { role: "user", content: `Turn ${turn}: read a file, then answer.` };
}

async function chat(args, log) {
  const client = new OpenAI({
    baseURL: `${args.base}/v1`,
    apiKey: "sk-client-key-chat",
    maxRetries: 0,
    timeout: TIMEOUT_MS,
    defaultHeaders: args.headers,
  });
  const tools = [
    {
      type: "function",
      function: { name: "read_file", description: "Read a file.", parameters: TOOL_SCHEMA },
    },
  ];
  const messages = [{ role: "system", content: "You are the client's own agent." }];
  for (let turn = 1; turn <= args.turns; turn++) {
    messages.push(userTurn(turn));
    for (;;) {
      log.requests += 1;
      const body = { model: "gpt-4.1", messages, tools };
      let text = "";
      let calls;
      let used = null;
      if (args.stream) {
        const byIndex = new Map();
        for await (const chunk of await client.chat.completions.create({ ...body, stream: true })) {
          if (chunk.usage != null) used = chunk.usage;
          for (const choice of chunk.choices) {
            const delta = choice.delta;
            text += delta.content ?? "";
            for (const frag of delta.tool_calls ?? []) {
              if (!byIndex.has(frag.index)) byIndex.set(frag.index, { id: null, name: "", args: "" });
              const call = byIndex.get(frag.index);
              if (frag.id) call.id = frag.id;
              if (frag.function?.name) call.name = frag.function.name;
              if (frag.function?.arguments) call.args += frag.function.arguments;
            }
          }
        }
        calls = [...byIndex.keys()].sort((a, b) => a - b).map((i) => byIndex.get(i));
      } else {
        const reply = await client.chat.completions.create(body);
        const message = reply.choices[0].message;
        text = message.content ?? "";
        used = reply.usage ?? null;
        calls = (message.tool_calls ?? []).map((c) => ({
          id: c.id,
          name: c.function.name,
          args: c.function.arguments,
        }));
      }
      log.usage.push(used);
      const assistant = { role: "assistant", content: text || null };
      if (calls.length > 0) {
        assistant.tool_calls = calls.map((c) => ({
          id: c.id,
          type: "function",
          function: { name: c.name, arguments: c.args },
        }));
      }
      messages.push(assistant);
      if (calls.length === 0) {
        log.texts.push(text);
        break;
      }
      for (const c of calls) {
        log.calls.push(c.id);
        messages.push({ role: "tool", tool_call_id: c.id, content: `contents of ${c.id}` });
      }
    }
  }
}

// A response's text as the SDK's `output_text` gives it (which a streamed event's response
// does not carry).
function outputText(response) {
  return response.output
    .filter((o) => o.type === "message")
    .flatMap((o) => o.content)
    .filter((c) => c.type === "output_text")
    .map((c) => c.text)
    .join("");
}

async function responses(args, log) {
  const client = new OpenAI({
    baseURL: `${args.base}/v1`,
    apiKey: "sk-client-key-resp",
    maxRetries: 0,
    timeout: TIMEOUT_MS,
    defaultHeaders: args.headers,
  });
  const tools = [
    {
      type: "function",
      name: "read_file",
      description: "Read a file.",
      parameters: TOOL_SCHEMA,
      strict: false,
    },
  ];
  const items = [];
  for (let turn = 1; turn <= args.turns; turn++) {
    items.push(userTurn(turn));
    for (;;) {
      log.requests += 1;
      const body = {
        model: "gpt-4.1",
        instructions: "You are the client's own agent.",
        input: items,
        tools,
      };
      let response = null;
      if (args.stream) {
        for await (const event of await client.responses.create({ ...body, stream: true })) {
          if (event.type === "response.completed") response = event.response;
        }
        if (response === null) throw new Error("the stream had no response.completed");
      } else {
        response = await client.responses.create(body);
      }
      log.usage.push(response.usage ?? null);
      const calls = response.output.filter((o) => o.type === "function_call");
      for (const o of response.output) {
        if (o.type === "message" || o.type === "function_call") items.push(o);
      }
      if (calls.length === 0) {
        log.texts.push(response.output_text ?? outputText(response));
        break;
      }
      for (const c of calls) {
        log.calls.push(c.call_id);
        items.push({ type: "function_call_output", call_id: c.call_id, output: `contents of ${c.call_id}` });
      }
    }
  }
}

async function anthropic(args, log) {
  const client = new Anthropic({
    baseURL: args.base,
    apiKey: "sk-ant-client-key",
    maxRetries: 0,
    timeout: TIMEOUT_MS,
    defaultHeaders: args.headers,
  });
  const tools = [{ name: "read_file", description: "Read a file.", input_schema: TOOL_SCHEMA }];
  const system = [
    { type: "text", text: "You are the client's own agent.", cache_control: { type: "ephemeral" } },
  ];
  const messages = [];
  for (let turn = 1; turn <= args.turns; turn++) {
    messages.push(userTurn(turn));
    for (;;) {
      log.requests += 1;
      const body = { model: "claude-sonnet-4-5", max_tokens: 1024, system, messages, tools };
      const message = args.stream
        ? await client.messages.stream(body).finalMessage()
        : await client.messages.create(body);
      log.usage.push(message.usage ?? null);
      messages.push({ role: "assistant", content: message.content });
      const calls = message.content.filter((b) => b.type === "tool_use");
      if (calls.length === 0) {
        log.texts.push(
          message.content
            .filter((b) => b.type === "text")
            .map((b) => b.text)
            .join(""),
        );
        break;
      }
      messages.push({
        role: "user",
        content: calls.map((c) => {
          log.calls.push(c.id);
          return { type: "tool_result", tool_use_id: c.id, content: `contents of ${c.id}` };
        }),
      });
    }
  }
}

const args = argsOf();
const log = new Log();
try {
  await { "openai-chat": chat, "openai-responses": responses, anthropic }[args.sdk](args, log);
} catch (e) {
  // The SDK's typed error, printed for the test to show.
  console.error(`${e?.constructor?.name ?? "Error"}: ${e?.message ?? e}`);
  process.exit(1);
}
console.log(
  JSON.stringify({
    requests: log.requests,
    turns: log.texts.length,
    texts: log.texts,
    calls: log.calls,
    usage: log.usage,
  }),
);
