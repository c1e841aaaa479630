"""Does each value conform to one schema of an OpenAPI document? (tests/openapi.rs)

    python conforms.py DOCUMENT POINTER VALUES

DOCUMENT is the OpenAPI document (JSON), POINTER a JSON pointer into it naming a schema (e.g.
`/components/schemas/NewSession`), VALUES a file holding a JSON array of values. Prints a JSON array
with, for each value, null when it conforms or the first error's message when not.

Validation is JSON Schema 2020-12 (OpenAPI 3.1's dialect) with the document as the base of
every `$ref`, plus one assertion the dialect leaves to applications: a string whose schema
says `contentMediaType: application/json` must parse as JSON, and the parsed value must
conform to its `contentSchema` (how the document describes the data of a server-sent event).
"""

import json
import sys

import jsonschema
import referencing
from referencing.jsonschema import DRAFT202012

BASE = "urn:promptd:openapi"


def content_schema(validator, subschema, instance, schema):
    if not isinstance(instance, str) or schema.get("contentMediaType") != "application/json":
        return
    try:
        value = json.loads(instance)
    except ValueError as e:
        yield jsonschema.ValidationError(f"{instance!r} is not JSON: {e}")
        return
    yield from validator.descend(value, subschema)


Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator, {"contentSchema": content_schema}
)


def main():
    document_path, pointer, values_path = sys.argv[1:4]
    with open(document_path, encoding="utf-8") as f:
        document = json.load(f)
    registry = referencing.Registry().with_resource(
        BASE, DRAFT202012.create_resource(document)
    )
    validator = Validator({"$ref": f"{BASE}#{pointer}"}, registry=registry)
    with open(values_path, encoding="utf-8") as f:
        values = json.load(f)
    out = []
    for value in values:
        error = jsonschema.exceptions.best_match(validator.iter_errors(value))
        out.append(None if error is None else f"{error.message} (at {list(error.absolute_path)})")
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
