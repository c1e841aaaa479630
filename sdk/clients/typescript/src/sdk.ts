// What an official SDK's call takes of a step's body, where that is not the body itself.

type Obj = Record<string, unknown>;

const isObject = (v: unknown): v is Obj => typeof v === "object" && v !== null && !Array.isArray(v);

function bytes(base64: string): Uint8Array {
  return Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
}

/** Turns, in place, the base64 text of a Converse block list's media and redacted reasoning
 * into bytes (tool results' content included). */
function rawBlocks(blocks: unknown): void {
  if (!Array.isArray(blocks)) return;
  for (const block of blocks) {
    if (!isObject(block)) continue;
    for (const kind of ["image", "document"]) {
      const source = isObject(block[kind]) ? (block[kind] as Obj)["source"] : undefined;
      if (isObject(source) && typeof source["bytes"] === "string") source["bytes"] = bytes(source["bytes"]);
    }
    const reasoning = block["reasoningContent"];
    if (isObject(reasoning) && typeof reasoning["redactedContent"] === "string") {
      reasoning["redactedContent"] = bytes(reasoning["redactedContent"]);
    }
    if (isObject(block["toolResult"])) rawBlocks((block["toolResult"] as Obj)["content"]);
  }
}

/** A copy of a `bedrock` step's body as the AWS SDK's `ConverseCommand` takes it: each image's
 * and document's `source.bytes` (and each `redactedContent`) as a `Uint8Array`. The body keeps
 * the base64 text the REST API takes; the SDK wants bytes and encodes them itself, so base64
 * text handed to it would reach the model encoded twice. */
export function converseInput<T extends object>(body: T): T {
  const copy = structuredClone(body) as Obj;
  for (const message of Array.isArray(copy["messages"]) ? copy["messages"] : []) {
    if (isObject(message)) rawBlocks(message["content"]);
  }
  return copy as T;
}
