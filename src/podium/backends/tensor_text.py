"""Text and flags carried in request tensors (BYTES and BOOL of one element), and back."""

from __future__ import annotations

import numpy as np

from podium.backends.base import InferenceRequest, Tensor
from podium.errors import InvalidArgument


def read_text(request: InferenceRequest, name: str, *, required: bool) -> str:
    """The one UTF-8 string in input `name` ("" when absent and not required)."""
    tensor = request.inputs.get(name)
    if tensor is None:
        if required:
            raise InvalidArgument(f"input {name!r} is missing", param=name)
        return ""
    values = tensor.data.reshape(-1)
    if values.size != 1:
        raise InvalidArgument(f"input {name!r} must hold one string, got {values.size}",
                              param=name)
    return utf8_text(name, values[0])


def read_texts(request: InferenceRequest, name: str, *, what: str = "texts") -> list[str]:
    """Every string in input `name`, which must be present and non-empty."""
    tensor = request.inputs.get(name)
    if tensor is None:
        raise InvalidArgument(f"input {name!r} is missing; send BYTES [N] {what}", param=name)
    texts = [utf8_text(name, v) for v in tensor.data.reshape(-1)]
    if not texts:
        raise InvalidArgument(f"input {name!r} is empty; send at least one", param=name)
    return texts


def utf8_text(name: str, value: object) -> str:
    """One element of input `name` as text; 400 naming where it is not UTF-8."""
    try:
        return value.decode() if isinstance(value, bytes) else str(value)
    except UnicodeDecodeError as exc:
        raise InvalidArgument(f"input {name!r} is not UTF-8 text ({exc.reason} at byte "
                              f"{exc.start})", param=name) from None


def read_flag(request: InferenceRequest, name: str) -> bool:
    """The one BOOL in input `name` (False when absent)."""
    tensor = request.inputs.get(name)
    if tensor is None:
        return False
    values = tensor.data.reshape(-1)
    if values.size != 1:
        raise InvalidArgument(f"input {name!r} must hold one BOOL, got {values.size}",
                              param=name)
    return bool(values[0])


def text_tensor(name: str, texts: list[str]) -> Tensor:
    """A BYTES [N] tensor of UTF-8 strings."""
    data = np.empty(len(texts), dtype=object)
    data[:] = [t.encode() for t in texts]
    return Tensor(name, "BYTES", data)
