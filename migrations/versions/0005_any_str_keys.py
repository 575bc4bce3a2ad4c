"""Keys of any text (issue 24): the lease table holds each key in its stored form
(``sql_lease.contract.encode_key``: NUL, U+0001 and lone surrogates escaped with U+0001).

Keys an earlier release stored with a raw U+0001 are rewritten into that form, and on PostgreSQL
``key`` widens to 1024 characters (a key of 512 characters stores in at most two per character;
no table rewrite). MySQL's VARBINARY(2048) already holds four bytes per character, and SQLite does
not enforce a declared length. Downgrading deletes the leases of keys the earlier release cannot
name (those with NUL or a lone surrogate) and turns the rest back.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# How long the ALTER waits for its brief exclusive lock on the lease table (as in 0003).
POSTGRES_LOCK_TIMEOUT = "2s"
OLD_KEY_LENGTH = 512
STORED_KEY_LENGTH = 1024

# Per dialect: U+0001, U+0001 U+0002 (U+0001 stored), and "{text} contains U+0001".
_TEXTS = {
    "postgresql": ("chr(1)", "chr(1) || chr(2)", "strpos({text}, chr(1)) > 0"),
    "sqlite": ("char(1)", "char(1, 2)", "instr({text}, char(1)) > 0"),
    "mysql": ("X'01'", "X'0102'", "LOCATE(X'01', {text}) > 0"),
}


def _names():  # type: ignore[no-untyped-def]
    return context.config.attributes["sql_lease_names"]


def _texts() -> tuple[str, str, str, str, str]:
    """The lease table, its key column, U+0001, U+0001 stored, and "contains U+0001" of a text."""
    dialect = op.get_context().dialect
    names = _names()
    quote = dialect.identifier_preparer.quote
    table = f"{quote(names.schema)}.{quote(names.table)}" if names.schema else quote(names.table)
    char, stored, contains = _TEXTS["mysql" if dialect.name == "mariadb" else dialect.name]
    return table, quote("key"), char, stored, contains


def _alter_key(length: int) -> None:
    names = _names()
    op.execute(f"SET LOCAL lock_timeout = '{POSTGRES_LOCK_TIMEOUT}'")
    op.alter_column(
        names.table,
        "key",
        type_=sa.String(length),
        existing_type=sa.String(STORED_KEY_LENGTH if length == OLD_KEY_LENGTH else OLD_KEY_LENGTH),
        existing_nullable=False,
        schema=names.schema,
    )


def _rekey(table: str, key: str, where: str, new_key: str) -> None:
    """Give the rows ``where`` selects the key ``new_key`` computes, through a temporary table: one
    row's new key may be another selected row's old key, which an ``UPDATE`` row by row would meet."""
    dialect = op.get_context().dialect
    rekeyed = dialect.identifier_preparer.quote("sql_lease_rekey")
    temporary = "TEMPORARY" if dialect.name in ("mysql", "mariadb") else "TEMP"  # MySQL: DROP TEMPORARY too
    op.execute(f"CREATE {temporary} TABLE {rekeyed} AS SELECT * FROM {table} WHERE {where}")
    op.execute(f"DELETE FROM {table} WHERE {where}")
    op.execute(f"UPDATE {rekeyed} SET {key} = {new_key}")
    op.execute(f"INSERT INTO {table} SELECT * FROM {rekeyed}")
    op.execute(f"DROP {'TEMPORARY TABLE' if temporary == 'TEMPORARY' else 'TABLE'} {rekeyed}")


def upgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        _alter_key(STORED_KEY_LENGTH)
    table, key, char, stored, contains = _texts()
    _rekey(table, key, contains.format(text=key), f"replace({key}, {char}, {stored})")


def downgrade() -> None:
    table, key, char, stored, contains = _texts()
    # Left with a U+0001 once every stored U+0001 (U+0001 U+0002) is taken out: a NUL or a surrogate.
    without_stored_escapes = f"replace({key}, {stored}, '')"
    op.execute(f"DELETE FROM {table} WHERE {contains.format(text=without_stored_escapes)}")
    _rekey(table, key, contains.format(text=key), f"replace({key}, {stored}, {char})")
    if op.get_context().dialect.name == "postgresql":
        _alter_key(OLD_KEY_LENGTH)
