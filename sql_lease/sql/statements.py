"""What each lease operation is in SQL, one dialect per class, read top to bottom.

Every operation is one statement that checks and acts, run on its own (autocommit, never inside a
caller's transaction); time comes from the database's clock. Parameters are positional and the
same for both dialects:

    acquire   (key, owner, ttl, data) -> (acquired, owner, fence, expires_at, remaining_ms) or no row
                                      (PostgreSQL: a fifth parameter, the lock_timeout of the
                                      statement's transaction, e.g. '2500ms', or NULL)
    acquire_waiting                -> the same (PostgreSQL: and flagged); a refusal also marks the row
                                      has_waiters, unless another transaction locks it: then
                                      flagged is false (the executor asks again, then gives up)
    holder    (key,)               -> (owner, fence, expires_at, remaining_ms, data, acquired_at) of the
                                      unexpired lease
    owner     (key,)               -> (owner,) of the unexpired lease
    release   (key, owner)         -> (was_unexpired,) if owner's row was deleted
    renew     (key, owner, ttl)    -> (owner, fence, expires_at, remaining_ms) if renewed
    renew_many (keys, owners, ttls) -> rows (key, owner, fence, expires_at, remaining_ms) of the
                                      leases renewed (PostgreSQL: three arrays; SQLite: one JSON
                                      array of [key, owner, ttl]); a key without a row was refused
    transfer  (key, from, to, ttl, data) -> (owner, fence, expires_at, remaining_ms) if transferred
    sweep     (grace, batch_size)  -> rows removed (PostgreSQL: one row with the count)
    notify_channel ()              -> (channel,) PostgreSQL only: the LISTEN channel of the table
    list_leases (prefix, include_expired, limit, upper)
                                   -> rows (key, owner, fence, expires_at, remaining_ms, data,
                                      acquired_at), by key,
                                      of keys in [prefix, upper) by code point (= starting with prefix)
    list_all  (include_expired, limit) -> the same rows, every key
    break_lease (key, fence)       -> (owner, fence, expires_at, remaining_ms, was_unexpired) of the
                                      row it deleted: whoever held it (fence NULL), or only the
                                      tenure with that fence

``data`` goes in as JSON text or NULL (:func:`sql_lease.contract.encode_data`) and comes out as
text (PostgreSQL: ``data::text`` of a ``json`` column, kept verbatim; SQLite: ``TEXT``), decoded by
:meth:`LeaseStatements.lease_data` for both faces. A new tenure stores the given data; the same
tenure keeps the stored data when given NULL (docs/statements.md, "Lease data").

``acquired_at`` is when the tenure began, by the database's clock (stored as ``expires_at`` is):
set wherever a new fence is drawn, kept wherever the fence is kept; NULL on rows written before
migration 0003 (docs/statements.md, "Tenure start").

``remaining_ms`` is ``expires_at`` minus the database's clock (on PostgreSQL writes read
``clock_timestamp()`` after their locks, so a grant that waited for a lock counts its TTL from when
it took effect: docs/statements.md, "Time after the lock"): waiters pace themselves by it,
never by comparing ``expires_at`` with the client's clock. ``acquire`` returns no row when it was
refused and the holder is not visible to the statement's snapshot; the executor then asks again
(a waiting acquire re-runs, so its refusal flags the row) or reads ``holder``. On PostgreSQL,
releasing, transferring or sweeping a row whose ``has_waiters`` is set sends ``NOTIFY <channel>,
<key>``, so waiters wake at once; rows nobody waits for never notify (NOTIFY serialises commits,
so the plain acquire/release cycle stays free of it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.engine.interfaces import Dialect

from ..contract import AcquireResult, LeaseInfo, decode_data
from .schema import LeaseTableNames

__all__ = [
    "DURABLE_PIN",
    "OWN_CONNECTION_SETUP",
    "LeaseStatements",
    "PostgresStatements",
    "SqliteStatements",
    "qualified_name",
    "statements_for",
]


@dataclass(frozen=True)
class LeaseStatements:
    """The SQL text of every operation for one dialect and table, and the pure functions that
    turn their rows into results (no I/O here: executors run the text, these decode the rows)."""

    acquire: str
    acquire_waiting: str
    holder: str
    owner: str
    release: str
    renew: str
    transfer: str
    sweep: str
    notify_channel: str | None = None
    list_leases: str = ""
    list_all: str = ""
    break_lease: str = ""
    renew_many: str = ""
    acquire_reads_first: bool = False
    """Run ``holder`` before ``acquire`` and refuse on its answer (SQLite: a read is never blocked by
    a caller's transaction holding the write lock, the write would wait for it)."""

    def renew_many_params(self, items: Sequence[tuple[str, str, float]]) -> tuple[Any, ...]:
        """The parameters of ``renew_many`` for ``(key, owner, ttl_ms)`` items (TTLs as milliseconds)."""
        return (
            [key for key, _, _ in items],
            [owner for _, owner, _ in items],
            [float(self.ttl_param(ttl)) for _, _, ttl in items],
        )

    def ttl_param(self, ttl_ms: float) -> Any:
        """The TTL as the statements expect it (milliseconds)."""
        return ttl_ms

    def acquire_params(
        self, key: str, owner: str, ttl: Any, data: str | None, lock_wait_ms: float | None
    ) -> tuple[Any, ...]:
        """The parameters of ``acquire``/``acquire_waiting``; ``lock_wait_ms`` bounds its lock waits
        (PostgreSQL ``lock_timeout``; None: the session's)."""
        return (key, owner, ttl, data)

    def lock_timed_out(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a statement's lock wait running out (nothing was written)."""
        return False

    def to_datetime(self, value: Any) -> datetime:
        """An ``expires_at`` value from the database as an aware UTC datetime."""
        return value  # type: ignore[no-any-return]

    def acquired_at(self, value: Any) -> datetime | None:
        """An ``acquired_at`` value as an aware UTC datetime (None for a row from before migration 0003)."""
        return None if value is None else self.to_datetime(value)

    def acquire_result(self, row: Sequence[Any]) -> AcquireResult:
        """``(acquired, owner, fence, expires_at, remaining_ms)`` from acquire."""
        return AcquireResult(bool(row[0]), row[1], row[2], self.to_datetime(row[3]), float(row[4]))

    def refusal(self, row: Sequence[Any]) -> AcquireResult:
        """A refused acquire naming the holder, from a ``holder`` row."""
        return AcquireResult(False, row[0], row[1], self.to_datetime(row[2]), float(row[3]))

    def lease_info(self, key: str, row: Sequence[Any]) -> LeaseInfo:
        """``(owner, fence, expires_at, remaining_ms)`` from renew and transfer (no data read)."""
        return LeaseInfo(key, row[0], row[1], self.to_datetime(row[2]), float(row[3]))

    def lease_data(self, value: str | None) -> dict[str, Any] | None:
        """The lease data of a row: its JSON text decoded (None for a row without data)."""
        return decode_data(value)

    def held(self, key: str, row: Sequence[Any]) -> LeaseInfo:
        """``(owner, fence, expires_at, remaining_ms, data, acquired_at)`` from holder."""
        expires_at, acquired_at = self.to_datetime(row[2]), self.acquired_at(row[5])
        return LeaseInfo(key, row[0], row[1], expires_at, float(row[3]), self.lease_data(row[4]), acquired_at)

    def swept_count(self, rows: list[Any]) -> int:
        """How many rows ``sweep`` removed, from the rows it returned."""
        return len(rows)

    def listed(self, row: Sequence[Any]) -> LeaseInfo:
        """``(key, owner, fence, expires_at, remaining_ms, data, acquired_at)`` from list_leases and list_all."""
        return self.held(row[0], row[1:])


def qualified_name(dialect: Dialect, names: LeaseTableNames, name: str) -> str:
    """``name`` (a table or sequence of ``names``) quoted for ``dialect``, with its schema if any."""
    quote = dialect.identifier_preparer.quote_identifier
    return f"{quote(names.schema)}.{quote(name)}" if names.schema else quote(name)


DURABLE_PIN = (
    "set_config('synchronous_commit', CASE current_setting('synchronous_commit') "
    "WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, {scope})"
)
"""``synchronous_commit`` raised to ``on`` if it is ``off`` (stronger settings kept): ``{scope}`` is
``true`` for one transaction, ``false`` for the session."""

OWN_CONNECTION_SETUP = ("SET enable_seqscan = off", f"SELECT {DURABLE_PIN.format(scope='false')}")
"""Run once on each PostgreSQL connection a provider makes itself (never on a borrowed one, nor
through PgBouncer): no sequential scans for key lookups (docs/statements.md), and a durable session
(:class:`PostgresStatements` with ``durable_session=True`` then pins nothing per statement)."""


class PostgresStatements(LeaseStatements):
    """PostgreSQL: ``timestamptz`` from ``now()``, fences from a sequence, upsert with a CTE that
    also returns the holder on refusal, so acquire is one round trip either way.

    The reasoning behind each statement is in ``docs/statements.md``; in short:

    - A key held by another owner is refused by a plain read (``busy``), taking no lock.
    - Otherwise the statement takes a transaction-level advisory lock on (the table's OID, key)
      before ``nextval()``, so fences are drawn in the order owners change. The OID, not the
      table's name, so every spelling of one table (schema, search_path) takes the same lock.
    - Acquire, renew and transfer commit with ``synchronous_commit`` at least ``on``: an
      acknowledged one survives a crash whatever the server's default. On the provider's own
      connections the session is pinned once when the connection is made (:data:`OWN_CONNECTION_SETUP`,
      ``durable_session=True``); on borrowed connections and through PgBouncer each statement pins
      its own transaction (``set_config(..., true)``), so no session state is changed.
      Release runs with ``synchronous_commit = off`` in its own transaction (``durable_release=False``,
      the default): a release lost in a crash leaves the lease held until its TTL, as if its holder
      had died. ``durable_release=True`` commits it like the others.
    - ``renew_many`` renews a batch of ``(key, owner, ttl)`` in one statement (``unnest`` of three
      arrays), pinned like renew; a key it returns no row for was refused.
    - Expiry is tested as ``expires_at + interval '0' > now()`` where a key is looked up, so no
      plan ever walks the ``expires_at`` index instead of the primary key.
    """

    def __init__(self, names: LeaseTableNames, *, durable_release: bool = False, durable_session: bool = False) -> None:
        from sqlalchemy.dialects import postgresql

        dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
        t = qualified_name(dialect, names, names.table)
        table_oid = f"'{t}'::regclass::oid"
        seq = qualified_name(dialect, names, names.fence_sequence).replace("'", "''")
        expires = "now() + $3::float8 * interval '1 millisecond'"
        remaining = "(extract(epoch FROM expires_at - now()) * 1000)::float8"
        # After a lock wait (docs/statements.md, "Time after the lock"): the clock when the statement gets there.
        after = "clock_timestamp()"
        remaining_after = f"(extract(epoch FROM expires_at - {after}) * 1000)::float8"
        ttl = "$3::float8 * interval '1 millisecond'"
        live = "expires_at + interval '0' > now()"
        notify = f"pg_notify('sql_lease_' || {table_oid}, key)"
        lock = f"pg_advisory_xact_lock({table_oid}::int4, hashtext($1::varchar))"
        # The durability pin of one transaction, where the session is not pinned (docs/statements.md, "Durability").
        durable = "" if durable_session else DURABLE_PIN.format(scope="true")
        pin = f", {durable}" if durable else ""
        pinned = f"WITH durable AS (SELECT {durable})\n" if durable else ""
        from_pinned = "durable, " if durable else ""
        renew_from = "\n  FROM durable" if durable else ""
        release_commit = durable if durable_release else "set_config('synchronous_commit', 'off', true)"
        release_head = (
            f"WITH commit_mode AS (SELECT {release_commit}), gone AS (\n    DELETE FROM {t} USING commit_mode"
            if release_commit
            else f"WITH gone AS (\n    DELETE FROM {t}"
        )
        busy = f"""busy AS (
    SELECT owner, fence, expires_at, {remaining} AS remaining, has_waiters FROM {t}
     WHERE key = $1 AND {live} AND owner <> $2
)"""
        upsert = f"""
    INSERT INTO {t} AS held (key, owner, fence, expires_at, data, acquired_at)
    SELECT $1, $2, nextval('{seq}'), at + {ttl}, $4::json, at FROM granted
    ON CONFLICT (key) DO UPDATE
       SET owner = excluded.owner,
           expires_at = {after} + {ttl},
           fence = CASE WHEN held.owner = excluded.owner AND held.expires_at > {after}
                        THEN held.fence ELSE excluded.fence END,
           data = CASE WHEN held.owner = excluded.owner AND held.expires_at > {after}
                       THEN coalesce(excluded.data, held.data) ELSE excluded.data END,
           acquired_at = CASE WHEN held.owner = excluded.owner AND held.expires_at > {after}
                              THEN held.acquired_at ELSE {after} END,
           has_waiters = held.has_waiters AND held.owner = excluded.owner
     WHERE held.owner = excluded.owner OR held.expires_at <= {after}
    RETURNING held.owner, held.fence, held.expires_at"""
        # granted: the clock read from serialised's row, i.e. after the advisory lock.
        # bounded: this transaction's lock_timeout ($5, e.g. '2500ms'), set before any lock is waited for.
        acquire_head = f"""
WITH {busy}, bounded AS (
    SELECT set_config('lock_timeout', coalesce($5::text, current_setting('lock_timeout')), true) AS limit_
), serialised AS (
    SELECT {lock}{pin} FROM bounded WHERE NOT EXISTS (SELECT FROM busy)
), granted AS (
    SELECT {after} AS at FROM serialised
), attempt AS ({upsert}
)"""
        super().__init__(
            acquire=f"""{acquire_head}
SELECT true, owner, fence, expires_at, {remaining_after} FROM attempt
UNION ALL
SELECT false, owner, fence, expires_at, remaining FROM busy""",
            # A row some transaction locks (a caller's check_held) is not flagged but refused at once,
            # its last column false (docs/statements.md, "Waiters beside a guarded transaction").
            acquire_waiting=f"""{acquire_head}, flag AS (
    SELECT key FROM {t}
     WHERE key = $1 AND NOT has_waiters AND NOT EXISTS (SELECT FROM attempt)
       FOR NO KEY UPDATE SKIP LOCKED
), waiting AS (
    UPDATE {t} AS l SET has_waiters = true FROM flag
     WHERE l.key = flag.key
    RETURNING l.owner, l.fence, l.expires_at
)
SELECT true, owner, fence, expires_at, {remaining_after}, true FROM attempt
UNION ALL
SELECT false, owner, fence, expires_at, {remaining_after}, true FROM waiting WHERE expires_at > {after} AND owner <> $2
UNION ALL
SELECT false, owner, fence, expires_at, remaining, has_waiters FROM busy WHERE NOT EXISTS (SELECT FROM waiting)""",
            holder=f"""
SELECT owner, fence, expires_at, {remaining}, data::text, acquired_at FROM {t} WHERE key = $1 AND {live}""",
            owner=f"SELECT owner FROM {t} WHERE key = $1 AND {live}",
            release=f"""
{release_head} WHERE key = $1 AND owner = $2
    RETURNING key, expires_at > now() AS was_unexpired, has_waiters
)
SELECT was_unexpired, CASE WHEN has_waiters THEN {notify} END FROM gone""",
            renew=f"""
{pinned}UPDATE {t} SET expires_at = {expires}{renew_from}
 WHERE key = $1 AND owner = $2 AND {live}
RETURNING owner, fence, expires_at, {remaining_after}""",
            renew_many=f"""
{pinned}UPDATE {t} AS l SET expires_at = now() + r.ttl * interval '1 millisecond'
  FROM {from_pinned}unnest($1::varchar[], $2::varchar[], $3::float8[]) AS r(key, owner, ttl)
 WHERE l.key = r.key AND l.owner = r.owner AND l.{live}
RETURNING l.key, l.owner, l.fence, l.expires_at, {remaining_after}""",
            transfer=f"""
WITH serialised AS (SELECT {lock}{pin}), mine AS (
    SELECT l.key, l.has_waiters, l.expires_at FROM {t} AS l, serialised
     WHERE l.key = $1 AND l.owner = $2 AND l.{live}
       FOR UPDATE OF l
), granted AS (
    SELECT key, has_waiters, at FROM (SELECT key, has_waiters, expires_at, {after} AS at FROM mine) AS locked
     WHERE expires_at > at
), moved AS (
    UPDATE {t} AS l
       SET owner = $3::varchar,
           expires_at = granted.at + $4::float8 * interval '1 millisecond',
           fence = CASE WHEN l.owner = $3::varchar THEN l.fence ELSE nextval('{seq}') END,
           data = CASE WHEN l.owner = $3::varchar THEN coalesce($5::json, l.data) ELSE $5::json END,
           acquired_at = CASE WHEN l.owner = $3::varchar THEN l.acquired_at ELSE granted.at END,
           has_waiters = l.has_waiters AND l.owner = $3::varchar
      FROM granted
     WHERE l.key = granted.key
    RETURNING l.key, l.owner, l.fence, l.expires_at, granted.has_waiters AS had_waiters
)
SELECT owner, fence, expires_at, {remaining_after}, CASE WHEN had_waiters AND $2 <> $3 THEN {notify} END
  FROM moved""",
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
            notify_channel=f"SELECT 'sql_lease_' || {table_oid}",
            # Prefixes as a code point range (COLLATE "C": byte order of UTF-8), whatever the
            # database's collation; rows come in the column's own order, so the primary key serves it.
            list_leases=f"""
SELECT key, owner, fence, expires_at, {remaining}, data::text, acquired_at FROM {t}
 WHERE key COLLATE "C" >= $1::varchar AND key COLLATE "C" < $4::varchar
   AND ($2::boolean OR {live})
 ORDER BY key
 LIMIT $3""",
            list_all=f"""
SELECT key, owner, fence, expires_at, {remaining}, data::text, acquired_at FROM {t}
 WHERE $1::boolean OR {live}
 ORDER BY key
 LIMIT $2""",
            # As release, for any owner: no advisory lock (deleting draws no fence) and no durability pin.
            break_lease=f"""
WITH gone AS (
    DELETE FROM {t} WHERE key = $1 AND ($2::bigint IS NULL OR fence = $2::bigint)
    RETURNING key, owner, fence, expires_at, has_waiters
)
SELECT owner, fence, expires_at, {remaining}, expires_at > now(),
       CASE WHEN has_waiters THEN {notify} END FROM gone""",
        )

    def swept_count(self, rows: list[Any]) -> int:
        return int(rows[0][0])

    def acquire_params(
        self, key: str, owner: str, ttl: Any, data: str | None, lock_wait_ms: float | None
    ) -> tuple[Any, ...]:
        wait = None if lock_wait_ms is None else f"{max(1, math.ceil(lock_wait_ms))}ms"
        return (key, owner, ttl, data, wait)

    def lock_timed_out(self, exc: BaseException) -> bool:
        from .translate import sqlstate

        return sqlstate(exc) == "55P03"  # lock_not_available


# SQLite's own clock as integer Unix epoch milliseconds. 'now' is stable within one statement.
# (SQLite 3.40 has no unixepoch('subsec'); julianday keeps sub-millisecond precision.)
SQLITE_NOW_MS = "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"


class SqliteStatements(LeaseStatements):
    """SQLite: integer epoch milliseconds from SQLite's clock, fences from a one-row counter table
    advanced by triggers. Each statement runs as its own write transaction."""

    def __init__(self, names: LeaseTableNames) -> None:
        from sqlalchemy.dialects import sqlite

        dialect = sqlite.dialect()  # type: ignore[no-untyped-call]
        t = qualified_name(dialect, names, names.table)
        counter = qualified_name(dialect, names, names.fence_counter)
        now = SQLITE_NOW_MS
        next_fence = f"(SELECT last_fence + 1 FROM {counter})"
        acquire = f"""
INSERT INTO {t} AS held (key, owner, fence, expires_at, data, acquired_at)
VALUES (?1, ?2, {next_fence}, {now} + ?3, ?4, {now})
ON CONFLICT (key) DO UPDATE
   SET owner = excluded.owner,
       expires_at = excluded.expires_at,
       fence = CASE WHEN held.owner = excluded.owner AND held.expires_at > {now}
                    THEN held.fence ELSE excluded.fence END,
       data = CASE WHEN held.owner = excluded.owner AND held.expires_at > {now}
                   THEN coalesce(excluded.data, held.data) ELSE excluded.data END,
       acquired_at = CASE WHEN held.owner = excluded.owner AND held.expires_at > {now}
                          THEN held.acquired_at ELSE excluded.acquired_at END
 WHERE held.owner = excluded.owner OR held.expires_at <= {now}
RETURNING 1, owner, fence, expires_at, expires_at - {now}"""
        super().__init__(
            acquire=acquire,
            acquire_waiting=acquire,  # no NOTIFY on SQLite: waiters poll
            acquire_reads_first=True,
            holder=f"""
SELECT owner, fence, expires_at, expires_at - {now}, data, acquired_at FROM {t}
 WHERE key = ?1 AND expires_at > {now}""",
            owner=f"SELECT owner FROM {t} WHERE key = ?1 AND expires_at > {now}",
            release=f"DELETE FROM {t} WHERE key = ?1 AND owner = ?2 RETURNING expires_at > {now}",
            renew=f"""
UPDATE {t} SET expires_at = {now} + ?3
 WHERE key = ?1 AND owner = ?2 AND expires_at > {now}
RETURNING owner, fence, expires_at, expires_at - {now}""",
            renew_many=f"""
UPDATE {t} SET expires_at = {now} + r.ttl
  FROM (SELECT value ->> 0 AS k, value ->> 1 AS o, value ->> 2 AS ttl FROM json_each(?1)) AS r
 WHERE key = r.k AND owner = r.o AND expires_at > {now}
RETURNING key, owner, fence, expires_at, expires_at - {now}""",
            transfer=f"""
UPDATE {t}
   SET owner = ?3,
       expires_at = {now} + ?4,
       fence = CASE WHEN owner = ?3 THEN fence ELSE {next_fence} END,
       data = CASE WHEN owner = ?3 THEN coalesce(?5, data) ELSE ?5 END,
       acquired_at = CASE WHEN owner = ?3 THEN acquired_at ELSE {now} END
 WHERE key = ?1 AND owner = ?2 AND expires_at > {now}
RETURNING owner, fence, expires_at, expires_at - {now}""",
            sweep=f"""
DELETE FROM {t} WHERE key IN (
    SELECT key FROM {t} WHERE expires_at <= {now} - ?1 ORDER BY expires_at LIMIT ?2
) RETURNING 1""",
            # BINARY collation: [prefix, upper) is exactly the keys starting with prefix, on the index.
            list_leases=f"""
SELECT key, owner, fence, expires_at, expires_at - {now}, data, acquired_at FROM {t}
 WHERE key >= ?1 AND key < ?4 AND (?2 OR expires_at > {now})
 ORDER BY key
 LIMIT ?3""",
            list_all=f"""
SELECT key, owner, fence, expires_at, expires_at - {now}, data, acquired_at FROM {t}
 WHERE ?1 OR expires_at > {now}
 ORDER BY key
 LIMIT ?2""",
            break_lease=f"""
DELETE FROM {t} WHERE key = ?1 AND (?2 IS NULL OR fence = ?2)
RETURNING owner, fence, expires_at, expires_at - {now}, expires_at > {now}""",
        )

    def ttl_param(self, ttl_ms: float) -> int:
        return math.ceil(ttl_ms)

    def renew_many_params(self, items: Sequence[tuple[str, str, float]]) -> tuple[Any, ...]:
        return (json.dumps([[key, owner, self.ttl_param(ttl)] for key, owner, ttl in items]),)

    def to_datetime(self, value: Any) -> datetime:
        return datetime.fromtimestamp(value / 1000.0, tz=UTC)


def statements_for(
    dialect_name: str, names: LeaseTableNames, *, durable_release: bool = False, durable_session: bool = False
) -> LeaseStatements:
    """The statements of ``dialect_name``; ``ValueError`` for a database sql_lease does not support.
    ``durable_release``: PostgreSQL releases wait for the WAL flush as the other writes do (SQLite's
    releases always follow its ``synchronous`` setting). ``durable_session``: the statements run on
    connections set up with :data:`OWN_CONNECTION_SETUP`, so they need no durability pin of their own."""
    if dialect_name == "postgresql":
        return PostgresStatements(names, durable_release=durable_release, durable_session=durable_session)
    if dialect_name == "sqlite":
        return SqliteStatements(names)
    raise ValueError(f"sql_lease supports postgresql and sqlite, not {dialect_name!r}")
