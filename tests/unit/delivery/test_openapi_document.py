"""The OpenAPI document reads well to people and to client generators: every operation has a
camelCase verb-noun operationId (unique), a tag of the document's, a summary, a description, and
the errors it can give as problem+json with an example; every schema has an example that is valid
against the schema, and every request body's example is accepted by the API's own decoder.
"""

from __future__ import annotations

import re

import jsonschema
import msgspec
import pytest
from referencing import Registry, Resource

from delivery.api import openapi, openapi_examples, problems

DOCUMENT = openapi.document()
OPERATIONS = [(path, method, operation) for path, methods in DOCUMENT["paths"].items()
              for method, operation in methods.items()]
SCHEMAS = DOCUMENT["components"]["schemas"]


def test_every_operation_is_named_tagged_and_described():
    ids = [operation["operationId"] for _, _, operation in OPERATIONS]
    assert len(ids) == len(set(ids)), "operationIds are unique"
    tags = {tag["name"] for tag in DOCUMENT["tags"]}
    for path, method, operation in OPERATIONS:
        assert re.fullmatch(r"[a-z]+(?:[A-Z][a-z]+)+", operation["operationId"]), (path, method)
        assert len(operation["tags"]) == 1 and operation["tags"][0] in tags, (path, method)
        assert operation["summary"] and len(operation["summary"]) <= 60, (path, method)
        assert operation["description"] and operation["description"] != operation["summary"], (path, method)
    assert {tag for _, _, operation in OPERATIONS for tag in operation["tags"]} == tags, "no tag stands empty"


def test_every_error_response_is_a_problem_with_an_example():
    for path, method, operation in OPERATIONS:
        for status, response in operation["responses"].items():
            if int(status) < 400 or "application/json" in response["content"]:
                continue  # a success, or a declared body (/readyz answers its Readiness with 503)
            media = response["content"]["application/problem+json"]
            assert media["schema"] == {"$ref": "#/components/schemas/ProblemBody"}, (path, method, status)
            assert media["example"]["status"] == int(status), (path, method, status)
            assert media["example"]["type"].startswith(problems.TYPE_BASE), (path, method, status)


def _validator(name: str) -> jsonschema.protocols.Validator:
    resource = Resource.from_contents({"$schema": "https://json-schema.org/draft/2020-12/schema",
                                       "components": DOCUMENT["components"]})
    registry = Registry().with_resource("urn:document", resource)
    schema = {"$ref": f"urn:document#/components/schemas/{name}"}
    return jsonschema.Draft202012Validator(schema, registry=registry)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_every_schema_has_a_valid_example(name):
    examples = SCHEMAS[name].get("examples")
    assert examples, f"{name} has no example"
    for example in examples:
        _validator(name).validate(example)


def test_every_json_body_in_the_document_has_an_example_of_its_schema():
    for path, method, operation in OPERATIONS:
        bodies = [operation.get("requestBody", {}).get("content", {}).get("application/json")]
        bodies += [response.get("content", {}).get("application/json") for response in operation["responses"].values()]
        for media in filter(None, bodies):
            name = media["schema"]["$ref"].rsplit("/", 1)[1]
            assert media["example"] == SCHEMAS[name]["examples"][0], (path, method, name)


@pytest.mark.parametrize("kind", openapi.REQUEST_BODY_TYPES, ids=lambda kind: kind.__name__)
def test_every_request_example_is_accepted_by_the_decoder(kind):
    example = openapi_examples.EXAMPLES[kind.__name__]
    msgspec.json.decode(msgspec.json.encode(example), type=kind)


def test_a_wrong_example_would_be_caught():
    """The checks above can fail: an example that breaks its schema is refused by the validator."""
    with pytest.raises(jsonschema.ValidationError):
        _validator("TopupCreate").validate({"order_id": "o 1", "amount": 0})
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"order_id": "o-1", "amount": 0}', type=openapi.v.TopupCreate)
