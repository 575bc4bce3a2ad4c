"""Add the nullable ``data`` column (lease data, a small JSON object given at acquire or transfer)
and the nullable ``acquired_at`` column (when the tenure began, by the database's clock).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import mysql, postgresql

from sql_lease.sql.migrate import mysql_object_missing

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

# How long the ALTER waits for its brief exclusive lock on the lease table; lease statements queue
# behind a waiting ALTER, so it gives up (migrate fails; run it again) rather than stall holders.
POSTGRES_LOCK_TIMEOUT = "2s"


def _names():  # type: ignore[no-untyped-def]
    return context.config.attributes["sql_lease_names"]


def upgrade() -> None:
    names = _names()
    if op.get_context().dialect.name == "postgresql":
        op.execute(f"SET LOCAL lock_timeout = '{POSTGRES_LOCK_TIMEOUT}'")
        data_type: sa.types.TypeEngine = postgresql.JSON()
        time_type: sa.types.TypeEngine = sa.DateTime(timezone=True)
    elif op.get_context().dialect.name in ("mysql", "mariadb"):
        data_type, time_type = mysql.LONGTEXT(), mysql.DATETIME(fsp=6)
    else:
        data_type, time_type = sa.Text(), sa.BigInteger()
    # Nullable, no default: no table rewrite (PostgreSQL); rows of earlier releases read as no data
    # and an unknown tenure start.
    # each skipped on MySQL if a migrate that stopped partway added it
    if mysql_object_missing("column", "data", names.table):
        op.add_column(names.table, sa.Column("data", data_type, nullable=True), schema=names.schema)
    if mysql_object_missing("column", "acquired_at", names.table):
        op.add_column(names.table, sa.Column("acquired_at", time_type, nullable=True), schema=names.schema)


def downgrade() -> None:
    names = _names()
    op.drop_column(names.table, "acquired_at", schema=names.schema)
    op.drop_column(names.table, "data", schema=names.schema)
