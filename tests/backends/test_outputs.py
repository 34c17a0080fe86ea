"""check_outputs / to_output_array: what a model may answer, and what each violation says."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from podium.backends.base import InferenceResponse, Tensor
from podium.backends.outputs import check_outputs, to_output_array
from podium.errors import BackendError
from podium.package.manifest import TensorSpec

SCORE = TensorSpec(name="score", datatype="FP32", shape=[-1, 1])
COUNT = TensorSpec(name="count", datatype="INT32", shape=[2])
LABEL = TensorSpec(name="label", datatype="BYTES", shape=[1])


# id: (spec, value returned by the model, words of the error)
BAD_VALUES: dict[str, tuple[TensorSpec, Any, list[str]]] = {
    "none": (SCORE, None, ["m@1", "'score'", "is None", "FP32"]),
    "dict": (SCORE, {"a": 1.0}, ["'score'", "a dict"]),
    "str-for-fp32": (SCORE, "high", ["'score'", "str", "not FP32"]),
    "str-list-for-fp32": (SCORE, [["1.0"]], ["'score'", "str"]),
    "ragged": (SCORE, [[1.0], [2.0, 3.0]], ["'score'", "rectangular"]),
    "float-for-int32": (COUNT, np.array([0.5, 1.5]), ["'count'", "float64", "INT32"]),
    "complex-for-fp32": (SCORE, np.array([[1j]]), ["'score'", "complex128"]),
    "objects-for-fp32": (SCORE, np.array([[object()]], dtype=object), ["'score'", "object"]),
    "single-bytes": (LABEL, b"ok", ["'label'", "single bytes", "array"]),
    "int-in-bytes": (LABEL, [3], ["'label'", "int"]),
    "none-in-bytes": (LABEL, np.array([None], dtype=object), ["'label'", "NoneType"]),
}


@pytest.mark.parametrize("row", list(BAD_VALUES), ids=list(BAD_VALUES))
def test_a_value_that_is_not_the_declared_datatype_is_named(row: str) -> None:
    spec, value, words = BAD_VALUES[row]
    with pytest.raises(BackendError) as err:
        to_output_array(value, spec, package="m@1")
    for word in words:
        assert word in str(err.value), str(err.value)


@pytest.mark.parametrize(("spec", "value", "dtype"), [
    (SCORE, [[0.5]], np.float32),
    (SCORE, np.array([[1]], dtype=np.int64), np.float32),
    (SCORE, np.array([[np.nan]]), np.float32),
    (SCORE, np.array([[True]]), np.float32),
    (COUNT, [1, 2], np.int32),
    (COUNT, np.array([1, 2], dtype=np.uint64), np.int32),
    (LABEL, ["ok"], object),
    (LABEL, np.array([b"ok"], dtype=object), object),
], ids=["list", "int-to-float", "nan", "bool-to-float", "ints", "uint-to-int", "str", "bytes"])
def test_numbers_convert_within_their_kind_or_upwards(spec: TensorSpec, value: Any,
                                                      dtype: type) -> None:
    assert to_output_array(value, spec, package="m@1").dtype == np.dtype(dtype)


def _response(*tensors: tuple[str, str, np.ndarray]) -> InferenceResponse:
    return InferenceResponse(outputs=[Tensor(n, d, a) for n, d, a in tensors])


GOOD_SCORE = ("score", "FP32", np.zeros((2, 1), dtype=np.float32))
GOOD_COUNT = ("count", "INT32", np.zeros(2, dtype=np.int32))

# id: (response, max_batch_size, request batch size, complete, words of the error)
BAD_RESPONSES: dict[str, tuple[InferenceResponse, int, int | None, bool, list[str]]] = {
    "unknown-output": (_response(GOOD_SCORE, ("scores", "FP32", np.zeros((2, 1), np.float32))),
                       0, None, False, ["m@1", "'scores'", "not declare", "score, count"]),
    "output-twice": (_response(GOOD_SCORE, GOOD_SCORE), 0, None, False, ["'score' twice"]),
    "datatype-label": (_response(("score", "FP64", np.zeros((2, 1)))), 0, None, False,
                       ["'score'", "FP64", "declares FP32"]),
    "dtype-behind-label": (_response(("score", "FP32", np.zeros((2, 1)))), 0, None, False,
                           ["'score'", "float64"]),
    "not-an-array": (_response(("score", "FP32", [[0.0]])), 0, None, False,
                     ["'score'", "list"]),
    "wrong-rank": (_response(("score", "FP32", np.zeros(3, np.float32))), 0, None, False,
                   ["'score'", "shape [3]", "expected [-1, 1]"]),
    "wrong-fixed-dim": (_response(("score", "FP32", np.zeros((2, 2), np.float32))), 0, None,
                        False, ["'score'", "shape [2, 2]"]),
    "batch-dim-missing": (_response(("count", "INT32", np.zeros(2, np.int32))), 8, 2, False,
                          ["'count'", "shape [2]", "expected [2, 2]"]),
    "batch-size-differs": (_response(("count", "INT32", np.zeros((3, 2), np.int32))), 8, 2,
                           False, ["'count'", "shape [3, 2]", "expected [2, 2]"]),
    "missing-when-complete": (_response(GOOD_SCORE), 0, None, True,
                              ["m@1", "without output 'count'", "INT32"]),
}


@pytest.mark.parametrize("row", list(BAD_RESPONSES), ids=list(BAD_RESPONSES))
def test_a_response_off_its_declaration_is_named(row: str) -> None:
    response, max_batch_size, batch_size, complete, words = BAD_RESPONSES[row]
    with pytest.raises(BackendError) as err:
        check_outputs(response, [SCORE, COUNT], max_batch_size, package="m@1",
                      batch_size=batch_size, complete=complete)
    for word in words:
        assert word in str(err.value), str(err.value)


def test_a_response_with_some_outputs_passes_unless_complete_is_asked() -> None:
    # a decoupled LLM part carries only its mode's outputs
    check_outputs(_response(GOOD_SCORE), [SCORE, COUNT], 0, package="m@1")
    check_outputs(_response(GOOD_SCORE, GOOD_COUNT), [SCORE, COUNT], 0, package="m@1",
                  complete=True)
    batched = _response(("count", "INT32", np.zeros((2, 2), np.int32)))
    check_outputs(batched, [COUNT], 8, package="m@1", batch_size=2, complete=True)
