"""The lease statements of one dialect and table, and the pure functions that decode their rows.

The SQL itself is in :mod:`sql_lease.sql.dialects` (``postgresql.py``, ``sqlite.py``), each
statement written out whole under a comment naming its parameters; this module fills in the table
names once per provider (:func:`statements_for`) and turns rows into results. No I/O here.

Every operation is one statement that checks and acts, run on its own (autocommit, never inside a
caller's transaction); time comes from the database's clock. Parameters are positional, in the
same order for both dialects (PostgreSQL's acquire takes a fifth, its transaction's
``lock_timeout``; ``renew_many`` takes three arrays on PostgreSQL, one JSON array on SQLite).

Keys go in and come out in their stored form (:func:`sql_lease.contract.encode_key`, applied by
the plans): the decoding functions below take a stored key and give the key back as it was given.

``data`` goes in as JSON text or NULL (:func:`sql_lease.contract.encode_data`) and comes out as
text, decoded by :meth:`LeaseStatements.lease_data` for both faces. ``remaining_ms`` is
``expires_at`` minus the database's clock: waiters pace themselves by it, never by comparing
``expires_at`` with the client's clock. ``acquire`` returns no row when it was refused and the
holder is not visible to the statement's snapshot; the plan then asks again or reads ``holder``
(docs/statements.md).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.engine.interfaces import Dialect

from ..contract import AcquireResult, LeaseInfo, RenewItem, decode_data, decode_key
from .dialects import dialect_module
from .dialects import mysql as mysql_texts
from .dialects import postgresql as postgresql_texts
from .dialects import sqlite as sqlite_texts
from .hints import SemaphoreKeys
from .schema import LeaseTableNames

__all__ = [
    "OWN_CONNECTION_SETUP",
    "SQLITE_NOW_MS",
    "LeaseStatements",
    "MysqlStatements",
    "PostgresStatements",
    "SqliteStatements",
    "filled_slot_texts",
    "filled_texts",
    "placeholder_values",
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
    release_keeping: str = ""
    acquire_reads_first: bool = False
    """Run ``holder`` before ``acquire`` and refuse on its answer (SQLite: a read is never blocked by
    a caller's transaction holding the write lock, the write would wait for it)."""
    transactional: bool = False
    """Operations are short transactions (:mod:`.transactional`; MySQL), their statements in ``steps``."""
    steps: dict[str, str] = field(default_factory=dict)
    lock_wait_ms: float | None = None
    """MySQL: the lock wait timeout of the provider's own sessions (None on an application's engine,
    whose setting is unknown: a takeover then does not wait for a locked row)."""
    packed: bool = False
    """MySQL on a provider's own connections (multi-statement packets): an acquire is one packet
    (``steps["acquire_packet"]``) instead of a statement per step."""
    slots: dict[str, Any] = field(default_factory=dict)
    """The statements of semaphores by name (``slot_steps()`` of the dialect module; None where the
    dialect has no such step), run by :func:`.transactional.slot_acquire` and its siblings."""
    release_covers_slots: bool = False
    """``release`` releases the owner's slot of a semaphore's key itself (PostgreSQL: by migration
    0006's function, in the same statement): no slot transaction after it."""
    acquire_keys: str = ""
    holders: str = ""
    release_keys: str = ""
    acquire_tries_quick: bool = False
    """Try ``acquire`` first as a quick query, then read ``holder`` if it met a lock (SQLite on a
    provider's own connections, whose lock waits the executor bounds: one statement when nothing
    contends)."""
    semaphore_keys: SemaphoreKeys = field(default_factory=SemaphoreKeys, compare=False, repr=False)
    """The keys this provider last saw held as semaphores: a hint for the order of a release's statements
    (:mod:`.hints`); one per provider, since each makes its own statements."""

    def renew_many_params(self, items: Sequence[RenewItem]) -> tuple[Any, ...]:
        """The parameters of ``renew_many`` for ``(key, owner, ttl_ms, fence | None)`` items (TTLs as
        milliseconds)."""
        return (
            [item[0] for item in items],
            [item[1] for item in items],
            [float(self.ttl_param(item[2])) for item in items],
            [item[3] for item in items],
        )

    def json_renew_items(self, items: Sequence[RenewItem]) -> tuple[Any, ...]:
        """``renew_many``'s one parameter where it is a JSON array: ``[key, owner, ttl]``, or
        ``[key, owner, ttl, fence]`` for an item with a fence (SQLite, MySQL)."""
        return (
            json.dumps(
                [
                    [key, owner, self.ttl_param(ttl)] if fence is None else [key, owner, self.ttl_param(ttl), fence]
                    for key, owner, ttl, fence in items
                ]
            ),
        )

    def keys_param(self, keys: Sequence[str] | Sequence[int]) -> Any:
        """The stored keys of an all-or-nothing call (or their fences, in the same order) as its
        statements take them (a ``varchar[]`` or ``bigint[]``; SQLite, MySQL: a JSON array)."""
        return json.dumps(list(keys))

    def refused_all(self, exc: BaseException) -> bool:
        """Whether ``exc`` is ``acquire_keys`` undoing itself because a key was refused (PostgreSQL)."""
        return False

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

    def conflicted(self, exc: BaseException) -> bool:
        """Whether ``exc`` ended a transaction that may simply run again (a deadlock, a duplicate key)."""
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
        """``(owner, fence, expires_at, remaining_ms)`` from renew and transfer (no data read) of the
        lease on the stored ``key``."""
        return LeaseInfo(decode_key(key), row[0], row[1], self.to_datetime(row[2]), float(row[3]))

    def lease_data(self, value: str | None) -> dict[str, Any] | None:
        """The lease data of a row: its JSON text decoded (None for a row without data)."""
        return decode_data(value)

    def held(self, key: str, row: Sequence[Any]) -> LeaseInfo:
        """``(owner, fence, expires_at, remaining_ms, data, acquired_at, released)`` from holder, of
        the lease on the stored ``key``."""
        expires_at, acquired_at = self.to_datetime(row[2]), self.acquired_at(row[5])
        data = self.lease_data(row[4])
        return LeaseInfo(decode_key(key), row[0], row[1], expires_at, float(row[3]), data, acquired_at, bool(row[6]))

    @staticmethod
    def refuses(holder: Sequence[Any] | None, owner: str) -> bool:
        """Whether the ``holder`` row (None: no unexpired lease) refuses ``owner``'s acquire: another
        owner's lease, or ``owner``'s own released one, kept for its minimum hold."""
        return holder is not None and (holder[0] != owner or bool(holder[6]))

    def keys_results(self, keys: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[AcquireResult] | None:
        """The results of an all-or-nothing acquire of the stored ``keys`` (in their order) from
        ``acquire_keys`` rows ``(stored key, acquired, owner, fence, expires_at, remaining_ms)`` when
        every key was granted; else None (the plan reads the holders)."""
        found = {row[0]: self.acquire_result(row[1:]) for row in rows}
        if len(found) < len(keys) or not all(found.values()):
            return None
        return [found[key] for key in keys]

    def keys_refusals(
        self, keys: Sequence[str], owner: str, holders: Sequence[Sequence[Any]]
    ) -> list[AcquireResult] | None:
        """The refusals of an all-or-nothing acquire of the stored ``keys`` by ``owner`` from ``holders``
        rows ``(stored key, *holder row)``: each key held by another (or released and kept) names its
        holder, the others ``AcquireResult(False, None)``; None if no key refuses ``owner``."""
        refusing = {row[0]: self.refusal(row[1:]) for row in holders if self.refuses(row[1:], owner)}
        if not refusing:
            return None
        return [refusing.get(key, AcquireResult(False, None)) for key in keys]

    def swept_count(self, rows: list[Any]) -> int:
        """How many leases ``sweep`` removed, from the rows it returned (a falsy row: a semaphore's head)."""
        return sum(1 for row in rows if row[0])

    def listed(self, row: Sequence[Any]) -> LeaseInfo:
        """``(key, owner, fence, expires_at, remaining_ms, data, acquired_at, released)`` from list_leases and
        list_all."""
        return self.held(row[0], row[1:])


_LEASE_FIELDS = (
    "acquire",
    "acquire_waiting",
    "holder",
    "owner",
    "release",
    "renew",
    "transfer",
    "sweep",
    "notify_channel",
    "list_leases",
    "list_all",
    "break_lease",
    "renew_many",
    "release_keeping",
    "acquire_keys",
    "holders",
    "release_keys",
)


def qualified_name(dialect: Dialect, names: LeaseTableNames, name: str) -> str:
    """``name`` (a table or sequence of ``names``) quoted for ``dialect``, with its schema if any."""
    quote = dialect.identifier_preparer.quote_identifier
    return f"{quote(names.schema)}.{quote(name)}" if names.schema else quote(name)


def _sql_literal(text: str) -> str:
    """``text`` as a SQL string literal (quotes doubled)."""
    return "'" + text.replace("'", "''") + "'"


def placeholder_values(dialect_name: str, names: LeaseTableNames) -> dict[str, str]:
    """The value of each placeholder of ``dialect_name``'s statements (its module's ``PLACEHOLDERS``)
    for the tables of ``names``: identifiers quoted by SQLAlchemy's dialect, literals escaped."""
    module = dialect_module(dialect_name)
    if dialect_name == "postgresql":
        from sqlalchemy.dialects import postgresql as sa_dialect
    elif dialect_name == "mysql":
        from sqlalchemy.dialects import mysql as sa_dialect  # type: ignore[no-redef]
    else:
        from sqlalchemy.dialects import sqlite as sa_dialect  # type: ignore[no-redef]
    dialect = sa_dialect.dialect()  # type: ignore[no-untyped-call]
    table = qualified_name(dialect, names, names.table)
    values = {
        "table": table,
        "table_literal": _sql_literal(table),
        "fence_sequence_literal": _sql_literal(qualified_name(dialect, names, names.fence_sequence)),
        "fence_counter": qualified_name(dialect, names, names.fence_counter),
        "fence_table": qualified_name(dialect, names, names.fence_table),
        "slot_table": qualified_name(dialect, names, names.slot_table),
        "slot_acquire_function": qualified_name(dialect, names, names.slot_acquire_function),
        "slot_release_function": qualified_name(dialect, names, names.slot_release_function),
        "slot_live_index": dialect.identifier_preparer.quote(names.slot_live_index),
    }
    return {name: values[name] for name in module.PLACEHOLDERS}


def filled_texts(
    dialect_name: str, names: LeaseTableNames, *, durable_session: bool = False, durable_release: bool = False
) -> dict[str, str | None]:
    """Every statement of ``dialect_name`` by name (:data:`~sql_lease.sql.dialects.STATEMENT_NAMES`),
    in the given variant, with the table names of ``names`` filled in: the exact texts sent."""
    values = placeholder_values(dialect_name, names)
    texts = dialect_module(dialect_name).texts(durable_session=durable_session, durable_release=durable_release)
    return {name: None if text is None else text.format_map(values) for name, text in texts.items()}


def filled_slot_texts(
    dialect_name: str, names: LeaseTableNames, *, durable_session: bool = False, durable_release: bool = False
) -> dict[str, str | None]:
    """The statements of semaphores of ``dialect_name`` by name, the table names of ``names`` filled in."""
    values = placeholder_values(dialect_name, names)
    texts = dialect_module(dialect_name).slot_steps(durable_session=durable_session, durable_release=durable_release)
    return {name: None if text is None else text.format_map(values) for name, text in texts.items()}


def _lease_texts(texts: dict[str, str | None]) -> dict[str, Any]:
    """The lease statements of ``texts`` as :class:`LeaseStatements` fields."""
    return {name: texts[name] for name in _LEASE_FIELDS}


SQLITE_NOW_MS = sqlite_texts.NOW_MS
"""SQLite's clock as integer epoch milliseconds, as the statements write it (for scripts)."""

OWN_CONNECTION_SETUP = postgresql_texts.SESSION_SETUP
"""Run once on each PostgreSQL connection a provider makes itself (never on a borrowed one, nor
through PgBouncer): no sequential scans for key lookups (docs/statements.md), and a durable session
(:class:`PostgresStatements` with ``durable_session=True`` then pins nothing per statement)."""


ACQUIRE_KEYS_REFUSED = "sql_lease: all-or-nothing acquire refused"
"""The text of the deliberate error (a failed cast, SQLSTATE 22P02) PostgreSQL's ``acquire_keys`` raises to
undo itself when its recheck refused a key (docs/statements.md, "All-or-nothing acquire")."""


class PostgresStatements(LeaseStatements):
    """PostgreSQL: the texts of :mod:`sql_lease.sql.dialects.postgresql` for one table and variant
    (``durable_release``: releases commit durably; ``durable_session``: the connections ran
    :data:`OWN_CONNECTION_SETUP`, so no statement pins its own durability). Timestamps are
    ``timestamptz`` from the database's clock, fences come from a sequence."""

    def __init__(self, names: LeaseTableNames, *, durable_release: bool = False, durable_session: bool = False) -> None:
        texts = filled_texts("postgresql", names, durable_session=durable_session, durable_release=durable_release)
        slots = filled_slot_texts("postgresql", names, durable_session=durable_session, durable_release=durable_release)
        super().__init__(**_lease_texts(texts), slots=slots, release_covers_slots=True)

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

    def conflicted(self, exc: BaseException) -> bool:
        from .translate import sqlstate

        return sqlstate(exc) in ("40P01", "40001")  # deadlock, serialization failure: nothing was written

    def keys_param(self, keys: Sequence[str] | Sequence[int]) -> Any:
        return list(keys)

    def refused_all(self, exc: BaseException) -> bool:
        from .translate import sqlstate

        return sqlstate(exc) == "22P02" and ACQUIRE_KEYS_REFUSED in str(exc)


class SqliteStatements(LeaseStatements):
    """SQLite: the texts of :mod:`sql_lease.sql.dialects.sqlite` for one table. Integer epoch
    milliseconds from SQLite's clock, fences from a one-row counter table advanced by triggers;
    each statement runs as its own write transaction."""

    def __init__(self, names: LeaseTableNames, *, quick_first: bool = False) -> None:
        super().__init__(
            **_lease_texts(filled_texts("sqlite", names)),
            slots=filled_slot_texts("sqlite", names),
            acquire_reads_first=not quick_first,
            acquire_tries_quick=quick_first,
        )

    def ttl_param(self, ttl_ms: float) -> int:
        return math.ceil(ttl_ms)

    def lock_timed_out(self, exc: BaseException) -> bool:
        from .translate import sqlite_busy

        return sqlite_busy(exc)  # past the busy timeout: the statement's own transaction wrote nothing

    def renew_many_params(self, items: Sequence[RenewItem]) -> tuple[Any, ...]:
        return self.json_renew_items(items)

    def to_datetime(self, value: Any) -> datetime:
        return datetime.fromtimestamp(value / 1000.0, tz=UTC)


MYSQL_SESSION_SETUP = mysql_texts.SESSION_SETUP
"""Run once on each MySQL connection a provider makes itself: READ COMMITTED (docs/statements.md)."""

_MYSQL_LOCK_ERRORS = (1205, 3572)  # lock wait timeout (also MariaDB's NOWAIT), MySQL's NOWAIT
_MYSQL_CONFLICTS = (1213, 1062)  # deadlock (rolled back), duplicate key


class MysqlStatements(LeaseStatements):
    """MySQL 8 and MariaDB: the texts of :mod:`sql_lease.sql.dialects.mysql` for one table, run as
    the transactions of :mod:`.transactional`. ``DATETIME(6)`` in UTC from ``UTC_TIMESTAMP(6)``, TTLs
    in integer microseconds, fences from a one-row counter."""

    def __init__(self, names: LeaseTableNames, *, lock_wait_s: int | None = None, packed: bool = False) -> None:
        values = placeholder_values("mysql", names)
        steps = {name: text.format_map(values) for name, text in mysql_texts.steps().items()}
        super().__init__(
            **_lease_texts(filled_texts("mysql", names)),
            slots=filled_slot_texts("mysql", names),
            transactional=True,
            steps=steps,
            lock_wait_ms=None if lock_wait_s is None else lock_wait_s * 1000,
            packed=packed,
        )

    def ttl_param(self, ttl_ms: float) -> int:
        return math.ceil(ttl_ms * 1000)

    def swept_count(self, rows: list[Any]) -> int:
        return int(rows[0][0]) if rows else 0  # a DELETE answers its row count

    def renew_many_params(self, items: Sequence[RenewItem]) -> tuple[Any, ...]:
        return self.json_renew_items(items)

    def to_datetime(self, value: Any) -> datetime:
        return datetime.combine(value, value.time(), UTC)  # replace(tzinfo=UTC) costs five times as much

    def lock_timed_out(self, exc: BaseException) -> bool:
        from .translate import mysql_errno

        return mysql_errno(exc) in _MYSQL_LOCK_ERRORS

    def conflicted(self, exc: BaseException) -> bool:
        from .translate import mysql_errno

        return mysql_errno(exc) in _MYSQL_CONFLICTS


def statements_for(
    dialect_name: str,
    names: LeaseTableNames,
    *,
    durable_release: bool = False,
    durable_session: bool = False,
    sqlite_quick_first: bool = False,
    mysql_lock_wait_s: int | None = None,
    mysql_packed: bool = False,
) -> LeaseStatements:
    """The statements of ``dialect_name``; ``ValueError`` for a database sql_lease does not support.
    ``durable_release``: PostgreSQL releases wait for the WAL flush as the other writes do (SQLite's
    releases always follow its ``synchronous`` setting). ``durable_session``: the statements run on
    connections set up with :data:`OWN_CONNECTION_SETUP`, so they need no durability pin of their own.
    ``sqlite_quick_first``: the statements run on a provider's own SQLite connections, whose lock
    waits the executor bounds (:class:`.retry.SqliteLockWait`). ``mysql_lock_wait_s``: the lock wait
    timeout the provider's own MySQL sessions were given (:func:`.setup.mysql_session_setup`);
    ``mysql_packed``: they take multi-statement packets (one round trip per acquire)."""
    if dialect_name == "postgresql":
        return PostgresStatements(names, durable_release=durable_release, durable_session=durable_session)
    if dialect_name == "sqlite":
        return SqliteStatements(names, quick_first=sqlite_quick_first)
    if dialect_name in ("mysql", "mariadb"):
        return MysqlStatements(names, lock_wait_s=mysql_lock_wait_s, packed=mysql_packed)
    raise ValueError(f"sql_lease supports postgresql, sqlite and mysql, not {dialect_name!r}")
