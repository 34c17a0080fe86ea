"""Every malformed gRPC ModelInferRequest is INVALID_ARGUMENT or RESOURCE_EXHAUSTED naming the
field (never INTERNAL), on ModelInfer and ModelStreamInfer, and the server then serves."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

from podium.examples.builders import synthetic_features
from tests.support.kserve_instance import LIMITS, LLM, Instance

ROW = synthetic_features(1, seed=1)
INT64_MAX = 2**63 - 1
INVALID, EXHAUSTED = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED
Request = service_pb2.ModelInferRequest


def bytes_element(value: bytes) -> bytes:
    return len(value).to_bytes(4, "little") + value


def xgb(datatype: str = "FP32", shape: list[int] | None = None, raw: bytes | None = None,
        **fields: Any) -> Request:
    request = Request(model_name="xgb-example", **fields)
    request.inputs.add(name="features", datatype=datatype, shape=shape or [1, 20])
    request.raw_input_contents.append(ROW.tobytes() if raw is None else raw)
    return request


def llm(text: bytes = b"Capital?", sampling: dict[str, Any] | None = None,
        **parameters: Any) -> Request:
    request = Request(model_name=LLM, id="bad")
    request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    request.raw_input_contents.append(bytes_element(text))
    if sampling is not None:
        request.inputs.add(name="sampling_parameters", datatype="BYTES", shape=[1])
        request.raw_input_contents.append(bytes_element(json.dumps(sampling).encode()))
    for key, value in parameters.items():
        request.parameters[key].int64_param = value
    return request


def typed_text(value: bytes) -> Request:
    request = Request(model_name=LLM)
    request.inputs.add(name="text_input", datatype="BYTES", shape=[1]).contents \
        .bytes_contents.append(value)
    return request


def too_many_inputs() -> Request:
    request = Request(model_name="xgb-example")
    for i in range(LIMITS.max_tensors + 1):
        request.inputs.add(name=f"f{i}", datatype="FP32", shape=[1])
    return request


def parameter_without_value() -> Request:
    request = xgb()
    request.parameters["flag"].SetInParent()  # an InferParameter with no value set
    return request


def deep_constraint() -> Request:
    request = llm()
    request.parameters["constraint"].string_param = "[" * 100_000
    return request


def requested_output_without_name() -> Request:
    request = xgb()
    request.outputs.add(name="")
    return request


# (build the request, expected code, words the details must contain)
CASES: dict[str, tuple[Callable[[], Request], grpc.StatusCode, list[str]]] = {
    "unknown-datatype": (lambda: xgb(datatype="FP8"), INVALID,
                         ["inputs[0] ('features').datatype 'FP8'", "FP32"]),
    "empty-datatype": (lambda: xgb(datatype=""), INVALID, ["datatype ''"]),
    "negative-dim": (lambda: xgb(shape=[-1, 20]), INVALID, ["shape [-1, 20]", "non-negative"]),
    "shape-2**32-x-2**32": (lambda: xgb(shape=[2**32, 2**32], raw=b""), EXHAUSTED,
                            ["18446744073709551616 elements", "--max-elements"]),
    "shape-int64-max": (lambda: xgb(shape=[INT64_MAX], raw=b""), EXHAUSTED,
                        ["--max-elements"]),
    "shape-vs-bytes": (lambda: xgb(shape=[3, 20]), INVALID, ["'features'", "240 bytes"]),
    "too-many-inputs": (too_many_inputs, EXHAUSTED, ["17 tensors", "--max-tensors"]),
    "input-without-name": (lambda: Request(model_name="xgb-example", inputs=[
        Request.InferInputTensor(datatype="FP32", shape=[1])]), INVALID, ["inputs[0] has no name"]),
    "output-without-name": (requested_output_without_name, INVALID, ["outputs[0] has no name"]),
    "parameter-without-value": (parameter_without_value, INVALID, ["'flag'", "has no value"]),
    "invalid-utf8-raw-text": (lambda: llm(text=b"\xff\xfe"), INVALID,
                              ["'text_input' is not UTF-8"]),
    "invalid-utf8-bytes-contents": (lambda: typed_text(b"caf\xc3"), INVALID,
                                    ["'text_input' is not UTF-8"]),
    "max-tokens-int64-sampling-tensor": (lambda: llm(sampling={"max_tokens": INT64_MAX}),
                                         INVALID, [f"max_tokens={INT64_MAX}", "context of 64"]),
    "max-tokens-int64-parameter": (lambda: llm(max_tokens=INT64_MAX), INVALID,
                                   [f"max_tokens={INT64_MAX}", "prompt uses 2"]),
    "max-tokens-zero": (lambda: llm(max_tokens=0), INVALID, ["max_tokens=0"]),
    "max-tokens-ten": (lambda: llm(sampling={"max_tokens": "ten"}), INVALID,
                       ["max_tokens='ten'"]),
    "prompt-past-context": (lambda: llm(text=b"w " * 70), INVALID, ["71 tokens", "context"]),
    "stop-token-id-out-of-vocab": (lambda: llm(sampling={"stop_token_ids": [10**6]}), INVALID,
                                   ["stop_token_ids", "1000000"]),
    "allowed-token-id-out-of-vocab": (lambda: llm(sampling={"allowed_token_ids": [1000]}),
                                      INVALID, ["allowed_token_ids", "0 to 999"]),
    "logprobs-21": (lambda: llm(sampling={"logprobs": 21}), INVALID, ["logprobs=21"]),
    "deep-constraint-parameter": (deep_constraint, INVALID, ["nests too deeply"]),
}


def _good(kserve_instance: Instance) -> None:
    client = grpcclient.InferenceServerClient(kserve_instance.grpc_url)
    tensor = grpcclient.InferInput("features", [1, 20], "FP32")
    tensor.set_data_from_numpy(ROW)
    assert client.infer("xgb-example", [tensor]).as_numpy("probability").shape == (1, 1)
    text = grpcclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"Capital?"], dtype=object))
    reply = client.infer(LLM, [text], parameters={"max_tokens": 2})
    assert reply.as_numpy("text_output")[0].decode().endswith("Paris is")


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_grpc_bad_request_then_good(kserve_instance: Instance, case: str) -> None:
    build, code, words = CASES[case]
    with grpc.insecure_channel(kserve_instance.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(build(), timeout=30)
    assert err.value.code() == code, err.value.details()
    for word in words:
        assert word in err.value.details(), err.value.details()
    _good(kserve_instance)


STREAM_CASES = ["unknown-datatype", "shape-2**32-x-2**32", "invalid-utf8-raw-text",
                "max-tokens-int64-parameter", "logprobs-21", "prompt-past-context"]


@pytest.mark.parametrize("case", STREAM_CASES, ids=STREAM_CASES)
def test_grpc_stream_bad_request_fails_alone(kserve_instance: Instance, case: str) -> None:
    """On ModelStreamInfer the bad request gets an error message, the next one its answer."""
    build, _, words = CASES[case]
    good = llm(max_tokens=2)
    good.id = "good"
    with grpc.insecure_channel(kserve_instance.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        replies = list(stub.ModelStreamInfer(iter([build(), good]), timeout=30))
    errors = [r.error_message for r in replies if r.error_message]
    assert len(errors) == 1 and all(w in errors[0] for w in words), errors
    answers = [r.infer_response for r in replies if not r.error_message]
    assert answers and answers[-1].id == "good", replies


def _raw_call(kserve_instance: Instance, payload: bytes, method: str = "ModelInfer"
              ) -> grpc.RpcError:
    with grpc.insecure_channel(kserve_instance.grpc_url) as channel:
        call = channel.unary_unary(f"/inference.GRPCInferenceService/{method}",
                                   request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as err:
            call(payload, timeout=30)
    return err.value


@pytest.mark.parametrize("payload", [b"\xff" * 16, b"\x0a\x05ab", b"\x0a\x02\xff\xfe"],
                         ids=["garbage", "truncated-field", "model-name-not-utf8"])
def test_grpc_undecodable_message_then_good(kserve_instance: Instance, payload: bytes) -> None:
    error = _raw_call(kserve_instance, payload)
    assert error.code() == INVALID, error.details()
    assert "not a valid protobuf message" in error.details()
    _good(kserve_instance)


def test_grpc_message_over_the_limit_then_good(kserve_instance: Instance) -> None:
    request = xgb(raw=b"\0" * (LIMITS.grpc_max_message_bytes + 1))
    with grpc.insecure_channel(kserve_instance.grpc_url, options=[
            ("grpc.max_send_message_length", -1)]) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(request, timeout=30)
    assert err.value.code() == EXHAUSTED, err.value.details()
    assert str(LIMITS.grpc_max_message_bytes) in err.value.details()
    _good(kserve_instance)


def test_grpc_undecodable_stream_message_serves_those_before(kserve_instance: Instance) -> None:
    """A garbled message ends the stream with INVALID_ARGUMENT; earlier requests answered."""
    good = llm(max_tokens=2)
    good.id = "first"

    def messages() -> Iterator[bytes]:
        yield good.SerializeToString()
        yield b"\xff" * 8

    with grpc.insecure_channel(kserve_instance.grpc_url) as channel:
        call = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer",
                                     request_serializer=None,
                                     response_deserializer=service_pb2.ModelStreamInferResponse
                                     .FromString)
        replies = call(messages(), timeout=30)
        received = []
        with pytest.raises(grpc.RpcError) as err:
            for reply in replies:
                received.append(reply)
    assert err.value.code() == INVALID and "not a valid protobuf" in err.value.details()
    assert [r.infer_response.id for r in received] == ["first"]
    _good(kserve_instance)


def test_grpc_load_with_deep_version_policy_then_good(kserve_instance: Instance) -> None:
    request = service_pb2.RepositoryModelLoadRequest(model_name="xgb-example")
    request.parameters["version_policy"].string_param = "[" * 100_000
    with grpc.insecure_channel(kserve_instance.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.RepositoryModelLoad(request, timeout=30)
    assert err.value.code() == INVALID, err.value.details()
    assert "'version_policy' nests JSON deeper" in err.value.details()
    _good(kserve_instance)


def test_grpc_load_with_a_policy_that_is_not_an_object_then_good(
        kserve_instance: Instance) -> None:
    request = service_pb2.RepositoryModelLoadRequest(model_name="xgb-example")
    request.parameters["version_policy"].string_param = '{"latest": 5}'
    with grpc.insecure_channel(kserve_instance.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.RepositoryModelLoad(request, timeout=30)
    assert err.value.code() == INVALID, err.value.details()
    assert "version_policy.latest=5 must be an object" in err.value.details()
    _good(kserve_instance)
