"""The gRPC proxy with the real tritonclient against real `podium serve` instances."""

from __future__ import annotations

import queue
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from podium.gateway.wire import read_name_version
from podium.routes.table import Endpoint, RouteTable
from tests.support.grpc_servers import GrpcFront, Instance, echo_table
from tests.support.servers import closed_port_url


@pytest.fixture
def front(echo_instances: dict[str, Instance]) -> Iterator[tuple[GrpcFront, RouteTable]]:
    table = echo_table(echo_instances)
    f = GrpcFront(table)
    yield f, table
    f.stop()


def _infer(client: grpcclient.InferenceServerClient, version: str = "") -> tuple[str, float]:
    x = grpcclient.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[1.5]], dtype=np.float32))
    result = client.infer("echo", [x], model_version=version)
    return result.get_response().model_version, float(result.as_numpy("y")[0][0])


def test_infer_routes_by_split_version_and_alias(front: tuple[GrpcFront, RouteTable]) -> None:
    gateway, table = front
    client = grpcclient.InferenceServerClient(gateway.target)
    assert _infer(client) == ("1", 15.0)
    assert _infer(client, "2") == ("2", 30.0)
    assert _infer(client, "latest") == ("2", 30.0)
    table.set_split("echo", {"1": 50, "2": 50})
    assert sorted(_infer(client)[0] for _ in range(4)) == ["1", "1", "2", "2"]
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("echo", "2")
    assert client.get_model_metadata("echo", "1").versions == ["1"]
    health = gateway.gateway.stats.health("echo", "2", since_ms=0)
    assert health.num_requests >= 3 and health.num_errors == 0


def test_unknown_model_is_not_found(front: tuple[GrpcFront, RouteTable]) -> None:
    client = grpcclient.InferenceServerClient(front[0].target)
    with pytest.raises(InferenceServerException, match="model 'ghost' is not deployed"):
        client.get_model_metadata("ghost")


def test_a_refused_connection_is_retried_on_another_instance(
        front: tuple[GrpcFront, RouteTable]) -> None:
    gateway, table = front
    dead = Endpoint("echo-1-dead", closed_port_url(),
                    grpc_target=closed_port_url().removeprefix("http://"))
    table.add_endpoint("echo", "1", dead)
    client = grpcclient.InferenceServerClient(gateway.target)
    assert [_infer(client, "1")[0] for _ in range(4)] == ["1"] * 4
    assert dead.healthy is False


def test_stream_infer_passes_through(front: tuple[GrpcFront, RouteTable]) -> None:
    client = grpcclient.InferenceServerClient(front[0].target)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for value in (1.0, 2.0):
            x = grpcclient.InferInput("x", [1, 1], "FP32")
            x.set_data_from_numpy(np.array([[value]], dtype=np.float32))
            client.async_stream_infer("echo", [x], model_version="2")
        got = [answers.get(timeout=20) for _ in range(2)]
    finally:
        client.stop_stream()
    assert [e for _, e in got] == [None, None]
    assert sorted(float(r.as_numpy("y")[0][0]) for r, _ in got) == [20.0, 40.0]  # v2: x*20


def test_name_and_version_are_read_from_fields_1_and_2() -> None:
    request = service_pb2.ModelInferRequest(model_name="echo", model_version="7", id="r1")
    request.raw_input_contents.append(b"\x00" * 4096)
    infer = service_pb2.ModelInferRequest
    assert read_name_version(infer, request.SerializeToString()) == ("echo", "7")
    ready = service_pb2.ModelReadyRequest(name="m").SerializeToString()
    assert read_name_version(service_pb2.ModelReadyRequest, ready) == ("m", None)


def test_a_grpc_call_at_zero_is_held_until_an_instance_is_ready(
        echo_instances: dict[str, Instance]) -> None:
    import threading

    from podium.gateway.hold import Hold
    from tests.support.polling import eventually

    table = RouteTable()
    table.set_split("echo", {"1": 100})
    table.set_on_demand("echo", "1", True)  # at zero, started on demand
    gateway = GrpcFront(table, hold=Hold(max_held=4, max_wait_s=30, poll_s=0.01))
    try:
        answers: list[tuple[str, float]] = []
        call = threading.Thread(target=lambda: answers.append(
            _infer(grpcclient.InferenceServerClient(gateway.target))))
        call.start()
        eventually(lambda: gateway.gateway.hold.counts() == {"echo": {"1": 1}})
        instance = echo_instances["1"]
        table.add_endpoint("echo", "1", Endpoint(
            "echo-1", f"http://127.0.0.1:{instance.http_port}",
            grpc_target=f"127.0.0.1:{instance.grpc_port}"))
        call.join(30)
        assert answers == [("1", 15.0)]
    finally:
        gateway.stop()
