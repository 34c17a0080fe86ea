"""The control plane's periodic work: one `step()` = one pass, its phases numbered in order.

    1. observe    the world as stored (once per driver), then every region's instances, and
                  the gateways' drain reports
    2. rollouts   each running rollout one step (`driver`: observe → decide → write → act)
    3. autoscale  each autoscaled deployment (`autoscaler` → `autoscale.decide`)
    4. GC         idle versions of versioned deployments scaled to 0 (`gc.idle_versions`)
    5. publish    the route tables are whole: gateways may take them

Runs in its own thread under `podium up` (the store and the runtime probes are blocking); a
pass holds the plane's lock once, so API calls never interleave with it. Every change goes
through one write-then-act commit (`control.commit`). Under `podium up` a pass first checks
that the plane still holds its database lock (a plane that lost it to another stops acting and
exits; see plane_lock), and the gateway processes are watched after every pass.

When the database goes away (`StoreUnavailable`) the loop pauses: one warning names the reason,
rollouts take no step, the gateway keeps the routes it has, and instances are still watched (a
crashed one leaves routing at once; its restart waits). Each pass then asks the database once;
when it answers, the loop logs how long it was paused, moves the running rollouts' timers on by
as much, re-applies the desired state and carries on.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from podium.control.actions import Scale
from podium.control.autoscale import DEFAULT_TARGETS, Targets
from podium.control.autoscaler import Autoscaler
from podium.control.gc import VersionUsage, idle_versions
from podium.control.plane import ControlPlane
from podium.control.plane_lock import AlreadyRunning, PlaneLock
from podium.control.region_world import Region
from podium.control.rollout import LATEST
from podium.control.runtime.base import Runtime
from podium.control.store import StoreUnavailable
from podium.routes.stats import VersionStats
from podium.routes.table import RouteTable

if TYPE_CHECKING:
    from podium.control.gateway_feed import RouteFeed
    from podium.control.gateways import GatewayProcesses

log = logging.getLogger("podium.control")
TOUCH_EVERY_MS = 60_000
LOCK_CHECK_S = 5.0
"""How often the loop checks that the database lock is still this plane's."""


@dataclass(frozen=True)
class LoopConfig:
    """How often the loop runs and what it manages besides rollouts."""

    interval_s: float = 0.5
    """Seconds between passes."""
    target_in_flight: float = DEFAULT_TARGETS.target_in_flight
    """Autoscaler target of in-flight requests per instance."""
    scale_down_cooldown_ms: int = DEFAULT_TARGETS.scale_down_cooldown_ms
    """Autoscaler scale-down cooldown."""
    version_ttl_ms: int = 3_600_000
    """Versioned deployments idle this long are stopped (never the latest)."""


@dataclass(frozen=True)
class Outage:
    """The database stopped answering: when (wall clock, monotonic) and why."""

    since_ms: int
    since_s: float
    reason: str


class ControlLoop:
    """One `step()` = observe, advance rollouts, autoscale, collect idle versions, publish; in
    every region (`regions`; without it, the one region of `runtime`, `table`, `stats`).
    `podium up` adds its route `feeds`, its `gateways` and its `plane_lock`."""

    def __init__(self, plane: ControlPlane, runtime: Runtime, table: RouteTable,
                 stats: VersionStats, config: LoopConfig | None = None, *,
                 regions: list[Region] | None = None, feeds: list[RouteFeed] | None = None,
                 gateways: list[GatewayProcesses] | None = None,
                 plane_lock: PlaneLock | None = None,
                 on_deposed: Callable[[], None] = lambda: None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.plane = plane
        self.driver = plane.driver
        self.commit = plane.driver.commit
        self.regions = {r.name: r for r in regions or [Region.default(runtime, table, stats)]}
        self.config = config or LoopConfig()
        self.autoscaler = Autoscaler(plane.store, self.regions, self.commit, Targets(
            target_in_flight=self.config.target_in_flight,
            scale_down_cooldown_ms=self.config.scale_down_cooldown_ms))
        self.feeds = feeds or []
        self.gateways = gateways or []
        self.plane_lock = plane_lock
        self.on_deposed = on_deposed
        self.monotonic = monotonic
        self._stop = threading.Event()
        self._lock_checked_s = monotonic()
        self.outage: Outage | None = None
        """Set while the loop is paused because the database is away."""
        self.deposed: AlreadyRunning | None = None
        """Set when another plane took the database lock: this one acts no more."""

    def step(self) -> None:
        """One pass (raises StoreUnavailable while the database is away)."""
        if self.deposed is not None or not self._lock_held():
            return
        try:
            with self.plane.lock:
                # 1. observe: drains, back from an outage?, the stored world, instances
                self._observe()
                now = self.plane.clock()
                # 2. rollouts: each running one a step
                self.driver.step(now)
                busy = {r.state.model for r in self.plane.store.list_rollouts(status="running")}
                # 3. autoscale: each autoscaled deployment not in a rollout
                self.autoscaler.step(now, busy)
                # 4. GC: versions idle past their TTL
                self._collect(now, busy)
            # 5. publish: only a pass that went through (instances probed back in) makes a
            # table whole; until then gateways keep the one they have
            for feed in self.feeds:
                feed.open()
        finally:
            for gateways in self.gateways:
                gateways.poll()  # even while the store is away

    def run_forever(self) -> None:
        """Pass until `stop()`."""
        while not self._stop.is_set():
            self.run_once()
            self._stop.wait(self.config.interval_s)

    def run_once(self) -> None:
        """One pass that never raises: an error is logged (the next pass still runs), a
        database outage pauses the loop until the database answers again."""
        try:
            self.step()
        except StoreUnavailable as exc:
            self._pause(exc)
        except Exception:  # a bad pass must not stop rollouts for good
            log.exception("control loop pass failed")
            self.driver.resync()  # it may have failed between writing and acting

    def _pause(self, exc: StoreUnavailable) -> None:
        self.driver.resync()  # a step may have been written but not carried out
        if self.outage is None:  # one line per outage, however long it lasts
            self.outage = Outage(self.plane.clock(), self.monotonic(), exc.message)
            log.warning("control loop paused: %s; rollouts wait, the gateway keeps routing on "
                        "its last routes; retrying every %.1f s", exc.message,
                        self.config.interval_s)
        else:
            log.debug("control loop still paused: %s", exc.message)

    def _observe(self) -> None:
        """Phase 1: re-count drains; while paused, watch instances and ask the database (raises
        while it is away); then make the world match the store (once per driver: after a boot,
        a failed pass or an outage) and poll every region's instances."""
        for feed in self.feeds:
            feed.changed()  # re-count drains against the gateways' latest reports
        if self.outage is not None:
            with contextlib.suppress(StoreUnavailable):  # what it could not write waits
                self._poll()
            self._check_back(self.outage)
        self.driver.reconcile()
        self._poll()

    def _check_back(self, outage: Outage) -> None:
        """The database answers again (`ping` raises while it does not): timers move on."""
        self.plane.store.ping()
        paused_ms = max(0, self.plane.clock() - outage.since_ms)
        reason = f"database unreachable: {outage.reason}"
        self.driver.resume(paused_ms, reason, self.plane.clock())
        self.plane.store.record_event(
            "control", f"control loop paused {paused_ms / 1000:.1f} s ({reason}); resumed")
        log.warning("control loop resumed: the database answers again after %.1f s",
                    self.monotonic() - outage.since_s)
        self.outage = None

    def _lock_held(self) -> bool:
        """Renew the database lock every LOCK_CHECK_S (each pass while it could not be
        checked); False, and the plane stops, once another plane holds it."""
        if self.plane_lock is None or self.monotonic() - self._lock_checked_s < LOCK_CHECK_S:
            return True
        try:
            if self.plane_lock.renew():
                self._lock_checked_s = self.monotonic()
        except AlreadyRunning as exc:
            self.deposed = exc
            log.error("this control plane lost its database lock while the database was away "
                      "and %s; it stops acting and exits, leaving the instances to that one",
                      exc.message.removeprefix("another "))
            self.stop()
            self.on_deposed()
            return False
        return True

    def stop(self) -> None:
        """Ask `run_forever` to return after its current pass."""
        self._stop.set()

    def _poll(self) -> None:
        """Poll every region's runtime (all of them even when the database is away)."""
        failed: StoreUnavailable | None = None
        for region in self.regions.values():
            try:
                region.runtime.poll()
            except StoreUnavailable as exc:
                failed = failed or exc
        if failed is not None:
            raise failed

    def _collect(self, now_ms: int, busy: set[str]) -> None:
        """Phase 4: versions idle longer than `version_ttl_ms` scaled to 0."""
        by_model: dict[tuple[str, str], list[VersionUsage]] = {}
        for dep in self.plane.store.list_deployments():
            region = self.regions.get(dep.region)
            if region is not None and dep.strategy == "versioned" and dep.num_desired > 0:
                deployed_ms = int(dep.created_at.timestamp() * 1000)
                seen = region.stats.last_request_ms(dep.model, dep.version)
                if seen - dep.last_request_ms > TOUCH_EVERY_MS:
                    # persisted now and then, so a restart does not make a busy version look idle
                    self.plane.store.touch(dep.model, dep.version, seen, region=dep.region)
                last = max(dep.last_request_ms, seen)
                by_model.setdefault((dep.region, dep.model), []).append(
                    VersionUsage(dep.version, last, deployed_ms))
        for (region_name, model), usages in by_model.items():
            latest = self.plane.store.aliases(model, region_name).get(LATEST)
            # while a rollout of the model runs, none of its versions is collected
            held = {u.version for u in usages} if model in busy else set()
            for version in idle_versions(usages, latest=latest, busy=held, now_ms=now_ms,
                                         ttl_ms=self.config.version_ttl_ms):
                self.commit.scale(Scale(model, version, 0, region=region_name),
                                  f"idle longer than {self.config.version_ttl_ms} ms")
