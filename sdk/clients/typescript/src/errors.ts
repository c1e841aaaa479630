// promptd's errors as typed exceptions. Every non-2xx answer of the daemon is
// `{"error": {"code", "message"}}` with a stable `code`; the class says which status family it
// came with, so a loop can `catch (e) { if (e instanceof NotFoundError) ... }` or switch on
// `e.code` without parsing messages.

/** Any error from promptd or from talking to it. `status` is the HTTP status, or 0 when the
 * error arose in the client (the daemon unreachable, a timeout, a check before sending). */
export class PromptdError extends Error {
  /** promptd's stable error code (`unknown_session`, `unknown_variable`, ...), or the client's
   * own (`unreachable`, `timeout`, `invalid_response`, `open_tool_calls`, `invalid_arguments`). */
  readonly code: string;
  readonly status: number;
  /** `METHOD /path` of the request that failed, when there was one. */
  readonly request: string | undefined;

  constructor(code: string, message: string, status = 0, request?: string) {
    super(message);
    this.name = new.target.name;
    this.code = code;
    this.status = status;
    this.request = request;
  }
}

/** 400: malformed input (`bad_request`, `invalid_agent`). */
export class BadRequestError extends PromptdError {}
/** 401: the daemon has a token and the request did not carry it (`unauthorized`). */
export class UnauthorizedError extends PromptdError {}
/** 404: an unknown session, step, plugin or route (`unknown_session`, `unknown_step`,
 * `unknown_plugin`, `not_found`). */
export class NotFoundError extends PromptdError {}
/** 405: a route that exists with another method (`method_not_allowed`). */
export class MethodNotAllowedError extends PromptdError {}
/** 409: another writer appended to the session meanwhile (`store_conflict`); the next step
 * starts from the log. */
export class ConflictError extends PromptdError {}
/** 413: a body over `[limits] max_body_mb` (`body_too_large`). */
export class PayloadTooLargeError extends PromptdError {}
/** 422: well-formed input that cannot be assembled or recorded (`unknown_variable`,
 * `empty_message`, `context_overflow`, `missing_model_setting`, ...). Nothing was recorded. */
export class UnprocessableError extends PromptdError {}
/** 500: a store or engine failure (`store`, `store_corrupt`, `engine`, ...). */
export class InternalError extends PromptdError {}
/** 502: a plugin call failed (`plugin_call`, ...). */
export class PluginFailedError extends PromptdError {}
/** 503: the daemon cannot serve now (`loading` after 30 s, `store` when its database went). */
export class UnavailableError extends PromptdError {}

/** Nothing answers at the daemon's address (connection refused, unknown host, reset). */
export class DaemonUnreachableError extends PromptdError {}

/** The request took longer than the client's `timeoutMs`. */
export class TimeoutError extends PromptdError {}

/** Tool calls the model made are not answered yet. Thrown before sending a step that does
 * not answer them all (status 0), or mapped from the daemon's own 422 `open_tool_calls`. */
export class OpenToolCallsError extends UnprocessableError {
  /** The ids of the unanswered calls. */
  readonly callIds: string[];

  constructor(callIds: string[], message: string, status = 0, request?: string) {
    super("open_tool_calls", message, status, request);
    this.callIds = callIds;
  }
}

type ErrorClass = new (code: string, message: string, status: number, request?: string) => PromptdError;

const BY_STATUS: Record<number, ErrorClass> = {
  400: BadRequestError,
  401: UnauthorizedError,
  404: NotFoundError,
  405: MethodNotAllowedError,
  409: ConflictError,
  413: PayloadTooLargeError,
  422: UnprocessableError,
  500: InternalError,
  502: PluginFailedError,
  503: UnavailableError,
};

/** The call ids a daemon message names in backticks (`tool calls `a`, `b` are not answered`). */
function quotedIds(message: string): string[] {
  return [...message.matchAll(/`([^`]*)`/g)].map((m) => m[1] ?? "");
}

/** The typed error for a non-2xx answer. `text` is the raw body: promptd's JSON error, or
 * anything else a proxy in between may have sent (still an error naming the status). */
export function errorFromResponse(status: number, text: string, request: string): PromptdError {
  let code: string | undefined;
  let message: string | undefined;
  let callIds: string[] | undefined;
  try {
    const parsed = JSON.parse(text) as {
      error?: { code?: unknown; message?: unknown; call_ids?: unknown };
    };
    if (typeof parsed?.error?.code === "string") {
      code = parsed.error.code;
      message = typeof parsed.error.message === "string" ? parsed.error.message : "";
      const ids = parsed.error.call_ids;
      if (Array.isArray(ids)) {
        callIds = ids.filter((i): i is string => typeof i === "string");
      }
    }
  } catch {
    // Not JSON: handled below.
  }
  if (code === undefined || message === undefined) {
    const excerpt = text.length > 200 ? `${text.slice(0, 200)}…` : text;
    code = "invalid_response";
    message = `${request} answered HTTP ${status} without promptd's JSON error: ${JSON.stringify(excerpt)}`;
  }
  if (code === "open_tool_calls") {
    return new OpenToolCallsError(callIds ?? quotedIds(message), message, status, request);
  }
  const Class = BY_STATUS[status] ?? PromptdError;
  return new Class(code, message, status, request);
}
