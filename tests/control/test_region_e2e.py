"""End to end, two regions on this machine: two local runtimes of real `podium serve` instances
(the Python backend), two real gateways, one control loop; 16 clients load both gateways while
a good version rolls out region by region and a broken one fails in the first region."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from podium.control.actions import MoveAlias, Scale, SetSplit
from podium.control.loop import ControlLoop, LoopConfig
from podium.control.plane import ControlPlane
from podium.control.region_config import RegionSpec
from podium.control.region_world import Region, RegionWorlds
from podium.control.rollout_config import RolloutConfig
from podium.control.runtime.base import Runtime
from podium.control.runtime.local import LocalRuntime
from podium.control.store import Store
from podium.gateway.proxy import Gateway
from podium.gateway.routing import RouteTable
from tests.support.echo_platform import Load, write_echo
from tests.support.servers import Served

NAMES = ("a", "b")
RuntimeFactory = Callable[[Store, RouteTable, Path], Runtime]
BAKE_MS = 2_000
# loose on latency as in test_e2e_rollout (2 shared cores); errors are what this run judges
STAGED = RolloutConfig(stages=(50, 100), num_instances=1, ready_timeout_ms=60_000,
                       analysis_window_ms=1_500, min_requests=20, warm_delay_ms=500,
                       max_p99_ratio=4.0, p99_slack_ms=100.0, bake_ms=BAKE_MS)


def local_runtime(store: Store, table: RouteTable, workdir: Path) -> Runtime:
    return LocalRuntime(store, table, workdir, drain_timeout_s=10)


class TwoRegions:
    """What `podium up --region a,... --region b,...` wires, in-process with test timings;
    `runtime_for` gives a region its runtime (default: local processes in both)."""

    def __init__(self, root: Path, runtime_for: dict[str, RuntimeFactory] | None = None,
                 credential: str | None = None) -> None:
        self.store = Store.open(f"sqlite:///{root / 'control.db'}")
        self.store.set_regions([RegionSpec(n, http_port=9100 + i, grpc_port=-1)
                                for i, n in enumerate(NAMES)])
        self.gateways = {n: Gateway(upstream_credential=credential) for n in NAMES}
        factories = runtime_for or {}
        self.runtimes = {n: factories.get(n, local_runtime)(
            self.store.for_region(n), self.gateways[n].table, root / n / "instances")
                         for n in NAMES}
        regions = [Region(n, self.runtimes[n], self.gateways[n].table, self.gateways[n].stats)
                   for n in NAMES]
        self.plane = ControlPlane(self.store, RegionWorlds(regions), materialize=lambda _p: None)
        first = regions[0]
        self.loop = ControlLoop(self.plane, first.runtime, first.table, first.stats,
                                LoopConfig(interval_s=0.1), regions=regions)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.served = {n: Served(g.app()) for n, g in self.gateways.items()}

    def serve_v1(self) -> None:
        """echo@1 in both regions at once, as an earlier rollout would have left it."""
        actions = [a for n in NAMES for a in (Scale("echo", "1", 1, region=n),
                                              SetSplit("echo", {"1": 100}, region=n),
                                              MoveAlias("echo", "latest", "1", region=n))]
        with self.plane.lock:
            self.store.apply(actions)
            self.plane.world.apply(actions)
        deadline = time.monotonic() + 60
        while not all(self.gateways[n].table.endpoints() for n in NAMES):
            assert time.monotonic() < deadline, "echo@1 never got ready"
            time.sleep(0.05)

    def wait_done(self, rollout_id: int, timeout_s: float = 90) -> str:
        deadline = time.monotonic() + timeout_s
        while (status := self.store.get_rollout(rollout_id).status) == "running":
            assert time.monotonic() < deadline, self.plane.rollout(rollout_id)
            time.sleep(0.05)
        return status

    def close(self) -> None:
        self.loop.stop()
        self.thread.join(timeout=10)
        with self.plane.lock:
            for runtime in self.runtimes.values():
                runtime.close()
        for served in self.served.values():
            served.stop()
        self.store.close()


@pytest.fixture
def regions(tmp_path: Path) -> Iterator[TwoRegions]:
    r = TwoRegions(tmp_path)
    yield r
    r.close()


def _step_at(steps: list, text: str) -> int:
    return next(s.at_ms for s in steps if text in s.note)


def test_two_regions_roll_one_after_the_other_and_a_broken_version_stops_in_the_first(
        regions: TwoRegions, tmp_path: Path) -> None:
    for version, params in (("1", {}), ("2", {}), ("3", {"fail": True})):
        regions.plane.announce(str(write_echo(tmp_path / "packages", version, **params)))
    regions.serve_v1()
    loads = {n: Load(regions.served[n].url, num_clients=8) for n in NAMES}  # 16 clients
    for load in loads.values():
        load.start()
    for load in loads.values():
        load.wait_requests(100)

    good = regions.plane.deploy("echo", "2", STAGED)
    assert regions.wait_done(good) == "succeeded", regions.store.get_rollout(good).reason
    steps = regions.store.rollout_steps(good)
    a_done = _step_at(steps, "a: warm delay over")
    b_start = _step_at(steps, "b starts")
    assert b_start - a_done >= BAKE_MS  # b started only once a finished and baked
    assert [s for s in steps if s.at_ms < b_start and "b:" in s.note] == []
    for name in NAMES:
        assert regions.store.splits("echo", name) == {"2": 100}
        assert regions.store.aliases("echo", name) == {"latest": "2"}

    broken = regions.plane.deploy("echo", "3", STAGED)
    assert regions.wait_done(broken) == "rolled_back"
    record = regions.store.get_rollout(broken)
    # at the first stage, unless a loaded machine gave v3 fewer than min_requests in its window
    assert re.match(r"a: analysis failed at (50|100)%: error rate 100\.0% vs 0\.0%",
                    record.reason), record.reason
    # v3 never reached b: no deployment, no instance, no route there
    assert [d.version for d in regions.store.list_deployments("echo", region="b")] == ["1", "2"]
    assert regions.store.list_instances("echo", "3", region="b", include_stopped=True) == []
    assert regions.store.splits("echo", "b") == {"2": 100}
    for load in loads.values():
        load.wait_requests(len(load.results) + 100)
    results = {n: load.stop() for n, load in loads.items()}

    for name, got in results.items():
        assert [r for r in got if r.status != 200] == [], name  # 0 failed requests
        assert {r.version for r in got[-50:]} == {"2"}, name
    assert {r.version for r in results["b"]} == {"1", "2"}
    # every request v3 failed in a was answered by v2 instead
    num_requests, num_errors, _ = regions.gateways["a"].stats.totals[("echo", "3")]
    assert num_errors == num_requests >= STAGED.min_requests
    assert ("echo", "3") not in regions.gateways["b"].stats.totals
