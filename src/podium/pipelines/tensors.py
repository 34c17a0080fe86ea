"""Python values ↔ named tensors, at the pipeline's edges and around model calls."""

from __future__ import annotations

from typing import Any

import numpy as np

from podium.backends.base import Tensor
from podium.backends.datatypes import NUMPY_DTYPES, datatype_of
from podium.errors import InvalidArgument


def to_tensor(name: str, value: Any, datatype: str | None = None) -> Tensor:
    """A tensor of `value` (nested lists or a scalar); floats default to FP32, ints to INT64,
    strings to BYTES (UTF-8)."""
    array = np.asarray(value)
    if datatype is None:
        kind = array.dtype.kind
        datatype = ("FP32" if kind == "f" else "INT64" if kind in "iu" else "BOOL"
                    if kind == "b" else datatype_of(array.dtype))
    if datatype is None:
        raise InvalidArgument(f"input {name!r}: cannot send a {array.dtype} value; give "
                              "`datatypes` for it", param=name)
    if datatype == "BYTES":
        flat = [v if isinstance(v, bytes) else str(v).encode() for v in array.reshape(-1)]
        data = np.empty(len(flat), dtype=object)
        data[:] = flat
        return Tensor(name, datatype, data.reshape(array.shape))
    try:
        return Tensor(name, datatype, array.astype(NUMPY_DTYPES[datatype]))
    except (KeyError, ValueError, TypeError) as exc:
        raise InvalidArgument(f"input {name!r}: {value!r} is not {datatype} ({exc})",
                              param=name) from None


def to_value(tensor: Tensor) -> Any:
    """A tensor as nested lists (BYTES as text)."""
    if tensor.datatype == "BYTES":
        flat = [v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v)
                for v in tensor.data.reshape(-1)]
        return np.array(flat, dtype=object).reshape(tensor.data.shape).tolist()
    return tensor.data.tolist()


def scalar(value: Any) -> Any:
    """A one-element input (`[\"42\"]`, `[[7]]`) as its element; other values as they are."""
    while isinstance(value, list) and len(value) == 1:
        value = value[0]
    return value
