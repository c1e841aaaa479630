// The agent loop through the official `@anthropic-ai/sdk` npm client, Messages API.
//     node anthropic_messages.mjs PROMPTD_URL STUB_URL AGENT [--steps N] [--reply blocks|message]
// --reply: `blocks` (default) records {role: "assistant", content: message.content}; `message`
// records the whole message object (id, type, role, content, model, stop_reason, usage...).
import Anthropic from "@anthropic-ai/sdk";
import { main, parseArgs, TIMEOUT_MS } from "./agent_loop.mjs";

function replyOf(message, shape) {
  return shape === "message" ? message : { role: "assistant", content: message.content };
}

const shape = parseArgs().reply ?? "blocks";
if (!["blocks", "message"].includes(shape)) {
  console.error(`--reply must be blocks or message, not ${shape}`);
  process.exit(2);
}

await main("anthropic-js", "anthropic", (args) => {
  const client = new Anthropic({ baseURL: args.stub, apiKey: "sk-ant-stub", maxRetries: 0, timeout: TIMEOUT_MS });
  return async (body) => {
    const message = await client.messages.create(body);
    const calls = message.content.filter((b) => b.type === "tool_use").map((b) => [b.id, b.name]);
    const text = message.content.filter((b) => b.type === "text").map((b) => b.text).join("");
    return { reply: replyOf(message, shape), calls, text };
  };
});
