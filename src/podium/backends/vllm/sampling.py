"""vLLM `SamplingParams` from what Triton clients send: field names and types read off vLLM's
own `SamplingParams`, values coerced as Triton's vLLM backend does ("0.7", "true", "[1, 2]").

A request sets sampling fields in the `sampling_parameters` JSON tensor and in its
`parameters` (the tensor wins). Every public `SamplingParams` field is settable except those
in `PODIUM_OWNED`, which Podium sets itself; any other name is a 400 naming it. vLLM validates
value ranges itself, and its complaint is the client's 400 too.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from collections.abc import Callable
from typing import Any

from podium.backends.base import InferenceRequest
from podium.backends.tensor_text import read_text
from podium.errors import InvalidArgument

SamplingFactory = Callable[..., Any]

PODIUM_OWNED: dict[str, str] = {
    "output_kind": "Podium streams by diffing cumulative outputs",
    "detokenize": "text_output is text, which needs detokenizing",
    "extra_args": "it carries Podium's constraint; send 'constraint' instead",
    "logprob_token_ids": "scoring sets it; send 'context' and 'candidates' to score",
    "prompt_logprob_token_ids": "scoring sets it; send 'context' and 'candidates' to score",
    "prompt_logprob_start": "scoring sets it; send 'context' and 'candidates' to score",
    "skip_reading_prefix_cache": "scoring sets it; send 'context' and 'candidates' to score",
    "skip_clone": "it is internal to vLLM",
    "output_text_buffer_length": "it is internal to vLLM",
}
"""SamplingParams fields a request may not set, and why."""


def vllm_sampling_params(**kwargs: Any) -> Any:
    """vLLM's SamplingParams (imported on the first LLM request only: it loads torch)."""
    from vllm import SamplingParams

    return SamplingParams(**kwargs)


@functools.cache
def sampling_field_types() -> dict[str, Any]:
    """Each SamplingParams field a request may set, with its type as vLLM declares it."""
    import msgspec
    from vllm.sampling_params import SamplingParams

    return {f.name: f.type for f in msgspec.structs.fields(SamplingParams)
            if not f.name.startswith("_") and f.name not in PODIUM_OWNED}


def parse_sampling_parameters(request: InferenceRequest) -> dict[str, Any]:
    """SamplingParams keyword arguments from the `sampling_parameters` JSON tensor and the
    request's parameters (the tensor wins), each in its vLLM type."""
    merged = dict(request.parameters)
    raw = read_text(request, "sampling_parameters", required=False)
    if raw:
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise InvalidArgument(f"sampling_parameters is not valid JSON ({exc.msg} at "
                                  f"character {exc.pos}): {raw[:80]!r}",
                                  param="sampling_parameters") from None
        if not isinstance(data, dict):
            raise InvalidArgument(f"sampling_parameters must be a JSON object, got {raw[:80]!r}",
                                  param="sampling_parameters")
        merged.update(data)
    constraint = merged.pop("constraint", None)
    kwargs = {key: coerce(key, value) for key, value in merged.items()}
    if constraint is not None:  # enforced in the decoding loop by the constraint processor
        from podium.backends.vllm import constraint as constraints

        kwargs["extra_args"] = constraints.admit(
            _constraint(constraint), min_tokens=kwargs.get("min_tokens"),
            xargs_field="extra_args",
            also_constrained_by=("structured_outputs" if kwargs.get("structured_outputs")
                                 is not None else None))
    return kwargs


def build_sampling_params(factory: SamplingFactory, kwargs: dict[str, Any]) -> Any:
    """SamplingParams validates value ranges itself; a bad value is the client's error."""
    try:
        return factory(**kwargs)
    except Exception as exc:
        from vllm.exceptions import VLLMClientError

        if isinstance(exc, ValueError | TypeError | VLLMClientError):
            raise InvalidArgument(f"sampling_parameters: {exc}", param="sampling_parameters"
                                  ) from None
        raise


def coerce(key: str, value: Any) -> Any:
    """`value` in the type vLLM declares for field `key`; strings convert as Triton's do."""
    import msgspec

    if key in PODIUM_OWNED:
        raise InvalidArgument(f"sampling parameter {key!r} is set by Podium: "
                              f"{PODIUM_OWNED[key]}", param=key)
    fields = sampling_field_types()
    if key not in fields:
        raise InvalidArgument(f"{key!r} is not a sampling parameter: vLLM's SamplingParams "
                              f"has no such field (known: {', '.join(sorted(fields))}; and "
                              "Podium's 'constraint')", param=key)
    kind = fields[key]
    container = _admits_container(kind)
    try:
        if isinstance(value, str) and container and not _admits(kind, str):
            # Triton clients send lists as JSON text too
            return msgspec.convert(json.loads(value), kind, strict=False)
        return msgspec.convert(value, kind, strict=False)
    except (ValueError, msgspec.ValidationError) as exc:  # JSONDecodeError is a ValueError
        detail = f" ({exc})" if container else ""  # which element, or which key
        raise InvalidArgument(f"sampling parameter {key}={value!r} must be "
                              f"{describe(kind)}{detail}", param=key) from None


def describe(kind: Any) -> str:
    """A type in words, for error messages: `int | None` is "an integer or null"."""
    if _is_union(kind):
        return " or ".join(describe(arg) for arg in typing.get_args(kind))
    origin = typing.get_origin(kind) or kind
    if origin is typing.Annotated:
        return describe(typing.get_args(kind)[0])
    words = {int: "an integer", float: "a number", bool: "true or false", str: "a string",
             list: "a list", set: "a list", dict: "an object", type(None): "null"}
    if origin in words:
        return words[origin]
    return "an object" if dataclasses.is_dataclass(origin) else f"a {origin!r}"


def _constraint(value: Any) -> Any:
    """The constraint object; a request parameter may hold it as JSON text (gRPC parameters
    carry only scalars)."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"constraint is not valid JSON ({exc.msg} at character "
                              f"{exc.pos}): {value[:80]!r}; send the constraint object, or its "
                              "JSON text where parameters must be scalars (gRPC)",
                              param="constraint") from None


def _is_union(kind: Any) -> bool:
    return typing.get_origin(kind) in (typing.Union, types.UnionType)


def _members(kind: Any) -> tuple[Any, ...]:
    return typing.get_args(kind) if _is_union(kind) else (kind,)


def _admits(kind: Any, member: type) -> bool:
    return any((typing.get_origin(arg) or arg) is member for arg in _members(kind))


def _admits_container(kind: Any) -> bool:
    return any((typing.get_origin(arg) or arg) in (list, set, dict)
               or dataclasses.is_dataclass(arg) for arg in _members(kind))
