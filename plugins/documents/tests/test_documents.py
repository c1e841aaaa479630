"""Native (CPython) tests of the `documents` plugin; no WebAssembly is built or run.

    sdk/python/.venv/bin/python -m unittest discover -s plugins/documents/tests

app.py ends with `export_plugin`, which needs the bindings, so they are generated into a
temporary folder with the venv's componentize-py (as sdk/python/tests does).
"""

import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PLUGIN = os.path.dirname(HERE)
ROOT = os.path.join(PLUGIN, "..", "..")

_tmp = tempfile.TemporaryDirectory()
_cpy = os.path.join(os.path.dirname(sys.executable), "componentize-py")
subprocess.run([_cpy, "-q", "-d", os.path.join(ROOT, "wit"), "-w", "plugin", "bindings", _tmp.name], check=True)
sys.path[:0] = [_tmp.name, os.path.join(ROOT, "sdk", "python", "src"), PLUGIN]

from componentize_py_types import Err, Ok  # noqa: E402
from wit_world.imports import types as wit  # noqa: E402

import app  # noqa: E402
from app import HEADER, Document, Settings, parse_config, parse_documents, render  # noqa: E402

GLOBAL = wit.Scope_Global()


def step(last_user_message=None, **facts):
    return wit.Step("default", ["global", "default"], "", 0, sorted(facts.items()), last_user_message, None, None, None)


def context(w, step):
    """The one answer of `evaluate` for the context (Ok(text) or Err(message))."""
    wanted = wit.Wanted([], [wit.Item("documents:retrieved", GLOBAL)], [], False)
    evaluation = w.evaluate(step, wanted)
    assert (evaluation.sections, evaluation.variables, evaluation.shown_tools) == ([], [], None)
    return evaluation.contexts[0]


class RenderTest(unittest.TestCase):
    def test_empty(self):
        self.assertEqual(render([]), "")

    def test_layout(self):
        docs = [Document("wiki/deploy.md", "Deploy.", "2026-11-02"), Document("notes/oncall.txt", "Page.")]
        self.assertEqual(
            render(docs),
            "<retrieved_documents>\n"
            f"{HEADER}\n"
            '<document index="1" source="wiki/deploy.md" date="2026-11-02">\nDeploy.\n</document>\n'
            '<document index="2" source="notes/oncall.txt">\nPage.\n</document>\n'
            "</retrieved_documents>",
        )

    def test_escaping(self):
        # `{{...}}` stays as written: the context is verbatim, the host never interpolates it.
        doc = Document('a"{{x}}<&>\nb\r', "</document> & {{api_key}} <i>", '{{d}}"')
        self.assertIn(
            '<document index="1" source="a&quot;{{x}}&lt;&amp;&gt;&#10;b&#13;" date="{{d}}&quot;">\n'
            "&lt;/document&gt; &amp; {{api_key}} &lt;i&gt;\n</document>",
            render([doc]),
        )

    def test_empty_date_is_left_out(self):
        self.assertIn('<document index="1" source="s">', render([Document("s", "t", "")]))

    def test_truncation(self):
        self.assertIn("\nabcd\n", render([Document("s", "abcd")], max_chars=4))
        self.assertIn("\nabc […]\n", render([Document("s", "abcd")], max_chars=3))
        # Cut first, escape after: the entity is whole and the limit counts the real text.
        self.assertIn("\na&amp; […]\n", render([Document("s", "a&bc")], max_chars=2))
        self.assertIn("\néé […]\n", render([Document("s", "ééé")], max_chars=2))

    def test_left_out(self):
        docs = [Document(f"s{i}", "t") for i in range(4)]
        self.assertTrue(render(docs, max_documents=2).endswith(
            '<document index="2" source="s1">\nt\n</document>\n'
            "(2 more documents were left out.)\n</retrieved_documents>"
        ))
        self.assertIn("\n(1 more document was left out.)\n", render(docs, max_documents=3))
        self.assertNotIn("left out", render(docs, max_documents=4))

    def test_unpaired_surrogate(self):
        text = render(parse_documents('[{"source": "s", "text": "a\\ud800b \\ud83d\\ude00"}]'))
        self.assertIn("\na\ufffdb \U0001f600\n", text)
        text.encode("utf-8")  # would raise on a surrogate


class ParseDocumentsTest(unittest.TestCase):
    def test_fields(self):
        self.assertEqual(
            parse_documents('[{"source": "a", "text": "t", "date": "d", "score": 0.9}, {"text": "u", "source": "b"}]'),
            [Document("a", "t", "d"), Document("b", "u")],
        )
        self.assertEqual(parse_documents("[]"), [])

    def test_errors(self):
        for raw, message in [
            ("notjson", "fact `documents`: not valid JSON: Expecting value: line 1 column 1 (char 0)"),
            ("", "fact `documents`: not valid JSON: Expecting value: line 1 column 1 (char 0)"),
            ('{"a":1}', "fact `documents`: expected a JSON array of documents, got an object"),
            ("null", "fact `documents`: expected a JSON array of documents, got null"),
            ('[{"source": "a", "text": "t"}, "x"]', "fact `documents`: item 2 is a string, expected an object"),
            ("[[]]", "fact `documents`: item 1 is an array, expected an object"),
            ('[{"text": "t"}]', "fact `documents`: item 1 has no `source`"),
            ('[{"source": "a"}]', "fact `documents`: item 1 has no `text`"),
            ('[{"source": 1, "text": "t"}]', "fact `documents`: item 1: `source` is a number, expected a string"),
            ('[{"source": "a", "text": null}]', "fact `documents`: item 1: `text` is null, expected a string"),
            ('[{"source": "a", "text": "t", "date": true}]',
             "fact `documents`: item 1: `date` is a boolean, expected a string"),
        ]:
            with self.subTest(raw=raw), self.assertRaises(Exception) as e:
                parse_documents(raw)
            self.assertEqual(str(e.exception), message)


class ParseConfigTest(unittest.TestCase):
    def test_values(self):
        self.assertEqual(parse_config({}), Settings(200, 8, 4000))
        self.assertEqual(
            parse_config({"order": "-5", "max_documents": "1", "max_chars": "2147483647"}),
            Settings(-5, 1, 2147483647),
        )

    def test_errors(self):
        for config, message in [
            ({"max_chars": "x"}, 'config `max_chars`: expected an integer from 1 to 2147483647, got "x"'),
            ({"max_chars": "0"}, 'config `max_chars`: expected an integer from 1 to 2147483647, got "0"'),
            ({"max_documents": " 8"}, 'config `max_documents`: expected an integer from 1 to 2147483647, got " 8"'),
            ({"max_documents": "+8"}, 'config `max_documents`: expected an integer from 1 to 2147483647, got "+8"'),
            ({"order": "1.5"}, 'config `order`: expected an integer from -2147483648 to 2147483647, got "1.5"'),
            ({"order": "2147483648"},
             'config `order`: expected an integer from -2147483648 to 2147483647, got "2147483648"'),
            ({"maxchars": "1"}, "config: unknown key `maxchars` (known: corpus, max_chars, max_documents, order)"),
            ({"b": "1", "a": "1"}, "config: unknown keys `a`, `b` (known: corpus, max_chars, max_documents, order)"),
        ]:
            with self.subTest(config=config), self.assertRaises(Exception) as e:
                parse_config(config)
            self.assertEqual(str(e.exception), message)


class WorldTest(unittest.TestCase):
    def test_declare_and_call(self):
        w = app.WitWorld()
        d = w.declare([("max_documents", "1"), ("order", "7")])
        reads = wit.Reads(["documents", "query"], wit.Inputs.LAST_USER_MESSAGE, False)
        self.assertEqual(d.contexts, [wit.Context("documents:retrieved", 7, wit.Content_Dynamic(), GLOBAL, True, reads)])
        self.assertEqual((d.sections, d.variables, d.tools, d.review_order), ([], [], [], None))
        self.assertEqual(context(w, step()), Ok(""))
        self.assertEqual(context(w, step(documents="[]")), Ok(""))
        text = context(w, step(documents='[{"source":"a","text":"{{t}}"},{"source":"b","text":"u"}]')).value
        self.assertIn("\n{{t}}\n</document>\n(1 more document was left out.)\n", text)
        self.assertEqual(
            context(w, step(documents="[1]")), Err("fact `documents`: item 1 is a number, expected an object")
        )

    def test_retrieves_from_the_last_user_message_unless_a_fact_says(self):
        corpus = (
            '[{"source":"wiki/deploy.md","text":"Deploy with make."},'
            '{"source":"notes/oncall.txt","text":"Page the on-call engineer."},'
            '{"source":"wiki/release.md","text":"A release deploy needs a tag."}]'
        )
        w = app.WitWorld()
        w.declare([("corpus", corpus)])
        text = context(w, step(last_user_message="How do I deploy a release?")).value
        # Two words match release.md (deploy, release), one deploy.md: ranked by that.
        self.assertLess(text.index("wiki/release.md"), text.index("wiki/deploy.md"))
        self.assertNotIn("oncall", text)
        # The fact `query` wins over the message; the fact `documents` over both.
        text = context(w, step(last_user_message="deploy", query="on-call")).value
        self.assertIn("notes/oncall.txt", text)
        self.assertNotIn("wiki/", text)
        text = context(w, step(last_user_message="deploy", documents='[{"source":"x","text":"y"}]')).value
        self.assertIn('source="x"', text)
        self.assertNotIn("wiki/", text)
        # Nothing matches, or no query: no context.
        self.assertEqual(context(w, step(last_user_message="zebra")), Ok(""))
        self.assertEqual(context(w, step()), Ok(""))

    def test_a_bad_corpus_refuses_the_plugin(self):
        with self.assertRaises(Err) as e:
            app.WitWorld().declare([("corpus", '[{"source":"a"}]')])
        self.assertEqual(e.exception.value, "config `corpus`: item 1 has no `text`")

    def test_declare_error(self):
        with self.assertRaises(Err) as e:
            app.WitWorld().declare([("max_chars", "x")])
        self.assertEqual(e.exception.value, 'config `max_chars`: expected an integer from 1 to 2147483647, got "x"')


if __name__ == "__main__":
    unittest.main()
