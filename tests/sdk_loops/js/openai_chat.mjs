// The agent loop through the official `openai` npm client, Chat Completions.
//     node openai_chat.mjs PROMPTD_URL STUB_URL AGENT [--steps N]   (see agent_loop.mjs)
import OpenAI from "openai";
import { main, TIMEOUT_MS } from "./agent_loop.mjs";

await main("openai-js", "openai", (args) => {
  const client = new OpenAI({ baseURL: `${args.stub}/v1`, apiKey: "sk-stub", maxRetries: 0, timeout: TIMEOUT_MS });
  return async (body) => {
    const completion = await client.chat.completions.create(body);
    const message = completion.choices[0].message;
    const calls = (message.tool_calls ?? []).map((c) => [c.id, c.function.name]);
    // The reply as the SDK gives it (the API's JSON), recorded as is: the whole completion,
    // so its usage is recorded with it.
    return { reply: completion, calls, text: message.content ?? "" };
  };
});
