"""The blocking client: :class:`Client` and its :class:`Session`."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Dict, List, Optional, Union

import httpx

from . import _core, _tracing
from .errors import ConnectionLost, DaemonUnreachable, PromptdError, RequestTimeout
from .models import (Compacted, Event, Format, Health, Plugin, Recorded, RegistryEvent,
                     SessionSummary, StepDiff, StepExplain, StepResult, ToolCall, ToolRun)

TimeoutTypes = Union[float, httpx.Timeout, None]
#: Connecting is quick or not happening; a step may wait up to 30 s for the first plugin load.
DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=5.0)


def transport_error(e: httpx.TransportError, method: str, url: str) -> PromptdError:
    """httpx's transport failures as promptd errors, so a caller catches one family."""
    path = httpx.URL(url).path
    if isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout)):
        return DaemonUnreachable("unreachable", f"no promptd answers at {url}: {e} (is "
                                 "`promptd serve` running, and listening there?)",
                                 method=method, path=path)
    if isinstance(e, httpx.TimeoutException):
        return RequestTimeout("timeout", f"{method} {url} got no answer in time: {e}",
                              method=method, path=path)
    return ConnectionLost("connection_lost", f"{method} {url}: {e}", method=method, path=path)


class _Settings:
    """The URL, token and timeout both clients take, read the way the CLI reads them."""

    def __init__(self, url: Optional[str], token: Optional[str]) -> None:
        url = url if url is not None else os.environ.get("PROMPTD_URL", _core.DEFAULT_URL)
        self.url = url.rstrip("/")
        self.token = token if token is not None else os.environ.get("PROMPTD_TOKEN") or None

    def headers(self, extra: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        headers.update(extra or {})
        # Per request, so the trace context is the caller's at the time of the call.
        _tracing.inject(headers)
        return headers


class Client:
    """A promptd daemon.

    ``url`` defaults to ``$PROMPTD_URL`` or ``http://127.0.0.1:8417``; ``token`` to
    ``$PROMPTD_TOKEN`` (sent as ``Authorization: Bearer``). ``timeout`` is seconds or an
    ``httpx.Timeout``. Pass ``http_client`` to bring your own ``httpx.Client`` (proxies, hooks,
    a test transport); the client then leaves closing it to you. Use it as a context manager,
    or call :meth:`close`, to close the connection pool.
    """

    def __init__(self, url: Optional[str] = None, token: Optional[str] = None, *,
                 timeout: TimeoutTypes = DEFAULT_TIMEOUT,
                 http_client: Optional[httpx.Client] = None) -> None:
        self._settings = _Settings(url, token)
        self._timeout = timeout
        self._owns_http = http_client is None
        self._http = http_client if http_client is not None else httpx.Client(timeout=timeout)

    @property
    def url(self) -> str:
        return self._settings.url

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- HTTP ---

    def _send(self, method: str, path: str, *, json: Any = None,
              params: Optional[Mapping[str, Any]] = None) -> httpx.Response:
        url = self._settings.url + path
        try:
            response = self._http.request(method, url, json=json, params=params,
                                          headers=self._settings.headers(),
                                          timeout=self._timeout)
        except httpx.TransportError as e:
            raise transport_error(e, method, url) from None
        if not response.is_success:
            raise _core.error_from(response.status_code, response.content, method, path)
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._send(method, path, **kwargs)
        return _core.parse_json(response.content, response.status_code, method, path)

    # --- Daemon and plugins ---

    def health(self) -> Health:
        """``GET /v1/health``. A daemon whose store failed answers 503: :class:`Unavailable`."""
        return Health.of(self._json("GET", "/v1/health"))

    def plugins(self) -> List[Plugin]:
        """``GET /v1/plugins``: every plugin file, its state, last error and declaration."""
        value = self._json("GET", "/v1/plugins")
        return [Plugin.of(p) for p in _core.need(value, "plugins", "GET", "/v1/plugins")]

    def reload(self) -> List[RegistryEvent]:
        """``POST /v1/plugins/reload``: rescan the plugin folder now; the changes it applied."""
        return self._applied("POST", "/v1/plugins/reload")

    def unload(self, plugin_id: str) -> List[RegistryEvent]:
        """``DELETE /v1/plugins/{id}``: its contributions leave the next step (a rescan loads
        the file again)."""
        return self._applied("DELETE", f"/v1/plugins/{_core.segment(plugin_id)}")

    def enable(self, plugin_id: str) -> List[RegistryEvent]:
        """``POST /v1/plugins/{id}/enable``: load a quarantined plugin again, or try a
        ``failed`` MCP server again (nothing to do, an empty list, for one that is neither)."""
        return self._applied("POST", f"/v1/plugins/{_core.segment(plugin_id)}/enable")

    def _applied(self, method: str, path: str) -> List[RegistryEvent]:
        value = self._json(method, path)
        return [RegistryEvent.of(e) for e in _core.need(value, "applied", method, path)]

    def metrics(self) -> str:
        """``GET /metrics``: Prometheus text."""
        return self._send("GET", "/metrics").text

    def openapi(self) -> Dict[str, Any]:
        """``GET /v1/openapi.json``: the OpenAPI 3.1 document of this daemon's API."""
        return self._json("GET", "/v1/openapi.json")

    def registry_events(self, since: Optional[int] = None, *,
                        timeout: TimeoutTypes = None) -> Iterator[RegistryEvent]:
        """``GET /v1/events``: plugin changes, first the kept ones numbered above ``since``
        (None or 0: every one the daemon keeps, its last 1,024), then live ones as they happen.
        Blocks between events; ``timeout`` bounds each wait (None: wait for ever). A
        ``lagged`` event ends the stream: resync from :meth:`plugins` and reconnect with
        ``since`` set to the last seq seen. Leaving the loop closes the connection."""
        path = "/v1/events"
        url = self._settings.url + path
        params = {"since": since} if since is not None else None
        headers = self._settings.headers({"Accept": "text/event-stream"})
        try:
            with self._http.stream("GET", url, params=params, headers=headers,
                                   timeout=_stream_timeout(self._timeout, timeout)) as response:
                if not response.is_success:
                    response.read()
                    raise _core.error_from(response.status_code, response.content, "GET", path)
                parser = _core.SSEParser()
                for line in response.iter_lines():
                    event = parser.feed(line)
                    if event is not None:
                        yield event
        except httpx.TransportError as e:
            raise transport_error(e, "GET", url) from None

    # --- Sessions ---

    def usage(self, agent: Optional[str] = None, since: Optional[int] = None,
              limit: Optional[int] = None) -> Dict[str, Any]:
        """``GET /v1/usage``: the cost ledger across sessions — replies, tokens, cache outcomes
        with the tokens they lost and the misses' cost, the plugins whose changes broke the
        prefix, the cost by the config's ``[pricing]`` — in ``total`` and per agent in
        ``agents``; ``agent`` keeps one agent's sessions, ``since`` (ms since the Unix epoch)
        the replies to requests sent since then."""
        params = {k: v for k, v in (("agent", agent), ("since", since), ("limit", limit))
                  if v is not None}
        return self._json("GET", "/v1/usage", params=params or None)

    def replay(self, sessions: Optional[List[str]] = None, *, agent: Optional[str] = None,
               since: Optional[int] = None, limit: Optional[int] = None,
               plugins: Optional[str] = None, swap: Optional[List[str]] = None,
               config: Optional[str] = None, format: Optional[Format] = None) -> Dict[str, Any]:
        """``POST /v1/replay``: re-assembles recorded sessions with a candidate plugin folder,
        swapped plugin files or config (paths on the daemon's machine; default: the daemon's
        own) and reports per step where the candidate's request differs from the recorded one
        and what it would cost under the cache model; never writes to a log."""
        fields = (("sessions", sessions), ("agent", agent), ("since", since), ("limit", limit),
                  ("plugins", plugins), ("swap", swap), ("config", config), ("format", format))
        body = {k: v for k, v in fields if v is not None}
        return self._json("POST", "/v1/replay", json=body)

    def sessions(self, q: Optional[str] = None,
                 limit: Optional[int] = None) -> List[SessionSummary]:
        """``GET /v1/sessions``: sessions, most recent activity first; ``q`` keeps those
        whose id or agent contains it, ``limit`` the first so many."""
        params = {k: v for k, v in (("q", q), ("limit", limit)) if v is not None}
        value = self._json("GET", "/v1/sessions", params=params or None)
        return [SessionSummary.of(s) for s in _core.need(value, "sessions", "GET", "/v1/sessions")]

    def session(self, agent: str = "default", *, format: Optional[Format] = None) -> "Session":
        """``POST /v1/sessions``: a new session of ``agent``. ``format`` is the default of its
        steps (else ``neutral``, the daemon's default)."""
        value = self._json("POST", "/v1/sessions", json={"agent": agent})
        return Session(self, _core.need(value, "id", "POST", "/v1/sessions"),
                       value.get("agent", agent), format=format)

    def reopen(self, session_id: str, *, format: Optional[Format] = None) -> "Session":
        """An existing session, e.g. after a restart of the loop: reads its log for its agent
        and the tool calls still open. An unknown id raises :class:`NotFound`."""
        session = Session(self, session_id, None, format=format)
        events = session.events()
        created = next((e for e in events if e.kind == "session/created"), None)
        session.agent = created.body.get("agent") if created else None
        session._conversation.rebuild(events)
        return session


def _stream_timeout(base: TimeoutTypes, wait: TimeoutTypes) -> httpx.Timeout:
    """The client's timeouts, but ``wait`` between events (a quiet stream is not an error)."""
    connect = base.connect if isinstance(base, httpx.Timeout) else base
    if isinstance(wait, httpx.Timeout):
        return wait
    return httpx.Timeout(connect=connect, read=wait, write=connect, pool=connect)


class Session:
    """One session of the daemon: its log, its steps, the replies and tool results recorded
    into it. Made by :meth:`Client.session` or :meth:`Client.reopen`."""

    def __init__(self, client: Client, session_id: str, agent: Optional[str], *,
                 format: Optional[Format] = None) -> None:
        self.client = client
        self.id = session_id
        self.agent = agent
        self.format = format
        self._conversation = _core.Conversation()
        self._bodies = _core.KeptBodies()

    def __repr__(self) -> str:
        return f"Session(id={self.id!r}, agent={self.agent!r})"

    @property
    def _path(self) -> str:
        return f"/v1/sessions/{_core.segment(self.id)}"

    @property
    def open_tool_calls(self) -> List[ToolCall]:
        """The calls the last recorded reply made that have no result yet."""
        return list(self._conversation.open.values())

    def step(self, user: Any = None, *, facts: Optional[Mapping[str, Any]] = None,
             messages: Optional[Sequence[Mapping[str, Any]]] = None,
             format: Optional[Format] = None, whole: bool = False) -> StepResult:
        """``POST /v1/sessions/{id}/steps``: assemble the next request.

        ``user`` (text, or a list of text/image/document blocks) adds a user message after
        ``messages`` (neutral messages, for full control: tool results, several user turns).
        ``facts`` are this step's facts (strings; see the README for how other values are
        sent). Returns the body in ``format`` (else the session's, else ``neutral``) for the
        provider SDK unchanged (and, in ``text``, its exact bytes). The session keeps each
        format's body and asks the daemon only for what changed since its last step;
        ``whole=True`` asks for the whole body instead. Refuses, before sending, a step that
        leaves open tool calls unanswered (:class:`OpenToolCalls`)."""
        body_messages = _core.step_messages(user, messages)
        self._conversation.check_step(body_messages)
        fmt = format or self.format
        body: Dict[str, Any] = {"messages": body_messages, "facts": _core.facts_body(facts)}
        if fmt is not None:
            body["format"] = fmt
        if not whole:
            # Ask for what changed since the body this session keeps (0: none yet).
            body["since"] = self._bodies.since(fmt)
        path = f"{self._path}/steps"
        value = self.client._json("POST", path, json=body)
        self._conversation.stepped(body_messages)
        request, text = self._bodies.answer(fmt, value, "POST", path)
        return StepResult(body=request, step=_core.need(value, "step", "POST", path),
                          usage=value.get("usage") or {}, format=fmt or "neutral", text=text)

    def record(self, reply: Any, *, sent_at: Optional[int] = None) -> Recorded:
        """``POST /v1/sessions/{id}/messages``: the model's reply as the SDK returned it — an
        ``openai`` ``ChatCompletion`` (or its ``choices[0].message``), a Responses
        ``Response``, an ``anthropic`` ``Message`` — or a dict in any shape the daemon takes.
        A reply with its ``usage`` is recorded with its cache outcome, judged at ``sent_at``
        (when the request was sent, ms since the Unix epoch; default: now).
        Returns the tool calls it opened (also in :attr:`open_tool_calls`)."""
        value = _core.reply_json(reply)
        if isinstance(value, dict) and value.get("role") == "tool":
            return self._post_tool(value)
        self._conversation.check_reply()
        path = f"{self._path}/messages"
        params = {"sent_at": sent_at} if sent_at is not None else None
        answer = self.client._json("POST", path, json=value, params=params)
        calls = _core.recorded_calls(answer, value)
        self._conversation.replied(calls)
        return Recorded(seq=_core.need(answer, "seq", "POST", path), tool_calls=calls)

    def tool_result(self, call_id: str, content: Any, *, is_error: bool = False) -> Recorded:
        """Records a tool's output for call ``call_id``: text, a list of blocks (text, images,
        documents), or any JSON value (sent as its JSON text). ``is_error`` tells providers
        that support it that the tool failed."""
        return self._post_tool(_core.tool_message(call_id, content, is_error))

    def _post_tool(self, message: Dict[str, Any]) -> Recorded:
        path = f"{self._path}/messages"
        answer = self.client._json("POST", path, json=message)
        self._conversation.answered(message.get("tool_call_id"))
        return Recorded(seq=_core.need(answer, "seq", "POST", path))

    def run_tool(self, call_id: str) -> ToolRun:
        """``POST /v1/sessions/{id}/tool-calls/{call_id}/run``: the daemon runs the open call
        on the MCP server whose tool it names and records the outcome as its result (a tool
        error or time-out too, with ``is_error``). A call of a tool no MCP server provides is
        :class:`Conflict` ``tool_not_runnable``: run it yourself and :meth:`tool_result`."""
        path = f"{self._path}/tool-calls/{_core.segment(call_id)}/run"
        run = ToolRun.of(self.client._json("POST", path))
        self._conversation.answered(call_id)
        return run

    def events(self) -> List[Event]:
        """``GET /v1/sessions/{id}/events``: the session's log, in order."""
        path = f"{self._path}/events"
        value = self.client._json("GET", path)
        return [Event.of(e) for e in _core.need(value, "events", "GET", path)]

    def request(self, n: int, format: Optional[Format] = None) -> Dict[str, Any]:
        """``GET /v1/sessions/{id}/steps/{n}/request``: step ``n``'s body rebuilt from the log,
        identical to what the step returned (in ``format``, else the session's, else
        ``neutral``)."""
        return self._step_json(n, "request", format)

    def upstream(self, n: int) -> bytes:
        """``GET /v1/sessions/{id}/steps/{n}/upstream``: the bytes a gateway step sent to the
        provider, rebuilt from the log (the client's body with what promptd spliced in);
        :class:`NotFound` (``not_a_gateway_step``) for a step that did not come through the
        gateway."""
        return self.client._send("GET", f"{self._path}/steps/{int(n)}/upstream").content

    def explain(self, n: int, format: Optional[Format] = None) -> StepExplain:
        """``GET /v1/sessions/{id}/steps/{n}/explain``: step ``n``'s request (in
        ``format``, else the session's, else ``neutral``) and which plugin, version and scope
        gave each section, context, variable and tool."""
        return StepExplain.of(self._step_json(n, "explain", format))

    def diff(self, n: int, format: Optional[Format] = None) -> StepDiff:
        """``GET /v1/sessions/{id}/steps/{n}/diff``: how much of step ``n``'s request (in
        ``format``) a provider's prompt cache could reuse, where the prefix broke and why."""
        return StepDiff.of(self._step_json(n, "diff", format))

    def _step_json(self, n: int, what: str, format: Optional[Format]) -> Dict[str, Any]:
        fmt = format or self.format
        params = {"format": fmt} if fmt is not None else None
        return self.client._json("GET", f"{self._path}/steps/{int(n)}/{what}",
                                 params=params)

    def usage(self) -> Dict[str, Any]:
        """``GET /v1/sessions/{id}/usage``: per step, the budget's estimate and the provider's
        reported usage of the reply that followed, its cache outcome (``cache``) and ``cost``;
        ``totals`` with ``actual_per_estimate`` and ``cached_share``; the session's ``ledger``."""
        return self.client._json("GET", f"{self._path}/usage")

    def compact(self, from_seq: int, to_seq: int, summary: str) -> Compacted:
        """``POST /v1/sessions/{id}/compact``: later requests show ``summary`` in place of the
        message events ``from_seq..=to_seq`` (the log keeps them)."""
        path = f"{self._path}/compact"
        value = self.client._json("POST", path,
                                  json={"from": from_seq, "to": to_seq, "summary": summary})
        return Compacted(seq=_core.need(value, "seq", "POST", path))
