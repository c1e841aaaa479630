// The shapes the daemon sends and takes (README, "The daemon" and "Budgets"). Bodies for the
// providers are left open on purpose: they go to the provider SDK unchanged, and that SDK has
// the precise types.

/** The body formats a step or a rebuild can return. */
export type Format = "neutral" | "openai" | "anthropic" | "openai-responses" | "gemini" | "bedrock";

/** A provider request body as promptd returned it: `any` by default so it can be handed to
 * `openai.chat.completions.create(body)` or `anthropic.messages.create(body)` as is; pass the
 * SDK's own params type to `step<T>()` for a checked one. */
export type ProviderBody = any;

/** One block of a user message's or tool result's content. */
export type ContentBlock =
  | { type: "text"; text: string }
  | { type: "image"; media_type: string; data: string }
  | { type: "image"; url: string }
  | { type: "document"; media_type: "application/pdf"; data: string; name?: string }
  | { type: "document"; url: string; name?: string };

/** Text, or blocks (text, images, documents). */
export type Content = string | ContentBlock[];

/** A tool call in promptd's neutral shape; `arguments` is the parsed JSON object. */
export interface ToolCall {
  id: string;
  name: string;
  arguments: Record<string, unknown>;
}

/** A message a step may carry: user input, or a tool's result. */
export type StepMessage =
  | { role: "user"; content: Content }
  | { role: "tool"; tool_call_id: string; content: Content; is_error?: boolean };

/** What `session.step()` takes. */
export interface StepInput {
  /** User text (or blocks), appended after `messages` as one user message. */
  user?: Content;
  /** Messages in promptd's neutral shape: tool results first, then user input. */
  messages?: StepMessage[];
  /** Facts for the plugins at this step (`cwd`, `git_branch`, `read_only`, ...). */
  facts?: Record<string, string>;
  /** The body's format; default: the session's (`"neutral"` unless set). */
  format?: Format;
}

/** A measured part of a request (`chars` and `tokens` of the budget's tokenizer). */
export interface Measure {
  chars: number;
  tokens: number;
}

/** A step's measure (README, "Budgets"). Keys beyond these may be added by newer daemons. */
export interface StepUsage {
  tokenizer: string;
  window?: number;
  reserve: number;
  tools: Measure;
  system: Measure;
  sections: Array<Measure & { name: string }>;
  contexts: Array<Measure & { name: string }>;
  snapshot?: Measure | null;
  messages: Measure;
  message_count: number;
  total: Measure;
  dropped?: { messages: number; tokens: number } | null;
  [key: string]: unknown;
}

/** What `session.step()` resolves to. */
export interface StepResult<Body = ProviderBody> {
  /** The request for the provider SDK: `create(body)`, unchanged. */
  body: Body;
  /** The step's number in the session, from 1. */
  step: number;
  usage: StepUsage;
  /** The body's exact bytes, kept by the session from the daemon's parts: what
   * `GET …/steps/{n}/request` returns. Undefined from a daemon that sends whole bodies. */
  text?: string;
}

/** What `session.record()` and `session.toolResult()` resolve to. */
export interface Recorded {
  /** The sequence number of the event the daemon appended. */
  seq: number;
  /** The tool calls this reply made (empty for a tool result or a reply without calls), in
   * the neutral shape whatever the provider: run them, then answer each with `toolResult`. */
  toolCalls: ToolCall[];
}

/** The kinds of a session's log events. */
export type SessionEventKind =
  | "session/created"
  | "user/message"
  | "assistant/message"
  | "tool/result"
  | "context/snapshot"
  | "request/header"
  | "plugin/omitted"
  | "history/dropped"
  | "history/compacted"
  | "step";

/** One event of a session's log (`GET /v1/sessions/{id}/events`). */
export interface SessionEvent {
  seq: number;
  kind: SessionEventKind | string;
    body: any;
  at_ms: number;
}

/** `GET /v1/sessions/{id}/usage`: the estimate per step against what the provider reported. */
export interface UsageReport {
  steps: Array<{
    step: number;
    estimate: number;
    tokenizer: string;
    actual?: {
      input_tokens?: number;
      output_tokens?: number;
      cached_tokens?: number;
      cache_write_tokens?: number;
      cache_write_1h_tokens?: number;
    };
    /** How the provider's cache served the step's request, recorded with its reply. */
    cache?: CacheOutcome;
    /** What the request cost by the config's `[pricing]`, when its model has a price. */
    cost?: Cost;
    [key: string]: unknown;
  }>;
  totals: {
    estimate: number;
    actual: number;
    cached: number;
    compared_steps: number;
    actual_per_estimate: number | null;
    cached_share: number | null;
    [key: string]: unknown;
  };
  /** The session's cost ledger. */
  ledger: Ledger;
}

/** A reply's cache outcome (docs/cache.md). */
export interface CacheOutcome {
  outcome:
    | "hit"
    | "cold"
    | "ttl_expired"
    | "prefix_changed"
    | "model_changed"
    | "compacted"
    | "routing"
    | "partial"
    | "uncacheable"
    | "unexplained";
  format: string;
  model?: string;
  sent_at_ms: number;
  expected_read: number;
  lost?: number;
  gap_ms?: number;
  part?: string;
  plugin?: string;
  cause?: string;
}

/** A cost in US dollars. */
export interface Cost {
  total: number;
  input: number;
  cache_read: number;
  cache_write: number;
  output: number;
  miss: number;
}

/** One cause's totals in a ledger. */
export interface CauseTotals {
  replies: number;
  lost_tokens: number;
  miss_cost: number;
}

/** Sums over recorded replies. */
export interface Ledger {
  replies: number;
  input_tokens: number;
  cached_tokens: number;
  cache_write_tokens: number;
  output_tokens: number;
  cached_share: number | null;
  outcomes: Record<string, CauseTotals>;
  plugins: Record<string, CauseTotals>;
  cost: Cost | null;
  unpriced_models: string[];
}

/** `GET /v1/usage`: the cost ledger across sessions. */
export interface UsageSummary {
  since_ms: number | null;
  sessions: number;
  total: Ledger;
  agents: Record<string, Ledger>;
}

/** `GET /v1/health`. */
export interface Health {
  status: "ok" | "loading" | "no_plugin_set" | "error";
  plugins: number;
  version: string;
  loaded?: number;
  total?: number;
  error?: { code: string; message: string };
  [key: string]: unknown;
}

/** An error as the daemon reports it inside other answers. */
export interface ErrorBody {
  code: string;
  message: string;
}

/** A plugin file as `GET /v1/plugins` lists it. */
export interface PluginStatus {
  id: string;
  file: string;
  sha256: string;
  serving_sha256: string | null;
  state: "loaded" | "refused" | "stale" | "quarantined" | "failed" | string;
  last_error: ErrorBody | null;
  /** What the serving version declares (sections, contexts, variables, tools), or null. */
    declares: any;
}

/** The kinds of registry changes. */
export type ChangeKind = "load" | "reload" | "unload" | "refused" | "quarantine" | "failed";

/** One applied registry change (`POST /v1/plugins/reload`, the event stream). */
export interface RegistryEvent {
  seq: number;
  kind: ChangeKind | string;
  plugin: string;
  file: string;
  sha256: string;
  error: ErrorBody | null;
}

/** One server-sent event of `GET /v1/events`: a registry change, or `lagged` (events were
 * lost: resync from `plugins()`, then reconnect with `since`); after `lagged` the stream ends. */
export type RegistryStreamEvent =
  | { event: "lagged"; id: null; data: { missed: number } }
  | { event: ChangeKind; id: number | null; data: RegistryEvent };

/** A session as `GET /v1/sessions` lists it. */
export interface SessionSummary {
  id: string;
  agent: string;
  /** Steps taken. */
  steps: number;
  /** Events in the log. */
  events: number;
  created_ms: number;
  /** When its last event was written. */
  last_ms: number;
}

/** One effective contribution of a step and who gave it. */
export interface Given {
  name: string;
  plugin: string;
  /** `global`, or the agent it is scoped to. */
  scope: string;
  /** A short hash of the part's text (not for variables). */
  hash?: string;
  [key: string]: unknown;
}

/** `GET /v1/sessions/{id}/steps/{n}/explain`: step n's request and who gave each part. */
export interface StepExplain<Body = ProviderBody> {
  step: number;
  format: Format;
  /** The request exactly as the step returned it in `format`. */
  request: Body;
  /** Null for steps recorded before provenance was (0.1.0 logs). */
  provenance: {
    /** Every plugin serving the step: id → sha256 of its file. */
    plugins: Record<string, string>;
    sections: Given[];
    contexts: Given[];
    variables: Given[];
    tools: Given[];
  } | null;
}

/** One comparison of a step's request with an earlier one. */
export interface PrefixAgainst {
  step: number;
  bytes: number;
  shared_bytes: number;
  prefix_kept: boolean;
  /** Where the prefix broke: the part (`tool \`bash\``, `system`, …) and its byte offset. */
  first_divergence: { part: string; offset: number } | null;
}

/** `GET /v1/sessions/{id}/steps/{n}/diff`: how much of step n's request a provider's prompt
 * cache could reuse, where the prefix broke and why. */
export interface StepDiff {
  step: number;
  format: Format;
  bytes: number;
  /** Against step n−1; null on the first step. */
  previous: PrefixAgainst | null;
  /** Against the last earlier step with the same header, when there is one. */
  same_header: PrefixAgainst | null;
  causes: string[];
  /** Whether step n−1's request is not a prefix of step n's (what was cached for it is not
   * read whole); false on the first step. */
  breaks_cache: boolean;
  notes: string[];
  cached_share: { bytes: number; tokens: { shared: number; [key: string]: unknown } | null };
}
