"""KServe v2 tensors on the wire: datatypes, JSON data, raw bytes (binary extension, gRPC raw).

Both frontends turn wire tensors into `podium.backends.base.Tensor` here and back, so HTTP and
gRPC decode (and reject) the same things with the same messages.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from tritonclient.utils import serialize_byte_tensor

from podium.backends.base import Tensor
from podium.backends.datatypes import NUMPY_DTYPES
from podium.backends.datatypes import datatype_of as _datatype_of
from podium.errors import InvalidArgument


def datatype_of(array: np.ndarray) -> str:
    """The KServe datatype of a numpy array (object and string arrays are BYTES)."""
    datatype = _datatype_of(array.dtype)
    if datatype is None:
        raise InvalidArgument(f"numpy dtype {array.dtype} has no KServe datatype")
    return datatype


def numpy_dtype(datatype: str, *, name: str) -> np.dtype:
    """The numpy dtype for a wire datatype; the error names the tensor."""
    try:
        return NUMPY_DTYPES[datatype]
    except KeyError:
        known = ", ".join(NUMPY_DTYPES)
        raise InvalidArgument(f"input {name!r}: datatype {datatype!r} is not supported "
                              f"(use one of {known})", param=name) from None


def _num_elements(shape: Sequence[int], *, name: str) -> int:
    if any(not isinstance(d, int) or d < 0 for d in shape):
        raise InvalidArgument(f"input {name!r}: shape {list(shape)} must be non-negative "
                              "integers", param=name)
    return int(np.prod(shape, dtype=np.int64))


# -- raw bytes (binary extension and gRPC raw contents) ---------------------------------------
def tensor_from_raw(name: str, datatype: str, shape: Sequence[int], raw: bytes | memoryview
                    ) -> Tensor:
    """Decode raw little-endian bytes; BYTES elements are 4-byte length-prefixed."""
    count = _num_elements(shape, name=name)
    dtype = numpy_dtype(datatype, name=name)
    if datatype == "BYTES":
        items = _split_bytes(raw, name=name)
        if len(items) != count:
            raise InvalidArgument(f"input {name!r}: shape {list(shape)} holds {count} elements "
                                  f"but the data holds {len(items)} strings", param=name)
        array = np.empty(count, dtype=object)
        array[:] = items
        return Tensor(name, datatype, array.reshape(shape))
    expected = count * dtype.itemsize
    if len(raw) != expected:
        raise InvalidArgument(f"input {name!r}: shape {list(shape)} of {datatype} needs "
                              f"{expected} bytes but {len(raw)} were sent", param=name)
    array = np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(dtype, copy=False)
    return Tensor(name, datatype, array.reshape(shape))


def tensor_to_raw(tensor: Tensor) -> bytes:
    """Encode a tensor as raw bytes (row-major, little-endian)."""
    if tensor.datatype == "BYTES":
        return serialize_bytes(tensor.data)
    dtype = NUMPY_DTYPES[tensor.datatype].newbyteorder("<")
    return np.ascontiguousarray(tensor.data, dtype=dtype).tobytes()


def serialize_bytes(array: np.ndarray) -> bytes:
    """Triton's BYTES layout: each element as a uint32 length then its bytes (str as UTF-8)."""
    flat = np.asarray(array, dtype=object)  # tritonclient refuses numpy unicode arrays
    return serialize_byte_tensor(flat).item() if flat.size else b""


def _split_bytes(raw: bytes | memoryview, *, name: str) -> list[bytes]:
    # not tritonclient's deserialize_bytes_tensor: on a truncated or lying length prefix it
    # raises a bare struct.error, and a client's bad bytes deserve a message saying which
    view = memoryview(raw)
    items, offset = [], 0
    while offset < len(view):
        if offset + 4 > len(view):
            raise InvalidArgument(f"input {name!r}: BYTES data ends inside a length prefix",
                                  param=name)
        (length,) = struct.unpack_from("<I", view, offset)
        offset += 4
        if offset + length > len(view):
            raise InvalidArgument(f"input {name!r}: a BYTES element claims {length} bytes but "
                                  f"only {len(view) - offset} remain", param=name)
        items.append(bytes(view[offset:offset + length]))
        offset += length
    return items


# -- JSON data --------------------------------------------------------------------------------
def tensor_from_json(name: str, datatype: str, shape: Sequence[int], data: Any) -> Tensor:
    """Decode a JSON `data` list (flat or nested, row-major)."""
    count = _num_elements(shape, name=name)
    dtype = numpy_dtype(datatype, name=name)
    flat = list(_flatten(data))
    if len(flat) != count:
        raise InvalidArgument(f"input {name!r}: shape {list(shape)} holds {count} elements but "
                              f"'data' holds {len(flat)}", param=name)
    if datatype == "BYTES":
        array = np.empty(count, dtype=object)
        array[:] = [v.encode() if isinstance(v, str) else bytes(v) for v in flat]
    else:
        try:
            array = np.asarray(flat, dtype=dtype)
        except (TypeError, ValueError, OverflowError) as exc:
            raise InvalidArgument(f"input {name!r}: 'data' does not hold {datatype} values "
                                  f"({exc})", param=name) from None
    return Tensor(name, datatype, array.reshape(shape))


def tensor_to_json(tensor: Tensor) -> list[Any]:
    """A flat row-major JSON list; BYTES elements become UTF-8 strings."""
    flat = tensor.data.reshape(-1)
    if tensor.datatype == "BYTES":
        return [v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v)
                for v in flat]
    return flat.tolist()


def _flatten(data: Any) -> Iterable[Any]:
    if isinstance(data, list | tuple):
        for item in data:
            yield from _flatten(item)
    else:
        yield data
