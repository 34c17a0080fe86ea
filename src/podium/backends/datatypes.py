"""KServe v2 datatypes and their numpy dtypes (BYTES tensors are object arrays of bytes)."""

from __future__ import annotations

import numpy as np

NUMPY_DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}
"""Every datatype Podium serves. BF16 is absent: numpy has no such dtype."""

_DATATYPE_OF_DTYPE = {dtype: name for name, dtype in NUMPY_DTYPES.items() if name != "BYTES"}


def datatype_of(dtype: np.dtype) -> str | None:
    """The KServe datatype of a numpy dtype (object and string dtypes are BYTES), or None."""
    if dtype.kind in "OSU":
        return "BYTES"
    return _DATATYPE_OF_DTYPE.get(np.dtype(dtype))
