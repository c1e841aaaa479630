// The agent loop every JavaScript SDK script runs; the scripts add only their SDK call. The same
// loop as ../agent_loop.py: for each step, ask promptd for the body in the SDK's format, hand it
// to the official client UNCHANGED (`create(body)`), record the client's reply back in the SDK's
// own shape, and carry the tool results (in promptd's neutral shape) into the next step.
//
//     node SCRIPT PROMPTD_URL STUB_URL AGENT [--steps N]
//
// Exits 1 with the SDK's (or promptd's) error on any failure; on success prints one line of
// JSON: {sdk, format, agent, steps, tool_calls, tool_results, request_bytes, reply_bytes}.

export const TIMEOUT_MS = 30_000;

class Failed extends Error {}

export function parseArgs(argv = process.argv.slice(2)) {
  const positional = [];
  const options = { steps: 4 };
  for (let i = 0; i < argv.length; i++) {
    if (argv[i].startsWith("--")) {
      options[argv[i].slice(2)] = argv[++i];
    } else {
      positional.push(argv[i]);
    }
  }
  if (positional.length !== 3) {
    console.error("usage: node SCRIPT PROMPTD_URL STUB_URL AGENT [--steps N]");
    process.exit(2);
  }
  const [promptd, stub, agent] = positional;
  return { promptd, stub, agent, ...options, steps: Number(options.steps) };
}

async function post(base, path, body) {
  const response = await fetch(base + path, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(TIMEOUT_MS),
  });
  const text = await response.text();
  if (!response.ok) {
    throw new Failed(`promptd POST ${path} -> ${response.status}: ${text}`);
  }
  return JSON.parse(text);
}

// git_dirty flips after the first tool call, so a fresh runtime context snapshot lands right
// after tool results, as it would in a real loop.
function facts(dirty) {
  return { cwd: "/src/app", git_branch: "main", git_dirty: dirty ? "true" : "false", date: "2026-12-01" };
}

// `call(body) -> {reply, calls: [[id, name]], text}` is the SDK part.
async function run(sdk, format, args, call) {
  const { id } = await post(args.promptd, "/v1/sessions", { agent: args.agent });
  let pending = [{ role: "user", content: "Look around the repository and tell me what is here." }];
  let awaiting = [];
  const stats = { sdk, format, agent: args.agent, steps: 0, tool_calls: 0, tool_results: 0, request_bytes: 0, reply_bytes: 0 };
  for (let n = 1; n <= args.steps; n++) {
    const step = await post(args.promptd, `/v1/sessions/${id}/steps`, {
      format,
      messages: pending,
      facts: facts(stats.tool_calls > 0),
    });
    const body = step.request;
    stats.request_bytes += JSON.stringify(body).length;
    let turn;
    try {
      turn = await call(body);
    } catch (e) {
      throw new Failed(`step ${n}: the ${sdk} client refused or failed: ${e.name}: ${e.message}`);
    }
    if (awaiting.length) {
      // The stub names the call ids whose results it read: proof they arrived, answered.
      const missing = awaiting.filter((c) => !turn.text.includes(c));
      if (turn.calls.length || missing.length) {
        throw new Failed(
          `step ${n}: the provider did not take the tool results for ${missing.length ? missing : awaiting} ` +
            `(reply text ${JSON.stringify(turn.text)}, calls ${JSON.stringify(turn.calls)})`,
        );
      }
      stats.tool_results += awaiting.length;
    }
    stats.reply_bytes += JSON.stringify(turn.reply).length;
    await post(args.promptd, `/v1/sessions/${id}/messages`, turn.reply);
    stats.steps = n;
    if (turn.calls.length) {
      stats.tool_calls += turn.calls.length;
      pending = turn.calls.map(([callId, name], k) => ({ role: "tool", tool_call_id: callId, content: `${name}: output ${k}` }));
      awaiting = turn.calls.map(([callId]) => callId);
    } else {
      pending = [{ role: "user", content: `Thanks. Now the next thing (question ${n + 1}).` }];
      awaiting = [];
    }
  }
  return stats;
}

// `makeCall(args) -> call`, building the SDK client from the arguments.
export async function main(sdk, format, makeCall) {
  const args = parseArgs();
  try {
    console.log(JSON.stringify(await run(sdk, format, args, makeCall(args))));
  } catch (e) {
    console.error(`${sdk} loop, agent ${args.agent}: ${e instanceof Failed ? e.message : e.stack}`);
    process.exit(1);
  }
}
