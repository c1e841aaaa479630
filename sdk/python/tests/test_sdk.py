"""Native (CPython) tests of promptd_sdk against the bindings componentize-py generates.

    sdk/python/.venv/bin/python -m unittest discover -s sdk/python/tests

Generates the bindings into a temporary folder with the venv's componentize-py; no WebAssembly
is built or run (sdk/python/build.sh and `promptd plugin check` cover that).
"""

import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SDK = os.path.dirname(HERE)
WIT = os.path.join(SDK, "..", "..", "wit")

_tmp = tempfile.TemporaryDirectory()
_cpy = os.path.join(os.path.dirname(sys.executable), "componentize-py")
subprocess.run([_cpy, "-q", "-d", WIT, "-w", "plugin", "bindings", _tmp.name], check=True)
sys.path[:0] = [_tmp.name, os.path.join(SDK, "src")]

from componentize_py_types import Err, Ok  # noqa: E402
from wit_world.imports import types as wit  # noqa: E402

from promptd_sdk import (  # noqa: E402
    Accept,
    CallError,
    Message,
    Plugin,
    Redact,
    Redaction,
    Reject,
    ReviewInput,
    Step,
    export_plugin,
)

GLOBAL = wit.Scope_Global()
CODER = wit.Scope_Agent("coder")


def step(**facts):
    return wit.Step("coder", ["global", "coder"], "", 3, sorted(facts.items()), None, None, None, None)


def reads(facts=(), inputs=wit.Inputs(0), volatile=False):
    return wit.Reads(list(facts), inputs, volatile)


def wanted(sections=(), contexts=(), variables=(), shown_tools=False):
    """A `wanted` record; each item is a name (global scope) or a (name, scope) pair."""

    def items(names):
        return [wit.Item(*n) if isinstance(n, tuple) else wit.Item(n, GLOBAL) for n in names]

    return wit.Wanted(items(sections), items(contexts), items(variables), shown_tools)


def review_input(*texts, role="user"):
    return wit.ReviewInput([wit.Message(role, list(texts), "")], "System.", None, ["t"])


def maybe(s):
    return s.fact("maybe")


def boom(s):
    raise CallError("boom")


class SdkTest(unittest.TestCase):
    def world(self, build):
        return export_plugin(build)()

    def test_declaration_shapes(self):
        w = self.world(
            lambda c: Plugin()
            .section("hello", 10, "Hi {{who}}")
            .complete()
            .variable("who", c.get("who", "world"))
            .scope("coder")
            .dynamic_context("ctx", 5, lambda s: f"step {s.step_number}")
            .tool("t", "d", {"type": "object"})
        )
        d = w.declare([("who", "Ada")])
        self.assertEqual(
            d.sections,
            [wit.Section("hello", 10, wit.Content_StaticText("Hi {{who}}"), True, GLOBAL, False, None, None)],
        )
        self.assertEqual(d.variables, [wit.Variable("who", wit.Content_StaticText("Ada"), CODER, None)])
        self.assertEqual(d.contexts, [wit.Context("ctx", 5, wit.Content_Dynamic(), GLOBAL, False, None)])
        self.assertEqual(d.tools, [wit.Tool("t", "d", '{"type":"object"}', GLOBAL, None, False)])
        self.assertFalse(d.filters_tools)
        self.assertIsNone(d.review_order)
        self.assertIsNone(d.reads)
        self.assertEqual(w.evaluate(step(), wanted(contexts=["ctx"])), wit.Evaluation([], [Ok("step 3")], [], None))

    def test_verbatim(self):
        w = self.world(
            lambda c: Plugin()
            .context("raw", 35, "Raw {{x}}.")
            .verbatim()
            .dynamic_section("echo", 30, lambda s: "Echo: {{x}}")
            .verbatim()
            .scope("coder")
            .section("plain", 0, "{{x}}")
        )
        d = w.declare([])
        self.assertEqual(
            d.sections,
            [
                wit.Section("echo", 30, wit.Content_Dynamic(), False, CODER, True, None, None),
                wit.Section("plain", 0, wit.Content_StaticText("{{x}}"), False, GLOBAL, False, None, None),
            ],
        )
        self.assertEqual(
            d.contexts, [wit.Context("raw", 35, wit.Content_StaticText("Raw {{x}}."), GLOBAL, True, None)]
        )
        self.assertEqual(w.evaluate(step(), wanted(sections=[("echo", CODER)])).sections, [Ok("Echo: {{x}}")])

    def test_reads(self):
        w = self.world(
            lambda c: Plugin()
            .reads_by_default(facts=["cwd"], inputs=["step-number"])
            .dynamic_section("task", 20, lambda s: "T")
            .reads(facts=["task"])
            .verbatim()
            .dynamic_section("rag", 30, lambda s: "R")
            .reads(inputs=["last-user-message", "model"], facts=("q", "lang"))
            .scope("coder")
            .dynamic_context("clock", 40, lambda s: "C")
            .reads(volatile=True)
            .dynamic_context("plain", 50, lambda s: "P")
            .dynamic_variable("v", lambda s: None)
            .reads(
                ["a"],
                ["last-user-message", "model", "client-tools", "step-number", "turn-count", "model"],
                False,
            )
        )
        d = w.declare([])
        self.assertEqual(d.reads, reads(["cwd"], wit.Inputs.STEP_NUMBER))
        self.assertEqual(
            d.sections,
            [
                wit.Section("task", 20, wit.Content_Dynamic(), False, GLOBAL, True, reads(["task"]), None),
                wit.Section(
                    "rag",
                    30,
                    wit.Content_Dynamic(),
                    False,
                    CODER,
                    False,
                    reads(["q", "lang"], wit.Inputs.LAST_USER_MESSAGE | wit.Inputs.MODEL),
                    None,
                ),
            ],
        )
        self.assertEqual(
            d.contexts,
            [
                wit.Context("clock", 40, wit.Content_Dynamic(), GLOBAL, False, reads(volatile=True)),
                wit.Context("plain", 50, wit.Content_Dynamic(), GLOBAL, False, None),
            ],
        )
        every = (
            wit.Inputs.LAST_USER_MESSAGE
            | wit.Inputs.MODEL
            | wit.Inputs.CLIENT_TOOLS
            | wit.Inputs.STEP_NUMBER
            | wit.Inputs.TURN_COUNT
        )
        self.assertEqual(d.variables, [wit.Variable("v", wit.Content_Dynamic(), GLOBAL, reads(["a"], every))])
        # What the host declares does not change how items are answered.
        e = w.evaluate(step(), wanted(sections=["task", ("rag", CODER)], contexts=["clock"], variables=["v"]))
        self.assertEqual(e, wit.Evaluation([Ok("T"), Ok("R")], [Ok("C")], [Ok(None)], None))

    def test_refresh_and_defer(self):
        w = self.world(
            lambda c: Plugin()
            .section("s", 0, "S")
            .refresh("session")
            .dynamic_section("d", 1, lambda s: "D")
            .refresh("step")
            .reads(facts=["x"])
            .section("plain", 2, "P")
            .tool("t", "d", "{}")
            .refresh("boundary")
            .defer()
            .scope("coder")
            .tool("u", "d", "{}")
            .defer()
            .tool("v", "d", "{}")
        )
        d = w.declare([])
        self.assertEqual(
            d.sections,
            [
                wit.Section("s", 0, wit.Content_StaticText("S"), False, GLOBAL, False, None, wit.Refresh.SESSION),
                wit.Section("d", 1, wit.Content_Dynamic(), False, GLOBAL, False, reads(["x"]), wit.Refresh.STEP),
                wit.Section("plain", 2, wit.Content_StaticText("P"), False, GLOBAL, False, None, None),
            ],
        )
        self.assertEqual(
            d.tools,
            [
                wit.Tool("t", "d", "{}", CODER, wit.Refresh.BOUNDARY, True),
                wit.Tool("u", "d", "{}", GLOBAL, None, True),
                wit.Tool("v", "d", "{}", GLOBAL, None, False),
            ],
        )
        self.assertIsNone(d.reads)

    def test_step_inputs(self):
        seen = []

        def look(s):
            seen.append(s)
            return ""

        w = self.world(lambda c: Plugin().dynamic_context("c", 0, look).show_tools(lambda s: seen.append(s) or []))
        w.declare([])
        full = wit.Step("coder", ["global", "coder"], "s1", 4, [("a", "1")], "Hello?", "gpt-x", ["read", "bash"], 2)
        w.evaluate(full, wanted(contexts=["c"], shown_tools=True))
        w.evaluate(step(), wanted(contexts=["c"]))
        empty = wit.Step("coder", ["global", "coder"], "s1", 0, [], None, None, [], None)
        w.evaluate(empty, wanted(contexts=["c"]))
        self.assertEqual(
            seen,
            [
                Step("coder", ["global", "coder"], "s1", 4, {"a": "1"}, "Hello?", "gpt-x", ["read", "bash"], 2),
                Step("coder", ["global", "coder"], "s1", 4, {"a": "1"}, "Hello?", "gpt-x", ["read", "bash"], 2),
                Step("coder", ["global", "coder"], "", 3),
                Step("coder", ["global", "coder"], "s1", 0, client_tools=[]),
            ],
        )
        self.assertEqual(seen[0].last_user_message, "Hello?")
        self.assertEqual(seen[0].model, "gpt-x")
        self.assertEqual(seen[0].client_tools, ["read", "bash"])
        self.assertEqual(seen[0].turn_count, 2)
        self.assertEqual(seen[0].fact("a"), "1")
        for missing in ("last_user_message", "model", "client_tools", "turn_count"):
            self.assertIsNone(getattr(seen[2], missing), missing)

        # A review's step carries them too.
        reviewed = []
        w = self.world(lambda c: Plugin().review(0, lambda s, i: reviewed.append(s) or Accept()))
        w.declare([])
        w.review(full, review_input("x"))
        self.assertEqual(reviewed[0].client_tools, ["read", "bash"])
        self.assertEqual(reviewed[0].turn_count, 2)

    def test_evaluate_answers_item_by_item(self):
        w = self.world(
            lambda c: Plugin()
            .dynamic_variable("maybe", maybe)
            .dynamic_section("boom", 0, boom)
            .dynamic_section("num", 1, lambda s: 42)
            .dynamic_section("s", 2, lambda s: "global")
            .dynamic_section("s", 2, lambda s: "coder")
            .scope("coder")
            .dynamic_context("c", 0, lambda s: s.fact("maybe") or "")
            .dynamic_variable("bad", lambda s: 1)
            .show_tools(lambda s: ["a"])
        )
        self.assertTrue(w.declare([]).filters_tools)
        e = w.evaluate(
            step(maybe="M"),
            wanted(
                sections=["s", "boom", ("s", CODER), "num", "nope"],
                contexts=["c", ("c", CODER)],
                variables=["maybe", ("maybe", CODER), "bad"],
                shown_tools=True,
            ),
        )
        self.assertEqual(
            e.sections,
            [
                Ok("global"),
                Err("boom"),
                Ok("coder"),
                Err("section `num`: the function returned int, expected str"),
                Err("no dynamic section `nope` is declared"),
            ],
        )
        self.assertEqual(e.contexts, [Ok("M"), Err("no dynamic context `c` is declared")])
        self.assertEqual(
            e.variables,
            [
                Ok("M"),
                Err("no dynamic variable `maybe` is declared"),
                Err("variable `bad`: the function returned int, expected str or None"),
            ],
        )
        self.assertEqual(e.shown_tools, Ok(["a"]))
        e = w.evaluate(step(), wanted(variables=["maybe"]))
        self.assertEqual(e, wit.Evaluation([], [], [Ok(None)], None))
        self.assertEqual(w.evaluate(step(), wanted()), wit.Evaluation([], [], [], None))

    def test_shown_tools(self):
        def fail(s):
            raise ValueError("no tools today")

        w = self.world(lambda c: Plugin())
        w.declare([])
        self.assertEqual(
            w.evaluate(step(), wanted(shown_tools=True)).shown_tools, Err("this plugin does not filter its tools")
        )
        w = self.world(lambda c: Plugin().show_tools(fail))
        w.declare([])
        self.assertEqual(w.evaluate(step(), wanted(shown_tools=True)).shown_tools, Err("no tools today"))
        self.assertIsNone(w.evaluate(step(), wanted()).shown_tools)

    def test_review(self):
        seen = []

        def review(s, i):
            seen.append((s.agent, i))
            texts = [t for m in i.messages for t in m.texts]
            if any("forbidden" in t for t in texts):
                return Reject('the step mentions "forbidden"')
            if any("hunter2" in t for t in texts):
                return Redact([("hunter2", "[redacted]"), Redaction("a", "b")])
            if any("none" in t for t in texts):
                return None
            if any("raise" in t for t in texts):
                raise CallError("review failed")
            return Accept()

        w = self.world(lambda c: Plugin().section("s", 0, "S").review(-5, review))
        self.assertEqual(w.declare([]).review_order, -5)
        self.assertEqual(w.review(step(), review_input("hello")), wit.Verdict_Accept())
        self.assertEqual(
            seen,
            [("coder", ReviewInput([Message("user", ["hello"], "")], "System.", None, ["t"]))],
        )
        self.assertEqual(
            w.review(step(), review_input("a", "it is forbidden")), wit.Verdict_Reject('the step mentions "forbidden"')
        )
        self.assertEqual(
            w.review(step(), review_input("pw hunter2", role="tool")),
            wit.Verdict_Redact([wit.Redaction("hunter2", "[redacted]"), wit.Redaction("a", "b")]),
        )
        for text, message in [
            ("none", "review: the function returned NoneType, expected Accept, Reject or Redact"),
            ("raise", "review failed"),
        ]:
            with self.assertRaises(Err) as e:
                w.review(step(), review_input(text))
            self.assertEqual(e.exception.value, message)

    def test_no_review_hook_accepts(self):
        w = self.world(lambda c: Plugin())
        self.assertIsNone(w.declare([]).review_order)
        self.assertEqual(w.review(step(), review_input("forbidden")), wit.Verdict_Accept())

    def test_verdict_helpers(self):
        self.assertEqual(Redact([("a", "b")]), Redact((Redaction("a", "b"),)))
        self.assertEqual(Redact([("a", "b")]).redactions, (Redaction("a", "b"),))
        self.assertEqual(Redact(), Redact([]))
        self.assertEqual(Reject("why").reason, "why")
        self.assertEqual(Accept(), Accept())

    def test_declare_errors(self):
        def fail(c):
            raise ValueError("bad config")

        for build, message in [
            (fail, "bad config"),
            (lambda c: Plugin().scope("x"), "scope() called before any item was added"),
            (lambda c: Plugin().variable("v", "x").complete(), "complete() applies to a section only"),
            (lambda c: Plugin().verbatim(), "verbatim() applies to a section or context only"),
            (lambda c: Plugin().variable("v", "x").verbatim(), "verbatim() applies to a section or context only"),
            (lambda c: Plugin().tool("t", "d", "{}").verbatim(), "verbatim() applies to a section or context only"),
            (lambda c: Plugin().reads(facts=["x"]), "reads() applies to a dynamic section, context or variable only"),
            (lambda c: Plugin().section("s", 0, "S").reads(),
             "reads() applies to a dynamic section, context or variable only"),
            (lambda c: Plugin().context("c", 0, "C").reads(),
             "reads() applies to a dynamic section, context or variable only"),
            (lambda c: Plugin().variable("v", "x").reads(),
             "reads() applies to a dynamic section, context or variable only"),
            (lambda c: Plugin().tool("t", "d", "{}").reads(),
             "reads() applies to a dynamic section, context or variable only"),
            (lambda c: Plugin().dynamic_section("d", 0, len).reads().reads(), "reads() called twice for section `d`"),
            (lambda c: Plugin().dynamic_context("d", 0, len).reads(inputs=["model", "last_user_message"]),
             "reads(): unknown input 'last_user_message' "
             "(known: last-user-message, model, client-tools, step-number, turn-count)"),
            (lambda c: Plugin().dynamic_variable("v", len).reads(facts="task"),
             "reads(): facts must be a list of str, got str"),
            (lambda c: Plugin().dynamic_variable("v", len).reads(inputs="model"),
             "reads(): inputs must be a list of str, got str"),
            (lambda c: Plugin().dynamic_variable("v", len).reads(facts=None),
             "reads(): facts must be a list of str, got NoneType"),
            (lambda c: Plugin().dynamic_variable("v", len).reads(facts=["a", 1]),
             "reads(): facts must be a list of str, got an item of type int"),
            (lambda c: Plugin().dynamic_variable("v", len).reads(volatile="yes"),
             "reads(): volatile must be True or False, got 'yes'"),
            (lambda c: Plugin().reads_by_default(inputs=["turns"]),
             "reads_by_default(): unknown input 'turns' "
             "(known: last-user-message, model, client-tools, step-number, turn-count)"),
            (lambda c: Plugin().reads_by_default(volatile=1),
             "reads_by_default(): volatile must be True or False, got 1"),
            (lambda c: Plugin().reads_by_default().reads_by_default(), "reads_by_default() called twice"),
            (lambda c: Plugin().refresh("step"), "refresh() applies to a section or tool only"),
            (lambda c: Plugin().context("c", 0, "C").refresh("step"), "refresh() applies to a section or tool only"),
            (lambda c: Plugin().dynamic_variable("v", len).refresh("step"),
             "refresh() applies to a section or tool only"),
            (lambda c: Plugin().section("s", 0, "S").refresh("often"),
             "refresh(): unknown value 'often' (expected step, boundary or session)"),
            (lambda c: Plugin().tool("t", "d", "{}").refresh("Boundary"),
             "refresh(): unknown value 'Boundary' (expected step, boundary or session)"),
            (lambda c: Plugin().defer(), "defer() applies to a tool only"),
            (lambda c: Plugin().section("s", 0, "S").defer(), "defer() applies to a tool only"),
            (lambda c: Plugin().review(0, "x"), "expected a function, got str"),
            (lambda c: Plugin().review(0, len).review(1, len), "review() called twice (a plugin has one review hook)"),
            (lambda c: Plugin().review(2**31, len),
             "review() order must be an integer from -2147483648 to 2147483647, got 2147483648"),
            (lambda c: Plugin().review(True, len),
             "review() order must be an integer from -2147483648 to 2147483647, got True"),
            (lambda c: "nope", "declare must return a Plugin, not str"),
        ]:
            with self.assertRaises(Err) as e:
                self.world(build).declare([])
            self.assertEqual(e.exception.value, message)

    def test_called_before_declare(self):
        for call in [
            lambda w: w.evaluate(step(), wanted(shown_tools=True)),
            lambda w: w.review(step(), review_input("x")),
        ]:
            with self.assertRaises(Err) as e:
                call(self.world(lambda c: Plugin()))
            self.assertEqual(e.exception.value, "the plugin was called before declare")


if __name__ == "__main__":
    unittest.main()
