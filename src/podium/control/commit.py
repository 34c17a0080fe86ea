"""Write, then act: the one way the control plane changes the world.

A change (a rollout step, an autoscaler's or the GC's new size, an operator's new bounds) is
first written to the store as desired state, then carried out. A plane that dies between the
two re-applies the stored state after its restart (`RolloutDriver.reconcile`): the actions are
idempotent, so carrying one out twice is harmless, while one carried out and never written
would be lost.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from podium.control.actions import DEFAULT_REGION, Action, Decision, Scale
from podium.control.models import DeploymentRow

if TYPE_CHECKING:
    from podium.control.region_rollout import RegionRollout
    from podium.control.rollout import Observation, RolloutState
    from podium.control.store import Store


class World(Protocol):
    """Where actions land and health comes from: the runtime plus the gateway."""

    def apply(self, actions: list[Action]) -> None:
        """Carry out idempotent actions (scale, split, alias)."""

    def observe(self, state: RolloutState, since_ms: int) -> Observation:
        """Health of the rollout's versions in its region; request stats from `since_ms`."""


class Commit:
    """Writes each change to the store, then carries it out in the world."""

    def __init__(self, store: Store, world: World) -> None:
        self.store = store
        self.world = world

    def step(self, rollout_id: int, decision: Decision[RegionRollout], now_ms: int, *,
             kind: str | None = None) -> None:
        """One rollout step: its state, actions and event (of `kind`, default
        `rollout.PHASE`) in one transaction, then the actions."""
        def write() -> list[Action]:
            self.store.record_step(rollout_id, decision, now_ms, kind=kind)
            return decision.actions
        self._write_then_act(write)

    def scale(self, action: Scale, why: str) -> None:
        """A new size of one deployment (the autoscaler's, the GC's), with its event."""
        def write() -> list[Action]:
            self.store.apply([action])
            return [action]
        self._write_then_act(write)
        where = "" if action.region == DEFAULT_REGION else f" in {action.region}"
        self.store.record_event("scale", f"{action.model}@{action.version} -> {action.count}"
                                f"{where} ({why})", action.model)

    def bounds(self, model: str, version: str, min_instances: int, max_instances: int, *,
               region: str | None = None) -> DeploymentRow:
        """An operator's new bounds; a size pushed into them is carried out (the autoscaler
        skips fixed-size deployments and starts from the stored size: nobody else would)."""
        rows: list[DeploymentRow] = []

        def write() -> list[Action]:
            before = {d.region: d.num_desired for d in self.store.list_deployments(model)
                      if d.version == version}
            row = self.store.set_scaling(model, version, min_instances, max_instances,
                                         region=region)
            rows.append(row)
            if row.num_desired == before.get(row.region):
                return []
            return [Scale(model, version, row.num_desired, region=row.region)]
        if self._write_then_act(write):
            row = rows[0]
            self.store.record_event("scale", f"{model}@{version} -> {row.num_desired} "
                                    f"(bounds {min_instances}..{max_instances})", model)
        return rows[0]

    def _write_then_act(self, write: Callable[[], list[Action]]) -> list[Action]:
        actions = write()
        # written before acted on: a crash after this line re-applies it on resume
        self.world.apply(actions)
        return actions
