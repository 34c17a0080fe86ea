"""Where each attempt of one request goes: the first, and the next after a failed one.

Pure and synchronous (a route table, an admission bound, counters), shared by the HTTP and the
gRPC proxy, so every decision is tested without a process. After an attempt fails:

- **not sent** (the connection failed before the request left): the instance is marked down
  and another instance takes the request, up to `max_attempts` connections in all;
- **overloaded** (the instance answered 429 / RESOURCE_EXHAUSTED: it did not start the
  request): once, another instance of the same version that has room under the gateway's bound
  (the instance may be full of another gateway's traffic); else the 429 goes to the client as
  the instance wrote it, counted as shed by the instance;
- **broken** (the connection broke after sending, before any answer: the instance may be
  gone, e.g. its node lost): once, another instance of the same version when its package
  declares inference idempotent; else as failed;
- **failed** (a 5xx, or a broken connection not resent): once, the stable version, when
  the request went by the split (it named no version), the version that failed is not the
  stable one (the `latest` alias, which a Red-Black rollout moves only once the new version
  passed its last analysis), and its package declares inference idempotent. The failure is
  still recorded against the version that failed, so the rollout analysis sees it. If the
  stable version has no ready instance the failure is the answer; if all of its instances are
  at the bound the request is shed (429), since overload is never a 5xx.

A streamed answer whose first byte reached the client is never sent again: the proxies decide
before they relay anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from podium.errors import NotFound, Unavailable
from podium.gateway.admission import BY_INSTANCE, Admission
from podium.routes.stats import VersionStats
from podium.routes.table import LATEST, Choose, Endpoint, RouteTable

NOT_SENT, OVERLOADED, BROKEN, CANARY = "not_sent", "overloaded", "broken", "canary"
"""Why a request was sent again (the `reason` of `podium:gateway_retries`)."""


@dataclass(frozen=True)
class Target:
    """One attempt's destination: the resolved version and the instance."""

    version: str
    endpoint: Endpoint


class Attempts:
    """The routing decisions for one request (create one per request)."""

    def __init__(self, table: RouteTable, admission: Admission, stats: VersionStats,
                 model: str, version: str | None, *, max_attempts: int,
                 exclude: frozenset[str] = frozenset(), choose: Choose | None = None) -> None:
        self.table = table
        self.admission = admission
        self.stats = stats
        self.model = model
        self.version = version
        """The version the client named (None: routed by the split)."""
        self.max_attempts = max_attempts
        self._exclude = exclude
        self._choose = choose
        """The request's own instance pick (its prefix cache), for every attempt."""
        self._tried: set[str] = set()
        self._num_connects = 0
        self._overload_retried = False
        self._broken_retried = False
        self._canary_retried = False

    def first(self) -> Target:
        """The first attempt; `Overloaded` when every instance of the version is at the bound."""
        return self._pick(self.version)

    def after_not_sent(self, failed: Target, why: str) -> Target:
        """The next instance after a failed connection; `Unavailable` after `max_attempts`."""
        failed.endpoint.healthy = False  # until a health check finds it answering again
        self._tried.add(failed.endpoint.id)
        self._num_connects += 1
        if self._num_connects >= self.max_attempts:
            raise Unavailable(f"no instance of {self.model} accepted a connection after "
                              f"{self._num_connects} attempt(s): {why}")
        self.stats.record_retry(self.model, failed.version, NOT_SENT)
        return self._pick(self.version)

    def after_overloaded(self, shed: Target) -> Target | None:
        """Another instance of the version with room, once; None: relay the instance's 429."""
        self._tried.add(shed.endpoint.id)
        if not self._overload_retried:
            sibling = self._instance(shed.version)
            if sibling is not None and self.admission.has_room(sibling):
                self._overload_retried = True
                self.stats.record_retry(self.model, shed.version, OVERLOADED)
                return Target(shed.version, sibling)
        self.stats.record_shed(self.model, shed.version, BY_INSTANCE)
        return None

    def after_broken(self, failed: Target) -> Target | None:
        """Another instance of the same version, once, for an idempotent package's broken
        connection; else `after_failure`'s answer."""
        self._tried.add(failed.endpoint.id)
        if not self._broken_retried and failed.endpoint.idempotent:
            sibling = self._instance(failed.version)
            if sibling is not None:
                self._broken_retried = True
                self.stats.record_retry(self.model, failed.version, BROKEN)
                return Target(failed.version,
                              self.admission.admit(self.model, failed.version, sibling))
        return self.after_failure(failed)

    def after_failure(self, failed: Target) -> Target | None:
        """The stable version, once, for a canary's failure; None: the failure is the answer."""
        stable = self.table.alias(self.model, LATEST)
        if (self._canary_retried or self.version is not None or stable is None
                or stable == failed.version or not failed.endpoint.idempotent):
            return None
        endpoint = self._instance(stable)
        if endpoint is None:
            return None
        self._canary_retried = True
        self.stats.record_retry(self.model, failed.version, CANARY)
        return Target(stable, self.admission.admit(self.model, stable, endpoint))

    def _pick(self, version: str | None) -> Target:
        resolved, endpoint = self.table.resolve(self.model, version,
                                                exclude=self._exclude | self._tried,
                                                choose=self._choose)
        return Target(resolved, self.admission.admit(self.model, resolved, endpoint))

    def _instance(self, version: str) -> Endpoint | None:
        try:
            return self.table.resolve(self.model, version,
                                      exclude=self._exclude | self._tried,
                                      choose=self._choose)[1]
        except (NotFound, Unavailable):
            return None
