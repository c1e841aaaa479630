"""The glue between the bindings componentize-py generates from wit/ (``wit_world``) and
:class:`promptd_sdk.Plugin`. Only this module knows the generated types.

Binding shapes (componentize-py 0.25): records are dataclasses, variants are one dataclass per
case (``Scope_Global()``, ``Scope_Agent(value)``), ``option<string>`` is ``Optional[str]``,
tuples are tuples, and a ``result`` error is raised as ``componentize_py_types.Err(value)``.
Any other exception escaping an export traps the instance, so every export catches all.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import wit_world
from componentize_py_types import Err
from wit_world.imports import host
from wit_world.imports import types as wit

from . import Config, Plugin, Step, _Item


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


def _step(s: Any) -> Step:
    return Step(
        agent=s.agent,
        scope_chain=list(s.scope_chain),
        session_id=s.session_id,
        step_number=s.step_number,
        facts=dict(s.facts),
    )


def _declaration(p: Plugin) -> Any:
    items = p._items
    return wit.Declaration(
        sections=[
            wit.Section(i.name, i.order, _content(i), i.complete, _scope_to_wit(i.agent))
            for i in items
            if i.kind == "section"
        ],
        contexts=[
            wit.Context(i.name, i.order, _content(i), _scope_to_wit(i.agent))
            for i in items
            if i.kind == "context"
        ],
        variables=[
            wit.Variable(i.name, _content(i), _scope_to_wit(i.agent))
            for i in items
            if i.kind == "variable"
        ],
        tools=[
            wit.Tool(i.name, i.description, i.parameters, _scope_to_wit(i.agent))
            for i in items
            if i.kind == "tool"
        ],
        filters_tools=p._shown_tools is not None,
    )


def make_world(declare: Callable[[Config], Plugin]) -> type:
    state: dict[str, Optional[Plugin]] = {"plugin": None}

    def current() -> Plugin:
        p = state["plugin"]
        if p is None:
            raise Err("the plugin was called before declare")
        return p

    def call(kind: str, name: str, scope: Any, step: Any) -> Any:
        agent = _agent_of(scope)
        for item in current()._items:
            if item.kind == kind and item.name == name and item.agent == agent and item.fn:
                try:
                    return item.fn(_step(step))
                except Exception as e:
                    raise Err(_message(e))
        raise Err(f"no dynamic {kind} `{name}` is declared")

    def text(kind: str, name: str, scope: Any, step: Any) -> str:
        value = call(kind, name, scope, step)
        if not isinstance(value, str):
            raise Err(f"{kind} `{name}`: the function returned {type(value).__name__}, expected str")
        return value

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
            state["plugin"] = p
            return declaration

        def section_text(self, name: str, scope: Any, step: Any) -> str:
            return text("section", name, scope, step)

        def context_text(self, name: str, scope: Any, step: Any) -> str:
            return text("context", name, scope, step)

        def variable_value(self, name: str, scope: Any, step: Any) -> Optional[str]:
            value = call("variable", name, scope, step)
            if value is not None and not isinstance(value, str):
                raise Err(f"variable `{name}`: the function returned {type(value).__name__}, expected str or None")
            return value

        def shown_tools(self, step: Any) -> list[str]:
            p = current()
            if p._shown_tools is None:
                raise Err("this plugin does not filter its tools")
            try:
                names = p._shown_tools(_step(step))
            except Exception as e:
                raise Err(_message(e))
            return [str(n) for n in names]

    PromptdWorld.__name__ = PromptdWorld.__qualname__ = "WitWorld"
    return PromptdWorld
