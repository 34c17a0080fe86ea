"""Initial schema: packages, deployments, instances, rollouts and steps, splits, aliases, events.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "packages",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(64), nullable=False, index=True),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("backend", sa.String(32), nullable=False),
        sa.Column("location", sa.Text, nullable=False),
        sa.Column("manifest", sa.JSON, nullable=False),
        sa.Column("announced_at", _TS, nullable=False),
        sa.UniqueConstraint("name", "version", name="uq_packages_name_version"),
    )
    op.create_table(
        "deployments",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("model", sa.String(64), nullable=False, index=True),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("strategy", sa.String(16), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("num_desired", sa.Integer, nullable=False),
        sa.Column("min_instances", sa.Integer, nullable=False),
        sa.Column("max_instances", sa.Integer, nullable=False),
        sa.Column("last_request_ms", sa.BigInteger, nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.UniqueConstraint("model", "version", name="uq_deployments_model_version"),
    )
    op.create_table(
        "instances",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("deployment_id", sa.Integer, sa.ForeignKey("deployments.id"), nullable=False,
                  index=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("http_port", sa.Integer, nullable=True),
        sa.Column("grpc_port", sa.Integer, nullable=True),
        sa.Column("pid", sa.Integer, nullable=True),
        sa.Column("num_restarts", sa.Integer, nullable=False),
        sa.Column("log_path", sa.Text, nullable=True),
        sa.Column("updated_at", _TS, nullable=False),
    )
    op.create_table(
        "rollouts",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("model", sa.String(64), nullable=False, index=True),
        sa.Column("from_version", sa.String(64), nullable=True),
        sa.Column("to_version", sa.String(64), nullable=False),
        sa.Column("strategy", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False, index=True),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("state", sa.JSON, nullable=False),
        sa.Column("num_steps", sa.Integer, nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("updated_at", _TS, nullable=False),
    )
    op.create_index("uq_rollouts_running_model", "rollouts", ["model"], unique=True,
                    sqlite_where=sa.text("status = 'running'"),
                    postgresql_where=sa.text("status = 'running'"))
    op.create_table(
        "rollout_steps",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("rollout_id", sa.Integer, sa.ForeignKey("rollouts.id"), nullable=False,
                  index=True),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("at_ms", sa.BigInteger, nullable=False),
        sa.Column("phase", sa.String(32), nullable=False),
        sa.Column("note", sa.Text, nullable=False),
        sa.Column("actions", sa.JSON, nullable=False),
        sa.UniqueConstraint("rollout_id", "seq", name="uq_rollout_steps_seq"),
    )
    op.create_table(
        "traffic_splits",
        sa.Column("model", sa.String(64), primary_key=True),
        sa.Column("version", sa.String(64), primary_key=True),
        sa.Column("weight", sa.Integer, nullable=False),
    )
    op.create_table(
        "aliases",
        sa.Column("model", sa.String(64), primary_key=True),
        sa.Column("alias", sa.String(32), primary_key=True),
        sa.Column("version", sa.String(64), nullable=False),
    )
    op.create_table(
        "events",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("at", _TS, nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("model", sa.String(64), nullable=True, index=True),
        sa.Column("message", sa.Text, nullable=False),
    )


def downgrade() -> None:
    for table in ("events", "aliases", "traffic_splits", "rollout_steps", "rollouts",
                  "instances", "deployments", "packages"):
        op.drop_table(table)
