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

_SCALARS = (int, float, bool, str, type(None))
_STRICT = ConfigDict(strict=True)
COERCED = frozenset({"logprobs"})
"""Fields checked in lax mode, as vLLM's model coerces them: clients send `"logprobs": "true"`
and `vllm serve` answers it with logprobs (an unparseable value is still a 400)."""


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
            raise InvalidArgument(_closest(name, value, exc.errors()), param=name) from None


def _closest(name: str, value: Any, errors: list[Any]) -> str:
    """One line for the union branch that got furthest into `value`, not one per branch:
    `prompt[1]: Input should be greater than or equal to 0 (got -1)`."""
    located = [(_path(value, err["loc"]), err) for err in errors]
    depth = max(len(path) for path, _ in located)
    deepest = [(path, err) for path, err in located if len(path) == depth]
    # a bound broken ("at most 4 items") says more than "not a string" from another branch
    specific = [(path, err) for path, err in deepest if not err["type"].endswith("_type")]
    path, err = (specific or deepest)[0]
    if specific:
        problem = err["msg"]
    else:  # every branch wanted another type: name them all, once each
        wanted = dict.fromkeys(e["msg"].removeprefix("Input should be ") for _, e in deepest)
        problem = "Input should be " + " or ".join(wanted)
    where = "".join(f"[{step}]" if isinstance(step, int) else f".{step}" for step in path)
    return f"{name}{where}: {problem} (got {_short(err.get('input'))})"


def _path(value: Any, loc: tuple[Any, ...]) -> list[Any]:
    """The steps of `loc` into `value` itself, without the union branch tags pydantic adds."""
    path = []
    for step in loc:
        if (isinstance(value, list) and isinstance(step, int) and 0 <= step < len(value)) \
                or (isinstance(value, dict) and step in value):
            path.append(step)
            value = value[step]
    return path


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


@functools.cache
def _adapters(model_cls: type) -> dict[str, TypeAdapter]:
    """A strict validator for each field of `model_cls` made of JSON scalars."""
    adapters = {}
    for name, field in model_cls.model_fields.items():  # type: ignore[attr-defined]
        if _is_plain(field.annotation):
            annotation = (Annotated[field.annotation, *field.metadata] if field.metadata
                          else field.annotation)
            key = field.alias or name
            adapters[key] = TypeAdapter(annotation, config=None if key in COERCED else _STRICT)
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
