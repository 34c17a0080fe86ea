"""The control plane's side of its gateways: it publishes the route table, they report back.

Gateways run in their own processes (`podium gateway`); each long-polls `POST
/v1/gateways/sync`, sending its in-flight counts and finished requests and getting the table
back as soon as it changes (or after `wait_s`). Their reports are what the control plane sees
of traffic: outcomes feed the rollout analysis (`VersionStats`), in-flight counts the drain and
the autoscaler (summed over gateways on the control plane's own endpoints).

A drain is over only once no gateway can send the instance a new request: until a gateway
reports under a table that already marks it draining, it counts one request in flight there.
For the first `grace_s` after a (re)start, gateways not heard from yet may still route by the
previous control plane's table, so the same holds for all of them.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from podium.routes.stats import VersionStats
from podium.routes.sync import (
    ModelSpec,
    SyncAnswer,
    SyncReport,
    record_outcomes,
    snapshot,
)
from podium.routes.table import Endpoint, RouteTable

STALE_S = 5.0
"""A gateway silent this long no longer counts (its process is gone or cut off)."""
GRACE_S = 3.0
"""After a start, how long drains wait for gateways that have not reported yet."""


@dataclass
class _Gateway:
    report: SyncReport
    seen_s: float
    acked: int = -1
    """Generation of this epoch the gateway routes by (-1: an older table, or none)."""
    num_outcomes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class RouteFeed:
    """Numbers the control plane's route table and tracks what each gateway has of it."""

    def __init__(self, table: RouteTable, stats: VersionStats, *,
                 clock: Callable[[], float] = time.monotonic, stale_s: float = STALE_S,
                 grace_s: float = GRACE_S) -> None:
        self.table = table
        self.stats = stats
        self.clock = clock
        self.stale_s = stale_s
        self.epoch = uuid.uuid4().hex[:12]
        self.generation = 0
        self._started_s = clock()
        self._grace_s = grace_s
        self._last: dict[str, ModelSpec] | None = None
        self._drain_since: dict[str, int] = {}
        """Endpoint id → first generation that marks it draining."""
        self._ready = False
        self._gateways: dict[str, _Gateway] = {}
        self._cond = threading.Condition()

    def open(self) -> None:
        """The table is whole (the first control-loop pass ran): gateways may take it."""
        with self._cond:
            self._ready = True
            self._cond.notify_all()

    def changed(self) -> None:
        """The table changed: number it, wake the gateways' polls, re-count drains."""
        with self._cond:
            self._current()
            self._refresh_in_flight()
            self._cond.notify_all()

    def sync(self, report: SyncReport, *, wait_s: float) -> SyncAnswer:
        """Take a gateway's report; answer the current table once it differs from the one the
        gateway has, or after `wait_s`."""
        num = record_outcomes(self.stats, report.outcomes)
        with self._cond:
            gateway = self._gateways.get(report.gateway_id)
            if gateway is None:
                gateway = self._gateways[report.gateway_id] = _Gateway(report, self.clock())
            gateway.report, gateway.seen_s = report, self.clock()
            gateway.acked = report.generation if report.epoch == self.epoch else -1
            gateway.num_outcomes += num
            self._current()
            self._refresh_in_flight()
            self._cond.wait_for(
                lambda: self._ready and (report.epoch, report.generation) != (
                    self.epoch, self._current()), timeout=wait_s)
            generation = self._current()
            return SyncAnswer(self.epoch, generation, self._last if self._ready else None,
                              elsewhere=self._in_flight_elsewhere(report.gateway_id))

    def forget_gateways(self) -> None:
        """The gateways are stopped: none counts any more, drains end at once."""
        with self._cond:
            self._gateways.clear()
            self._grace_s = 0.0
            self._refresh_in_flight()

    def gateways(self) -> list[dict[str, Any]]:
        """Every gateway heard from: where, when, and whether it has the current table."""
        now = self.clock()
        with self._cond:
            current = self._current()
            return [{"id": g.report.gateway_id, "pid": g.report.pid, "http": g.report.http,
                     "seen_s_ago": round(now - g.seen_s, 3),
                     "live": now - g.seen_s < self.stale_s,
                     "in_sync": g.acked == current and self._ready,
                     "generation": g.acked, "num_outcomes": g.num_outcomes}
                    for g in sorted(self._gateways.values(), key=lambda g: g.report.gateway_id)]

    def _current(self) -> int:
        # attribute writes (a probe's `healthy`) bypass `changed`: compare copies as well
        routes = snapshot(self.table)
        if routes != self._last:
            self._last = routes
            self.generation += 1
            draining = {e.id for spec in routes.values() for eps in spec.endpoints.values()
                        for e in eps if e.draining}
            self._drain_since = {i: self._drain_since.get(i, self.generation) for i in draining}
        return self.generation

    def _in_flight_elsewhere(self, gateway_id: str) -> dict[str, int]:
        """Per endpoint, what the live gateways other than `gateway_id` last reported."""
        now = self.clock()
        counts: dict[str, int] = {}
        for g in self._gateways.values():
            if g.report.gateway_id != gateway_id and now - g.seen_s < self.stale_s:
                for endpoint_id, num in g.report.in_flight.items():
                    if num > 0:
                        counts[endpoint_id] = counts.get(endpoint_id, 0) + num
        return counts

    def _refresh_in_flight(self) -> None:
        now = self.clock()
        live = [g for g in self._gateways.values() if now - g.seen_s < self.stale_s]
        unknown = 1 if now - self._started_s < self._grace_s else 0
        for endpoint in self.table.endpoints():
            num = sum(g.report.in_flight.get(endpoint.id, 0) for g in live)
            since = self._drain_since.get(endpoint.id)
            if since is not None:  # a gateway on an older table may still send it requests
                num += sum(1 for g in live if g.acked < since) + unknown
            endpoint.num_in_flight = num
        held: dict[tuple[str, str], int] = {}
        for g in live:
            for model, versions in g.report.held.items():
                for version, num in versions.items():
                    held[model, version] = held.get((model, version), 0) + num
        self.table.held = held


class PublishedTable(RouteTable):
    """The control plane's route table: every change goes out to the gateways at once."""

    def __init__(self) -> None:
        super().__init__()
        self.feed: RouteFeed | None = None

    def _changed(self) -> None:
        if self.feed is not None:
            self.feed.changed()

    def set_split(self, model: str, weights: dict[str, int]) -> None:
        """Route the model's unversioned traffic by these weights."""
        super().set_split(model, weights)
        self._changed()

    def set_alias(self, model: str, alias: str, version: str) -> None:
        """Point an alias at a version."""
        super().set_alias(model, alias, version)
        self._changed()

    def set_adapter(self, adapter: str, base: str, version: str, placed: bool) -> None:
        """Place (or remove) adapter@version on its base's instances."""
        super().set_adapter(adapter, base, version, placed)
        self._changed()

    def add_endpoint(self, model: str, version: str, endpoint: Endpoint) -> None:
        """Start routing to a (ready) instance."""
        super().add_endpoint(model, version, endpoint)
        self._changed()

    def set_on_demand(self, model: str, version: str, on: bool) -> None:
        """Mark a version as started on demand."""
        super().set_on_demand(model, version, on)
        self._changed()

    def remove_endpoint(self, endpoint_id: str) -> None:
        """Forget an instance (after it drained)."""
        super().remove_endpoint(endpoint_id)
        self._changed()

    def drain(self, endpoint_id: str) -> Endpoint:
        """Stop new requests to an instance; counted busy until every gateway knows."""
        endpoint = super().drain(endpoint_id)
        self._changed()
        return endpoint
