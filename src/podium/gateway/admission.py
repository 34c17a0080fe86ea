"""The gateway's admission: a bound on requests in flight per instance, shed at once past it.

The gateway keeps no queue of its own. Instances are picked by least requests in flight (this
gateway's plus what the other gateways of the plane last reported, `Endpoint.load`), so
when the one picked is at its bound (HTTP and gRPC together) every instance of the routed
version is (they share a package, so a bound): the request is answered `Overloaded` (429 with
`Retry-After`, gRPC RESOURCE_EXHAUSTED) without waiting, and counted as shed for that version.
The bound is what the package's own queue limits imply, when it declares them, else the
gateway's `--max-in-flight-per-instance`; an instance that measures its own bound (a classic
model: the work it finishes within its target wait, `backends.classic_admission`) sends it on
its answers, and the smaller of the two holds (`learn`).
Shed requests never reached an instance, so they are no evidence about the version: the rollout
analysis does not count them (neither as requests nor as errors).
"""

from __future__ import annotations

from podium.errors import Overloaded
from podium.routes.stats import VersionStats
from podium.routes.table import Endpoint

RETRY_AFTER_S = 1.0
"""What a shed request is told to wait: about one batch or queue wait of a busy instance."""
BY_GATEWAY, BY_INSTANCE = "gateway", "instance"
"""Who shed a request: the gateway's bound, or the instance's own queue (its 429 relayed)."""


class Admission:
    """The per-instance in-flight bound of one gateway, and the shed count it keeps."""

    def __init__(self, stats: VersionStats, max_in_flight: int) -> None:
        self.stats = stats
        self.max_in_flight = max_in_flight

    def bound(self, endpoint: Endpoint) -> int:
        """Most requests this gateway keeps in flight on the instance."""
        configured = endpoint.max_in_flight or self.max_in_flight
        measured = endpoint.measured_bound
        return configured if measured is None or measured > configured else measured

    @staticmethod
    def learn(endpoint: Endpoint, header: str | None) -> None:
        """Keep the bound the instance measured for itself (its `podium-admission-bound`
        answer header); an answer without one, or with a value that is no positive
        integer, changes nothing."""
        if header is not None and header.isdigit() and int(header) > 0:
            endpoint.measured_bound = int(header)

    def has_room(self, endpoint: Endpoint) -> bool:
        """Whether one more request may go to this instance now."""
        return endpoint.load < self.bound(endpoint)

    def admit(self, model: str, version: str, endpoint: Endpoint) -> Endpoint:
        """`endpoint` when it has room; else the request is shed (counted, `Overloaded`)."""
        if self.has_room(endpoint):
            return endpoint
        raise self.refuse(model, version, endpoint)

    def refuse(self, model: str, version: str, endpoint: Endpoint) -> Overloaded:
        """Count a request shed at `endpoint`, which has no room, and say why (the error to
        answer it with)."""
        self.stats.record_shed(model, version, BY_GATEWAY)
        bound = self.bound(endpoint)
        where = ("the instance's measured bound" if bound == endpoint.measured_bound
                 else "the package's queue limits" if endpoint.max_in_flight
                 else "--max-in-flight-per-instance")
        others = (f", {endpoint.in_flight_elsewhere} of them from other gateways"
                  if endpoint.in_flight_elsewhere else "")
        return Overloaded(f"every instance of {model}@{version} has {bound} "
                          f"requests in flight ({where}{others}); retry in "
                          f"{RETRY_AFTER_S:g} s", retry_after_s=RETRY_AFTER_S)
