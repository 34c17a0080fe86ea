"""One validation layer for KServe requests, run before any backend sees them.

HTTP JSON headers are checked against strict pydantic models (a list where a datatype belongs,
a bool dim, an object as a parameter value are each a 400 naming the field); gRPC
`ModelInferRequest`s get the same checks on their proto fields. Both bound the number of
tensors and of elements (shapes are multiplied as Python ints, so `[2**32, 2**32]` cannot wrap
to 0), and JSON `data` must hold values of its datatype (a number where a BYTES string belongs
would otherwise become `bytes(n)`, n zero bytes).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
)

from podium.backends.datatypes import NUMPY_DTYPES
from podium.errors import InvalidArgument, PayloadTooLarge
from podium.frontends.kserve_limits import KServeLimits
from podium.frontends.safe_json import type_name

HEADER_LENGTH = "Inference-Header-Content-Length"

Datatype = Literal["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32",
                   "INT64", "FP16", "FP32", "FP64", "BYTES"]
assert set(get_args(Datatype)) == set(NUMPY_DTYPES), "keep Datatype in step with NUMPY_DTYPES"
# parameters hold bool, number or string values; checked after the model, for a clear message
Parameters = dict[str, Any]
Dim = Annotated[StrictInt, Field(ge=0)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class InputHeader(_Strict):
    """One entry of `inputs`: its data inline (`data`) or in the binary part."""

    name: StrictStr = Field(min_length=1)
    datatype: Datatype
    shape: list[Dim]
    parameters: Parameters = Field(default_factory=dict)
    data: Any = None


class OutputHeader(_Strict):
    """One entry of `outputs`."""

    name: StrictStr = Field(min_length=1)
    parameters: Parameters = Field(default_factory=dict)


class InferHeader(_Strict):
    """The JSON header of `POST /v2/models/{m}/infer`."""

    id: StrictStr = ""
    parameters: Parameters = Field(default_factory=dict)
    inputs: list[InputHeader] = Field(default_factory=list)
    outputs: list[OutputHeader] | None = None


# -- HTTP ---------------------------------------------------------------------------------------
def header_length(value: str | None, body_size: int) -> int:
    """The JSON header's length from `Inference-Header-Content-Length` (the body if absent)."""
    if value is None:
        return body_size
    if not (value.strip().isascii() and value.strip().isdigit()):  # "²".isdigit() too
        raise InvalidArgument(f"{HEADER_LENGTH}={value!r} is not a non-negative integer",
                              param=HEADER_LENGTH)
    length = int(value)
    if length > body_size:
        raise InvalidArgument(f"{HEADER_LENGTH}={length} is past the end of the "
                              f"{body_size}-byte body", param=HEADER_LENGTH)
    return length


def check_infer_header(header: dict[str, Any], limits: KServeLimits, binary_size: int
                       ) -> InferHeader:
    """The header as a checked model: field types, shapes, limits, data values, binary sizes."""
    for key in ("inputs", "outputs"):
        value = header.get(key)
        if isinstance(value, list) and len(value) > limits.max_tensors:
            raise PayloadTooLarge(f"'{key}' lists {len(value)} tensors, over the limit of "
                                  f"{limits.max_tensors} (--max-tensors)", param=key)
    try:
        model = InferHeader.model_validate(header)
    except ValidationError as exc:
        raise _invalid(exc, header) from None
    _check_parameters("parameters", model.parameters)
    for key, tensors in (("inputs", model.inputs), ("outputs", model.outputs or [])):
        for index, tensor in enumerate(tensors):
            _check_parameters(f"{key}[{index}] ({tensor.name!r}).parameters", tensor.parameters)
    check_element_count(((t.name, t.shape) for t in model.inputs), limits)
    binary_total = 0
    for tensor in model.inputs:
        size = tensor.parameters.get("binary_data_size")
        has_data = "data" in tensor.model_fields_set
        if size is None:
            if not has_data:
                raise InvalidArgument(f"input {tensor.name!r} has neither 'data' nor "
                                      "parameters.binary_data_size", param=tensor.name)
            tensor.data = flat_data(tensor.name, tensor.datatype, tensor.data,
                                    math.prod(tensor.shape))
            continue
        if has_data:
            raise InvalidArgument(f"input {tensor.name!r} has both 'data' and "
                                  "parameters.binary_data_size; send one", param=tensor.name)
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise InvalidArgument(f"input {tensor.name!r}: parameters.binary_data_size="
                                  f"{size!r} must be a non-negative integer", param=tensor.name)
        binary_total += size
        if binary_total > binary_size:
            raise InvalidArgument(f"input {tensor.name!r}: binary_data_size={size} is past the "
                                  f"end of the {binary_size} binary bytes sent",
                                  param=tensor.name)
    for output in model.outputs or []:
        flag = output.parameters.get("binary_data")
        if flag is not None and not isinstance(flag, bool):
            raise InvalidArgument(f"output {output.name!r}: parameters.binary_data={flag!r} "
                                  "must be true or false", param=output.name)
    flag = model.parameters.get("binary_data_output")
    if flag is not None and not isinstance(flag, bool):
        raise InvalidArgument(f"parameters.binary_data_output={flag!r} must be true or false",
                              param="binary_data_output")
    return model


def _check_parameters(label: str, parameters: dict[str, Any]) -> None:
    for key, value in parameters.items():
        if not isinstance(value, bool | int | float | str):
            raise InvalidArgument(f"{label}.{key} is {type_name(value)}; parameter values are "
                                  "booleans, numbers or strings", param=key)


def _invalid(exc: ValidationError, header: dict[str, Any]) -> InvalidArgument:
    """The first pydantic error as a 400 naming the field (and the tensor, by name)."""
    error = exc.errors(include_url=False)[0]
    loc = list(error["loc"])
    where, param = "", str(loc[-1]) if loc else None
    node: Any = header
    for part in loc:
        if isinstance(part, int):
            name = node[part].get("name") if isinstance(node, list) and \
                isinstance(node[part], dict) else None
            where += f"[{part}]" + (f" ({name!r})" if isinstance(name, str) else "")
            param = name if isinstance(name, str) else param
        else:
            where += f".{part}" if where else str(part)
        node = node[part] if isinstance(node, dict | list) and _has(node, part) else None
    if error["type"] == "extra_forbidden":
        return InvalidArgument(f"{where}: unknown field; the KServe v2 protocol does not "
                               "define it", param=str(loc[-1]))
    got = error.get("input")
    shown = repr(got) if not isinstance(got, dict | list) else type_name(got)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return InvalidArgument(f"{where or 'body'}: {error['msg']} (got {shown})", param=param)


def _has(node: Any, part: Any) -> bool:
    return part in node if isinstance(node, dict) else 0 <= part < len(node)


def check_generate_body(body: dict[str, Any]) -> None:
    """The generate extension's body: `parameters` an object, `id` a string."""
    parameters = body.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise InvalidArgument(f"'parameters' must be an object, got {type_name(parameters)}",
                              param="parameters")
    if not isinstance(body.get("id", ""), str):
        raise InvalidArgument(f"'id' must be a string, got {type_name(body['id'])}", param="id")


class RepositoryBody(_Strict):
    """The body of the repository extension's index, load and unload requests."""

    ready: StrictBool = False
    parameters: dict[str, Any] = Field(default_factory=dict)


def check_repository_body(body: dict[str, Any]) -> dict[str, Any]:
    """A repository request's body, its field types checked (the values: the handlers)."""
    try:
        RepositoryBody.model_validate(body)
    except ValidationError as exc:
        raise _invalid(exc, body) from None
    return body


# -- both protocols -------------------------------------------------------------------------------
def check_element_count(shapes: Any, limits: KServeLimits) -> None:
    """Every shape's element count, and their sum, within `max_elements`."""
    total = 0
    for name, shape in shapes:
        count = math.prod(shape)  # Python ints: [2**32, 2**32] is 2**64, not 0
        total += count
        if total > limits.max_elements:
            raise PayloadTooLarge(f"input {name!r}: shape {list(shape)} brings the request to "
                                  f"{total} elements, over the limit of {limits.max_elements} "
                                  "(--max-elements)", param=name)


_LEAF_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "BYTES": ((str,), "strings"), "BOOL": ((bool,), "true or false"),
    **{t: ((int,), "integers") for t in ("UINT8", "UINT16", "UINT32", "UINT64", "INT8",
                                          "INT16", "INT32", "INT64")},
    **{t: ((int, float), "numbers") for t in ("FP16", "FP32", "FP64")},
}


_EXACT_TYPES = {datatype: frozenset(kinds) for datatype, (kinds, _) in _LEAF_TYPES.items()}


def flat_data(name: str, datatype: str, data: Any, count: int) -> list[Any]:
    """JSON `data` (flat or nested, row-major) as a flat list of values of `datatype`."""
    kinds, described = _LEAF_TYPES[datatype]
    if isinstance(data, list) and len(data) == count and \
            set(map(type, data)) <= _EXACT_TYPES[datatype]:
        return data  # already flat and of the datatype: checked without a Python loop
    flat: list[Any] = []
    stack = [data] if isinstance(data, list) else [[data]]
    while stack:
        value = stack.pop()
        if not isinstance(value, list):
            if isinstance(value, bool) != (datatype == "BOOL") or not isinstance(value, kinds):
                raise InvalidArgument(f"input {name!r}: 'data' holds {type_name(value)} "
                                      f"({_short(value)}); {datatype} data must be {described}",
                                      param=name)
            flat.append(value)
            if len(flat) > count:
                break  # the shape check below names both counts
            continue
        stack.extend(reversed(value))
    if len(flat) != count:
        held = f"{len(flat)}" if not stack else f"more than {count}"
        raise InvalidArgument(f"input {name!r}: its shape holds {count} elements but 'data' "
                              f"holds {held}", param=name)
    return flat


def _short(value: Any) -> str:
    text = repr(value) if not isinstance(value, dict) else "an object"
    return text if len(text) <= 40 else text[:37] + "..."


# -- gRPC -----------------------------------------------------------------------------------------
def check_grpc_request(request: Any, limits: KServeLimits) -> None:
    """A ModelInferRequest's counts, datatypes, shapes and parameters (contents: the codec)."""
    for key in ("inputs", "outputs"):
        count = len(getattr(request, key))
        if count > limits.max_tensors:
            raise PayloadTooLarge(f"'{key}' lists {count} tensors, over the limit of "
                                  f"{limits.max_tensors} (--max-tensors)", param=key)
    for index, tensor in enumerate(request.inputs):
        label = f"inputs[{index}] ({tensor.name!r})"
        if not tensor.name:
            raise InvalidArgument(f"inputs[{index}] has no name", param="name")
        if tensor.datatype not in NUMPY_DTYPES:
            raise InvalidArgument(f"{label}.datatype {tensor.datatype!r} is not supported (use "
                                  f"one of {', '.join(NUMPY_DTYPES)})", param=tensor.name)
        if any(d < 0 for d in tensor.shape):
            raise InvalidArgument(f"{label}.shape {list(tensor.shape)} must be non-negative "
                                  "integers", param=tensor.name)
        _check_grpc_parameters(f"{label}.parameters", tensor.parameters)
    check_element_count(((t.name, list(t.shape)) for t in request.inputs), limits)
    for index, output in enumerate(request.outputs):
        if not output.name:
            raise InvalidArgument(f"outputs[{index}] has no name", param="name")
        _check_grpc_parameters(f"outputs[{index}] ({output.name!r}).parameters",
                               output.parameters)
    _check_grpc_parameters("parameters", request.parameters)


def _check_grpc_parameters(label: str, parameters: Any) -> None:
    for key, value in parameters.items():
        if value.WhichOneof("parameter_choice") is None:
            raise InvalidArgument(f"{label}[{key!r}] has no value; set bool_param, "
                                  "int64_param, double_param or string_param", param=key)


__all__ = ["InferHeader", "InputHeader", "OutputHeader", "check_element_count",
           "check_generate_body", "check_grpc_request", "check_infer_header",
           "check_repository_body", "flat_data", "header_length"]
