"""Bad requests get Triton-style errors naming the problem, and the next request is served."""

from __future__ import annotations

import json
from collections.abc import Callable

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

from podium.examples.builders import synthetic_features
from tests.support.kserve_instance import LLM, Instance

ROW = synthetic_features(1, seed=1)


def _binary_body(header: dict, raw: bytes) -> tuple[bytes, dict[str, str]]:
    text = json.dumps(header).encode()
    return text + raw, {"Inference-Header-Content-Length": str(len(text)),
                        "Content-Type": "application/octet-stream"}


def _features(shape: list[int], datatype: str = "FP32", raw: bytes | None = None) -> dict:
    size = len(raw) if raw is not None else 0
    return {"name": "features", "datatype": datatype, "shape": shape,
            "parameters": {"binary_data_size": size}}


# (path, json body or (raw body, headers), expected status, words the error must contain)
HTTP_CASES: dict[str, tuple[str, object, int, list[str]]] = {
    "unknown-model": ("/v2/models/nope/infer", {"inputs": []}, 404, ["nope"]),
    "unknown-version": ("/v2/models/xgb-example/versions/9/infer", {"inputs": []}, 404,
                        ["version '9'"]),
    "wrong-datatype": ("/v2/models/xgb-example/infer", {"inputs": [
        {"name": "features", "datatype": "FP64", "shape": [1, 20],
         "data": ROW.astype(float).ravel().tolist()}]}, 400, ["'features'", "FP64", "FP32"]),
    "wrong-shape": ("/v2/models/xgb-example/infer", {"inputs": [
        {"name": "features", "datatype": "FP32", "shape": [1, 19],
         "data": ROW.ravel()[:19].tolist()}]}, 400, ["'features'", "[1, 19]"]),
    "shape-vs-bytes": ("/v2/models/xgb-example/infer",
                       _binary_body({"inputs": [_features([2, 20], raw=ROW.tobytes())]},
                                    ROW.tobytes()), 400, ["'features'", "160 bytes", "80"]),
    "shape-vs-json-data": ("/v2/models/xgb-example/infer", {"inputs": [
        {"name": "features", "datatype": "FP32", "shape": [2, 20],
         "data": ROW.ravel().tolist()}]}, 400, ["'features'", "40 elements", "20"]),
    "missing-input": ("/v2/models/xgb-example/infer", {"inputs": []}, 400,
                      ["'features' is missing"]),
    "unknown-input": ("/v2/models/xgb-example/infer", {"inputs": [
        {"name": "feature", "datatype": "FP32", "shape": [1, 20],
         "data": ROW.ravel().tolist()}]}, 400, ["unexpected input 'feature'"]),
    "binary-header-past-body": ("/v2/models/xgb-example/infer",
                                (b'{"inputs": []}', {"Inference-Header-Content-Length": "9999"}),
                                400, ["9999", "past the end"]),
    "binary-size-past-body": ("/v2/models/xgb-example/infer",
                              _binary_body({"inputs": [{**_features([1, 20]), "parameters":
                                                        {"binary_data_size": 4000}}]},
                                           ROW.tobytes()), 400, ["binary_data_size=4000"]),
    "not-json": ("/v2/models/xgb-example/infer", (b"{nope", {}), 400, ["not valid JSON"]),
    "empty-batch": ("/v2/models/xgb-example/infer", {"inputs": [
        {"name": "features", "datatype": "FP32", "shape": [0, 20], "data": []}]}, 400,
                    ["'features'", "[0, 20]", "empty batch"]),
    "empty-batch-ensemble": ("/v2/models/python-example/infer", {"inputs": [
        {"name": "features", "datatype": "FP32", "shape": [0, 20], "data": []}]}, 400,
                             ["'features'", "[0, 20]", "empty batch"]),
    "batch-over-max": ("/v2/models/torch-example/infer", {"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [33, 4], "data": [0.0] * 132}]}, 400,
                       ["batch size 33", "max_batch_size of 32"]),
    "unknown-output": ("/v2/models/xgb-example/infer", {"inputs": [
        {"name": "features", "datatype": "FP32", "shape": [1, 20], "data": ROW.ravel().tolist()}],
        "outputs": [{"name": "proba"}]}, 400, ["'proba'"]),
    "malformed-sampling-parameters": (f"/v2/models/{LLM}/infer", {"inputs": [
        {"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["hi"]},
        {"name": "sampling_parameters", "datatype": "BYTES", "shape": [1],
         "data": ['{"max_tokens": 4']}]}, 400, ["sampling_parameters is not valid JSON"]),
    "unknown-sampling-parameter": (f"/v2/models/{LLM}/generate", {
        "text_input": "hi", "parameters": {"max_tokenz": 4}}, 400, ["'max_tokenz'"]),
    "podium-owned-sampling-parameter": (f"/v2/models/{LLM}/generate", {
        "text_input": "hi", "parameters": {"extra_args": {"x": 1}}}, 400,
        ["'extra_args' is set by Podium", "'constraint'"]),
    "sampling-list-element-wrong-type": (f"/v2/models/{LLM}/generate", {
        "text_input": "hi", "parameters": {"stop_token_ids": "[1, \"x\"]"}}, 400,
        ["stop_token_ids=", "a list"]),
    "stream-over-infer": (f"/v2/models/{LLM}/infer", {"inputs": [
        {"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["hi"]},
        {"name": "stream", "datatype": "BOOL", "shape": [1], "data": [True]}]}, 400,
        ["generate_stream"]),
    "generate-unknown-field": (f"/v2/models/{LLM}/generate_stream",
                               {"text": "hi"}, 400, ["'text'"]),
    "load-unknown-model": ("/v2/repository/models/nope/load", {}, 404, ["nope"]),
    "load-bad-policy": ("/v2/repository/models/xgb-example/load", {"parameters": {
        "version_policy": {"latest": {"num_versions": 0}}}}, 400, ["num_versions=0"]),
    "load-policy-not-object": ("/v2/repository/models/xgb-example/load", {"parameters": {
        "version_policy": {"latest": 5}}}, 400, ["version_policy.latest=5", "an object"]),
}


def _good_http(kserve_instance: Instance) -> None:
    reply = httpx.post(f"http://{kserve_instance.http_url}/v2/models/xgb-example/infer", json={
        "inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 20],
                    "data": ROW.ravel().tolist()}]})
    assert reply.status_code == 200, reply.text
    assert reply.json()["outputs"][0]["shape"] == [1, 1]


@pytest.mark.parametrize("case", list(HTTP_CASES), ids=list(HTTP_CASES))
def test_http_bad_input_then_good(kserve_instance: Instance, case: str) -> None:
    path, body, status, words = HTTP_CASES[case]
    url = f"http://{kserve_instance.http_url}{path}"
    if isinstance(body, tuple):
        raw, headers = body
        reply = httpx.post(url, content=raw, headers=headers)
    else:
        reply = httpx.post(url, json=body)
    assert reply.status_code == status, reply.text
    message = reply.json()["error"]
    for word in words:
        assert word in message, message
    _good_http(kserve_instance)


def _raw_request(model: str, inputs: list[tuple[str, str, list[int]]], raw: list[bytes],
                 version: str = "") -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    for name, datatype, shape in inputs:
        request.inputs.add(name=name, datatype=datatype, shape=shape)
    request.raw_input_contents.extend(raw)
    return request


def _sampling_request(text: str) -> service_pb2.ModelInferRequest:
    return _raw_request(LLM, [("text_input", "BYTES", [1]), ("sampling_parameters", "BYTES", [1])],
                        [_bytes_tensor(b"hi"), _bytes_tensor(text.encode())])


def _bytes_tensor(value: bytes) -> bytes:
    return len(value).to_bytes(4, "little") + value


GRPC_CASES: dict[str, tuple[Callable[[], service_pb2.ModelInferRequest], grpc.StatusCode,
                            list[str]]] = {
    "unknown-model": (lambda: _raw_request("nope", [], []), grpc.StatusCode.NOT_FOUND, ["nope"]),
    "unknown-version": (lambda: _raw_request("xgb-example", [], [], version="7"),
                        grpc.StatusCode.NOT_FOUND, ["version '7'"]),
    "wrong-datatype": (lambda: _raw_request("xgb-example", [("features", "FP64", [1, 20])],
                                            [ROW.astype(np.float64).tobytes()]),
                       grpc.StatusCode.INVALID_ARGUMENT, ["'features'", "FP64"]),
    "wrong-shape": (lambda: _raw_request("xgb-example", [("features", "FP32", [2, 10])],
                                         [ROW.tobytes()]),
                    grpc.StatusCode.INVALID_ARGUMENT, ["'features'", "[2, 10]"]),
    "shape-vs-bytes": (lambda: _raw_request("xgb-example", [("features", "FP32", [3, 20])],
                                            [ROW.tobytes()]),
                       grpc.StatusCode.INVALID_ARGUMENT, ["'features'", "240 bytes"]),
    "empty-batch": (lambda: _raw_request("xgb-example", [("features", "FP32", [0, 20])], [b""]),
                    grpc.StatusCode.INVALID_ARGUMENT, ["'features'", "[0, 20]", "empty batch"]),
    "missing-input": (lambda: _raw_request("xgb-example", [], []),
                      grpc.StatusCode.INVALID_ARGUMENT, ["'features' is missing"]),
    "raw-count-mismatch": (lambda: _raw_request("xgb-example", [("features", "FP32", [1, 20])],
                                                [ROW.tobytes(), b""]),
                           grpc.StatusCode.INVALID_ARGUMENT, ["raw_input_contents"]),
    "malformed-sampling-parameters": (lambda: _sampling_request("{not json"),
                                      grpc.StatusCode.INVALID_ARGUMENT,
                                      ["sampling_parameters is not valid JSON"]),
    "bytes-length-past-end": (lambda: _raw_request(LLM, [("text_input", "BYTES", [1])],
                                                   [(50).to_bytes(4, "little") + b"hi"]),
                              grpc.StatusCode.INVALID_ARGUMENT, ["claims 50 bytes"]),
}


@pytest.mark.parametrize("case", list(GRPC_CASES), ids=list(GRPC_CASES))
def test_grpc_bad_input_then_good(kserve_instance: Instance, case: str) -> None:
    build, code, words = GRPC_CASES[case]
    with grpc.insecure_channel(kserve_instance.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(build())
    assert err.value.code() == code
    for word in words:
        assert word in err.value.details(), err.value.details()
    client = grpcclient.InferenceServerClient(kserve_instance.grpc_url)
    tensor = grpcclient.InferInput("features", [1, 20], "FP32")
    tensor.set_data_from_numpy(ROW)
    assert client.infer("xgb-example", [tensor]).as_numpy("probability").shape == (1, 1)
