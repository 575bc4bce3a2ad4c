"""Blocking executors for the synchronous provider: run one plan of :mod:`.operations` on one
connection, in autocommit, within a deadline.

- :class:`PsycopgPoolExecutor`: PostgreSQL from a URL, psycopg 3 with a ``psycopg_pool``
  pool of autocommit connections the provider owns (session settings are set on them once).
- :class:`SqliteFileExecutor`: SQLite from a URL, the standard library's ``sqlite3``; a small pool
  of connections (WAL, busy timeout, ``synchronous``), each statement its own write transaction.
- :class:`EngineExecutor`: the application's SQLAlchemy ``Engine`` (psycopg or pysqlite); a
  connection is checked out per operation and goes back unchanged (no ``SET``), so the
  application's pool limits, recycle and pre-ping apply.

Executors raise the driver's exceptions (the provider translates them) and ``StalledError`` when
the deadline passed: a watchdog thread then aborted the statement with no call that can block
the process (a PostgreSQL socket is shut down and a non-blocking cancel request sent from a
thread of its own; a given engine's SQLite connection is interrupted) and the connection is
discarded. On a SQLite file, the wait for another writer's lock (the busy timeout) is cut to
what is left of the deadline instead. In a child process after ``os.fork()`` every executor
starts afresh (:mod:`.forks`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import math
import os
import re
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from ..errors import MissingDriverError, SchemaMissingError
from . import forks
from .operations import run_sync
from .plans import LockRetry, Plan
from .retry import (
    SQLITE_TRY_BUSY_TIMEOUT_MS,
    DeadBeforeSending,
    DeadConnectionRetry,
    SqliteLockWait,
    readable_while_idle,
)
from .rows import mysql_row, named, pyformat
from .setup import sqlite_pragmas, utc_timestamptz_loader
from .statements import OWN_CONNECTION_SETUP
from .translate import connection_survives
from .urls import psycopg_conninfo

__all__ = [
    "EngineExecutor",
    "PsycopgPoolExecutor",
    "PyMysqlPoolExecutor",
    "SqliteFileExecutor",
    "StalledError",
    "SyncExecutor",
    "Watchdog",
    "psycopg_conninfo",
    "run_on_psycopg",
]

T = TypeVar("T")
Row = Sequence[Any]


class StalledError(TimeoutError):
    """The operation passed its deadline; its connection was aborted (the outcome is unknown)."""


def _missing_driver(exc: ImportError) -> MissingDriverError:
    return MissingDriverError(
        "the synchronous PostgreSQL provider needs psycopg 3 and psycopg-pool: "
        f"pip install 'sql-lease[psycopg]' ({exc})",
        name=exc.name,
    )


# -- the watchdog -------------------------------------------------------------------------------


class _Ticket:
    __slots__ = ("abort", "aborted", "deadline")

    def __init__(self, deadline: float, abort: Callable[[], None]) -> None:
        self.deadline = deadline
        self.abort = abort
        self.aborted: threading.Event | None = None  # made (under the watchdog's lock) when it fires


class Watchdog:
    """Aborts operations that pass their deadline. One thread per provider, started on first use;
    it sleeps until the soonest deadline and costs nothing while no operation is in flight."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()  # watch()/done() take it directly: cheaper than the Condition
        self._cond = threading.Condition(self._lock)
        self._active: set[_Ticket] = set()
        self._wake_at = float("inf")
        self._thread: threading.Thread | None = None
        self._closed = False
        forks.on_fork_in_child(self, Watchdog._after_fork_in_child)

    def _after_fork_in_child(self) -> None:
        # The thread is not in the child, and its lock may have been held at the fork.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._active = set()
        self._wake_at = float("inf")
        self._thread = None

    def watch(self, deadline: float, abort: Callable[[], None]) -> _Ticket:
        """Call ``abort()`` (from the watchdog's thread) if :meth:`done` is not called by ``deadline``
        (``time.monotonic()``)."""
        ticket = _Ticket(deadline, abort)
        with self._lock:
            self._active.add(ticket)
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
            if deadline < self._wake_at:
                self._cond.notify()
        return ticket

    def done(self, ticket: _Ticket) -> bool:
        """The operation ended; True if it had been aborted (the caller must then discard its
        connection). Returns only once a started abort has finished."""
        with self._lock:
            self._active.discard(ticket)
            aborted = ticket.aborted
        if aborted is not None:
            aborted.wait()
            return True
        return False

    def _loop(self) -> None:
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                expired = [t for t in self._active if t.deadline <= now]
                if not expired:
                    self._wake_at = min((t.deadline for t in self._active), default=float("inf"))
                    self._cond.wait(None if self._wake_at == float("inf") else self._wake_at - now)
                    self._wake_at = float("inf")
                    continue
                for ticket in expired:
                    self._active.discard(ticket)
                    ticket.aborted = threading.Event()
                self._cond.release()
                try:
                    for ticket in expired:
                        try:
                            ticket.abort()
                        except Exception:
                            pass  # the connection is discarded anyway
                        finally:
                            ticket.aborted.set()  # type: ignore[union-attr]
                finally:
                    self._cond.acquire()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1)


def _guarded(watchdog: Watchdog, deadline: float, abort: Callable[[], None], work: Callable[[], T]) -> tuple[T, bool]:
    """``work()`` aborted by ``abort`` at ``deadline``; (result, whether the connection is spoiled).
    Raises ``StalledError`` (from the driver's error) if the abort ended it."""
    ticket = watchdog.watch(deadline, abort)
    try:
        result = work()
    except BaseException as exc:
        if watchdog.done(ticket):
            raise StalledError("the operation passed its deadline and was aborted") from exc
        raise
    return result, watchdog.done(ticket)


def run_on_psycopg(watchdog: Watchdog, conn: Any, deadline: float, work: Callable[[], T]) -> T:
    """``work()`` on the psycopg connection ``conn``, aborted (socket shut down, no blocking call)
    at ``deadline`` (``time.monotonic()``): then ``StalledError``, and ``conn`` must be discarded."""
    result, spoiled = _guarded(watchdog, deadline, lambda: _shut_socket(conn), work)
    if spoiled:
        raise StalledError("the operation passed its deadline and was aborted")
    return result


StatementHook = Callable[[str, tuple[Any, ...]], None]
Fetch = Callable[[str, tuple[Any, ...]], Any]


def _with_hooks(hooks: list[StatementHook], fetch: Fetch) -> Fetch:
    """``fetch`` that first calls every hook with the statement and its parameters."""

    def hooked(sql: str, params: tuple[Any, ...]) -> Any:
        for hook in list(hooks):
            hook(sql, params)
        return fetch(sql, params)

    return hooked


_NO_DEADLINE_S = 86_400.0  # run(deadline=None): bounded by the longest operation timeout there is


class SyncExecutor:
    """Runs a plan on one connection by a deadline (the interface of :class:`.retry.Executor`, the
    async face's :class:`.executors.AsyncExecutor` without ``await``); ``close()`` ends the pool.
    ``hooks`` are called with ``(sql, params)`` before every statement."""

    dialect_name: str
    hooks: list[StatementHook]
    listens = False  # listen_connection() gives a psycopg connection for LISTEN
    retry = DeadConnectionRetry(0)  # connections found dead before sending, replaced in a row

    def _run_plan(self, plan: Plan[T], fetch_one: Fetch, fetch_all: Fetch, lock_retry: LockRetry | None = None) -> T:
        if self.hooks:
            fetch_one, fetch_all = _with_hooks(self.hooks, fetch_one), _with_hooks(self.hooks, fetch_all)
        return run_sync(plan, fetch_one, fetch_all, lock_retry)

    def run(self, make_plan: Callable[[], Plan[T]], plan: Plan[T] | None = None, deadline: float | None = None) -> T:
        """Run ``plan`` (else ``make_plan()``) by ``deadline`` (``time.monotonic()`` seconds; None:
        no bound of the caller's); ``make_plan`` starts it afresh after a connection was found dead
        before its statement was sent (:class:`.retry.DeadConnectionRetry`)."""
        until = time.monotonic() + _NO_DEADLINE_S if deadline is None else deadline
        for attempt in itertools.count():
            try:
                return self._run_once(make_plan() if plan is None else plan, until)
            except DeadBeforeSending as dead:
                self.retry.again(dead, attempt, until)
                plan = None
        raise AssertionError("unreachable")

    def _run_once(self, plan: Plan[T], deadline: float) -> T:
        raise NotImplementedError

    def listen_connection(self, timeout_s: float) -> tuple[Any, Callable[[], None]]:
        """A connection of its own for LISTEN (not pooled, autocommit), and a function that drops
        it; connecting takes at most about ``timeout_s`` seconds."""
        raise NotImplementedError("no LISTEN on this driver")

    def close(self, timeout_s: float) -> None:
        """Let the executor's own connections go within ``timeout_s`` seconds."""
        raise NotImplementedError


# -- PostgreSQL through psycopg ---------------------------------------------------------------

_CONNECT_FAILURES = (
    # libpq's connection errors carry no SQLSTATE; these server messages (English) name the
    # configuration errors the async face recognises by SQLSTATE (class 28, 3D000).
    (re.compile(r'database "[^"]*" does not exist'), "3D000"),
    (re.compile(r"password authentication failed|role \"[^\"]*\" does not exist|no pg_hba\.conf entry"), "28000"),
    (re.compile(r"permission denied for database"), "42501"),
)


class ConnectError(Exception):
    """A connection attempt failed; ``sqlstate`` as the server would have said it, when known."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(str(exc).strip())
        text = str(exc)
        self.sqlstate: str | None = next((state for pattern, state in _CONNECT_FAILURES if pattern.search(text)), None)


_CANCEL_WITHIN_S = 5.0  # how long a background cancel request may take before it is given up


def _shut_socket(conn: Any) -> None:
    """Break ``conn`` now, from any thread, with no call that can block: the socket is shut down,
    so a thread blocked on it gets an error at once, and a cancel request goes to the server in the
    background (so a statement waiting there stops). The connection object itself is closed by
    its user, who then discards it.

    The cancel is libpq's non-blocking one (``PQcancelStart``, libpq 17 and later), polled from a
    thread that waits in ``select`` with the GIL released. Older libpq has only a blocking cancel,
    which psycopg's C implementation runs holding the GIL (it would stall every thread of the
    process while the server or the link hangs): there it is sent only by the pure Python
    implementation (``ctypes`` releases the GIL), else not at all, and the server notices the
    closed socket when the statement next reads from or writes to it."""
    send = _cancel_sender(conn)  # made before the shutdown, while the connection is whole
    with contextlib.suppress(Exception):
        dup = socket.socket(fileno=os.dup(conn.pgconn.socket))
        try:
            dup.shutdown(socket.SHUT_RDWR)
        finally:
            dup.close()
    if send is not None:
        threading.Thread(target=lambda: _quietly(send), name="sql_lease cancel", daemon=True).start()


def _cancel_sender(conn: Any) -> Callable[[], object] | None:
    """A function that sends a cancel request for ``conn``'s statement without holding the GIL
    while it waits, or None if this psycopg/libpq has none."""
    try:
        from psycopg import capabilities, pq

        if capabilities.has_cancel_safe():
            cancel_conn = conn.pgconn.cancel_conn()  # PQcancelCreate: copies, no I/O
            return lambda: _poll_cancel(cancel_conn, time.monotonic() + _CANCEL_WITHIN_S)
        if pq.__impl__ == "python":
            return conn.pgconn.get_cancel().cancel  # type: ignore[no-any-return]
    except Exception:
        pass
    return None


def _poll_cancel(cancel_conn: Any, deadline: float) -> None:
    """Drive libpq's non-blocking cancel connection to its end, or give up at ``deadline``."""
    import selectors

    from psycopg import pq

    try:
        cancel_conn.start()
        while True:
            status = cancel_conn.poll()
            if status == pq.PollingStatus.READING:
                events = selectors.EVENT_READ
            elif status == pq.PollingStatus.WRITING:
                events = selectors.EVENT_WRITE
            else:
                return  # sent (OK) or failed: either way there is nothing more to do
            left = deadline - time.monotonic()
            if left <= 0:
                return
            with selectors.DefaultSelector() as selector:
                selector.register(cancel_conn.socket, events)
                selector.select(left)
    finally:
        cancel_conn.finish()


def _quietly(call: Callable[[], object]) -> None:
    with contextlib.suppress(Exception):
        call()


def ended_while_idle(conn: Any) -> bool:
    """True when the server ended the idle psycopg connection ``conn`` (sync or async): it is
    closed, or its socket had the server's goodbye to read. Nothing is sent; what arrived is read
    without waiting (libpq's non-blocking ``PQconsumeInput``), so a notification or a parameter
    report stays queued for its owner and the connection counts as alive."""
    try:
        if conn.closed:
            return True
        pgconn = conn.pgconn
        for _ in range(8):  # a goodbye is a message, then the end of the stream: a read each
            if not readable_while_idle(pgconn.socket):
                return bool(pgconn.status != 0)  # 0: CONNECTION_OK
            pgconn.consume_input()
        return False  # still more to read: a busy stream of notifications, not an end
    except Exception:  # the socket is gone, or reading found its end
        return True


class _PgFetch:
    """fetch_one/fetch_all on one psycopg cursor (``$n`` placeholders: RawCursor)."""

    __slots__ = ("cur",)

    def __init__(self, cur: Any) -> None:
        self.cur = cur

    def fetch_one(self, sql: str, params: tuple[Any, ...]) -> Row | None:
        cur = self.cur
        cur.execute(sql, params)
        return cur.fetchone() if cur.description is not None else None  # BEGIN, COMMIT: no result

    def fetch_all(self, sql: str, params: tuple[Any, ...]) -> list[Row]:
        cur = self.cur
        cur.execute(sql, params)
        return cur.fetchall() if cur.description is not None else []  # type: ignore[no-any-return]


class PsycopgPoolExecutor(SyncExecutor):
    """PostgreSQL from a URL: a ``psycopg_pool.ConnectionPool`` of at most ``pool_size`` autocommit
    connections made by the provider, opened on first use."""

    dialect_name = "postgresql"

    def __init__(
        self,
        conninfo: str,
        pool_size: int,
        *,
        pgbouncer: bool,
        watchdog: Watchdog,
        name: str,
        connect_timeout_s: float = 10.0,
    ) -> None:
        try:
            import psycopg
            import psycopg_pool  # noqa: F401
        except ImportError as exc:
            raise _missing_driver(exc) from exc
        self.hooks = []
        self.listens = True
        self.retry = DeadConnectionRetry(pool_size)
        self._conninfo = conninfo
        self._pool_size = pool_size
        self._connect_timeout_s = connect_timeout_s
        self._pgbouncer = pgbouncer
        self._watchdog = watchdog
        self._name = name
        self._pool: Any = None
        self._opening = threading.Lock()
        self._closed = False
        self.last_connect_error: BaseException | None = None
        self._loader = utc_timestamptz_loader()
        self._raw_cursor = psycopg.RawCursor
        forks.on_fork_in_child(self, PsycopgPoolExecutor._after_fork_in_child)

    def _after_fork_in_child(self) -> None:
        # The parent's pool (its sockets, its threads) stays the parent's: a new one on first use.
        forks.abandon(self._pool)
        self._pool = None
        self._opening = threading.Lock()
        self.last_connect_error = None

    def _make_pool(self) -> Any:
        import psycopg
        import psycopg_pool
        from psycopg.conninfo import conninfo_to_dict

        executor = self
        loader = self._loader

        class Connection(psycopg.Connection[Any]):
            sql_lease_fetch: _PgFetch | None = None  # the cursor the provider keeps on it

            @classmethod
            def connect(cls, conninfo: str = "", **kwargs: Any) -> Any:  # type: ignore[override]
                try:
                    conn = super().connect(conninfo, **kwargs)
                except Exception as exc:
                    executor.last_connect_error = exc
                    raise
                executor.last_connect_error = None
                return conn

        setup = () if self._pgbouncer else OWN_CONNECTION_SETUP

        def configure(conn: Any) -> None:
            conn.adapters.register_loader("timestamptz", loader)
            for statement in setup:
                conn.execute(statement)

        kwargs: dict[str, Any] = {"autocommit": True, "cursor_factory": psycopg.RawCursor}
        if "connect_timeout" not in conninfo_to_dict(self._conninfo):
            # A pool thread's connection attempt ends too (libpq counts whole seconds, at least 2).
            kwargs["connect_timeout"] = max(2, math.ceil(self._connect_timeout_s))
        if self._pgbouncer:
            kwargs["prepare_threshold"] = None  # PgBouncer's transaction mode cannot track them
        return psycopg_pool.ConnectionPool(
            self._conninfo,
            connection_class=Connection,
            kwargs=kwargs,
            min_size=0,
            max_size=self._pool_size,
            configure=configure,
            name=self._name,
            open=True,
        )

    def _checkout(self, deadline: float) -> tuple[Any, Any]:
        """(the pool, a connection from it): the connection goes back to that pool, even if
        :meth:`close` has let go of it meanwhile."""
        import psycopg_pool

        pool = self._pool
        if pool is None:
            with self._opening:
                if self._closed:
                    raise RuntimeError("the provider is closed")
                if self._pool is None:
                    self._pool = self._make_pool()
                pool = self._pool
        while True:
            left = deadline - time.monotonic()
            try:
                # In slices, so a connection error that no wait can fix is reported at once.
                return pool, pool.getconn(timeout=max(0.001, min(left, 0.25)))
            except psycopg_pool.PoolTimeout as exc:
                error = self.last_connect_error
                if error is not None and (ConnectError(error).sqlstate or time.monotonic() >= deadline):
                    raise ConnectError(error) from error
                if time.monotonic() >= deadline:
                    raise StalledError("no pooled connection was free in time") from exc
            except psycopg_pool.PoolClosed as exc:
                raise RuntimeError("the provider is closed") from exc

    def _run_once(self, plan: Plan[T], deadline: float) -> T:
        pool, conn = self._checkout(deadline)
        if ended_while_idle(conn):
            with contextlib.suppress(Exception):
                conn.close()
            pool.putconn(conn)
            raise DeadBeforeSending(ConnectionError("the server ended an idle pooled connection"))
        healthy = False
        try:
            # One cursor per connection, kept: a new cursor would look up its row loaders afresh.
            fetch = conn.sql_lease_fetch
            if fetch is None:
                fetch = conn.sql_lease_fetch = _PgFetch(conn.cursor())
            result, spoiled = _guarded(
                self._watchdog,
                deadline,
                lambda: _shut_socket(conn),
                lambda: self._run_plan(plan, fetch.fetch_one, fetch.fetch_all),
            )
            healthy = not spoiled
            return result
        except BaseException as exc:
            healthy = not isinstance(exc, StalledError) and connection_survives(exc)
            raise
        finally:
            if not healthy:
                with contextlib.suppress(Exception):
                    conn.close()
            pool.putconn(conn)  # a closed pool closes it

    def listen_connection(self, timeout_s: float) -> tuple[Any, Callable[[], None]]:
        """A new autocommit connection of its own (not pooled) for LISTEN, and how to close it."""
        import psycopg

        try:
            conn = psycopg.Connection.connect(self._conninfo, autocommit=True, connect_timeout=max(1, round(timeout_s)))
        except psycopg.OperationalError as exc:
            raise ConnectError(exc) from exc
        return conn, conn.close

    def close(self, timeout_s: float) -> None:
        with self._opening:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close(timeout=timeout_s)


# -- SQLite through sqlite3 -----------------------------------------------------------------------


class _SlotPool:
    """At most ``size`` connections, made by ``connect(deadline)`` on demand; idle ones reused
    last-in first-out."""

    def __init__(self, size: int, connect: Callable[[float], Any]) -> None:
        self._size = size
        self._made = 0
        self._idle: list[Any] = []
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)
        self._waiting = 0  # threads in _freed.wait(): give_back notifies only when there are some
        self._connect = connect
        self._closed = False

    def take(self, deadline: float) -> Any:
        with self._lock:
            while True:
                if self._closed:
                    raise RuntimeError("the provider is closed")
                if self._idle:
                    return self._idle.pop()
                if self._made < self._size:
                    self._made += 1
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StalledError("no pooled connection was free in time")
                self._waiting += 1
                try:
                    self._freed.wait(left)
                finally:
                    self._waiting -= 1
        try:
            return self._connect(deadline)
        except BaseException:
            with self._lock:
                self._made -= 1
                if self._waiting:
                    self._freed.notify()
            raise

    def give_back(self, conn: Any, healthy: bool) -> None:
        with self._lock:
            keep = healthy and not self._closed
            if keep:
                self._idle.append(conn)
            else:
                self._made -= 1
            if self._waiting:
                self._freed.notify()
        if not keep:
            with contextlib.suppress(Exception):
                conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            self._made -= len(idle)
            self._freed.notify_all()
        for conn in idle:
            with contextlib.suppress(Exception):
                conn.close()


def _sqlite_fetch_one(conn: sqlite3.Connection) -> Callable[[str, tuple[Any, ...]], Row | None]:
    def fetch_one(sql: str, params: tuple[Any, ...]) -> Row | None:
        # Every row is read: a statement with RETURNING commits only when it has run to the end.
        rows = conn.execute(sql, params).fetchall()
        return rows[0] if rows else None

    return fetch_one


def _sqlite_fetch_all(conn: sqlite3.Connection) -> Callable[[str, tuple[Any, ...]], list[Row]]:
    def fetch_all(sql: str, params: tuple[Any, ...]) -> list[Row]:
        return conn.execute(sql, params).fetchall()

    return fetch_all


def _mysql_fetch(conn: Any) -> tuple[Fetch, Fetch]:
    """Fetch functions on a PyMySQL/mysqlclient connection: ``$n`` as ``%(pn)s``, ``VARBINARY``
    values as text, a statement without a result answering one row, its row count, and a
    multi-statement packet the rows of its last result with columns."""

    def fetch_all(sql: str, params: tuple[Any, ...]) -> list[Row]:
        cursor = conn.cursor()
        try:
            cursor.execute(pyformat(sql), named(params))
            count, rows = cursor.rowcount, None
            while True:  # a multi-statement packet answers its last result with columns
                if cursor.description is not None:
                    rows = cursor.fetchall()
                if not cursor.nextset():
                    break
            return [(count,)] if rows is None else [mysql_row(row) for row in rows]
        finally:
            cursor.close()

    def fetch_one(sql: str, params: tuple[Any, ...]) -> Row | None:
        rows = fetch_all(sql, params)
        return rows[0] if rows else None

    return fetch_one, fetch_all


def mysql_ended_while_idle(conn: Any) -> bool:
    """True when the server ended the idle PyMySQL connection ``conn``: its socket has something to
    read (the server sends nothing unasked to an idle session but its goodbye and end of stream), or
    it is closed. Nothing is sent or read. (mysqlclient's socket is not reachable: False.)"""
    if not hasattr(conn, "_sock"):
        return False
    sock = conn._sock
    try:
        return sock is None or readable_while_idle(sock.fileno())
    except (OSError, ValueError):  # closed meanwhile
        return True


def _shut_mysql_socket(conn: Any) -> None:
    """End a PyMySQL connection's statement now: its socket shut (no call that can block)."""
    sock = getattr(conn, "_sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


class _SlotPoolExecutor(SyncExecutor):
    """Connections the provider owns in a :class:`_SlotPool` of ``pool_size``, each with its fetch
    functions; a forked child starts a pool of its own and never closes (or uses) the parent's."""

    def __init__(self, pool_size: int, watchdog: Watchdog) -> None:
        self.hooks = []
        self._watchdog = watchdog
        self._pool_size = pool_size
        self._pool = _SlotPool(pool_size, self._connect)
        self._fetchers: dict[int, tuple[Any, Any]] = {}
        forks.on_fork_in_child(self, _SlotPoolExecutor._after_fork_in_child)

    def _after_fork_in_child(self) -> None:
        # Closing a parent's connection in the child would end its session (MySQL) or drop the
        # child's own POSIX locks on the file (SQLite): the child opens its own.
        old = self._pool
        forks.abandon(old, self._fetchers)
        self._pool = _SlotPool(self._pool_size, self._connect)
        self._fetchers = {}
        if old._closed:
            self._pool.close()

    def _connect(self, deadline: float) -> Any:
        raise NotImplementedError

    def close(self, timeout_s: float) -> None:
        self._pool.close()
        self._fetchers.clear()


class PyMysqlPoolExecutor(_SlotPoolExecutor):
    """MySQL/MariaDB from a URL: up to ``pool_size`` PyMySQL connections the provider owns
    (``connect_kwargs`` as for ``pymysql.connect``, taken from SQLAlchemy's dialect for the URL),
    autocommit, multi-statement packets; the ``setup`` statements run once on each new connection.
    A statement past its deadline is ended by the watchdog (the socket shut) and its connection
    discarded."""

    dialect_name = "mysql"

    def __init__(
        self, connect_kwargs: dict[str, Any], pool_size: int, *, setup: Sequence[str], watchdog: Watchdog
    ) -> None:
        self.retry = DeadConnectionRetry(pool_size)
        self._connect_kwargs = connect_kwargs
        self._setup = tuple(setup)
        super().__init__(pool_size, watchdog)

    def _connect(self, deadline: float) -> Any:
        import pymysql

        conn = pymysql.connect(**self._connect_kwargs, defer_connect=True)
        fetch_one, fetch_all = _mysql_fetch(conn)

        def connect() -> None:  # the handshake and the setup: aborted at the deadline as a statement is
            conn.connect()
            for statement in self._setup:
                fetch_all(statement, ())

        try:
            if _guarded(self._watchdog, deadline, lambda: _shut_mysql_socket(conn), connect)[1]:
                raise StalledError("the operation passed its deadline and was aborted")
        except BaseException:
            _shut_mysql_socket(conn)  # then close() cannot block on its QUIT
            with contextlib.suppress(Exception):
                conn.close()
            raise
        self._fetchers[id(conn)] = (fetch_one, fetch_all)
        return conn

    def _run_once(self, plan: Plan[T], deadline: float) -> T:
        conn = self._pool.take(deadline)
        healthy = False
        try:
            sock = conn._sock
            if sock is None or readable_while_idle(sock.fileno()):
                # the server ended it while idle (a restart, wait_timeout): nothing was sent
                raise DeadBeforeSending(ConnectionError("the server ended an idle pooled connection"))
            fetch_one, fetch_all = self._fetchers[id(conn)]
            result, spoiled = _guarded(
                self._watchdog,
                deadline,
                lambda: _shut_mysql_socket(conn),
                lambda: self._run_plan(plan, fetch_one, fetch_all),
            )
            healthy = not spoiled
            return result
        except BaseException as exc:
            healthy = not isinstance(exc, (StalledError, DeadBeforeSending)) and connection_survives(exc)
            raise
        finally:
            if not healthy:
                self._fetchers.pop(id(conn), None)
            self._pool.give_back(conn, healthy)


class SqliteFileExecutor(_SlotPoolExecutor):
    """SQLite from a URL: ``sqlite3`` connections in autocommit (``isolation_level=None``), WAL,
    ``busy_timeout`` and ``synchronous`` set when each is opened; the file is opened with
    ``mode=rw``, so a missing file raises ``SchemaMissingError`` and is never created here."""

    dialect_name = "sqlite"

    def __init__(
        self,
        path: Path,
        pool_size: int,
        *,
        busy_timeout_ms: int,
        synchronous: str,
        missing: Callable[[], SchemaMissingError],
        watchdog: Watchdog,
    ) -> None:
        self._path = path
        self._uri = "file:" + quote(str(path), safe="/") + "?mode=rw"
        self._busy_timeout_ms = busy_timeout_ms
        self._pragmas = sqlite_pragmas(busy_timeout_ms, synchronous, retried=True)
        self._missing = missing
        super().__init__(pool_size, watchdog)

    def _connect(self, deadline: float) -> sqlite3.Connection:
        if not self._path.exists():
            raise self._missing()
        try:
            conn = sqlite3.connect(
                self._uri,
                uri=True,
                isolation_level=None,
                check_same_thread=False,
                timeout=min(self._busy_timeout_ms, SQLITE_TRY_BUSY_TIMEOUT_MS) / 1000,
            )
        except sqlite3.OperationalError:
            if not self._path.exists():
                raise self._missing() from None
            raise
        try:
            for pragma in self._pragmas:
                conn.execute(pragma).fetchall()
        except BaseException:
            conn.close()
            raise
        self._fetchers[id(conn)] = (_sqlite_fetch_one(conn), _sqlite_fetch_all(conn))
        return conn

    def _run_once(self, plan: Plan[T], deadline: float) -> T:
        conn = self._pool.take(deadline)
        healthy = False
        try:
            fetch_one, fetch_all = self._fetchers[id(conn)]
            # No watchdog here: the only wait of a lease statement on SQLite is for another
            # writer's lock, bounded above; sqlite3_interrupt() would stop neither it nor a
            # blocked fsync, and the hot path is cheaper without it.
            # SQLite's busy handler does not heed sqlite3_interrupt(): each try waits briefly for
            # another writer's lock, and SqliteLockWait bounds the tries by the time left.
            result = self._run_plan(plan, fetch_one, fetch_all, SqliteLockWait(self._busy_timeout_ms, deadline))
            healthy = True
            return result
        except BaseException as exc:
            healthy = connection_survives(exc)
            raise
        finally:
            if not healthy:
                self._fetchers.pop(id(conn), None)
            self._pool.give_back(conn, healthy)


# -- the application's Engine ---------------------------------------------------------------------


class EngineExecutor(SyncExecutor):
    """The application's SQLAlchemy ``Engine`` (``postgresql+psycopg`` or ``sqlite+pysqlite``): per
    operation one connection is checked out (``with engine.connect()``), its driver connection is
    switched to autocommit by the driver's flag (psycopg ``autocommit``, sqlite3
    ``isolation_level=None``: no statement is sent), the statements run on it, and the flag is put
    back: the connection returns unchanged. At most ``pool_size`` operations run at once.

    While the engine's pool has idle connections and the last operation went well, the checkout
    runs inline (a ``pool_pre_ping`` is then bounded only by the engine's own settings, e.g.
    libpq's ``tcp_user_timeout`` or keepalives in ``connect_args``). Otherwise (no idle connection,
    or after a connection was aborted or lost) it runs in a thread of its own and is given up at
    the deadline; a connection that arrives later goes back to the engine's pool."""

    def __init__(self, engine: Any, pool_size: int, *, watchdog: Watchdog, owned: bool = False) -> None:
        self.hooks = []
        self._engine = engine
        self._owned = owned  # the provider made it (MySQL URLs): disposed on close
        self.dialect_name = engine.dialect.name
        self.listens = self.dialect_name == "postgresql"
        idle_checks = {
            "postgresql": ended_while_idle,
            "mysql": mysql_ended_while_idle,
            "mariadb": mysql_ended_while_idle,
        }
        self._ended_while_idle = idle_checks.get(self.dialect_name)
        size = getattr(engine.pool, "size", None)
        self.retry = DeadConnectionRetry((size() if callable(size) else 5) + 2)
        self._pool_size = pool_size
        self._slots = threading.BoundedSemaphore(pool_size)
        self._watchdog = watchdog
        self._connecting: concurrent.futures.ThreadPoolExecutor | None = None
        self._connecting_lock = threading.Lock()
        self._late: set[concurrent.futures.Future[Any]] = set()  # checkouts given up, still running
        self._suspect = False  # a connection was aborted or lost: check out under the deadline
        # The engine's pool is the application's to reset in a child (SQLAlchemy documents
        # engine.dispose(close=False)); the slots taken by the parent's threads are not the child's.
        forks.on_fork_in_child(self, EngineExecutor._after_fork_in_child)
        if self.dialect_name == "postgresql":
            import psycopg

            self._raw_cursor = psycopg.RawCursor
            self._loader = utc_timestamptz_loader()

    def _run_once(self, plan: Plan[T], deadline: float) -> T:
        if not self._slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise StalledError("no connection slot was free in time")
        try:
            with self._checkout(deadline) as connection:
                raw = connection.connection.driver_connection
                if self._ended_while_idle is not None and self._ended_while_idle(raw):
                    # died while idle in the application's pool (a database restart, no pre-ping)
                    self._suspect = True
                    connection.invalidate()
                    raise DeadBeforeSending(ConnectionError("the server ended an idle pooled connection"))
                spoiled = True
                prepare: Callable[[], None] | None = None
                fetch_one: Callable[[str, tuple[Any, ...]], Row | None]
                fetch_all: Callable[[str, tuple[Any, ...]], list[Row]]
                # Autocommit by the driver's own flag, put back as it was afterwards (no statement
                # is sent for either): SQLAlchemy's AUTOCOMMIT option would leave its isolation
                # level reset behind on the connection.
                if self.dialect_name == "postgresql":
                    before: Any = raw.autocommit
                    raw.autocommit = True
                    cur = self._raw_cursor(raw)
                    cur.adapters.register_loader("timestamptz", self._loader)  # this cursor only
                    fetch = _PgFetch(cur)
                    fetch_one, fetch_all = fetch.fetch_one, fetch.fetch_all

                    def abort() -> None:
                        _shut_socket(raw)

                    def restore() -> None:
                        raw.autocommit = before
                elif self.dialect_name in ("mysql", "mariadb"):
                    before = raw.get_autocommit()  # read from the last server status: no round trip
                    if not before:  # a statement: sent under the watchdog, with the plan's
                        prepare = lambda: raw.autocommit(True)  # noqa: E731
                    fetch_one, fetch_all = _mysql_fetch(raw)

                    def abort() -> None:
                        _shut_mysql_socket(raw)

                    def restore() -> None:
                        # a statement too: under the watchdog (aborted, the connection is dropped)
                        if not before and _guarded(self._watchdog, deadline, abort, lambda: raw.autocommit(False))[1]:
                            raise StalledError("the operation passed its deadline and was aborted")
                else:
                    before = raw.isolation_level
                    raw.isolation_level = None
                    fetch_one, fetch_all = _sqlite_fetch_one(raw), _sqlite_fetch_all(raw)
                    abort = raw.interrupt

                    def restore() -> None:
                        raw.isolation_level = before

                def work() -> T:
                    if prepare is not None:
                        prepare()
                    return self._run_plan(plan, fetch_one, fetch_all)

                try:
                    result, spoiled = _guarded(self._watchdog, deadline, abort, work)
                    self._suspect = spoiled
                    return result
                except BaseException as exc:
                    spoiled = isinstance(exc, StalledError) or not connection_survives(exc)
                    self._suspect = spoiled
                    raise
                finally:
                    if spoiled:
                        connection.invalidate()
                    else:
                        try:
                            restore()
                        except Exception:
                            connection.invalidate()
                            raise
        finally:
            self._slots.release()

    def _after_fork_in_child(self) -> None:
        self._slots = threading.BoundedSemaphore(self._pool_size)
        forks.abandon(self._connecting)  # its threads are not in the child
        self._connecting = None
        self._connecting_lock = threading.Lock()

    def _checkout(self, deadline: float) -> Any:
        """A ``Connection`` of the engine, by ``deadline`` (``StalledError`` after it)."""
        checkedin = getattr(self._engine.pool, "checkedin", None)
        if not self._suspect and checkedin is not None and checkedin() > 0:
            return self._engine.connect()  # an idle connection, believed alive: no connection attempt
        with self._connecting_lock:
            if self._connecting is None:
                self._connecting = concurrent.futures.ThreadPoolExecutor(
                    self._pool_size, thread_name_prefix="sql_lease connect"
                )
            future = self._connecting.submit(self._engine.connect)
        try:
            return future.result(timeout=max(0.0, deadline - time.monotonic()))
        except concurrent.futures.TimeoutError:
            self._late.add(future)
            future.add_done_callback(self._give_back)  # back to the engine's pool when it comes
            self._suspect = True
            raise StalledError("no connection from the engine in time") from None

    def listen_connection(self, timeout_s: float) -> tuple[Any, Callable[[], None]]:
        """A connection of the engine's pool kept for LISTEN (autocommit); discarded, not returned,
        when done, so the application never gets it back LISTENing."""
        proxied = self._engine.raw_connection()
        driver = proxied.driver_connection
        try:
            driver.autocommit = True
        except BaseException:
            proxied.invalidate()
            raise
        return driver, proxied.invalidate

    def _give_back(self, future: concurrent.futures.Future[Any]) -> None:
        if not future.cancelled() and future.exception() is None:
            with contextlib.suppress(Exception):
                future.result().close()
        self._late.discard(future)

    def close(self, timeout_s: float) -> None:
        """The engine belongs to the application: only the threads that connect for it end, after
        giving back (within ``timeout_s``) the connections still arriving."""
        with self._connecting_lock:
            connecting, self._connecting = self._connecting, None
        if connecting is not None:
            concurrent.futures.wait(list(self._late), timeout=timeout_s)
            connecting.shutdown(wait=False)
        if self._owned:
            self._engine.dispose()
