"""Fatal vs recoverable backend errors: a failed request fails alone; a dead engine takes the
version out of service and stops the instance, whether a request met it or the poll found it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import httpx
import pytest

from podium.backends.base import InferenceRequest
from podium.errors import BackendDead, BackendError, Unavailable
from podium.server.app import build_app
from podium.server.config import ServerConfig
from podium.server.instance import Instance
from podium.server.serve import _watch_engines
from tests.support.fake_backends import FakeEngineBackend, add_ready
from tests.support.polling import async_eventually


def _instance() -> tuple[Instance, FakeEngineBackend, list[str]]:
    instance = Instance(ServerConfig(grpc_port=-1))
    backend = FakeEngineBackend()
    add_ready(instance.repository, backend)
    instance.booted = True
    stops: list[str] = []
    instance.stop = lambda: stops.append("stop")
    return instance, backend, stops


async def _ready(instance: Instance) -> httpx.Response:
    transport = httpx.ASGITransport(app=build_app(instance))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        return await client.get("/health/ready")


async def test_a_failed_request_fails_alone() -> None:
    instance, backend, stops = _instance()
    backend.fail_next = BackendError("the model failed on this input")
    with pytest.raises(BackendError):
        await instance.repository.infer("fake-engine", None, InferenceRequest(inputs={}))
    response = await instance.repository.infer("fake-engine", None, InferenceRequest(inputs={}))
    assert response.outputs[0].data.tolist() == [b"ok"]
    assert stops == [] and instance.is_ready()
    assert (await _ready(instance)).status_code == 200


async def test_a_request_that_meets_a_dead_engine_stops_the_instance() -> None:
    instance, backend, stops = _instance()
    backend.fail_next = BackendDead("the engine core exited")
    with pytest.raises(BackendDead):
        await instance.repository.infer("fake-engine", None, InferenceRequest(inputs={}))
    assert stops == ["stop"]
    ready = await _ready(instance)
    assert ready.status_code == 503
    assert ready.json()["status"] == "failed" and "engine died" in ready.json()["error"]
    assert ready.json()["models"] == {"fake-engine@1": "unavailable"}
    row = instance.repository.index()[0]
    assert row["state"] == "UNAVAILABLE" and "the engine core exited" in row["reason"]
    with pytest.raises(Unavailable):  # no request is routed to it any more
        await instance.repository.infer("fake-engine", None, InferenceRequest(inputs={}))
    assert stops == ["stop"], "a dead engine is reported once"


async def test_the_poll_finds_an_engine_that_died_between_requests() -> None:
    instance, backend, _ = _instance()
    server = SimpleNamespace(should_exit=False)
    instance.stop = lambda: setattr(server, "should_exit", True)
    polls: list[None] = []
    check_alive = instance.repository.check_alive
    instance.repository.check_alive = lambda: (polls.append(None), check_alive())[1]
    watcher = asyncio.create_task(_watch_engines(instance, server, interval_s=0.01))
    assert await async_eventually(lambda: len(polls) >= 3)
    assert not server.should_exit, "a live engine keeps the instance running"
    backend.alive = False
    await asyncio.wait_for(watcher, 2)
    assert server.should_exit and instance.boot_error == "engine died: fake-engine@1"
    assert not instance.is_ready()


async def test_an_engine_shut_down_by_unload_is_not_dead() -> None:
    instance, backend, stops = _instance()
    await instance.repository.unload("fake-engine")
    backend.alive = False  # what unloading does to a real engine
    assert instance.repository.check_alive() == []
    assert stops == [] and instance.boot_error is None
