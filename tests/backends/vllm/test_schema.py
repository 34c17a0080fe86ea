"""The JSON-schema checks before vLLM's grammar compilers (each case is also a real-engine
test in tests/frontends/test_openai_bad_real.py or test_kserve_llm_bad_real.py)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from podium.backends.vllm.schema import check_json_schema, check_structured_outputs
from podium.errors import InvalidArgument

CONTEXT = 8192
P = "response_format.json_schema.schema"

REFUSED: dict[str, tuple[dict[str, Any], str, str]] = {
    # name: (schema, param, what the message says)
    "min-items-1e9": ({"type": "array", "minItems": 10**9}, f"{P}.minItems", "past 65,536"),
    "max-items-nested": ({"type": "object", "properties": {"a": {"type": "array",
                                                                 "maxItems": 70_000}}},
                         f"{P}.properties.a.maxItems", "maxItems=70000"),
    "min-contains-float": ({"type": "array", "minContains": 1e12}, f"{P}.minContains",
                           "minContains=1000000000000.0"),
    "not": ({"not": {"type": "string"}}, f"{P}.not", "not enforced"),
    "if-then": ({"if": {"required": ["a"]}, "then": {"required": ["b"]}}, f"{P}.if",
                "not enforced"),
    "else-in-items": ({"type": "array", "items": {"else": {}}}, f"{P}.items.else",
                      "not enforced"),
    "dependent-required": ({"type": "object", "dependentRequired": {"a": ["b"]}},
                           f"{P}.dependentRequired", "properties it requires"),
    "dependent-schemas-in-defs": ({"$defs": {"x": {"dependentSchemas": {}}}},
                                  f"{P}.$defs.x.dependentSchemas", "not enforced"),
    "ref-http": ({"$ref": "http://example.com/s.json"}, f"{P}.$ref", "outside the schema"),
    "ref-file-in-any-of": ({"anyOf": [{"type": "string"}, {"$ref": "file:///etc/passwd"}]},
                           f"{P}.anyOf.1.$ref", "'#/$defs/NAME'"),
    "ref-to-itself": ({"$ref": "#"}, P, "'#' leads back to itself"),
    "ref-loop-through-defs": ({"$defs": {"a": {"$ref": "#/$defs/b"},
                                         "b": {"allOf": [{"$ref": "#/$defs/a"}]}},
                               "$ref": "#/$defs/a"}, f"{P}.$defs.a", "no value satisfies it"),
}


@pytest.mark.parametrize("case", list(REFUSED.values()), ids=list(REFUSED))
def test_a_schema_the_engine_would_not_honour_is_refused(
        case: tuple[dict[str, Any], str, str]) -> None:
    schema, param, says = case
    with pytest.raises(InvalidArgument) as caught:
        check_json_schema(schema, param=P, context=CONTEXT)
    assert caught.value.param == param
    assert says in caught.value.message, caught.value.message


class Node(BaseModel):
    name: str
    children: list[Node] = []


class Catalog(BaseModel):
    titles: list[str]
    root: Node | None = None


ACCEPTED: dict[str, dict[str, Any]] = {
    "pydantic-recursive-model": Catalog.model_json_schema(),
    "recursion-through-properties": {"type": "object", "properties": {"next": {"$ref": "#"}}},
    "recursion-with-a-base-case": {"anyOf": [{"type": "string"}, {"$ref": "#"}]},
    "property-named-like-keywords": {"type": "object", "properties": {
        "if": {"type": "string"}, "not": {"type": "integer"}, "$ref": {"type": "string"}}},
    "counts-within-the-context": {"type": "array", "minItems": 3, "maxItems": 65_536},
    "enum-and-const": {"enum": ["a", "b"], "const": "a"},
}


@pytest.mark.parametrize("schema", list(ACCEPTED.values()), ids=list(ACCEPTED))
def test_schemas_the_engine_honours_pass(schema: dict[str, Any]) -> None:
    check_json_schema(schema, param=P, context=CONTEXT)


@pytest.mark.parametrize("value", [
    {"json": {"type": "array", "maxItems": 10**6}},
    {"json": '{"type": "array", "maxItems": 1000000}'},
], ids=["dict", "json-text"])
def test_structured_outputs_json_is_checked_as_given(value: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument) as caught:
        check_structured_outputs(value, param="structured_outputs", context=CONTEXT)
    assert caught.value.param == "structured_outputs.json.maxItems"


def test_structured_outputs_without_a_schema_pass() -> None:
    for value in ({"regex": "[0-9]+"}, {"json": "not json"}, {"choice": ["a"]}):
        check_structured_outputs(value, param="structured_outputs", context=CONTEXT)
