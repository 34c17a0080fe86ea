"""Property-based fuzzing of the KServe edges: random and garbled HTTP JSON / binary bodies and
gRPC ModelInferRequests never get a server error, and the server answers a good request after
each one. Seeds are fixed (derandomize) and example counts bounded (100 per test, ~30 s for
the file on two cores), so a run is repeatable."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2, service_pb2_grpc

from podium.examples.builders import synthetic_features
from tests.support.kserve_instance import LLM, Instance

ROW = synthetic_features(1, seed=1).ravel().tolist()
MODELS = ["xgb-example", "python-example", LLM, "nope"]
DATATYPES = ["FP32", "FP64", "INT64", "BYTES", "BOOL", "UINT8", "FP16", "fp32", "", "FP8"]
NAMES = ["features", "text_input", "sampling_parameters", "stream", "context", "candidates",
         "x", ""]
SAMPLING = ["max_tokens", "temperature", "n", "stop", "stop_token_ids", "logprobs", "top_k",
            "allowed_token_ids", "min_tokens", "seed", "bogus"]
FUZZ = settings(derandomize=True, max_examples=100, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])

scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
                    st.floats(allow_nan=True), st.text(max_size=8))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=4),
                           max_leaves=12)
dims = st.one_of(st.integers(min_value=-3, max_value=25), st.sampled_from([2**32, 2**63, 2**64]),
                 json_values)
sampling = st.dictionaries(st.sampled_from(SAMPLING), json_values, max_size=3)


@st.composite
def input_entries(draw: st.DrawFn) -> Any:
    entry: dict[str, Any] = {"name": draw(st.sampled_from(NAMES) | json_values),
                             "datatype": draw(st.sampled_from(DATATYPES) | json_values),
                             "shape": draw(st.lists(dims, max_size=3) | json_values)}
    if draw(st.booleans()):
        entry["data"] = draw(st.sampled_from([ROW, ["hi"], [True], []]) | json_values)
    if draw(st.booleans()):
        entry["parameters"] = draw(st.dictionaries(
            st.sampled_from(["binary_data_size", "x"]), json_values, max_size=2) | json_values)
    if draw(st.booleans()):
        entry["data"] = [json.dumps(draw(sampling))]
    return draw(st.sampled_from([entry, draw(json_values)]) if draw(st.booleans()) else
                st.just(entry))


infer_bodies = st.fixed_dictionaries({"inputs": st.lists(input_entries(), max_size=3)},
                                     optional={"parameters": st.dictionaries(
                                         st.text(max_size=5), json_values, max_size=3)
                                         | json_values,
                                         "outputs": st.lists(json_values, max_size=2),
                                         "id": json_values})
generate_bodies = st.fixed_dictionaries({}, optional={
    "text_input": json_values, "parameters": sampling | json_values, "stream": json_values,
    "id": json_values})


@pytest.fixture(scope="module")
def http(kserve_instance: Instance) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://{kserve_instance.http_url}", timeout=30) as client:
        yield client


def _http_ok(http: httpx.Client, reply: httpx.Response) -> None:
    assert reply.status_code < 500, reply.text
    if reply.status_code >= 400:
        assert reply.json()["error"], reply.text
    good = http.post("/v2/models/xgb-example/infer", json={"inputs": [
        {"name": "features", "datatype": "FP32", "shape": [1, 20], "data": ROW}]})
    assert good.status_code == 200, good.text


@FUZZ
@given(model=st.sampled_from(MODELS), body=infer_bodies)
def test_fuzz_http_infer_json(http: httpx.Client, model: str, body: dict[str, Any]) -> None:
    reply = http.post(f"/v2/models/{model}/infer", content=json.dumps(body).encode(),
                      headers={"Content-Type": "application/json"})
    _http_ok(http, reply)


@FUZZ
@given(route=st.sampled_from(["generate", "generate_stream"]), body=generate_bodies)
def test_fuzz_http_generate(http: httpx.Client, route: str, body: dict[str, Any]) -> None:
    reply = http.post(f"/v2/models/{LLM}/{route}", content=json.dumps(body).encode())
    if route == "generate_stream" and reply.status_code == 200:
        assert "internal error" not in reply.text, reply.text
    _http_ok(http, reply)


@FUZZ
@given(model=st.sampled_from(MODELS), body=infer_bodies, tail=st.binary(max_size=64),
       length=st.one_of(st.none(), st.integers(-5, 400).map(str), st.text(
           st.characters(max_codepoint=255, exclude_categories=("Cc",)), max_size=4)))
def test_fuzz_http_infer_binary(http: httpx.Client, model: str, body: dict[str, Any],
                                tail: bytes, length: str | None) -> None:
    header = json.dumps(body).encode()
    value = length if length is not None else str(len(header))
    headers = {"Inference-Header-Content-Length": value.strip().encode("latin-1")}
    reply = http.post(f"/v2/models/{model}/infer", content=header + tail, headers=headers)
    _http_ok(http, reply)


@FUZZ
@given(body=st.binary(max_size=200), encoding=st.sampled_from(["", "gzip", "deflate"]))
def test_fuzz_http_garbled_body(http: httpx.Client, body: bytes, encoding: str) -> None:
    headers = {"Content-Encoding": encoding} if encoding else {}
    _http_ok(http, http.post("/v2/models/xgb-example/infer", content=body, headers=headers))


@FUZZ
@given(route=st.sampled_from(["/v2/repository/index", "/v2/repository/models/nope/load",
                              "/v2/repository/models/nope/unload",
                              f"/v2/models/{LLM}/score"]),
       body=st.dictionaries(st.sampled_from(["ready", "parameters", "context", "candidates",
                                             "id", "x"]), json_values, max_size=3))
def test_fuzz_http_other_routes(http: httpx.Client, route: str, body: dict[str, Any]) -> None:
    _http_ok(http, http.post(route, content=json.dumps(body).encode()))


# -- gRPC ------------------------------------------------------------------------------------
int64s = st.integers(min_value=-2**63, max_value=2**63 - 1)


@st.composite
def grpc_requests(draw: st.DrawFn) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=draw(st.sampled_from(MODELS)),
                                            id=draw(st.text(max_size=4)))
    raw = draw(st.booleans())
    for _ in range(draw(st.integers(0, 3))):
        tensor = request.inputs.add(name=draw(st.sampled_from(NAMES)),
                                    datatype=draw(st.sampled_from(DATATYPES)),
                                    shape=draw(st.lists(st.one_of(st.integers(-2, 25), int64s),
                                                        max_size=3)))
        if raw:
            request.raw_input_contents.append(draw(st.sampled_from([
                b"", (8).to_bytes(4, "little") + b"Capital?", b"\xff" * 5]) | st.binary(
                    max_size=90)))
        else:
            contents = tensor.contents
            contents.fp32_contents.extend(draw(st.lists(st.floats(width=32), max_size=25)))
            contents.bytes_contents.extend(draw(st.lists(st.binary(max_size=8), max_size=2)))
            contents.int64_contents.extend(draw(st.lists(int64s, max_size=3)))
    for key in draw(st.lists(st.sampled_from([*SAMPLING, "triton_x"]), max_size=3)):
        kind = draw(st.sampled_from(["int64_param", "string_param", "bool_param",
                                     "double_param", None]))
        value = {"int64_param": int64s, "string_param": st.text(max_size=6),
                 "bool_param": st.booleans(), "double_param": st.floats()}.get(kind)
        if kind is None:
            request.parameters[key].SetInParent()
        else:
            setattr(request.parameters[key], kind, draw(value))
    return request


@pytest.fixture(scope="module")
def stub(kserve_instance: Instance) -> Iterator[Any]:
    with grpc.insecure_channel(kserve_instance.grpc_url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel), channel


_NOT_OURS = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN,
             grpc.StatusCode.DEADLINE_EXCEEDED}


def _grpc_ok(stub: Any, call: Any) -> None:
    try:
        call()
    except grpc.RpcError as err:
        assert err.code() not in _NOT_OURS, (err.code(), err.details())
    good = service_pb2.ModelInferRequest(model_name="xgb-example")
    good.inputs.add(name="features", datatype="FP32", shape=[1, 20])
    good.raw_input_contents.append(synthetic_features(1, seed=1).tobytes())
    assert stub[0].ModelInfer(good, timeout=30).outputs[0].name


@FUZZ
@given(request=grpc_requests())
def test_fuzz_grpc_model_infer(stub: Any, request: service_pb2.ModelInferRequest) -> None:
    _grpc_ok(stub, lambda: stub[0].ModelInfer(request, timeout=30))


@FUZZ
@given(request=grpc_requests(), cuts=st.lists(st.tuples(st.integers(0, 400), st.binary(
    max_size=3)), min_size=1, max_size=4))
def test_fuzz_grpc_garbled(stub: Any, request: service_pb2.ModelInferRequest,
                           cuts: list[tuple[int, bytes]]) -> None:
    """A valid message with bytes overwritten: a parse error, or whatever it now says."""
    data = bytearray(request.SerializeToString())
    for at, patch in cuts:
        at = min(at, len(data))
        data[at:at + len(patch)] = patch
    call = stub[1].unary_unary("/inference.GRPCInferenceService/ModelInfer",
                               request_serializer=None, response_deserializer=None)
    _grpc_ok(stub, lambda: call(bytes(data), timeout=30))


@FUZZ
@given(requests=st.lists(grpc_requests(), min_size=1, max_size=3))
def test_fuzz_grpc_stream(stub: Any, requests: list[service_pb2.ModelInferRequest]) -> None:
    def run() -> None:
        for reply in stub[0].ModelStreamInfer(iter(requests), timeout=30):
            assert "internal error" not in reply.error_message, reply.error_message
    _grpc_ok(stub, run)
