// promptd-client: sessions, steps whose body goes to the provider SDK unchanged, replies
// recorded as the SDK returned them, tool results, and promptd's errors as typed exceptions.
export { Client, Session, DEFAULT_URL, DEFAULT_TIMEOUT_MS } from "./client.js";
export type { ClientOptions, SessionOptions } from "./client.js";
export {
  PromptdError,
  BadRequestError,
  UnauthorizedError,
  NotFoundError,
  MethodNotAllowedError,
  ConflictError,
  PayloadTooLargeError,
  UnprocessableError,
  InternalError,
  PluginFailedError,
  UnavailableError,
  DaemonUnreachableError,
  TimeoutError,
  OpenToolCallsError,
} from "./errors.js";
export { toolCallsOf } from "./replies.js";
export { converseInput } from "./sdk.js";
export type * from "./types.js";
