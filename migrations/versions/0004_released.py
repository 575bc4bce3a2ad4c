"""Add the ``released`` column: a lease its owner released with a minimum hold (``min_hold_ms``)
is kept, marked released (renewable, transferable and re-acquirable by nobody), until that hold
runs out.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

from sql_lease.sql.migrate import mysql_object_missing

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# How long the ALTER waits for its brief exclusive lock on the lease table (as 0003).
POSTGRES_LOCK_TIMEOUT = "2s"


def _names():  # type: ignore[no-untyped-def]
    return context.config.attributes["sql_lease_names"]


def upgrade() -> None:
    names = _names()
    if op.get_context().dialect.name == "postgresql":
        op.execute(f"SET LOCAL lock_timeout = '{POSTGRES_LOCK_TIMEOUT}'")
    # NOT NULL with a constant default: no table rewrite on PostgreSQL 11+ (nor on MySQL 8, INSTANT);
    # every existing row reads as not released. Skipped on MySQL if a migrate that stopped partway added it.
    if not mysql_object_missing("column", "released", names.table):
        return
    op.add_column(
        names.table,
        sa.Column("released", sa.Boolean(), nullable=False, server_default=sa.false()),
        schema=names.schema,
    )


def downgrade() -> None:
    names = _names()
    op.drop_column(names.table, "released", schema=names.schema)
