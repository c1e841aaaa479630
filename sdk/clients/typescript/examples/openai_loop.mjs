// An agent loop through the official `openai` npm client and promptd-client: promptd assembles
// each request, the SDK sends it unchanged, its reply is recorded unchanged, and each tool call
// is answered with a result before the next step.
//
//     node examples/openai_loop.mjs [--agent coder] [--turns 2] [--api chat|responses]
//
// Reads PROMPTD_URL (default http://127.0.0.1:8417) and PROMPTD_TOKEN; the OpenAI client reads
// its own OPENAI_BASE_URL and OPENAI_API_KEY. Prints one line of JSON: {session, api, format,
// steps, tool_calls: [{id, name, arguments}], results: [{call_id, content}], answers}.
import { parseArgs } from "node:util";
import OpenAI from "openai";
import { Client } from "promptd-client";

const { values: args } = parseArgs({
  options: {
    agent: { type: "string", default: "coder" },
    turns: { type: "string", default: "2" },
    api: { type: "string", default: "chat" },
  },
});
if (!["chat", "responses"].includes(args.api)) throw new Error(`--api must be chat or responses, not ${args.api}`);
const format = args.api === "chat" ? "openai" : "openai-responses";

const openai = new OpenAI({ maxRetries: 0 });
const promptd = new Client(process.env.PROMPTD_URL, { token: process.env.PROMPTD_TOKEN });
const session = await promptd.session(args.agent, { format });

// Stands in for real tools; deterministic, so a test can find each result where it belongs.
const runTool = (call) => `${call.name} ran with ${JSON.stringify(call.arguments)}`;

// The reply's text, for the log of answers (the SDK gives it; promptd needs none of this).
const textOf = (reply) => (args.api === "chat" ? reply.choices[0].message.content : reply.output_text) ?? "";

const summary = { session: session.id, api: args.api, format, steps: 0, tool_calls: [], results: [], answers: [] };
for (let turn = 1; turn <= Number(args.turns); turn++) {
  let user = turn === 1 ? "Look around the repository and tell me what is here." : `Thanks. Now question ${turn}.`;
  // The facts change between turns, so a new runtime context snapshot lands in the log.
  const facts = { cwd: "/src/app", git_branch: "main", git_dirty: turn > 1 ? "true" : "false" };
  for (;;) {
    const { body, step } = await session.step({ user, facts });
    const reply = args.api === "chat" ? await openai.chat.completions.create(body) : await openai.responses.create(body);
    const { toolCalls } = await session.record(reply);
    summary.steps = step;
    if (toolCalls.length === 0) {
      summary.answers.push(textOf(reply));
      break;
    }
    for (const call of toolCalls) {
      const content = runTool(call);
      await session.toolResult(call.id, content);
      summary.tool_calls.push(call);
      summary.results.push({ call_id: call.id, content });
    }
    user = undefined; // the next step carries only the results, already recorded
  }
}
console.log(JSON.stringify(summary));
