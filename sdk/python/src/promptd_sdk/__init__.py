"""Write a promptd plugin in Python.

A plugin is a function from its config to a :class:`Plugin`: a builder of sections, contexts,
variables and tools. Static text is sent to the host once, at load; dynamic parts are functions
the host calls at each assembly with the :class:`Step`. You never touch the generated bindings.

.. code-block:: python

    from promptd_sdk import Config, Plugin, export_plugin

    def declare(config: Config) -> Plugin:
        return (
            Plugin()
            .section("deployment:persona", 0, "You are {{name}}.")
            .variable("name", config.get("name", "a helpful assistant"))
            .dynamic_context("clock", 50, lambda step: f"Today is {step.fact('date') or 'unknown'}.")
        )

    WitWorld = export_plugin(declare)

The module-level name ``WitWorld`` is what componentize-py looks for. Build with
``sdk/python/build.sh PLUGIN_DIR OUT.wasm`` (the entry module is ``PLUGIN_DIR/app.py``). The
plugin's id is OUT's file name without ``.wasm``.

A dynamic function fails its call by raising: the exception's message goes to the host (which
fails the assembly, or leaves the plugin out if the host config marks it optional).

:meth:`Plugin.verbatim` marks the section or context added last as verbatim: the host uses its
text exactly as given and never interpolates ``{{...}}`` in it (for text the plugin did not write
itself, such as retrieved documents). :meth:`Plugin.review` registers a hook the host calls once
per session step with the step's new messages (a :class:`ReviewInput`); it returns
:class:`Accept`, :class:`Reject` or :class:`Redact`:

.. code-block:: python

    def review(step: Step, input: ReviewInput) -> Verdict:
        if any("hunter2" in text for m in input.messages for text in m.texts):
            return Redact([("hunter2", "[redacted]")])
        return Accept()

    Plugin().review(0, review)
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

__all__ = [
    "Accept",
    "CallError",
    "Config",
    "Message",
    "Plugin",
    "Redact",
    "Redaction",
    "Reject",
    "ReviewInput",
    "Step",
    "Verdict",
    "export_plugin",
    "log",
]


class CallError(Exception):
    """Raise it (or any exception) from a dynamic function to fail the call with a message."""


class Config(Mapping):
    """Plugin config: the key/value strings of the plugin's ``[plugins.NAME] config`` table.

    A read-only mapping, so ``config.get("key", "default")``, ``"key" in config`` and
    ``config.items()`` work as for a dict.
    """

    def __init__(self, pairs: Union[Mapping[str, str], list[tuple[str, str]], None] = None):
        self._values: dict[str, str] = dict(pairs or {})

    def __getitem__(self, key: str) -> str:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._values))

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Config({dict(self.items())!r})"


@dataclass(frozen=True)
class Step:
    """What the host knows about the step being assembled."""

    agent: str
    """The agent the request is for."""
    scope_chain: list[str] = field(default_factory=list)
    """``global``, the agent's ancestors, the agent."""
    session_id: str = ""
    """The session id; empty outside a session."""
    step_number: int = 0
    """The step number in the session (from 1); 0 outside a session."""
    facts: dict[str, str] = field(default_factory=dict)
    """Step facts from the client (cwd, git branch...), by key."""

    def fact(self, key: str) -> Optional[str]:
        """One step fact, or None if the client did not send it."""
        return self.facts.get(key)


@dataclass(frozen=True)
class Message:
    """One message the client sent this step, as a review sees it."""

    role: str
    """``user``, ``assistant`` or ``tool``."""
    texts: list[str] = field(default_factory=list)
    """Its texts in order: one per text content or text block (images and documents give none);
    an assistant's reply gives its text (empty when it only calls tools)."""
    tool_call_id: str = ""
    """The call a ``tool`` message answers; empty for the other roles."""


@dataclass(frozen=True)
class ReviewInput:
    """What a review is shown: the step's new messages and what assembly made of the step."""

    messages: list[Message] = field(default_factory=list)
    """The messages the client sent this step, in order."""
    system: str = ""
    """The assembled system prompt."""
    runtime_context: Optional[str] = None
    """The assembled runtime context snapshot, or None if there is none."""
    tools: list[str] = field(default_factory=list)
    """The names of the tools shown this step, in order."""


@dataclass(frozen=True)
class Accept:
    """Verdict: the step goes on unchanged."""


@dataclass(frozen=True)
class Reject:
    """Verdict: the step fails (the host answers HTTP 422 naming the plugin and ``reason``)."""

    reason: str


@dataclass(frozen=True)
class Redaction:
    """Replace every occurrence of ``find`` (non-empty) by ``replace``."""

    find: str
    replace: str


@dataclass(frozen=True)
class Redact:
    """Verdict: the step goes on with these replacements made, in order, in the texts of its new
    ``user`` and ``tool`` messages (the model's own replies are not changed).

    ``Redact([("hunter2", "[redacted]"), ...])``: pairs ``(find, replace)`` or :class:`Redaction`
    values; they are kept as a tuple of :class:`Redaction`.
    """

    redactions: "tuple[Redaction, ...]" = ()

    def __post_init__(self) -> None:
        pairs = tuple(r if isinstance(r, Redaction) else Redaction(*r) for r in self.redactions)
        object.__setattr__(self, "redactions", pairs)


Verdict = Union[Accept, Reject, Redact]
"""What a review returns."""

TextFn = Callable[[Step], str]
ValueFn = Callable[[Step], Optional[str]]
ToolsFn = Callable[[Step], "list[str]"]
ReviewFn = Callable[[Step, ReviewInput], Verdict]

_S32 = (-(2**31), 2**31 - 1)


@dataclass
class _Item:
    kind: str  # "section", "context", "variable", "tool"
    name: str
    order: int = 0
    text: Optional[str] = None  # static text or value
    fn: Optional[Callable[[Step], Any]] = None  # dynamic
    description: str = ""
    parameters: str = ""
    complete: bool = False
    verbatim: bool = False
    agent: Optional[str] = None  # None: global scope


class Plugin:
    """Everything a plugin contributes.

    Methods add one item each and return the plugin, so calls chain; :meth:`scope`,
    :meth:`complete` and :meth:`verbatim` change the item added last.
    """

    def __init__(self) -> None:
        self._items: list[_Item] = []
        self._shown_tools: Optional[ToolsFn] = None
        self._review: Optional[tuple[int, ReviewFn]] = None
        self._misuse: Optional[str] = None

    # -- sections --
    def section(self, name: str, order: int, text: str) -> "Plugin":
        """A static section of the system prompt; ``{{name}}`` references are interpolated by the
        host. Conventional orders: identity -100, persona 0, tool guidance 100..199."""
        return self._push(_Item("section", name, order, text=str(text)))

    def dynamic_section(self, name: str, order: int, fn: TextFn) -> "Plugin":
        """A section whose text ``fn(step)`` computes at each assembly."""
        return self._push(_Item("section", name, order, fn=self._callable(fn)))

    # -- contexts --
    def context(self, name: str, order: int, text: str) -> "Plugin":
        """A static part of the runtime context snapshot (a user message, not system)."""
        return self._push(_Item("context", name, order, text=str(text)))

    def dynamic_context(self, name: str, order: int, fn: TextFn) -> "Plugin":
        """A runtime context part ``fn(step)`` computes at each assembly; "" contributes nothing."""
        return self._push(_Item("context", name, order, fn=self._callable(fn)))

    # -- variables --
    def variable(self, name: str, value: str) -> "Plugin":
        """A variable for ``{{name}}``; names match ``^[a-z][a-z0-9_]*$``."""
        return self._push(_Item("variable", name, text=str(value)))

    def dynamic_variable(self, name: str, fn: ValueFn) -> "Plugin":
        """A variable ``fn(step)`` computes when referenced; None means "no value this assembly",
        which is an error only if some text references it."""
        return self._push(_Item("variable", name, fn=self._callable(fn)))

    # -- tools --
    def tool(self, name: str, description: str, parameters: Union[str, Mapping[str, Any]]) -> "Plugin":
        """A tool the plugin knows. ``parameters`` is a JSON Schema object, as JSON text or as a
        dict (serialised with ``json.dumps``)."""
        if not isinstance(parameters, str):
            parameters = json.dumps(parameters, separators=(",", ":"))
        return self._push(_Item("tool", name, description=description, parameters=parameters))

    def show_tools(self, fn: ToolsFn) -> "Plugin":
        """Chooses, per assembly, which known tools are shown: ``fn(step)`` returns their names.
        Without it, all are."""
        self._shown_tools = self._callable(fn)
        return self

    # -- review --
    def review(self, order: int, fn: ReviewFn) -> "Plugin":
        """Registers a review hook: the host calls ``fn(step, input)`` once per session step,
        after assembly, with a :class:`ReviewInput`; it returns :class:`Accept`,
        :class:`Reject` or :class:`Redact`. Hooks of all plugins run one after another, sorted by
        (``order``, plugin id). Raising fails the step with the exception's message."""
        if isinstance(order, bool) or not isinstance(order, int) or not _S32[0] <= order <= _S32[1]:
            self._misuse = self._misuse or (
                f"review() order must be an integer from {_S32[0]} to {_S32[1]}, got {order!r}"
            )
        elif self._review is not None:
            self._misuse = self._misuse or "review() called twice (a plugin has one review hook)"
        else:
            self._review = (order, self._callable(fn))
        return self

    # -- modifiers --
    def scope(self, agent: str) -> "Plugin":
        """Makes the item added last visible only to ``agent`` (and the agents below it)."""
        if not self._items:
            self._misuse = self._misuse or "scope() called before any item was added"
        else:
            self._items[-1].agent = str(agent)
        return self

    def complete(self) -> "Plugin":
        """Marks the section added last as complete: it replaces every other section."""
        if not self._items or self._items[-1].kind != "section":
            self._misuse = self._misuse or "complete() applies to a section only"
        else:
            self._items[-1].complete = True
        return self

    def verbatim(self) -> "Plugin":
        """Marks the section or context added last as verbatim: the host uses its text exactly as
        given and never interpolates ``{{...}}`` in it, so it can never pull a variable (a secret)
        into the prompt. For text the plugin did not write itself (retrieved documents, tool
        output, web pages)."""
        if not self._items or self._items[-1].kind not in ("section", "context"):
            self._misuse = self._misuse or "verbatim() applies to a section or context only"
        else:
            self._items[-1].verbatim = True
        return self

    def _push(self, item: _Item) -> "Plugin":
        self._items.append(item)
        return self

    def _callable(self, fn: Any) -> Any:
        if not callable(fn):
            self._misuse = self._misuse or f"expected a function, got {type(fn).__name__}"
        return fn


class _Log:
    """Writes a line to the host's log, tagged with this plugin's id: ``log.info("...")``."""

    def _write(self, level_name: str, message: str) -> None:
        if _glue is None:
            raise RuntimeError(_NO_BINDINGS)
        _glue.log(level_name, str(message))

    def trace(self, message: str) -> None:
        self._write("TRACE", message)

    def debug(self, message: str) -> None:
        self._write("DEBUG", message)

    def info(self, message: str) -> None:
        self._write("INFO", message)

    def warn(self, message: str) -> None:
        self._write("WARN", message)

    def error(self, message: str) -> None:
        self._write("ERROR", message)


log = _Log()


def export_plugin(declare: Callable[[Config], Plugin]) -> type:
    """Turns ``declare(config) -> Plugin`` into the class componentize-py exports.

    Bind it to the module-level name ``WitWorld`` of the app module:
    ``WitWorld = export_plugin(declare)``.
    """
    if _glue is None:
        raise RuntimeError(_NO_BINDINGS)
    return _glue.make_world(declare)


_NO_BINDINGS = (
    "promptd_sdk: the generated bindings (module `wit_world`) are missing; "
    "build the plugin with sdk/python/build.sh (componentize-py)"
)

# Imported now, not lazily: componentize-py snapshots the interpreter after importing the app,
# and a module first imported later (at a call from the host) is not found.
try:
    from . import _glue
except ModuleNotFoundError as e:  # outside componentize-py: the builder still works (tests)
    if e.name not in ("wit_world", "componentize_py_types"):
        raise
    _glue = None
