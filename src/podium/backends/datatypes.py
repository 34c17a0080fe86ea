"""KServe v2 datatypes and their numpy dtypes (BYTES tensors are object arrays of bytes),
as tritonclient maps them."""

from __future__ import annotations

import numpy as np
from tritonclient.utils import np_to_triton_dtype, triton_to_np_dtype

SERVED = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
          "FP16", "FP32", "FP64", "BYTES")
"""Every datatype Podium serves. BF16 is absent: numpy has no such dtype (tritonclient maps it
to ml_dtypes.bfloat16, which no backend here produces or takes)."""

NUMPY_DTYPES: dict[str, np.dtype] = {name: np.dtype(triton_to_np_dtype(name)) for name in SERVED}


def datatype_of(dtype: np.dtype) -> str | None:
    """The KServe datatype of a numpy dtype (object and string dtypes are BYTES), or None."""
    if dtype.kind in "OSU":  # tritonclient has no mapping for numpy's unicode strings
        return "BYTES"
    name = np_to_triton_dtype(np.dtype(dtype))
    return name if name in NUMPY_DTYPES else None
