"""The rollout half of the store: rollouts, their steps, and the desired state each implies.

A step is written together with what it asks of the world (deployment scale, traffic split,
alias, in whichever region), so the store always holds what the world should look like before
anyone acts on it.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from podium.control import region_rollout
from podium.control.actions import (
    DEFAULT_REGION,
    Action,
    Decision,
    MoveAlias,
    Scale,
    SetSplit,
    action_to_dict,
)
from podium.control.models import (
    AliasRow,
    DeploymentRow,
    EventRow,
    RolloutRow,
    RolloutStepRow,
    TrafficSplitRow,
    utcnow,
)
from podium.control.region_rollout import RegionRollout
from podium.control.rollout import RUNNING, RolloutState
from podium.errors import Conflict, NotFound


@dataclass(frozen=True)
class RolloutRecord:
    """A stored rollout: its id, status and the controller state to resume from."""

    id: int
    status: str
    reason: str
    num_steps: int
    state: RegionRollout


class RolloutTables:
    """Rollouts and desired state; mixed into `Store`, which provides `session`."""

    def session(self) -> AbstractContextManager[Session]:
        """A transaction (the store's)."""
        raise NotImplementedError

    def create_rollout(self, state: RegionRollout | RolloutState) -> int:
        """Store a new rollout; a second running rollout of the same model is a conflict."""
        if isinstance(state, RolloutState):
            state = region_rollout.single(state)
        try:
            with self.session() as s:
                running = s.scalar(select(RolloutRow.id).where(
                    RolloutRow.model == state.model, RolloutRow.status == RUNNING))
                if running is not None:
                    raise Conflict(f"rollout {running} of {state.model} is still running; wait "
                                   f"for it or `podium rollback {state.model}`", param="model")
                row = RolloutRow(model=state.model, from_version=state.leg.from_version,
                                 to_version=state.to_version, strategy=state.config.strategy,
                                 status=state.status, reason="", state=state.to_dict(),
                                 num_steps=0)
                s.add(row)
                s.flush()
                regions = "" if state.order == (DEFAULT_REGION,) else (
                    f" in {', '.join(state.order)}")
                s.add(EventRow(kind="rollout", model=state.model,
                               message=f"rollout {row.id}: {state.leg.from_version} -> "
                                       f"{state.to_version} ({state.config.strategy}){regions}"))
                return row.id
        except IntegrityError:
            # the partial unique index caught a concurrent creator the SELECT could not see
            raise Conflict(f"a rollout of {state.model} is already running",
                           param="model") from None

    def record_step(self, rollout_id: int,
                    decision: Decision[RolloutState] | Decision[RegionRollout],
                    at_ms: int, *, kind: str | None = None) -> None:
        """Write one controller step and the desired state it implies, atomically (its event
        of `kind`, default `rollout.PHASE`)."""
        state = decision.state
        if isinstance(state, RolloutState):
            state = region_rollout.single(state)
        with self.session() as s:
            row = s.get(RolloutRow, rollout_id, with_for_update=True)
            if row is None:
                raise NotFound(f"no rollout {rollout_id}", param="rollout_id")
            row.num_steps += 1
            s.add(RolloutStepRow(rollout_id=rollout_id, seq=row.num_steps, at_ms=at_ms,
                                 phase=state.phase, note=decision.note,
                                 actions=[action_to_dict(a) for a in decision.actions]))
            row.state, row.status, row.reason = state.to_dict(), state.status, state.reason
            for action in decision.actions:
                apply_action(s, action, strategy=state.config.strategy)
            s.add(EventRow(kind=kind or f"rollout.{state.phase}", model=state.model,
                           message=f"rollout {rollout_id}: {decision.note}"))

    def apply(self, actions: list[Action], *, strategy: str = "red-black") -> None:
        """Record desired state outside a rollout (operator scaling, GC)."""
        with self.session() as s:
            for action in actions:
                apply_action(s, action, strategy=strategy)

    def get_rollout(self, rollout_id: int) -> RolloutRecord:
        """One rollout, or NotFound."""
        with self.session() as s:
            row = s.get(RolloutRow, rollout_id)
            if row is None:
                raise NotFound(f"no rollout {rollout_id}", param="rollout_id")
            return _record(row)

    def list_rollouts(self, model: str | None = None, *,
                      status: str | None = None) -> list[RolloutRecord]:
        """Rollouts, newest first, optionally of one model or with one status."""
        with self.session() as s:
            query = select(RolloutRow).order_by(RolloutRow.id.desc())
            if model is not None:
                query = query.where(RolloutRow.model == model)
            if status is not None:
                query = query.where(RolloutRow.status == status)
            return [_record(r) for r in s.scalars(query)]

    def running_rollout(self, model: str) -> RolloutRecord | None:
        """The model's running rollout, if any."""
        found = self.list_rollouts(model, status=RUNNING)
        return found[0] if found else None

    def rollout_steps(self, rollout_id: int) -> list[RolloutStepRow]:
        """The steps of a rollout in order."""
        with self.session() as s:
            return list(s.scalars(select(RolloutStepRow).where(
                RolloutStepRow.rollout_id == rollout_id).order_by(RolloutStepRow.seq)))


def apply_action(s: Session, action: Action, *, strategy: str) -> None:
    if isinstance(action, Scale):
        row = find_deployment(s, action.model, action.version, action.region)
        if row is None:
            row = DeploymentRow(model=action.model, version=action.version, strategy=strategy,
                                region=action.region,
                                state="active", num_desired=0, min_instances=1,
                                max_instances=1, last_request_ms=0)
            s.add(row)
        if row.num_desired == 0 and action.count > 0:
            row.created_at = utcnow()  # deployed (again) now: idle-version GC counts from here
        row.num_desired = action.count
        if row.min_instances >= row.max_instances and action.count > 0:
            # fixed size (nobody set bounds with `podium scale`): a deploy's instance count is
            # its floor and its ceiling, or the autoscaler would shrink `--instances 2` to 1
            # (and a scale-down would leave a range behind)
            row.min_instances = row.max_instances = action.count
        row.max_instances = max(row.max_instances, action.count)
        row.state = "active" if action.count > 0 else "retired"
    elif isinstance(action, SetSplit):
        s.execute(delete(TrafficSplitRow).where(TrafficSplitRow.model == action.model,
                                                TrafficSplitRow.region == action.region))
        for version, weight in action.weights.items():
            s.add(TrafficSplitRow(model=action.model, region=action.region, version=version,
                                  weight=weight))
    elif isinstance(action, MoveAlias):
        row = s.get(AliasRow, (action.model, action.region, action.alias))
        if row is None:
            s.add(AliasRow(model=action.model, region=action.region, alias=action.alias,
                           version=action.version))
        else:
            row.version = action.version
    else:  # pragma: no cover - Action is a closed union
        raise TypeError(f"unknown action {action!r}")


def find_deployment(s: Session, model: str, version: str, region: str) -> DeploymentRow | None:
    return s.scalar(select(DeploymentRow).where(DeploymentRow.model == model,
                                                DeploymentRow.region == region,
                                                DeploymentRow.version == version))


def _record(row: RolloutRow) -> RolloutRecord:
    return RolloutRecord(id=row.id, status=row.status, reason=row.reason,
                         num_steps=row.num_steps, state=RegionRollout.from_dict(row.state))
