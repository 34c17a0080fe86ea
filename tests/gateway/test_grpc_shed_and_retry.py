"""Shedding and canary retry through the gRPC gateway: the real echo instance is the stable
version, a stand-in that ends every call with one status is the canary."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Iterator

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from podium.gateway.grpc_proxy import SERVICE
from podium.routes.table import Endpoint, RouteTable
from tests.support.grpc_servers import GrpcFront, Instance


class Refusing:
    """A KServe gRPC stand-in ending every ModelInfer and ModelStreamInfer with `code`, on its
    own loop thread."""

    def __init__(self, code: grpc.StatusCode) -> None:
        self.num_calls = 0

        async def infer(_request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            self.num_calls += 1
            await context.abort(code, f"refused with {code.name}")
            return b""

        async def stream(_requests: AsyncIterator[bytes],
                         context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            self.num_calls += 1
            async for _ in _requests:  # refuse once the call's first message is in, as an
                break                  # instance does (aborting earlier races grpc's own read)
            await context.abort(code, f"refused with {code.name}")
            yield b""

        async def start() -> tuple[grpc.aio.Server, int]:
            server = grpc.aio.server()
            server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
                "ModelInfer": grpc.unary_unary_rpc_method_handler(infer),
                "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(stream)}),))
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            return server, port

        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.server, port = asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)
        self.target = f"127.0.0.1:{port}"

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(0), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture
def routes(echo_instances: dict[str, Instance]) -> RouteTable:
    """echo v1 (the real instance) stable and `latest`, all traffic on it for now."""
    table = RouteTable()
    instance = echo_instances["1"]
    table.add_endpoint("echo", "1", Endpoint(
        "echo-1", f"http://127.0.0.1:{instance.http_port}",
        grpc_target=f"127.0.0.1:{instance.grpc_port}"))
    table.set_split("echo", {"1": 100})
    table.set_alias("echo", "latest", "1")
    return table


@pytest.fixture
def front(routes: RouteTable) -> Iterator[GrpcFront]:
    f = GrpcFront(routes, max_in_flight=1)
    yield f
    f.stop()


def _canary(routes: RouteTable, code: grpc.StatusCode) -> Refusing:
    canary = Refusing(code)
    routes.add_endpoint("echo", "2", Endpoint("echo-2", "http://127.0.0.1:9",
                                              grpc_target=canary.target))
    routes.set_split("echo", {"1": 50, "2": 50})
    return canary


def _infer(front: GrpcFront, version: str = "") -> tuple[str, float]:
    client = grpcclient.InferenceServerClient(front.target)
    x = grpcclient.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[1.5]], dtype=np.float32))
    result = client.infer("echo", [x], model_version=version)
    return result.get_response().model_version, float(result.as_numpy("y")[0][0])


def test_a_canary_internal_error_is_answered_by_the_stable_version(
        front: GrpcFront, routes: RouteTable) -> None:
    canary = _canary(routes, grpc.StatusCode.INTERNAL)
    try:
        assert [_infer(front) for _ in range(4)] == [("1", 15.0)] * 4  # v1: x*10
        assert canary.num_calls == 2
        health = front.gateway.stats.health("echo", "2", since_ms=0)
        assert (health.num_requests, health.num_errors) == (2, 2)  # the analysis sees them
        assert front.gateway.stats.retried == {("echo", "2", "canary"): 2}
        with pytest.raises(InferenceServerException, match="refused with INTERNAL"):
            _infer(front, "2")  # named by the client: its answer, not another version's
    finally:
        canary.stop()


def test_past_the_bound_and_when_the_instance_sheds_the_call_is_resource_exhausted(
        front: GrpcFront, routes: RouteTable) -> None:
    stable = routes.endpoint("echo-1")
    stable.num_in_flight = 1  # the bound (1) taken by a call in flight
    with pytest.raises(InferenceServerException) as shed:
        _infer(front, "1")
    assert shed.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert "every instance of echo@1 has 1 requests in flight" in shed.value.message()
    stable.num_in_flight = 0
    assert _infer(front, "1") == ("1", 15.0)  # room again: served
    canary = _canary(routes, grpc.StatusCode.RESOURCE_EXHAUSTED)
    try:
        with pytest.raises(InferenceServerException, match="refused with RESOURCE_EXHAUSTED"):
            _infer(front, "2")  # no sibling: the instance's own refusal, relayed
        assert front.gateway.stats.shed == {("echo", "1", "gateway"): 1,
                                            ("echo", "2", "instance"): 1}
        assert front.gateway.stats.health("echo", "2", since_ms=0).num_requests == 0
    finally:
        canary.stop()


def _stream_one(front: GrpcFront, version: str) -> list[tuple[object, object]]:
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(front.target)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        x = grpcclient.InferInput("x", [1, 1], "FP32")
        x.set_data_from_numpy(np.array([[1.5]], dtype=np.float32))
        client.async_stream_infer("echo", [x], model_version=version)
        return [answers.get(timeout=20)]
    finally:
        client.stop_stream()


def test_a_stream_the_instance_sheds_is_counted_as_shed_not_as_a_served_request(
        front: GrpcFront, routes: RouteTable) -> None:
    canary = _canary(routes, grpc.StatusCode.RESOURCE_EXHAUSTED)
    try:
        [(result, error)] = _stream_one(front, "2")
        assert result is None and "refused with RESOURCE_EXHAUSTED" in str(error)
        assert front.gateway.stats.shed == {("echo", "2", "instance"): 1}
        # no evidence about the version: not a request, not an error, no latency sample
        assert front.gateway.stats.health("echo", "2", since_ms=0).num_requests == 0
        [(result, error)] = _stream_one(front, "1")  # the next stream is served
        assert error is None and float(result.as_numpy("y")[0][0]) == 15.0
        assert front.gateway.stats.health("echo", "1", since_ms=0).num_requests == 1
    finally:
        canary.stop()
