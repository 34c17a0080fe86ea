"""Scale to zero and back in the control loop (a real supervisor, fake instances, a fake
clock): a deployment with `min_instances: 0` is marked in the route table as started on
demand, stops its last instance once idle for its cooldown, and starts one again on the
requests the gateways report holding for it (`gateway.hold`, tested in tests/gateway)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from podium.control.runtime.base import READY
from tests.support.autoscale_env import Env, open_env


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    with open_env(tmp_path) as e:
        yield e

IRIS = {"name": "iris", "version": "1", "backend": "python",
        "autoscale": {"scale_down_cooldown_ms": 5_000}}


def _none_left(env: Env) -> None:
    for _ in range(50):
        if not env.runtime.instances() and not env.table.endpoints():
            return
        env.step()
    raise AssertionError(f"instances left: {env.runtime.instances()}")


def test_an_idle_deployment_scales_to_zero_and_back_on_held_requests(env: Env) -> None:
    env.deploy(IRIS, 0, 2)
    env.ready(1)
    assert env.step() == 1
    assert env.table.on_demand() == {"iris": ["1"]}  # the gateways hold its requests at zero
    assert env.step(4_000) == 1  # idle, inside its idle timeout (the cooldown)
    assert env.step(1_000) == 0
    _none_left(env)
    assert env.table.waiting_version("iris", "1") == "1"
    for _ in range(5):  # at zero and idle: stays there
        assert env.step(60_000) == 0
    env.table.held = {("iris", "1"): 3}  # what the gateways report holding
    assert env.step() == 1
    assert "iris@1 -> 1 (autoscale: in_flight 3/instance > target 8)" in env.events()
    env.table.held = {}
    env.ready(1)
    assert [i.state for i in env.runtime.instances()] == [READY]
    assert env.table.waiting_version("iris", "1") is None  # served straight through now


def test_a_deployment_with_a_floor_is_not_started_on_demand(env: Env) -> None:
    env.deploy(IRIS, 1, 2)
    env.ready(1)
    for _ in range(3):
        assert env.step(60_000) == 1
    assert env.table.on_demand() == {}
    env.store.set_scaling("iris", "1", 0, 2)  # opened to zero: marked from the next pass
    env.step()
    assert env.table.on_demand() == {"iris": ["1"]}
    env.store.set_scaling("iris", "1", 1, 2)
    env.step()
    assert env.table.on_demand() == {}
