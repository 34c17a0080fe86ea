"""`POST /pipelines/NAME[/versions/V]` through the gateway: routed by the same splits and
aliases, admitted under the same in-flight bound, behind the same keys and body limit, and
counted in the same per-version metrics as KServe v2 (real upstream servers on loopback; the
real pipeline behind a real gateway is in tests/pipelines/test_deployed.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import httpx
import pytest

from podium.auth import ApiKeyMiddleware
from podium.auth_keys import KeyConfig
from podium.gateway.limits import GatewayLimits
from podium.gateway.proxy import Gateway
from podium.gateway.request_route import route_of
from podium.routes.table import Endpoint
from tests.support.polling import metric_sample
from tests.support.servers import Served, upstream

BOUND = 2


@pytest.fixture(scope="module")
def instances() -> Iterator[dict[str, Served]]:
    served = {v: Served(upstream(v)) for v in ("1", "2")}
    yield served
    for s in served.values():
        s.stop()


class Front:
    """A gateway (with an inference key and a small body limit) serving `recommend` 1 and 2."""

    def __init__(self, instances: dict[str, Served]) -> None:
        self.gateway = Gateway(connect_timeout_s=1.0, limits=GatewayLimits(
            max_body_bytes=4096, max_in_flight_per_instance=BOUND))
        self.table = self.gateway.table
        self.endpoints = {v: Endpoint(f"recommend-{v}", s.url) for v, s in instances.items()}
        for version, endpoint in self.endpoints.items():
            self.table.add_endpoint("recommend", version, endpoint)
        self.table.set_split("recommend", {"1": 100})
        self.table.set_alias("recommend", "latest", "2")
        access = KeyConfig(api_keys=("k1",)).access()
        self.served = Served(ApiKeyMiddleware(self.gateway.app(), access=access))
        self.client = httpx.Client(base_url=self.served.url, timeout=10,
                                   headers={"Authorization": "Bearer k1"})

    def close(self) -> None:
        self.client.close()
        self.served.stop()


@pytest.fixture
def front(instances: dict[str, Served]) -> Iterator[Front]:
    f = Front(instances)
    yield f
    f.close()


@pytest.mark.parametrize(("path", "model", "version", "upstream_path"), [
    ("/pipelines/recommend", "recommend", None, "/pipelines/recommend"),
    ("/pipelines/recommend/versions/2", "recommend", "2", "/pipelines/recommend/versions/2"),
    ("/pipelines/recommend/versions/latest", "recommend", "latest",
     "/pipelines/recommend/versions/2"),
], ids=["unversioned", "versioned", "alias"])
def test_the_pipeline_path_names_its_model_and_version(path: str, model: str,
                                                       version: str | None,
                                                       upstream_path: str) -> None:
    route = route_of("POST", path, b"{}")
    assert (route.model, route.version, route.kind) == (model, version, "pipeline")
    assert route.upstream_path(path, "2") == upstream_path


def test_pipeline_requests_follow_the_split_and_the_version_the_path_names(
        front: Front) -> None:
    r = front.client.post("/pipelines/recommend", json={"member_id": "m5"})
    assert r.status_code == 200, r.text
    assert (r.json()["version"], r.json()["path"], r.json()["body"]) == (
        "1", "/pipelines/recommend", {"member_id": "m5"})
    assert r.json()["auth"] == "Bearer k1"  # the caller's key goes on, as for KServe

    front.table.set_split("recommend", {"1": 50, "2": 50})
    got = Counter(front.client.post("/pipelines/recommend", json={}).json()["version"]
                  for _ in range(10))
    assert got == {"1": 5, "2": 5}

    for path in ("/pipelines/recommend/versions/2", "/pipelines/recommend/versions/latest"):
        r = front.client.post(path, json={})
        assert (r.json()["version"], r.json()["path"]) == ("2",
                                                           "/pipelines/recommend/versions/2")


def test_an_unknown_pipeline_or_version_is_a_404_in_kserve_shape_then_a_good_one_passes(
        front: Front) -> None:
    r = front.client.post("/pipelines/nope", json={})
    assert r.status_code == 404 and "nope" in r.json()["error"]
    r = front.client.post("/pipelines/recommend/versions/9", json={})
    assert r.status_code == 404 and "9" in r.json()["error"]
    assert front.client.post("/pipelines/recommend", json={}).status_code == 200


def test_pipelines_take_the_same_key_body_limit_and_in_flight_bound(front: Front) -> None:
    no_key = httpx.post(f"{front.served.url}/pipelines/recommend", json={})
    assert no_key.status_code == 401
    big = front.client.post("/pipelines/recommend", content=b'{"x": "' + b"a" * 5000 + b'"}')
    assert big.status_code == 413, big.text
    front.endpoints["1"].in_flight_elsewhere = BOUND  # other gateways fill v1's instance
    try:
        shed = front.client.post("/pipelines/recommend", json={})
        assert shed.status_code == 429 and shed.headers.get("retry-after"), shed.text
        assert metric_sample(front.client, "podium:gateway_shed_total", model="recommend",
                             version="1", by="gateway") == 1
    finally:
        front.endpoints["1"].in_flight_elsewhere = 0
    assert front.client.post("/pipelines/recommend", json={}).status_code == 200


def test_pipeline_requests_are_counted_per_version_in_the_gateways_metrics(
        front: Front) -> None:
    front.table.set_split("recommend", {"2": 100})
    for _ in range(3):
        assert front.client.post("/pipelines/recommend", json={}).status_code == 200
    assert metric_sample(front.client, "podium:gateway_requests_total",
                         model="recommend", version="2", outcome="ok") == 3
