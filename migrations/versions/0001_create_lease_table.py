"""Create the lease table, its expiry index and its fence counter.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import mysql

from sql_lease.sql.migrate import mysql_object_missing

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _names():  # type: ignore[no-untyped-def]
    return context.config.attributes["sql_lease_names"]


def upgrade() -> None:
    names = _names()
    dialect = op.get_context().dialect.name
    # MySQL/MariaDB: byte-for-byte keys and owners (VARBINARY: no collation, no padding; 2048
    # bytes hold 512 characters of UTF-8), DATETIME(6) in UTC
    text_type: sa.types.TypeEngine = sa.String(512).with_variant(mysql.VARBINARY(2048), "mysql", "mariadb")
    if dialect == "postgresql":
        op.execute(sa.schema.CreateSequence(sa.Sequence(names.fence_sequence, schema=names.schema)))
        expires_at_type: sa.types.TypeEngine = sa.DateTime(timezone=True)
    elif dialect in ("mysql", "mariadb"):
        expires_at_type = mysql.DATETIME(fsp=6)
    else:
        expires_at_type = sa.BigInteger()
    # each step skips, on MySQL, what a migrate that stopped partway made (mysql_object_missing)
    if mysql_object_missing("table", names.table):
        op.create_table(
            names.table,
            sa.Column("key", text_type, primary_key=True),
            sa.Column("owner", text_type, nullable=False),
            sa.Column("fence", sa.BigInteger(), nullable=False),
            sa.Column("expires_at", expires_at_type, nullable=False),
            sa.Column("has_waiters", sa.Boolean(), nullable=False, server_default=sa.false()),
            schema=names.schema,
            sqlite_with_rowid=False,
            mysql_engine="InnoDB",
        )
    if mysql_object_missing("index", names.expires_at_index, names.table):
        op.create_index(names.expires_at_index, names.table, ["expires_at"], schema=names.schema)
    if dialect in ("mysql", "mariadb") and mysql_object_missing("table", names.fence_counter):
        # Fences are drawn from its AUTO_INCREMENT (no sequences on MySQL; no triggers: they need
        # privileges a deploy user often lacks when binary logging is on).
        op.create_table(
            names.fence_counter,
            sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=True),
            schema=names.schema,
            mysql_engine="InnoDB",
        )
    if dialect == "sqlite":
        prefix = f'"{names.schema}".' if names.schema else ""
        counter = f'{prefix}"{names.fence_counter}"'

        op.create_table(
            names.fence_counter,
            sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
            sa.Column("last_fence", sa.BigInteger(), nullable=False),
            sa.CheckConstraint("id = 1", name=f"ck_{names.fence_counter}_one_row"),
            schema=names.schema,
        )
        op.execute(f"INSERT INTO {counter} (id, last_fence) VALUES (1, 0)")
        # Trigger bodies may not qualify table names: they act on the trigger's own database.
        for event, condition in (("INSERT", ""), ("UPDATE OF fence", " WHEN NEW.fence > OLD.fence")):
            suffix = "insert" if event == "INSERT" else "update"
            trigger = f'{prefix}"{names.table}_fence_on_{suffix}"'
            op.execute(
                f'CREATE TRIGGER {trigger} AFTER {event} ON "{names.table}"{condition}\n'
                f'BEGIN UPDATE "{names.fence_counter}" SET last_fence = NEW.fence WHERE NEW.fence > last_fence; END'
            )


def downgrade() -> None:
    names = _names()
    dialect = op.get_context().dialect.name
    op.drop_index(names.expires_at_index, names.table, schema=names.schema)
    op.drop_table(names.table, schema=names.schema)
    if dialect == "postgresql":
        op.execute(sa.schema.DropSequence(sa.Sequence(names.fence_sequence, schema=names.schema)))
    else:  # SQLite, MySQL
        op.drop_table(names.fence_counter, schema=names.schema)
