// The installed artifact: `promptd-client` resolves to the packed tarball installed in this
// folder (not the source tree), it is ESM with no runtime dependency, and its types check a
// TypeScript consumer that hands the body to the official SDKs' typed methods.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import * as api from "promptd-client";

const entry = fileURLToPath(import.meta.resolve("promptd-client"));
const packageDir = dirname(dirname(entry));
const installDir = dirname(dirname(fileURLToPath(import.meta.url)));

test("promptd-client resolves to the installed tarball", () => {
  assert.equal(packageDir, join(installDir, "node_modules", "promptd-client"));
  assert.ok(!existsSync(join(packageDir, "src")), "the package ships no sources");
  const shipped = readdirSync(join(packageDir, "dist")).sort();
  assert.ok(shipped.includes("index.js") && shipped.includes("index.d.ts"), shipped.join(" "));
  assert.deepEqual(shipped.filter((f) => f.endsWith(".ts") && !f.endsWith(".d.ts")), []);
});

test("the package is ESM for Node 18+, with types and no runtime dependency", () => {
  const meta = JSON.parse(readFileSync(join(packageDir, "package.json"), "utf8"));
  assert.equal(meta.name, "promptd-client");
  assert.equal(meta.type, "module");
  assert.equal(meta.engines.node, ">=18");
  assert.deepEqual(meta.exports["."], { types: "./dist/index.d.ts", import: "./dist/index.js" });
  for (const key of ["dependencies", "peerDependencies", "optionalDependencies"]) {
    assert.equal(meta[key], undefined, `${key} must be absent`);
  }
  assert.ok(existsSync(join(packageDir, meta.exports["."].types)));
});

test("the public API is exported", () => {
  const classes = [
    "Client",
    "Session",
    "PromptdError",
    "BadRequestError",
    "UnauthorizedError",
    "NotFoundError",
    "MethodNotAllowedError",
    "ConflictError",
    "PayloadTooLargeError",
    "UnprocessableError",
    "InternalError",
    "PluginFailedError",
    "UnavailableError",
    "DaemonUnreachableError",
    "TimeoutError",
    "OpenToolCallsError",
  ];
  for (const name of classes) assert.equal(typeof api[name], "function", name);
  for (const name of classes.slice(3)) assert.ok(api[name].prototype instanceof api.PromptdError, name);
  assert.ok(api.OpenToolCallsError.prototype instanceof api.UnprocessableError);
  assert.equal(api.DEFAULT_URL, "http://127.0.0.1:8417");
  const methods = ["session", "sessionOf", "sessions", "health", "plugins", "reload", "unload", "enable", "metrics", "openapi", "registryEvents"];
  for (const m of methods) assert.equal(typeof api.Client.prototype[m], "function", `Client#${m}`);
  for (const m of ["step", "record", "toolResult", "events", "request", "explain", "diff", "usage", "compact", "sync"]) {
    assert.equal(typeof api.Session.prototype[m], "function", `Session#${m}`);
  }
});

/** Type-checks `source` as a consumer module in this folder (so it sees the installed package
 * and the provider SDKs) with the client's pinned TypeScript; returns tsc's output. */
function typecheck(source) {
  const tsc = join(installDir, "..", "node_modules", "typescript", "bin", "tsc");
  assert.ok(existsSync(tsc), `${tsc} is missing: install.sh runs npm ci in sdk/clients/typescript`);
  const dir = mkdtempSync(join(installDir, "typecheck-"));
  try {
    writeFileSync(join(dir, "consumer.ts"), source);
    const tsconfig = {
      compilerOptions: { strict: true, noEmit: true, target: "ES2022", module: "NodeNext", moduleResolution: "NodeNext", lib: ["ES2022", "DOM"], skipLibCheck: true, types: [] },
      files: ["consumer.ts"],
    };
    writeFileSync(join(dir, "tsconfig.json"), JSON.stringify(tsconfig));
    writeFileSync(join(dir, "package.json"), '{"type": "module"}');
    const run = spawnSync(process.execPath, [tsc, "-p", dir], { encoding: "utf8" });
    return { ok: run.status === 0, output: run.stdout + run.stderr };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

test("the types check a TypeScript loop with the official SDKs, and catch mistakes", () => {
  const loop = `
    import OpenAI from "openai";
    import Anthropic from "@anthropic-ai/sdk";
    import type { ChatCompletionCreateParamsNonStreaming } from "openai/resources/chat/completions";
    import { Client, NotFoundError, type Recorded, type StepResult } from "promptd-client";

    export async function loop(openai: OpenAI, anthropic: Anthropic): Promise<void> {
      const client = new Client("http://127.0.0.1:8417", { token: "t", timeoutMs: 5000 });
      const session = await client.session("coder", { format: "openai" });
      const step: StepResult<ChatCompletionCreateParamsNonStreaming> = await session.step({ user: "hi", facts: { cwd: "/" } });
      const completion = await openai.chat.completions.create(step.body);
      const recorded: Recorded = await session.record(completion);
      for (const call of recorded.toolCalls) await session.toolResult(call.id, { ok: true, name: call.name }, { isError: false });
      const { body } = await session.step({ format: "anthropic" });
      const message = await anthropic.messages.create(body);
      await session.record(message);
      const ids: string[] = session.openToolCalls.map((c) => c.id);
      const n: number = step.usage.total.tokens + ids.length;
      for await (const e of client.registryEvents({ since: n })) if (e.event === "lagged") console.log(e.data.missed);
      try { await client.sessionOf("x"); } catch (e) { if (e instanceof NotFoundError) console.log(e.code, e.status); }
    }
  `;
  const good = typecheck(loop);
  assert.ok(good.ok, good.output);
  for (const [mistake, message] of [
    ['await new Client("u").session("a").then((s) => s.step({ usr: "typo" }));', /usr/],
    ['await new Client("u").session("a").then((s) => s.step({ format: "yaml" }));', /yaml/],
    ['await new Client("u").session("a").then((s) => s.toolResult(42, "x"));', /number/],
    ['new Client("u", { tokn: "t" });', /tokn/],
  ]) {
    const bad = typecheck(`import { Client } from "promptd-client";\n${mistake}\nexport {};\n`);
    assert.ok(!bad.ok, `should not type-check: ${mistake}`);
    assert.match(bad.output, message);
  }
});
