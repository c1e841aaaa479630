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

from componentize_py_types import Err  # noqa: E402
from wit_world.imports import types as wit  # noqa: E402

from promptd_sdk import CallError, Plugin, export_plugin  # noqa: E402

GLOBAL = wit.Scope_Global()


def step(**facts):
    return wit.Step("coder", ["global", "coder"], "", 3, sorted(facts.items()))


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
        self.assertEqual(d.sections, [wit.Section("hello", 10, wit.Content_StaticText("Hi {{who}}"), True, GLOBAL)])
        self.assertEqual(d.variables, [wit.Variable("who", wit.Content_StaticText("Ada"), wit.Scope_Agent("coder"))])
        self.assertEqual(d.contexts, [wit.Context("ctx", 5, wit.Content_Dynamic(), GLOBAL)])
        self.assertEqual(d.tools, [wit.Tool("t", "d", '{"type":"object"}', GLOBAL)])
        self.assertFalse(d.filters_tools)
        self.assertEqual(w.context_text("ctx", GLOBAL, step()), "step 3")

    def test_dynamic_calls_and_errors(self):
        w = self.world(
            lambda c: Plugin()
            .dynamic_variable("maybe", maybe)
            .dynamic_section("boom", 0, boom)
            .show_tools(lambda s: ["a"])
        )
        self.assertTrue(w.declare([]).filters_tools)
        self.assertIsNone(w.variable_value("maybe", GLOBAL, step()))
        self.assertEqual(w.variable_value("maybe", GLOBAL, step(maybe="M")), "M")
        self.assertEqual(w.shown_tools(step()), ["a"])
        with self.assertRaises(Err) as e:
            w.section_text("boom", GLOBAL, step())
        self.assertEqual(e.exception.value, "boom")
        with self.assertRaises(Err) as e:
            w.variable_value("maybe", wit.Scope_Agent("coder"), step())
        self.assertEqual(e.exception.value, "no dynamic variable `maybe` is declared")

    def test_declare_errors(self):
        def fail(c):
            raise ValueError("bad config")

        for build, message in [
            (fail, "bad config"),
            (lambda c: Plugin().scope("x"), "scope() called before any item was added"),
            (lambda c: Plugin().variable("v", "x").complete(), "complete() applies to a section only"),
            (lambda c: "nope", "declare must return a Plugin, not str"),
        ]:
            with self.assertRaises(Err) as e:
                self.world(build).declare([])
            self.assertEqual(e.exception.value, message)

    def test_called_before_declare(self):
        with self.assertRaises(Err) as e:
            self.world(lambda c: Plugin()).shown_tools(step())
        self.assertEqual(e.exception.value, "the plugin was called before declare")


if __name__ == "__main__":
    unittest.main()
