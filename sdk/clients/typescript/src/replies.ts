// Reading, not converting: the daemon takes a reply in the shape the provider SDK returned it
// (promptd_core::replies), so the client sends it unchanged. It only looks into it for the
// tool calls the reply opened, to keep the session's bookkeeping and to hand the loop its calls
// in one shape whatever the provider.

import { PromptdError } from "./errors.js";
import type { ToolCall } from "./types.js";

type Obj = Record<string, unknown>;

const isObject = (v: unknown): v is Obj => typeof v === "object" && v !== null && !Array.isArray(v);
const list = (v: unknown): unknown[] => (Array.isArray(v) ? v : []);

/** Arguments as the model wrote them: OpenAI sends the JSON text of an object, Anthropic and
 * promptd's neutral shape an object. Parsed once here; a string holding the JSON text of
 * another string (arguments encoded twice, a common mistake of hand-written glue) is refused
 * before it reaches the daemon, naming the call. */
function parseArguments(callId: string, value: unknown): Record<string, unknown> {
  if (value === undefined || value === null) return {};
  if (isObject(value)) return value;
  if (typeof value === "string") {
    let parsed: unknown;
    try {
      parsed = JSON.parse(value);
    } catch (e) {
      throw new PromptdError("invalid_arguments", `tool call \`${callId}\`: arguments are not JSON: ${(e as Error).message}`);
    }
    if (typeof parsed === "string") {
      throw new PromptdError(
        "invalid_arguments",
        `tool call \`${callId}\`: arguments are JSON-encoded twice (a JSON string holding ${JSON.stringify(parsed.slice(0, 80))}); send the object, or its JSON text once`,
      );
    }
    if (isObject(parsed)) return parsed;
  }
  throw new PromptdError("invalid_arguments", `tool call \`${callId}\`: arguments must be a JSON object (or its JSON text)`);
}

/** The tool calls of an OpenAI Chat Completions message, or of promptd's neutral one. */
function chatCalls(message: Obj): ToolCall[] {
  return list(message["tool_calls"]).filter(isObject).map((call) => {
    const id = String(call["id"] ?? "");
    const fn = call["function"];
    if (isObject(fn)) {
      return { id, name: String(fn["name"] ?? ""), arguments: parseArguments(id, fn["arguments"]) };
    }
    return { id, name: String(call["name"] ?? ""), arguments: parseArguments(id, call["arguments"]) };
  });
}

/** The tool calls a reply makes, in any shape the daemon records: an OpenAI completion or its
 * `choices[0].message`, an Anthropic message or `{role, content: [blocks]}`, an OpenAI
 * Responses response or `{output: [items]}`, a Gemini response or model content, a Bedrock
 * Converse response or its message, or the neutral `{role, content, tool_calls}`. Throws `invalid_arguments` for arguments the daemon would refuse anyway. */
export function toolCallsOf(reply: unknown): ToolCall[] {
  if (!isObject(reply)) return [];
  // Gemini: a response's first candidate, or a model content. Calls may come without ids; the
  // daemon names them and says so in its answer to the record.
  const candidates = reply["candidates"];
  if (Array.isArray(candidates) || reply["role"] === "model") {
    const content = Array.isArray(candidates) ? (candidates[0] as Obj | undefined)?.["content"] : reply;
    const parts = isObject(content) ? list(content["parts"]) : [];
    return parts
      .filter(isObject)
      .map((p) => p["functionCall"])
      .filter(isObject)
      .map((call) => {
        const id = String(call["id"] ?? "");
        return { id, name: String(call["name"] ?? ""), arguments: parseArguments(id, call["args"]) };
      });
  }
  // Bedrock Converse: a response's output.message, or the message.
  if (isObject(reply["output"])) return toolCallsOf(reply["output"]["message"]);
  if (reply["role"] === "assistant" && list(reply["content"]).some((b) => isObject(b) && isObject(b["toolUse"]))) {
    return list(reply["content"])
      .filter(isObject)
      .map((b) => b["toolUse"])
      .filter(isObject)
      .map((use) => {
        const id = String(use["toolUseId"] ?? "");
        return { id, name: String(use["name"] ?? ""), arguments: parseArguments(id, use["input"]) };
      });
  }
  if (Array.isArray(reply["choices"])) {
    const message = (reply["choices"][0] as Obj | undefined)?.["message"];
    return isObject(message) ? chatCalls(message) : [];
  }
  if (Array.isArray(reply["output"])) {
    return reply["output"]
      .filter((item): item is Obj => isObject(item) && item["type"] === "function_call")
      .map((item) => {
        const id = String(item["call_id"] ?? "");
        return { id, name: String(item["name"] ?? ""), arguments: parseArguments(id, item["arguments"]) };
      });
  }
  if (reply["role"] === "assistant" && Array.isArray(reply["content"])) {
    return reply["content"]
      .filter((block): block is Obj => isObject(block) && block["type"] === "tool_use")
      .map((block) => {
        const id = String(block["id"] ?? "");
        return { id, name: String(block["name"] ?? ""), arguments: parseArguments(id, block["input"]) };
      });
  }
  if (reply["role"] === "assistant") return chatCalls(reply);
  return [];
}

/** The call a neutral tool message answers, if `message` is one. */
export function answeredBy(message: unknown): string | undefined {
  if (isObject(message) && message["role"] === "tool" && typeof message["tool_call_id"] === "string") {
    return message["tool_call_id"];
  }
  return undefined;
}
