"""What each lease operation is in SQL, one dialect per class, read top to bottom.

Every operation is one statement that checks and acts, run on its own (autocommit, never inside a
caller's transaction); time comes from the database's clock. Parameters are positional and the
same for both dialects:

    acquire   (key, owner, ttl)           -> (acquired, owner, fence, expires_at) or no row
    holder    (key,)                      -> (owner, fence, expires_at) of the unexpired lease
    owner     (key,)                      -> (owner,) of the unexpired lease
    release   (key, owner)                -> (was_unexpired,) if owner's row was deleted
    renew     (key, owner, ttl)           -> (expires_at,) if renewed
    transfer  (key, from, to, ttl)        -> (owner, fence, expires_at) if transferred
    sweep     (grace, batch_size)         -> rows removed (PostgreSQL: one row with the count)

``acquire`` returns no row when it was refused and the holder is not visible to the statement;
the executor then reads ``holder``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.engine.interfaces import Dialect

from .schema import LeaseTableNames

__all__ = ["LeaseStatements", "PostgresStatements", "SqliteStatements", "statements_for"]


@dataclass(frozen=True)
class LeaseStatements:
    """The SQL text of every operation for one dialect and table."""

    acquire: str
    holder: str
    owner: str
    release: str
    renew: str
    transfer: str
    sweep: str

    def ttl_param(self, ttl_ms: float) -> Any:
        """The TTL as the statements expect it (milliseconds)."""
        return ttl_ms

    def to_datetime(self, value: Any) -> datetime:
        """An ``expires_at`` value from the database as an aware UTC datetime."""
        return value  # type: ignore[no-any-return]

    def swept_count(self, rows: list[Any]) -> int:
        """How many rows ``sweep`` removed, from the rows it returned."""
        return len(rows)


def _qualified(dialect: Dialect, names: LeaseTableNames, name: str) -> str:
    quote = dialect.identifier_preparer.quote_identifier
    return f"{quote(names.schema)}.{quote(name)}" if names.schema else quote(name)


class PostgresStatements(LeaseStatements):
    """PostgreSQL: ``timestamptz`` from ``now()``, fences from a sequence, upsert with a CTE that
    also returns the holder on refusal, so acquire is one round trip either way."""

    def __init__(self, names: LeaseTableNames) -> None:
        from sqlalchemy.dialects import postgresql

        dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
        t = _qualified(dialect, names, names.table)
        seq = _qualified(dialect, names, names.fence_sequence).replace("'", "''")
        expires = "now() + $3::float8 * interval '1 millisecond'"
        super().__init__(
            acquire=f"""
WITH attempt AS (
    INSERT INTO {t} AS held (key, owner, fence, expires_at)
    VALUES ($1, $2, nextval('{seq}'), {expires})
    ON CONFLICT (key) DO UPDATE
       SET owner = excluded.owner,
           expires_at = excluded.expires_at,
           fence = CASE WHEN held.owner = excluded.owner THEN held.fence ELSE excluded.fence END
     WHERE held.owner = excluded.owner OR held.expires_at <= now()
    RETURNING held.owner, held.fence, held.expires_at
)
SELECT true, owner, fence, expires_at FROM attempt
UNION ALL
SELECT false, owner, fence, expires_at FROM {t}
 WHERE key = $1 AND NOT EXISTS (SELECT FROM attempt)""",
            holder=f"SELECT owner, fence, expires_at FROM {t} WHERE key = $1 AND expires_at > now()",
            owner=f"SELECT owner FROM {t} WHERE key = $1 AND expires_at > now()",
            release=f"DELETE FROM {t} WHERE key = $1 AND owner = $2 RETURNING expires_at > now()",
            renew=f"""
UPDATE {t} SET expires_at = {expires}
 WHERE key = $1 AND owner = $2 AND expires_at > now()
RETURNING expires_at""",
            transfer=f"""
UPDATE {t}
   SET owner = $3::varchar,
       expires_at = now() + $4::float8 * interval '1 millisecond',
       fence = CASE WHEN owner = $3::varchar THEN fence ELSE nextval('{seq}') END
 WHERE key = $1 AND owner = $2 AND expires_at > now()
RETURNING owner, fence, expires_at""",
            sweep=f"""
WITH doomed AS (
    SELECT key FROM {t}
     WHERE expires_at <= now() - $1::float8 * interval '1 millisecond'
     ORDER BY expires_at
     LIMIT $2
       FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM {t} AS l USING doomed WHERE l.key = doomed.key RETURNING 1
)
SELECT count(*) FROM gone""",
        )

    def swept_count(self, rows: list[Any]) -> int:
        return int(rows[0][0])


# SQLite's own clock as integer Unix epoch milliseconds. 'now' is stable within one statement.
# (SQLite 3.40 has no unixepoch('subsec'); julianday keeps sub-millisecond precision.)
SQLITE_NOW_MS = "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"


class SqliteStatements(LeaseStatements):
    """SQLite: integer epoch milliseconds from SQLite's clock, fences from a one-row counter table
    advanced by triggers. Each statement runs as its own write transaction."""

    def __init__(self, names: LeaseTableNames) -> None:
        from sqlalchemy.dialects import sqlite

        dialect = sqlite.dialect()  # type: ignore[no-untyped-call]
        t = _qualified(dialect, names, names.table)
        counter = _qualified(dialect, names, names.fence_counter)
        now = SQLITE_NOW_MS
        next_fence = f"(SELECT last_fence + 1 FROM {counter})"
        super().__init__(
            acquire=f"""
INSERT INTO {t} AS held (key, owner, fence, expires_at)
VALUES (?1, ?2, {next_fence}, {now} + ?3)
ON CONFLICT (key) DO UPDATE
   SET owner = excluded.owner,
       expires_at = excluded.expires_at,
       fence = CASE WHEN held.owner = excluded.owner THEN held.fence ELSE excluded.fence END
 WHERE held.owner = excluded.owner OR held.expires_at <= {now}
RETURNING 1, owner, fence, expires_at""",
            holder=f"SELECT owner, fence, expires_at FROM {t} WHERE key = ?1 AND expires_at > {now}",
            owner=f"SELECT owner FROM {t} WHERE key = ?1 AND expires_at > {now}",
            release=f"DELETE FROM {t} WHERE key = ?1 AND owner = ?2 RETURNING expires_at > {now}",
            renew=f"""
UPDATE {t} SET expires_at = {now} + ?3
 WHERE key = ?1 AND owner = ?2 AND expires_at > {now}
RETURNING expires_at""",
            transfer=f"""
UPDATE {t}
   SET owner = ?3,
       expires_at = {now} + ?4,
       fence = CASE WHEN owner = ?3 THEN fence ELSE {next_fence} END
 WHERE key = ?1 AND owner = ?2 AND expires_at > {now}
RETURNING owner, fence, expires_at""",
            sweep=f"""
DELETE FROM {t} WHERE key IN (
    SELECT key FROM {t} WHERE expires_at <= {now} - ?1 ORDER BY expires_at LIMIT ?2
) RETURNING 1""",
        )

    def ttl_param(self, ttl_ms: float) -> int:
        return math.ceil(ttl_ms)

    def to_datetime(self, value: Any) -> datetime:
        return datetime.fromtimestamp(value / 1000.0, tz=UTC)


def statements_for(dialect_name: str, names: LeaseTableNames) -> LeaseStatements:
    """The statements of ``dialect_name``; ``ValueError`` for a database sql_lease does not support."""
    if dialect_name == "postgresql":
        return PostgresStatements(names)
    if dialect_name == "sqlite":
        return SqliteStatements(names)
    raise ValueError(f"sql_lease supports postgresql and sqlite, not {dialect_name!r}")
