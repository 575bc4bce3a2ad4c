"""What each lease operation is in SQL, one dialect per class, read top to bottom.

Every operation is one statement that checks and acts, run on its own (autocommit, never inside a
caller's transaction); time comes from the database's clock. Parameters are positional and the
same for both dialects:

    acquire   (key, owner, ttl)           -> (acquired, owner, fence, expires_at) or no row
    acquire_waiting                       -> the same; a refusal also marks the row has_waiters
    holder    (key,)                      -> (owner, fence, expires_at) of the unexpired lease
    owner     (key,)                      -> (owner,) of the unexpired lease
    release   (key, owner)                -> (was_unexpired,) if owner's row was deleted
    renew     (key, owner, ttl)           -> (expires_at,) if renewed
    transfer  (key, from, to, ttl)        -> (owner, fence, expires_at) if transferred
    sweep     (grace, batch_size)         -> rows removed (PostgreSQL: one row with the count)

``acquire`` returns no row when it was refused and the holder is not visible to the statement;
the executor then reads ``holder``. On PostgreSQL, releasing, transferring or sweeping a row whose
``has_waiters`` is set sends ``NOTIFY <channel>, <key>``, so waiters wake at once; rows nobody waits
for never notify (NOTIFY serialises commits, so the plain acquire/release cycle stays free of it).
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
    acquire_waiting: str
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
        # Statements that find a row by its key test expiry as `expires_at + interval '0' > now()`:
        # the same test, but one the expires_at index cannot serve. Otherwise a generic plan made
        # while the table was (nearly) empty may walk that index over every live lease instead of
        # looking the key up (seen in the benchmark: 10,000 renewals every 5 s fell to 120/s).
        live = "expires_at + interval '0' > now()"
        notify = "pg_notify('" + names.notify_channel + "', key)"
        # Fences must be drawn in the order owners change. nextval() in an INSERT's VALUES runs
        # before ON CONFLICT waits for a locked row; if that row is then deleted, the insert would
        # go ahead with a fence older than one issued meanwhile. So every statement that draws a
        # fence first takes a transaction-level advisory lock on (table, key), and draws after it.
        # A key held by another owner is refused by a plain read, taking no lock: racers for a busy
        # key never queue behind each other or delay the holder's release. (The read uses the
        # statement's snapshot; a release committed after it began is seen by the next attempt.)
        busy = f"""busy AS (
    SELECT owner, fence, expires_at FROM {t} WHERE key = $1 AND {live} AND owner <> $2
)"""
        # Otherwise, fences must be drawn in the order owners change. nextval() in an INSERT runs
        # before ON CONFLICT waits for a locked row; if that row is then deleted, the insert would
        # go ahead with a fence older than one issued meanwhile. So every statement that draws a
        # fence first takes a transaction-level advisory lock on (table, key), and draws after it.
        lock = f"pg_advisory_xact_lock({names.advisory_lock_class}, hashtext($1::varchar))"
        serialise = f"SELECT {lock} WHERE NOT EXISTS (SELECT FROM busy)"
        upsert = f"""
    INSERT INTO {t} AS held (key, owner, fence, expires_at)
    SELECT $1, $2, nextval('{seq}'), {expires} FROM serialised
    ON CONFLICT (key) DO UPDATE
       SET owner = excluded.owner,
           expires_at = excluded.expires_at,
           fence = CASE WHEN held.owner = excluded.owner THEN held.fence ELSE excluded.fence END
     WHERE held.owner = excluded.owner OR held.expires_at <= now()
    RETURNING held.owner, held.fence, held.expires_at"""
        # If the upsert itself refused (a holder committed after the snapshot), the holder is not
        # visible to this statement: no row comes back and the executor reads it afresh.
        super().__init__(
            acquire=f"""
WITH {busy}, serialised AS ({serialise}), attempt AS ({upsert}
)
SELECT true, owner, fence, expires_at FROM attempt
UNION ALL
SELECT false, owner, fence, expires_at FROM busy""",
            acquire_waiting=f"""
WITH {busy}, serialised AS ({serialise}), attempt AS ({upsert}
), waiting AS (
    UPDATE {t} SET has_waiters = true
     WHERE key = $1 AND NOT EXISTS (SELECT FROM attempt)
    RETURNING owner, fence, expires_at
)
SELECT true, owner, fence, expires_at FROM attempt
UNION ALL
SELECT false, owner, fence, expires_at FROM waiting WHERE expires_at > now() AND owner <> $2""",
            holder=f"SELECT owner, fence, expires_at FROM {t} WHERE key = $1 AND {live}",
            owner=f"SELECT owner FROM {t} WHERE key = $1 AND {live}",
            release=f"""
WITH gone AS (
    DELETE FROM {t} WHERE key = $1 AND owner = $2
    RETURNING key, expires_at > now() AS was_unexpired, has_waiters
)
SELECT was_unexpired, CASE WHEN has_waiters THEN {notify} END FROM gone""",
            renew=f"""
UPDATE {t} SET expires_at = {expires}
 WHERE key = $1 AND owner = $2 AND {live}
RETURNING expires_at""",
            transfer=f"""
WITH serialised AS (SELECT {lock}), moved AS (
    UPDATE {t} AS l
       SET owner = $3::varchar,
           expires_at = now() + $4::float8 * interval '1 millisecond',
           fence = CASE WHEN l.owner = $3::varchar THEN l.fence ELSE nextval('{seq}') END
      FROM serialised
     WHERE l.key = $1 AND l.owner = $2 AND l.{live}
    RETURNING l.key, l.owner, l.fence, l.expires_at, l.has_waiters
)
SELECT owner, fence, expires_at, CASE WHEN has_waiters THEN {notify} END FROM moved""",
            sweep=f"""
WITH doomed AS (
    SELECT key FROM {t}
     WHERE expires_at <= now() - $1::float8 * interval '1 millisecond'
     ORDER BY expires_at
     LIMIT $2
       FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM {t} AS l USING doomed WHERE l.key = doomed.key RETURNING l.key, l.has_waiters
)
SELECT count(*), count(CASE WHEN has_waiters THEN {notify} END) FROM gone""",
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
        acquire = f"""
INSERT INTO {t} AS held (key, owner, fence, expires_at)
VALUES (?1, ?2, {next_fence}, {now} + ?3)
ON CONFLICT (key) DO UPDATE
   SET owner = excluded.owner,
       expires_at = excluded.expires_at,
       fence = CASE WHEN held.owner = excluded.owner THEN held.fence ELSE excluded.fence END
 WHERE held.owner = excluded.owner OR held.expires_at <= {now}
RETURNING 1, owner, fence, expires_at"""
        super().__init__(
            acquire=acquire,
            acquire_waiting=acquire,  # no NOTIFY on SQLite: waiters poll
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
