"""The control plane's periodic work, one pass at a time: instances → rollouts → scale → GC.

Runs in its own thread under `podium up` (the store and the runtime probes are blocking); every
pass holds the plane's lock so API calls never interleave with it.

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
from dataclasses import dataclass

from podium.control.actions import DEFAULT_REGION, Scale
from podium.control.autoscaler import Autoscaler, Defaults
from podium.control.gc import VersionUsage, idle_versions
from podium.control.plane import ControlPlane
from podium.control.region_world import Region
from podium.control.rollout import LATEST
from podium.control.runtime.base import Runtime
from podium.control.store import StoreUnavailable
from podium.gateway.routing import RouteTable
from podium.gateway.stats import VersionStats

log = logging.getLogger("podium.control")
TOUCH_EVERY_MS = 60_000


@dataclass(frozen=True)
class LoopConfig:
    """How often the loop runs and what it manages besides rollouts."""

    interval_s: float = 0.5
    """Seconds between passes."""
    target_in_flight: float = 8.0
    """Autoscaler target of in-flight requests per instance."""
    scale_down_cooldown_ms: int = 60_000
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
    """One `step()` = poll instances, advance rollouts, autoscale idle models, collect versions;
    in every region (`regions`; without it, the one region of `runtime`, `table`, `stats`)."""

    def __init__(self, plane: ControlPlane, runtime: Runtime, table: RouteTable,
                 stats: VersionStats, config: LoopConfig | None = None, *,
                 regions: list[Region] | None = None) -> None:
        self.plane = plane
        self.regions = {r.name: r for r in regions or [Region.default(runtime, table, stats)]}
        self.runtime = runtime
        self.table = table
        self.stats = stats
        self.config = config or LoopConfig()
        self.autoscaler = Autoscaler(
            plane.store, self.regions,
            lambda model, version, n, why, region: self._scale(model, version, n, why,
                                                               region=region),
            Defaults(target_in_flight=self.config.target_in_flight,
                     scale_down_cooldown_ms=self.config.scale_down_cooldown_ms))
        self._stop = threading.Event()
        self.outage: Outage | None = None
        """Set while the loop is paused because the database is away."""

    def step(self) -> None:
        """One pass."""
        with self.plane.lock:
            self.plane.driver.reconcile()  # after a boot or a failed pass: the world as stored
            self._poll()
            self.plane.tick()
            now = self.plane.clock()
            busy = {r.state.model for r in self.plane.store.list_rollouts(status="running")}
            self._autoscale(now, busy)
            self._collect(now, busy)

    def run_forever(self) -> None:
        """Pass until `stop()`."""
        while not self._stop.is_set():
            self.run_once()
            self._stop.wait(self.config.interval_s)

    def run_once(self) -> None:
        """One pass that never raises: an error is logged (the next pass still runs), a
        database outage pauses the loop until the database answers again."""
        try:
            if self.outage is not None:
                self._check_back()
            self.step()
        except StoreUnavailable as exc:
            self._pause(exc)
        except Exception:  # a bad pass must not stop rollouts for good
            log.exception("control loop pass failed")
            self.plane.driver.resync()  # it may have failed between writing and acting

    def _pause(self, exc: StoreUnavailable) -> None:
        self.plane.driver.resync()  # a step may have been written but not carried out
        if self.outage is None:  # one line per outage, however long it lasts
            self.outage = Outage(self.plane.clock(), time.monotonic(), exc.message)
            log.warning("control loop paused: %s; rollouts wait, the gateway keeps routing on "
                        "its last routes; retrying every %.1f s", exc.message,
                        self.config.interval_s)
        else:
            log.debug("control loop still paused: %s", exc.message)

    def _check_back(self) -> None:
        """While paused: keep watching instances, then ask the database (raises while away)."""
        assert self.outage is not None
        with self.plane.lock:
            with contextlib.suppress(StoreUnavailable):  # what it could not write waits
                self._poll()
            self.plane.store.ping()
            paused_ms = max(0, self.plane.clock() - self.outage.since_ms)
            reason = f"database unreachable: {self.outage.reason}"
            self.plane.driver.resume(paused_ms, reason, self.plane.clock())
            self.plane.store.record_event(
                "control", f"control loop paused {paused_ms / 1000:.1f} s ({reason}); resumed")
        log.warning("control loop resumed: the database answers again after %.1f s",
                    time.monotonic() - self.outage.since_s)
        self.outage = None

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

    def _autoscale(self, now_ms: int, busy: set[str]) -> None:
        self.autoscaler.step(now_ms, busy)  # observe → decide → scale, in control/autoscaler.py

    def _collect(self, now_ms: int, busy: set[str]) -> None:
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
                self._scale(model, version, 0, f"idle longer than {self.config.version_ttl_ms} ms",
                            region=region_name)

    def _scale(self, model: str, version: str, count: int, why: str, *,
               region: str = DEFAULT_REGION) -> None:
        action = Scale(model, version, count, region=region)
        self.plane.store.apply([action])  # written before acted on, like rollout steps
        self.plane.world.apply([action])
        where = "" if region == DEFAULT_REGION else f" in {region}"
        self.plane.store.record_event("scale", f"{model}@{version} -> {count}{where} ({why})",
                                      model)
