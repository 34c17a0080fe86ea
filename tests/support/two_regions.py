"""Two regions wired as `podium up --region a,... --region b,...` would, in-process with test
timings: a store, a gateway and a runtime per region (local processes by default), one control
loop over both."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

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
from podium.routes.table import RouteTable
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
