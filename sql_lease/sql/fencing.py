"""Fenced writes: ``check_held`` and ``accept_fence`` on the caller's connection, and the pure helpers.

Their SQL is in :mod:`sql_lease.sql.dialects` (``CHECK_HELD``, ``ACCEPT_FENCE``, ``ACCEPTED`` of
``postgresql.py``, ``sqlite.py`` and ``mysql.py``), beside the lease statements.

Both statements run on the *caller's* connection, inside the caller's transaction (unlike every
lease statement, which runs in autocommit on the provider's own connections). Parameters are
named, for SQLAlchemy ``text()``:

    check_held    (:key, :owner, :fence)  -> (fence,) iff owner holds key with that fence, unexpired
    accept_fence  (:resource, :fence)     -> (fence,) iff fence >= the highest one accepted so far
    accepted      (:resource,)            -> (fence,) the highest fence accepted (for the error)

``check_held`` makes the rest of the caller's transaction safe:

- PostgreSQL: ``SELECT ... FOR SHARE`` locks the lease row until the transaction ends. Every
  statement that changes the row (acquire's upsert and renew take ``FOR NO KEY UPDATE``, release
  and transfer ``FOR UPDATE``) waits for it; the sweeper skips it (``SKIP LOCKED``). ``FOR KEY
  SHARE`` would be lighter but does not block updates of non-key columns, i.e. a change of owner.
  Expiry is tested against ``statement_timestamp()``, not ``now()``, which is the start of the
  caller's transaction.
- MySQL/MariaDB: ``SELECT ... LOCK IN SHARE MODE`` locks the row until the transaction ends; every
  statement that changes it (the lock of an acquire, renew, release, transfer) waits for it.
  ``accept_fence`` is an ``INSERT ... ON DUPLICATE KEY UPDATE`` that raises the fence to the given
  one if larger (no ``RETURNING``): ``accepted`` reads it back in the same transaction.
- SQLite: a no-op ``UPDATE ... SET owner = owner ... RETURNING`` instead of a ``SELECT``: it takes
  the database's write lock (and makes pysqlite open its transaction, which it does only before
  DML), so no other writer (renew, transfer, takeover) runs until the caller's transaction ends.
  The fence triggers fire on ``UPDATE OF fence`` only, so the counter is untouched.

``accept_fence`` is one upsert whose ``WHERE`` refuses a smaller fence; the row lock it takes (or
SQLite's write lock) serialises concurrent writers of one resource until their transactions end, so
the recorded fence never goes down. An equal fence is accepted (the same holder's next write).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..contract import MAX_FENCE, validate_fence, validate_owner
from ..errors import LeaseConfigError, LeaseLostError, StaleFenceError
from .operations import stored_key
from .schema import LeaseTableNames
from .statements import filled_slot_texts, filled_texts

__all__ = [
    "MAX_FENCE",
    "MAX_RESOURCE_LENGTH",
    "FenceStatements",
    "UnguardedCheckError",
    "accept_fence_result",
    "check_held_result",
    "connection_dialect",
    "fence_statements_for",
    "format_paramstyle_statement",
    "validate_fence",
    "validate_resource",
]

MAX_RESOURCE_LENGTH = 512


@dataclass(frozen=True)
class FenceStatements:
    """The SQL text of the fenced-write statements for one dialect and lease table."""

    check_held: str
    accept_fence: str
    accepted: str
    check_slot: str = ""
    """``check_held`` of a semaphore's slot holder (run when ``check_held`` found no plain lease)."""


@lru_cache(maxsize=64)
def fence_statements_for(dialect_name: str, names: LeaseTableNames) -> FenceStatements:
    """The fenced-write statements of ``names`` for ``"postgresql"`` or ``"sqlite"`` (their texts:
    ``CHECK_HELD``, ``ACCEPT_FENCE``, ``ACCEPTED`` of :mod:`sql_lease.sql.dialects`)."""
    texts = filled_texts(dialect_name, names)
    slot = filled_slot_texts(dialect_name, names)["check_slot"]
    return FenceStatements(
        **{name: str(texts[name]) for name in ("check_held", "accept_fence", "accepted")}, check_slot=str(slot)
    )


@lru_cache(maxsize=64)
def _format_paramstyle(dialect_name: str, sql: str) -> tuple[str, tuple[str, ...]]:
    from sqlalchemy import text
    from sqlalchemy.dialects import mysql, postgresql, sqlite

    module = {"postgresql": postgresql, "mysql": mysql, "mariadb": mysql}.get(dialect_name, sqlite)
    compiled = text(sql).compile(dialect=module.dialect(paramstyle="format"))  # type: ignore[no-untyped-call]
    return compiled.string, tuple(compiled.positiontup or ())


def format_paramstyle_statement(
    dialect_name: str, names: LeaseTableNames, statement: str, params: dict[str, Any]
) -> tuple[str, list[Any]]:
    """One fenced-write statement (``"check_held"``, ``"accept_fence"`` or ``"accepted"``) of
    ``names`` for ``"postgresql"`` or ``"sqlite"``, in DB-API ``format`` paramstyle (``%s``, a
    literal ``%`` doubled), as Django's cursors take it: the SQL text and the values of ``params``
    in placeholder order. SQLAlchemy's compiler does the conversion; values are never put in the
    text."""
    if statement not in ("check_held", "accept_fence", "accepted"):
        raise ValueError(f"no fenced-write statement {statement!r}")
    sql, order = _format_paramstyle(dialect_name, getattr(fence_statements_for(dialect_name, names), statement))
    return sql, [params[name] for name in order]


def validate_resource(resource: object) -> str:
    """``resource`` if it is a non-empty ``str`` without NUL of at most 512 characters."""
    if not isinstance(resource, str):
        raise TypeError(f"resource must be a str, not {type(resource).__name__}")
    if not resource or "\x00" in resource or len(resource) > MAX_RESOURCE_LENGTH:
        raise ValueError(f"resource must be 1 to {MAX_RESOURCE_LENGTH} characters without NUL, not {resource[:40]!r}")
    return resource


def validate_check(key: object, owner: object, fence: object) -> dict[str, Any]:
    """The bind parameters of ``check_held``, validated (before any SQL)."""
    return {"key": stored_key(key), "owner": validate_owner(owner), "fence": validate_fence(fence)}


def connection_dialect(conn: object) -> str:
    """The dialect name of a SQLAlchemy ``Connection``/``Session`` (sync or async)."""
    dialect = getattr(conn, "dialect", None)
    if dialect is None and callable(getattr(conn, "get_bind", None)):
        dialect = conn.get_bind().dialect  # type: ignore[attr-defined]
    name = getattr(dialect, "name", None)
    if not isinstance(name, str) or not callable(getattr(conn, "execute", None)):
        raise TypeError(
            "conn must be a SQLAlchemy Connection or Session (AsyncConnection or AsyncSession for the async "
            f"provider), not {type(conn).__name__}"
        )
    return name


def check_held_result(key: str, owner: str, fence: int, row: Sequence[Any] | None) -> None:
    """Raise ``LeaseLostError`` unless ``check_held`` returned a row."""
    if row is None:
        raise LeaseLostError(
            key, owner, f"the lease is not held with fence {fence} (expired, released or taken over); do not commit"
        )


def accept_fence_result(resource: str, fence: int, row: Sequence[Any] | None, accepted: int | None) -> int:
    """The accepted fence, or ``StaleFenceError`` naming the larger one already accepted. ``row``:
    what ``accept_fence`` returned; ``accepted``: the fence ``accepted`` read when it returned none
    (on MySQL, whose upsert returns no row, the fence is accepted when that read gives it back)."""
    if row is None and accepted != fence:
        raise StaleFenceError(resource, fence, accepted)
    return fence if row is None else int(row[0])


# -- is there a transaction for the lock to last in? ----------------------------------------------


class UnguardedCheckError(LeaseConfigError):
    """``check_held`` ran where its lock cannot outlast the statement, so it would guard none of
    the caller's writes: a connection in autocommit (no transaction open after the check), or, on
    SQLite, a SAVEPOINT (``begin_nested()``) that may be the outermost transaction, whose release
    commits and drops the lock. The message names the connection's setting. A configuration error:
    fix the code (run the check in a transaction), retrying cannot help."""


def _transaction_open(driver: Any) -> bool | None:
    """Whether the driver connection ``driver`` has a transaction open now; None if it cannot tell."""
    in_transaction = getattr(driver, "in_transaction", None)  # sqlite3, aiosqlite
    if isinstance(in_transaction, bool):
        return in_transaction
    is_in_transaction = getattr(driver, "is_in_transaction", None)  # asyncpg
    if callable(is_in_transaction):
        return bool(is_in_transaction())
    info = getattr(driver, "info", None)  # psycopg 3 (sync and async): pq.TransactionStatus
    status = getattr(info, "transaction_status", None)
    if status is not None:
        return int(status) != 0  # IDLE: no transaction
    get_status = getattr(driver, "get_transaction_status", None)  # psycopg2
    if callable(get_status):
        return int(get_status()) != 0
    get_autocommit = getattr(driver, "get_autocommit", None)  # PyMySQL, asyncmy, mysqlclient
    if callable(get_autocommit):
        if not get_autocommit():
            return True  # every statement runs in a transaction until COMMIT
        server_status = getattr(driver, "server_status", 0)  # flags of the last OK packet (after BEGIN)
        return isinstance(server_status, int) and bool(server_status & _MYSQL_SERVER_STATUS_IN_TRANS)
    return None


_MYSQL_SERVER_STATUS_IN_TRANS = 1


def _setting(driver: Any, options: dict[str, Any] | None) -> str:
    """The connection's transaction setting, for the message."""
    parts = []
    level = (options or {}).get("isolation_level")
    if level is not None:
        parts.append(f"isolation_level={level!r} (SQLAlchemy)")
    for name in ("autocommit", "isolation_level"):
        value = getattr(driver, name, None)
        if isinstance(value, (bool, str)) or (name == "isolation_level" and value is None and hasattr(driver, name)):
            parts.append(f"{name}={value!r} ({type(driver).__module__.split('.')[0]})")
    return ", ".join(parts) or "no transaction open"


def check_guarded(dialect_name: str, driver: Any, nested: bool, options: dict[str, Any] | None = None) -> None:
    """Raise :class:`UnguardedCheckError` unless ``check_held``'s lock lasts until the caller's
    transaction ends: ``driver`` (the DBAPI driver connection, asked right after the check) must
    have a transaction open, and on SQLite the check must not run inside a SAVEPOINT (``nested``):
    a SAVEPOINT outside ``BEGIN`` starts the transaction, and releasing it commits."""
    if _transaction_open(driver) is False:
        raise UnguardedCheckError(
            f"check_held ran on a connection in autocommit ({_setting(driver, options)}): its lock ended with "
            "the statement and guards none of your writes; run it inside a transaction (engine.begin(), "
            "session.begin()) on a connection that is not AUTOCOMMIT"
        )
    if nested and dialect_name == "sqlite":
        raise UnguardedCheckError(
            "check_held ran inside a SAVEPOINT (begin_nested()) on SQLite: releasing a savepoint that opened "
            "the transaction commits it and drops the lock, so the writes after it are not guarded; call "
            "check_held in the outer transaction"
        )


def _options(conn: Any) -> dict[str, Any] | None:
    get = getattr(conn, "get_execution_options", None)
    options = get() if callable(get) else None
    return dict(options) if options else None


def _guard_sync(conn: Any, dialect_name: str) -> None:
    """``check_guarded`` for a sync ``Connection`` or ``Session`` (after the check ran on it)."""
    from sqlalchemy.orm import Session

    connection = conn.connection() if isinstance(conn, Session) else conn
    driver = connection.connection.driver_connection
    check_guarded(dialect_name, driver, bool(conn.in_nested_transaction()), _options(connection))


async def _guard_async(conn: Any, dialect_name: str) -> None:
    """``check_guarded`` for an ``AsyncConnection`` or ``AsyncSession`` (after the check ran on it)."""
    from sqlalchemy.ext.asyncio import AsyncSession

    connection = await conn.connection() if isinstance(conn, AsyncSession) else conn
    driver = (await connection.get_raw_connection()).driver_connection
    check_guarded(dialect_name, driver, bool(conn.in_nested_transaction()), _options(connection))


# -- running them on the caller's connection (the faces' check_held / accept_fence call these) -----


def _prepare_check(
    conn: object, names: LeaseTableNames, key: object, owner: object, fence: object
) -> tuple[tuple[Any, Any], dict[str, Any]]:
    from sqlalchemy import text

    params = validate_check(key, owner, fence)
    statements = fence_statements_for(connection_dialect(conn), names)
    return (text(statements.check_held), text(statements.check_slot)), params


def _prepare_accept(
    conn: object, names: LeaseTableNames, resource: object, fence: object
) -> tuple[FenceStatements, dict[str, Any]]:
    params = {"resource": validate_resource(resource), "fence": validate_fence(fence)}
    return fence_statements_for(connection_dialect(conn), names), params


async def check_held_async(conn: Any, names: LeaseTableNames, key: str, owner: str, fence: int) -> None:
    """``check_held`` on an ``AsyncConnection`` or ``AsyncSession``; ``UnguardedCheckError`` where
    its lock would not last (autocommit; a SQLite SAVEPOINT)."""
    (statement, slot), params = _prepare_check(conn, names, key, owner, fence)
    row = (await conn.execute(statement, params)).first()
    if row is None:  # a slot of a semaphore, if any
        row = (await conn.execute(slot, params)).first()
    await _guard_async(conn, connection_dialect(conn))
    check_held_result(key, owner, fence, row)


def check_held_sync(conn: Any, names: LeaseTableNames, key: str, owner: str, fence: int) -> None:
    """``check_held`` on a ``Connection`` or ``Session``; ``UnguardedCheckError`` where its lock
    would not last (autocommit; a SQLite SAVEPOINT)."""
    (statement, slot), params = _prepare_check(conn, names, key, owner, fence)
    row = conn.execute(statement, params).first()
    if row is None:  # a slot of a semaphore, if any
        row = conn.execute(slot, params).first()
    _guard_sync(conn, connection_dialect(conn))
    check_held_result(key, owner, fence, row)


async def accept_fence_async(conn: Any, names: LeaseTableNames, resource: str, fence: int) -> int:
    """``accept_fence`` on an ``AsyncConnection`` or ``AsyncSession``."""
    from sqlalchemy import text

    s, params = _prepare_accept(conn, names, resource, fence)
    result = await conn.execute(text(s.accept_fence), params)
    row = result.first() if result.returns_rows else None  # MySQL's upsert reports nothing: read it back
    accepted = None
    if row is None:
        accepted = (await conn.execute(text(s.accepted), {"resource": resource})).scalar()
    return accept_fence_result(resource, fence, row, accepted)


def accept_fence_sync(conn: Any, names: LeaseTableNames, resource: str, fence: int) -> int:
    """``accept_fence`` on a ``Connection`` or ``Session``."""
    from sqlalchemy import text

    s, params = _prepare_accept(conn, names, resource, fence)
    result = conn.execute(text(s.accept_fence), params)
    row = result.first() if result.returns_rows else None  # MySQL's upsert reports nothing: read it back
    accepted = None
    if row is None:
        accepted = conn.execute(text(s.accepted), {"resource": resource}).scalar()
    return accept_fence_result(resource, fence, row, accepted)
