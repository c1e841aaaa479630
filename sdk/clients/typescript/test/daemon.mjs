// The daemon the client's tests run against, named by the environment (tests/client_typescript.rs
// starts it): PROMPTD_URL and PROMPTD_TOKEN. It serves two copies of the `scripted` test plugin:
// `echo` (a section whose text is the fact `text`, the variable `name` = "Ada", a tool
// `read_file`) and `trapper` (a section that traps, scoped to agent `crashy`), with model
// settings for every format and `[limits] max_body_mb = 1`.
import assert from "node:assert/strict";
import { Client } from "promptd-client";

export const url = process.env.PROMPTD_URL;
export const token = process.env.PROMPTD_TOKEN;
assert.ok(url && token, "PROMPTD_URL and PROMPTD_TOKEN must name the daemon under test");

export const client = new Client(url, { token });

/** Facts that keep the `echo` section (and so the header) the same from step to step. */
export const FACTS = { text: "Hi {{name}}" };

/** An OpenAI Chat Completions message as the SDK returns it, calling read_file. */
export function openaiToolCall(id, args) {
  return {
    role: "assistant",
    content: null,
    refusal: null,
    annotations: [],
    tool_calls: [{ id, type: "function", function: { name: "read_file", arguments: args } }],
  };
}
