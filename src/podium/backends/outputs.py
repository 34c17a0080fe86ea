"""Checks of a model's answer against its declared outputs: names, datatypes, shapes.

A model that answers wrongly is the model's fault, not the client's: every violation is a
`BackendError` (500) naming the package, the output, what was declared and what came back,
never a 200 carrying the wrong shape. `to_output_array` converts what a model's own code
returned (a python model's `execute`, a classic model's prediction) to the declared datatype;
`check_outputs` checks a finished `InferenceResponse`, whichever backend produced it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from podium.backends.base import InferenceResponse
from podium.backends.datatypes import NUMPY_DTYPES
from podium.backends.validation import expected_shape
from podium.errors import BackendError
from podium.package.manifest import TensorSpec


def to_output_array(value: Any, spec: TensorSpec, *, package: str) -> np.ndarray:
    """`value` as an array of the declared datatype, or a BackendError saying why it is not."""
    if value is None or isinstance(value, Mapping):
        raise _violation(package, spec, f"is {_kind_of(value)}, not {spec.datatype} data")
    if spec.datatype == "BYTES":
        return _to_bytes_array(value, spec, package)
    try:
        array = np.asarray(value)
    except ValueError as exc:  # ragged nested lists
        raise _violation(package, spec, f"is not a rectangular array ({exc})") from exc
    if not _casts_to(array.dtype, NUMPY_DTYPES[spec.datatype]):
        found = _element_kind(array)
        raise _violation(package, spec, f"holds {found} values, which are not {spec.datatype}")
    return array.astype(NUMPY_DTYPES[spec.datatype], copy=False)


def check_outputs(response: InferenceResponse, specs: Sequence[TensorSpec], max_batch_size: int,
                  *, package: str, batch_size: int | None = None,
                  complete: bool = False) -> None:
    """Reject unknown, repeated, mistyped or misshapen outputs (and missing ones if
    `complete`); with batching, each output's first dimension is the request's batch size."""
    by_name = {spec.name: spec for spec in specs}
    seen: set[str] = set()
    for tensor in response.outputs:
        spec = by_name.get(tensor.name)
        if spec is None:
            raise BackendError(f"{package} answered with output {tensor.name!r}, which it does "
                               f"not declare (outputs: {', '.join(by_name) or 'none'})")
        if tensor.name in seen:
            raise BackendError(f"{package} answered with output {tensor.name!r} twice")
        seen.add(tensor.name)
        if tensor.datatype != spec.datatype or not isinstance(tensor.data, np.ndarray) or (
                tensor.data.dtype != NUMPY_DTYPES[spec.datatype]):
            found = getattr(tensor.data, "dtype", type(tensor.data).__name__)
            raise _violation(package, spec, f"came back as {tensor.datatype} ({found})",
                             max_batch_size)
        expected = expected_shape(spec, max_batch_size)
        if max_batch_size > 0 and batch_size is not None:
            expected = [batch_size, *expected[1:]]
        shape = list(tensor.data.shape)
        if len(shape) != len(expected) or any(e not in (-1, s)
                                              for s, e in zip(shape, expected, strict=True)):
            raise _violation(package, spec, f"has shape {shape}, expected {expected} (-1: any "
                             "size)", max_batch_size)
    missing = [name for name in by_name if name not in seen]
    if complete and missing:
        raise BackendError(f"{package} answered without output {missing[0]!r} (declared "
                           f"{by_name[missing[0]].datatype} {by_name[missing[0]].shape})")


def _to_bytes_array(value: Any, spec: TensorSpec, package: str) -> np.ndarray:
    if isinstance(value, str | bytes):
        raise _violation(package, spec, f"is a single {type(value).__name__}; return an array "
                         "of them (e.g. np.array([b'...'], dtype=object))")
    try:
        array = np.asarray(value, dtype=object)
    except ValueError as exc:
        raise _violation(package, spec, f"is not a rectangular array ({exc})") from exc
    for item in array.flat:
        if not isinstance(item, bytes | str | np.bytes_ | np.str_):
            raise _violation(package, spec, f"holds a {type(item).__name__} ({item!r}); BYTES "
                             "elements are bytes or str")
    return array


def _casts_to(found: np.dtype, declared: np.dtype) -> bool:
    """Numbers convert within their kind (float64 → FP32, int64 → UINT8) or upwards (bool →
    any number, int → float); never str, objects or float → int."""
    if found.kind not in "biuf":
        return False
    order = {"b": 0, "i": 1, "u": 1, "f": 2}
    return order[found.kind] <= order[declared.kind]


def _element_kind(array: np.ndarray) -> str:
    if array.dtype.kind == "O" and array.size:
        return type(array.flat[0]).__name__
    return {"U": "str", "S": "bytes"}.get(array.dtype.kind, str(array.dtype))


def _kind_of(value: Any) -> str:
    return "None" if value is None else f"a {type(value).__name__}"


def _violation(package: str, spec: TensorSpec, problem: str, max_batch_size: int = 0
               ) -> BackendError:
    declared = expected_shape(spec, max_batch_size)
    return BackendError(f"{package}: output {spec.name!r} {problem}; the model declares "
                        f"{spec.datatype} {declared}")
