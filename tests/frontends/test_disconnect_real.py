"""Cancellation on the real engine (issue 12, item 2): 16 clients start long generations and
vanish mid-request (half of them mid-stream, half waiting for a whole answer), directly and
through the gateway, over OpenAI and KServe gRPC; the engine's running and waiting requests
are back to 0 within 2 s, and the server still answers a good request."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from typing import Any

import grpc
import httpx
import pytest
from tritonclient.grpc import service_pb2_grpc

from podium.gateway.proxy import Gateway
from podium.routes.table import Endpoint
from tests.conftest import API_KEY, LLM
from tests.support.grpc_servers import GrpcFront
from tests.support.harness import RunningInstance
from tests.support.servers import Served
from tests.support.vanishing import (
    Streams,
    grpc_client,
    kserve_request,
    openai_client,
    vanish,
)

pytestmark = pytest.mark.engine

NUM_CLIENTS = 16
BACK_TO_IDLE_S = 2.0
HEADERS = {"Authorization": f"Bearer {API_KEY}"}
METADATA = (("authorization", f"Bearer {API_KEY}"),)


@pytest.fixture(scope="module")
def targets(instance: RunningInstance) -> Iterator[dict[str, tuple[str, str]]]:
    """(HTTP URL, gRPC target) of the instance itself and of a gateway in front of it."""
    gateway = Gateway(max_attempts=1)
    gateway.table.add_endpoint(LLM, "1", Endpoint("llm-1", instance.http_url,
                                                  grpc_target=instance.grpc_url))
    gateway.table.set_split(LLM, {"1": 100})
    http = Served(gateway.app())
    grpc_front = GrpcFront(gateway.table)
    try:
        yield {"direct": (instance.http_url, instance.grpc_url),
               "gateway": (http.url, grpc_front.target)}
    finally:
        grpc_front.stop()
        http.stop()


def _good_request(http_url: str, grpc_target: str, protocol: str) -> None:
    if protocol == "openai":
        reply = httpx.post(f"{http_url}/v1/chat/completions", headers=HEADERS, timeout=60,
                           json={"model": LLM, "max_tokens": 4,
                                 "messages": [{"role": "user", "content": "Hi"}]})
        assert reply.status_code == 200, reply.text
        return
    with grpc.insecure_channel(grpc_target) as channel:
        answer = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
            kserve_request(LLM, stream=False, max_tokens=4), metadata=METADATA, timeout=60)
    assert answer.raw_output_contents


@pytest.mark.parametrize("route", ["direct", "gateway"])
@pytest.mark.parametrize("protocol", ["openai", "grpc"])
def test_sixteen_clients_vanish_and_the_engine_is_idle_within_2s(
        instance: RunningInstance, targets: dict[str, tuple[str, str]], protocol: str,
        route: str) -> None:
    http_url, grpc_target = targets[route]

    def client(index: int, streams: Streams) -> Coroutine[Any, Any, None]:
        if protocol == "openai":
            return openai_client(http_url, LLM, index, streams, HEADERS)
        return grpc_client(grpc_target, LLM, index, streams, METADATA)

    idle_after_s = asyncio.run(vanish(instance.http_url, LLM, client, NUM_CLIENTS))
    assert idle_after_s <= BACK_TO_IDLE_S, (
        f"the engine took {idle_after_s:.2f} s to drop {NUM_CLIENTS} vanished clients")
    _good_request(http_url, grpc_target, protocol)
