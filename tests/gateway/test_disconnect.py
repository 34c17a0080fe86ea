"""Through the gateway, a client that leaves cancels its generation at the instance: the
gateway closes its upstream call (HTTP whole answers and relayed streams, gRPC unary and
streams), the instance sees the disconnect, the engine's request is cancelled. The instances
are the in-process KServe one over a fake engine and a slow OpenAI stand-in."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from podium.gateway.proxy import Gateway
from podium.routes.table import Endpoint
from tests.support.grpc_servers import GrpcFront
from tests.support.kserve_instance import LLM, Instance
from tests.support.leaving import (
    cancel_stream,
    cancel_unary,
    leave_stream,
    leave_whole,
    llm_request,
    wait_for,
)
from tests.support.servers import Served
from tests.support.slow_openai import MODEL, SlowServing, openai_body, serve_slow_openai

CANCELLED_WITHIN_S = 2.0


class Fronted:
    """The HTTP and gRPC gateways in front of both instances."""

    def __init__(self, kserve: Instance, openai: Served) -> None:
        self.gateway = Gateway(max_attempts=1)
        table = self.gateway.table
        table.add_endpoint(LLM, "1", Endpoint("llm-1", f"http://{kserve.http_url}",
                                              grpc_target=kserve.grpc_url))
        table.set_split(LLM, {"1": 100})
        table.add_endpoint(MODEL, "1", Endpoint("slow-1", openai.url))
        table.set_split(MODEL, {"1": 100})
        self.endpoints = list(table.endpoints())
        self.http = Served(self.gateway.app())
        self.grpc = GrpcFront(table)

    def num_in_flight(self) -> int:
        return sum(e.num_in_flight for e in self.endpoints)

    def stop(self) -> None:
        self.grpc.stop()
        self.http.stop()


@pytest.fixture(scope="module")
def slow_openai() -> Iterator[tuple[Served, SlowServing]]:
    served, serving = serve_slow_openai()
    yield served, serving
    served.stop()


@pytest.fixture(scope="module")
def fronted(kserve_instance: Instance,
            slow_openai: tuple[Served, SlowServing]) -> Iterator[Fronted]:
    front = Fronted(kserve_instance, slow_openai[0])
    yield front
    front.stop()


@pytest.mark.parametrize("stream", [False, True], ids=["chat", "chat-stream"])
def test_openai_client_that_leaves_the_gateway_cancels_its_generation(
        fronted: Fronted, slow_openai: tuple[Served, SlowServing], stream: bool) -> None:
    _, serving = slow_openai
    path = "/v1/chat/completions"
    request_id = f"gateway-gone-openai-{stream}"
    serving.delay_s = 10.0
    body = openai_body(path, request_id, stream=stream)
    if stream:  # relayed as it comes: one event, then the client leaves
        leave_stream(fronted.http.url + path, body, events=1)
    else:  # a whole answer: the gateway is waiting for its headers when the client leaves
        leave_whole(fronted.http.url + path, body)
    assert wait_for(lambda: request_id in serving.cancelled, CANCELLED_WITHIN_S) is not None, \
        "the instance went on generating for a client that had left the gateway"
    assert wait_for(lambda: fronted.num_in_flight() == 0, 1.0) is not None
    serving.delay_s = 0.0
    reply = httpx.post(fronted.http.url + path, json=openai_body(path, "good", stream=False),
                       timeout=10)
    assert reply.status_code == 200, reply.text


@pytest.fixture
def slow_engine(kserve_instance: Instance, fronted: Fronted) -> Iterator[Instance]:
    """The fake LLM taking 5 s per word for the test's duration; a good request after."""
    assert kserve_instance.llm is not None
    kserve_instance.llm.engine.word_delay_s = 5.0
    try:
        yield kserve_instance
    finally:
        kserve_instance.llm.engine.word_delay_s = 0.0
    assert wait_for(lambda: fronted.num_in_flight() == 0, 1.0) is not None
    reply = httpx.post(f"{fronted.http.url}/v2/models/{LLM}/generate",
                       json={"text_input": "Capital?", "parameters": {"max_tokens": 2}})
    assert reply.status_code == 200, reply.text


def _aborted(instance: Instance, request_id: str) -> bool:
    assert instance.llm is not None
    return request_id in instance.llm.engine.aborted


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
def test_kserve_http_client_that_leaves_the_gateway_cancels_its_generation(
        fronted: Fronted, slow_engine: Instance, route: str) -> None:
    request_id = f"gateway-gone-http-{route}"
    leave_whole(f"{fronted.http.url}/v2/models/{LLM}/{route}",
                {"id": request_id, "text_input": "Capital?"})
    assert wait_for(lambda: _aborted(slow_engine, request_id), CANCELLED_WITHIN_S) is not None


@pytest.mark.parametrize("method", ["ModelInfer", "ModelStreamInfer"])
def test_kserve_grpc_client_that_cancels_at_the_gateway_cancels_its_generation(
        fronted: Fronted, slow_engine: Instance, method: str) -> None:
    request_id = f"gateway-gone-grpc-{method}"
    if method == "ModelInfer":
        cancel_unary(fronted.grpc.target, llm_request(LLM, request_id, stream=False))
    else:
        cancel_stream(fronted.grpc.target, llm_request(LLM, request_id, stream=True))
    assert wait_for(lambda: _aborted(slow_engine, request_id), CANCELLED_WITHIN_S) is not None
