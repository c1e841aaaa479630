// The HTTP client over promptd's API (README, "The daemon"): Client for the daemon-wide routes,
// Session for one conversation. Node 18+'s built-in fetch, nothing else.

import {
  DaemonUnreachableError,
  OpenToolCallsError,
  PromptdError,
  TimeoutError,
  errorFromResponse,
} from "./errors.js";
import { answeredBy, toolCallsOf } from "./replies.js";
import { readEvents } from "./sse.js";
import type {
  ChangeKind,
  Content,
  Format,
  Health,
  PluginStatus,
  ProviderBody,
  Recorded,
  RegistryEvent,
  RegistryStreamEvent,
  SessionEvent,
  SessionSummary,
  StepDiff,
  StepExplain,
  StepInput,
  StepMessage,
  StepResult,
  StepUsage,
  ToolCall,
  UsageReport,
  UsageSummary,
} from "./types.js";

/** Where `promptd serve` listens by default. */
export const DEFAULT_URL = "http://127.0.0.1:8417";

/** A step may wait up to 30 s for the daemon's first plugin load; this leaves room for it. */
export const DEFAULT_TIMEOUT_MS = 60_000;

export interface ClientOptions {
  /** The daemon's bearer token (`token` in its config, or `PROMPTD_TOKEN`), when it has one. */
  token?: string;
  /** Each request's bound, in milliseconds (default 60,000); the event stream's bound is on
   * connecting only. */
  timeoutMs?: number;
  /** The format of steps that name none (default `"neutral"`). */
  format?: Format;
  /** A fetch to use instead of the global one (a proxy agent, a test double). */
  fetch?: typeof fetch;
}

export interface SessionOptions {
  /** The format of this session's steps that name none (default: the client's). */
  format?: Format;
}

interface Call {
  body?: unknown;
  accept?: string;
}

/** Where `@opentelemetry/api` 1.x keeps what the app registered (its `src/internal/global-utils.ts`:
 * `Symbol.for("opentelemetry.js.api." + major)`), among them `propagation` (a TextMapPropagator)
 * and `context` (a ContextManager). Read, never written: the package does not import the API. */
const OTEL_API_KEY = Symbol.for("opentelemetry.js.api.1");

interface OtelGlobal {
  propagation?: { inject?: (context: unknown, carrier: Record<string, string>, setter: typeof headerSetter) => void };
  context?: { active?: () => unknown };
}

const headerSetter = {
  set(carrier: Record<string, string>, key: string, value: string): void {
    carrier[key] = String(value);
  },
};

/** Adds the caller's trace context (README, "Tracing") to `headers`: what the registered
 * propagator writes for the active context (W3C `traceparent`, `tracestate` when set). Nothing
 * when no propagator and context manager are registered; never replaces the client's own
 * headers, and never fails the request. */
function injectTraceContext(headers: Record<string, string>): void {
  const api = (globalThis as unknown as Record<symbol, OtelGlobal | undefined>)[OTEL_API_KEY];
  if (api == null || typeof api !== "object") return;
  const { propagation, context } = api;
  if (typeof propagation?.inject !== "function" || typeof context?.active !== "function") return;
  const carrier: Record<string, string> = {};
  try {
    propagation.inject(context.active(), carrier, headerSetter);
  } catch {
    return; // tracing is best effort
  }
  const own = new Set(Object.keys(headers).map((k) => k.toLowerCase()));
  for (const [key, value] of Object.entries(carrier)) {
    if (!own.has(key.toLowerCase())) headers[key] = value;
  }
}

/** @internal One daemon address with its token and timeout; every request goes through it.
 * Not part of the package's API (index.ts does not export it). */
export class Transport {
  readonly url: string;
  readonly #token: string | undefined;
  readonly #timeoutMs: number;
  readonly #fetch: typeof fetch;

  constructor(url: string, options: ClientOptions) {
    const parsed = new URL(url); // throws a TypeError naming a malformed address
    if (parsed.protocol !== "http:" && parsed.protocol !== "https:") {
      throw new TypeError(`promptd URL ${JSON.stringify(url)}: use http:// or https:// (fetch cannot reach a Unix socket)`);
    }
    this.url = url.replace(/\/+$/, "");
    this.#token = options.token;
    this.#timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    const f = options.fetch ?? globalThis.fetch;
    if (typeof f !== "function") throw new TypeError("no fetch: promptd-client needs Node.js 18 or later");
    this.#fetch = f;
  }

  #headers(call: Call): Record<string, string> {
    const headers: Record<string, string> = { Accept: call.accept ?? "application/json" };
    if (call.body !== undefined) headers["Content-Type"] = "application/json";
    if (this.#token !== undefined) headers["Authorization"] = `Bearer ${this.#token}`;
    injectTraceContext(headers); // per request: the context active at the call
    return headers;
  }

  /** Sends one request and returns the response once its status is 2xx; any other status is
   * read and thrown as the typed error. `signal` bounds the exchange. */
  async #open(method: string, path: string, call: Call, signal: AbortSignal): Promise<Response> {
    const what = `${method} ${path}`;
    let response: Response;
    try {
      const init: RequestInit = { method, headers: this.#headers(call), signal };
      // Serialized once, here: replies and bodies go as the caller gave them.
      if (call.body !== undefined) init.body = JSON.stringify(call.body);
      response = await this.#fetch(this.url + path, init);
    } catch (e) {
      throw this.#failure(e, what, signal);
    }
    if (!response.ok) {
      const text = await response.text().catch((e: unknown) => {
        throw this.#failure(e, what, signal);
      });
      throw errorFromResponse(response.status, text, what);
    }
    return response;
  }

  /** What a failed fetch means: the timeout, the caller's abort, or nothing listening.
   * `signal` is the one the request ran with: aborted by a timeout, its reason says so even
   * where fetch reports a plain AbortError. */
  #failure(e: unknown, what: string, signal?: AbortSignal): unknown {
    if (e instanceof PromptdError) return e;
    const name = (e as { name?: string } | null)?.name;
    const timedOut = signal?.aborted === true && (signal.reason as { name?: string } | undefined)?.name === "TimeoutError";
    if (name === "TimeoutError" || timedOut) {
      return new TimeoutError("timeout", `${what}: no answer from promptd at ${this.url} within ${this.#timeoutMs} ms`, 0, what);
    }
    if (name === "AbortError") return e; // the caller's own signal: not promptd's doing
    if (e instanceof TypeError) {
      // fetch's network failure: "fetch failed" with the system error as its cause (an
      // AggregateError when several addresses were tried).
      const cause = (e as { cause?: { code?: string; errors?: Array<{ code?: string }>; message?: string } }).cause;
      const code = cause?.code ?? cause?.errors?.[0]?.code;
      const detail = code ?? cause?.message ?? e.message;
      return new DaemonUnreachableError(
        "unreachable",
        `${what}: cannot reach promptd at ${this.url} (${detail}); is \`promptd serve\` running there?`,
        0,
        what,
      );
    }
    return e;
  }

  /** A request whose answer is JSON. */
  async json<T>(method: string, path: string, body?: unknown): Promise<T> {
    const text = await this.text(method, path, { body });
    try {
      return JSON.parse(text) as T;
    } catch {
      throw new PromptdError("invalid_response", `${method} ${path}: the answer is not JSON: ${JSON.stringify(text.slice(0, 200))}`, 200, `${method} ${path}`);
    }
  }

  /** A request whose answer is text. */
  async text(method: string, path: string, call: Call = {}): Promise<string> {
    const signal = AbortSignal.timeout(this.#timeoutMs);
    const response = await this.#open(method, path, call, signal);
    try {
      return await response.text();
    } catch (e) {
      throw this.#failure(e, `${method} ${path}`, signal);
    }
  }

  /** A streaming GET: the timeout bounds only the wait for the response's head, and `signal`
   * (the caller's) ends it at any time. */
  async stream(path: string, signal?: AbortSignal): Promise<Response> {
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(new DOMException("connect timeout", "TimeoutError")), this.#timeoutMs);
    const stop = () => controller.abort(signal?.reason);
    if (signal?.aborted) stop();
    signal?.addEventListener("abort", stop, { once: true });
    try {
      // The timer's abort carries a TimeoutError reason, which #open maps to TimeoutError.
      return await this.#open("GET", path, { accept: "text/event-stream" }, controller.signal);
    } finally {
      clearTimeout(timer);
    }
  }
}

const segment = (s: string) => encodeURIComponent(s);

/** A client of one promptd daemon. */
export class Client {
  readonly #transport: Transport;
  readonly #format: Format;

  /** `url` defaults to http://127.0.0.1:8417, where `promptd serve` listens. */
  constructor(url: string = DEFAULT_URL, options: ClientOptions = {}) {
    this.#transport = new Transport(url, options);
    this.#format = options.format ?? "neutral";
  }

  /** The daemon's base URL. */
  get url(): string {
    return this.#transport.url;
  }

  /** A new session for `agent` (the daemon's default agent when omitted). */
  async session(agent?: string, options: SessionOptions = {}): Promise<Session> {
    const created = await this.#transport.json<{ id: string; agent: string }>(
      "POST",
      "/v1/sessions",
      agent === undefined ? {} : { agent },
    );
    return new Session(this.#transport, created.id, created.agent, options.format ?? this.#format);
  }

  /** An existing session, read back from its log: its agent, and the tool calls still waiting
   * for a result. A session the daemon does not hold is a `NotFoundError`. */
  async sessionOf(id: string, options: SessionOptions = {}): Promise<Session> {
    const session = new Session(this.#transport, id, undefined, options.format ?? this.#format);
    await session.sync();
    return session;
  }

  /** The sessions the daemon holds, most recent activity first: those whose id or agent
   * contains `q`, at most `limit` (the daemon's default 100, at most 1000). */
  async sessions(options: { q?: string; limit?: number } = {}): Promise<SessionSummary[]> {
    const query = new URLSearchParams();
    if (options.q !== undefined) query.set("q", options.q);
    if (options.limit !== undefined) query.set("limit", String(options.limit));
    const path = query.toString() === "" ? "/v1/sessions" : `/v1/sessions?${query}`;
    return (await this.#transport.json<{ sessions: SessionSummary[] }>("GET", path)).sessions;
  }

  /** The cost ledger across sessions (`GET /v1/usage`): replies, tokens, cache outcomes with
   * the tokens they lost and the misses' cost, the plugins whose changes broke the prefix, the
   * cost by the config's `[pricing]`, in `total` and per agent; `agent` keeps one agent's
   * sessions, `since` (ms since the Unix epoch) the replies to requests sent since then. */
  usage(options: { agent?: string; since?: number; limit?: number } = {}): Promise<UsageSummary> {
    const query = new URLSearchParams();
    if (options.agent !== undefined) query.set("agent", options.agent);
    if (options.since !== undefined) query.set("since", String(options.since));
    if (options.limit !== undefined) query.set("limit", String(options.limit));
    const path = query.toString() === "" ? "/v1/usage" : `/v1/usage?${query}`;
    return this.#transport.json("GET", path);
  }

  /** `GET /v1/health`. A daemon whose store failed is an `UnavailableError`. */
  health(): Promise<Health> {
    return this.#transport.json("GET", "/v1/health");
  }

  /** Every plugin file the daemon knows: id, file, sha256, state, last error, declarations. */
  async plugins(): Promise<PluginStatus[]> {
    return (await this.#transport.json<{ plugins: PluginStatus[] }>("GET", "/v1/plugins")).plugins;
  }

  /** Rescans the plugin folder now; the changes it applied. */
  async reload(): Promise<RegistryEvent[]> {
    return (await this.#transport.json<{ applied: RegistryEvent[] }>("POST", "/v1/plugins/reload")).applied;
  }

  /** Unloads plugin `id` until the next rescan loads its file again. */
  async unload(id: string): Promise<RegistryEvent[]> {
    return (await this.#transport.json<{ applied: RegistryEvent[] }>("DELETE", `/v1/plugins/${segment(id)}`)).applied;
  }

  /** Brings a quarantined plugin back, or tries a `failed` MCP server again (nothing to do
   * for one that is neither). */
  async enable(id: string): Promise<RegistryEvent[]> {
    return (await this.#transport.json<{ applied: RegistryEvent[] }>("POST", `/v1/plugins/${segment(id)}/enable`)).applied;
  }

  /** `GET /metrics`: Prometheus text. */
  metrics(): Promise<string> {
    return this.#transport.text("GET", "/metrics", { accept: "text/plain" });
  }

  /** The OpenAPI 3.1 document describing the API (`GET /v1/openapi.json`). */
  openapi(): Promise<Record<string, unknown>> {
    return this.#transport.json("GET", "/v1/openapi.json");
  }

  /** The registry's changes as they happen (`GET /v1/events`), after event `since` (the last
   * `id` seen, to resume; all the daemon still keeps when omitted). Runs until `signal` aborts,
   * the loop breaks, or the daemon ends the stream (after a `lagged` event: resync from
   * `plugins()`, then reconnect). */
  async *registryEvents(options: { since?: number; signal?: AbortSignal } = {}): AsyncGenerator<RegistryStreamEvent> {
    const { since, signal } = options;
    const path = since === undefined ? "/v1/events" : `/v1/events?since=${since}`;
    try {
      const response = await this.#transport.stream(path, signal);
      if (response.body === null) return;
      for await (const raw of readEvents(response.body)) {
        let data: unknown;
        try {
          data = JSON.parse(raw.data);
        } catch {
          throw new PromptdError("invalid_response", `GET ${path}: an event's data is not JSON: ${JSON.stringify(raw.data.slice(0, 200))}`, 200, `GET ${path}`);
        }
        if (raw.event === "lagged") {
          yield { event: "lagged", id: null, data: data as { missed: number } };
        } else {
          const id = raw.id === null || raw.id === "" ? null : Number(raw.id);
          yield { event: raw.event as ChangeKind, id, data: data as RegistryEvent };
        }
      }
    } catch (e) {
      // The caller's abort ends the stream; it is not an error of the stream.
      if (signal?.aborted) return;
      throw e;
    }
  }
}

/** A tool result's content: text or blocks as they are; anything else (an object, a number)
 * goes as its JSON text, encoded once. */
function toolContent(content: unknown): Content {
  if (typeof content === "string" || Array.isArray(content)) return content as Content;
  if (content === undefined || content === null) return "";
  return JSON.stringify(content);
}

const quoted = (ids: string[]) => ids.map((id) => `\`${id}\``).join(", ");

/** A step's body in parts, relative to step `since` (0: from nothing). */
interface StepParts {
  since: number;
  open: string | null;
  close: string | null;
  keep: number;
  items: string[];
}

/** A step's request body in one format, kept from the daemon's parts: the text before the
 * message list, each message's JSON text, the text after. Joined, the body's exact bytes. */
class KeptBody {
  step = 0;
  #open = "";
  #close = "";
  #items: string[] = [];

  /** Applies `parts` for `step`; returns the body's text. */
  apply(parts: StepParts, step: number, request: string): string {
    const ok =
      Number.isInteger(parts?.since) &&
      Number.isInteger(parts.keep) &&
      Array.isArray(parts.items) &&
      (parts.since === 0 || parts.since === this.step) &&
      parts.keep >= 0 &&
      parts.keep <= this.#items.length &&
      (parts.since !== 0 || (parts.keep === 0 && typeof parts.open === "string" && typeof parts.close === "string"));
    if (!ok) {
      const excerpt = JSON.stringify(parts).slice(0, 200);
      throw new PromptdError("invalid_response", `${request}: parts this client cannot apply (it holds step ${this.step}): ${excerpt}`, 200, request);
    }
    this.#items.length = parts.keep;
    if (typeof parts.open === "string") this.#open = parts.open;
    if (typeof parts.close === "string") this.#close = parts.close;
    for (const item of parts.items) this.#items.push(item);
    this.step = step;
    return this.#open + this.#items.join(",") + this.#close;
  }
}

/** One conversation: its steps, the replies recorded and the tool calls waiting for results. */
export class Session {
  readonly id: string;
  /** The agent the session assembles for (undefined until read from the log). */
  agent: string | undefined;
  /** The format of steps that name none. */
  format: Format;
  readonly #transport: Transport;
  /** Calls the model made that no result answers yet, in the order they were made. */
  readonly #open = new Map<string, ToolCall>();
  /** The request body of the last step in each format, kept from the parts the daemon sends. */
  readonly #bodies = new Map<Format, KeptBody>();

  /** @internal Use `client.session()` or `client.sessionOf()`. */
  constructor(transport: Transport, id: string, agent: string | undefined, format: Format) {
    this.#transport = transport;
    this.id = id;
    this.agent = agent;
    this.format = format;
  }

  #path(rest: string): string {
    return `/v1/sessions/${segment(this.id)}${rest}`;
  }

  /** The tool calls recorded replies made that no result answers yet. A step must answer all
   * of them (with `toolResult`, or tool messages in its `messages`). */
  get openToolCalls(): ToolCall[] {
    return [...this.#open.values()];
  }

  /** Reads the session's log again: its agent and its open tool calls. */
  async sync(): Promise<void> {
    const events = await this.events();
    this.#open.clear();
    for (const e of events) {
      if (e.kind === "session/created" && typeof e.body?.agent === "string") this.agent = e.body.agent;
      if (e.kind === "assistant/message") {
        for (const call of e.body?.tool_calls ?? []) {
          this.#open.set(call.id, { id: call.id, name: call.name, arguments: call.arguments ?? {} });
        }
      }
      if (e.kind === "tool/result") this.#open.delete(e.body?.tool_call_id);
    }
  }

  /** One step: posts `messages` (then `user` as a user message) with `facts`, and resolves to
   * the request `body` in `format`, ready for the provider SDK's `create(body)`, with the
   * step's number and usage. Throws `OpenToolCallsError` before sending when tool calls are
   * still unanswered. */
  async step<Body = ProviderBody>(input: StepInput = {}): Promise<StepResult<Body>> {
    const messages: StepMessage[] = [...(input.messages ?? [])];
    if (input.user !== undefined) messages.push({ role: "user", content: input.user });
    const answered = new Set(messages.map(answeredBy).filter((id): id is string => id !== undefined));
    const open = [...this.#open.keys()].filter((id) => !answered.has(id));
    if (open.length > 0) {
      throw new OpenToolCallsError(
        open,
        `session ${this.id}: tool calls ${quoted(open)} are not answered; record a result for each ` +
          "with session.toolResult(callId, content) (or send them in this step's messages) before the next step",
      );
    }
    const format = input.format ?? this.format;
    // Ask for what changed since the body this session keeps (0: none yet).
    const since = this.#bodies.get(format)?.step ?? 0;
    let answer: { request?: Body; parts?: StepParts; step: number; usage: StepUsage };
    try {
      answer = await this.#transport.json("POST", this.#path("/steps"), { messages, facts: input.facts ?? {}, format, since });
    } catch (e) {
      // The log knows calls this object does not (another process recorded them): read it,
      // so openToolCalls says what is open, then report the daemon's error.
      if (e instanceof OpenToolCallsError) await this.sync().catch(() => {});
      throw e;
    }
    for (const id of answered) this.#open.delete(id);
    if (answer.parts === undefined) {
      // A daemon that sends whole bodies.
      this.#bodies.delete(format);
      return { body: answer.request as Body, step: answer.step, usage: answer.usage };
    }
    let kept = this.#bodies.get(format);
    if (kept === undefined) {
      kept = new KeptBody();
      this.#bodies.set(format, kept);
    }
    const text = kept.apply(answer.parts, answer.step, `POST ${this.#path("/steps")}`);
    return { body: JSON.parse(text) as Body, step: answer.step, usage: answer.usage, text };
  }

  /** Records the model's reply as the provider SDK returned it — an OpenAI completion (or its
   * `choices[0].message`), an Anthropic message (or `{role, content}`), an OpenAI Responses
   * response (or `{output}`), a Gemini `GenerateContentResponse`, a Bedrock `ConverseResponse`
   * — unchanged; or promptd's neutral assistant or tool message.
   * Resolves to the event's seq and the tool calls the reply made, in one shape. A reply with
   * its `usage` is recorded with its cache outcome, judged at `sentAt` (when the request was
   * sent, ms since the Unix epoch; default: now). */
  async record(reply: object, options: { sentAt?: number } = {}): Promise<Recorded> {
    const toolCalls = toolCallsOf(reply); // throws on arguments encoded twice, before sending
    const answers = answeredBy(reply);
    if (answers === undefined && this.#open.size > 0) {
      const open = [...this.#open.keys()];
      throw new OpenToolCallsError(
        open,
        `session ${this.id}: tool calls ${quoted(open)} are not answered; a new reply comes after their results`,
      );
    }
    const path = options.sentAt === undefined ? "/messages" : `/messages?sent_at=${options.sentAt}`;
    const answer = await this.#transport.json<{ seq: number; tool_calls?: ToolCall[] }>(
      "POST",
      this.#path(path),
      reply,
    );
    // As recorded: with the names the daemon gave calls that came without ids (Gemini's).
    const recorded = Array.isArray(answer.tool_calls)
      ? answer.tool_calls.map((c) => ({ id: c.id, name: c.name, arguments: c.arguments ?? {} }))
      : toolCalls;
    if (answers !== undefined) this.#open.delete(answers);
    for (const call of recorded) this.#open.set(call.id, call);
    return { seq: answer.seq, toolCalls: recorded };
  }

  /** Records the result of tool call `callId`: text, or blocks (text, images, documents); any
   * other value is sent as its JSON text. `isError` tells providers that support it that the
   * tool failed. */
  async toolResult(callId: string, content: unknown, options: { isError?: boolean } = {}): Promise<Recorded> {
    const message: StepMessage = { role: "tool", tool_call_id: callId, content: toolContent(content) };
    if (options.isError) message.is_error = true;
    const { seq } = await this.#transport.json<{ seq: number }>("POST", this.#path("/messages"), message);
    this.#open.delete(callId);
    return { seq, toolCalls: [] };
  }

  /** The session's log, in order. */
  async events(): Promise<SessionEvent[]> {
    return (await this.#transport.json<{ events: SessionEvent[] }>("GET", this.#path("/events"))).events;
  }

  /** Step `n`'s request rebuilt from the log: byte-identical to what the step returned. */
  request<Body = ProviderBody>(n: number, options: { format?: Format } = {}): Promise<Body> {
    const format = options.format ?? this.format;
    return this.#transport.json("GET", this.#path(`/steps/${n}/request?format=${segment(format)}`));
  }

  /** Step `n`'s request in `format` and which plugin (id, sha256) and scope gave each
   * section, context, variable and tool, as recorded with the step. */
  explain<Body = ProviderBody>(n: number, options: { format?: Format } = {}): Promise<StepExplain<Body>> {
    const format = options.format ?? this.format;
    return this.#transport.json("GET", this.#path(`/steps/${n}/explain?format=${segment(format)}`));
  }

  /** How much of step `n`'s request (in `format`) a provider's prompt cache could reuse from
   * the step before, where the prefix broke and why. */
  diff(n: number, options: { format?: Format } = {}): Promise<StepDiff> {
    const format = options.format ?? this.format;
    return this.#transport.json("GET", this.#path(`/steps/${n}/diff?format=${segment(format)}`));
  }

  /** Per step, the budget's estimate against the provider-reported usage; and the totals. */
  usage(): Promise<UsageReport> {
    return this.#transport.json("GET", this.#path("/usage"));
  }

  /** Shows `summary` in place of the message events `fromSeq..=toSeq` in later requests;
   * resolves to the seq of the compaction event. */
  async compact(fromSeq: number, toSeq: number, summary: string): Promise<number> {
    const { seq } = await this.#transport.json<{ seq: number }>("POST", this.#path("/compact"), {
      from: fromSeq,
      to: toSeq,
      summary,
    });
    return seq;
  }
}
