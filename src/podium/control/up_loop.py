"""The control loop as `podium up` runs it: each pass also publishes the route tables to the
gateway processes, watches those processes, and checks that the plane still holds its
database lock (a plane that lost it to another stops acting and exits; see plane_lock)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from podium.control.gateway_feed import RouteFeed
from podium.control.gateways import GatewayProcesses
from podium.control.loop import ControlLoop
from podium.control.plane_lock import AlreadyRunning, PlaneLock

log = logging.getLogger("podium.control")
LOCK_CHECK_S = 5.0
"""How often the loop checks that the database lock is still this plane's."""


class FeedingLoop(ControlLoop):
    """The control loop, plus what `podium up` adds to each pass: publish, watch gateways,
    and keep the plane's database lock (`PlaneLock.renew`)."""

    def __init__(self, *args: Any, feeds: list[RouteFeed], gateways: list[GatewayProcesses],
                 plane_lock: PlaneLock | None = None,
                 on_deposed: Callable[[], None] = lambda: None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.feeds = feeds
        self.gateways = gateways
        self.plane_lock = plane_lock
        self.on_deposed = on_deposed
        self.deposed: AlreadyRunning | None = None
        """Set when another plane took the database lock: this one acts no more."""
        self._lock_checked_s = time.monotonic()

    def step(self) -> None:
        """One pass; after the first, the route tables are whole and gateways may take them."""
        if self.deposed is not None or not self._lock_held():
            return
        try:
            for feed in self.feeds:
                feed.changed()  # re-count drains against the gateways' latest reports
            super().step()
            # only a pass that went through (instances probed back in) makes a table whole:
            # until then gateways keep the one they have
            for feed in self.feeds:
                feed.open()
        finally:
            for gateways in self.gateways:
                gateways.poll()  # even while the store is away


    def _lock_held(self) -> bool:
        """Renew the database lock every LOCK_CHECK_S (each pass while it could not be
        checked); False, and the plane stops, once another plane holds it."""
        if self.plane_lock is None or time.monotonic() - self._lock_checked_s < LOCK_CHECK_S:
            return True
        try:
            if self.plane_lock.renew():
                self._lock_checked_s = time.monotonic()
        except AlreadyRunning as exc:
            self.deposed = exc
            log.error("this control plane lost its database lock while the database was away "
                      "and %s; it stops acting and exits, leaving the instances to that one",
                      exc.message.removeprefix("another "))
            self.stop()
            self.on_deposed()
            return False
        return True
