"""The control plane's database: a SQLite file by default, PostgreSQL by URL.

`Store.open(url)` applies the Alembic migrations in code, then every method is one short
transaction. Rollout steps are written together with the desired state they imply
(`store_rollouts`), so the store always holds what the world should look like before anyone
acts on it. Deployments, splits and aliases belong to a region (`default` where none is
declared).

A database that cannot be reached (stopped, restarting, network gone) raises `StoreUnavailable`
from any method, whatever the driver (`control/database.py`): the control loop pauses on it and
the API answers 503; the first call after the database returns works again.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from podium.control.actions import (
    DEFAULT_REGION,
    Action,
    MoveAlias,
    Scale,
    SetSplit,
)
from podium.control.database import StoreUnavailable, connect, migrate, unreachable_is_unavailable
from podium.control.models import (
    AliasRow,
    DeploymentRow,
    EventRow,
    InstanceRow,
    PackageRow,
    RegionRow,
    TrafficSplitRow,
)
from podium.control.region_config import RegionSpec
from podium.control.store_rollouts import RolloutRecord, RolloutTables, find_deployment
from podium.errors import Conflict, InvalidArgument, NotFound

__all__ = ["RolloutRecord", "Store", "StoreUnavailable", "default_url"]
MAX_INSTANCES = 64


def default_url(home: Path) -> str:
    """The SQLite file under PODIUM_HOME used when no database URL is given."""
    home.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{home / 'control.db'}"


class Store(RolloutTables):
    """Typed access to the control-plane tables; every method is its own transaction.

    A store bound to a region (`for_region`) is what that region's runtime gets: the instances
    it lists and adds are the region's; everything else is shared."""

    def __init__(self, engine: Engine, *, region: str | None = None) -> None:
        self.engine = engine
        self.region = region
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    def for_region(self, region: str) -> Store:
        """The same database, with instances scoped to `region`."""
        return Store(self.engine, region=region)

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

    # regions ----------------------------------------------------------------------------

    def set_regions(self, specs: list[RegionSpec]) -> None:
        """Record the declared regions, in rollout order (replacing the previous set)."""
        with self.session() as s:
            s.execute(delete(RegionRow))
            for position, spec in enumerate(specs):
                s.add(RegionRow(name=spec.name, position=position, runtime=spec.runtime,
                                ray_address=spec.ray_address, http_port=spec.http_port,
                                grpc_port=spec.grpc_port))

    def list_regions(self) -> list[RegionRow]:
        """The declared regions in rollout order (none until `podium up` declared them)."""
        with self.session() as s:
            return list(s.scalars(select(RegionRow).order_by(RegionRow.position)))

    def region_names(self) -> list[str]:
        """Names of the declared regions in order; `default` alone when none is declared."""
        return [r.name for r in self.list_regions()] or [DEFAULT_REGION]

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
                          *, min_instances: int = 1, max_instances: int = 1,
                          region: str | None = None) -> DeploymentRow:
        """The deployment of model@version, created (with no instances) if missing."""
        region = self._region(region)
        with self.session() as s:
            row = find_deployment(s, model, version, region)
            if row is None:
                row = DeploymentRow(model=model, version=version, strategy=strategy,
                                    region=region,
                                    state="active", num_desired=0, min_instances=min_instances,
                                    max_instances=max_instances, last_request_ms=0)
                s.add(row)
            elif row.state != "active":
                row.state = "active"
            return row

    def get_deployment(self, model: str, version: str, *,
                       region: str | None = None) -> DeploymentRow:
        """The deployment of model@version (in a region), or NotFound."""
        region = self._region(region)
        with self.session() as s:
            row = find_deployment(s, model, version, region)
            if row is None:
                raise NotFound(f"no deployment of {model}@{version} in region {region}",
                               param="version")
            return row

    def list_deployments(self, model: str | None = None, *,
                         region: str | None = None) -> list[DeploymentRow]:
        """Every deployment (of one model, of one region when given; a bound store's region)."""
        region = region or self.region
        with self.session() as s:
            query = select(DeploymentRow).order_by(DeploymentRow.model, DeploymentRow.id)
            if model is not None:
                query = query.where(DeploymentRow.model == model)
            if region is not None:
                query = query.where(DeploymentRow.region == region)
            return list(s.scalars(query))

    def set_scaling(self, model: str, version: str, min_instances: int,
                    max_instances: int, *, region: str | None = None) -> DeploymentRow:
        """Change the autoscaling bounds; out-of-range values change nothing."""
        for name, value in (("min_instances", min_instances), ("max_instances", max_instances)):
            if isinstance(value, bool) or not isinstance(value, int) or not (
                    0 <= value <= MAX_INSTANCES):
                raise InvalidArgument(f"{name}={value!r} is out of range; use 0..{MAX_INSTANCES}",
                                      param=name)
        if min_instances > max_instances:
            raise InvalidArgument(f"min_instances={min_instances} exceeds max_instances="
                                  f"{max_instances}", param="min_instances")
        region = self._region(region)
        with self.session() as s:
            row = find_deployment(s, model, version, region)
            if row is None:
                raise NotFound(f"no deployment of {model}@{version} in region {region}",
                               param="version")
            row.min_instances, row.max_instances = min_instances, max_instances
            row.num_desired = min(max(row.num_desired, min_instances), max_instances)
            return row

    def touch(self, model: str, version: str, now_ms: int, *,
              region: str | None = None) -> None:
        """Note that model@version served a request at `now_ms` (for idle-version GC)."""
        with self.session() as s:
            row = find_deployment(s, model, version, self._region(region))
            if row is not None and row.last_request_ms < now_ms:
                row.last_request_ms = now_ms

    # routing ----------------------------------------------------------------------------

    def splits(self, model: str, region: str | None = None) -> dict[str, int]:
        """The model's traffic split by version in a region (empty when never deployed)."""
        with self.session() as s:
            rows = s.scalars(select(TrafficSplitRow).where(
                TrafficSplitRow.model == model, TrafficSplitRow.region == self._region(region)))
            return {r.version: r.weight for r in rows}

    def aliases(self, model: str, region: str | None = None) -> dict[str, str]:
        """The model's aliases in a region (e.g. {'latest': '2'})."""
        with self.session() as s:
            rows = s.scalars(select(AliasRow).where(
                AliasRow.model == model, AliasRow.region == self._region(region)))
            return {r.alias: r.version for r in rows}

    def routing_rows(self) -> tuple[list[DeploymentRow], list[TrafficSplitRow], list[AliasRow],
                                    list[tuple[str, str, InstanceRow]]]:
        """Every deployment, split, alias and live instance, read in one transaction (three
        queries beside the deployments' whatever the count: what `status` shows)."""
        with self.session() as s:
            deployments = list(s.scalars(select(DeploymentRow).order_by(DeploymentRow.model,
                                                                        DeploymentRow.id)))
            splits = list(s.scalars(select(TrafficSplitRow)))
            aliases = list(s.scalars(select(AliasRow)))
            instances = s.execute(select(DeploymentRow.model, DeploymentRow.version, InstanceRow)
                                  .join(InstanceRow.deployment)
                                  .where(InstanceRow.state != "stopped")
                                  .order_by(InstanceRow.id)).all()
            return deployments, splits, aliases, [(m, v, i) for m, v, i in instances]

    def desired_actions(self) -> list[Action]:
        """The whole desired world (every region) as idempotent actions: re-applied after a
        restart."""
        with self.session() as s:
            actions: list[Action] = [Scale(d.model, d.version, d.num_desired, region=d.region)
                                     for d in s.scalars(select(DeploymentRow)
                                                        .order_by(DeploymentRow.id))]
            weights: dict[tuple[str, str], dict[str, int]] = {}
            for split in s.scalars(select(TrafficSplitRow)):
                weights.setdefault((split.model, split.region), {})[split.version] = split.weight
            actions += [SetSplit(model, w, region=region)
                        for (model, region), w in sorted(weights.items())]
            actions += [MoveAlias(a.model, a.alias, a.version, region=a.region)
                        for a in s.scalars(select(AliasRow))]
            return actions

    # instances --------------------------------------------------------------------------

    def add_instance(self, model: str, version: str, *, region: str | None = None,
                     **fields: Any) -> int:
        """Record a new instance of model@version (in the store's region); returns its id."""
        region = self._region(region)
        with self.session() as s:
            dep = find_deployment(s, model, version, region)
            if dep is None:
                raise NotFound(f"no deployment of {model}@{version} in region {region}",
                               param="version")
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
                       *, include_stopped: bool = False,
                       region: str | None = None) -> list[tuple[str, str, InstanceRow]]:
        """(model, version, instance) for every instance (of a bound store's region),
        optionally filtered."""
        region = region or self.region
        with self.session() as s:
            query = select(DeploymentRow.model, DeploymentRow.version, InstanceRow).join(
                InstanceRow.deployment).order_by(InstanceRow.id)
            if model is not None:
                query = query.where(DeploymentRow.model == model)
            if version is not None:
                query = query.where(DeploymentRow.version == version)
            if not include_stopped:
                query = query.where(InstanceRow.state != "stopped")
            if region is not None:
                query = query.where(DeploymentRow.region == region)
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

    def _region(self, region: str | None) -> str:
        return region or self.region or DEFAULT_REGION

    def count(self, table: type) -> int:
        """Rows in a table (for tests and status)."""
        with self.session() as s:
            return s.scalar(select(func.count()).select_from(table)) or 0
