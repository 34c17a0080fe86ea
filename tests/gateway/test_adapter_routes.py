"""LoRA adapter routes: an adapter's versions run on its base's instances, and the gateway
names the version it chose (OpenAI `name@version`, KServe `/versions/N`), since one base
instance serves every placed version of the adapter."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import httpx
import pytest
from tritonclient.grpc import service_pb2

from podium.gateway.grpc_proxy import _with_version
from podium.gateway.proxy import Gateway
from podium.routes.sync import SyncAnswer, TableFollower, snapshot
from podium.routes.table import Endpoint, RouteTable
from tests.support.servers import Served, upstream


@pytest.fixture(scope="module")
def base_instance() -> Iterator[Served]:
    served = Served(upstream("1"))
    yield served
    served.stop()


@pytest.fixture
def gateway(base_instance: Served) -> Iterator[tuple[Gateway, httpx.Client]]:
    gateway = Gateway(max_attempts=2, connect_timeout_s=1.0)
    gateway.table.add_endpoint("llm", "1", Endpoint("llm-1-a", base_instance.url))
    gateway.table.set_split("llm", {"1": 100})
    for version in ("1", "2"):
        gateway.table.set_adapter("tone", "llm", version, placed=True)
    served = Served(gateway.app())
    client = httpx.Client(base_url=served.url, timeout=10)
    yield gateway, client
    client.close()
    served.stop()


def test_openai_requests_name_the_adapter_version_the_split_chose(
        gateway: tuple[Gateway, httpx.Client]) -> None:
    gw, client = gateway
    gw.table.set_split("tone", {"1": 90, "2": 10})
    models = Counter()
    for _ in range(20):
        r = client.post("/v1/chat/completions", json={"model": "tone", "messages": []})
        assert r.status_code == 200, r.text
        models[r.json()["body"]["model"]] += 1
    assert models == {"tone@1": 18, "tone@2": 2}  # smooth round robin: exact shares
    assert gw.stats.health("tone", "2", 0).num_requests == 2  # counted per adapter version
    r = client.post("/v1/completions", json={"model": "tone@2", "prompt": "hi"})
    assert r.json()["body"]["model"] == "tone@2"


def test_kserve_paths_always_name_the_adapter_version(
        gateway: tuple[Gateway, httpx.Client]) -> None:
    gw, client = gateway
    gw.table.set_split("tone", {"2": 100})
    r = client.post("/v2/models/tone/generate", json={"text_input": "hi"})
    assert r.json()["path"] == "/v2/models/tone/versions/2/generate"
    gw.table.set_alias("tone", "latest", "1")
    r = client.post("/v2/models/tone/versions/latest/infer", json={})
    assert r.json()["path"] == "/v2/models/tone/versions/1/infer"
    # a base request is forwarded as before: its instance serves one version
    r = client.post("/v1/chat/completions", json={"model": "llm", "messages": []})
    assert r.json()["body"]["model"] == "llm"


def test_a_version_not_placed_is_404_then_a_placed_one_answers(
        gateway: tuple[Gateway, httpx.Client]) -> None:
    gw, client = gateway
    gw.table.set_adapter("tone", "llm", "2", placed=False)
    r = client.post("/v1/chat/completions", json={"model": "tone@2", "messages": []})
    assert r.status_code == 404
    assert "tone@2 is not deployed; versions: 1" in r.text
    r = client.post("/v1/chat/completions", json={"model": "tone@1", "messages": []})
    assert r.status_code == 200


def test_an_adapter_whose_base_has_no_instance_is_unavailable(
        gateway: tuple[Gateway, httpx.Client]) -> None:
    gw, client = gateway
    gw.table.remove_endpoint("llm-1-a")
    gw.table.set_split("tone", {"1": 100})
    r = client.post("/v1/chat/completions", json={"model": "tone", "messages": []})
    assert r.status_code == 503
    assert "tone@1 has no ready instance" in r.text


def test_models_lists_adapters_with_their_base_as_parent(
        gateway: tuple[Gateway, httpx.Client]) -> None:
    _gw, client = gateway
    data = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert data["tone"]["parent"] == "llm"
    assert data["tone@2"]["parent"] == "llm"
    assert "parent" not in data["llm"]


def test_adapter_routes_reach_a_gateway_through_the_sync_wire() -> None:
    plane = RouteTable()
    shared = Endpoint("llm-1-a", "http://x")
    plane.add_endpoint("llm", "1", shared)
    plane.set_split("llm", {"1": 100})
    plane.set_adapter("tone", "llm", "3", placed=True)
    plane.set_split("tone", {"3": 100})
    gateway = RouteTable()
    TableFollower(gateway).apply(SyncAnswer("e", 1, snapshot(plane)))
    assert gateway.adapters() == {"tone": ("llm", ["3"])}
    version, endpoint = gateway.resolve("tone", None)
    assert (version, endpoint.id) == ("3", "llm-1-a")
    # the adapter shares the base's endpoint object: one in-flight count for both
    assert endpoint is gateway.resolve("llm", None)[1]


def test_grpc_requests_for_an_adapter_always_carry_the_version() -> None:
    request = service_pb2.ModelInferRequest(model_name="tone").SerializeToString()
    cls = service_pb2.ModelInferRequest
    assert _with_version(cls, request, None, "2") == request  # a model: left as asked
    pinned = cls.FromString(_with_version(cls, request, None, "2", pinned=True))
    assert (pinned.model_name, pinned.model_version) == ("tone", "2")


def _base_in_rollout() -> RouteTable:
    """A base in a rollout (v1 90%, v2 10%, one instance each) with adapter tone@1 placed."""
    table = RouteTable()
    table.add_endpoint("llm", "1", Endpoint("llm-1-a", "http://a"))
    table.add_endpoint("llm", "2", Endpoint("llm-2-a", "http://b"))
    table.set_split("llm", {"1": 90, "2": 10})
    table.set_adapter("tone", "llm", "1", placed=True)
    table.set_split("tone", {"1": 100})
    return table


def test_adapter_traffic_follows_its_base_split_during_a_base_rollout() -> None:
    table = _base_in_rollout()
    picks = Counter(table.resolve("tone", None)[1].id for _ in range(20))
    assert picks == {"llm-1-a": 18, "llm-2-a": 2}  # the base's shares, not least in-flight
    pinned = Counter(table.resolve("tone", "1")[1].id for _ in range(10))
    assert pinned == {"llm-1-a": 9, "llm-2-a": 1}
    # a retry that excludes the new base version's instance lands on the old one
    assert table.resolve("tone", None, exclude=frozenset({"llm-1-a"}))[1].id == "llm-2-a"
    table.set_split("llm", {"2": 100})  # the base rollout's last stage: all adapter traffic
    assert {table.resolve("tone", None)[1].id for _ in range(5)} == {"llm-2-a"}


def test_an_adapter_answer_counts_for_the_base_version_that_served_it() -> None:
    table = _base_in_rollout()
    new = table.endpoint("llm-2-a")
    assert table.counted_for("tone", "1", new) == [("tone", "1"), ("llm", "2")]
    assert table.counted_for("llm", "2", new) == [("llm", "2")]
    assert table.counted_for("tone", "1", Endpoint("gone", "http://x")) == [("tone", "1")]


def test_adapter_errors_on_a_new_base_version_reach_the_base_analysis(
        base_instance: Served) -> None:
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def fail(_request: object) -> JSONResponse:
        return JSONResponse({"error": "adapter failed to load"}, status_code=500)

    broken = Served(Starlette(routes=[Route("/{path:path}", fail, methods=["GET", "POST"])]))
    gateway = Gateway(max_attempts=1, connect_timeout_s=1.0)
    gateway.table.add_endpoint("llm", "1", Endpoint("llm-1-a", base_instance.url))
    gateway.table.add_endpoint("llm", "2", Endpoint("llm-2-a", broken.url))
    gateway.table.set_split("llm", {"1": 50, "2": 50})
    gateway.table.set_adapter("tone", "llm", "1", placed=True)
    gateway.table.set_split("tone", {"1": 100})
    served = Served(gateway.app())
    try:
        with httpx.Client(base_url=served.url, timeout=10) as client:
            codes = Counter(client.post("/v1/chat/completions", json={
                "model": "tone", "messages": []}).status_code for _ in range(10))
            assert codes == {200: 5, 500: 5}
            assert client.post("/v1/chat/completions", json={
                "model": "llm", "messages": []}).status_code in (200, 500)
    finally:
        served.stop()
        broken.stop()
    new, old = gateway.stats.health("llm", "2", 0), gateway.stats.health("llm", "1", 0)
    assert new.num_errors == 5 and new.num_requests >= 5  # the base's analysis sees them
    assert old.num_errors == 0 and old.num_requests >= 5
    assert gateway.stats.health("tone", "1", 0).num_requests == 10  # and the adapter's own
