"""The OpenAI fields that have vLLM constrain an answer with a grammar (`response_format`,
`structured_outputs`, a required or named tool call): their schemas checked before the engine
compiles them (`podium.backends.vllm.schema`), and their clash with Podium's `constraint`."""

from __future__ import annotations

from typing import Any

from podium.backends.vllm.schema import check_json_schema, check_structured_outputs
from podium.errors import InvalidArgument


def check_structured_output(body: dict[str, Any], context: int | None) -> None:
    """A 400 for a schema in `body` that is invalid, that the engine would not honour, or that
    would cost more than an answer can use. `context`: the model's, in tokens."""
    _check_response_format(body.get("response_format"), context)
    if body.get("structured_outputs") is not None and context:
        check_structured_outputs(body["structured_outputs"], param="structured_outputs",
                                 context=context)


def structured_field(body: dict[str, Any]) -> str | None:
    """The field of `body` that has vLLM constrain the answer with a grammar, if any."""
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") not in (None, "text"):
        return f"response_format {response_format.get('type')}"
    if body.get("structured_outputs") is not None:
        return "structured_outputs"
    tool_choice = body.get("tool_choice")
    if body.get("tools") and (tool_choice == "required" or isinstance(tool_choice, dict)):
        return "tool_choice (a required or named tool call is a grammar too)"
    return None


def _check_response_format(response_format: Any, context: int | None) -> None:
    """An invalid JSON schema is the client's error, and so is one the engine would not honour
    or that would cost more than an answer can use: say so before the engine compiles it."""
    if not isinstance(response_format, dict) or response_format.get("type") != "json_schema":
        return
    spec = response_format.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if schema is None:
        return
    import jsonschema

    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise InvalidArgument(f"response_format.json_schema.schema is not a valid JSON Schema: "
                              f"{exc.message}", param="response_format.json_schema.schema"
                              ) from None
    if context:
        check_json_schema(schema, param="response_format.json_schema.schema", context=context)
