"""The gateway and an instance render the same error byte for byte, on every protocol."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import grpc
import httpx
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from podium.errors import PodiumError
from podium.frontends.kserve_grpc import create_server
from podium.gateway.grpc_proxy import GrpcGateway
from podium.gateway.proxy import Gateway
from podium.repository import ModelEntry
from podium.routes.stats import VersionStats
from podium.routes.table import RouteTable
from podium.server.app import build_app
from podium.server.config import ServerConfig
from podium.server.instance import Instance
from tests.support.fake_backends import FakeLlmBackend

MESSAGES = [{"role": "user", "content": "hi"}]
# "ghost" is served nowhere (NotFound); "fake-llm" is still loading (Unavailable)
MODELS = [pytest.param("ghost", 404, id="not-found"),
          pytest.param("fake-llm", 503, id="unavailable")]
PATHS = [pytest.param("/v1/chat/completions", id="openai"),
         pytest.param("/v2/models/{model}/infer", id="kserve-http")]


def _instance() -> Instance:
    instance = Instance(ServerConfig(grpc_port=-1))
    backend = FakeLlmBackend()
    instance.repository._entries["fake-llm"] = {"1": ModelEntry(backend, state="LOADING")}
    instance.booted = True
    return instance


def _raised_by(instance: Instance, model: str) -> PodiumError:
    """What the instance raises for `model`; the gateway is made to raise the same."""
    with pytest.raises(PodiumError) as err:
        instance.repository.find(model)
    return err.value


def _gateway_raising(exc: PodiumError, monkeypatch: pytest.MonkeyPatch) -> RouteTable:
    table = RouteTable()

    def resolve(*_args: object, **_kwargs: object) -> None:
        raise exc

    monkeypatch.setattr(table, "resolve", resolve)
    return table


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("model", "status"), MODELS)
async def test_http_bodies_are_identical(model: str, status: int, path: str,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    instance = _instance()
    table = _gateway_raising(_raised_by(instance, model), monkeypatch)
    url = path.format(model=model)
    body = {"model": model, "messages": MESSAGES} if path.startswith("/v1") else {"inputs": []}
    answers = []
    for app in (build_app(instance), Gateway(table).app()):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://t") as client:
            answers.append(await client.post(url, json=body))
    from_instance, from_gateway = answers
    assert from_instance.status_code == from_gateway.status_code == status
    assert from_instance.headers["content-type"] == from_gateway.headers["content-type"]
    assert from_instance.content == from_gateway.content
    error = json.loads(from_instance.content)["error"]
    assert model in (error["message"] if isinstance(error, dict) else error)


@pytest.fixture
async def grpc_targets() -> AsyncIterator[tuple[Instance, str, RouteTable, str]]:
    instance = _instance()
    server = create_server(instance.repository, port=0, host="127.0.0.1",
                           server_ready=lambda: True)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    table = RouteTable()
    gateway = GrpcGateway(table, VersionStats())
    gateway_server, gateway_port = await gateway.serve("127.0.0.1", 0)
    yield instance, f"127.0.0.1:{port}", table, f"127.0.0.1:{gateway_port}"
    await gateway_server.stop(None)
    await gateway.aclose()
    await server.stop(None)


@pytest.mark.parametrize(("model", "status"), MODELS)
async def test_grpc_statuses_are_identical(
        model: str, status: int, monkeypatch: pytest.MonkeyPatch,
        grpc_targets: tuple[Instance, str, RouteTable, str]) -> None:
    instance, instance_target, table, gateway_target = grpc_targets
    exc = _raised_by(instance, model)
    monkeypatch.setattr(table, "resolve", lambda *_a, **_k: (_ for _ in ()).throw(exc))
    statuses = []
    for target in (instance_target, gateway_target):
        async with grpc.aio.insecure_channel(target) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.ModelInfer(service_pb2.ModelInferRequest(model_name=model))
            statuses.append((err.value.code(), err.value.details()))
    assert statuses[0] == statuses[1]
    assert statuses[0][0] == {404: grpc.StatusCode.NOT_FOUND,
                              503: grpc.StatusCode.UNAVAILABLE}[status]
