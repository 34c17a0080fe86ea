"""A connection that breaks after the request was sent (an instance lost with its node): an
idempotent package's request goes once to another instance of its version; any other is a 502."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from podium.gateway.proxy import Gateway
from podium.routes.table import Endpoint
from tests.support.servers import Dropper, Served, upstream


@pytest.fixture
def gateway() -> Iterator[tuple[Gateway, httpx.Client]]:
    gateway = Gateway(max_attempts=3, connect_timeout_s=1.0)
    served = Served(gateway.app())
    client = httpx.Client(base_url=served.url, timeout=10)
    yield gateway, client
    client.close()
    served.stop()


@pytest.fixture(scope="module")
def good() -> Iterator[Served]:
    served = Served(upstream("1"))
    yield served
    served.stop()


@pytest.mark.parametrize("pinned", [False, True], ids=["by-split", "version-named"])
def test_an_idempotent_request_whose_connection_broke_goes_to_a_sibling(
        gateway: tuple[Gateway, httpx.Client], good: Served, pinned: bool) -> None:
    front, client = gateway
    dropper = Dropper()
    try:
        front.table.add_endpoint("iris", "1", Endpoint("iris-1-drop", dropper.url))
        front.table.add_endpoint("iris", "1", Endpoint("iris-1-good", good.url))
        front.table.set_split("iris", {"1": 100})
        path = "/v2/models/iris/versions/1/infer" if pinned else "/v2/models/iris/infer"
        answers = [client.post(path, json={}) for _ in range(6)]
        assert [r.status_code for r in answers] == [200] * 6
        assert {r.json()["version"] for r in answers} == {"1"}
        assert dropper.num_requests >= 1  # it did reach the dropper, and was resent
    finally:
        dropper.stop()


def test_a_request_of_a_package_that_is_not_idempotent_is_never_resent(
        gateway: tuple[Gateway, httpx.Client], good: Served) -> None:
    front, client = gateway
    dropper = Dropper()
    try:
        front.table.add_endpoint("iris", "1", Endpoint("iris-1-drop", dropper.url,
                                                       idempotent=False))
        front.table.add_endpoint("iris", "1", Endpoint("iris-1-good", good.url,
                                                       idempotent=False))
        front.table.set_split("iris", {"1": 100})
        answers = [client.post("/v2/models/iris/infer", json={}) for _ in range(6)]
        failed = [r for r in answers if r.status_code != 200]
        assert failed and {r.status_code for r in failed} == {502}
        assert all("failed mid-request" in r.json()["error"] for r in failed)
        assert len(failed) == dropper.num_requests
        # the gateway still serves the next one
        front.table.remove_endpoint("iris-1-drop")
        assert client.post("/v2/models/iris/infer", json={}).status_code == 200
    finally:
        dropper.stop()
