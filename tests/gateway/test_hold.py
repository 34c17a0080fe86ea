"""A version at zero instances that starts on demand: the gateway holds its requests until an
instance is in the route table, then serves them; a full hold or a wait that runs out is a 503
with Retry-After; a version not started on demand answers at once, as before."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from podium.gateway.hold import Hold
from podium.gateway.proxy import Gateway
from podium.routes.sync import SyncAnswer, TableFollower, snapshot
from podium.routes.table import Endpoint, RouteTable
from tests.support.polling import async_eventually, eventually
from tests.support.servers import Served, upstream


@pytest.fixture(scope="module")
def v1() -> Iterator[Served]:
    served = Served(upstream("1"))
    yield served
    served.stop()


class Front:
    """A gateway on loopback whose `iris@1` starts on demand and has no instance yet."""

    def __init__(self, hold: Hold) -> None:
        self.gateway = Gateway(max_attempts=3, connect_timeout_s=1.0, hold=hold)
        self.table = self.gateway.table
        self.table.set_split("iris", {"1": 100})
        self.table.set_alias("iris", "latest", "1")
        self.table.set_on_demand("iris", "1", True)
        self.served = Served(self.gateway.app())
        self.client = httpx.Client(base_url=self.served.url, timeout=30)

    def close(self) -> None:
        self.client.close()
        self.served.stop()


@pytest.fixture
def front() -> Iterator[Front]:
    f = Front(Hold(max_held=4, max_wait_s=10, poll_s=0.01))
    yield f
    f.close()


def _infer(front: Front) -> httpx.Response:
    return front.client.post("/v2/models/iris/infer", json={"inputs": []})


def test_a_request_at_zero_is_held_until_an_instance_is_ready_then_served(
        front: Front, v1: Served) -> None:
    with ThreadPoolExecutor(3) as pool:
        answers = [pool.submit(_infer, front) for _ in range(3)]
        eventually(lambda: front.gateway.hold.counts() == {"iris": {"1": 3}})
        assert not any(a.done() for a in answers)  # held, not answered
        metrics = front.client.get("/metrics").text
        assert 'podium:gateway_held{model="iris",version="1"} 3.0' in metrics
        front.table.add_endpoint("iris", "1", Endpoint("iris-1-a", v1.url))  # it started
        results = [a.result(timeout=30) for a in answers]
    assert [r.status_code for r in results] == [200, 200, 200], [r.text for r in results]
    assert front.gateway.hold.counts() == {}
    metrics = front.client.get("/metrics").text
    assert 'podium:gateway_cold_start_wait_seconds_count{model="iris",version="1"} 3.0' in metrics
    assert _infer(front).status_code == 200  # warm now: straight through


def test_a_burst_past_the_bound_is_refused_503_with_retry_after_never_dropped(
        front: Front, v1: Served) -> None:
    with ThreadPoolExecutor(6) as pool:
        answers = [pool.submit(_infer, front) for _ in range(6)]
        eventually(lambda: sum(a.done() for a in answers) == 2)  # the two past max_held=4
        refused = [a.result() for a in answers if a.done()]
        front.table.add_endpoint("iris", "1", Endpoint("iris-1-a", v1.url))
        results = [a.result(timeout=30) for a in answers]
    assert sorted(r.status_code for r in results) == [200] * 4 + [503] * 2
    for r in refused:
        assert r.status_code == 503
        assert int(r.headers["retry-after"]) >= 1
        assert "starting from zero instances" in r.json()["error"]
    assert 'why="full"} 2.0' in front.client.get("/metrics").text


def test_a_held_request_whose_wait_runs_out_gets_503_with_retry_after_and_the_next_is_served(
        v1: Served) -> None:
    f = Front(Hold(max_held=4, max_wait_s=0.3, poll_s=0.01))
    try:
        r = f.client.post("/v1/chat/completions", json={"model": "iris", "messages": []})
        assert r.status_code == 503, r.text
        assert r.headers["retry-after"] == "1"
        assert "none was ready within 0.3 s" in r.json()["error"]["message"]
        f.table.add_endpoint("iris", "1", Endpoint("iris-1-a", v1.url))
        assert _infer(f).status_code == 200
    finally:
        f.close()


def test_a_version_not_started_on_demand_answers_at_once_as_before() -> None:
    # an hour's bound: held, the request would outlast the client's 30 s timeout and fail
    f = Front(Hold(max_held=4, max_wait_s=3600, poll_s=0.01))
    try:
        f.table.set_on_demand("iris", "1", False)
        r = _infer(f)
        assert r.status_code == 503
        assert "has no ready instance" in r.text
        assert "retry-after" not in r.headers
    finally:
        f.close()


def test_on_demand_versions_reach_the_gateways_with_the_table() -> None:
    plane = RouteTable()
    plane.set_split("iris", {"1": 100})
    plane.set_on_demand("iris", "1", True)
    gateway = RouteTable()
    TableFollower(gateway).apply(SyncAnswer("e", 1, snapshot(plane)))
    assert gateway.on_demand() == {"iris": ["1"]}
    assert gateway.waiting_version("iris", None) == "1"
    assert gateway.waiting_version("iris", "1") == "1"
    assert gateway.waiting_version("other", None) is None


def test_a_hold_counts_per_version_while_waiting() -> None:
    import asyncio

    hold = Hold(max_held=2, max_wait_s=5, poll_s=0.01)
    ready = threading.Event()

    async def main() -> list[str]:
        def attempt() -> str | None:
            return "target" if ready.is_set() else None

        tasks = [asyncio.create_task(hold.until_routable("m", "1", attempt)) for _ in range(2)]
        assert await async_eventually(lambda: hold.counts() == {"m": {"1": 2}})
        ready.set()
        return await asyncio.gather(*tasks)

    assert asyncio.run(main()) == ["target", "target"]
    assert hold.counts() == {}
    assert hold.waited["m", "1"][0] == 2


def test_the_wait_bound_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PODIUM_COLD_START_WAIT_S", "7.5")
    assert Hold().max_wait_s == 7.5
    monkeypatch.setenv("PODIUM_COLD_START_WAIT_S", "nonsense")
    assert Hold().max_wait_s == 120.0
    assert Hold(max_wait_s=2).max_wait_s == 2
