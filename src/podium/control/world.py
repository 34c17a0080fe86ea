"""The real world a rollout acts on: a runtime for instances, a gateway for traffic.

A LoRA adapter has no instances of its own: scaling one of its versions above 0 places it on
its base's instances in the route table (0 removes it), and it is ready while one of them is.
"""

from __future__ import annotations

from collections.abc import Callable

from podium.control.actions import Action, MoveAlias, Scale, SetSplit
from podium.control.rollout import Observation, RolloutState, VersionHealth
from podium.control.runtime.base import READY, Runtime
from podium.routes.stats import VersionStats
from podium.routes.table import RouteTable


class RuntimeWorld:
    """Scale goes to the runtime, splits and aliases to the gateway's route table; health comes
    from the runtime (readiness, crashes) and the gateway (errors, latency)."""

    def __init__(self, runtime: Runtime, table: RouteTable, stats: VersionStats, *,
                 base_of: Callable[[str], str | None] = lambda _model: None) -> None:
        self.runtime = runtime
        self.table = table
        self.stats = stats
        self.base_of = base_of
        """A LoRA adapter's base model (None: a model with instances of its own)."""

    def apply(self, actions: list[Action]) -> None:
        """Carry out idempotent actions."""
        for action in actions:
            if isinstance(action, Scale):
                base = self.base_of(action.model)
                if base is not None:  # an adapter: placed on its base's instances, no process
                    self.table.set_adapter(action.model, base, action.version, action.count > 0)
                else:
                    self.runtime.scale(action.model, action.version, action.count)
            elif isinstance(action, SetSplit):
                self.table.set_split(action.model, action.weights)
            elif isinstance(action, MoveAlias):
                self.table.set_alias(action.model, action.alias, action.version)

    def observe(self, state: RolloutState, since_ms: int) -> Observation:
        """Health of both versions; request stats since the analysis window began."""
        old = (self._health(state.model, state.from_version, since_ms)
               if state.from_version else VersionHealth())
        return Observation(new=self._health(state.model, state.to_version, since_ms), old=old)

    def _health(self, model: str, version: str, since_ms: int) -> VersionHealth:
        traffic = self.stats.health(model, version, since_ms)
        if self.base_of(model) is not None:  # one placement, ready while a base instance is
            num_ready = int(any(e.can_take for e in self.table.adapter_endpoints(model, version)))
            num_crashes = 0
        else:
            num_ready = sum(1 for i in self.runtime.instances(model, version)
                            if i.state == READY and self._answering(i.id))
            num_crashes = self.runtime.num_crashes(model, version)
        return VersionHealth(num_ready=num_ready, num_crashes=num_crashes,
                             num_requests=traffic.num_requests, num_errors=traffic.num_errors,
                             p99_ms=traffic.p99_ms)

    def _answering(self, instance_id: str) -> bool:
        # ready once, but its latest readiness probe may have failed (a hung instance)
        try:
            return self.table.endpoint(instance_id).healthy
        except KeyError:
            return False
