"""What the sync and async clients share: building request bodies, reading answers and
errors, the session's open tool calls, and the server-sent events parser. No I/O here, so the
two clients cannot drift apart."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Mapping
from typing import Any, Dict, Iterable, List, Optional, Sequence
from urllib.parse import quote

from .errors import BadResponse, OpenToolCalls, PromptdError, error_class
from .models import Event, RegistryEvent, ToolCall

DEFAULT_URL = "http://127.0.0.1:8417"


def segment(value: str) -> str:
    """A path segment: a session or plugin id is never allowed to add path components."""
    return quote(str(value), safe="")


def error_from(status: int, content: bytes, method: str, path: str) -> PromptdError:
    """The exception for a non-2xx answer: promptd's ``{"error": {"code", "message"}}`` when
    the body is that, else one naming the status (a proxy's HTML page, an empty 502...)."""
    try:
        value = json.loads(content)
    except ValueError:
        value = None
    error = value.get("error") if isinstance(value, dict) else None
    if isinstance(error, dict) and isinstance(error.get("code"), str):
        code, message = error["code"], str(error.get("message", ""))
    else:
        text = content.decode("utf-8", "replace").strip()
        code = f"http_{status}"
        message = (f"HTTP {status} from {method} {path}, not a promptd error body"
                   + (f": {text[:500]}" if text else " (empty body)"))
    cls = error_class(status, code)
    if cls is OpenToolCalls:
        ids = error.get("call_ids") if isinstance(error, dict) else None
        ids = [i for i in ids if isinstance(i, str)] if isinstance(ids, list) else []
        return OpenToolCalls(code, message, status, call_ids=ids, method=method, path=path)
    return cls(code, message, status, method=method, path=path)


def parse_json(content: bytes, status: int, method: str, path: str) -> Any:
    try:
        return json.loads(content)
    except ValueError as e:
        raise BadResponse("bad_response", f"the answer is not JSON ({e}): "
                          f"{content[:200].decode('utf-8', 'replace')!r}", status,
                          method=method, path=path) from None


def need(value: Any, key: str, method: str, path: str) -> Any:
    """``value[key]`` of a 2xx answer, or a BadResponse naming what is missing."""
    if not isinstance(value, dict) or key not in value:
        raise BadResponse("bad_response", f"the answer has no `{key}`: {str(value)[:200]}",
                          None, method=method, path=path)
    return value[key]


# --- A step's body, kept by the client ---------------------------------------------------------

class KeptBody:
    """A step's request body in one format, kept from the parts the daemon sends (``since``):
    the text before the message list, each message's JSON text, the text after. Joined, they
    are the body's exact bytes; a step sends only what changed since the step kept."""

    def __init__(self) -> None:
        self.step = 0
        self.open = ""
        self.close = ""
        self.items: List[str] = []

    def apply(self, parts: Any, step: int, method: str, path: str) -> str:
        """Applies ``parts`` (the answer's ``parts``) for ``step``; returns the body's text."""
        try:
            since, keep, items = parts["since"], parts["keep"], parts["items"]
            opened, closed = parts.get("open"), parts.get("close")
            ok = (isinstance(since, int) and isinstance(keep, int) and isinstance(items, list)
                  and (since == 0 or since == self.step) and 0 <= keep <= len(self.items)
                  and (since != 0 or (keep == 0 and isinstance(opened, str)
                                      and isinstance(closed, str))))
        except (TypeError, KeyError):
            ok = False
        if not ok:
            raise BadResponse("bad_response", f"parts this client cannot apply (it holds step "
                              f"{self.step}): {str(parts)[:200]}", None, method=method, path=path)
        del self.items[keep:]
        if opened is not None:
            self.open = opened
        if closed is not None:
            self.close = closed
        self.items.extend(items)
        self.step = step
        return self.open + ",".join(self.items) + self.close


class KeptBodies:
    """A session's kept bodies, one per format."""

    def __init__(self) -> None:
        self._by_format: Dict[str, KeptBody] = {}

    def since(self, fmt: Optional[str]) -> int:
        kept = self._by_format.get(fmt or "neutral")
        return kept.step if kept else 0

    def answer(self, fmt: Optional[str], value: Any, method: str, path: str) -> tuple:
        """The body (parsed) and its text from a step's answer: its ``parts`` applied to the
        kept body, or (a daemon that does not send parts) its ``request``."""
        step = need(value, "step", method, path)
        if isinstance(value, dict) and "parts" in value:
            kept = self._by_format.setdefault(fmt or "neutral", KeptBody())
            text = kept.apply(value["parts"], step, method, path)
            return json.loads(text), text
        self._by_format.pop(fmt or "neutral", None)
        return need(value, "request", method, path), None


# --- Request bodies -----------------------------------------------------------------------------

def fact_value(key: str, value: Any) -> str:
    """Facts are strings on the wire. A string goes as it is (never JSON-encoded again);
    booleans become ``true``/``false`` (what the plugins compare with), numbers their text,
    lists and objects their JSON text (e.g. the ``documents`` fact, a JSON array)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    try:
        return json.dumps(value, ensure_ascii=False)
    except TypeError:
        raise TypeError(f"fact `{key}`: {type(value).__name__} is neither a string nor JSON") \
            from None


def facts_body(facts: Optional[Mapping[str, Any]]) -> Dict[str, str]:
    # A None value means "no such fact this step", as if the key were left out.
    return {str(k): fact_value(str(k), v) for k, v in (facts or {}).items() if v is not None}


def step_messages(user: Any, messages: Optional[Sequence[Mapping[str, Any]]]) -> List[Any]:
    out: List[Any] = [dict(m) for m in messages or []]
    if user is not None:
        out.append({"role": "user", "content": user})
    return out


def tool_content(content: Any) -> Any:
    """A tool result's content: text, or a list of blocks, as given; anything else (a dict a
    tool returned) is sent as its JSON text, once."""
    if isinstance(content, (str, list)):
        return content
    return json.dumps(content, ensure_ascii=False)


def tool_message(call_id: str, content: Any, is_error: bool) -> Dict[str, Any]:
    message = {"role": "tool", "tool_call_id": call_id, "content": tool_content(content)}
    if is_error:
        message["is_error"] = True
    return message


def _bytes_as_base64(value: Any) -> Any:
    """``value`` with every ``bytes`` as standard base64 text, the JSON the APIs send."""
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, Mapping):
        return {k: _bytes_as_base64(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_bytes_as_base64(v) for v in value]
    return value


def reply_json(reply: Any) -> Any:
    """A reply as the daemon takes it: the official SDKs' objects (pydantic models in the
    ``openai``, ``anthropic`` and ``google-genai`` packages) as their JSON; dicts (``boto3``'s
    ``converse`` response) as they are. Bytes (a Gemini ``thoughtSignature``, a Bedrock
    ``redactedContent``) go as standard base64, as the APIs write them: the daemon keeps that
    text and sends it back unchanged."""
    if isinstance(reply, Mapping):
        return _bytes_as_base64(dict(reply))
    dump = getattr(reply, "model_dump", None)
    if callable(dump) and type(reply).__module__.startswith("google.genai"):
        # google-genai's JSON dump writes bytes URL-safe; its fields in the API's spelling.
        return _bytes_as_base64(dump(mode="python", by_alias=True, exclude_none=True,
                                     exclude={"sdk_http_response", "automatic_function_calling_history"}))
    if callable(dump):
        return dump(mode="json")
    to_dict = getattr(reply, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    raise TypeError(f"cannot record a {type(reply).__name__}: pass the SDK's reply object "
                    "(ChatCompletion, Message, Response) or a dict")


# --- Tool calls a reply opens (the same shapes the daemon reads, promptd_core::replies) --------

def _arguments(value: Any) -> Dict[str, Any]:
    # OpenAI writes arguments as JSON text; decoded here once, for the caller's tool.
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}


def sdk_kwargs(fmt: str, body: Dict[str, Any]) -> Dict[str, Any]:
    """A copy of ``body`` as the format's official SDK call takes it (see
    :meth:`StepResult.sdk_kwargs`)."""
    out = copy.deepcopy(body)
    if fmt != "bedrock":
        return out

    def raw(blocks: Any) -> None:
        for block in blocks if isinstance(blocks, list) else []:
            if not isinstance(block, dict):
                continue
            for kind in ("image", "document"):
                source = (block.get(kind) or {}).get("source") if isinstance(block.get(kind), dict) else None
                if isinstance(source, dict) and isinstance(source.get("bytes"), str):
                    source["bytes"] = base64.b64decode(source["bytes"])
            reasoning = block.get("reasoningContent")
            if isinstance(reasoning, dict) and isinstance(reasoning.get("redactedContent"), str):
                reasoning["redactedContent"] = base64.b64decode(reasoning["redactedContent"])
            result = block.get("toolResult")
            if isinstance(result, dict):
                raw(result.get("content"))

    for message in out.get("messages") or []:
        if isinstance(message, dict):
            raw(message.get("content"))
    return out


def recorded_calls(answer: Any, value: Any) -> List[ToolCall]:
    """The calls a recorded reply opened: as the daemon recorded them (with the ids it gave
    calls that came without), else read from the reply here (an older daemon)."""
    calls = answer.get("tool_calls") if isinstance(answer, dict) else None
    if isinstance(calls, list):
        return [ToolCall(str(c.get("id", "")), str(c.get("name", "")), _arguments(c.get("arguments")))
                for c in calls if isinstance(c, dict)]
    return tool_calls_of(value)


def tool_calls_of(value: Any) -> List[ToolCall]:
    """The tool calls a recorded reply made, in their order, from any shape the daemon
    accepts: OpenAI Chat (a completion or ``choices[0].message``), Responses (``output``
    items), Anthropic (``content`` blocks, a message object) or the neutral shape."""
    if not isinstance(value, dict):
        return []
    # Gemini (a response's first candidate, or a model content): calls may come without ids;
    # the daemon names them, and record() takes its names.
    candidates = value.get("candidates")
    if isinstance(candidates, list) or value.get("role") == "model":
        content = (candidates[0] or {}).get("content") if candidates else value
        parts = (content or {}).get("parts") or []
        calls = [p.get("functionCall") or p.get("function_call") for p in parts if isinstance(p, dict)]
        return [ToolCall(str(c.get("id") or ""), str(c.get("name", "")), _arguments(c.get("args")))
                for c in calls if isinstance(c, dict)]
    # Bedrock (a Converse response, or its output.message).
    output = value.get("output")
    if isinstance(output, dict):
        return tool_calls_of(output.get("message"))
    if value.get("role") == "assistant" and isinstance(value.get("content"), list) and any(
            isinstance(b, dict) and "toolUse" in b for b in value["content"]):
        uses = [b["toolUse"] for b in value["content"] if isinstance(b, dict) and "toolUse" in b]
        return [ToolCall(str(u.get("toolUseId", "")), str(u.get("name", "")), _arguments(u.get("input")))
                for u in uses if isinstance(u, dict)]
    if "choices" in value:
        choices = value.get("choices") or []
        message = choices[0].get("message") if choices and isinstance(choices[0], dict) else None
        return tool_calls_of(message)
    if "output" in value:
        return [ToolCall(str(item.get("call_id", "")), str(item.get("name", "")),
                         _arguments(item.get("arguments")))
                for item in value.get("output") or []
                if isinstance(item, dict) and item.get("type") == "function_call"]
    if value.get("role") == "assistant" and isinstance(value.get("content"), list):
        return [ToolCall(str(b.get("id", "")), str(b.get("name", "")), _arguments(b.get("input")))
                for b in value["content"] if isinstance(b, dict) and b.get("type") == "tool_use"]
    calls = []
    for call in value.get("tool_calls") or []:
        if not isinstance(call, dict):
            continue
        function = call.get("function")
        if isinstance(function, dict):
            calls.append(ToolCall(str(call.get("id", "")), str(function.get("name", "")),
                                  _arguments(function.get("arguments"))))
        else:
            calls.append(ToolCall(str(call.get("id", "")), str(call.get("name", "")),
                                  _arguments(call.get("arguments"))))
    return calls


class Conversation:
    """The session's open tool calls, as this client saw them (or rebuilt from the log).

    Providers refuse a turn that leaves a tool call unanswered, and so does the daemon
    (``open_tool_calls``); the client says so before sending, naming the calls, which is the
    usual bug of a hand-written loop."""

    def __init__(self) -> None:
        self.open: Dict[str, ToolCall] = {}

    def check_step(self, messages: Iterable[Any]) -> None:
        answered = {m.get("tool_call_id") for m in messages
                    if isinstance(m, dict) and m.get("role") == "tool"}
        missing = [i for i in self.open if i not in answered]
        if missing:
            names = ", ".join(f"`{i}` ({self.open[i].name})" for i in missing)
            raise OpenToolCalls(
                "open_tool_calls",
                f"tool calls {names} are not answered: send session.tool_result(call_id, ...) "
                "for each before the next step (providers require the results right after "
                "the call)", None, call_ids=missing)

    def check_reply(self) -> None:
        if self.open:
            ids = ", ".join(f"`{i}`" for i in self.open)
            raise OpenToolCalls(
                "open_tool_calls",
                f"a reply cannot be recorded while tool calls {ids} are open: send their "
                "results with session.tool_result(call_id, ...) and take a step first", None,
                call_ids=list(self.open))

    def stepped(self, messages: Iterable[Any]) -> None:
        for m in messages:
            if isinstance(m, dict) and m.get("role") == "tool":
                self.open.pop(m.get("tool_call_id"), None)

    def replied(self, calls: Sequence[ToolCall]) -> None:
        self.open = {c.id: c for c in calls}

    def answered(self, call_id: str) -> None:
        self.open.pop(call_id, None)

    def rebuild(self, events: Iterable[Event]) -> None:
        """From the log: the last reply's calls, less the results recorded after it."""
        self.open = {}
        for e in events:
            if e.kind == "assistant/message":
                self.replied(tool_calls_of(e.body))
            elif e.kind == "tool/result":
                self.answered(e.body.get("tool_call_id"))


# --- Server-sent events (GET /v1/events) --------------------------------------------------------

class SSEParser:
    """Feeds lines of a ``text/event-stream``; returns an event at each blank line that ends
    one. Comments (``:``, the keep-alives) are skipped; ``data`` lines join with newlines."""

    def __init__(self) -> None:
        self._id: Optional[str] = None
        self._event: Optional[str] = None
        self._data: List[str] = []

    def feed(self, line: str) -> Optional[RegistryEvent]:
        line = line.rstrip("\r\n")
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "id":
            self._id = value
        elif name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None

    def _dispatch(self) -> Optional[RegistryEvent]:
        if not self._data and self._event is None:
            return None
        text = "\n".join(self._data)
        kind = self._event or "message"
        seq = int(self._id) if self._id and self._id.isdigit() else None
        # Each event's own id: a `lagged` event carries none and must not borrow the last.
        self._id, self._event, self._data = None, None, []
        try:
            data = json.loads(text) if text else {}
        except ValueError:
            data = {"data": text}
        if not isinstance(data, dict):
            data = {"data": data}
        return RegistryEvent.of(data, kind=kind, seq=seq)
