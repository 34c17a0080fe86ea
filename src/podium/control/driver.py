"""One rollout step, top to bottom: observe → decide → write the step → act (`commit`).

The driver owns no state of its own: everything it needs to resume is in the store. A driver
created after a crash first re-applies the whole desired state recorded in the store (in case
the crash fell between writing a step and acting on it, even the last one), then keeps stepping.
Every rollout runs region by region (`region_rollout`); with one region it is one leg.
"""

from __future__ import annotations

from podium.control import region_rollout, rollout
from podium.control.actions import DEFAULT_REGION, Decision
from podium.control.adapter_deploy import (
    adapter_of_row,
    check_adapter_deploy,
    check_base_carries,
)
from podium.control.commit import Commit, World
from podium.control.rollout import LATEST
from podium.control.rollout_config import RolloutConfig
from podium.control.store import RolloutRecord, Store
from podium.errors import Conflict, InvalidArgument


class RolloutDriver:
    """Steps every running rollout; safe to recreate at any moment from the store."""

    def __init__(self, store: Store, world: World) -> None:
        self.store = store
        self.world = world
        self.commit = Commit(store, world)
        self._reconciled = False

    def start(self, model: str, version: str, config: RolloutConfig, now_ms: int) -> int:
        """Begin a rollout of model@version in its regions (default: every region, in declared
        order); Conflict if one is running, NotFound if unknown."""
        package = self.store.get_package(model, version)
        declared = self.store.region_names()
        unknown = [r for r in config.regions if r not in declared]
        if unknown:
            raise InvalidArgument(f"region {unknown[0]!r} is not declared; declared regions: "
                                  f"{', '.join(declared)}", param="regions")
        regions = list(config.regions or declared)
        adapter = adapter_of_row(package)
        if adapter is not None:  # placed on its base's instances: the base must run first
            config = check_adapter_deploy(self.store, model, version, adapter, config, regions)
        else:  # a base carries the adapters placed on it to its new version
            check_base_carries(self.store, model, version, regions)
        legs = []
        for region in regions:
            from_version, num_old = self._current(model, config, region)
            if from_version == version and config.strategy == "red-black":
                continue  # already there: nothing to roll in this region
            legs.append(rollout.begin(model, version, from_version, config, num_old=num_old,
                                      now_ms=now_ms, region=region))
        if not legs:
            where = "" if declared == [DEFAULT_REGION] else " in every region asked"
            raise InvalidArgument(f"{model}@{version} already takes all of {model}'s traffic"
                                  f"{where}", param="version")
        return self.store.create_rollout(region_rollout.begin(legs, now_ms))

    def tick(self, now_ms: int) -> None:
        """Make the world match the store (once), then advance every running rollout."""
        self.reconcile()
        self.step(now_ms)

    def step(self, now_ms: int) -> None:
        """Advance every running rollout by at most one step (the control loop's phase 2)."""
        for record in self.store.list_rollouts(status=rollout.RUNNING):
            self._tick_one(record, now_ms)

    def abort(self, model: str, reason: str, now_ms: int) -> int | None:
        """Roll back the model's running rollout; returns its id, None if none runs."""
        self.reconcile()
        record = self.store.running_rollout(model)
        if record is None:
            return None
        decision = region_rollout.abort(record.state, reason, now_ms)
        if decision is not None:
            self._commit(record.id, decision, now_ms)
        return record.id

    def hold(self, rollout_id: int, pause: bool, by: str, now_ms: int) -> RolloutRecord:
        """An operator pauses (`pause`) or resumes a running rollout; Conflict says why not."""
        record = self.store.get_rollout(rollout_id)
        state = record.state
        if pause:
            why = region_rollout.can_pause(state)
            if why is not None:
                raise Conflict(f"rollout {rollout_id} of {state.model} cannot be paused: {why}",
                               param="rollout_id")
            decision = region_rollout.pause(state, now_ms, by)
        else:
            if state.is_done or state.paused_since_ms is None:
                now = state.status if state.is_done else "running, not paused"
                raise Conflict(f"rollout {rollout_id} of {state.model} is {now}; only a paused "
                               "rollout resumes", param="rollout_id")
            decision = region_rollout.unpause(state, now_ms, by)
        self.commit.step(rollout_id, decision, now_ms,
                         kind="rollout.paused" if pause else "rollout.resumed")
        return self.store.get_rollout(rollout_id)

    def resume(self, paused_ms: int, reason: str, now_ms: int) -> None:
        """The plane could not act for `paused_ms`: every running rollout's timers move on."""
        for record in self.store.list_rollouts(status=rollout.RUNNING):
            decision = region_rollout.resume(record.state, paused_ms, reason)
            if decision is not None:
                self._commit(record.id, decision, now_ms)

    def reconcile(self) -> None:
        """Once per driver: make the world match the store (a no-op when it already does)."""
        if not self._reconciled:
            self.world.apply(self.store.desired_actions())
            self._reconciled = True

    def resync(self) -> None:
        """An apply failed part-way: re-apply the whole desired state at the next tick."""
        self._reconciled = False

    def _tick_one(self, record: RolloutRecord, now_ms: int) -> None:
        state = record.state
        if state.paused_since_ms is not None:
            return  # held by an operator: nothing observed, nothing judged
        observations = {leg.region: self.world.observe(leg, since_ms=leg.phase_since_ms)
                        for leg in region_rollout.watched(state)}
        decision = region_rollout.step(state, observations, now_ms)
        if decision is not None:
            self._commit(record.id, decision, now_ms)

    def _commit(self, rollout_id: int, decision: Decision[region_rollout.RegionRollout],
                now_ms: int) -> None:
        self.commit.step(rollout_id, decision, now_ms)  # written, then acted on

    def _current(self, model: str, config: RolloutConfig,
                 region: str) -> tuple[str | None, int]:
        """The version serving the model in a region now, and how many instances it wants."""
        if config.strategy == "versioned":
            current = self.store.aliases(model, region).get(LATEST)
        else:
            splits = self.store.splits(model, region)
            current = max(splits, key=lambda v: splits[v]) if splits else None
            if current is not None and splits[current] == 0:
                current = None
        if current is None:
            return None, 0
        deployments = {d.version: d for d in self.store.list_deployments(model, region=region)}
        dep = deployments.get(current)
        if dep is None or dep.num_desired == 0:
            return None, 0
        return current, dep.num_desired
