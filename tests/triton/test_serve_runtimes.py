"""A real `podium serve --repository` of stateful, libtorch and BLS models, driven with
tritonclient over HTTP and gRPC: an accumulator with `sequence_batching` (sequences kept in
order on one instance, bad sequences refused naming the field), TorchScript models named by
Triton's libtorch convention, a Python model calling xgb-example, and refused configs."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from podium.examples.builders import synthetic_features
from tests.support.harness import RunningInstance, running_instance
from tests.support.triton_runtimes import BAD, write_runtime_repository

CLIENTS = {"http": httpclient, "grpc": grpcclient}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningInstance]:
    root = write_runtime_repository(tmp_path_factory.mktemp("triton-runtimes"))
    log = tmp_path_factory.mktemp("triton-runtimes-log") / "serve.log"
    with running_instance(["--repository", str(root)], log) as instance:
        instance.wait_ready(timeout_s=120)
        yield instance


@pytest.fixture(scope="module")
def clients(server: RunningInstance) -> dict:
    return {"http": httpclient.InferenceServerClient(server.http_url.removeprefix("http://")),
            "grpc": grpcclient.InferenceServerClient(server.grpc_url)}


def _tensor(module, name: str, value: np.ndarray):
    datatype = {np.dtype(np.int32): "INT32", np.dtype(np.float32): "FP32"}.get(value.dtype,
                                                                                "BYTES")
    tensor = module.InferInput(name, list(value.shape), datatype)
    tensor.set_data_from_numpy(value)
    return tensor


def _add(client, module, sequence_id, value, **flags):
    result = client.infer("accumulator", [_tensor(module, "INPUT", np.array([value], np.int32))],
                          sequence_id=sequence_id, **flags)
    return int(result.as_numpy("OUTPUT")[0]), result.as_numpy("INSTANCE")[0]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_interleaved_sequences_accumulate_in_order_on_one_instance(clients, protocol):
    client, module = clients[protocol], CLIENTS[protocol]
    first, second = (1001, 1002) if protocol == "http" else (2001, 2002)
    sums = {first: [], second: []}
    instances = {first: set(), second: set()}
    steps = [(first, 1, True, False), (second, 10, True, False), (first, 2, False, False),
             (second, 20, False, False), (first, 3, False, True), (second, 30, False, True)]
    for sequence_id, value, start, end in steps:
        total, instance = _add(client, module, sequence_id, value, sequence_start=start,
                               sequence_end=end)
        sums[sequence_id].append(total)
        instances[sequence_id].add(instance)
    assert sums == {first: [1, 3, 6], second: [10, 30, 60]}
    assert all(len(names) == 1 for names in instances.values()), instances
    assert instances[first] != instances[second]  # two instances: one sequence each


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_sequence_that_ended_must_start_again(clients, protocol):
    client, module = clients[protocol], CLIENTS[protocol]
    _add(client, module, 3001, 5, sequence_start=True, sequence_end=True)
    with pytest.raises(InferenceServerException, match="sequence_start=true") as caught:
        _add(client, module, 3001, 5)
    assert caught.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    assert _add(client, module, 3001, 7, sequence_start=True)[0] == 7


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("case, kwargs, field", [
    ("unknown id", {"sequence_id": 987654}, "sequence_start"),
    ("end without start", {"sequence_id": 987655, "sequence_end": True}, "sequence_start"),
    ("no id", {}, "sequence_id"),
    ("string id, integer CORRID", {"sequence_id": "abc", "sequence_start": True},
     "sequence_id"),
])
def test_a_bad_sequence_is_a_4xx_naming_the_field(clients, protocol, case, kwargs, field):
    client, module = clients[protocol], CLIENTS[protocol]
    with pytest.raises(InferenceServerException) as caught:
        client.infer("accumulator", [_tensor(module, "INPUT", np.array([1], np.int32))],
                     **kwargs)
    assert field in caught.value.message(), caught.value.message()
    assert caught.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    # the model still serves a good sequence afterwards
    assert _add(client, module, 4242, 2, sequence_start=True, sequence_end=True)[0] == 2


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_torchscript_with_indexed_tensors(clients, protocol):
    client, module = clients[protocol], CLIENTS[protocol]
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.ones((2, 4), dtype=np.float32)
    result = client.infer("torch_add_sub", [_tensor(module, "INPUT__0", a),
                                            _tensor(module, "INPUT__1", b)])
    np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), a + b)
    np.testing.assert_allclose(result.as_numpy("OUTPUT__1"), a - b)
    config = clients["http"].get_model_config("torch_add_sub")
    assert config["platform"] == "pytorch_libtorch"


def test_torchscript_inputs_named_after_forward_with_reshape(clients):
    a = np.array([1, 2, 3, 4], dtype=np.float32)
    b = np.array([[10, 20], [30, 40]], dtype=np.float32)
    result = clients["grpc"].infer("torch_named", [_tensor(grpcclient, "b", b),
                                                   _tensor(grpcclient, "a", a)])
    np.testing.assert_allclose(result.as_numpy("OUTPUT__1"), a - b.reshape(4))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bls_calls_xgb_example(clients, protocol):
    client, module = clients[protocol], CLIENTS[protocol]
    features = synthetic_features(3, seed=5)
    direct = client.infer("xgb-example", [_tensor(module, "features", features)])
    result = client.infer("bls_xgb", [_tensor(module, "FEATURES", features)])
    probability = direct.as_numpy("probability")
    np.testing.assert_allclose(result.as_numpy("PROBABILITY"), probability)
    np.testing.assert_array_equal(result.as_numpy("LABEL"), (probability > 0.5).astype(np.int32))
    with pytest.raises(InferenceServerException) as caught:  # 19 features: xgb-example refuses
        client.infer("bls_xgb", [_tensor(module, "FEATURES", features[:, :19].copy())])
    assert "'features'" in caught.value.message() and "20" in caught.value.message()
    result = client.infer("bls_xgb", [_tensor(module, "FEATURES", features)])  # then serves
    np.testing.assert_allclose(result.as_numpy("PROBABILITY"), probability)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bls_carries_the_sequence_into_a_stateful_model(clients, protocol):
    client, module = clients[protocol], CLIENTS[protocol]
    sequence_id = 5001 if protocol == "http" else 5002

    def add(value, **flags):
        result = client.infer("bls_sequence",
                              [_tensor(module, "INPUT", np.array([value], np.int32))],
                              sequence_id=sequence_id, **flags)
        return int(result.as_numpy("OUTPUT")[0])

    assert [add(4, sequence_start=True), add(5), add(6, sequence_end=True)] == [4, 9, 15]
    with pytest.raises(InferenceServerException, match="sequence_start=true") as caught:
        add(1)  # ended: the accumulator's 400 comes back through BLS as a 400
    assert caught.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")


@pytest.mark.parametrize("name, field", [(name, field) for name, (_, field) in BAD.items()])
def test_refused_runtime_configs_name_the_field(clients, name, field):
    rows = {row["name"]: row for row in clients["http"].get_model_repository_index()}
    assert rows[name]["state"] == "UNAVAILABLE", rows[name]
    assert field in rows[name]["reason"], rows[name]["reason"]
    assert rows["accumulator"]["state"] == "READY"
