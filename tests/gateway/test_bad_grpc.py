"""Bad gRPC input at the gateway: a clear status, never UNKNOWN or INTERNAL, and it serves on."""

from __future__ import annotations

import random
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2

from podium.errors import InvalidArgument
from podium.gateway.wire import read_name_version
from tests.support.grpc_servers import GrpcFront, Instance, echo_table

MAX_MESSAGE = 1 << 20
INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"


def _good_request(version: str = "1", value: float = 1.5) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="echo", model_version=version, id="r1")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 1])
    request.raw_input_contents.append(np.array([[value]], dtype=np.float32).tobytes())
    return request


def _request_of(size: int) -> bytes:
    request = _good_request()
    request.raw_input_contents.append(b"\x00" * size)
    return request.SerializeToString()


GOOD = _good_request().SerializeToString()


class Front:
    """The gRPC gateway (1 MiB message limit) before both echo versions, and raw clients."""

    def __init__(self, instances: dict[str, Instance]) -> None:
        self.grpc = GrpcFront(echo_table(instances), max_message_bytes=MAX_MESSAGE)
        self.channel = grpc.insecure_channel(self.grpc.target, options=[
            ("grpc.max_send_message_length", -1)])
        self.infer = self.channel.unary_unary(INFER)
        self.stream = self.channel.stream_stream(STREAM)
        self.client = grpcclient.InferenceServerClient(self.grpc.target)

    def status_of(self, payload: bytes) -> tuple[grpc.StatusCode, str]:
        """The status a raw ModelInfer call with `payload` ends with."""
        try:
            self.infer(payload, timeout=10)
        except grpc.RpcError as exc:
            return exc.code(), exc.details() or ""
        return grpc.StatusCode.OK, ""

    def assert_serving(self) -> None:
        """A good request through the same gateway is answered by the model."""
        x = grpcclient.InferInput("x", [1, 1], "FP32")
        x.set_data_from_numpy(np.array([[1.5]], dtype=np.float32))
        result = self.client.infer("echo", [x], model_version="2")
        assert float(result.as_numpy("y")[0][0]) == 30.0

    def close(self) -> None:
        self.client.close()
        self.channel.close()
        self.grpc.stop()


@pytest.fixture(scope="module")
def front(echo_instances: dict[str, Instance]) -> Iterator[Front]:
    f = Front(echo_instances)
    yield f
    f.close()


def _with_name(raw: bytes) -> bytes:
    return b"\x0a" + bytes([len(raw)]) + raw


NOT_VALID = "the request is not a valid ModelInferRequest: "
BAD = {
    "truncated-message": (GOOD[:len(GOOD) // 2], grpc.StatusCode.INVALID_ARGUMENT,
                          (NOT_VALID, "truncated?")),
    "varint-running-off-the-end": (b"\x0a\xff", grpc.StatusCode.INVALID_ARGUMENT,
                                   (NOT_VALID, "field 1's length at byte 1 is a varint cut off")),
    "length-past-the-end": (b"\x0a\x10echo", grpc.StatusCode.INVALID_ARGUMENT,
                            (NOT_VALID, "field 1 declares 16 bytes at byte 2")),
    "11-byte-varint": (b"\x0a" + b"\xff" * 10 + b"\x01", grpc.StatusCode.INVALID_ARGUMENT,
                       (NOT_VALID, "longer than 10 bytes")),
    "random-garbage": (random.Random(7).randbytes(64), grpc.StatusCode.INVALID_ARGUMENT,
                       (NOT_VALID,)),
    "wrong-wire-type-for-field-1": (b"\x08\x05", grpc.StatusCode.INVALID_ARGUMENT,
                                    ("names no model (field 1)",)),
    "empty-message": (b"", grpc.StatusCode.INVALID_ARGUMENT, ("names no model (field 1)",)),
    "model-name-not-utf8": (_with_name(b"\xff\xfeecho"), grpc.StatusCode.INVALID_ARGUMENT,
                            (NOT_VALID, "field 1 (the model name) is not UTF-8")),
    "field-number-0": (b"\x02\x01a", grpc.StatusCode.INVALID_ARGUMENT,
                       (NOT_VALID, "field number 0")),
    "unterminated-group": (b"\x0b\x08\x01", grpc.StatusCode.INVALID_ARGUMENT,
                           (NOT_VALID, "is a group")),
    "wire-type-7": (b"\x0f", grpc.StatusCode.INVALID_ARGUMENT, (NOT_VALID, "wire type 7")),
    "garbled-tensor-inside": (GOOD.replace(b"FP32", b"\xff\xfe32"),
                              grpc.StatusCode.INVALID_ARGUMENT, (NOT_VALID, "a nested message")),
    "unknown-model": (_with_name(b"ghost"), grpc.StatusCode.NOT_FOUND, ("'ghost'",)),
    "message-over-the-limit": (_request_of(2 * MAX_MESSAGE), grpc.StatusCode.RESOURCE_EXHAUSTED,
                               ("larger than max", str(MAX_MESSAGE))),
}


@pytest.mark.parametrize("payload, code, says", BAD.values(), ids=BAD.keys())
def test_a_bad_message_gets_a_clear_status_and_the_gateway_serves_on(
        front: Front, payload: bytes, code: grpc.StatusCode, says: tuple[str, ...]) -> None:
    got, details = front.status_of(payload)
    assert got == code, details
    for words in says:
        assert words in details, details
    front.assert_serving()


@pytest.mark.parametrize("messages", [[b"\x0a\xff"], [GOOD, b"\x0a\x10echo"]],
                         ids=["bad-first-message", "bad-second-message"])
def test_a_bad_message_in_a_stream_ends_it_invalid_argument(front: Front,
                                                            messages: list[bytes]) -> None:
    answers = front.stream(iter(messages), timeout=10)
    with pytest.raises(grpc.RpcError) as caught:
        list(answers)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert NOT_VALID in (caught.value.details() or "")
    front.assert_serving()


def _mutated(data: st.DataObject, message: bytes) -> bytes:
    """`message` with a few bytes flipped, cut, inserted or deleted."""
    raw = bytearray(message)
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "cut", "insert", "delete"]))
        at = data.draw(st.integers(0, max(len(raw) - 1, 0)))
        if op == "flip" and raw:
            raw[at] ^= data.draw(st.integers(1, 255))
        elif op == "cut":
            del raw[at:]
        elif op == "insert":
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=4))
        elif raw:
            del raw[at]
    return bytes(raw)


def _read_or_refuse(payload: bytes) -> None:
    try:
        model, version = read_name_version(service_pb2.ModelInferRequest, payload)
    except InvalidArgument as exc:  # the one error it may raise, and it says why
        assert exc.message.startswith(NOT_VALID) and len(exc.message) > len(NOT_VALID)
        return
    assert isinstance(model, str) and (version is None or isinstance(version, str))


@settings(max_examples=1000, derandomize=True, database=None, deadline=None)
@given(st.binary(max_size=128))
def test_fuzz_reading_arbitrary_bytes_raises_only_the_clear_error(payload: bytes) -> None:
    _read_or_refuse(payload)


@settings(max_examples=600, derandomize=True, database=None, deadline=None)
@given(st.data())
def test_fuzz_reading_mutated_requests_raises_only_the_clear_error(data: st.DataObject) -> None:
    _read_or_refuse(_mutated(data, GOOD))


@settings(max_examples=300, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_fuzz_mutated_requests_through_the_gateway_never_fail_the_server(
        front: Front, data: st.DataObject) -> None:
    payload = _mutated(data, _good_request(data.draw(st.sampled_from(["1", "2", ""]))
                                           ).SerializeToString())
    code, details = front.status_of(payload)
    assert code not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL), details
    front.assert_serving()
