"""``SqlLeaseProvider``: the executor that runs :mod:`.statements` on PostgreSQL or SQLite.

SQLAlchemy gives configuration, URL parsing and the connection pool; each operation checks out a
pooled connection and runs its one statement on the *driver* connection (asyncpg or aiosqlite), in
autocommit, so on PostgreSQL an operation is one round trip: no ``BEGIN``/``COMMIT``, no reset
query when the connection goes back to the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ..contract import (
    AcquireResult,
    LeaseInfo,
    LeaseProviderBase,
    validate_key,
    validate_owner,
    validate_sweep,
    validate_ttl_ms,
)
from ..errors import LeaseBackendError, LeaseConfigError, LeaseError, ProviderClosedError, SchemaMissingError
from .schema import DEFAULT_TABLE_NAME, LeaseTableNames, derived_version_table
from .slots import ConnectionSlots
from .statements import LeaseStatements, statements_for
from .urls import ASYNC_DRIVERS as _ASYNC_DRIVERS
from .urls import open_existing_sqlite_file_only, safe_url, sqlite_file, to_async_url

if TYPE_CHECKING:
    from .notify import NotifyListener, PostgresReleaseWaiter

__all__ = ["SqlLeaseProvider", "to_async_url"]

T = TypeVar("T")
log = logging.getLogger("sql_lease")
_MAX_SQLITE_BUSY_TIMEOUT_MS = 2**31 - 1  # SQLite's busy timeout is a C int: larger values wrap to 0
Row = Sequence[Any]

# Session settings of the connections the provider creates itself (never of borrowed ones), sent
# in the startup packet. asyncpg caches prepared statements, and PostgreSQL may switch one to a
# generic plan after five runs; one made while the lease table was empty is a sequential scan,
# kept until the next ANALYZE. Every lease statement has one right index, so index scans are
# always right (see docs/statements.md). Not through PgBouncer, which rejects unknown startup
# parameters; there, and on a given engine, autovacuum's ANALYZE ends a stale plan.
OWN_CONNECTION_SETTINGS = {"enable_seqscan": "off"}

# SQLSTATEs that no retry can fix: the configuration is wrong (class 28: the role or password;
# 3D000: no such database; 42501: a missing privilege).
_CONFIG_HINTS = {
    "28": "the server refused the role or its password: check the user and password of the URL",
    "3D000": "the database does not exist: create it or fix the database name in the URL",
    "42501": "the role lacks a privilege on the lease table or its sequence (README: least privilege)",
}


def _sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a driver error, looked for on SQLAlchemy's wrapper and its causes."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return None
        state = getattr(seen, "sqlstate", None)
        if isinstance(state, str):
            return state
        seen = getattr(seen, "orig", None) or seen.__cause__
    return None


def _config_hint(exc: BaseException) -> str | None:
    state = _sqlstate(exc)
    if state is None:
        return None
    return _CONFIG_HINTS.get(state) or _CONFIG_HINTS.get(state[:2] if state.startswith("28") else "")


def _merge_engine_options(options: dict[str, Any], extra: dict[str, Any]) -> None:
    """``options.update(extra)``, except that ``connect_args`` and its ``server_settings`` merge."""
    for name, value in extra.items():
        if name == "connect_args" and isinstance(value, dict) and isinstance(options.get(name), dict):
            merged = dict(options[name])
            for arg, arg_value in value.items():
                if arg == "server_settings" and isinstance(arg_value, dict):
                    merged[arg] = {**merged.get(arg, {}), **arg_value}
                else:
                    merged[arg] = arg_value
            options[name] = merged
        else:
            options[name] = value


class _Driver:
    """How one driver fetches rows and which of its errors leave the connection usable."""

    async def fetch_one(self, conn: Any, sql: str, params: tuple[Any, ...]) -> Row | None:
        raise NotImplementedError

    async def fetch_all(self, conn: Any, sql: str, params: tuple[Any, ...]) -> list[Row]:
        raise NotImplementedError

    async def prepare(self, conn: Any) -> None:
        """Run once per new driver connection."""

    def is_schema_missing(self, exc: BaseException) -> bool:
        raise NotImplementedError

    def connection_survives(self, exc: BaseException) -> bool:
        """True if ``exc`` came from the server about the statement, so the connection is still good."""
        raise NotImplementedError

    async def abort(self, conn: Any) -> None:
        """Stop whatever ``conn`` is doing, at once and without waiting for the server or a thread."""
        raise NotImplementedError

    def is_usable(self, conn: Any) -> bool:
        """False if ``conn`` is known to be dead (e.g. its socket closed while it sat idle)."""
        return True

    def failed_before_sending(self, exc: BaseException, conn: Any) -> bool:
        """True if ``exc`` says the connection was found dead before the statement was sent, so
        the operation can be retried on another connection whatever it was."""
        return False


class _AsyncpgDriver(_Driver):
    """asyncpg. Nothing is SET on a connection: the provider's own connections get their settings
    in the startup packet (``OWN_CONNECTION_SETTINGS``), and borrowed ones come back unchanged."""

    async def fetch_one(self, conn: Any, sql: str, params: tuple[Any, ...]) -> Row | None:
        return await conn.fetchrow(sql, *params)  # type: ignore[no-any-return]

    async def fetch_all(self, conn: Any, sql: str, params: tuple[Any, ...]) -> list[Row]:
        return await conn.fetch(sql, *params)  # type: ignore[no-any-return]

    def is_schema_missing(self, exc: BaseException) -> bool:
        import asyncpg

        # a missing schema surfaces as 3F000 where a statement names the table as '"schema".table'::regclass
        return isinstance(exc, (asyncpg.UndefinedTableError, asyncpg.InvalidSchemaNameError))

    def connection_survives(self, exc: BaseException) -> bool:
        import asyncpg

        return isinstance(exc, asyncpg.PostgresError) and not isinstance(
            exc, (asyncpg.AdminShutdownError, asyncpg.CannotConnectNowError)
        )

    async def abort(self, conn: Any) -> None:
        conn.terminate()  # closes the socket now; a graceful close could wait seconds

    def is_usable(self, conn: Any) -> bool:
        return not conn.is_closed()

    def failed_before_sending(self, exc: BaseException, conn: Any) -> bool:
        import asyncpg

        # asyncpg checks that the connection is open before it writes anything and raises an
        # InterfaceError; a connection lost mid-statement raises a connection error instead.
        return isinstance(exc, asyncpg.InterfaceError) and conn.is_closed()


class _AiosqliteDriver(_Driver):
    def __init__(self, busy_timeout_ms: int, synchronous: str) -> None:
        self._pragmas = (
            f"PRAGMA busy_timeout = {int(busy_timeout_ms)}",
            "PRAGMA journal_mode = WAL",
            f"PRAGMA synchronous = {synchronous}",
        )

    async def fetch_one(self, conn: Any, sql: str, params: tuple[Any, ...]) -> Row | None:
        rows = await conn.execute_fetchall(sql, params)
        return next(iter(rows), None)

    async def fetch_all(self, conn: Any, sql: str, params: tuple[Any, ...]) -> list[Row]:
        return list(await conn.execute_fetchall(sql, params))

    async def prepare(self, conn: Any) -> None:
        for pragma in self._pragmas:
            await conn.execute_fetchall(pragma, ())

    def is_schema_missing(self, exc: BaseException) -> bool:
        return isinstance(exc, sqlite3.OperationalError) and "no such table" in str(exc)

    def connection_survives(self, exc: BaseException) -> bool:
        return isinstance(exc, sqlite3.Error)

    async def abort(self, conn: Any) -> None:
        await conn.interrupt()  # sqlite3_interrupt(): the worker thread's statement stops now


class SqlLeaseProvider(LeaseProviderBase):
    """Leases in a PostgreSQL or SQLite table, shared by every process that reaches the database.

    Args:
        url_or_engine: a URL (``postgresql://``, ``postgresql+asyncpg://``, ``postgres://``,
            ``sqlite:///path``, ``sqlite+aiosqlite:///path``; plain forms use the async drivers) or
            an ``AsyncEngine`` on asyncpg or aiosqlite. A URL's engine is created and disposed by the
            provider; a given engine is shared and never disposed. A ``sqlite:///path`` must name a
            file in an existing directory (else ``ValueError``); only :meth:`migrate` creates the
            file, and other operations on a missing file raise ``SchemaMissingError``.
        table_name: the lease table (default ``sql_leases``); letters, digits, underscores; at
            most 49 characters, at most 43 without ``version_table`` (PostgreSQL's 63-byte names
            must hold ``ix_<table>_expires_at`` and ``<table>_alembic_version_pkc``).
        schema: PostgreSQL schema (SQLite: attached database name) of the table, default the
            connection's search path.
        version_table: Alembic's version table for :meth:`migrate`, kept apart from the
            application's own Alembic history; one per lease table. Default
            ``sql_lease_alembic_version`` for the default table, ``<table>_alembic_version`` else.
        operation_timeout_s: every operation (pool checkout included) either completes within this
            many seconds or raises ``LeaseBackendError``. Default 10; more than 0, at most 86400
            (one day).
        pool_size: at most this many connections run lease statements at once; the provider keeps
            them checked out of the engine's pool until :meth:`close`. Default 10 for a URL, 2 for
            a given engine (leaving the rest of its pool to the application).
        sqlite_busy_timeout_ms: how long a SQLite statement waits for another process's write lock
            before failing, in milliseconds: 0 to 2**31 - 1. Default: the operation timeout. SQLite
            only (``ValueError`` for PostgreSQL).
        sqlite_synchronous: SQLite ``PRAGMA synchronous``: ``"FULL"`` (default: a committed lease
            and its fence survive power loss) or ``"NORMAL"`` (faster; survives process crashes).
        engine_options: extra keyword arguments for ``create_async_engine`` when given a URL.
        listen_notify: PostgreSQL only: waiters (``acquire_lease_wait``, ``hold(wait=True)``)
            ``LISTEN`` on one pooled connection and wake within milliseconds of a release, instead
            of polling. Default True; turn off where LISTEN is unavailable (PgBouncer in
            transaction mode).
        pgbouncer: the database is reached through PgBouncer in transaction pooling mode: no
            named prepared statements (asyncpg's ``statement_cache_size=0``, which PgBouncer's
            transaction mode cannot track) and no LISTEN (``listen_notify=False``; waiters poll).
            Every lease operation is one statement in its own transaction, so nothing else
            depends on a session. Applies to engines the provider creates from a URL; configure a
            given engine the same way yourself (``connect_args={"statement_cache_size": 0}``).

    Raises ``ValueError``/``TypeError`` for bad arguments, before connecting. Operations raise
    ``SchemaMissingError`` when the table does not exist (run ``sql-lease migrate``) and
    ``LeaseBackendError`` (original on ``__cause__``) when the database fails or times out.

    Use it as an async context manager, or call :meth:`close` when done.
    """

    def __init__(
        self,
        url_or_engine: str | URL | AsyncEngine,
        *,
        table_name: str = DEFAULT_TABLE_NAME,
        schema: str | None = None,
        version_table: str | None = None,
        operation_timeout_s: float = 10.0,
        pool_size: int | None = None,
        sqlite_busy_timeout_ms: int | None = None,
        sqlite_synchronous: str = "FULL",
        engine_options: dict[str, Any] | None = None,
        listen_notify: bool = True,
        pgbouncer: bool = False,
    ) -> None:
        self.names = LeaseTableNames(table_name, schema, version_table)
        if isinstance(operation_timeout_s, bool) or not isinstance(operation_timeout_s, (int, float)):
            raise TypeError("operation_timeout_s must be a number of seconds")
        if not 0 < operation_timeout_s <= 86_400:
            raise ValueError(f"operation_timeout_s must be > 0 and at most 86400 seconds, got {operation_timeout_s!r}")
        if sqlite_synchronous not in ("FULL", "NORMAL", "EXTRA"):
            raise ValueError("sqlite_synchronous must be 'FULL', 'NORMAL' or 'EXTRA'")
        if pool_size is not None and (isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1):
            raise ValueError(f"pool_size must be an int >= 1, got {pool_size!r}")
        if sqlite_busy_timeout_ms is not None:
            if isinstance(sqlite_busy_timeout_ms, bool) or not isinstance(sqlite_busy_timeout_ms, (int, float)):
                kind = type(sqlite_busy_timeout_ms).__name__
                raise TypeError(f"sqlite_busy_timeout_ms must be a number of milliseconds, not {kind}")
            if not 0 <= sqlite_busy_timeout_ms <= _MAX_SQLITE_BUSY_TIMEOUT_MS:
                raise ValueError(
                    f"sqlite_busy_timeout_ms must be 0 to {_MAX_SQLITE_BUSY_TIMEOUT_MS} milliseconds "
                    f"(SQLite's limit, about 24.8 days), got {sqlite_busy_timeout_ms!r}"
                )
        self.operation_timeout_s = float(operation_timeout_s)
        database_file = None

        if isinstance(url_or_engine, AsyncEngine):
            base_engine, self._owns_engine = url_or_engine, False
            backend = base_engine.dialect.name
            if base_engine.dialect.driver != _ASYNC_DRIVERS.get(backend):
                raise ValueError(
                    f"the engine must use asyncpg (PostgreSQL) or aiosqlite (SQLite), "
                    f"not {backend}+{base_engine.dialect.driver}"
                )
        elif isinstance(url_or_engine, (str, URL)):
            url = to_async_url(url_or_engine)
            backend = url.get_backend_name()
            database_file = sqlite_file(url)
            if database_file is not None and not database_file.parent.is_dir():
                raise ValueError(
                    f"the directory {database_file.parent} of the SQLite database does not exist "
                    "(or is not a directory); create it first"
                )
            options: dict[str, Any] = {"pool_reset_on_return": None}
            if pgbouncer and backend == "postgresql":
                url = url.update_query_dict({"prepared_statement_cache_size": "0"})
                options["connect_args"] = {"statement_cache_size": 0}
            elif backend == "postgresql":
                options["connect_args"] = {"server_settings": dict(OWN_CONNECTION_SETTINGS)}
            if not {"poolclass", "pool"} & set(engine_options or {}):
                # the lease statements' connections, the LISTEN connection and migrations
                options.update(pool_size=(pool_size or 10) + 2, max_overflow=0)
            _merge_engine_options(options, engine_options or {})
            base_engine, self._owns_engine = create_async_engine(url, **options), True
        else:
            raise TypeError(
                f"url_or_engine must be a URL string, sqlalchemy URL or AsyncEngine, not {type(url_or_engine).__name__}"
            )
        if sqlite_busy_timeout_ms is not None and backend != "sqlite":
            raise ValueError(f"sqlite_busy_timeout_ms is only for SQLite databases, not {backend}")
        if sqlite_busy_timeout_ms is None:
            sqlite_busy_timeout_ms = min(int(self.operation_timeout_s * 1000), _MAX_SQLITE_BUSY_TIMEOUT_MS)
        sqlite_busy_timeout_ms = int(sqlite_busy_timeout_ms)
        if database_file is not None:
            # Only migrate() creates the database file (see sql_lease.sql.migrate); lease
            # operations on a missing file raise SchemaMissingError and leave no empty file behind.
            missing_file = database_file

            def missing() -> SchemaMissingError:
                return SchemaMissingError(
                    f"lease table {self.names.table!r} not found: the SQLite database file {missing_file} "
                    f"does not exist: run `sql-lease migrate --url URL{self._names_options()}` first"
                )

            open_existing_sqlite_file_only(base_engine, database_file, missing)
        # Migrations run in transactions on the base engine; lease operations run in autocommit.
        self._base_engine = base_engine
        # Lease statements run on the driver connection outside any transaction (asyncpg: each is
        # its own). SQLAlchemy's AUTOCOMMIT option is only needed for SQLite's driver; on
        # PostgreSQL it would reset the isolation level with a session-level SET on return.
        self._engine = (
            base_engine if backend == "postgresql" else base_engine.execution_options(isolation_level="AUTOCOMMIT")
        )
        self.dialect_name = backend
        self.statements: LeaseStatements = statements_for(backend, self.names)
        self._driver: _Driver = (
            _AsyncpgDriver()
            if backend == "postgresql"
            else _AiosqliteDriver(
                sqlite_busy_timeout_ms if sqlite_busy_timeout_ms is not None else int(self.operation_timeout_s * 1000),
                sqlite_synchronous,
            )
        )
        self.safe_url = safe_url(base_engine.url)
        self._closed = False
        self._in_flight = 0
        self._idle = asyncio.Event()
        self.listen_notify = bool(listen_notify) and not pgbouncer
        self._listener: NotifyListener | None = None
        if pool_size is not None and (isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1):
            raise ValueError(f"pool_size must be an int >= 1, got {pool_size!r}")
        self._slots = ConnectionSlots(
            self._engine,
            pool_size or (10 if self._owns_engine else 2),
            self._driver.prepare,
            self._driver.is_usable,
        )

    def __repr__(self) -> str:
        return f"SqlLeaseProvider({getattr(self, 'safe_url', '?')!r}, table_name={self.names.table!r})"

    @property
    def engine(self) -> AsyncEngine:
        """The engine the provider checks its connections out of (on SQLite with the AUTOCOMMIT
        execution option; lease statements never run inside a transaction of SQLAlchemy's)."""
        return self._engine

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    async def __aenter__(self) -> SqlLeaseProvider:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Let operations in flight finish (each ends within ``operation_timeout_s``), return the
        provider's connections, close the LISTEN connection, and dispose the engine if the provider
        created it (a given engine is left to its owner). Later operations raise
        ``ProviderClosedError``; waiters stop listening and get that error at their next attempt."""
        self._closed = True
        if self._in_flight:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.operation_timeout_s + 1):
                    await self._idle.wait()
        await self._slots.close()
        if self._listener is not None:
            await self._listener.close()
        if self._owns_engine:
            await self._base_engine.dispose()

    def release_waiter(self, key: str) -> PostgresReleaseWaiter | None:
        """The optional wake-up hook of :func:`sql_lease.holding.acquire_lease_wait`.

        On PostgreSQL (unless ``listen_notify=False``): an async context manager whose ``acquire``
        marks a refused row, and whose ``wait`` ends as soon as that row is released, transferred
        or swept (``LISTEN``/``NOTIFY``). None on SQLite, where waiters poll.
        """
        if self.dialect_name != "postgresql" or not self.listen_notify:
            return None
        from .notify import NotifyListener, PostgresReleaseWaiter

        if self._listener is None:
            self._listener = NotifyListener(self)
        return PostgresReleaseWaiter(self, self._listener, validate_key(key))

    async def migrate(self) -> str | None:
        """Create or upgrade the lease table to the newest schema (Alembic ``upgrade head``).

        Idempotent and safe to run from several processes at once. Needs DDL privileges. Returns
        the schema revision now in place.
        """
        from .migrate import upgrade_engine

        try:
            return await upgrade_engine(self._base_engine, self.names)
        except LeaseError:
            raise
        except Exception as exc:
            raise LeaseBackendError(f"migrating {self.safe_url} failed: {type(exc).__name__}: {exc}") from exc

    def _names_options(self) -> str:
        """The CLI options that name this provider's table, for hints in messages."""
        names = self.names
        options = "" if names.table == DEFAULT_TABLE_NAME else f" --table {names.table}"
        options += f" --schema {names.schema}" if names.schema else ""
        if names.version_table != derived_version_table(names.table):
            options += f" --version-table {names.version_table}"
        return options

    # -- the executor -----------------------------------------------------------------------

    async def _run(self, operation: str, key: str | None, work: Callable[[Any], Awaitable[T]]) -> T:
        """Run ``work`` on a driver connection within the operation timeout; translate errors."""
        if self._closed:
            raise ProviderClosedError(f"{operation}: the provider for {self.safe_url} is closed")
        self._in_flight += 1
        try:
            return await self._run_once(operation, key, work)
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()

    async def _run_once(self, operation: str, key: str | None, work: Callable[[Any], Awaitable[T]]) -> T:
        what = f"{operation} {key!r}" if key is not None else operation
        try:
            async with asyncio.timeout(self.operation_timeout_s):
                # A connection that died while idle (a database restart) may not have noticed yet;
                # its statement was then never sent, so another connection may run it.
                for attempt in itertools.count():
                    slot = await self._slots.take()
                    healthy = False
                    try:
                        result = await work(slot[1])
                        healthy = True
                        return result
                    except BaseException as exc:
                        healthy = self._driver.connection_survives(exc)
                        if not healthy:
                            with contextlib.suppress(Exception):
                                await self._driver.abort(slot[1])
                        if attempt < self._slots.size and self._driver.failed_before_sending(exc, slot[1]):
                            continue
                        raise
                    finally:
                        self._slots.give_back(slot, healthy=healthy)
                raise AssertionError("unreachable")
        except LeaseError:
            raise
        except TimeoutError as exc:
            raise LeaseBackendError(
                f"{what}: no answer from {self.safe_url} within {self.operation_timeout_s:g} s"
            ) from exc
        except Exception as exc:
            if self._closed and isinstance(exc, RuntimeError):
                raise ProviderClosedError(f"{what}: the provider for {self.safe_url} was closed") from exc
            if self._driver.is_schema_missing(exc):
                raise SchemaMissingError(
                    f"lease table {self.names.table!r} not found in {self.safe_url}: "
                    f"run `sql-lease migrate --url URL{self._names_options()}` first ({exc})"
                ) from exc
            hint = _config_hint(exc)
            if hint is not None:
                raise LeaseConfigError(f"{what} on {self.safe_url}: {hint} ({type(exc).__name__}: {exc})") from exc
            raise LeaseBackendError(f"{what} on {self.safe_url} failed: {type(exc).__name__}: {exc}") from exc

    # -- the five operations ------------------------------------------------------------------

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int | float) -> AcquireResult:
        return await self._acquire(key, owner, ttl_ms, waiting=False)

    async def _acquire(self, key: str, owner: str, ttl_ms: int | float, *, waiting: bool) -> AcquireResult:
        key, owner = validate_key(key), validate_owner(owner)
        params = (key, owner, self.statements.ttl_param(validate_ttl_ms(ttl_ms)))
        s, fetch = self.statements, self._driver.fetch_one
        statement = s.acquire_waiting if waiting else s.acquire

        async def acquire(conn: Any) -> AcquireResult:
            # No row: refused by a holder the statement's snapshot could not see, or the key was
            # freed meanwhile. A waiting acquire asks again, so that its refusal flags the row and
            # the holder's release wakes it; a plain one reads the holder afresh.
            for _ in range(3):
                row = await fetch(conn, statement, params)
                if row is not None:
                    return s.acquire_result(row)
                if waiting:
                    continue
                holder = await fetch(conn, s.holder, (key,))
                if holder is not None and holder[0] != owner:
                    return s.refusal(holder)
            holder = await fetch(conn, s.holder, (key,))
            if holder is not None and holder[0] != owner:
                return s.refusal(holder)
            return AcquireResult(False, None)

        return await self._run("acquire", key, acquire)

    async def get_lease_owner(self, key: str) -> str | None:
        key = validate_key(key)
        row = await self._run("get owner of", key, lambda c: self._driver.fetch_one(c, self.statements.owner, (key,)))
        return None if row is None else row[0]

    async def get_lease(self, key: str) -> LeaseInfo | None:
        """The unexpired lease on ``key`` (owner, fence, expiry, remaining TTL), or None."""
        key = validate_key(key)
        row = await self._run("read", key, lambda c: self._driver.fetch_one(c, self.statements.holder, (key,)))
        return None if row is None else self.statements.lease_info(key, row)

    async def release_lease(self, key: str, owner: str) -> bool:
        key, owner = validate_key(key), validate_owner(owner)
        row = await self._run(
            "release", key, lambda c: self._driver.fetch_one(c, self.statements.release, (key, owner))
        )
        return row is not None and bool(row[0])

    async def renew_lease(self, key: str, owner: str, ttl_ms: int | float) -> bool:
        return await self.renew_lease_info(key, owner, ttl_ms) is not None

    async def renew_lease_info(self, key: str, owner: str, ttl_ms: int | float) -> LeaseInfo | None:
        """Renew as ``renew_lease``; the renewed lease with the database's new ``expires_at``, or
        None if ``owner`` does not hold an unexpired lease on ``key``."""
        key, owner = validate_key(key), validate_owner(owner)
        params = (key, owner, self.statements.ttl_param(validate_ttl_ms(ttl_ms)))
        row = await self._run("renew", key, lambda c: self._driver.fetch_one(c, self.statements.renew, params))
        return None if row is None else self.statements.lease_info(key, row)

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int | float) -> bool:
        key, from_owner = validate_key(key), validate_owner(from_owner, "from_owner")
        to_owner = validate_owner(to_owner, "to_owner")
        params = (key, from_owner, to_owner, self.statements.ttl_param(validate_ttl_ms(ttl_ms)))
        row = await self._run("transfer", key, lambda c: self._driver.fetch_one(c, self.statements.transfer, params))
        return row is not None

    async def sweep_expired(self, batch_size: int = 1000, grace_ms: int | float = 0) -> int:
        """Delete up to ``batch_size`` leases that expired at least ``grace_ms`` milliseconds ago.

        One short statement (on PostgreSQL ``FOR UPDATE SKIP LOCKED``, so it never waits for or
        blocks a concurrent acquire). Returns how many rows it removed; call again while that equals
        ``batch_size``. Fences stay monotonic: they come from a per-table counter, not the rows.
        """
        batch_size, grace_ms = validate_sweep(batch_size, grace_ms)
        params = (self.statements.ttl_param(grace_ms) if grace_ms else 0, batch_size)
        rows = await self._run("sweep", None, lambda c: self._driver.fetch_all(c, self.statements.sweep, params))
        return self.statements.swept_count(rows)
