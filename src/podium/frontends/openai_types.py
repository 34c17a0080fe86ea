"""JSON types of the OpenAI request fields, checked strictly against vLLM's own request models.

vLLM's models validate in pydantic's lax mode: `"0.5"` passes as a temperature, `true` as `n`,
`"yes"` as `stream`. Each field whose annotation is made of JSON scalars (numbers, strings,
booleans, null, literals, and lists or string-keyed maps of them) is checked here in strict
mode, with the annotation's own bounds, so a wrong type is a 400 naming the field. Fields of
richer types (messages, tools, response_format) are left to the models themselves.
"""

from __future__ import annotations

import functools
import types
import typing
from typing import Annotated, Any, Literal, Union

from pydantic import ConfigDict, TypeAdapter, ValidationError

from podium.errors import InvalidArgument
from podium.validation import describe

_SCALARS = (int, float, bool, str, type(None))
_STRICT = ConfigDict(strict=True)


def check_types(model_cls: type, body: dict[str, Any]) -> None:
    """400 naming the first field of `body` whose value is not of its declared JSON type."""
    adapters = _adapters(model_cls)
    for name, value in body.items():
        adapter = adapters.get(name)
        if adapter is None:
            continue
        try:
            adapter.validate_python(value)
        except ValidationError as exc:
            raise InvalidArgument(f"{name}{_rest(describe(exc))}", param=name) from None


def _rest(description: str) -> str:
    # describe() leads with the location inside the value ("0: ..."), or with "body"
    location, _, problem = description.partition(": ")
    return f": {problem}" if location == "body" else f"[{location}]: {problem}"


@functools.cache
def _adapters(model_cls: type) -> dict[str, TypeAdapter]:
    """A strict validator for each field of `model_cls` made of JSON scalars."""
    adapters = {}
    for name, field in model_cls.model_fields.items():  # type: ignore[attr-defined]
        if _is_plain(field.annotation):
            annotation = (Annotated[field.annotation, *field.metadata] if field.metadata
                          else field.annotation)
            adapters[field.alias or name] = TypeAdapter(annotation, config=_STRICT)
    return adapters


def _is_plain(annotation: Any) -> bool:
    """True for JSON scalars and lists / string-keyed maps of them (the laxly coerced ones)."""
    if annotation in _SCALARS:
        return True
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return True
    if origin is Annotated:
        return _is_plain(args[0])
    if origin in (Union, types.UnionType):
        return all(_is_plain(arg) for arg in args)
    if origin is list:
        return bool(args) and _is_plain(args[0])
    if origin is dict:
        return len(args) == 2 and args[0] is str and _is_plain(args[1])
    return False
