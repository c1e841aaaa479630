#!/usr/bin/env python3
"""Checks that the client's tests exercised the whole OpenAPI document of the daemon.

    openapi_coverage.py CALLS_LOG OPENAPI_JSON

CALLS_LOG is what the tests' recording transport wrote (conftest.py: one JSON line per answer
and per server-sent event: method, path, status, content type, top-level fields). Fails
(exit 1, listing every gap) unless:

1. every operation of the document (each method of each path template) got at least one 2xx
   answer in the tests;
2. every top-level property of each of its 2xx response schemas (through $ref, allOf, oneOf
   and anyOf) was seen at the top level of an answer of that operation, or of a server-sent
   event's data for a stream, in an answer whose documented response schema names it (so
   `Health.error`, which the daemon sends only with its 503, counts when a 503 carried it).
   A `text/event-stream` schema describes each event (`id`, `event`, `data`); the fields
   wanted of a stream are those of its events' data (each shape's `data.contentSchema`), but
   for the `lagged` event's (`missed`): it ends a stream only after more than 1,024 changes,
   and tests/openapi.rs provokes it against the daemon instead;
3. every call the tests made is to an operation the document describes.

Standard library only.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict

METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")


def resolve(document, schema):
    while isinstance(schema, dict) and "$ref" in schema:
        ref = schema["$ref"]
        if not ref.startswith("#/"):
            raise SystemExit(f"openapi_coverage.py: external $ref {ref} is not supported")
        node = document
        for part in ref[2:].split("/"):
            node = node[part.replace("~1", "/").replace("~0", "~")]
        schema = node
    return schema if isinstance(schema, dict) else {}


def properties(document, schema, seen=None):
    """The top-level property names a schema gives an object."""
    seen = set() if seen is None else seen
    if id(schema) in seen:
        return set()
    seen.add(id(schema))
    schema = resolve(document, schema)
    names = set(schema.get("properties", {}))
    for key in ("allOf", "oneOf", "anyOf"):
        for part in schema.get(key, []):
            names |= properties(document, part, seen)
    return names


def response_for(responses, status):
    """The documented response of an answer's status: exact, then `2XX`-style, then default."""
    return (responses.get(str(status)) or responses.get(f"{str(status)[0]}XX")
            or responses.get("default"))


def event_data_schemas(document, schema, seen=None):
    """The data schemas (`contentSchema`) of each event shape of a stream's schema, but for
    the `lagged` event's."""
    seen = set() if seen is None else seen
    if id(schema) in seen:
        return []
    seen.add(id(schema))
    schema = resolve(document, schema)
    found = []
    event = schema.get("properties", {}).get("event", {})
    data = schema.get("properties", {}).get("data", {})
    if "contentSchema" in data and event.get("enum") != ["lagged"]:
        found.append(data["contentSchema"])
    for key in ("allOf", "oneOf", "anyOf"):
        for part in schema.get(key, []):
            found += event_data_schemas(document, part, seen)
    return found


def fields_of(document, response):
    names = set()
    for media_type, media in (response or {}).get("content", {}).items():
        if "schema" not in media:
            continue
        if media_type.split(";")[0].strip() == "text/event-stream":
            for data in event_data_schemas(document, media["schema"]):
                names |= properties(document, data)
        else:
            names |= properties(document, media["schema"])
    return names


def template_regex(template):
    parts = re.split(r"(\{[^}/]+\})", template)
    return re.compile("^" + "".join("[^/]+" if p.startswith("{") else re.escape(p)
                                    for p in parts) + "$")


def main(calls_path, document_path):
    with open(document_path, encoding="utf-8") as f:
        document = json.load(f)
    operations = {}
    for template, item in document.get("paths", {}).items():
        for method in METHODS:
            if method in item:
                operations[(method.upper(), template)] = item[method].get("responses", {})
    if not operations:
        return f"{document_path} describes no operation"
    matchers = sorted(((template_regex(t), m, t) for m, t in operations),
                      key=lambda x: x[2].count("{"))  # literal segments win over parameters

    with open(calls_path, encoding="utf-8") as f:
        calls = [json.loads(line) for line in f if line.strip()]
    answered = defaultdict(int)  # operation -> 2xx answers
    seen = defaultdict(set)      # operation -> fields seen where documented
    undocumented = set()
    for call in calls:
        op = next(((m, t) for regex, m, t in matchers
                   if m == call["method"] and regex.match(call["path"])), None)
        if op is None:
            undocumented.add(f"{call['method']} {call['path']} -> {call['status']}")
            continue
        status = call["status"]
        if 200 <= status < 300 and not call.get("sse"):
            answered[op] += 1
        documented = fields_of(document, response_for(operations[op], status))
        seen[op] |= documented & set(call["fields"])

    gaps, lines = [], []
    for op in sorted(operations):
        method, template = op
        wanted = set()
        for status, response in operations[op].items():
            if status.startswith("2"):
                wanted |= fields_of(document, response)
        missing = sorted(wanted - seen[op])
        lines.append(f"  {method:6} {template:40} {answered[op]:3} answers, fields "
                     f"{len(wanted) - len(missing)}/{len(wanted)}")
        if not answered[op]:
            gaps.append(f"{method} {template}: never answered 2xx in the tests")
        if missing:
            gaps.append(f"{method} {template}: response fields never seen: {', '.join(missing)}")
    gaps += [f"{c}: no operation of the document matches this call" for c in sorted(undocumented)]
    print(f"openapi coverage of {document_path}: {len(operations)} operations, "
          f"{len(calls)} recorded answers")
    print("\n".join(lines))
    if gaps:
        return "openapi coverage gaps:\n" + "\n".join(f"  - {g}" for g in gaps)
    print("every operation was answered and every response field seen")
    return None


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.split("\n\n")[1])
    sys.exit(main(sys.argv[1], sys.argv[2]))
