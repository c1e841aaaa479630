// The agent loop every JavaScript SDK script runs; the scripts add only their SDK call. The same
// loop as ../agent_loop.py: for each step, ask promptd for the body in the SDK's format, hand it
// to the official client UNCHANGED (`create(body)`), record the client's reply back in the SDK's
// own shape, and carry the tool results (in promptd's neutral shape) into the next step.
//
//     node SCRIPT PROMPTD_URL STUB_URL AGENT [--steps N] [--media first|every]
//
// --media as in ../agent_loop.py: `first` sends text, a small PNG, an image by URL and a PDF in
// step 1's user message and a PNG "screenshot" (noise, over 1 KiB) with the first result of
// every tool round; `every` sends the screenshot with every user message and tool result. Every
// body promptd returns after a medium was sent must hold its base64.
//
// Exits 1 with the SDK's (or promptd's) error on any failure; on success prints one line of
// JSON: {sdk, format, agent, session, steps, tool_calls, tool_results, request_bytes,
// reply_bytes}, with --media also media: {photo, screenshot, pdf} (base64).

import { deflateSync } from "node:zlib";

export const TIMEOUT_MS = 30_000;

class Failed extends Error {}

export function parseArgs(argv = process.argv.slice(2)) {
  const positional = [];
  const options = { steps: 4, media: "none" };
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

async function get(base, path) {
  const response = await fetch(base + path, { signal: AbortSignal.timeout(TIMEOUT_MS) });
  const text = await response.text();
  if (!response.ok) throw new Failed(`promptd GET ${path} -> ${response.status}: ${text}`);
  return JSON.parse(text);
}

// git_dirty flips after the first tool call, so a fresh runtime context snapshot lands right
// after tool results, as it would in a real loop.
function facts(dirty) {
  return { cwd: "/src/app", git_branch: "main", git_dirty: dirty ? "true" : "false", date: "2026-12-01" };
}

// --- Media: generated here, so every run sends the same valid files ---------------------------

const CRC_TABLE = Array.from({ length: 256 }, (_, n) => {
  let c = n;
  for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
  return c >>> 0;
});

function crc32(bytes) {
  let c = 0xffffffff;
  for (const b of bytes) c = CRC_TABLE[(c ^ b) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

// A valid 8-bit RGB PNG: of one colour `rgb`, or of deterministic noise from `seed` (which
// does not compress); the same bytes as ../agent_loop.py makes.
function png(width, height, { rgb, seed }) {
  const u32 = (n) => { const b = Buffer.alloc(4); b.writeUInt32BE(n); return b; };
  const chunk = (tag, data) => {
    const tagged = Buffer.concat([Buffer.from(tag, "latin1"), data]);
    return Buffer.concat([u32(data.length), tagged, u32(crc32(tagged))]);
  };
  let pixels;
  if (seed === undefined) {
    pixels = Buffer.concat(Array(width * height).fill(Buffer.from(rgb)));
  } else {
    pixels = Buffer.alloc(width * height * 3);
    let x = seed;
    for (let i = 0; i < pixels.length; i++) {
      x = (Math.imul(x, 1103515245) + 12345) & 0x7fffffff;
      pixels[i] = (x >>> 16) & 0xff;
    }
  }
  const stride = width * 3;
  const rows = Array.from({ length: height }, (_, y) =>
    Buffer.concat([Buffer.from([0]), pixels.subarray(y * stride, (y + 1) * stride)]), // filter 0
  );
  const header = Buffer.concat([u32(width), u32(height), Buffer.from([8, 2, 0, 0, 0])]); // 8-bit RGB
  return Buffer.concat([
    Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
    chunk("IHDR", header),
    chunk("IDAT", deflateSync(Buffer.concat(rows))),
    chunk("IEND", Buffer.alloc(0)),
  ]);
}

// A minimal valid one-page PDF, with its cross-reference table.
function pdf() {
  const objects = ["<</Type/Catalog/Pages 2 0 R>>", "<</Type/Pages/Kids[3 0 R]/Count 1>>",
    "<</Type/Page/Parent 2 0 R/MediaBox[0 0 72 72]>>"];
  let out = "%PDF-1.4\n";
  const offsets = objects.map((obj, i) => {
    const at = out.length;
    out += `${i + 1} 0 obj\n${obj}\nendobj\n`;
    return at;
  });
  const xref = out.length;
  out += `xref\n0 ${objects.length + 1}\n0000000000 65535 f \n`;
  out += offsets.map((o) => `${String(o).padStart(10, "0")} 00000 n \n`).join("");
  out += `trailer\n<</Size ${objects.length + 1}/Root 1 0 R>>\nstartxref\n${xref}\n%%EOF\n`;
  return Buffer.from(out, "latin1");
}

const MEDIA = {
  photo: png(4, 3, { rgb: [200, 40, 40] }).toString("base64"),
  screenshot: png(32, 24, { seed: 7 }).toString("base64"),
  pdf: pdf().toString("base64"),
};
const IMAGE_URL = "https://example.com/diagram.png";
const image = (name) => ({ type: "image", media_type: "image/png", data: MEDIA[name] });

function userMessage(n, media) {
  const text = n === 1 ? "Look around the repository and tell me what is here." : `Thanks. Now the next thing (question ${n}).`;
  if (media === "first" && n === 1) {
    return {
      role: "user",
      content: [
        { type: "text", text: `${text} Here is a photo, a diagram and the spec.` },
        image("photo"),
        { type: "image", url: IMAGE_URL },
        { type: "document", media_type: "application/pdf", data: MEDIA.pdf, name: "spec.pdf" },
      ],
    };
  }
  if (media === "every") return { role: "user", content: [{ type: "text", text }, image("screenshot")] };
  return { role: "user", content: text };
}

function toolResult(callId, name, k, media) {
  const text = `${name}: output ${k}`;
  const shot = { first: k === 0 ? "screenshot" : null, every: "screenshot" }[media] ?? null;
  if (shot === null) return { role: "tool", tool_call_id: callId, content: text };
  return { role: "tool", tool_call_id: callId, content: [{ type: "text", text }, image(shot)] };
}

// `call(body) -> {reply, calls: [[id, name]], text}` is the SDK part.
async function run(sdk, format, args, call) {
  if (!["none", "first", "every"].includes(args.media)) {
    throw new Failed(`--media must be none, first or every, not ${args.media}`);
  }
  const { id } = await post(args.promptd, "/v1/sessions", { agent: args.agent });
  let pending = [userMessage(1, args.media)];
  let awaiting = [];
  const stats = { sdk, format, agent: args.agent, session: id, steps: 0, tool_calls: 0, tool_results: 0, request_bytes: 0, reply_bytes: 0 };
  const sent = new Set(); // the media sent so far, by name
  for (let n = 1; n <= args.steps; n++) {
    const step = await post(args.promptd, `/v1/sessions/${id}/steps`, {
      format,
      messages: pending,
      facts: facts(stats.tool_calls > 0),
    });
    const body = step.request;
    const pendingText = JSON.stringify(pending);
    for (const name of Object.keys(MEDIA)) if (pendingText.includes(MEDIA[name])) sent.add(name);
    const bodyText = JSON.stringify(body);
    const lost = [...sent].filter((name) => !bodyText.includes(MEDIA[name]));
    if (lost.length) {
      throw new Failed(`step ${n}: the body promptd returned lacks the ${lost.join(", ")} sent before (its base64 is not in it)`);
    }
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
      pending = turn.calls.map(([callId, name], k) => toolResult(callId, name, k, args.media));
      awaiting = turn.calls.map(([callId]) => callId);
    } else {
      pending = [userMessage(n + 1, args.media)];
      awaiting = [];
    }
  }
  if (args.media !== "none") stats.media = MEDIA;
  // How the stub's cache served each step, as the daemon recorded it with the reply (null
  // where the reply's shape carried no usage).
  const report = await get(args.promptd, `/v1/sessions/${id}/usage`);
  stats.cache = report.steps.map((s) => (s.cache ? s.cache.outcome : null));
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
