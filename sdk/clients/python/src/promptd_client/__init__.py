"""promptd_client: the Python client for the promptd daemon.

    from promptd_client import Client

    session = Client("http://127.0.0.1:8417").session("coder")
    step = session.step(user="What is here?", facts={"cwd": "/src/app"}, format="openai")
    reply = openai_client.chat.completions.create(**step.body)   # the body, unchanged
    for call in session.record(reply).tool_calls:                 # the reply, unchanged
        session.tool_result(call.id, run(call.name, call.arguments))

Errors are :class:`PromptdError` subclasses carrying the daemon's stable ``code``.
"""

from ._async import AsyncClient, AsyncSession
from ._sync import Client, Session
from .errors import (BadRequest, BadResponse, Conflict, ConnectionLost, DaemonUnreachable,
                     MethodNotAllowed, NotFound, OpenToolCalls, PayloadTooLarge, PluginFailed,
                     PromptdError, RequestTimeout, ServerError, Unauthorized, Unavailable,
                     Unprocessable)
from .models import (Compacted, ErrorInfo, Event, Format, Health, Plugin, Recorded,
                     RegistryEvent, SessionSummary, StepDiff, StepExplain, StepResult, ToolCall,
                     ToolRun)

__version__ = "0.1.0"

__all__ = [
    "Client", "Session", "AsyncClient", "AsyncSession",
    "Compacted", "ErrorInfo", "Event", "Format", "Health", "Plugin", "Recorded",
    "RegistryEvent", "SessionSummary", "StepDiff", "StepExplain", "StepResult", "ToolCall",
    "ToolRun",
    "PromptdError", "BadRequest", "Unauthorized", "NotFound", "MethodNotAllowed", "Conflict",
    "PayloadTooLarge", "Unprocessable", "OpenToolCalls", "ServerError", "PluginFailed",
    "Unavailable", "DaemonUnreachable", "RequestTimeout", "ConnectionLost", "BadResponse",
]
