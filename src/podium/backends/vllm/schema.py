"""What a JSON schema for structured output may ask of vLLM's grammar compilers, checked
before vLLM sees it (OpenAI `response_format` and `structured_outputs.json`, KServe's
`sampling_parameters.structured_outputs.json`).

vLLM 0.32 hands the schema to xgrammar, and to llguidance when xgrammar declines it, in the
API server's own process. Measured with SmolLM2 (docs/openai.md, "Structured output"):

- **Array counts are unrolled** by llguidance, about 85 bytes an item: one request with
  `{"type": "array", "minItems": 1000000000}` grew the server to 17.7 GB and the kernel killed
  it. No answer holds more items than its context has characters, so a count past
  :data:`ITEMS_PER_TOKEN` per token of the context is refused.
- **Some keywords are ignored without a word**: the answer broke `not`, `if`/`then`/`else`,
  `dependentRequired` and `dependentSchemas` in 3 of 3 tries each. They are refused, never
  silently dropped.
- **A `$ref` outside the schema** (`http://…`, `file://…`) is ignored with a log warning: that
  part of the answer was unconstrained. Only references inside the schema are followed.
- **A `$ref` that comes back to itself through `$ref` and `allOf` alone** (`{"$ref": "#"}`)
  admits no value: the engine's grammar rejected the first token and vLLM ended the request
  with a 500.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from podium.errors import InvalidArgument

ITEMS_PER_TOKEN = 8
"""An array item and its comma take two characters at least, and a token of these vocabularies
rarely covers more than 16: an answer holds at most about 8 items per token of its context."""

_COUNTS = ("minItems", "maxItems", "minContains", "maxContains")
IGNORED = {
    "not": "the answer could still be what it excludes",
    "if": "its then/else would not apply", "then": "it would not apply",
    "else": "it would not apply",
    "dependentRequired": "the properties it requires could be missing",
    "dependentSchemas": "the schemas it applies would not be checked",
    "dependencies": "the properties or schemas it requires would not be checked",
}
"""Keywords the engine's grammar leaves unenforced, and what that would let through."""

_SCHEMA = ("items", "additionalItems", "additionalProperties", "contains", "not", "if", "then",
           "else", "propertyNames", "unevaluatedItems", "unevaluatedProperties")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def check_structured_outputs(value: Any, *, param: str, context: int) -> None:
    """The JSON schema in a `structured_outputs` (a dict, or vLLM's StructuredOutputsParams)."""
    schema = value.get("json") if isinstance(value, dict) else getattr(value, "json", None)
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            return  # vLLM's own 400 names it
    if isinstance(schema, dict):
        check_json_schema(schema, param=f"{param}.json", context=context)


def check_json_schema(schema: dict[str, Any], *, param: str, context: int) -> None:
    """A 400 naming the first place in `schema` the engine would not honour, or that would
    cost the server more than one answer can use. `context`: the model's, in tokens."""
    max_count = ITEMS_PER_TOKEN * context
    nodes = dict(_subschemas(schema, ""))
    for path, node in nodes.items():
        where = f"{param}{path.replace('/', '.')}"
        for key, why in IGNORED.items():
            if key in node:
                raise InvalidArgument(
                    f"{where}.{key} is not enforced by the engine's grammar (vLLM 0.32 ignores "
                    f"it: {why}); remove it, or check that part of the answer yourself",
                    param=f"{where}.{key}")
        for key in _COUNTS:
            value = node.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool) \
                    and value > max_count:
                raise InvalidArgument(
                    f"{where}.{key}={value} is past {max_count:,}, more items than an answer "
                    f"within the model's context of {context:,} tokens can hold "
                    f"({ITEMS_PER_TOKEN} a token at most); lower it",
                    param=f"{where}.{key}")
        ref = node.get("$ref")
        if isinstance(ref, str) and not ref.startswith("#"):
            raise InvalidArgument(
                f"{where}.$ref {ref!r} points outside the schema, and only references within "
                "it are followed (the engine would leave that part unconstrained); put the "
                "definition under $defs and refer to it as '#/$defs/NAME'",
                param=f"{where}.$ref")
    loop = _reference_loop(nodes)
    if loop is not None:
        raise InvalidArgument(
            f"{param}: the schema at '#{loop}' leads back to itself through $ref/allOf alone, "
            "so no value satisfies it; give the recursion a base case (an anyOf branch, or "
            "recurse only inside properties or items)", param=f"{param}{loop.replace('/', '.')}")


def _subschemas(node: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema object in `node` with its JSON pointer (depth is bounded by the body's
    nesting limit, checked before this)."""
    if not isinstance(node, dict):
        return
    yield path, node
    for key in _SCHEMA:
        if isinstance(node.get(key), dict):
            yield from _subschemas(node[key], f"{path}/{key}")
    for key in _SCHEMA_LISTS:
        if isinstance(node.get(key), list):
            for i, member in enumerate(node[key]):
                yield from _subschemas(member, f"{path}/{key}/{i}")
    for key in _SCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            for name, member in node[key].items():
                yield from _subschemas(member, f"{path}/{key}/{_escape(name)}")


def _reference_loop(nodes: dict[str, dict[str, Any]]) -> str | None:
    """The pointer of a schema (of `nodes`, by pointer) that reaches itself through `$ref` and
    `allOf` edges only (a value must then satisfy itself before anything else), or None."""

    def edges(path: str) -> Iterator[str]:
        node = nodes[path]
        ref = node.get("$ref")
        if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
            target = ref[1:]
            if target in nodes:
                yield target
        if isinstance(node.get("allOf"), list):
            for i in range(len(node["allOf"])):
                if f"{path}/allOf/{i}" in nodes:
                    yield f"{path}/allOf/{i}"

    done: set[str] = set()
    for start in nodes:
        if start in done:
            continue
        on_path = {start}
        stack = [(start, edges(start))]
        while stack:
            path, pending = stack[-1]
            nxt = next(pending, None)
            if nxt is None:
                stack.pop()
                on_path.discard(path)
                done.add(path)
            elif nxt in on_path:
                return nxt
            elif nxt not in done:
                on_path.add(nxt)
                stack.append((nxt, edges(nxt)))
    return None


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")
