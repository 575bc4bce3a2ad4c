"""``SyncSqlLeaseProvider``: the synchronous face of the SQL provider, for threads.

The same plans as the async provider (:mod:`.operations`: every statement, retry rule and decoding
step), run by blocking executors (:mod:`.sync_executors`): psycopg 3 with ``psycopg_pool`` on
PostgreSQL, the standard library's ``sqlite3`` on SQLite, or the application's SQLAlchemy
``Engine``. Driver errors become the library's errors in :mod:`.translate`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import create_engine
from sqlalchemy.engine import URL, Engine
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import NullPool

from .. import observe
from ..contract import AcquireResult, LeaseInfo, SyncLeaseProviderBase, validate_key, validate_limit, validate_seconds
from ..errors import LeaseBackendError, LeaseError, ProviderClosedError, SchemaMissingError
from . import forks, operations, setup
from .operations import LOCK_WAIT_SHARE, Plan
from .options import validate_provider_options
from .schema import DEFAULT_TABLE_NAME, LeaseTableNames
from .statements import LeaseStatements, statements_for
from .sync_executors import (
    EngineExecutor,
    PsycopgPoolExecutor,
    PyMysqlPoolExecutor,
    SqliteFileExecutor,
    SyncExecutor,
    Watchdog,
    psycopg_conninfo,
)
from .translate import describe, operation_label, translate
from .urls import safe_url, sqlite_file, to_async_url, to_sync_url

if TYPE_CHECKING:
    from .sync_notify import SyncNotifyListener, SyncPostgresReleaseWaiter

__all__ = ["SyncSqlLeaseProvider"]

T = TypeVar("T")
log = logging.getLogger("sql_lease")
_ENGINE_DRIVERS_IN_WORDS = (
    "psycopg (postgresql+psycopg), PyMySQL or mysqlclient (mysql+pymysql, mysql+mysqldb) "
    "or the standard sqlite3 (sqlite+pysqlite)"
)


class SyncSqlLeaseProvider(SyncLeaseProviderBase):
    """Leases in a PostgreSQL or SQLite table, with plain (blocking) methods, safe to share between
    threads (gunicorn threads, a thread pool, Celery workers). The same rules, statements and errors
    as :class:`~sql_lease.SqlLeaseProvider`; the method names are the same, without ``await``.

    Args:
        url_or_engine: a URL or a SQLAlchemy ``Engine``. URLs: ``postgresql://``, ``postgres://``,
            ``postgresql+psycopg://``, ``postgresql+psycopg2://``, ``postgresql+asyncpg://`` (all
            run on psycopg 3 with a ``psycopg_pool`` pool the provider owns) and ``sqlite:///path``
            (``sqlite+pysqlite``, ``sqlite+aiosqlite``: the standard library's ``sqlite3``). A
            SQLite URL must name a file in an existing directory (else ``ValueError``); only
            :meth:`migrate` creates the file, and other operations on a missing file raise
            ``SchemaMissingError``. An ``Engine`` must be ``postgresql+psycopg`` or
            ``sqlite+pysqlite``; it is shared, never disposed, and nothing is ``SET`` on its
            connections: each operation checks one out and gives it back.
        table_name, schema, version_table: where the lease table is (as ``SqlLeaseProvider``).
        operation_timeout_s: every operation (pool checkout included) completes within this many
            seconds or raises ``LeaseBackendError`` (a stalled statement is aborted and its
            connection discarded). Default 10; more than 0, at most 86400. (For a given engine,
            checking a connection out of its pool is bounded by the engine's own ``pool_timeout``.)
        pool_size: at most this many operations run at once. Default 10 for a URL, 2 for a given
            engine (leaving the rest of its pool to the application).
        sqlite_busy_timeout_ms: SQLite only: how long a statement waits for another writer, in
            milliseconds, 0 to 2**31 - 1. Default: the operation timeout.
        sqlite_synchronous: SQLite ``PRAGMA synchronous``: ``"FULL"`` (default), ``"NORMAL"`` or
            ``"EXTRA"``.
        listen_notify: PostgreSQL: waiters LISTEN on one connection (a listener thread) and wake
            within milliseconds of a release; False: they poll.
        pgbouncer: PostgreSQL through PgBouncer (or any transaction-pooling proxy) in transaction
            mode: no prepared statements (``prepare_threshold=None``), no session settings (the
            durability pin goes in each transaction instead), no LISTEN. Required there, also for
            durability (docs/statements.md, "Durability").

    A provider used before ``os.fork()`` works in the child: the child opens connections of its
    own and never uses or closes the parent's (a given ``Engine``'s pool is the application's to
    reset there, e.g. ``engine.dispose(close=False)``).

    Every method also takes a keyword ``timeout_s`` (seconds, at most ``operation_timeout_s``)
    that bounds that one call. Raises ``TypeError``/``ValueError`` for bad arguments before any
    SQL; ``SchemaMissingError``, ``LeaseConfigError``, ``LeaseBackendError`` (the driver's error on
    ``__cause__``) as the async provider; ``ProviderClosedError`` after :meth:`close`. Use it as
    ``with SyncSqlLeaseProvider(url) as leases:`` or call :meth:`close`.
    """

    accepts_limit = True
    """``acquire_lease`` takes ``limit`` (a semaphore of N slots; ``hold()`` passes it when not 1)."""
    accepts_fence = True
    """``release_lease``, ``renew_lease(_info)``, ``transfer_lease`` take ``fence``, and ``release_lease``
    ``min_hold_ms`` (``hold()`` passes them)."""

    def __init__(
        self,
        url_or_engine: str | URL | Engine,
        *,
        table_name: str = DEFAULT_TABLE_NAME,
        schema: str | None = None,
        version_table: str | None = None,
        operation_timeout_s: float = 10.0,
        pool_size: int | None = None,
        sqlite_busy_timeout_ms: int | None = None,
        sqlite_synchronous: str = "FULL",
        listen_notify: bool = True,
        pgbouncer: bool = False,
    ) -> None:
        self._closed = True  # until constructed: close() and __del__ find nothing to do
        self.names = LeaseTableNames(table_name, schema, version_table)
        checked = validate_provider_options(operation_timeout_s, pool_size, sqlite_busy_timeout_ms, sqlite_synchronous)
        self.operation_timeout_s = checked.operation_timeout_s
        self._watchdog = Watchdog("sql_lease watchdog")
        self._engine: Engine | None = None
        executor: SyncExecutor
        if isinstance(url_or_engine, AsyncEngine):
            raise TypeError("an AsyncEngine belongs to SqlLeaseProvider; SyncSqlLeaseProvider takes a URL or an Engine")
        if isinstance(url_or_engine, Engine):
            dialect = url_or_engine.dialect
            backend = setup.engine_backend(
                dialect.name, dialect.driver, setup.SYNC_ENGINE_DRIVERS, _ENGINE_DRIVERS_IN_WORDS
            )
            self._engine = url_or_engine
            self._url = url_or_engine.url
            executor = EngineExecutor(url_or_engine, pool_size or 2, watchdog=self._watchdog)
        elif isinstance(url_or_engine, (str, URL)):
            url = to_sync_url(url_or_engine)
            self._url = url
            backend = url.get_backend_name()
            if backend == "postgresql":
                executor = PsycopgPoolExecutor(
                    psycopg_conninfo(url),
                    pool_size or 10,
                    pgbouncer=bool(pgbouncer),
                    watchdog=self._watchdog,
                    name="sql_lease",
                    connect_timeout_s=self.operation_timeout_s,
                )
            elif backend == "mysql" and url.get_driver_name() not in setup.MYSQL_OWN_DRIVERS:
                executor = EngineExecutor(
                    setup.mysql_engine(setup.mysql_driver_checked(url), pool_size or 10, self.operation_timeout_s),
                    pool_size or 10,
                    watchdog=self._watchdog,
                    owned=True,
                )
            elif backend == "mysql":
                executor = PyMysqlPoolExecutor(
                    setup.mysql_connect_kwargs(
                        create_engine(setup.mysql_driver_checked(url), poolclass=NullPool), self.operation_timeout_s
                    ),
                    pool_size or 10,
                    setup=setup.mysql_session_setup(self.operation_timeout_s),
                    watchdog=self._watchdog,
                )
            else:
                path = sqlite_file(url)
                if path is None or url.query:
                    raise ValueError(
                        "SyncSqlLeaseProvider takes sqlite:///path/to/file.db URLs without query parameters"
                    )
                executor = SqliteFileExecutor(
                    setup.sqlite_directory(path),
                    pool_size or 10,
                    busy_timeout_ms=setup.sqlite_busy_timeout(
                        sqlite_busy_timeout_ms, self.operation_timeout_s, backend
                    ),
                    synchronous=sqlite_synchronous,
                    missing=functools.partial(setup.database_file_missing, self.names, path),
                    watchdog=self._watchdog,
                )
        else:
            raise TypeError(
                f"url_or_engine must be a URL string, sqlalchemy URL or Engine, not {type(url_or_engine).__name__}"
            )
        setup.sqlite_busy_timeout(sqlite_busy_timeout_ms, self.operation_timeout_s, backend)  # ValueError if not SQLite
        self._executor = executor
        self.dialect_name = backend
        own_postgres = isinstance(executor, PsycopgPoolExecutor) and not pgbouncer
        self.statements: LeaseStatements = statements_for(
            backend,
            self.names,
            durable_session=own_postgres,
            sqlite_quick_first=isinstance(executor, SqliteFileExecutor),
            mysql_lock_wait_s=setup.mysql_lock_wait_s(self.operation_timeout_s) if self._engine is None else None,
            mysql_packed=isinstance(executor, PyMysqlPoolExecutor),
        )
        self.safe_url = safe_url(self._url)
        self.listen_notify = bool(listen_notify) and not pgbouncer
        self._listener: SyncNotifyListener | None = None
        self._listener_lock = threading.Lock()
        self._in_flight: set[object] = set()  # a token per call (set.add/discard need no lock)
        self._closed = False
        forks.on_fork_in_child(self, SyncSqlLeaseProvider._after_fork_in_child)

    def _after_fork_in_child(self) -> None:
        # The parent's calls in flight are not the child's (close() would wait for them).
        self._in_flight = set()
        self._listener_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"SyncSqlLeaseProvider({getattr(self, 'safe_url', '?')!r}, table_name={self.names.table!r})"

    @property
    def engine(self) -> Engine | None:
        """The application's ``Engine`` this provider borrows connections from, or None (a URL)."""
        return self._engine

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    def on_statement(self, callback: Callable[[str, tuple[Any, ...]], None]) -> Callable[[], None]:
        """Call ``callback(sql, params)`` (from the calling thread) before every lease statement this
        provider sends, for tests, logs and metrics; returns a function that removes it."""
        self._executor.hooks.append(callback)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._executor.hooks.remove(callback)

        return remove

    def __enter__(self) -> SyncSqlLeaseProvider:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Let operations in flight finish (each ends within ``operation_timeout_s``), stop the
        LISTEN thread, and close the provider's own connections (a given engine is left to its
        owner). Later operations raise ``ProviderClosedError``. Idempotent."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + self.operation_timeout_s + 1
        while self._in_flight and time.monotonic() < deadline:
            time.sleep(0.005)
        with self._listener_lock:
            listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        self._executor.close(self.operation_timeout_s)
        self._watchdog.close()

    def migrate_command_options(self) -> str:
        """The CLI options that name this provider's table, for hints in messages."""
        return setup.migrate_command_options(self.names)

    def _schema_missing(self, exc: BaseException) -> SchemaMissingError:
        return setup.schema_missing(self.names, self.safe_url, exc)

    # -- running plans ------------------------------------------------------------------------

    def _limit(self, timeout_s: float | None) -> float:
        if timeout_s is None:
            return self.operation_timeout_s
        limit = validate_seconds(timeout_s, "timeout_s")
        if limit <= 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s!r}")
        return min(limit, self.operation_timeout_s)

    def _run(self, operation: str, key: str | None, make_plan: Callable[[], Plan[T]], timeout_s: float | None) -> T:
        """Run the plan ``make_plan()`` within the limit; errors become the library's. Every
        operation passes here, and here alone it is reported to observers (:mod:`sql_lease.observe`)."""
        plan = make_plan()  # validates the arguments before any I/O (and before closed-ness)
        limit = self._limit(timeout_s)
        if not observe.observers:
            return self._run_plan(operation, key, make_plan, plan, limit)
        started = time.perf_counter()
        try:
            result = self._run_plan(operation, key, make_plan, plan, limit)
        except BaseException as exc:
            observe.operation_failed(operation, key, self.dialect_name, time.perf_counter() - started, exc)
            raise
        observe.operation_done(operation, key, self.dialect_name, time.perf_counter() - started, result)
        return result

    def _run_plan(
        self, operation: str, key: str | None, make_plan: Callable[[], Plan[T]], plan: Plan[T], limit: float
    ) -> T:
        if self._closed:
            plan.close()
            raise ProviderClosedError(f"{operation_label(operation, key)}: the provider for {self.safe_url} is closed")
        token = object()
        self._in_flight.add(token)
        try:
            return self._executor.run(make_plan, plan, time.monotonic() + limit)
        except LeaseError:
            raise
        except TimeoutError as exc:
            what = operation_label(operation, key)
            raise LeaseBackendError(f"{what}: no answer from {self.safe_url} within {limit:g} s") from exc
        except Exception as exc:
            what = operation_label(operation, key)
            if self._closed and isinstance(exc, RuntimeError):
                raise ProviderClosedError(f"{what}: the provider for {self.safe_url} was closed") from exc
            raise translate(exc, what, self.safe_url, self._schema_missing) from exc
        finally:
            self._in_flight.discard(token)

    # -- the lease operations -----------------------------------------------------------------

    def acquire_lease(
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
        storing lease ``data``, with ``limit`` (1: a plain lease; N >= 2: one of N slots of a
        semaphore, checked first) as :meth:`SqlLeaseProvider.acquire_lease` does."""
        validate_limit(limit)
        return self._acquire(key, owner, ttl_ms, waiting=False, data=data, timeout_s=timeout_s, limit=limit)

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
    ) -> AcquireResult:
        s, wait_ms = self.statements, self._limit(timeout_s) * LOCK_WAIT_SHARE * 1000
        return self._run(
            "acquire",
            key,
            lambda: operations.acquire(
                s, key, owner, ttl_ms, waiting=waiting, data=data, lock_wait_ms=wait_ms, limit=limit
            ),
            timeout_s,
        )

    def get_lease_owner(self, key: str, *, timeout_s: float | None = None) -> str | None:
        """The owner of the unexpired lease on ``key``, or None (rule 5)."""
        return self._run("get owner of", key, lambda: operations.get_owner(self.statements, key), timeout_s)

    def get_lease(self, key: str, *, timeout_s: float | None = None) -> LeaseInfo | None:
        """The unexpired lease on ``key`` (owner, fence, expiry, remaining ms, data), or None."""
        return self._run("read", key, lambda: operations.get_lease(self.statements, key), timeout_s)

    def get_lease_holders(self, key: str, *, timeout_s: float | None = None) -> list[LeaseInfo]:
        """Every unexpired holder of ``key``, oldest tenure first (then fence): each slot holder of a
        semaphore, or the plain lease ([] or one). ``TypeError``/``ValueError`` for a bad key before any SQL."""
        return self._run("read holders of", key, lambda: operations.get_holders(self.statements, key), timeout_s)

    def release_lease(
        self,
        key: str,
        owner: str,
        *,
        fence: int | None = None,
        min_hold_ms: int | float | None = None,
        timeout_s: float | None = None,
    ) -> bool:
        """Release ``key`` if ``owner`` holds it unexpired; True iff it did (rule 6). ``fence`` and
        ``min_hold_ms`` (milliseconds) as :meth:`SqlLeaseProvider.release_lease`.
        ``TypeError``/``ValueError`` for bad input (``fence`` included) before any SQL."""
        s = self.statements
        return self._run("release", key, lambda: operations.release(s, key, owner, fence, min_hold_ms), timeout_s)

    def renew_lease(
        self,
        key: str,
        owner: str,
        ttl_ms: int | float,
        *,
        fence: int | None = None,
        timeout_s: float | None = None,
    ) -> bool:
        """Extend ``owner``'s unexpired lease to now + ``ttl_ms`` milliseconds (rule 7); with ``fence``,
        only the tenure with that fencing token; a released lease (kept by ``min_hold_ms``) is refused.
        ``TypeError``/``ValueError`` for bad input (``fence`` included) before any SQL."""
        return self.renew_lease_info(key, owner, ttl_ms, fence=fence, timeout_s=timeout_s) is not None

    def renew_lease_info(
        self,
        key: str,
        owner: str,
        ttl_ms: int | float,
        *,
        fence: int | None = None,
        timeout_s: float | None = None,
    ) -> LeaseInfo | None:
        """Renew as ``renew_lease``; the renewed lease with the database's new ``expires_at``, or
        None if ``owner`` does not hold an unexpired lease on ``key`` (of tenure ``fence``, if given).
        ``ttl_ms`` in milliseconds; ``TypeError``/``ValueError`` for bad input (``fence`` included) before any SQL."""
        s = self.statements
        return self._run("renew", key, lambda: operations.renew(s, key, owner, ttl_ms, fence), timeout_s)

    def acquire_leases(
        self,
        keys: Sequence[str],
        owner: str,
        ttl_ms: int | float,
        *,
        data: dict[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> list[AcquireResult]:
        """Acquire every key of ``keys`` for ``owner`` or none, in the order of ``keys``, as
        :meth:`SqlLeaseProvider.acquire_leases` does."""
        s, wait_ms = self.statements, self._limit(timeout_s) * LOCK_WAIT_SHARE * 1000
        return self._run(
            "acquire_leases",
            None,
            lambda: operations.acquire_keys(s, keys, owner, ttl_ms, data=data, lock_wait_ms=wait_ms),
            timeout_s,
        )

    def release_leases(
        self, keys: Sequence[str], owner: str, *, fences: Sequence[int] | None = None, timeout_s: float | None = None
    ) -> int:
        """Release ``owner``'s leases on ``keys`` (of ``fences``' tenures, if given) in one statement; how
        many unexpired ones were released (:meth:`SqlLeaseProvider.release_leases`)."""
        s = self.statements
        return self._run("release_leases", None, lambda: operations.release_keys(s, keys, owner, fences), timeout_s)

    def renew_leases(
        self,
        keys: Sequence[str],
        owner: str,
        ttl_ms: int | float,
        *,
        fences: Sequence[int] | None = None,
        timeout_s: float | None = None,
    ) -> list[bool]:
        """Renew ``owner``'s unexpired leases on ``keys`` (of ``fences``' tenures, if given) in one
        statement; whether each was renewed (:meth:`SqlLeaseProvider.renew_leases`)."""
        s = self.statements
        return self._run("renew_leases", None, lambda: operations.renew_keys(s, keys, owner, ttl_ms, fences), timeout_s)

    def transfer_lease(
        self,
        key: str,
        from_owner: str,
        to_owner: str,
        ttl_ms: int | float,
        *,
        data: dict[str, Any] | None = None,
        fence: int | None = None,
        timeout_s: float | None = None,
    ) -> bool:
        """Hand ``from_owner``'s unexpired lease to ``to_owner`` for ``ttl_ms`` ms, atomically (rule 8),
        with lease ``data`` and ``fence`` as :meth:`SqlLeaseProvider.transfer_lease`.
        ``TypeError``/``ValueError`` for bad input (``fence`` included) before any SQL."""
        s = self.statements
        return self._run(
            "transfer", key, lambda: operations.transfer(s, key, from_owner, to_owner, ttl_ms, data, fence), timeout_s
        )

    def sweep_expired(
        self, batch_size: int = 1000, grace_ms: int | float = 0, *, timeout_s: float | None = None
    ) -> int:
        """Delete up to ``batch_size`` leases that expired at least ``grace_ms`` milliseconds ago, and
        expired semaphore slots; how many it removed, leases and slots (call again while that equals ``batch_size``).
        The statements are in docs/statements.md, "Sweeping"."""
        return self._run("sweep", None, lambda: operations.sweep(self.statements, batch_size, grace_ms), timeout_s)

    def list_leases(
        self,
        prefix: str | None = None,
        include_expired: bool = False,
        limit: int = 1000,
        *,
        timeout_s: float | None = None,
    ) -> list[LeaseInfo]:
        """Leases ordered by key, at most ``limit`` (1 to 100,000), whose key starts with ``prefix``
        (all when None); unexpired ones only unless ``include_expired`` (``remaining_ms <= 0``);
        each with its ``data``."""
        s = self.statements
        return self._run("list", None, lambda: operations.list_leases(s, prefix, include_expired, limit), timeout_s)

    def break_lease(self, key: str, *, fence: int | None = None, timeout_s: float | None = None) -> LeaseInfo | None:
        """Delete the lease on ``key`` (for operators): whoever holds it, or, with ``fence``, only
        the tenure with that fencing token. The lease it broke, or None if there was no such
        unexpired one. The next acquire gets a larger fence; the holder's next renewal is refused.
        See :meth:`SqlLeaseProvider.break_lease`."""
        broken = self._run("break", key, lambda: operations.break_lease(self.statements, key, fence), timeout_s)
        if broken is not None:
            log.warning("lease %r held by %r (fence %s) broken by an operator", key, broken.owner, broken.fence)
        return broken

    # -- fenced writes: in the caller's transaction, on the caller's connection -------------------

    def check_held(self, conn: Any, key: str, owner: str, fence: int) -> None:
        """Raise ``LeaseLostError`` unless ``owner`` holds ``key`` with exactly ``fence``, unexpired by
        the database's clock; run it inside your transaction (``conn``: your SQLAlchemy
        ``Connection`` or ``Session`` on the lease table's database), before you commit.

        PostgreSQL locks the lease row (``FOR SHARE``) until your transaction ends; SQLite takes the
        write lock. Renewals, transfers and takeovers of that key wait for your transaction. See
        :meth:`SqlLeaseProvider.check_held`."""
        from .fencing import check_held_sync

        check_held_sync(conn, self.names, key, owner, fence)

    def accept_fence(self, conn: Any, resource: str, fence: int) -> int:
        """Record ``fence`` for ``resource`` in your transaction and return it; ``StaleFenceError``
        if a larger fence was accepted already. See :meth:`SqlLeaseProvider.accept_fence`."""
        from .fencing import accept_fence_sync

        return accept_fence_sync(conn, self.names, resource, fence)

    # -- waiting --------------------------------------------------------------------------------

    def release_waiter(self, key: str) -> SyncPostgresReleaseWaiter | None:
        """The wake-up hook of :func:`sql_lease.sync_holding.acquire_lease_wait`: on PostgreSQL
        (unless ``listen_notify=False``) a waiter woken by NOTIFY; None elsewhere (waiters poll)."""
        if self.dialect_name != "postgresql" or not self.listen_notify or not self._executor.listens:
            return None
        from .sync_notify import SyncNotifyListener, SyncPostgresReleaseWaiter

        key = validate_key(key)
        with self._listener_lock:
            if self._closed:
                raise ProviderClosedError(f"wait for {key!r}: the provider for {self.safe_url} is closed")
            if self._listener is None:
                self._listener = SyncNotifyListener(
                    self._executor.listen_connection,
                    self.statements.notify_channel or "",
                    lambda: self._closed,
                    self.operation_timeout_s,
                    self.names.table,
                    self._watchdog,
                )
            return SyncPostgresReleaseWaiter(self._listener, key, self._acquire)

    # -- migrations -----------------------------------------------------------------------------

    def migrate(self) -> str | None:
        """Create or upgrade the lease table to the newest schema (Alembic ``upgrade head``); the
        schema revision now in place. Idempotent, safe from several processes at once; needs DDL
        privileges. On PostgreSQL it runs on psycopg (a short-lived engine for a URL, or the given
        engine); on SQLite on a short-lived aiosqlite engine (in a thread of its own if this one
        runs an event loop), which also creates a missing database file."""
        if self._closed:
            raise ProviderClosedError(f"migrate: the provider for {self.safe_url} is closed")
        try:
            if self.dialect_name == "postgresql":
                return self._migrate_postgres()
            return self._migrate_sqlite()
        except LeaseError:
            raise
        except Exception as exc:
            raise LeaseBackendError(f"migrating {self.safe_url} failed: {describe(exc)}") from exc

    def _migrate_postgres(self) -> str | None:
        # The steps of migrate.upgrade_engine, on a synchronous connection (no asyncpg needed).
        import sqlalchemy as sa

        from .migrate import upgrade_sync_engine

        engine = self._engine or sa.create_engine(self._url, poolclass=sa.pool.NullPool)
        try:
            return upgrade_sync_engine(engine, self.names)
        finally:
            if engine is not self._engine:
                engine.dispose()

    def _migrate_sqlite(self) -> str | None:
        from sqlalchemy.ext.asyncio import create_async_engine

        from .migrate import upgrade_engine

        async_url = to_async_url(self._url)

        async def upgrade() -> str | None:
            engine = create_async_engine(async_url, pool_size=1, max_overflow=0)
            try:
                return await upgrade_engine(engine, self.names)
            finally:
                await engine.dispose()

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(upgrade())
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, upgrade()).result()

    def __del__(self) -> None:
        # A provider dropped without close(): its pool threads must not keep the process alive.
        # At interpreter exit, daemon threads are frozen, maybe holding the locks close() takes.
        if not getattr(self, "_closed", True) and not sys.is_finalizing():
            try:
                self._closed = True
                self._executor.close(0.1)
                self._watchdog.close()
            except Exception:
                pass
