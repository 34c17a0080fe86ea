"""What a gateway process and the control plane exchange: a route table one way, in-flight
counts and request outcomes the other (msgspec JSON, one `POST /v1/gateways/sync` each turn).

The control plane owns the route table (rebuilt from its store after a restart); a gateway
holds the last copy it was sent and serves on it while the control plane is away. Each table
is numbered (`epoch`: one per control-plane process, `generation`: bumped on every change), so
a gateway says which table it routes by and the control plane knows when a drain has reached
every gateway.
"""

from __future__ import annotations

import collections

import msgspec

from podium.routes.stats import Outcome, VersionStats
from podium.routes.table import Adapter, Endpoint, Routes, RouteTable

MAX_PENDING = 100_000
"""Outcomes a gateway keeps for the control plane while it cannot reach it (oldest dropped)."""
MAX_PER_REPORT = 10_000
"""Outcomes sent in one report (keeps each one well under the control API's body limit)."""


class EndpointSpec(msgspec.Struct, frozen=True):
    """One instance as the control plane routes to it."""

    id: str
    url: str
    grpc_target: str | None = None
    healthy: bool = True
    draining: bool = False
    max_in_flight: int | None = None
    """Requests this instance takes from one gateway at once (its package's declared bound)."""
    idempotent: bool = True
    """Whether a request it failed may be resent to the stable version (canary retry)."""
    frontends: str = "embedded"
    """embedded, or standalone: KServe only, the gateway refuses OpenAI requests for it."""


class ModelSpec(msgspec.Struct, frozen=True):
    """One model's routing: weights, aliases, endpoints per version."""

    splits: dict[str, int] = {}
    aliases: dict[str, str] = {}
    endpoints: dict[str, list[EndpointSpec]] = {}
    on_demand: list[str] = []
    """Versions started on demand (held requests wait for their instance)."""
    base: str | None = None
    """A LoRA adapter's base model: its `placed` versions run on the base's instances."""
    placed: list[str] = []


class Outcomes(msgspec.Struct, frozen=True):
    """Finished requests of one model@version, column by column (compact on the wire)."""

    model: str
    version: str
    at_ms: list[int]
    latency_ms: list[float]
    ok: list[bool]


class SyncReport(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A gateway's turn: who it is, which table it routes by, what it saw since last time."""

    gateway_id: str
    epoch: str = ""
    """Epoch of the table the gateway routes by ("" before its first)."""
    generation: int = -1
    """Generation of that table."""
    pid: int | None = None
    http: str = ""
    """Where the gateway listens for HTTP (host:port), for `GET /v1/gateways`."""
    in_flight: dict[str, int] = {}
    """Requests in flight per endpoint id, counted under the table above."""
    outcomes: list[Outcomes] = []
    held: dict[str, dict[str, int]] = {}
    """Requests held waiting for an instance, per model and version (`gateway.hold`): the
    demand of a deployment at zero."""


class SyncAnswer(msgspec.Struct, frozen=True):
    """The control plane's answer: the current table, or None while it is still starting."""

    epoch: str
    generation: int
    routes: dict[str, ModelSpec] | None = None
    elsewhere: dict[str, int] = {}
    """Requests in flight per endpoint id from the plane's other live gateways (their last
    reports): several gateways in front of one instance share its bound."""


def snapshot(table: RouteTable) -> dict[str, ModelSpec]:
    """The whole table as plain specs (the control plane's side)."""
    on_demand = table.on_demand()
    adapters = table.adapters()
    specs = {name: ModelSpec(
        splits=splits, aliases=aliases,
        endpoints={v: [EndpointSpec(e.id, e.url, e.grpc_target, e.healthy, e.draining,
                                    e.max_in_flight, e.idempotent, e.frontends)
                       for e in eps] for v, eps in endpoints.items()},
        on_demand=on_demand.get(name, []))
        for name, (splits, aliases, endpoints) in table.routes().items()}
    for name, (base, placed) in adapters.items():
        spec = specs.get(name, ModelSpec())
        specs[name] = ModelSpec(splits=spec.splits, aliases=spec.aliases,
                                endpoints=spec.endpoints, on_demand=spec.on_demand,
                                base=base, placed=placed)
    return specs


class TableFollower:
    """Applies the control plane's tables to a gateway's own `RouteTable` (the gateway side)."""

    def __init__(self, table: RouteTable) -> None:
        self.table = table
        self.epoch = ""
        self.generation = -1
        self._told_healthy: dict[str, bool] = {}

    def apply(self, answer: SyncAnswer) -> bool:
        """Take the answer's table if it is one this gateway does not route by yet, and the
        other gateways' in-flight counts whatever the table."""
        taken = self._take_table(answer)
        self.take_elsewhere(answer.elsewhere)
        return taken

    def take_elsewhere(self, counts: dict[str, int]) -> None:
        """The other gateways' requests in flight per endpoint ({}: none known)."""
        for endpoint in self.table.endpoints():
            endpoint.in_flight_elsewhere = counts.get(endpoint.id, 0)

    def _take_table(self, answer: SyncAnswer) -> bool:
        if answer.routes is None or (answer.epoch, answer.generation) == (
                self.epoch, self.generation):
            return False
        routes: dict[str, Routes] = {}
        adapters: dict[str, Adapter] = {}
        told: dict[str, bool] = {}
        for name, spec in answer.routes.items():
            endpoints = {v: [self._endpoint(s, told) for s in specs]
                         for v, specs in spec.endpoints.items()}
            routes[name] = (dict(spec.splits), dict(spec.aliases), endpoints)
            if spec.base is not None:
                adapters[name] = (spec.base, list(spec.placed))
        self.table.replace(routes, {name: list(spec.on_demand)
                                    for name, spec in answer.routes.items()},
                           adapters=adapters)
        self._told_healthy = told
        self.epoch, self.generation = answer.epoch, answer.generation
        return True

    def _endpoint(self, spec: EndpointSpec, told: dict[str, bool]) -> Endpoint:
        told[spec.id] = spec.healthy
        try:
            endpoint = self.table.endpoint(spec.id)
        except KeyError:
            return Endpoint(spec.id, spec.url, healthy=spec.healthy, draining=spec.draining,
                            grpc_target=spec.grpc_target, max_in_flight=spec.max_in_flight,
                            idempotent=spec.idempotent, frontends=spec.frontends)
        endpoint.url, endpoint.grpc_target = spec.url, spec.grpc_target
        endpoint.max_in_flight, endpoint.idempotent = spec.max_in_flight, spec.idempotent
        endpoint.frontends = spec.frontends
        endpoint.draining = spec.draining
        # only a change of the control plane's verdict overrides what this gateway saw itself
        # (a refused connection, its own probes) since
        if self._told_healthy.get(spec.id) != spec.healthy:
            endpoint.healthy = spec.healthy
        return endpoint


class ReportingStats(VersionStats):
    """A gateway's `VersionStats` that also keeps each outcome for the next report."""

    def __init__(self, max_pending: int = MAX_PENDING) -> None:
        super().__init__()
        self._pending: collections.deque[tuple[str, str, Outcome]] = collections.deque(
            maxlen=max_pending)

    def record(self, model: str, version: str, outcome: Outcome) -> None:
        """Count the outcome here and keep it for the control plane."""
        super().record(model, version, outcome)
        self._pending.append((model, version, outcome))

    def take(self, limit: int = MAX_PER_REPORT) -> list[tuple[str, str, Outcome]]:
        """Up to `limit` pending outcomes, oldest first, removed from the queue."""
        taken = []
        while self._pending and len(taken) < limit:
            taken.append(self._pending.popleft())
        return taken

    def put_back(self, taken: list[tuple[str, str, Outcome]]) -> None:
        """Outcomes a failed report did not deliver: first in line for the next one."""
        self._pending.extendleft(reversed(taken))


def columns(taken: list[tuple[str, str, Outcome]]) -> list[Outcomes]:
    """Outcomes grouped per model@version, as the report carries them."""
    grouped: dict[tuple[str, str], tuple[list[int], list[float], list[bool]]] = {}
    for model, version, outcome in taken:
        at, latency, ok = grouped.setdefault((model, version), ([], [], []))
        at.append(outcome.at_ms)
        latency.append(round(outcome.latency_ms, 3))
        ok.append(outcome.ok)
    return [Outcomes(m, v, *cols) for (m, v), cols in grouped.items()]


def record_outcomes(stats: VersionStats, outcomes: list[Outcomes]) -> int:
    """Add a report's outcomes to the control plane's stats; returns how many."""
    num = 0
    for group in outcomes:
        for at_ms, latency_ms, ok in zip(group.at_ms, group.latency_ms, group.ok, strict=False):
            stats.record(group.model, group.version, Outcome(at_ms, latency_ms, ok))
            num += 1
    return num


ENCODER = msgspec.json.Encoder()
REPORT_DECODER = msgspec.json.Decoder(SyncReport)
ANSWER_DECODER = msgspec.json.Decoder(SyncAnswer)
