"""``SqlLeaseProvider``: the asyncio face of the SQL leases.

Each public method validates its arguments and makes a plan (:mod:`.operations`, no I/O), an
executor (:mod:`.executors`) runs it on one connection within the operation timeout, and errors are
mapped in one place (:mod:`.translate`). URL rules live in :mod:`.urls`, the SQL in
:mod:`.statements`. The path of one ``acquire_lease`` call: ``acquire_lease`` ->
``operations.acquire`` (validates; yields ``PostgresStatements.acquire`` with its parameters) ->
``_run`` (timeout, in-flight count) -> ``AsyncpgPoolExecutor.run`` (a pooled connection,
``conn.fetch``) -> the row goes back into the plan -> ``LeaseStatements.acquire_result`` ->
``AcquireResult``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import AsyncAdaptedQueuePool, NullPool

from .. import observe
from ..contract import AcquireResult, LeaseInfo, LeaseProviderBase, validate_key, validate_limit, validate_seconds
from ..errors import (
    LeaseBackendError,
    LeaseError,
    MissingDriverError,
    ProviderClosedError,
    SchemaMissingError,
)
from . import operations, setup
from .deadlines import DeadlineWatch
from .executors import (
    AiosqlitePoolExecutor,
    AsyncExecutor,
    AsyncmyPoolExecutor,
    AsyncpgPoolExecutor,
    EngineExecutor,
    LoopLocal,
)
from .operations import LOCK_WAIT_SHARE, Plan
from .options import validate_provider_options
from .schema import DEFAULT_TABLE_NAME, LeaseTableNames
from .setup import async_postgres_driver, psycopg_conninfo_checked
from .statements import OWN_CONNECTION_SETUP, LeaseStatements, statements_for
from .translate import describe, operation_label, translate
from .urls import asyncpg_url_and_args, open_existing_sqlite_file_only, safe_url, sqlite_file, to_async_url

if TYPE_CHECKING:
    from pathlib import Path

    from .notify import NotifyListener, PostgresReleaseWaiter

__all__ = ["SqlLeaseProvider", "to_async_url"]

T = TypeVar("T")
log = logging.getLogger("sql_lease")

_ENGINE_DRIVERS_IN_WORDS = "asyncpg or psycopg (PostgreSQL), asyncmy or aiomysql (MySQL) or aiosqlite (SQLite)"
# keys SQLAlchemy's asyncpg dialect adds to the connect arguments that asyncpg itself does not take
_SQLALCHEMY_ONLY_ARGS = ("prepared_statement_cache_size", "prepared_statement_name_func", "async_creator_fn")


def require_driver(module: str, extra: str) -> None:
    """``MissingDriverError`` naming the extra to install when the driver ``module`` is missing."""
    if importlib.util.find_spec(module) is None:
        raise MissingDriverError(f"the {module} driver is not installed: pip install 'sql-lease[{extra}]'", name=module)


def _drop_listen_connection(listener: NotifyListener) -> None:
    """A closed event loop's LISTEN connection, dropped without I/O."""
    with contextlib.suppress(Exception):
        listener._driver.terminate()


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


def _asyncpg_connect_kwargs(engine: AsyncEngine, connect_args: dict[str, Any], pgbouncer: bool) -> dict[str, Any]:
    """``asyncpg.connect`` arguments for the URL of ``engine`` (SQLAlchemy parses it: multi-host
    forms, query parameters) and the ``connect_args`` the caller gave."""
    _, kwargs = engine.dialect.create_connect_args(engine.url)
    cache_size = kwargs.get("prepared_statement_cache_size")
    for name in _SQLALCHEMY_ONLY_ARGS:
        kwargs.pop(name, None)
    kwargs.update(connect_args)
    if pgbouncer or str(cache_size) == "0":
        kwargs["statement_cache_size"] = 0
    return dict(kwargs)


class SqlLeaseProvider(LeaseProviderBase):
    """Leases in a PostgreSQL or SQLite table, shared by every process that reaches the database.

    Args:
        url_or_engine: a URL (``postgresql://``, ``postgresql+asyncpg://``, ``postgres://``,
            ``sqlite:///path``, ``sqlite+aiosqlite:///path``; plain forms use the async drivers:
            asyncpg, else psycopg 3 when asyncpg is not installed) or an ``AsyncEngine`` on asyncpg,
            psycopg or aiosqlite. A URL's engine is created and disposed by the
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
        pool_size: at most this many connections run lease statements at once, in the provider's
            own pool (asyncpg's, for a PostgreSQL URL). Default 10. Ignored for a given engine: each
            operation checks one connection out of the engine's own pool and gives it back.
        sqlite_busy_timeout_ms: how long a SQLite statement waits for another process's write lock
            before failing, in milliseconds: 0 to 2**31 - 1. Default: the operation timeout. SQLite
            only (``ValueError`` for PostgreSQL).
        sqlite_synchronous: SQLite ``PRAGMA synchronous``: ``"FULL"`` (default: a committed lease
            and its fence survive power loss) or ``"NORMAL"`` (faster; survives process crashes).
        engine_options: extra keyword arguments for ``create_async_engine`` when given a URL (the
            engine :meth:`migrate` uses); their ``connect_args`` also reach the lease connections.
        listen_notify: PostgreSQL only: waiters (``acquire_lease_wait``, ``hold(wait=True)``)
            ``LISTEN`` on one connection of their own and wake within milliseconds of a release, instead
            of polling. Default True; turn off where LISTEN is unavailable (PgBouncer in
            transaction mode).
        pgbouncer: the database is reached through PgBouncer in transaction pooling mode: no
            named prepared statements (asyncpg's ``statement_cache_size=0``, which PgBouncer's
            transaction mode cannot track) and no LISTEN (``listen_notify=False``; waiters poll).
            Every lease operation is one statement in its own transaction, so nothing else
            depends on a session, and acquire, renew and transfer pin their durability per
            transaction instead of per session. Required behind any transaction-pooling proxy,
            also for durability (docs/statements.md, "Durability"). Applies to engines the provider
            creates from a URL; configure a given engine the same way yourself
            (``connect_args={"statement_cache_size": 0}``).
        durable_release: PostgreSQL only in effect: when False (default), a release commits with
            ``synchronous_commit = off`` for its own transaction and does not wait for the WAL flush
            (one disk flush less per acquire/release cycle). A release lost in a crash leaves the
            lease held until its TTL, as if its holder had died; acquire, renew and transfer stay
            durable, and the next durable commit flushes the release with it (docs/statements.md,
            "Durability"). True makes releases wait for the disk like the other writes.

    Raises ``ValueError``/``TypeError`` for bad arguments, before connecting (a URL query
    parameter no driver takes, or a bad port: ``InvalidURLError``, also a ``LeaseConfigError``). Operations raise
    ``SchemaMissingError`` when the table does not exist (run ``sql-lease migrate``),
    ``LeaseConfigError`` when the database refuses the configuration (no such database, role or
    privilege), ``ProviderClosedError`` after :meth:`close`, and ``LeaseBackendError`` (original on
    ``__cause__``) when the database fails or times out.

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
        durable_release: bool = False,
    ) -> None:
        self.names = LeaseTableNames(table_name, schema, version_table)
        checked = validate_provider_options(operation_timeout_s, pool_size, sqlite_busy_timeout_ms, sqlite_synchronous)
        self.operation_timeout_s = checked.operation_timeout_s
        self._closed = False
        self._in_flight = 0
        self._drained: asyncio.Future[None] | None = None  # close() waits on it for calls in flight
        self._deadlines = DeadlineWatch()
        self._listeners: LoopLocal[NotifyListener] | None = None  # one LISTEN connection per event loop
        database_file = None
        connect_args: dict[str, Any] = {}
        postgres_driver: str | None = None
        conninfo = ""

        if isinstance(url_or_engine, AsyncEngine):
            base_engine, self._owns_engine = url_or_engine, False
            dialect = base_engine.dialect
            backend = setup.engine_backend(
                dialect.name, dialect.driver, setup.ASYNC_ENGINE_DRIVERS, _ENGINE_DRIVERS_IN_WORDS
            )
        elif isinstance(url_or_engine, (str, URL)):
            url = to_async_url(url_or_engine)
            backend = url.get_backend_name()
            if backend == "postgresql":
                postgres_driver = async_postgres_driver()
                if postgres_driver == "psycopg":
                    url = url.set(drivername="postgresql+psycopg")
            if backend == "mysql":
                url = setup.mysql_driver_checked(url)
            database_file = sqlite_file(url)
            if database_file is not None:
                setup.sqlite_directory(database_file)
            # This engine only migrates (and runs `uri=true` SQLite URLs): it keeps no connections.
            options: dict[str, Any] = {"poolclass": NullPool}
            if postgres_driver == "asyncpg":
                # libpq's parameters (sslmode, application_name, ...) as asyncpg's arguments
                url, url_args = asyncpg_url_and_args(url)
                options["connect_args"] = url_args
                if pgbouncer:
                    url = url.update_query_dict({"prepared_statement_cache_size": "0"})
                    options["connect_args"]["statement_cache_size"] = 0
            elif postgres_driver == "psycopg":
                conninfo = psycopg_conninfo_checked(url)  # libpq takes its own parameters; unknown ones refused here
                if pgbouncer:
                    options["connect_args"] = {"prepare_threshold": None}
            _merge_engine_options(options, engine_options or {})
            connect_args = dict(options.get("connect_args") or {})
            base_engine, self._owns_engine = create_async_engine(url, **options), True
        else:
            raise TypeError(
                f"url_or_engine must be a URL string, sqlalchemy URL or AsyncEngine, not {type(url_or_engine).__name__}"
            )
        busy_timeout_ms = setup.sqlite_busy_timeout(checked.sqlite_busy_timeout_ms, self.operation_timeout_s, backend)
        self._base_engine = base_engine
        self.dialect_name = backend
        self.durable_release = bool(durable_release)
        own_postgres = self._owns_engine and backend == "postgresql"
        self.statements: LeaseStatements = statements_for(
            backend,
            self.names,
            durable_release=self.durable_release,
            durable_session=own_postgres and not pgbouncer,
            sqlite_quick_first=self._owns_engine and database_file is not None,
            mysql_lock_wait_s=setup.mysql_lock_wait_s(self.operation_timeout_s) if self._owns_engine else None,
            mysql_packed=self._owns_engine and base_engine.dialect.driver in setup.MYSQL_OWN_DRIVERS,
        )
        self.safe_url = safe_url(base_engine.url)
        self.listen_notify = bool(listen_notify) and not pgbouncer
        size = pool_size or 10
        pragmas = setup.sqlite_pragmas(busy_timeout_ms, sqlite_synchronous)
        self._executor: AsyncExecutor
        if not self._owns_engine:
            self._executor = EngineExecutor(base_engine)
        elif postgres_driver == "psycopg":
            from .psycopg_async import PsycopgAsyncPoolExecutor

            session_setup = () if pgbouncer else OWN_CONNECTION_SETUP
            self._executor = PsycopgAsyncPoolExecutor(conninfo, size, session_setup, pgbouncer=pgbouncer)
        elif backend == "postgresql":
            connect_kwargs = _asyncpg_connect_kwargs(base_engine, connect_args, pgbouncer)
            self._executor = AsyncpgPoolExecutor(connect_kwargs, size, () if pgbouncer else OWN_CONNECTION_SETUP)
        elif backend == "mysql" and base_engine.dialect.driver not in setup.MYSQL_OWN_DRIVERS:
            own = create_async_engine(
                base_engine.url, pool_size=size, max_overflow=0, pool_recycle=3600, **setup.autocommit_engine_options()
            )
            setup.run_at_connect(own.sync_engine, setup.mysql_session_setup(self.operation_timeout_s))
            self._executor = EngineExecutor(own, owned=True)
            self._uri_engine = own
        elif backend == "mysql":
            self._executor = AsyncmyPoolExecutor(
                setup.mysql_connect_kwargs(base_engine.sync_engine, self.operation_timeout_s),
                size,
                setup.mysql_session_setup(self.operation_timeout_s),
            )
        elif database_file is not None:
            retried = setup.sqlite_pragmas(busy_timeout_ms, sqlite_synchronous, retried=True)
            self._executor = AiosqlitePoolExecutor(database_file, size, retried, self._missing_file, busy_timeout_ms)
        else:  # a `uri=true` SQLite URL: SQLAlchemy's engine, pooled, opens it
            own = create_async_engine(
                base_engine.url,
                poolclass=AsyncAdaptedQueuePool,
                pool_size=size + 2,
                max_overflow=0,
                isolation_level="AUTOCOMMIT",
            )  # the pool named: SQLAlchemy before 2.0.38 gives file SQLite a NullPool
            setup.run_at_connect(own.sync_engine, pragmas)
            self._executor = EngineExecutor(own, owned=True)
            self._uri_engine = own
        if database_file is not None:
            # Only migrate() creates the database file (see sql_lease.sql.migrate); lease
            # operations on a missing file raise SchemaMissingError and leave no empty file behind.
            open_existing_sqlite_file_only(base_engine, database_file, self._missing_file)
        self._database_file = database_file

    def _missing_file(self) -> SchemaMissingError:
        return setup.database_file_missing(self.names, self._database_file)

    def __repr__(self) -> str:
        return f"SqlLeaseProvider({getattr(self, 'safe_url', '?')!r}, table_name={self.names.table!r})"

    @property
    def engine(self) -> AsyncEngine:
        """The SQLAlchemy engine: the application's when one was given, else the one
        :meth:`migrate` uses (lease statements then run on the provider's own pool)."""
        return self._base_engine

    @property
    def database_file(self) -> Path | None:
        """The SQLite database file of a URL-built provider; None for PostgreSQL, an engine or a
        ``uri=true`` SQLite URL."""
        return self._database_file

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    def on_statement(self, callback: Callable[[str, tuple[Any, ...]], None]) -> Callable[[], None]:
        """Call ``callback(sql, params)`` before every lease statement this provider sends (for
        tests, logs and metrics); returns a function that removes it. A given engine's SQLAlchemy
        events (``before_cursor_execute``) fire as well."""
        self._executor.hooks.append(callback)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._executor.hooks.remove(callback)

        return remove

    async def __aenter__(self) -> SqlLeaseProvider:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Let operations in flight finish (each ends within ``operation_timeout_s``), close the
        provider's connections and its LISTEN connection, and dispose the engine if the provider
        created it (a given engine is left to its owner, with nothing checked out). Later
        operations raise ``ProviderClosedError``; waiters stop listening and get that error at
        their next attempt. Calling it again does nothing."""
        self._closed = True
        if self._in_flight:
            self._drained = asyncio.get_running_loop().create_future()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.operation_timeout_s + 1):
                    await asyncio.shield(self._drained)
        if self._listeners is not None:
            await self._listeners.close()
        await self._executor.close(self.operation_timeout_s)
        if getattr(self, "_uri_engine", None) is not None:
            await self._uri_engine.dispose()
        if self._owns_engine:
            await self._base_engine.dispose()

    @property
    def _listener(self) -> NotifyListener | None:
        """The running event loop's LISTEN holder, None before the first waiter (for tests)."""
        return None if self._listeners is None else self._listeners.current()

    def release_waiter(self, key: str) -> PostgresReleaseWaiter | None:
        """The optional wake-up hook of :func:`sql_lease.holding.acquire_lease_wait`
        (``sql_lease.contract.ReleaseWaiters``).

        On PostgreSQL (unless ``listen_notify=False``): an async context manager whose ``acquire``
        marks a refused row, and whose ``wait`` ends as soon as that row is released, transferred
        or swept (``LISTEN``/``NOTIFY``). None on SQLite and on psycopg, where waiters poll.
        """
        if self.dialect_name != "postgresql" or not self.listen_notify or not self._executor.listens:
            return None
        from .notify import NotifyListener, PostgresReleaseWaiter

        if self._listeners is None:
            channel_query = self.statements.notify_channel or ""
            self._listeners = LoopLocal(
                lambda: NotifyListener(
                    self._executor.listen_connection,
                    channel_query,
                    lambda: self._closed,
                    self.operation_timeout_s,
                    self.names.table,
                ),
                NotifyListener.close,
                _drop_listen_connection,
            )
        return PostgresReleaseWaiter(self._listeners.current(), validate_key(key), self._acquire)

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
            raise LeaseBackendError(f"migrating {self.safe_url} failed: {describe(exc)}") from exc

    def migrate_command_options(self) -> str:
        """The CLI options that name this provider's table, for hints in messages."""
        return setup.migrate_command_options(self.names)

    def _schema_missing(self, exc: BaseException) -> SchemaMissingError:
        return setup.schema_missing(self.names, self.safe_url, exc)

    # -- fenced writes: in the caller's transaction, on the caller's connection ---------------------

    async def check_held(self, conn: Any, key: str, owner: str, fence: int) -> None:
        """Raise ``LeaseLostError`` unless ``owner`` holds ``key`` with exactly ``fence``, unexpired by
        the database's clock; run it inside your transaction (``conn``: your ``AsyncConnection`` or
        ``AsyncSession`` on the lease table's database), before you commit your writes.

        PostgreSQL locks the lease row (``FOR SHARE``) until your transaction ends, so the lease
        cannot change hands before your writes commit; renewals, transfers and takeovers of that
        key wait for your transaction. SQLite takes the database's write lock (a no-op ``UPDATE``)
        for the same effect. ``TypeError``/``ValueError`` for bad arguments before any SQL; driver
        errors are raised as SQLAlchemy raises them (your connection, your transaction).
        """
        from .fencing import check_held_async

        await check_held_async(conn, self.names, key, owner, fence)

    async def accept_fence(self, conn: Any, resource: str, fence: int) -> int:
        """Record ``fence`` as the highest accepted for ``resource`` in your transaction (one
        statement on the table ``<table>_fences`` of the database ``conn`` is on) and return it;
        ``StaleFenceError`` if a larger fence was accepted already. An equal fence is accepted."""
        from .fencing import accept_fence_async

        return await accept_fence_async(conn, self.names, resource, fence)

    # -- running a plan ---------------------------------------------------------------------------

    def _run(
        self, operation: str, key: str | None, make_plan: Callable[[], Plan[T]], limit_s: float | None = None
    ) -> Awaitable[T]:
        """Run the plan ``make_plan()`` within ``limit_s`` seconds (None: the operation timeout);
        errors become the library's. Every operation passes here, and here alone it is reported to
        observers (:mod:`sql_lease.observe`)."""
        plan = make_plan()  # validates the arguments before any I/O (and before closed-ness)
        if not observe.observers:
            return self._run_plan(operation, key, make_plan, plan, limit_s)
        return self._run_observed(operation, key, make_plan, plan, limit_s)

    async def _run_observed(
        self, operation: str, key: str | None, make_plan: Callable[[], Plan[T]], plan: Plan[T], limit_s: float | None
    ) -> T:
        started = time.perf_counter()
        try:
            result = await self._run_plan(operation, key, make_plan, plan, limit_s)
        except BaseException as exc:
            observe.operation_failed(operation, key, self.dialect_name, time.perf_counter() - started, exc)
            raise
        observe.operation_done(operation, key, self.dialect_name, time.perf_counter() - started, result)
        return result

    async def _run_plan(
        self,
        operation: str,
        key: str | None,
        make_plan: Callable[[], Plan[T]],
        plan: Plan[T],
        limit_s: float | None = None,
    ) -> T:
        if self._closed:
            raise ProviderClosedError(f"{operation}: the provider for {self.safe_url} is closed")
        limit = self.operation_timeout_s if limit_s is None else min(limit_s, self.operation_timeout_s)
        self._in_flight += 1
        ticket = self._deadlines.start(limit)
        try:
            try:
                return await self._executor.run(make_plan, plan, time.monotonic() + limit)
            except asyncio.CancelledError:
                if self._deadlines.stop(ticket):  # our deadline's, as asyncio.timeout converts it
                    raise TimeoutError from None
                raise
        except LeaseError:
            raise
        except TimeoutError as exc:
            what = operation_label(operation, key)
            raise LeaseBackendError(f"{what}: no answer from {self.safe_url} within {limit:g} s") from exc
        except Exception as exc:
            raise translate(exc, operation_label(operation, key), self.safe_url, self._schema_missing) from exc
        finally:
            self._deadlines.stop(ticket)
            self._in_flight -= 1
            if self._in_flight == 0 and self._drained is not None and not self._drained.done():
                self._drained.set_result(None)

    # -- the operations -----------------------------------------------------------------------------

    acquire_accepts_timeout_s = True
    """``acquire_lease`` takes a keyword ``timeout_s`` (the waiting acquire passes its time left)."""
    accepts_limit = True
    """``acquire_lease`` takes ``limit`` (a semaphore of N slots; ``hold()`` passes it when not 1)."""
    accepts_fence = True
    """``release_lease``, ``renew_lease(_info)``, ``transfer_lease`` take ``fence``, ``renew_many``
    items a fourth, and ``release_lease`` ``min_hold_ms`` (``hold()`` passes them)."""

    async def acquire_lease(
        self,
        key: str,
        owner: str,
        ttl_ms: int | float,
        *,
        limit: int = 1,
        data: dict[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> AcquireResult:
        """Acquire ``key`` for ``owner`` for ``ttl_ms`` milliseconds (rules 1-3 of ``LeaseProvider``),
        storing lease ``data`` (a JSON object, at most ``MAX_DATA_BYTES``; None: none, or within the
        owner's unexpired tenure: keep what is stored). ``timeout_s``: this call's time limit in
        seconds (None: ``operation_timeout_s``, also the most it can be); an expired lease guarded by
        a ``check_held`` transaction is waited for at most half of it, then answered "not acquired".
        ``limit`` (an int from 1 to 10,000, checked first): 1 is a plain lease; N >= 2 takes one of N
        slots of a semaphore on ``key``: granted while fewer than N other owners hold unexpired slots
        (the owner's own slot is renewed, same fence), else refused naming the holder with the oldest
        tenure. A key is held either as a plain lease or as a semaphore: each refuses the other while
        anyone holds it (docs/statements.md, "Semaphores").
        ``TypeError``/``ValueError`` before any SQL; ``LeaseBackendError`` past the limit."""
        validate_limit(limit)
        return await self._acquire(key, owner, ttl_ms, waiting=False, data=data, timeout_s=timeout_s, limit=limit)

    def _acquire(
        self,
        key: str,
        owner: str,
        ttl_ms: int | float,
        *,
        waiting: bool,
        data: dict[str, Any] | None = None,
        timeout_s: float | None = None,
        limit: int = 1,
    ) -> Awaitable[AcquireResult]:
        limit_s = self.operation_timeout_s if timeout_s is None else validate_seconds(timeout_s, "timeout_s")
        s, wait_ms = self.statements, min(limit_s, self.operation_timeout_s) * LOCK_WAIT_SHARE * 1000
        return self._run(
            "acquire",
            key,
            lambda: operations.acquire(
                s, key, owner, ttl_ms, waiting=waiting, data=data, lock_wait_ms=wait_ms, limit=limit
            ),
            limit_s,
        )

    async def get_lease_owner(self, key: str) -> str | None:
        return await self._run("get owner of", key, lambda: operations.get_owner(self.statements, key))

    async def get_lease(self, key: str) -> LeaseInfo | None:
        """The unexpired lease on ``key`` (owner, fence, expiry, remaining TTL, data), or None."""
        return await self._run("read", key, lambda: operations.get_lease(self.statements, key))

    async def get_lease_holders(self, key: str) -> list[LeaseInfo]:
        """Every unexpired holder of ``key``, oldest tenure first (then fence): each slot holder of a
        semaphore, or the plain lease ([] or one). ``TypeError``/``ValueError`` for a bad key before any SQL."""
        return await self._run("read holders of", key, lambda: operations.get_holders(self.statements, key))

    async def release_lease(
        self, key: str, owner: str, *, fence: int | None = None, min_hold_ms: int | float | None = None
    ) -> bool:
        """Release ``key`` if ``owner`` holds it unexpired; True iff it did (rule 6). ``fence``: only
        the tenure with that fencing token (else False, nothing changes). ``min_hold_ms``: keep the
        lease, held by ``owner`` and marked released, until that many milliseconds after its tenure
        began (``acquired_at``, by the database's clock; from now for a tenure without one), or free it
        at once if that moment has passed. ``TypeError``/``ValueError`` for bad input before any SQL."""
        s = self.statements
        return await self._run("release", key, lambda: operations.release(s, key, owner, fence, min_hold_ms))

    async def renew_lease(self, key: str, owner: str, ttl_ms: int | float, *, fence: int | None = None) -> bool:
        """Extend ``owner``'s unexpired lease to now + ``ttl_ms`` milliseconds (rule 7); with ``fence``,
        only the tenure with that fencing token. A released lease (kept by ``min_hold_ms``) is refused.
        ``TypeError``/``ValueError`` for bad input (``fence`` included) before any SQL."""
        return await self.renew_lease_info(key, owner, ttl_ms, fence=fence) is not None

    async def renew_lease_info(
        self, key: str, owner: str, ttl_ms: int | float, *, fence: int | None = None
    ) -> LeaseInfo | None:
        """Renew as ``renew_lease``; the renewed lease with the database's new ``expires_at``, or
        None if ``owner`` does not hold an unexpired lease on ``key`` (of tenure ``fence``, if given).
        ``ttl_ms`` in milliseconds; ``TypeError``/``ValueError`` for bad input (``fence`` included) before any SQL."""
        s = self.statements
        return await self._run("renew", key, lambda: operations.renew(s, key, owner, ttl_ms, fence))

    async def renew_many(self, items: Sequence[tuple[Any, ...]]) -> dict[str, LeaseInfo]:
        """Renew many leases at once: each ``(key, owner, ttl_ms)`` or ``(key, owner, ttl_ms, fence)``
        as ``renew_lease_info`` would (keys distinct), in one statement per 1000 items; the renewed
        leases by key. A key missing from the result was refused (expired, not ``owner``'s, or
        another tenure than ``fence``). ``hold()`` renews through it, so
        a process holding thousands of leases sends a few statements per renewal interval.
        ``TypeError``/``ValueError`` for bad items before any SQL; an empty batch sends nothing."""
        checked = operations.validate_renew_items(items)
        if not checked:
            if self._closed:
                raise ProviderClosedError(f"renew: the provider for {self.safe_url} is closed")
            return {}
        return await self._run("renew", None, lambda: operations.renew_checked(self.statements, checked))

    async def acquire_leases(
        self,
        keys: Sequence[str],
        owner: str,
        ttl_ms: int | float,
        *,
        data: dict[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> list[AcquireResult]:
        """Acquire every key of ``keys`` (1 to ``MAX_KEYS`` distinct keys) for ``owner`` for ``ttl_ms``
        milliseconds, or none: the results in the order of ``keys``. All granted: each key its own
        fence (a key the owner holds keeps its tenure and fence, as ``acquire_lease``). Refused:
        nothing is held or changed, each key that blocked names its holder, the others are
        ``AcquireResult(False, None)``. Keys are taken in a fixed order, so overlapping calls never
        deadlock; a deadlock the database reports anyway runs the call again within ``timeout_s``
        seconds (None: ``operation_timeout_s``). ``TypeError``/``ValueError`` before any SQL;
        ``LeaseBackendError`` past the limit."""
        limit = self.operation_timeout_s if timeout_s is None else validate_seconds(timeout_s, "timeout_s")
        s, wait_ms = self.statements, min(limit, self.operation_timeout_s) * LOCK_WAIT_SHARE * 1000
        return await self._run(
            "acquire_leases",
            None,
            lambda: operations.acquire_keys(s, keys, owner, ttl_ms, data=data, lock_wait_ms=wait_ms),
            limit,
        )

    async def release_leases(self, keys: Sequence[str], owner: str, *, fences: Sequence[int] | None = None) -> int:
        """Release ``owner``'s leases on ``keys`` (1 to ``MAX_KEYS`` distinct keys) in one statement; with
        ``fences`` (one fencing token per key, in order), only those tenures: a newer tenure of the same
        owner is left alone. How many unexpired ones were released. ``TypeError``/``ValueError`` for bad
        input (``fences`` included) before any SQL."""
        s = self.statements
        return await self._run("release_leases", None, lambda: operations.release_keys(s, keys, owner, fences))

    async def renew_leases(
        self, keys: Sequence[str], owner: str, ttl_ms: int | float, *, fences: Sequence[int] | None = None
    ) -> list[bool]:
        """Extend ``owner``'s unexpired leases on ``keys`` (1 to ``MAX_KEYS`` distinct keys) to now +
        ``ttl_ms`` milliseconds, in one statement; with ``fences`` (one per key, in order), only those
        tenures. Whether each key was renewed, in the order of ``keys``. ``TypeError``/``ValueError``
        for bad input before any SQL."""
        s = self.statements
        return await self._run("renew_leases", None, lambda: operations.renew_keys(s, keys, owner, ttl_ms, fences))

    async def transfer_lease(
        self,
        key: str,
        from_owner: str,
        to_owner: str,
        ttl_ms: int | float,
        *,
        data: dict[str, Any] | None = None,
        fence: int | None = None,
    ) -> bool:
        """Hand ``from_owner``'s unexpired lease to ``to_owner`` for ``ttl_ms`` ms, atomically (rule 8),
        with lease ``data`` (None: none for a new owner; ``to_owner == from_owner`` keeps it); with
        ``fence``, only the tenure with that fencing token (else False, nothing changes).
        ``TypeError``/``ValueError`` for bad input (``fence`` included) before any SQL."""
        s = self.statements
        return await self._run(
            "transfer", key, lambda: operations.transfer(s, key, from_owner, to_owner, ttl_ms, data, fence)
        )

    async def sweep_expired(self, batch_size: int = 1000, grace_ms: int | float = 0) -> int:
        """Delete up to ``batch_size`` leases that expired at least ``grace_ms`` milliseconds ago, and
        expired semaphore slots.

        Short statements (on PostgreSQL the leases' ``FOR UPDATE SKIP LOCKED``, so it never waits for
        or blocks a concurrent acquire; docs/statements.md, "Sweeping"). Returns how many rows it
        removed, leases and slots; call again while that equals ``batch_size``. Fences stay
        monotonic: they come from a per-table counter, not the rows.
        """
        return await self._run("sweep", None, lambda: operations.sweep(self.statements, batch_size, grace_ms))

    async def list_leases(
        self, prefix: str | None = None, include_expired: bool = False, limit: int = 1000
    ) -> list[LeaseInfo]:
        """Leases ordered by key (the database's collation), at most ``limit`` (1 to 100,000):
        those whose key starts with ``prefix`` (all when None), unexpired ones only unless
        ``include_expired`` (an expired lease has ``remaining_ms <= 0``), each with its ``data``.
        For operators: one bounded read; nothing is locked."""
        s = self.statements
        return await self._run("list", None, lambda: operations.list_leases(s, prefix, include_expired, limit))

    async def break_lease(self, key: str, *, fence: int | None = None) -> LeaseInfo | None:
        """Delete the lease on ``key`` (for operators): whoever holds it, or, with ``fence`` (an
        int from 1 to 2**63-1), only the tenure with that fencing token, so a lease that changed
        hands since you looked is left alone. The lease it broke, or None if there was no such
        unexpired one. The next acquire gets a new, larger fence; the holder's next renewal is
        refused (``hold()`` reports the loss); waiters are woken as by a release.
        ``TypeError``/``ValueError`` for a bad key or fence before any SQL."""
        broken = await self._run("break", key, lambda: operations.break_lease(self.statements, key, fence))
        if broken is not None:
            log.warning("lease %r held by %r (fence %s) broken by an operator", key, broken.owner, broken.fence)
        return broken
