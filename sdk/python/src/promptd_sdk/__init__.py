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

World 0.3.0 lets a plugin say what each dynamic part reads, so the host shows a call only that
and, in a session, asks again only when it changed: :meth:`Plugin.reads` on a dynamic section,
context or variable, :meth:`Plugin.reads_by_default` for the whole plugin (and its tool filter).
The :class:`Step` then carries only what is read: the facts named, and ``last_user_message``,
``model``, ``client_tools``, ``turn_count`` (None when not read or not known). Cache intent:
:meth:`Plugin.refresh` on a section or tool, :meth:`Plugin.defer` on a tool.

.. code-block:: python

    (
        Plugin()
        .dynamic_section("todo:task", 20, lambda step: f"Task: {step.fact('task')}")
        .reads(facts=["task"])
        .dynamic_context("rag:hits", 60, lambda step: search(step.last_user_message or ""))
        .reads(inputs=["last-user-message"])
        .verbatim()
        .tool("search_wiki", "Searches the wiki.", {"type": "object"})
        .refresh("boundary")
        .defer()
    )

A plugin that calls none of them declares exactly what it did under 0.2.0: every dynamic part
reads the whole step at every step, and sections and tools refresh at the next step.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

__all__ = [
    "Accept",
    "CallError",
    "Config",
    "INPUTS",
    "Message",
    "Plugin",
    "Redact",
    "REFRESH",
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


INPUTS = ("last-user-message", "model", "client-tools", "step-number", "turn-count")
"""The request inputs :meth:`Plugin.reads` may name, besides facts."""

REFRESH = ("step", "boundary", "session")
"""The words :meth:`Plugin.refresh` takes: when a change to a section's or tool's text may reach
the model."""


@dataclass(frozen=True)
class Step:
    """What the host knows about the step being assembled, as far as the call reads it (see
    :meth:`Plugin.reads`): a plugin that declares no reads is shown everything."""

    agent: str
    """The agent the request is for."""
    scope_chain: list[str] = field(default_factory=list)
    """``global``, the agent's ancestors, the agent."""
    session_id: str = ""
    """The session id; empty outside a session."""
    step_number: int = 0
    """The step number in the session (from 1); 0 outside a session, and 0 when the call does not
    read ``step-number``."""
    facts: dict[str, str] = field(default_factory=dict)
    """Step facts from the client (cwd, git branch...), by key: those the call reads."""
    last_user_message: Optional[str] = None
    """The text of the session's last user message (its text blocks joined by a blank line);
    None when not read (``last-user-message``) or when there is none."""
    model: Optional[str] = None
    """The model the request is for; None when not read (``model``) or not known."""
    client_tools: Optional[list[str]] = None
    """The names of the tools the client sent, in its order (empty when it sent none); None when
    not read (``client-tools``)."""
    turn_count: Optional[int] = None
    """How many user messages the session holds, this step's included; None when not read
    (``turn-count``)."""

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


@dataclass(frozen=True)
class _Reads:
    facts: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()  # names from INPUTS
    volatile: bool = False


def _reads(method: str, facts: Any, inputs: Any, volatile: Any) -> Union[_Reads, str]:
    """The checked arguments of reads()/reads_by_default(), or the misuse message."""
    lists = {}
    for what, value in (("facts", facts), ("inputs", inputs)):
        if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
            return f"{method}: {what} must be a list of str, got {type(value).__name__}"
        value = tuple(value)
        for v in value:
            if not isinstance(v, str):
                return f"{method}: {what} must be a list of str, got an item of type {type(v).__name__}"
        lists[what] = value
    for name in lists["inputs"]:
        if name not in INPUTS:
            return f"{method}: unknown input {name!r} (known: {', '.join(INPUTS)})"
    if not isinstance(volatile, bool):
        return f"{method}: volatile must be True or False, got {volatile!r}"
    return _Reads(lists["facts"], lists["inputs"], volatile)


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
    reads: Optional[_Reads] = None  # None: the plugin's default
    refresh: Optional[str] = None  # a word from REFRESH; None: the host's default (step)
    defer: bool = False


class Plugin:
    """Everything a plugin contributes.

    Methods add one item each and return the plugin, so calls chain; :meth:`scope`,
    :meth:`complete`, :meth:`verbatim`, :meth:`reads`, :meth:`refresh` and :meth:`defer` change
    the item added last. Misuse (a modifier on the wrong kind of item, a bad value) refuses the
    plugin at load with a message naming it.
    """

    def __init__(self) -> None:
        self._items: list[_Item] = []
        self._shown_tools: Optional[ToolsFn] = None
        self._review: Optional[tuple[int, ReviewFn]] = None
        self._reads: Optional[_Reads] = None
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

    def reads(self, facts: "Iterable[str]" = (), inputs: "Iterable[str]" = (), volatile: bool = False) -> "Plugin":
        """Says what the dynamic section, context or variable added last reads of a step: the
        facts named in ``facts`` and the request inputs named in ``inputs`` (from
        ``"last-user-message"``, ``"model"``, ``"client-tools"``, ``"step-number"``,
        ``"turn-count"``). Its function is then shown only those (the :class:`Step` holds no
        other fact, and None, or 0 for ``step_number``, for an input not read), and in a session
        it is asked again only when one of them changed, unless ``volatile`` is True (its text
        depends on something else too: the clock, a file). Without it, the item reads what
        :meth:`reads_by_default` says, or the whole step at every step."""
        item = self._items[-1] if self._items else None
        if item is None or item.kind not in ("section", "context", "variable") or item.fn is None:
            return self._misused("reads() applies to a dynamic section, context or variable only")
        if item.reads is not None:
            return self._misused(f"reads() called twice for {item.kind} `{item.name}`")
        checked = _reads("reads()", facts, inputs, volatile)
        if isinstance(checked, str):
            return self._misused(checked)
        item.reads = checked
        return self

    def reads_by_default(
        self, facts: "Iterable[str]" = (), inputs: "Iterable[str]" = (), volatile: bool = False
    ) -> "Plugin":
        """What every dynamic section, context and variable without its own :meth:`reads` reads,
        and what the tool filter (:meth:`show_tools`) reads; same arguments as :meth:`reads`.
        Without it, they read the whole step at every step."""
        if self._reads is not None:
            return self._misused("reads_by_default() called twice")
        checked = _reads("reads_by_default()", facts, inputs, volatile)
        if isinstance(checked, str):
            return self._misused(checked)
        self._reads = checked
        return self

    def refresh(self, when: str) -> "Plugin":
        """When a change to the text of the section or tool added last may reach the model in a
        session: ``"step"`` (at the next step, the default), ``"boundary"`` (at the session's
        next cache-cold point, or after the operator's ``max_stale_s``) or ``"session"`` (never
        within a session: a new session gets the current text). The operator's config
        (``[plugins.ID] refresh``) overrides it."""
        if not self._items or self._items[-1].kind not in ("section", "tool"):
            return self._misused("refresh() applies to a section or tool only")
        if when not in REFRESH:
            return self._misused(f"refresh(): unknown value {when!r} (expected step, boundary or session)")
        self._items[-1].refresh = when
        return self

    def defer(self) -> "Plugin":
        """Marks the tool added last as deferred: sent for the provider's tool search to find,
        not in every request's cached prefix. The operator's config overrides it."""
        if not self._items or self._items[-1].kind != "tool":
            return self._misused("defer() applies to a tool only")
        self._items[-1].defer = True
        return self

    def _misused(self, message: str) -> "Plugin":
        self._misuse = self._misuse or message
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
