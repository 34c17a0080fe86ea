"""Through the gateway, an OpenAI request for a standalone deployment is refused with a 404
naming the mode (never sent to the instance), while KServe requests for it and OpenAI requests
for embedded deployments are forwarded; the route table a gateway gets carries the mode."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from podium.gateway.proxy import Gateway
from podium.routes.sync import SyncAnswer, TableFollower, snapshot
from podium.routes.table import Endpoint, RouteTable
from tests.support.servers import Served, upstream


@pytest.fixture(scope="module")
def front() -> Iterator[tuple[httpx.Client, Served]]:
    instance = Served(upstream("1"))
    gateway = Gateway(max_attempts=3, connect_timeout_s=1.0)
    table = gateway.table
    table.add_endpoint("smol", "1", Endpoint("smol-1-a", instance.url, frontends="standalone"))
    table.add_endpoint("chat", "1", Endpoint("chat-1-a", instance.url))
    table.add_endpoint("chat", "2", Endpoint("chat-2-a", instance.url, frontends="standalone"))
    table.set_split("smol", {"1": 100})
    table.set_split("chat", {"1": 100})
    served = Served(gateway.app())
    with httpx.Client(base_url=served.url, timeout=10) as client:
        yield client, instance
    served.stop()
    instance.stop()


@pytest.mark.parametrize(("path", "model", "deployment"), [
    pytest.param("/v1/chat/completions", "smol", "smol@1", id="chat"),
    pytest.param("/v1/completions", "smol@1", "smol@1", id="completions-versioned"),
    pytest.param("/v1/embeddings", "chat@2", "chat@2", id="standalone-version-of-a-model"),
])
def test_an_openai_request_for_a_standalone_deployment_gets_a_404_naming_its_mode(
        front: tuple[httpx.Client, Served], path: str, model: str, deployment: str) -> None:
    client, instance = front
    seen = len(instance.app.state.seen)
    r = client.post(path, json={"model": model, "prompt": "hi"})
    assert r.status_code == 404, r.text
    message = r.json()["error"]["message"]
    assert f"{deployment} is deployed standalone" in message
    assert '"frontends": "standalone"' in message and path in message
    assert len(instance.app.state.seen) == seen  # refused at the gateway: never sent
    name = deployment.split("@")[0]
    r = client.post(f"/v2/models/{name}/infer", json={"inputs": []})  # KServe still serves
    assert r.status_code == 200 and r.json()["path"] == f"/v2/models/{name}/infer"
    r = client.post("/v1/chat/completions", json={"model": "chat", "messages": []})
    assert r.status_code == 200 and r.json()["body"]["model"] == "chat"  # embedded: sent


def test_the_route_table_a_gateway_gets_carries_each_deployments_mode() -> None:
    source = RouteTable()
    source.add_endpoint("smol", "1", Endpoint("smol-1-a", "http://a", frontends="standalone"))
    source.add_endpoint("chat", "1", Endpoint("chat-1-a", "http://b"))
    table = RouteTable()
    follower = TableFollower(table)
    assert follower.apply(SyncAnswer("e", 1, snapshot(source)))
    assert table.endpoint("smol-1-a").frontends == "standalone"
    assert table.endpoint("chat-1-a").frontends == "embedded"
    source.endpoint("chat-1-a").frontends = "standalone"  # a changed package, same instance id
    assert follower.apply(SyncAnswer("e", 2, snapshot(source)))
    assert table.endpoint("chat-1-a").frontends == "standalone"


def test_the_gateways_model_list_leaves_standalone_deployments_out(
        front: tuple[httpx.Client, Served]) -> None:
    client, _ = front
    ids = [m["id"] for m in client.get("/v1/models").json()["data"]]
    assert ids == ["chat", "chat@1"]  # not smol, not chat@2: they answer no OpenAI request
