"""A Triton model repository served by a real `podium serve --repository` process, driven with
tritonclient over HTTP and gRPC: python (add/sub, BLS, decoupled), onnxruntime with dynamic
batching, an ensemble, and refused configs shown in the index while the others serve."""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.harness import RunningInstance, running_instance
from tests.support.triton_layouts import write_repository


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningInstance]:
    root = write_repository(tmp_path_factory.mktemp("triton-repo"))
    log = tmp_path_factory.mktemp("triton-log") / "serve.log"
    with running_instance(["--repository", str(root)], log) as instance:
        instance.wait_ready(timeout_s=120)
        yield instance


@pytest.fixture(scope="module")
def http(server: RunningInstance) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.http_url.removeprefix("http://"),
                                            concurrency=8)


@pytest.fixture(scope="module")
def grpc(server: RunningInstance) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(server.grpc_url)


def _inputs(module, names_values):
    result = []
    for name, value in names_values:
        tensor = module.InferInput(name, list(value.shape),
                                   "INT32" if value.dtype == np.int32 else "FP32")
        tensor.set_data_from_numpy(value)
        result.append(tensor)
    return result


@pytest.mark.parametrize("client", ["http", "grpc"])
def test_add_sub_python_model(client, request):
    triton = request.getfixturevalue(client)
    module = httpclient if client == "http" else grpcclient
    a = np.array([1, 2, 3, 4], dtype=np.float32)
    b = np.array([4, 3, 2, 1], dtype=np.float32)
    result = triton.infer("add_sub", _inputs(module, [("INPUT0", a), ("INPUT1", b)]))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    with pytest.raises(InferenceServerException, match="negative input"):
        triton.infer("add_sub", _inputs(module, [("INPUT0", -a), ("INPUT1", b)]))


@pytest.mark.parametrize("client", ["http", "grpc"])
def test_execute_sees_request_id_and_parameters(client, request):
    triton = request.getfixturevalue(client)
    module = httpclient if client == "http" else grpcclient
    x = np.array([1], dtype=np.float32)
    result = triton.infer("meta", _inputs(module, [("X", x)]), request_id="req-7",
                          parameters={"mode": "fast"})
    request_id, parameters, names = json.loads(result.as_numpy("META")[0])
    assert request_id == "req-7" and parameters["mode"] == "fast" and names == ["X"]


def test_config_is_the_pbtxt(http, grpc):
    config = http.get_model_config("add_sub")
    assert config["backend"] == "python"
    assert config["parameters"]["greeting"]["string_value"] == "hello"
    assert [i["name"] for i in config["input"]] == ["INPUT0", "INPUT1"]
    message = grpc.get_model_config("add_sub").config
    assert message.instance_group[0].count == 2
    assert http.is_model_ready("add_sub") and grpc.is_model_ready("add_sub")


@pytest.mark.parametrize("client", ["http", "grpc"])
def test_bls_calls_another_model(client, request):
    triton = request.getfixturevalue(client)
    module = httpclient if client == "http" else grpcclient
    x = np.array([1, 2, 3, 4], dtype=np.float32)
    result = triton.infer("bls", _inputs(module, [("X", x)]))
    np.testing.assert_array_equal(result.as_numpy("Y"), 2 * x)


@pytest.mark.parametrize("client", ["http", "grpc"])
def test_onnx_versions_and_dynamic_batching(client, request, http):
    triton = request.getfixturevalue(client)
    module = httpclient if client == "http" else grpcclient
    x = np.ones((2, 3), dtype=np.float32)
    latest = triton.infer("onnx_add", _inputs(module, [("x", x)]))
    np.testing.assert_allclose(latest.as_numpy("y"), x + 10)
    first = triton.infer("onnx_add", _inputs(module, [("x", x)]), model_version="1")
    np.testing.assert_allclose(first.as_numpy("y"), x + 1)
    if client == "http":  # concurrent requests share model calls
        # tritonclient.http is gevent-based: concurrency through async_infer, not threads
        pending = [http.async_infer("onnx_add", _inputs(httpclient, [("x", x)]),
                                    model_version="1") for _ in range(32)]
        for call in pending:
            np.testing.assert_allclose(call.get_result().as_numpy("y"), x + 1)
        stats = http.get_inference_statistics("onnx_add", "1")["model_stats"][0]
        assert int(stats["execution_count"]) < int(stats["inference_count"])


@pytest.mark.parametrize("client", ["http", "grpc"])
def test_ensemble_of_python_and_onnx(client, request):
    triton = request.getfixturevalue(client)
    module = httpclient if client == "http" else grpcclient
    raw = np.array([[1, 2, 3]], dtype=np.float32)
    result = triton.infer("pipeline", _inputs(module, [("RAW", raw)]))
    np.testing.assert_allclose(result.as_numpy("RESULT"), raw * 2 + 10)


def test_decoupled_model_streams_n_responses(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    received: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: received.put((result, error)))
    try:
        client.async_stream_infer("repeat", _inputs(grpcclient,
                                                    [("N", np.array([3], dtype=np.int32))]))
        values = []
        for _ in range(3):
            result, error = received.get(timeout=30)
            assert error is None, error
            values.append(int(result.as_numpy("OUT")[0]))
        assert values == [0, 1, 2]
    finally:
        client.stop_stream()


@pytest.mark.parametrize("name, field", [
    ("bad_backend", "backend='tensorrt'"),
    ("bad_field", "field 'optimization'"),
    ("bad_gpu", "instance_group.kind=KIND_GPU"),
    ("bad_syntax", "malformed config.pbtxt"),
    ("bad_dims", "dims [5]"),
])
def test_refused_configs_are_in_the_index(http, grpc, name, field):
    rows = {row["name"]: row for row in http.get_model_repository_index()}
    assert rows[name]["state"] == "UNAVAILABLE"
    assert field in rows[name]["reason"]
    assert rows["add_sub"]["state"] == "READY"
    grpc_rows = {m.name: m for m in grpc.get_model_repository_index().models}
    assert grpc_rows[name].state == "UNAVAILABLE" and field in grpc_rows[name].reason
    assert not http.is_model_ready(name)


def test_a_fixed_config_loads_without_restart(server, http, grpc):
    # runs last: bad_field leaves the refused list once its config is fixed
    root = next(p for p in server.process.args if p.endswith("triton-repo0"))
    config = Path(root) / "bad_field" / "config.pbtxt"
    config.write_text(config.read_text().replace("optimization { cuda { graphs: true } }", ""))
    http.load_model("bad_field")
    raw = np.array([[1, 2, 3]], dtype=np.float32)
    result = grpc.infer("bad_field", _inputs(grpcclient, [("RAW", raw)]))
    np.testing.assert_allclose(result.as_numpy("SCALED"), raw * 2)
    rows = {row["name"]: row for row in http.get_model_repository_index()}
    assert rows["bad_field"]["state"] == "READY"


def test_load_over_the_api_keeps_the_config_version_policy(http):
    http.load_model("onnx_add")  # version_policy { all {} }: both versions stay served
    assert http.is_model_ready("onnx_add", "1") and http.is_model_ready("onnx_add", "2")
