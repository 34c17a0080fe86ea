"""Requests held for a version at zero instances while one starts (a cold start).

A version whose deployment starts on demand (`min_instances: 0`, marked in the route table by
the control plane) may have no ready instance. A request for it is then held here instead of
answered 503: the gateway reports the held requests to the control plane (`SyncReport.held`),
which counts them as demand and starts an instance (`control.autoscaler`); once the instance
is in the route table the request goes on as any other. Bounded both ways:

- at most `max_held` requests per version wait at once; one more is answered at once;
- each waits at most `max_wait_s`;

either way with 503 and `Retry-After` (`ColdStart`): never dropped, never left waiting.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

from podium.errors import ColdStart, NotFound, Unavailable
from podium.routes.table import RouteTable

T = TypeVar("T")
MAX_HELD = 64
"""Requests one version may have held at once (per gateway)."""
MAX_WAIT_S = 120.0
"""How long a held request waits for an instance before its 503 (``PODIUM_COLD_START_WAIT_S``
overrides it)."""
POLL_S = 0.05
"""How often a held request looks at the route table (it changes from another task)."""


class Hold:
    """The requests this gateway holds, per model and version."""

    def __init__(self, *, max_held: int = MAX_HELD, max_wait_s: float | None = None,
                 poll_s: float = POLL_S) -> None:
        from podium import env

        self.max_held = max_held
        self.max_wait_s = env.cold_start_wait_s(MAX_WAIT_S) if max_wait_s is None else max_wait_s
        self.poll_s = poll_s
        self.waited: dict[tuple[str, str], tuple[int, float]] = {}
        """Lifetime totals per (model, version) of held requests that went on: (count, seconds
        waited), for `/metrics`."""
        self.refused: dict[tuple[str, str, str], int] = {}
        """Lifetime 503s per (model, version, why: "full" or "timeout")."""
        self._held: dict[tuple[str, str], int] = {}

    def counts(self) -> dict[str, dict[str, int]]:
        """Held requests now: model → version → count (only those above 0)."""
        out: dict[str, dict[str, int]] = {}
        for (model, version), num in self._held.items():
            if num > 0:
                out.setdefault(model, {})[version] = num
        return out

    async def first(self, table: RouteTable, model: str, version: str | None,
                    attempt: Callable[[], T]) -> T:
        """`attempt()` (a request's first attempt, by the HTTP or the gRPC proxy); for a
        version at zero instances that starts on demand, once an instance is ready."""
        try:
            return attempt()
        except (NotFound, Unavailable):
            waiting = table.waiting_version(model, version)
            if waiting is None:
                raise

        def again() -> T | None:
            try:
                return attempt()
            except (NotFound, Unavailable):
                if table.waiting_version(model, version) is None:
                    raise  # no longer started on demand: the usual answer
                return None

        return await self.until_routable(model, waiting, again)

    async def until_routable(self, model: str, version: str,
                             attempt: Callable[[], T | None]) -> T:
        """Wait until `attempt` returns a target (it returns None while `version` still has
        no instance); `ColdStart` when the bound is full or the wait runs out."""
        key = (model, version)
        if self._held.get(key, 0) >= self.max_held:
            self._refuse(model, version, "full")
            raise ColdStart(f"{model}@{version} is starting from zero instances and "
                            f"{self.max_held} requests already wait for it; retry shortly",
                            retry_after_s=self.max_wait_s / 4)
        self._held[key] = self._held.get(key, 0) + 1
        started = time.monotonic()
        try:
            while True:
                target = attempt()
                if target is not None:
                    num, total = self.waited.get(key, (0, 0.0))
                    self.waited[key] = (num + 1, total + time.monotonic() - started)
                    return target
                if time.monotonic() - started >= self.max_wait_s:
                    self._refuse(model, version, "timeout")
                    raise ColdStart(f"{model}@{version} is starting from zero instances and "
                                    f"none was ready within {self.max_wait_s:g} s; retry "
                                    "shortly", retry_after_s=self.max_wait_s / 4)
                await asyncio.sleep(self.poll_s)
        finally:
            self._held[key] -= 1
            if not self._held[key]:
                del self._held[key]

    def _refuse(self, model: str, version: str, why: str) -> None:
        key = (model, version, why)
        self.refused[key] = self.refused.get(key, 0) + 1
