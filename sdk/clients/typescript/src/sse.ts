// A server-sent events reader over a fetch body (the WHATWG rules, the part promptd uses):
// lines end with \n, \r\n or \r; `field: value` (one space after the colon is dropped);
// lines starting with `:` are comments (the daemon's keep-alives); a blank line dispatches
// the event gathered so far, and an event without data is dropped.

export interface RawEvent {
  id: string | null;
  event: string;
  data: string;
}

/** The events of an SSE body, in order, until the body ends. Cancels the body when the
 * consumer stops early (a `break` out of `for await`). */
export async function* readEvents(body: ReadableStream<Uint8Array>): AsyncGenerator<RawEvent> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let data: string[] = [];
  let event = "";
  let id: string | null = null;
  // A \r at the end of a chunk may be the first half of \r\n: keep it until the next chunk.
  const lines = function* (final: boolean): Generator<string> {
    for (;;) {
      const at = buffer.search(/\r\n|\r|\n/);
      if (at < 0) break;
      if (buffer[at] === "\r" && at === buffer.length - 1 && !final) break;
      const width = buffer.startsWith("\r\n", at) ? 2 : 1;
      const line = buffer.slice(0, at);
      buffer = buffer.slice(at + width);
      yield line;
    }
  };
  try {
    for (;;) {
      const { done, value } = await reader.read();
      buffer += done ? decoder.decode() : decoder.decode(value, { stream: true });
      for (const line of lines(done)) {
        if (line === "") {
          if (data.length > 0) yield { id, event: event || "message", data: data.join("\n") };
          data = [];
          event = "";
          continue;
        }
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let value_ = colon < 0 ? "" : line.slice(colon + 1);
        if (value_.startsWith(" ")) value_ = value_.slice(1);
        if (field === "data") data.push(value_);
        else if (field === "event") event = value_;
        else if (field === "id" && !value_.includes("\0")) id = value_;
        // `retry` and unknown fields: nothing promptd sends that the client needs.
      }
      if (done) return;
    }
  } finally {
    // Stops the download when the consumer stopped early; harmless once the body ended.
    await reader.cancel().catch(() => {});
  }
}
