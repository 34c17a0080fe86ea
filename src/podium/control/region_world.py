"""Several regions as one world: each action goes to its region's runtime and gateway table,
each leg of a rollout is observed in its own region."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from podium.control.actions import DEFAULT_REGION, Action
from podium.control.rollout import Observation, RolloutState
from podium.control.runtime.base import Runtime
from podium.control.world import RuntimeWorld
from podium.routes.stats import VersionHealth, VersionStats
from podium.routes.table import RouteTable

log = logging.getLogger("podium.control")


@dataclass
class Region:
    """One region as `podium up` runs it: its runtime, its gateway's table and traffic stats."""

    name: str
    runtime: Runtime
    table: RouteTable
    stats: VersionStats

    @classmethod
    def default(cls, runtime: Runtime, table: RouteTable, stats: VersionStats) -> Region:
        """The one region of a plane that declares none."""
        return cls(DEFAULT_REGION, runtime, table, stats)


class RegionWorlds:
    """The World of a control plane with regions (one `RuntimeWorld` each)."""

    def __init__(self, regions: list[Region], *,
                 base_of: Callable[[str], str | None] = lambda _model: None) -> None:
        self.worlds = {r.name: RuntimeWorld(r.runtime, r.table, r.stats, base_of=base_of)
                       for r in regions}
        self._warned: set[str] = set()

    def apply(self, actions: list[Action]) -> None:
        """Carry out each action in its region (one no longer declared is skipped, once said)."""
        for action in actions:
            world = self.worlds.get(action.region)
            if world is None:
                if action.region not in self._warned:
                    self._warned.add(action.region)
                    log.warning("region %r is not declared any more: its deployments are left "
                                "as they are (declare it again to manage them)", action.region)
                continue
            world.apply([action])

    def observe(self, state: RolloutState, since_ms: int) -> Observation:
        """Health of a leg's versions in its region (nothing there: no instance, no traffic)."""
        world = self.worlds.get(state.region)
        if world is None:
            return Observation(new=VersionHealth())
        return world.observe(state, since_ms)
