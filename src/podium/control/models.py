"""The control plane's tables (SQLAlchemy 2.0 declarative models).

The schema itself is created by the Alembic migrations in `migrations/versions/`; these classes
are how code reads and writes it. A test checks the two agree.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from podium.control.actions import DEFAULT_REGION


def utcnow() -> datetime:
    """Timezone-aware now, so SQLite and PostgreSQL rows compare the same way."""
    return datetime.now(UTC)


class Base(DeclarativeBase):
    """Declarative base of every control-plane table."""


class PackageRow(Base):
    """An announced model version: a validated package the runtime can start."""

    __tablename__ = "packages"
    __table_args__ = (UniqueConstraint("name", "version", name="uq_packages_name_version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), index=True)
    version: Mapped[str] = mapped_column(String(64))
    backend: Mapped[str] = mapped_column(String(32))
    location: Mapped[str] = mapped_column(Text)
    manifest: Mapped[dict[str, Any]] = mapped_column(JSON)
    announced_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class RegionRow(Base):
    """A region: its own runtime and its own gateway, rolled out to in `position` order."""

    __tablename__ = "regions"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    position: Mapped[int] = mapped_column(Integer)
    runtime: Mapped[str] = mapped_column(String(16))
    ray_address: Mapped[str | None] = mapped_column(String(256), nullable=True)
    http_port: Mapped[int] = mapped_column(Integer)
    grpc_port: Mapped[int] = mapped_column(Integer)


class DeploymentRow(Base):
    """One (model, version) a region's runtime keeps `num_desired` instances of."""

    __tablename__ = "deployments"
    __table_args__ = (UniqueConstraint("model", "region", "version",
                                       name="uq_deployments_model_region_version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str] = mapped_column(String(64), index=True)
    version: Mapped[str] = mapped_column(String(64))
    region: Mapped[str] = mapped_column(String(64), server_default=DEFAULT_REGION)
    strategy: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16), default="active")
    num_desired: Mapped[int] = mapped_column(Integer, default=0)
    min_instances: Mapped[int] = mapped_column(Integer, default=1)
    max_instances: Mapped[int] = mapped_column(Integer, default=1)
    last_request_ms: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    instances: Mapped[list[InstanceRow]] = relationship(
        back_populates="deployment", cascade="all, delete-orphan")


class InstanceRow(Base):
    """One running (or starting, draining, stopped) server process of a deployment."""

    __tablename__ = "instances"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    deployment_id: Mapped[int] = mapped_column(ForeignKey("deployments.id"), index=True)
    state: Mapped[str] = mapped_column(String(16), default="starting")
    http_port: Mapped[int | None] = mapped_column(Integer, nullable=True)
    grpc_port: Mapped[int | None] = mapped_column(Integer, nullable=True)
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    num_restarts: Mapped[int] = mapped_column(Integer, default=0)
    log_path: Mapped[str | None] = mapped_column(Text, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow,
                                                 onupdate=utcnow)

    deployment: Mapped[DeploymentRow] = relationship(back_populates="instances")


class RolloutRow(Base):
    """A rollout of one model to a new version; `state` holds the controller's full state."""

    __tablename__ = "rollouts"
    # at most one running rollout per model, enforced by the database itself
    __table_args__ = (Index("uq_rollouts_running_model", "model", unique=True,
                            sqlite_where=text("status = 'running'"),
                            postgresql_where=text("status = 'running'")),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str] = mapped_column(String(64), index=True)
    from_version: Mapped[str | None] = mapped_column(String(64), nullable=True)
    to_version: Mapped[str] = mapped_column(String(64))
    strategy: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16), default="running", index=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    state: Mapped[dict[str, Any]] = mapped_column(JSON)
    num_steps: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow,
                                                 onupdate=utcnow)

    steps: Mapped[list[RolloutStepRow]] = relationship(
        back_populates="rollout", cascade="all, delete-orphan", order_by="RolloutStepRow.seq")


class RolloutStepRow(Base):
    """One decision of the rollout controller, written before its actions are carried out."""

    __tablename__ = "rollout_steps"
    __table_args__ = (UniqueConstraint("rollout_id", "seq", name="uq_rollout_steps_seq"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    rollout_id: Mapped[int] = mapped_column(ForeignKey("rollouts.id"), index=True)
    seq: Mapped[int] = mapped_column(Integer)
    at_ms: Mapped[int] = mapped_column(BigInteger)
    phase: Mapped[str] = mapped_column(String(32))
    note: Mapped[str] = mapped_column(Text, default="")
    actions: Mapped[list[dict[str, Any]]] = mapped_column(JSON)

    rollout: Mapped[RolloutRow] = relationship(back_populates="steps")


class TrafficSplitRow(Base):
    """The share (0-100) of a model's unversioned traffic in a region that goes to a version."""

    __tablename__ = "traffic_splits"

    model: Mapped[str] = mapped_column(String(64), primary_key=True)
    region: Mapped[str] = mapped_column(String(64), primary_key=True)
    version: Mapped[str] = mapped_column(String(64), primary_key=True)
    weight: Mapped[int] = mapped_column(Integer)


class AliasRow(Base):
    """A named pointer to a version of a model in a region (`latest`)."""

    __tablename__ = "aliases"

    model: Mapped[str] = mapped_column(String(64), primary_key=True)
    region: Mapped[str] = mapped_column(String(64), primary_key=True)
    alias: Mapped[str] = mapped_column(String(32), primary_key=True)
    version: Mapped[str] = mapped_column(String(64))


class EventRow(Base):
    """Something an operator should be able to read later: a step, a rollback and why."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    kind: Mapped[str] = mapped_column(String(32))
    model: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    message: Mapped[str] = mapped_column(Text)
