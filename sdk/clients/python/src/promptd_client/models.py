"""What the daemon's routes return, as plain dataclasses (no pydantic: the client's only
dependency is httpx). Each keeps the JSON it came from in ``raw``, so a field the daemon adds
later is still reachable before the client names it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Literal, Optional

__all__ = [
    "Format",
    "ErrorInfo",
    "Health",
    "Plugin",
    "RegistryEvent",
    "StepResult",
    "ToolCall",
    "Recorded",
    "Event",
    "Compacted",
    "SessionSummary",
    "StepExplain",
    "StepDiff",
    "ToolRun",
]

#: The body shapes a step can return (``"format"`` of a step, ``?format=`` of a rebuild).
Format = Literal["neutral", "openai", "anthropic", "openai-responses", "gemini", "bedrock"]


@dataclass(frozen=True)
class ErrorInfo:
    """An error as the daemon reports it inside a body (a plugin's last error, a refused
    load)."""

    code: str
    message: str

    @classmethod
    def of(cls, value: Any) -> Optional["ErrorInfo"]:
        if not isinstance(value, dict):
            return None
        return cls(str(value.get("code", "")), str(value.get("message", "")))


@dataclass(frozen=True)
class Health:
    """``GET /v1/health``: ``status`` is ``ok`` or ``loading`` (then ``loaded`` of ``total``
    plugins are in; steps wait for the first full load), or ``no_plugin_set`` on a daemon
    following its store's plugin sets none of which loads (steps are refused)."""

    status: str
    plugins: int
    version: str
    loaded: Optional[int] = None
    total: Optional[int] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, value: Dict[str, Any]) -> "Health":
        return cls(status=value["status"], plugins=value.get("plugins", 0),
                   version=value.get("version", ""), loaded=value.get("loaded"),
                   total=value.get("total"), raw=value)


@dataclass(frozen=True)
class Plugin:
    """One plugin file of ``GET /v1/plugins``. ``state`` is ``loaded``, ``refused``,
    ``stale`` (an older version serves, ``serving_sha256``), ``quarantined`` or ``failed`` (an
    MCP server given up on after ``max_failures``)."""

    id: str
    file: str
    sha256: str
    state: str
    serving_sha256: Optional[str]
    last_error: Optional[ErrorInfo]
    #: What the serving version declares (sections, contexts, variables, tools), or None.
    declares: Optional[Dict[str, Any]]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, value: Dict[str, Any]) -> "Plugin":
        return cls(id=value["id"], file=value["file"], sha256=value["sha256"],
                   state=value["state"], serving_sha256=value.get("serving_sha256"),
                   last_error=ErrorInfo.of(value.get("last_error")),
                   declares=value.get("declares"), raw=value)


@dataclass(frozen=True)
class RegistryEvent:
    """A change of the plugin registry: an entry of ``applied`` (reload, unload, enable) or
    one server-sent event of ``GET /v1/events``.

    ``kind`` is ``load``, ``reload``, ``unload``, ``refused``, ``quarantine``, ``failed``, or
    ``lagged``:
    the stream lost ``missed`` events and ends; resync from ``plugins()`` and reconnect.
    """

    seq: Optional[int]
    kind: str
    plugin: Optional[str] = None
    file: Optional[str] = None
    sha256: Optional[str] = None
    error: Optional[ErrorInfo] = None
    missed: Optional[int] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, value: Dict[str, Any], kind: Optional[str] = None,
           seq: Optional[int] = None) -> "RegistryEvent":
        return cls(seq=value.get("seq", seq), kind=value.get("kind", kind or ""),
                   plugin=value.get("plugin"), file=value.get("file"),
                   sha256=value.get("sha256"), error=ErrorInfo.of(value.get("error")),
                   missed=value.get("missed"), raw=value)


@dataclass(frozen=True)
class StepResult:
    """One step's answer.

    ``body`` is the provider request in the step's format, ready for the SDK unchanged:
    ``client.chat.completions.create(**result.body)``, ``client.messages.create(**result.body)``,
    ``client.responses.create(**result.body)`` or ``client.models.generate_content(**result.body)``
    (``google-genai``). For ``boto3``'s ``converse`` use :meth:`sdk_kwargs`: boto3 wants media as
    raw bytes. ``step`` is its number (1-based); ``usage`` the budget's measure of it
    (tokenizer, window, tools, system, sections, contexts, messages, total, ...).
    """

    body: Dict[str, Any]
    step: int
    usage: Dict[str, Any]
    format: str
    #: The body's exact bytes (as text), kept by the session from the daemon's parts: what
    #: ``GET …/steps/{n}/request`` returns. ``None`` from a daemon that sends whole bodies.
    text: Optional[str] = None

    def sdk_kwargs(self) -> Dict[str, Any]:
        """The body as the official SDK's call takes it, a copy: for ``bedrock``
        (``boto3``'s ``converse(**step.sdk_kwargs())``) each image's and document's
        ``source.bytes`` and each ``redactedContent`` as raw bytes, which boto3 base64-encodes
        itself (base64 text there would pass its validator and reach the model encoded
        twice); for every other format the body as it is."""
        from . import _core  # here: _core imports this module

        return _core.sdk_kwargs(self.format, self.body)


@dataclass(frozen=True)
class ToolCall:
    """A tool call a recorded reply opened. ``arguments`` is the decoded JSON object, whatever
    the provider's shape (OpenAI's JSON string, Anthropic's ``input`` object)."""

    id: str
    name: str
    arguments: Dict[str, Any]


@dataclass(frozen=True)
class Recorded:
    """``POST /v1/sessions/{id}/messages``: the log position of the recorded message, and the
    tool calls a recorded reply opened (empty for a final answer or a tool result)."""

    seq: int
    tool_calls: List[ToolCall] = field(default_factory=list)


@dataclass(frozen=True)
class Event:
    """One event of a session's log (``session/created``, ``user/message``,
    ``context/snapshot``, ``request/header``, ``step``, ``assistant/message``,
    ``tool/result``, ...)."""

    seq: int
    kind: str
    body: Dict[str, Any]
    at_ms: int

    @classmethod
    def of(cls, value: Dict[str, Any]) -> "Event":
        return cls(seq=value["seq"], kind=value["kind"], body=value["body"],
                   at_ms=value["at_ms"])


@dataclass(frozen=True)
class Compacted:
    """``POST /v1/sessions/{id}/compact``: the seq of the compaction event."""

    seq: int


@dataclass(frozen=True)
class SessionSummary:
    """One session of ``GET /v1/sessions`` (most recent activity first)."""

    id: str
    agent: str
    steps: int
    events: int
    created_ms: int
    last_ms: int
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, value: Dict[str, Any]) -> "SessionSummary":
        return cls(id=value["id"], agent=value["agent"], steps=value["steps"],
                   events=value["events"], created_ms=value["created_ms"],
                   last_ms=value["last_ms"], raw=value)


@dataclass(frozen=True)
class StepExplain:
    """``GET /v1/sessions/{id}/steps/{n}/explain``: step ``n``'s request in ``format`` and who
    gave each part: ``provenance`` has ``plugins`` (id -> sha256) and, per section, context,
    variable and tool, its ``name``, ``plugin``, ``scope`` and a hash of its ``text``
    (None for steps recorded before provenance was)."""

    step: int
    format: str
    request: Dict[str, Any]
    provenance: Optional[Dict[str, Any]]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, value: Dict[str, Any]) -> "StepExplain":
        return cls(step=value["step"], format=value["format"], request=value["request"],
                   provenance=value.get("provenance"), raw=value)


@dataclass(frozen=True)
class StepDiff:
    """``GET /v1/sessions/{id}/steps/{n}/diff``: how much of step ``n``'s request a provider's
    prompt cache could reuse. ``previous`` compares it with step n-1 and ``same_header`` with
    the last earlier step of the same header (each ``{step, bytes, shared_bytes,
    prefix_kept, first_divergence}``, or None); ``causes`` say why the prefix broke or that
    it was kept, and ``breaks_cache`` whether it broke (step n-1's request is not a prefix of
    step n's); ``cached_share`` is the best of the two, by ``bytes`` (and ``tokens``)."""

    step: int
    format: str
    bytes: int
    cached_share: Dict[str, Any]
    causes: List[str]
    breaks_cache: bool
    notes: List[str]
    previous: Optional[Dict[str, Any]]
    same_header: Optional[Dict[str, Any]]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, value: Dict[str, Any]) -> "StepDiff":
        return cls(step=value["step"], format=value["format"], bytes=value["bytes"],
                   cached_share=value.get("cached_share") or {},
                   causes=list(value.get("causes") or []),
                   breaks_cache=bool(value.get("breaks_cache", False)),
                   notes=list(value.get("notes") or []),
                   previous=value.get("previous"), same_header=value.get("same_header"),
                   raw=value)


@dataclass(frozen=True)
class ToolRun:
    """``POST /v1/sessions/{id}/tool-calls/{call_id}/run``: the daemon ran an open call on the
    MCP server whose tool it names and recorded the outcome: the ``tool/result`` event's
    ``seq``, the contributor that ran it (``plugin``, e.g. ``mcp:time``) and the recorded tool
    ``message`` (``role``, ``tool_call_id``, ``content``, ``is_error``)."""

    seq: int
    plugin: str
    message: Dict[str, Any]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, value: Dict[str, Any]) -> "ToolRun":
        return cls(seq=value["seq"], plugin=value["plugin"], message=value["message"], raw=value)
