"""promptd's errors as exceptions.

Every error response of the daemon is ``{"error": {"code", "message"}}`` with a 4xx/5xx status;
the client raises the class of that status, carrying the daemon's stable ``code`` (e.g.
``unknown_session``, ``unknown_variable``, ``open_tool_calls``) and its ``message``. Catch by
class for the kind of failure, and compare ``code`` for the exact cause.
"""

from __future__ import annotations

from typing import Optional, Sequence

__all__ = [
    "PromptdError",
    "BadRequest",
    "Unauthorized",
    "NotFound",
    "MethodNotAllowed",
    "Conflict",
    "PayloadTooLarge",
    "Unprocessable",
    "OpenToolCalls",
    "ServerError",
    "PluginFailed",
    "Unavailable",
    "DaemonUnreachable",
    "RequestTimeout",
    "ConnectionLost",
    "BadResponse",
]


class PromptdError(Exception):
    """Any failure talking to promptd.

    ``code`` is promptd's stable error code (or one of the client's own: ``unreachable``,
    ``timeout``, ``connection_lost``, ``bad_response``, ``http_STATUS`` for an error body that
    is not promptd's JSON); ``status`` is the HTTP status, None when no answer came or the
    client refused before sending.
    """

    def __init__(
        self,
        code: str,
        message: str,
        status: Optional[int] = None,
        *,
        method: Optional[str] = None,
        path: Optional[str] = None,
    ) -> None:
        super().__init__(code, message, status)
        self.code = code
        self.message = message
        self.status = status
        self.method = method
        self.path = path

    def __str__(self) -> str:
        where = f" ({self.method} {self.path})" if self.method and self.path else ""
        status = f" HTTP {self.status}" if self.status is not None else ""
        return f"[{self.code}]{status}{where}: {self.message}"

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(code={self.code!r}, message={self.message!r}, "
                f"status={self.status!r})")


class BadRequest(PromptdError):
    """400: malformed input (``bad_request``, ``invalid_agent``)."""


class Unauthorized(PromptdError):
    """401: the daemon wants ``Authorization: Bearer <token>`` (``unauthorized``)."""


class NotFound(PromptdError):
    """404: an unknown session, step, plugin or route (``unknown_session``, ``unknown_step``,
    ``unknown_plugin``, ``not_found``)."""


class MethodNotAllowed(PromptdError):
    """405 (``method_not_allowed``)."""


class Conflict(PromptdError):
    """409: another writer appended to the session (``store_conflict``; the next step starts
    from the log), or a tool call the daemon cannot run: answered already
    (``tool_call_answered``) or no running MCP server has its tool (``tool_not_runnable``)."""


class PayloadTooLarge(PromptdError):
    """413: the body is over ``[limits] max_body_mb`` (``body_too_large``)."""


class Unprocessable(PromptdError):
    """422: well-formed input that cannot be assembled or kept (``unknown_variable``,
    ``context_overflow``, ``missing_model_setting``, ``unknown_tool_call``, ...)."""


class OpenToolCalls(Unprocessable):
    """A step or reply while tool calls are still unanswered (``open_tool_calls``).

    Raised by the client *before* sending when it knows the calls are open (``status`` is
    None then), and for the daemon's own 422 ``open_tool_calls``. ``call_ids`` names the open
    calls when the client knows them.
    """

    def __init__(self, code: str, message: str, status: Optional[int] = None, *,
                 call_ids: Sequence[str] = (), method: Optional[str] = None,
                 path: Optional[str] = None) -> None:
        super().__init__(code, message, status, method=method, path=path)
        self.call_ids = list(call_ids)


class ServerError(PromptdError):
    """500: a store or engine failure (``store``, ``store_corrupt``, ``engine``, ...)."""


class PluginFailed(PromptdError):
    """502: a plugin call failed during assembly (``plugin_trap``, ``plugin_error``, ...)."""


class Unavailable(PromptdError):
    """503: the daemon cannot serve now (``loading`` for 30 s, ``plugin_set_behind`` or
    ``plugin_set_unavailable`` on a daemon following its store's plugin sets, or ``store``
    once its database was deleted under it)."""


class DaemonUnreachable(PromptdError):
    """Nothing answered at the daemon's address (``unreachable``): it is not running, or
    listens elsewhere."""


class RequestTimeout(PromptdError):
    """The daemon did not answer within the client's timeout (``timeout``)."""


class ConnectionLost(PromptdError):
    """The connection broke before a whole answer came (``connection_lost``)."""


class BadResponse(PromptdError):
    """A 2xx answer that is not the JSON the route returns (``bad_response``)."""


_BY_STATUS = {
    400: BadRequest,
    401: Unauthorized,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    413: PayloadTooLarge,
    422: Unprocessable,
    500: ServerError,
    502: PluginFailed,
    503: Unavailable,
}


def error_class(status: int, code: str) -> type[PromptdError]:
    """The exception class for an error answer; a code more specific than its status wins."""
    if code == "open_tool_calls":
        return OpenToolCalls
    return _BY_STATUS.get(status, PromptdError)
