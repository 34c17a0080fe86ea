"""The control loop: autoscaling and idle-version collection through the store."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from podium.control.actions import MoveAlias, Scale
from podium.control.api import create_app
from podium.control.loop import ControlLoop, LoopConfig
from podium.control.plane import ControlPlane
from podium.control.store import Store
from podium.control.world import RuntimeWorld
from podium.routes.stats import Outcome, VersionStats
from podium.routes.table import Endpoint, RouteTable
from tests.support.ready_runtime import FakeRuntime


class Env:
    def __init__(self, tmp_path: Path) -> None:
        self.offset_ms = 0
        self.store = Store.open(f"sqlite:///{tmp_path / 'c.db'}")
        self.table, self.stats, self.runtime = RouteTable(), VersionStats(), FakeRuntime()
        world = RuntimeWorld(self.runtime, self.table, self.stats)
        self.plane = ControlPlane(self.store, world, clock=self.now,
                                  materialize=lambda _p: None)
        self.loop = ControlLoop(self.plane, self.runtime, self.table, self.stats, LoopConfig(
            scale_down_cooldown_ms=10_000, version_ttl_ms=60_000, target_in_flight=8))

    def now(self) -> int:
        return int(time.time() * 1000) + self.offset_ms


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path)
    yield e
    e.store.close()


def test_busy_deployment_scales_up_then_back_down_after_cooldown(env: Env) -> None:
    env.store.apply([Scale("iris", "1", 1)])
    env.store.set_scaling("iris", "1", 1, 4)
    endpoint = Endpoint("iris-1-1", "http://x", num_in_flight=30)
    env.table.add_endpoint("iris", "1", endpoint)
    env.loop.step()
    assert env.store.get_deployment("iris", "1").num_desired == 4
    assert env.runtime.counts[("iris", "1")] == 4
    endpoint.num_in_flight = 0
    env.loop.step()
    assert env.store.get_deployment("iris", "1").num_desired == 4  # cooling down
    env.offset_ms += 10_001
    env.loop.step()
    assert env.store.get_deployment("iris", "1").num_desired == 3
    assert any("autoscale" in e.message for e in env.store.list_events("iris"))


def test_fixed_size_deployment_is_left_alone(env: Env) -> None:
    env.store.apply([Scale("iris", "1", 2)])
    env.store.set_scaling("iris", "1", 2, 2)
    env.table.add_endpoint("iris", "1", Endpoint("iris-1-1", "http://x", num_in_flight=100))
    env.loop.step()
    assert env.store.get_deployment("iris", "1").num_desired == 2
    assert env.runtime.counts == {("iris", "1"): 2}  # the stored size, reconciled, unchanged


@pytest.mark.parametrize(("bounds", "num_running"), [
    ((2, 2), 2),  # fixed size: the autoscaler skips it
    ((2, 4), 2),  # autoscaled: its policy starts from the stored size, already 2
    ((0, 0), 0),
], ids=["fixed-2", "min-2-of-4", "fixed-0"])
def test_scaling_bounds_put_through_the_api_reach_the_runtime(
        env: Env, bounds: tuple[int, int], num_running: int) -> None:
    """`PUT .../scaling` that moves the size starts (or stops) instances, not only the row."""
    env.store.announce_package("iris", "1", "python", "/p/1", {})
    env.store.apply([Scale("iris", "1", 1)])
    env.loop.step()  # reconciled: one instance runs
    assert env.runtime.counts == {("iris", "1"): 1}
    client = TestClient(create_app(env.plane))
    low, high = bounds
    r = client.put("/v1/deployments/iris/1/scaling",
                   json={"min_instances": low, "max_instances": high})
    assert r.status_code == 200 and r.json()["num_desired"] == num_running
    assert env.runtime.counts == {("iris", "1"): num_running}
    for _ in range(3):  # and the loop's passes keep it there
        env.loop.step()
    assert env.runtime.counts == {("iris", "1"): num_running}
    assert env.store.get_deployment("iris", "1").num_desired == num_running
    assert any(f"-> {num_running} (bounds" in e.message for e in env.store.list_events("iris"))
    # a bad bound after it changes nothing, and the plane still answers
    r = client.put("/v1/deployments/iris/1/scaling", json={"min_instances": 3,
                                                           "max_instances": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "min_instances"
    assert env.runtime.counts == {("iris", "1"): num_running}
    assert client.get("/v1/status").status_code == 200


def test_idle_versioned_versions_are_stopped_but_latest_is_kept(env: Env) -> None:
    env.store.apply([Scale("iris", "1", 1), Scale("iris", "2", 1), Scale("iris", "3", 1),
                     MoveAlias("iris", "latest", "3")], strategy="versioned")
    env.offset_ms = 120_000
    env.stats.record("iris", "2", Outcome(env.now() - 1_000, 5.0, True))  # recently used
    env.loop.step()
    desired = {d.version: d.num_desired for d in env.store.list_deployments("iris")}
    assert desired == {"1": 0, "2": 1, "3": 1}
    assert env.runtime.counts == {("iris", "1"): 0, ("iris", "2"): 1, ("iris", "3"): 1}


def test_recent_use_is_persisted_so_a_restart_keeps_busy_versions(env: Env) -> None:
    env.store.apply([Scale("iris", "1", 1), Scale("iris", "2", 1),
                     MoveAlias("iris", "latest", "2")], strategy="versioned")
    env.offset_ms = 120_000
    used_at = env.now() - 1_000
    env.stats.record("iris", "1", Outcome(used_at, 5.0, True))
    env.loop.step()
    assert env.store.get_deployment("iris", "1").last_request_ms == used_at
    # a new control plane: no in-memory stats, the stored time still protects the version
    fresh = ControlLoop(env.plane, env.runtime, env.table, VersionStats(), env.loop.config)
    fresh.step()
    assert env.store.get_deployment("iris", "1").num_desired == 1


def test_a_redeployed_version_counts_idle_time_from_its_redeployment(env: Env) -> None:
    env.store.apply([Scale("iris", "1", 1), MoveAlias("iris", "latest", "2"),
                     Scale("iris", "2", 1)], strategy="versioned")
    env.offset_ms = 120_000
    env.loop.step()
    assert env.store.get_deployment("iris", "1").num_desired == 0  # idle: collected
    # deployed again; the store stamps it with the real time, so the fake clock restarts there
    env.store.apply([Scale("iris", "1", 1)], strategy="versioned")
    env.offset_ms = 1_000
    env.loop.step()
    assert env.store.get_deployment("iris", "1").num_desired == 1
    env.offset_ms = 62_000
    env.loop.step()
    assert env.store.get_deployment("iris", "1").num_desired == 0
