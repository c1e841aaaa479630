"""The asyncio client: :class:`AsyncClient` and its :class:`AsyncSession`, the same surface as
the blocking one (see ``_sync.py`` for each method's documentation), every call awaited."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Dict, List, Optional

import httpx

from . import _core
from ._sync import DEFAULT_TIMEOUT, TimeoutTypes, _Settings, _stream_timeout, transport_error
from .models import (Compacted, Event, Format, Health, Plugin, Recorded, RegistryEvent,
                     SessionSummary, StepDiff, StepExplain, StepResult, ToolCall, ToolRun)


class AsyncClient:
    """A promptd daemon, for asyncio loops. ``async with AsyncClient(...) as c:`` closes the
    connection pool; see :class:`promptd_client.Client` for the arguments."""

    def __init__(self, url: Optional[str] = None, token: Optional[str] = None, *,
                 timeout: TimeoutTypes = DEFAULT_TIMEOUT,
                 http_client: Optional[httpx.AsyncClient] = None) -> None:
        self._settings = _Settings(url, token)
        self._timeout = timeout
        self._owns_http = http_client is None
        self._http = (http_client if http_client is not None
                      else httpx.AsyncClient(timeout=timeout))

    @property
    def url(self) -> str:
        return self._settings.url

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def _send(self, method: str, path: str, *, json: Any = None,
                    params: Optional[Mapping[str, Any]] = None) -> httpx.Response:
        url = self._settings.url + path
        try:
            response = await self._http.request(method, url, json=json, params=params,
                                                headers=self._settings.headers(),
                                                timeout=self._timeout)
        except httpx.TransportError as e:
            raise transport_error(e, method, url) from None
        if not response.is_success:
            raise _core.error_from(response.status_code, response.content, method, path)
        return response

    async def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = await self._send(method, path, **kwargs)
        return _core.parse_json(response.content, response.status_code, method, path)

    async def health(self) -> Health:
        return Health.of(await self._json("GET", "/v1/health"))

    async def plugins(self) -> List[Plugin]:
        value = await self._json("GET", "/v1/plugins")
        return [Plugin.of(p) for p in _core.need(value, "plugins", "GET", "/v1/plugins")]

    async def reload(self) -> List[RegistryEvent]:
        return await self._applied("POST", "/v1/plugins/reload")

    async def unload(self, plugin_id: str) -> List[RegistryEvent]:
        return await self._applied("DELETE", f"/v1/plugins/{_core.segment(plugin_id)}")

    async def enable(self, plugin_id: str) -> List[RegistryEvent]:
        return await self._applied("POST", f"/v1/plugins/{_core.segment(plugin_id)}/enable")

    async def _applied(self, method: str, path: str) -> List[RegistryEvent]:
        value = await self._json(method, path)
        return [RegistryEvent.of(e) for e in _core.need(value, "applied", method, path)]

    async def metrics(self) -> str:
        return (await self._send("GET", "/metrics")).text

    async def openapi(self) -> Dict[str, Any]:
        return await self._json("GET", "/v1/openapi.json")

    async def registry_events(self, since: Optional[int] = None, *,
                              timeout: TimeoutTypes = None) -> AsyncIterator[RegistryEvent]:
        path = "/v1/events"
        url = self._settings.url + path
        params = {"since": since} if since is not None else None
        headers = self._settings.headers({"Accept": "text/event-stream"})
        try:
            timeouts = _stream_timeout(self._timeout, timeout)
            async with self._http.stream("GET", url, params=params, headers=headers,
                                         timeout=timeouts) as response:
                if not response.is_success:
                    await response.aread()
                    raise _core.error_from(response.status_code, response.content, "GET", path)
                parser = _core.SSEParser()
                async for line in response.aiter_lines():
                    event = parser.feed(line)
                    if event is not None:
                        yield event
        except httpx.TransportError as e:
            raise transport_error(e, "GET", url) from None

    async def usage(self, agent: Optional[str] = None, since: Optional[int] = None,
                    limit: Optional[int] = None) -> Dict[str, Any]:
        params = {k: v for k, v in (("agent", agent), ("since", since), ("limit", limit))
                  if v is not None}
        return await self._json("GET", "/v1/usage", params=params or None)

    async def replay(self, sessions: Optional[List[str]] = None, *, agent: Optional[str] = None,
                     since: Optional[int] = None, limit: Optional[int] = None,
                     plugins: Optional[str] = None, swap: Optional[List[str]] = None,
                     config: Optional[str] = None,
                     format: Optional[Format] = None) -> Dict[str, Any]:
        fields = (("sessions", sessions), ("agent", agent), ("since", since), ("limit", limit),
                  ("plugins", plugins), ("swap", swap), ("config", config), ("format", format))
        body = {k: v for k, v in fields if v is not None}
        return await self._json("POST", "/v1/replay", json=body)

    async def sessions(self, q: Optional[str] = None,
                       limit: Optional[int] = None) -> List[SessionSummary]:
        params = {k: v for k, v in (("q", q), ("limit", limit)) if v is not None}
        value = await self._json("GET", "/v1/sessions", params=params or None)
        return [SessionSummary.of(s) for s in _core.need(value, "sessions", "GET", "/v1/sessions")]

    async def session(self, agent: str = "default", *,
                      format: Optional[Format] = None) -> "AsyncSession":
        value = await self._json("POST", "/v1/sessions", json={"agent": agent})
        return AsyncSession(self, _core.need(value, "id", "POST", "/v1/sessions"),
                            value.get("agent", agent), format=format)

    async def reopen(self, session_id: str, *,
                     format: Optional[Format] = None) -> "AsyncSession":
        session = AsyncSession(self, session_id, None, format=format)
        events = await session.events()
        created = next((e for e in events if e.kind == "session/created"), None)
        session.agent = created.body.get("agent") if created else None
        session._conversation.rebuild(events)
        return session


class AsyncSession:
    """One session, for asyncio loops; see :class:`promptd_client.Session`."""

    def __init__(self, client: AsyncClient, session_id: str, agent: Optional[str], *,
                 format: Optional[Format] = None) -> None:
        self.client = client
        self.id = session_id
        self.agent = agent
        self.format = format
        self._conversation = _core.Conversation()
        self._bodies = _core.KeptBodies()

    def __repr__(self) -> str:
        return f"AsyncSession(id={self.id!r}, agent={self.agent!r})"

    @property
    def _path(self) -> str:
        return f"/v1/sessions/{_core.segment(self.id)}"

    @property
    def open_tool_calls(self) -> List[ToolCall]:
        return list(self._conversation.open.values())

    async def step(self, user: Any = None, *, facts: Optional[Mapping[str, Any]] = None,
                   messages: Optional[Sequence[Mapping[str, Any]]] = None,
                   format: Optional[Format] = None, whole: bool = False) -> StepResult:
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
        value = await self.client._json("POST", path, json=body)
        self._conversation.stepped(body_messages)
        request, text = self._bodies.answer(fmt, value, "POST", path)
        return StepResult(body=request, step=_core.need(value, "step", "POST", path),
                          usage=value.get("usage") or {}, format=fmt or "neutral", text=text)

    async def record(self, reply: Any, *, sent_at: Optional[int] = None) -> Recorded:
        value = _core.reply_json(reply)
        if isinstance(value, dict) and value.get("role") == "tool":
            return await self._post_tool(value)
        self._conversation.check_reply()
        path = f"{self._path}/messages"
        params = {"sent_at": sent_at} if sent_at is not None else None
        answer = await self.client._json("POST", path, json=value, params=params)
        calls = _core.recorded_calls(answer, value)
        self._conversation.replied(calls)
        return Recorded(seq=_core.need(answer, "seq", "POST", path), tool_calls=calls)

    async def tool_result(self, call_id: str, content: Any, *,
                          is_error: bool = False) -> Recorded:
        return await self._post_tool(_core.tool_message(call_id, content, is_error))

    async def _post_tool(self, message: Dict[str, Any]) -> Recorded:
        path = f"{self._path}/messages"
        answer = await self.client._json("POST", path, json=message)
        self._conversation.answered(message.get("tool_call_id"))
        return Recorded(seq=_core.need(answer, "seq", "POST", path))

    async def run_tool(self, call_id: str) -> ToolRun:
        path = f"{self._path}/tool-calls/{_core.segment(call_id)}/run"
        run = ToolRun.of(await self.client._json("POST", path))
        self._conversation.answered(call_id)
        return run

    async def events(self) -> List[Event]:
        path = f"{self._path}/events"
        value = await self.client._json("GET", path)
        return [Event.of(e) for e in _core.need(value, "events", "GET", path)]

    async def request(self, n: int, format: Optional[Format] = None) -> Dict[str, Any]:
        return await self._step_json(n, "request", format)

    async def upstream(self, n: int) -> bytes:
        response = await self.client._send("GET", f"{self._path}/steps/{int(n)}/upstream")
        return response.content

    async def explain(self, n: int, format: Optional[Format] = None) -> StepExplain:
        return StepExplain.of(await self._step_json(n, "explain", format))

    async def diff(self, n: int, format: Optional[Format] = None) -> StepDiff:
        return StepDiff.of(await self._step_json(n, "diff", format))

    async def _step_json(self, n: int, what: str, format: Optional[Format]) -> Dict[str, Any]:
        fmt = format or self.format
        params = {"format": fmt} if fmt is not None else None
        return await self.client._json("GET", f"{self._path}/steps/{int(n)}/{what}",
                                       params=params)

    async def usage(self) -> Dict[str, Any]:
        return await self.client._json("GET", f"{self._path}/usage")

    async def compact(self, from_seq: int, to_seq: int, summary: str) -> Compacted:
        path = f"{self._path}/compact"
        value = await self.client._json("POST", path,
                                        json={"from": from_seq, "to": to_seq, "summary": summary})
        return Compacted(seq=_core.need(value, "seq", "POST", path))
