"""The gateway sends the control plane's credential to instances in place of the client's key:
HTTP proxy, gRPC proxy metadata and active health checks."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from podium.auth import ApiKeyMiddleware
from podium.gateway.grpc_proxy import _metadata
from podium.gateway.health import run_health_checks
from podium.gateway.proxy import Gateway
from podium.routes.table import Endpoint, RouteTable
from tests.support.polling import async_eventually
from tests.support.servers import Served, upstream

CREDENTIAL = "internal-credential"


@pytest.fixture(scope="module")
def sealed_instance() -> Iterator[Served]:
    """An instance stand-in that, like a sealed instance, takes only the credential."""
    app = upstream("1")
    served = Served(ApiKeyMiddleware(app, api_key=CREDENTIAL))
    served.app = app  # the records of what reached it
    yield served
    served.stop()


def _front(instance: Served, credential: str | None) -> tuple[Served, Gateway]:
    gateway = Gateway(upstream_credential=credential)
    gateway.table.add_endpoint("iris", "1", Endpoint("iris-1", instance.url))
    gateway.table.set_split("iris", {"1": 100})
    return Served(ApiKeyMiddleware(gateway.app(), api_key="gateway-key")), gateway


@pytest.mark.parametrize("credential", [CREDENTIAL, None], ids=["with", "without"])
def test_the_proxy_replaces_the_clients_key_by_the_credential(
        sealed_instance: Served, credential: str | None) -> None:
    front, _ = _front(sealed_instance, credential)
    try:
        r = httpx.post(front.url + "/v2/models/iris/infer", json={"inputs": []},
                       headers={"Authorization": "Bearer gateway-key", "x-custom": "kept"},
                       timeout=10)
        if credential is None:  # the client's gateway key reaches the instance: refused
            assert r.status_code == 401
            return
        assert r.status_code == 200, r.text
        seen = sealed_instance.app.state.seen[-1]
        assert seen["auth"] == f"Bearer {CREDENTIAL}"  # one header, the credential only
        assert "x-custom" in seen["headers"]
    finally:
        front.stop()


class _Context:
    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata


def test_grpc_metadata_carries_the_credential_not_the_clients_key() -> None:
    sent = (("authorization", "Bearer gateway-key"), ("x-request-id", "r1"),
            ("user-agent", "grpc"), (":authority", "gw"))
    assert _metadata(_Context(sent), f"Bearer {CREDENTIAL}") == (
        ("x-request-id", "r1"), ("authorization", f"Bearer {CREDENTIAL}"))
    # without a credential (instances of plain `podium serve`) the client's key goes on
    assert _metadata(_Context(sent)) == (("authorization", "Bearer gateway-key"),
                                         ("x-request-id", "r1"))


@pytest.mark.parametrize(("credential", "healthy"), [(CREDENTIAL, True), (None, False)],
                         ids=["with", "without"])
async def test_health_checks_send_the_credential(sealed_instance: Served,
                                                 credential: str | None,
                                                 healthy: bool) -> None:
    table = RouteTable()
    endpoint = Endpoint("iris-1", sealed_instance.url)
    endpoint.healthy = not healthy
    table.add_endpoint("iris", "1", endpoint)
    task: asyncio.Task[Any] = asyncio.create_task(
        run_health_checks(table, interval_s=0.05, credential=credential))
    try:
        assert await async_eventually(lambda: table.endpoint("iris-1").healthy is healthy)
    finally:
        task.cancel()
