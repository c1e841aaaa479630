// An agent loop through the official `@anthropic-ai/sdk` npm client and promptd-client:
// promptd assembles each request (Messages format, cache breakpoints included), the SDK sends
// it unchanged, its reply — thinking blocks and signatures too — is recorded unchanged, and
// each tool_use is answered with a result before the next step.
//
//     node examples/anthropic_loop.mjs [--agent coder] [--turns 2] [--reply message|blocks]
//
// --reply: `message` (default) records the whole message the SDK returned; `blocks` records
// `{role, content}` only. Reads PROMPTD_URL (default http://127.0.0.1:8417) and PROMPTD_TOKEN;
// the Anthropic client reads its own ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY. Prints one line
// of JSON: {session, format, steps, tool_calls: [{id, name, arguments}], results, answers}.
import { parseArgs } from "node:util";
import Anthropic from "@anthropic-ai/sdk";
import { Client } from "promptd-client";

const { values: args } = parseArgs({
  options: {
    agent: { type: "string", default: "coder" },
    turns: { type: "string", default: "2" },
    reply: { type: "string", default: "message" },
  },
});
if (!["message", "blocks"].includes(args.reply)) throw new Error(`--reply must be message or blocks, not ${args.reply}`);

const anthropic = new Anthropic({ maxRetries: 0 });
const promptd = new Client(process.env.PROMPTD_URL, { token: process.env.PROMPTD_TOKEN });
const session = await promptd.session(args.agent, { format: "anthropic" });

// Stands in for real tools; deterministic, so a test can find each result where it belongs.
const runTool = (call) => `${call.name} ran with ${JSON.stringify(call.arguments)}`;

const summary = { session: session.id, format: "anthropic", steps: 0, tool_calls: [], results: [], answers: [] };
for (let turn = 1; turn <= Number(args.turns); turn++) {
  let user = turn === 1 ? "Look around the repository and tell me what is here." : `Thanks. Now question ${turn}.`;
  const facts = { cwd: "/src/app", git_branch: "main", git_dirty: turn > 1 ? "true" : "false" };
  for (;;) {
    const { body, step } = await session.step({ user, facts });
    const message = await anthropic.messages.create(body);
    const { toolCalls } = await session.record(args.reply === "message" ? message : { role: message.role, content: message.content });
    summary.steps = step;
    if (toolCalls.length === 0) {
      summary.answers.push(message.content.filter((b) => b.type === "text").map((b) => b.text).join(""));
      break;
    }
    for (const call of toolCalls) {
      const content = runTool(call);
      await session.toolResult(call.id, content);
      summary.tool_calls.push(call);
      summary.results.push({ call_id: call.id, content });
    }
    user = undefined;
  }
}
console.log(JSON.stringify(summary));
