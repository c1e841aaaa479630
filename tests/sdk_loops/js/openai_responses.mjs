// The agent loop through the official `openai` npm client, Responses API.
//     node openai_responses.mjs PROMPTD_URL STUB_URL AGENT [--steps N]   (see agent_loop.mjs)
import OpenAI from "openai";
import { main, TIMEOUT_MS } from "./agent_loop.mjs";

// The reply as the SDK gives it: the response's output items and usage, as the API sent them.
function replyOf(response) {
  const reply = { type: "response", output: response.output };
  if (response.usage) reply.usage = response.usage;
  return reply;
}

await main("openai-js", "openai-responses", (args) => {
  const client = new OpenAI({ baseURL: `${args.stub}/v1`, apiKey: "sk-stub", maxRetries: 0, timeout: TIMEOUT_MS });
  return async (body) => {
    const response = await client.responses.create(body);
    const calls = response.output.filter((i) => i.type === "function_call").map((i) => [i.call_id, i.name]);
    return { reply: replyOf(response), calls, text: response.output_text ?? "" };
  };
});
