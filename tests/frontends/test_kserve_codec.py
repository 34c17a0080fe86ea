"""Wire tensors: raw bytes and JSON data round-trip for every datatype; bad data is named."""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from podium.backends.datatypes import NUMPY_DTYPES
from podium.errors import InvalidArgument
from podium.frontends import kserve_codec as codec

NUMERIC = [d for d in NUMPY_DTYPES if d != "BYTES"]


def sample(datatype: str) -> np.ndarray:
    if datatype == "BOOL":
        return np.array([[True, False, True], [False, False, True]])
    return (np.arange(6).reshape(2, 3) * 3).astype(NUMPY_DTYPES[datatype])


@pytest.mark.parametrize("datatype", NUMERIC)
def test_numeric_round_trips(datatype: str) -> None:
    array = sample(datatype)
    raw = codec.tensor_from_raw("t", datatype, [2, 3], array.tobytes())
    np.testing.assert_array_equal(raw.data, array)
    as_json = codec.tensor_from_json("t", datatype, [2, 3], array.tolist())
    np.testing.assert_array_equal(as_json.data, array)
    assert codec.tensor_to_raw(as_json) == array.astype(array.dtype.newbyteorder("<")).tobytes()
    assert codec.tensor_to_json(raw) == array.reshape(-1).tolist()


def test_bytes_match_tritonclients_serialization() -> None:
    values = np.array([b"", b"abc", "héllo".encode(), b"\x00\xff"], dtype=object)
    ours = codec.serialize_bytes(values)
    assert ours == serialize_byte_tensor(values).item()
    decoded = codec.tensor_from_raw("s", "BYTES", [2, 2], ours)
    assert decoded.data.reshape(-1).tolist() == values.tolist()
    np.testing.assert_array_equal(deserialize_bytes_tensor(codec.tensor_to_raw(decoded)),
                                  values)
    assert codec.tensor_to_json(decoded)[2] == "héllo"


def test_bytes_outputs_of_any_element_type_serialize_as_triton_does() -> None:
    # a Python backend may return numpy strings or numbers in a BYTES output
    for values in (np.array(["ab", "c"]), np.array([b"ab", 7, "c"], dtype=object),
                   np.array([], dtype=object)):
        assert codec.serialize_bytes(values) == (
            serialize_byte_tensor(values.astype(object)).item() if values.size else b"")
    assert codec.serialize_bytes(np.array([7], dtype=object)) == b"\x01\x00\x00\x007"


@pytest.mark.parametrize(("call", "words"), [
    (lambda: codec.tensor_from_raw("x", "FP32", [2], b"\x00" * 4), ["'x'", "8 bytes", "4"]),
    (lambda: codec.tensor_from_raw("x", "BYTES", [2], b"\x01\x00\x00\x00a"),
     ["'x'", "2 elements", "1 strings"]),
    (lambda: codec.tensor_from_raw("x", "BYTES", [1], b"\x01\x00"), ["length prefix"]),
    (lambda: codec.tensor_from_json("x", "INT32", [3], [1, 2]), ["3 elements", "holds 2"]),
    (lambda: codec.tensor_from_json("x", "INT32", [2], ["a", "b"]), ["INT32 values"]),
    (lambda: codec.tensor_from_json("x", "BF16", [1], [1.0]), ["'BF16' is not supported"]),
    (lambda: codec.tensor_from_json("x", "FP32", [-1], []), ["non-negative"]),
], ids=["raw-too-short", "bytes-count", "bytes-truncated-prefix", "json-count", "json-type",
        "bf16", "negative-shape"])
def test_bad_data_is_rejected_by_name(call, words: list[str]) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidArgument) as err:
        call()
    for word in words:
        assert word in err.value.message, err.value.message
