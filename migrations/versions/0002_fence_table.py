"""Create the fence table: the highest fence accepted per resource (``accept_fence``).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import mysql

from sql_lease.sql.migrate import mysql_object_missing

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def _names():  # type: ignore[no-untyped-def]
    return context.config.attributes["sql_lease_names"]


def upgrade() -> None:
    names = _names()
    dialect = op.get_context().dialect.name
    if dialect == "postgresql":
        accepted_at_type: sa.types.TypeEngine = sa.DateTime(timezone=True)
    elif dialect in ("mysql", "mariadb"):
        accepted_at_type = mysql.DATETIME(fsp=6)
    else:
        accepted_at_type = sa.BigInteger()  # epoch milliseconds by SQLite's clock, as expires_at
    if not mysql_object_missing("table", names.fence_table):  # made on MySQL by a migrate that stopped partway
        return
    op.create_table(
        names.fence_table,
        sa.Column("resource", sa.String(512).with_variant(mysql.VARBINARY(2048), "mysql", "mariadb"), primary_key=True),
        sa.Column("fence", sa.BigInteger(), nullable=False),
        sa.Column("accepted_at", accepted_at_type, nullable=False),
        schema=names.schema,
        mysql_engine="InnoDB",
    )


def downgrade() -> None:
    names = _names()
    op.drop_table(names.fence_table, schema=names.schema)
