"""The autoscaler in the control loop: a real supervisor scraping fake engines' /metrics over
loopback HTTP (with the plane's credential), targets from the package, a fake clock.

Each "instance" is an in-process HTTP server answering `/health/ready` and vLLM's gauges on
`/metrics`; the test sets its gauges the way an engine under load would."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from podium.control.api import create_app
from podium.control.rollout_config import RolloutConfig
from tests.support.autoscale_env import LLM, Env, open_env


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    with open_env(tmp_path) as e:
        yield e


@pytest.mark.parametrize(("gauge", "value", "reason"), [
    ("waiting", 3.0, "waiting 3/instance > target 1"),
    ("kv", 0.95, "kv_cache_usage 0.95/instance > target 0.8"),
], ids=["waiting", "kv-cache"])
def test_an_llm_scales_up_on_its_engine_signal_and_back_after_the_cooldown(
        env: Env, gauge: str, value: float, reason: str) -> None:
    env.deploy({**LLM, "autoscale": {"target_waiting": 1, "max_kv_cache_usage": 0.8,
                                     "scale_up_window_ms": 5_000,
                                     "scale_down_cooldown_ms": 20_000}}, 1, 3)
    [engine] = env.ready(1)
    setattr(engine, gauge, value)  # no request in flight at the gateway: only the engine knows
    assert env.step() == 1  # over its target since now
    assert env.step(4_000) == 1  # for 4 s: inside the window
    assert env.step(1_000) == (3 if gauge == "waiting" else 2)
    assert env.events()[0] == f"smol@1 -> {env.step()} (autoscale: {reason})"
    engines = env.ready(3 if gauge == "waiting" else 2)
    for e in engines:
        e.waiting, e.kv = 0.0, 0.1
    assert env.step() == len(engines)
    assert env.step(19_000) == len(engines)  # cooling down
    assert env.step(1_000) == len(engines) - 1
    # one at a time, each after a cooldown of its own
    for _ in range(len(engines) - 1):
        assert env.step(20_000) >= 1
    assert env.step(20_000) == 1
    assert env.ready(1)


def test_a_failed_scrape_holds_the_instances_instead_of_scaling_down(env: Env) -> None:
    env.deploy({**LLM, "autoscale": {"target_waiting": 1, "scale_down_cooldown_ms": 10_000}},
               1, 2, count=2)
    _idle, second = env.ready(2)
    second.status = 500  # its /metrics fails: idle or not, nobody knows
    # its last good reading (taken as it turned ready, both idle: low since then) stands for
    # 3 scrape intervals, 30 ms here; a pass within that would scale down on it, as designed.
    # The reading is let age first: the test is about after
    env.monotonic_s += 0.1
    for _ in range(10):
        assert env.step(10_000) == 2
    assert second.num_scrapes >= 10  # tried every pass (the interval is 10 ms here)
    second.status = 200
    assert env.step(1_000) == 2  # low from now: the cooldown starts again
    assert env.step(10_000) == 1
    assert "waiting 0/instance < target 1" in env.events()[0]


def test_a_package_without_engine_targets_is_never_scraped(env: Env) -> None:
    env.deploy({"name": "iris", "version": "1", "backend": "python",
                "autoscale": {"target_in_flight": 2, "scale_down_cooldown_ms": 5_000}}, 1, 3)
    [engine] = env.ready(1)
    engine.waiting = 50.0
    for _ in range(5):
        assert env.step(10_000) == 1
    assert engine.num_scrapes == 0
    [endpoint] = env.table.endpoints()
    endpoint.num_in_flight = 5  # its own target, not the plane's default of 8
    assert env.step() == 3
    assert env.events()[0] == "iris@1 -> 3 (autoscale: in_flight 5/instance > target 2)"


def test_deploy_instances_are_the_floor_until_bounds_are_set(env: Env) -> None:
    """`podium deploy --instances 2` keeps 2 (was: shrunk to 1 after the cooldown)."""
    env.store.announce_package("iris", "1", "python", "/p/1", {"backend": "python"})
    env.plane.deploy("iris", "1", RolloutConfig(stages=(100,), num_instances=2,
                                                analysis_window_ms=0, warm_delay_ms=0))
    env.ready(2)
    for _ in range(10):
        assert env.step(60_000) == 2
    row = env.store.list_deployments()[0]
    assert (row.min_instances, row.max_instances, row.num_desired) == (2, 2, 2)
    # the user opens a range through the API: now it is autoscaled, down to their floor
    client = TestClient(create_app(env.plane))
    bad = client.put("/v1/deployments/iris/1/scaling", json={"min_instances": 3,
                                                             "max_instances": 1})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "min_instances"
    assert client.put("/v1/deployments/iris/1/scaling",
                      json={"min_instances": 1, "max_instances": 4}).status_code == 200
    assert env.step() == 2
    assert env.step(60_000) == 1
    assert env.ready(1)


@pytest.mark.parametrize(("autoscale", "field"), [
    ({"target_waiting": 1}, "autoscale.target_waiting"),  # an engine signal, not an LLM
    ({"scale_down_cooldown_ms": -1}, "autoscale.scale_down_cooldown_ms"),
    ({"target_in_flight": 0}, "autoscale.target_in_flight"),
], ids=["engine-target-on-python", "negative-cooldown", "zero-in-flight"])
def test_bad_autoscale_targets_are_a_400_naming_the_field(
        env: Env, tmp_path: Path, autoscale: dict, field: str) -> None:
    from tests.support.control_api import package_dir

    client = TestClient(create_app(env.plane))
    (tmp_path / "bad").mkdir()
    r = client.post("/v1/packages", json={
        "path": package_dir(tmp_path / "bad", "iris", "1", autoscale=autoscale)})
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    assert field in r.json()["error"]["message"]
    good = client.post("/v1/packages", json={"path": package_dir(
        tmp_path, "iris", "1", autoscale={"target_in_flight": 4})})
    assert good.status_code == 201, good.text
