"""Add the slot table ``<table>_slots``: one row per holder of a key held as a semaphore
(``acquire_lease(..., limit=N)``, N >= 2; issue 25). Such a key keeps a head row in the lease
table (owner ``''``), which every slot operation locks first (docs/statements.md, "Semaphores").
Downgrading drops the table with its slots, and deletes the heads (a release before 0006 would
read a head as a lease held by ``''``).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import mysql

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

STORED_KEY_LENGTH = 1024
OWNER_LENGTH = 512


def _names():  # type: ignore[no-untyped-def]
    return context.config.attributes["sql_lease_names"]


def upgrade() -> None:
    names = _names()
    dialect = op.get_context().dialect.name
    # As the lease table's columns: VARBINARY (byte for byte) on MySQL, DATETIME(6) in UTC
    key_type: sa.types.TypeEngine = sa.String(STORED_KEY_LENGTH if dialect == "postgresql" else OWNER_LENGTH)
    owner_type: sa.types.TypeEngine = sa.String(OWNER_LENGTH)
    data_type: sa.types.TypeEngine = sa.Text()
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import JSON

        expires_at_type: sa.types.TypeEngine = sa.DateTime(timezone=True)
        data_type = JSON()
    elif dialect in ("mysql", "mariadb"):
        key_type = owner_type = mysql.VARBINARY(2048)
        expires_at_type, data_type = mysql.DATETIME(fsp=6), mysql.LONGTEXT()
    else:
        expires_at_type = sa.BigInteger()
    if dialect in ("mysql", "mariadb"):
        # InnoDB keys hold at most 3072 bytes: the primary key takes the owner's first 1024 (the
        # slot statements insert, never upsert, so two owners alike that far collide loudly)
        prefix = f"`{names.schema}`." if names.schema else ""
        op.execute(
            f"CREATE TABLE {prefix}`{names.slot_table}` (`key` VARBINARY(2048) NOT NULL, "
            "owner VARBINARY(2048) NOT NULL, fence BIGINT NOT NULL, acquired_at DATETIME(6) NOT NULL, "
            "expires_at DATETIME(6) NOT NULL, data LONGTEXT NULL, released BOOL NOT NULL DEFAULT false, "
            "PRIMARY KEY (`key`, owner(1024))) ENGINE=InnoDB"
        )
        return
    op.create_table(
        names.slot_table,
        sa.Column("key", key_type, primary_key=True),
        sa.Column("owner", owner_type, primary_key=True),
        sa.Column("fence", sa.BigInteger(), nullable=False),
        sa.Column("acquired_at", expires_at_type, nullable=False),
        sa.Column("expires_at", expires_at_type, nullable=False),
        sa.Column("data", data_type, nullable=True),
        sa.Column("released", sa.Boolean(), nullable=False, server_default=sa.false()),
        schema=names.schema,
        sqlite_with_rowid=False,
        mysql_engine="InnoDB",
    )


def downgrade() -> None:
    names = _names()
    op.drop_table(names.slot_table, schema=names.schema)
    table = sa.table(names.table, sa.column("owner"), schema=names.schema)
    op.execute(table.delete().where(table.c.owner == ""))
