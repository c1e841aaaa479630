"""The glue between the bindings componentize-py generates from wit/ (``wit_world``) and
:class:`promptd_sdk.Plugin`. Only this module knows the generated types.

Binding shapes (componentize-py 0.25): records are dataclasses, variants are one dataclass per
case (``Scope_Global()``, ``Scope_Agent(value)``, ``Verdict_Reject(value)``), an ``enum`` is an
``enum.Enum`` (``Refresh.BOUNDARY``, ``Level.INFO``), ``flags`` is an ``enum.Flag`` whose members
are or-ed (``Inputs.MODEL | Inputs.TURN_COUNT``; none set: ``Inputs(0)``), ``option<T>`` is
``Optional[T]``, tuples are tuples, a ``result`` inside a value is
``componentize_py_types.Ok(value)`` or ``Err(value)``, and an export's ``result`` error is
raised as ``Err(value)``. Any other exception escaping an export traps the instance, so every
export catches all.

World promptd:plugin@0.3.0: the host calls ``evaluate`` once per step with every wanted dynamic
item; the glue answers each one by calling the function the author registered for its (kind,
name, scope), exactly as the 0.1.0 per-item exports did (same values, same error texts), and an
error fails only its own item. What 0.3.0 adds is declared only when the author asks for it
(``reads`` none, ``refresh`` none, ``defer`` false otherwise), so a plugin written for the 0.2.0
SDK declares what it did; the step's new inputs reach the author's ``Step`` as they come (none
when not read).
"""

from __future__ import annotations

from functools import reduce
from operator import or_
from typing import Any, Callable, Optional

import wit_world
from componentize_py_types import Err, Ok
from wit_world.imports import host
from wit_world.imports import types as wit

from . import Accept, Config, Message, Plugin, Redact, Reject, ReviewInput, Step, _Item, _Reads


def _message(e: BaseException) -> str:
    if isinstance(e, Err):  # raised by the plugin itself: keep its payload
        return str(e.value)
    return str(e) or type(e).__name__


def log(level_name: str, message: str) -> None:
    host.log(getattr(wit.Level, level_name), message)


def _scope_to_wit(agent: Optional[str]) -> Any:
    return wit.Scope_Global() if agent is None else wit.Scope_Agent(agent)


def _agent_of(scope: Any) -> Optional[str]:
    return scope.value if isinstance(scope, wit.Scope_Agent) else None


def _content(item: _Item) -> Any:
    return wit.Content_Dynamic() if item.fn is not None else wit.Content_StaticText(item.text or "")


def _reads_to_wit(r: Optional[_Reads]) -> Any:
    if r is None:
        return None
    # "last-user-message" -> Inputs.LAST_USER_MESSAGE; the names were checked by the builder.
    flags = [getattr(wit.Inputs, name.upper().replace("-", "_")) for name in r.inputs]
    return wit.Reads(list(r.facts), reduce(or_, flags, wit.Inputs(0)), r.volatile)


def _refresh_to_wit(word: Optional[str]) -> Any:
    return None if word is None else getattr(wit.Refresh, word.upper())


def _step(s: Any) -> Step:
    return Step(
        agent=s.agent,
        scope_chain=list(s.scope_chain),
        session_id=s.session_id,
        step_number=s.step_number,
        facts=dict(s.facts),
        last_user_message=s.last_user_message,
        model=s.model,
        client_tools=None if s.client_tools is None else list(s.client_tools),
        turn_count=s.turn_count,
    )


def _review_input(i: Any) -> ReviewInput:
    return ReviewInput(
        messages=[Message(m.role, list(m.texts), m.tool_call_id) for m in i.messages],
        system=i.system,
        runtime_context=i.runtime_context,
        tools=list(i.tools),
    )


def _declaration(p: Plugin) -> Any:
    items = p._items
    return wit.Declaration(
        sections=[
            wit.Section(
                i.name,
                i.order,
                _content(i),
                i.complete,
                _scope_to_wit(i.agent),
                i.verbatim,
                _reads_to_wit(i.reads),
                _refresh_to_wit(i.refresh),
            )
            for i in items
            if i.kind == "section"
        ],
        contexts=[
            wit.Context(i.name, i.order, _content(i), _scope_to_wit(i.agent), i.verbatim, _reads_to_wit(i.reads))
            for i in items
            if i.kind == "context"
        ],
        variables=[
            wit.Variable(i.name, _content(i), _scope_to_wit(i.agent), _reads_to_wit(i.reads))
            for i in items
            if i.kind == "variable"
        ],
        tools=[
            wit.Tool(
                i.name, i.description, i.parameters, _scope_to_wit(i.agent), _refresh_to_wit(i.refresh), i.defer
            )
            for i in items
            if i.kind == "tool"
        ],
        filters_tools=p._shown_tools is not None,
        review_order=None if p._review is None else p._review[0],
        reads=_reads_to_wit(p._reads),
    )


def _verdict(v: Any) -> Any:
    if isinstance(v, Accept):
        return wit.Verdict_Accept()
    if isinstance(v, Reject):
        if not isinstance(v.reason, str):
            raise Err(f"review: the reject reason is {type(v.reason).__name__}, expected str")
        return wit.Verdict_Reject(v.reason)
    if isinstance(v, Redact):
        redactions = []
        for r in v.redactions:
            if not isinstance(r.find, str) or not isinstance(r.replace, str):
                raise Err("review: a redaction's find and replace must be str")
            redactions.append(wit.Redaction(r.find, r.replace))
        return wit.Verdict_Redact(redactions)
    raise Err(f"review: the function returned {type(v).__name__}, expected Accept, Reject or Redact")


class _Dispatch:
    """One declared plugin: its dynamic functions by (kind, name, agent), the first one wins."""

    def __init__(self, p: Plugin) -> None:
        self.plugin = p
        self.fns: dict[tuple[str, str, Optional[str]], Callable[[Step], Any]] = {}
        for item in p._items:
            if item.fn:
                self.fns.setdefault((item.kind, item.name, item.agent), item.fn)

    def call(self, kind: str, name: str, scope: Any, step: Any) -> Any:
        fn = self.fns.get((kind, name, _agent_of(scope)))
        if fn is None:
            raise Err(f"no dynamic {kind} `{name}` is declared")
        try:
            return fn(_step(step))
        except Exception as e:
            raise Err(_message(e))

    def text(self, kind: str, name: str, scope: Any, step: Any) -> str:
        value = self.call(kind, name, scope, step)
        if not isinstance(value, str):
            raise Err(f"{kind} `{name}`: the function returned {type(value).__name__}, expected str")
        return value

    def value(self, name: str, scope: Any, step: Any) -> Optional[str]:
        value = self.call("variable", name, scope, step)
        if value is not None and not isinstance(value, str):
            raise Err(f"variable `{name}`: the function returned {type(value).__name__}, expected str or None")
        return value

    def shown_tools(self, step: Any) -> list[str]:
        if self.plugin._shown_tools is None:
            raise Err("this plugin does not filter its tools")
        try:
            return [str(n) for n in self.plugin._shown_tools(_step(step))]
        except Exception as e:
            raise Err(_message(e))


def _result(fn: Callable[[], Any]) -> Any:
    """``Ok(fn())``, or ``Err(message)``: one item's answer, whose error fails only that item."""
    try:
        return Ok(fn())
    except Exception as e:
        return Err(_message(e))


def make_world(declare: Callable[[Config], Plugin]) -> type:
    state: dict[str, Optional[_Dispatch]] = {"plugin": None}

    def current() -> _Dispatch:
        d = state["plugin"]
        if d is None:
            raise Err("the plugin was called before declare")
        return d

    class PromptdWorld(wit_world.WitWorld):
        def declare(self, config: list[tuple[str, str]]) -> Any:
            try:
                p = declare(Config(config))
            except Exception as e:
                raise Err(_message(e))
            if not isinstance(p, Plugin):
                raise Err(f"declare must return a Plugin, not {type(p).__name__}")
            if p._misuse:
                raise Err(p._misuse)
            declaration = _declaration(p)
            state["plugin"] = _Dispatch(p)
            return declaration

        def evaluate(self, step: Any, wanted: Any) -> Any:
            d = current()
            sections = [_result(lambda i=i: d.text("section", i.name, i.scope, step)) for i in wanted.sections]
            contexts = [_result(lambda i=i: d.text("context", i.name, i.scope, step)) for i in wanted.contexts]
            variables = [_result(lambda i=i: d.value(i.name, i.scope, step)) for i in wanted.variables]
            tools = _result(lambda: d.shown_tools(step)) if wanted.shown_tools else None
            return wit.Evaluation(sections, contexts, variables, tools)

        def review(self, step: Any, input: Any) -> Any:
            d = current()
            if d.plugin._review is None:
                return wit.Verdict_Accept()
            fn = d.plugin._review[1]
            try:
                verdict = fn(_step(step), _review_input(input))
            except Exception as e:
                raise Err(_message(e))
            return _verdict(verdict)

    PromptdWorld.__name__ = PromptdWorld.__qualname__ = "WitWorld"
    return PromptdWorld
