"""The control plane's database: a SQLite file by default, PostgreSQL by URL.

`Store.open(url)` applies the Alembic migrations in code, then every method is one short
transaction. Rollout steps are written together with the desired state they imply (deployment
scale, traffic split, alias), so the store always holds what the world should look like before
anyone acts on it.

A database that cannot be reached (stopped, restarting, network gone) raises `StoreUnavailable`
from any method, whatever the driver (`control/database.py`): the control loop pauses on it and
the API answers 503; the first call after the database returns works again.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from podium.control.actions import Action, MoveAlias, Scale, SetSplit, action_to_dict
from podium.control.database import StoreUnavailable, connect, migrate, unreachable_is_unavailable
from podium.control.models import (
    AliasRow,
    DeploymentRow,
    EventRow,
    InstanceRow,
    PackageRow,
    RolloutRow,
    RolloutStepRow,
    TrafficSplitRow,
    utcnow,
)
from podium.control.rollout import RUNNING, Decision, RolloutState
from podium.errors import Conflict, InvalidArgument, NotFound

__all__ = ["RolloutRecord", "Store", "StoreUnavailable", "default_url"]
MAX_INSTANCES = 64


def default_url(home: Path) -> str:
    """The SQLite file under PODIUM_HOME used when no database URL is given."""
    home.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{home / 'control.db'}"


@dataclass(frozen=True)
class RolloutRecord:
    """A stored rollout: its id, status and the controller state to resume from."""

    id: int
    status: str
    reason: str
    num_steps: int
    state: RolloutState


class Store:
    """Typed access to the control-plane tables; every method is its own transaction."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    @classmethod
    def open(cls, url: str) -> Store:
        """Connect, apply pending migrations and return the store."""
        engine = connect(url)
        migrate(engine)
        return cls(engine)

    def close(self) -> None:
        """Release every pooled connection."""
        self.engine.dispose()

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A transaction: committed on success, rolled back on any exception."""
        with unreachable_is_unavailable(), self._sessions.begin() as session:
            yield session

    def ping(self) -> None:
        """A round trip to the database; StoreUnavailable when it does not answer."""
        with self.session() as s:
            s.execute(select(1))

    # packages ---------------------------------------------------------------------------

    def announce_package(self, name: str, version: str, backend: str, location: str,
                         manifest: dict[str, Any]) -> None:
        """Register a model version; announcing the same name@version twice is a conflict."""
        try:
            with self.session() as s:
                s.add(PackageRow(name=name, version=version, backend=backend,
                                 location=location, manifest=manifest))
                s.add(EventRow(kind="announce", model=name,
                               message=f"announced {name}@{version} ({backend})"))
        except IntegrityError:
            raise Conflict(f"{name}@{version} is already announced; bump the version in "
                           "podium.json", param="version") from None

    def get_package(self, name: str, version: str) -> PackageRow:
        """The announced package name@version, or NotFound naming what exists."""
        with self.session() as s:
            row = s.scalar(select(PackageRow).where(PackageRow.name == name,
                                                    PackageRow.version == version))
            if row is None:
                known = s.scalars(select(PackageRow.version).where(PackageRow.name == name)).all()
                hint = (f"announced versions: {', '.join(known)}" if known
                        else "announce it first with `podium announce PACKAGE`")
                raise NotFound(f"{name}@{version} is not announced; {hint}", param="version")
            return row

    def list_packages(self) -> list[PackageRow]:
        """Every announced package, by name then announcement order."""
        with self.session() as s:
            return list(s.scalars(select(PackageRow).order_by(PackageRow.name, PackageRow.id)))

    # deployments ------------------------------------------------------------------------

    def ensure_deployment(self, model: str, version: str, strategy: str,
                          *, min_instances: int = 1, max_instances: int = 1) -> DeploymentRow:
        """The deployment of model@version, created (with no instances) if missing."""
        with self.session() as s:
            row = _deployment(s, model, version)
            if row is None:
                row = DeploymentRow(model=model, version=version, strategy=strategy,
                                    state="active", num_desired=0, min_instances=min_instances,
                                    max_instances=max_instances, last_request_ms=0)
                s.add(row)
            elif row.state != "active":
                row.state = "active"
            return row

    def get_deployment(self, model: str, version: str) -> DeploymentRow:
        """The deployment of model@version, or NotFound."""
        with self.session() as s:
            row = _deployment(s, model, version)
            if row is None:
                raise NotFound(f"no deployment of {model}@{version}", param="version")
            return row

    def list_deployments(self, model: str | None = None) -> list[DeploymentRow]:
        """Every deployment (of one model when given)."""
        with self.session() as s:
            query = select(DeploymentRow).order_by(DeploymentRow.model, DeploymentRow.id)
            if model is not None:
                query = query.where(DeploymentRow.model == model)
            return list(s.scalars(query))

    def set_scaling(self, model: str, version: str, min_instances: int,
                    max_instances: int) -> DeploymentRow:
        """Change the autoscaling bounds; out-of-range values change nothing."""
        for name, value in (("min_instances", min_instances), ("max_instances", max_instances)):
            if isinstance(value, bool) or not isinstance(value, int) or not (
                    0 <= value <= MAX_INSTANCES):
                raise InvalidArgument(f"{name}={value!r} is out of range; use 0..{MAX_INSTANCES}",
                                      param=name)
        if min_instances > max_instances:
            raise InvalidArgument(f"min_instances={min_instances} exceeds max_instances="
                                  f"{max_instances}", param="min_instances")
        with self.session() as s:
            row = _deployment(s, model, version)
            if row is None:
                raise NotFound(f"no deployment of {model}@{version}", param="version")
            row.min_instances, row.max_instances = min_instances, max_instances
            row.num_desired = min(max(row.num_desired, min_instances), max_instances)
            return row

    def touch(self, model: str, version: str, now_ms: int) -> None:
        """Note that model@version served a request at `now_ms` (for idle-version GC)."""
        with self.session() as s:
            row = _deployment(s, model, version)
            if row is not None and row.last_request_ms < now_ms:
                row.last_request_ms = now_ms

    # routing ----------------------------------------------------------------------------

    def splits(self, model: str) -> dict[str, int]:
        """The model's traffic split by version (empty when never deployed)."""
        with self.session() as s:
            rows = s.scalars(select(TrafficSplitRow).where(TrafficSplitRow.model == model))
            return {r.version: r.weight for r in rows}

    def aliases(self, model: str) -> dict[str, str]:
        """The model's aliases (e.g. {'latest': '2'})."""
        with self.session() as s:
            rows = s.scalars(select(AliasRow).where(AliasRow.model == model))
            return {r.alias: r.version for r in rows}

    def desired_actions(self) -> list[Action]:
        """The whole desired world as idempotent actions: re-applied after a restart."""
        with self.session() as s:
            actions: list[Action] = [Scale(d.model, d.version, d.num_desired)
                                     for d in s.scalars(select(DeploymentRow)
                                                        .order_by(DeploymentRow.id))]
            weights: dict[str, dict[str, int]] = {}
            for split in s.scalars(select(TrafficSplitRow)):
                weights.setdefault(split.model, {})[split.version] = split.weight
            actions += [SetSplit(model, w) for model, w in sorted(weights.items())]
            actions += [MoveAlias(a.model, a.alias, a.version)
                        for a in s.scalars(select(AliasRow))]
            return actions

    # rollouts ---------------------------------------------------------------------------

    def create_rollout(self, state: RolloutState) -> int:
        """Store a new rollout; a second running rollout of the same model is a conflict."""
        try:
            with self.session() as s:
                running = s.scalar(select(RolloutRow.id).where(
                    RolloutRow.model == state.model, RolloutRow.status == RUNNING))
                if running is not None:
                    raise Conflict(f"rollout {running} of {state.model} is still running; wait "
                                   f"for it or `podium rollback {state.model}`", param="model")
                row = RolloutRow(model=state.model, from_version=state.from_version,
                                 to_version=state.to_version, strategy=state.config.strategy,
                                 status=state.status, reason="", state=state.to_dict(),
                                 num_steps=0)
                s.add(row)
                s.flush()
                s.add(EventRow(kind="rollout", model=state.model,
                               message=f"rollout {row.id}: {state.from_version} -> "
                                       f"{state.to_version} ({state.config.strategy})"))
                return row.id
        except IntegrityError:
            # the partial unique index caught a concurrent creator the SELECT could not see
            raise Conflict(f"a rollout of {state.model} is already running",
                           param="model") from None

    def record_step(self, rollout_id: int, decision: Decision, at_ms: int) -> None:
        """Write one controller step and the desired state it implies, atomically."""
        state = decision.state
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
                _apply(s, action, strategy=state.config.strategy)
            s.add(EventRow(kind=f"rollout.{state.phase}", model=state.model,
                           message=f"rollout {rollout_id}: {decision.note}"))

    def apply(self, actions: list[Action], *, strategy: str = "red-black") -> None:
        """Record desired state outside a rollout (operator scaling, GC)."""
        with self.session() as s:
            for action in actions:
                _apply(s, action, strategy=strategy)

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

    # instances --------------------------------------------------------------------------

    def add_instance(self, model: str, version: str, **fields: Any) -> int:
        """Record a new instance of model@version; returns its id."""
        with self.session() as s:
            dep = _deployment(s, model, version)
            if dep is None:
                raise NotFound(f"no deployment of {model}@{version}", param="version")
            row = InstanceRow(deployment_id=dep.id, **{"state": "starting", **fields})
            s.add(row)
            s.flush()
            return row.id

    def update_instance(self, instance_id: int, **fields: Any) -> None:
        """Change an instance's state, ports, pid or restart count."""
        with self.session() as s:
            row = s.get(InstanceRow, instance_id)
            if row is None:
                raise NotFound(f"no instance {instance_id}", param="instance_id")
            for key, value in fields.items():
                setattr(row, key, value)

    def list_instances(self, model: str | None = None, version: str | None = None,
                       *, include_stopped: bool = False) -> list[tuple[str, str, InstanceRow]]:
        """(model, version, instance) for every instance, optionally filtered."""
        with self.session() as s:
            query = select(DeploymentRow.model, DeploymentRow.version, InstanceRow).join(
                InstanceRow.deployment).order_by(InstanceRow.id)
            if model is not None:
                query = query.where(DeploymentRow.model == model)
            if version is not None:
                query = query.where(DeploymentRow.version == version)
            if not include_stopped:
                query = query.where(InstanceRow.state != "stopped")
            return [(m, v, i) for m, v, i in s.execute(query).all()]

    # events -----------------------------------------------------------------------------

    def record_event(self, kind: str, message: str, model: str | None = None) -> None:
        """Append an event for operators."""
        with self.session() as s:
            s.add(EventRow(kind=kind, model=model, message=message))

    def list_events(self, model: str | None = None, limit: int = 100, *,
                    before: int | None = None) -> list[EventRow]:
        """Latest events first (of one model, older than event id `before`, when given)."""
        with self.session() as s:
            query = select(EventRow).order_by(EventRow.id.desc()).limit(limit)
            if model is not None:
                query = query.where(EventRow.model == model)
            if before is not None:
                query = query.where(EventRow.id < before)
            return list(s.scalars(query))

    def count(self, table: type) -> int:
        """Rows in a table (for tests and status)."""
        with self.session() as s:
            return s.scalar(select(func.count()).select_from(table)) or 0


def _apply(s: Session, action: Action, *, strategy: str) -> None:
    if isinstance(action, Scale):
        row = _deployment(s, action.model, action.version)
        if row is None:
            row = DeploymentRow(model=action.model, version=action.version, strategy=strategy,
                                state="active", num_desired=0, min_instances=1,
                                max_instances=1, last_request_ms=0)
            s.add(row)
        if row.num_desired == 0 and action.count > 0:
            row.created_at = utcnow()  # deployed (again) now: idle-version GC counts from here
        row.num_desired = action.count
        if row.min_instances >= row.max_instances and action.count > 0:
            # fixed size (nobody set bounds with `podium scale`): a deploy's instance count is
            # its floor as well, or the autoscaler would shrink `--instances 2` to 1
            row.min_instances = action.count
        row.max_instances = max(row.max_instances, action.count)
        row.state = "active" if action.count > 0 else "retired"
    elif isinstance(action, SetSplit):
        s.execute(delete(TrafficSplitRow).where(TrafficSplitRow.model == action.model))
        for version, weight in action.weights.items():
            s.add(TrafficSplitRow(model=action.model, version=version, weight=weight))
    elif isinstance(action, MoveAlias):
        row = s.get(AliasRow, (action.model, action.alias))
        if row is None:
            s.add(AliasRow(model=action.model, alias=action.alias, version=action.version))
        else:
            row.version = action.version
    else:  # pragma: no cover - Action is a closed union
        raise TypeError(f"unknown action {action!r}")


def _deployment(s: Session, model: str, version: str) -> DeploymentRow | None:
    return s.scalar(select(DeploymentRow).where(DeploymentRow.model == model,
                                                DeploymentRow.version == version))


def _record(row: RolloutRow) -> RolloutRecord:
    return RolloutRecord(id=row.id, status=row.status, reason=row.reason,
                         num_steps=row.num_steps, state=RolloutState.from_dict(row.state))
