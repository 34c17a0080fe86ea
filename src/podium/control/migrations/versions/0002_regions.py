"""Regions: the `regions` table; deployments, traffic splits and aliases belong to a region.

Every existing row moves to the region `default`, the one region of a control plane that
declares none, so a single-region plane goes on exactly as before.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

DEFAULT = "default"


def upgrade() -> None:
    op.create_table(
        "regions",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("runtime", sa.String(16), nullable=False),
        sa.Column("ray_address", sa.String(256), nullable=True),
        sa.Column("http_port", sa.Integer, nullable=False),
        sa.Column("grpc_port", sa.Integer, nullable=False),
    )
    with op.batch_alter_table("deployments") as batch:
        batch.add_column(sa.Column("region", sa.String(64), nullable=False,
                                   server_default=DEFAULT))
        batch.drop_constraint("uq_deployments_model_version", type_="unique")
        batch.create_unique_constraint("uq_deployments_model_region_version",
                                       ["model", "region", "version"])
    # a primary key gains a column: the two small tables are rebuilt, rows kept
    _rebuild("traffic_splits", ["model", "version", "weight"], [
        sa.Column("model", sa.String(64), primary_key=True),
        sa.Column("region", sa.String(64), primary_key=True),
        sa.Column("version", sa.String(64), primary_key=True),
        sa.Column("weight", sa.Integer, nullable=False)])
    _rebuild("aliases", ["model", "alias", "version"], [
        sa.Column("model", sa.String(64), primary_key=True),
        sa.Column("region", sa.String(64), primary_key=True),
        sa.Column("alias", sa.String(32), primary_key=True),
        sa.Column("version", sa.String(64), nullable=False)])


def _rebuild(name: str, kept: list[str], columns: list[sa.Column]) -> None:
    connection = op.get_bind()
    rows = [dict(r._mapping) for r in connection.execute(
        sa.text(f"SELECT {', '.join(kept)} FROM {name}"))]
    op.drop_table(name)
    table = op.create_table(name, *columns)
    if rows:
        op.bulk_insert(table, [{**row, "region": DEFAULT} for row in rows])


def downgrade() -> None:
    raise NotImplementedError("regions cannot be merged back into one; restore a backup")
