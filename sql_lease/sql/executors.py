"""Async executors: where a plan's statements run. One small interface, three implementations.

- :class:`AsyncpgPoolExecutor`: a PostgreSQL URL. Up to ``pool_size`` asyncpg connections owned by
  the provider; session settings are applied once per new connection, and giving a connection back
  costs no round trip (lease statements leave no transaction and no session state to reset).
- :class:`AiosqlitePoolExecutor`: a SQLite URL. A small pool of aiosqlite connections in
  autocommit (each statement its own write transaction), WAL, a busy timeout.
- :class:`EngineExecutor`: the application's ``AsyncEngine``. Every operation checks a connection
  out of that engine and runs through SQLAlchemy (``exec_driver_sql``), so the application's pool
  limits, recycle, pre-ping, events and instrumentation all apply; autocommit is SQLAlchemy's
  ``AUTOCOMMIT`` isolation level on a view of the engine (public API; SQLAlchemy puts the level back
  when the connection returns to the pool), and nothing is held between operations.

``run(make_plan)`` runs one plan on one connection. A connection whose statement failed in a way
that may leave it unusable (timeout, cancellation, lost connection) is dropped, never reused; a
connection found dead before its statement was sent (a database restart while it sat idle) is
replaced and the plan runs again from the start. Errors are left to the provider, which maps them
in one place (:mod:`sql_lease.sql.translate`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import os
import threading
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Generic, TypeVar
from urllib.parse import quote

from sqlalchemy.ext.asyncio import AsyncEngine

from ..errors import ProviderClosedError
from .operations import run_async
from .plans import LockRetry, Plan
from .retry import DeadBeforeSending, DeadConnectionRetry, SqliteLockWait
from .rows import mysql_row, named, pyformat
from .translate import connection_survives, mysql_not_sent

__all__ = [
    "AiosqlitePoolExecutor",
    "AsyncExecutor",
    "AsyncmyPoolExecutor",
    "AsyncpgPoolExecutor",
    "EngineExecutor",
    "LentPoolExecutor",
]

T = TypeVar("T")
S = TypeVar("S")
Row = Sequence[Any]
StatementHook = Callable[[str, tuple[Any, ...]], None]
Fetch = Callable[[str, tuple[Any, ...]], Awaitable[Sequence[Row]]]


class AsyncExecutor:
    """Runs plans (the interface of :class:`.retry.AsyncExecutorInterface`, the sync face's
    :class:`.sync_executors.SyncExecutor` awaited); ``listen_connection()`` opens a driver
    connection of its own (PostgreSQL LISTEN)."""

    listens = False  # listen_connection() gives an asyncpg connection for LISTEN

    def __init__(self, retries: int = 3) -> None:
        self.hooks: list[StatementHook] = []
        self.retry = DeadConnectionRetry(retries)  # connections found dead before sending, replaced in a row

    async def run(
        self, make_plan: Callable[[], Plan[T]], plan: Plan[T] | None = None, deadline: float | None = None
    ) -> T:
        """Run ``plan`` (else ``make_plan()``); ``make_plan`` starts it afresh after a connection
        was found dead before its statement was sent (:class:`.retry.DeadConnectionRetry`).
        ``deadline``: ``time.monotonic()`` seconds, or None when the caller bounds the call."""
        attempt = 0
        while True:
            try:
                return await self._run_once(make_plan, plan, deadline)
            except DeadBeforeSending as dead:
                self.retry.again(dead, attempt, deadline)
                plan, attempt = None, attempt + 1

    async def _run_once(self, make_plan: Callable[[], Plan[T]], plan: Plan[T] | None, deadline: float | None) -> T:
        raise NotImplementedError

    def _execute(
        self,
        make_plan: Callable[[], Plan[T]],
        plan: Plan[T] | None,
        fetch: Fetch,
        lock_retry: LockRetry | None = None,
    ) -> Awaitable[T]:
        """``plan`` (else ``make_plan()``) run with ``fetch`` on one connection, each statement shown
        to the hooks first."""
        if self.hooks:
            fetch = _shown_to(self.hooks, fetch)
        return run_async(make_plan() if plan is None else plan, fetch, lock_retry)

    async def listen_connection(self, timeout_s: float) -> tuple[Any, Callable[[], Awaitable[None]]]:
        """A driver connection kept apart from the pool (for LISTEN), and a coroutine function that
        drops it; the caller bounds the wait (``timeout_s``, seconds, is the operation timeout)."""
        raise NotImplementedError("no LISTEN on this driver")

    async def close(self, timeout_s: float) -> None:
        """Let the executor's own connections go, closing idle ones politely for at most
        ``timeout_s`` seconds (then they are terminated)."""
        raise NotImplementedError


def _shown_to(hooks: list[StatementHook], fetch: Fetch) -> Fetch:
    async def fetch_shown(sql: str, params: tuple[Any, ...]) -> Sequence[Row]:
        for hook in hooks:
            hook(sql, params)
        return await fetch(sql, params)

    return fetch_shown


def _counted(fetch: Fetch) -> tuple[Fetch, list[int]]:
    """``fetch``, and a one-item list counting the statements it was asked to send."""
    count = [0]

    def counting(sql: str, params: tuple[Any, ...]) -> Awaitable[Sequence[Row]]:
        count[0] += 1
        return fetch(sql, params)

    return counting, count


def _asyncpg_dead_before_sending(exc: BaseException, driver_conn: Any) -> bool:
    """asyncpg checks that a connection is open before it writes, and raises InterfaceError."""
    import asyncpg

    return isinstance(exc, asyncpg.InterfaceError) and driver_conn.is_closed()


# -- one state per event loop and process ---------------------------------------------------------

_FORKED_AWAY: list[Any] = []
"""What a forked child inherited from its parent (pools, their sockets and threads): never used,
closed or freed in the child, so the parent's connections and event loop stay untouched."""


class _Holder:
    __slots__ = ("close", "live")

    def __init__(self, close: Callable[[], Awaitable[None]]) -> None:
        self.close = close
        self.live = True


async def _until_loop_ends(holder: _Holder) -> AsyncGenerator[None, None]:
    """Suspended in the loop that made it; ``asyncio.run`` closes it as the loop ends
    (``shutdown_asyncgens``), while the loop still runs, and it then closes the state politely."""
    try:
        yield
    finally:
        if holder.live:
            holder.live = False
            await holder.close()


class LoopLocal(Generic[S]):
    """One ``S`` per event loop and process, made by ``make()`` on first use in a loop.

    When ``asyncio.run`` (or any runner that shuts down async generators) ends a loop, that loop's
    state is closed by ``close(state)`` in it. A state whose loop was closed otherwise is given to
    ``abandon(state)`` (synchronous: nothing can be awaited on a closed loop). In a process forked
    after use, every inherited state is left alone (never closed: its sockets are the parent's)
    and the child makes its own."""

    def __init__(
        self, make: Callable[[], S], close: Callable[[S], Awaitable[None]], abandon: Callable[[S], None]
    ) -> None:
        self._make, self._close, self._abandon = make, close, abandon
        self._pid = os.getpid()
        self._states: dict[asyncio.AbstractEventLoop, tuple[S, _Holder, AsyncGenerator[None, None]]] = {}
        self._last: tuple[asyncio.AbstractEventLoop, S] | None = None
        self._lock = threading.Lock()  # threads running loops of their own share _states; never held across an await
        self._lock_pid = self._pid

    def _locked(self) -> threading.Lock:
        """The lock of ``_states`` in this process (a fork may have copied it while held)."""
        if self._lock_pid != os.getpid():
            self._lock, self._lock_pid = threading.Lock(), os.getpid()
        return self._lock

    def current(self) -> S:
        """The state of the running loop in this process."""
        loop = asyncio.get_running_loop()
        last = self._last
        if last is not None and last[0] is loop and self._pid == os.getpid():
            return last[1]
        return self._switch(loop)

    def _switch(self, loop: asyncio.AbstractEventLoop) -> S:
        with self._locked():
            if self._pid != os.getpid():  # forked: the parent's states are not ours to touch
                _FORKED_AWAY.append(self._states)
                self._states, self._pid = {}, os.getpid()
            gone = [self._states.pop(other) for other in [other for other in self._states if other.is_closed()]]
            found = self._states.get(loop)
            if found is None:
                state = self._make()
                holder = _Holder(functools.partial(self._close, state))
                sentinel = _until_loop_ends(holder)
                with contextlib.suppress(StopIteration):  # runs to its yield; the loop now knows it
                    sentinel.asend(None).send(None)
                found = self._states[loop] = (state, holder, sentinel)
            self._last = (loop, found[0])
        for state, holder, sentinel in gone:
            self._retire(state, holder, sentinel)
        return found[0]

    def _retire(self, state: S, holder: _Holder, sentinel: AsyncGenerator[None, None]) -> None:
        """Close a state whose loop is gone without awaiting, and end its sentinel quietly."""
        live, holder.live = holder.live, False
        with contextlib.suppress(StopIteration, RuntimeError):
            sentinel.aclose().send(None)
        if live:
            self._abandon(state)

    def states(self) -> list[S]:
        """This process's states, one per loop."""
        with self._locked():
            return [] if self._pid != os.getpid() else [state for state, _, _ in self._states.values()]

    async def close(self) -> None:
        """Close the running loop's state (awaited), every other loop's: a closed loop's by
        ``abandon``, a live one's by ``close`` scheduled in that loop."""
        with self._locked():
            if self._pid != os.getpid():
                _FORKED_AWAY.append(self._states)
                self._states, self._pid = {}, os.getpid()
            states, self._states, self._last = self._states, {}, None
        running = asyncio.get_running_loop()
        for loop, (state, holder, sentinel) in states.items():
            if loop is running:
                await sentinel.aclose()  # runs close(state) unless it ran already
            elif loop.is_closed():
                self._retire(state, holder, sentinel)
            else:
                with contextlib.suppress(RuntimeError):
                    asyncio.run_coroutine_threadsafe(sentinel.aclose(), loop)


CLOSE_BUDGET_S = 1.0
"""How long ``close()`` waits for its idle connections to close politely (seconds)."""


class _Connections:
    """At most ``size`` asyncpg connections, each lent to one operation at a time, most recently
    used first. (asyncpg's own pool costs 35-40% of the throughput of dedicated connections with 8
    concurrent workers on 2 cores, measured with ``SELECT 1``: a timeout and a holder per acquire.
    Lending a connection here is one deque operation, and giving it back sends nothing.)"""

    def __init__(self, connect: Callable[[], Any], size: int) -> None:
        self._connect = connect
        self._size = size
        self._idle: collections.deque[Any] = collections.deque()
        self._waiters: collections.deque[asyncio.Future[Any]] = collections.deque()
        self._open = 0
        self.closed = False

    def take_idle(self) -> Any:
        """An idle connection, most recently used first, or None (then ``await take()``)."""
        while self._idle:
            conn = self._idle.pop()
            if not conn.is_closed():
                return conn
            self._open -= 1  # died while idle (a database restart): replace it
        return None

    async def take(self) -> Any:
        while True:
            conn = self.take_idle()
            if conn is not None:
                return conn
            if self.closed:
                raise ProviderClosedError("the provider is closed")
            if self._open < self._size:
                self._open += 1
                try:
                    return await self._connect()
                except BaseException:
                    self._open -= 1
                    self._wake(None)
                    raise
            waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                conn = await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():  # woken just as we gave up: pass it on
                    handed = waiter.result()
                    if handed is not None:
                        self.give(handed, healthy=True)
                    else:
                        self._wake(None)  # the room to open a connection goes to the next waiter
                raise
            if conn is not None:
                return conn
            # None: a connection was dropped, so there is room to open one

    def give(self, conn: Any, *, healthy: bool) -> None:
        if not healthy or self.closed or conn.is_closed():
            self._open -= 1
            if not conn.is_closed():
                conn.terminate()  # at once: a graceful close could wait seconds
            self._wake(None)
        elif not (self._waiters and self._wake(conn)):
            self._idle.append(conn)

    def _wake(self, conn: Any) -> bool:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return True
        return False

    def abandon(self) -> None:
        """Drop every idle connection of a closed event loop without I/O or awaiting (asyncpg
        marks each closed; the loop that could have closed its socket is gone)."""
        self.closed = True
        idle, self._idle = list(self._idle), collections.deque()
        self._open -= len(idle)
        for conn in idle:
            with contextlib.suppress(Exception):
                conn.terminate()

    async def close(self, within_s: float = CLOSE_BUDGET_S) -> None:
        """Close the idle connections politely, all at once, within ``within_s`` seconds; a network
        that does not answer gets them terminated instead (never a wait per connection)."""
        self.closed = True
        idle, self._idle = list(self._idle), collections.deque()
        self._open -= len(idle)
        while self._wake(None):
            pass
        if idle:
            closing = [asyncio.ensure_future(conn.close()) for conn in idle]
            await asyncio.wait(closing, timeout=within_s)
            for conn, task in zip(idle, closing, strict=True):
                if not task.done():
                    task.cancel()
                    conn.terminate()
                elif not task.cancelled() and task.exception() is not None:
                    conn.terminate()


class LentPoolExecutor(AsyncExecutor):
    """The provider's own driver connections, up to ``size`` per event loop and process, lent by
    :class:`_Connections`; a driver supplies how to connect, fetch, and tell a dead connection."""

    def __init__(self, size: int) -> None:
        super().__init__(retries=size)
        self._close_within_s = CLOSE_BUDGET_S
        self._pools: LoopLocal[_Connections] = LoopLocal(
            lambda: _Connections(self._new_connection, size),
            lambda pool: pool.close(self._close_within_s),
            _Connections.abandon,
        )
        self._closed = False

    @property
    def _connections(self) -> _Connections:
        """The pool of the running event loop in this process (connections belong to one loop)."""
        if self._closed:
            raise ProviderClosedError("the provider is closed")
        return self._pools.current()

    async def _new_connection(self) -> Any:
        raise NotImplementedError

    def _fetch(self, conn: Any) -> Fetch:
        """The statement runner of the lent connection ``conn``."""
        raise NotImplementedError

    def _dead_before_sending(self, conn: Any, exc: BaseException | None) -> bool:
        """Whether ``conn`` was found dead before a statement was sent: idle (``exc`` None), or by
        the error its statement raised."""
        return False

    async def _run_once(self, make_plan: Callable[[], Plan[T]], plan: Plan[T] | None, deadline: float | None) -> T:
        connections = self._connections
        conn = connections.take_idle() or await connections.take()
        if self._dead_before_sending(conn, None):
            connections.give(conn, healthy=False)
            raise DeadBeforeSending(ConnectionError("the server ended an idle pooled connection"))
        healthy = False
        fetch, sent = _counted(self._fetch(conn))
        try:
            result = await self._execute(make_plan, plan, fetch)
            healthy = True
            return result
        except BaseException as exc:
            healthy = connection_survives(exc)
            # only while no statement of the plan was sent (the failing one is the first)
            if sent[0] <= 1 and self._dead_before_sending(conn, exc):
                raise DeadBeforeSending(exc) from exc
            raise
        finally:
            connections.give(conn, healthy=healthy)

    async def close(self, timeout_s: float) -> None:
        self._closed = True
        self._close_within_s = min(timeout_s, CLOSE_BUDGET_S)
        await self._pools.close()


class AsyncpgPoolExecutor(LentPoolExecutor):
    """The provider's own asyncpg connections for a PostgreSQL URL (``connect_kwargs`` as for
    ``asyncpg.connect``); the ``setup`` statements run once on each new connection."""

    listens = True

    def __init__(self, connect_kwargs: dict[str, Any], size: int, setup: Sequence[str]) -> None:
        super().__init__(size)
        self._connect_kwargs = connect_kwargs
        self._setup = tuple(setup)

    async def _new_connection(self) -> Any:
        import asyncpg

        conn = await asyncpg.connect(**self._connect_kwargs)
        try:
            for statement in self._setup:
                await conn.execute(statement)
        except BaseException:
            conn.terminate()
            raise
        return conn

    def _fetch(self, conn: Any) -> Fetch:
        return lambda sql, params: conn.fetch(sql, *params)  # type: ignore[no-any-return]

    def _dead_before_sending(self, conn: Any, exc: BaseException | None) -> bool:
        # idle: take_idle() already skipped closed ones; asyncpg checks before it writes
        return exc is not None and _asyncpg_dead_before_sending(exc, conn)

    async def listen_connection(self, timeout_s: float) -> tuple[Any, Callable[[], Awaitable[None]]]:
        import asyncpg

        conn = await asyncpg.connect(**self._connect_kwargs)

        async def drop() -> None:
            conn.terminate()

        return conn, drop


class _AsyncmyConnection:
    """An asyncmy connection as :class:`_Connections` lends it (``is_closed``, ``terminate``,
    ``close``), with its statement runner."""

    __slots__ = ("conn", "cursor")

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.cursor = conn.cursor()  # one per connection: a statement drains what the last one left

    def is_closed(self) -> bool:
        return not self.conn.connected

    def ended_while_idle(self) -> bool:
        """The server ended the idle connection (its end of stream arrived): nothing was sent."""
        return bool(getattr(self.conn, "_stream_broken", False))

    def terminate(self) -> None:
        self.conn.close()  # the transport closed at once, no QUIT

    async def close(self) -> None:
        await self.conn.ensure_closed()

    async def fetch(self, sql: str, params: tuple[Any, ...]) -> list[Row]:
        """The rows of the packet's last result with columns, else one row: the first row count."""
        cursor = self.cursor
        await cursor.execute(pyformat(sql), named(params))
        count, rows = cursor.rowcount, None
        while True:
            if cursor.description is not None:
                rows = await cursor.fetchall()
            if not await cursor.nextset():
                break
        return [(count,)] if rows is None else [mysql_row(row) for row in rows]


class AsyncmyPoolExecutor(LentPoolExecutor):
    """The provider's own asyncmy connections for a MySQL/MariaDB URL (``connect_kwargs`` as for
    ``asyncmy.connect``, taken from SQLAlchemy's dialect for the URL): autocommit, multi-statement
    packets; the ``setup`` statements run once on each new connection."""

    def __init__(self, connect_kwargs: dict[str, Any], size: int, setup: Sequence[str]) -> None:
        super().__init__(size)
        self._connect_kwargs = connect_kwargs
        self._setup = tuple(setup)

    async def _new_connection(self) -> Any:
        import asyncmy

        conn = _AsyncmyConnection(await asyncmy.connect(**self._connect_kwargs))
        try:
            for statement in self._setup:
                await conn.fetch(statement, ())
        except BaseException:
            conn.terminate()
            raise
        return conn

    def _fetch(self, conn: Any) -> Fetch:
        return conn.fetch  # type: ignore[no-any-return]

    def _dead_before_sending(self, conn: Any, exc: BaseException | None) -> bool:
        return exc is None and conn.ended_while_idle()


class _SqlitePool:
    """One event loop's aiosqlite connections: idle ones, the slots, the closes in flight."""

    __slots__ = ("closing", "idle", "slots")

    def __init__(self, size: int) -> None:
        self.idle: collections.deque[Any] = collections.deque()
        self.slots = asyncio.Semaphore(size)
        self.closing: set[asyncio.Future[Any]] = set()


class AiosqlitePoolExecutor(AsyncExecutor):
    """Up to ``size`` aiosqlite connections to the SQLite file ``path`` (which must exist: only
    migrations create it) per event loop, most recently used first. Each connection runs
    ``pragmas`` when opened, which set a short busy timeout (:data:`.retry.SQLITE_TRY_BUSY_TIMEOUT_MS`):
    a statement that met another writer's lock is tried again for up to ``busy_timeout_ms``
    (:class:`.retry.SqliteLockWait`)."""

    def __init__(
        self, path: Path, size: int, pragmas: Sequence[str], missing: Callable[[], Exception], busy_timeout_ms: int
    ) -> None:
        super().__init__()
        self._path = path
        self._pragmas = tuple(pragmas)
        self._busy_timeout_ms = busy_timeout_ms
        self._missing = missing
        self._pools: LoopLocal[_SqlitePool] = LoopLocal(lambda: _SqlitePool(size), self._close_pool, self._abandon)
        self._closed = False

    async def _connect(self) -> Any:
        import aiosqlite

        if not self._path.exists():
            raise self._missing()
        try:  # mode=rw: never create the file (it may vanish between the check and the open)
            conn = await aiosqlite.connect(f"file:{quote(str(self._path))}?mode=rw", uri=True, isolation_level=None)
        except Exception as exc:
            if not self._path.exists():
                raise self._missing() from exc
            raise
        try:
            for pragma in self._pragmas:
                await conn.execute_fetchall(pragma, ())
        except BaseException:
            await conn.close()
            raise
        return conn

    @staticmethod
    def _drop(pool: _SqlitePool, conn: Any, interrupt: bool = True) -> None:
        """Stop ``conn``'s statement now (``sqlite3_interrupt``) and close it in the background: a
        statement waiting in SQLite's busy handler may hold its thread a while longer."""
        if interrupt:  # not for idle ones: an interrupted close skips its WAL checkpoint
            with contextlib.suppress(Exception):
                conn._conn.interrupt()  # thread-safe by SQLite's contract; aiosqlite's own queues behind it
        closing = asyncio.ensure_future(conn.close())
        pool.closing.add(closing)
        closing.add_done_callback(pool.closing.discard)
        closing.add_done_callback(lambda done: done.cancelled() or done.exception())

    async def _run_once(self, make_plan: Callable[[], Plan[T]], plan: Plan[T] | None, deadline: float | None) -> T:
        if self._closed:
            raise ProviderClosedError("the provider is closed")
        pool = self._pools.current()
        async with pool.slots:
            if self._closed:
                raise ProviderClosedError("the provider is closed")
            conn = pool.idle.pop() if pool.idle else await self._connect()
            try:
                lock_wait = SqliteLockWait(self._busy_timeout_ms, deadline)
                result = await self._execute(make_plan, plan, conn.execute_fetchall, lock_wait)
            except BaseException as exc:
                self._give_back(pool, conn, connection_survives(exc))
                raise
            self._give_back(pool, conn, True)
            return result

    def _give_back(self, pool: _SqlitePool, conn: Any, healthy: bool) -> None:
        if healthy and not self._closed:
            pool.idle.append(conn)
        else:
            self._drop(pool, conn, interrupt=not healthy)

    async def _close_pool(self, pool: _SqlitePool) -> None:
        while pool.idle:
            self._drop(pool, pool.idle.pop(), interrupt=False)
        if pool.closing:  # let the connections' threads finish while their loop still runs
            await asyncio.wait(set(pool.closing), timeout=5)

    @staticmethod
    def _abandon(pool: _SqlitePool) -> None:
        """A closed loop's idle connections: each is closed in its own thread, not awaited
        (aiosqlite's ``stop()``; its threads need no event loop)."""
        while pool.idle:
            with contextlib.suppress(Exception):
                pool.idle.pop().stop()

    async def close(self, timeout_s: float) -> None:
        self._closed = True
        await self._pools.close()


class EngineExecutor(AsyncExecutor):
    """The application's ``AsyncEngine`` (asyncpg, psycopg or aiosqlite): one checkout per
    operation, through SQLAlchemy's public API, in autocommit (SQLAlchemy's ``AUTOCOMMIT`` isolation
    level on an engine view sharing the application's pool, put back when the connection returns;
    no driver attribute is set here)."""

    def __init__(self, engine: AsyncEngine, owned: bool = False) -> None:
        """``owned``: the provider made ``engine`` in AUTOCOMMIT (no level to set at each checkout)."""
        super().__init__()
        self._given = engine
        self._owned = owned  # made by the provider (its connections set up by setup.run_at_connect)
        self._pid = os.getpid()
        self._asyncpg = engine.dialect.name == "postgresql" and engine.dialect.driver == "asyncpg"
        self._psycopg = engine.dialect.name == "postgresql" and engine.dialect.driver == "psycopg"
        self._mysql = engine.dialect.name in ("mysql", "mariadb")
        # SQLAlchemy's AUTOCOMMIT, on a view of the engine sharing the application's pool: set at
        # checkout, put back at checkin (public API only; no driver attribute is set here). MySQL's
        # is a statement: set on the checked-out connection, where a connection that died idle can
        # be given back (failing in the view's checkout, SQLAlchemy would leave it checked out).
        self._autocommit_after_checkout = self._mysql and not owned
        plain = owned or self._autocommit_after_checkout
        self._engine = engine if plain else engine.execution_options(isolation_level="AUTOCOMMIT")
        self.listens = self._asyncpg
        pool = engine.sync_engine.pool
        size = getattr(pool, "size", None)
        self.retry = DeadConnectionRetry((size() if callable(size) else 5) + 2)

    async def _run_once(self, make_plan: Callable[[], Plan[T]], plan: Plan[T] | None, deadline: float | None) -> T:
        if self._owned and self._pid != os.getpid():
            # forked: the pool's connections are the parent's (SQLAlchemy's recipe for a child)
            self._pid = os.getpid()
            await self._given.dispose(close=False)
        conn = await _checkout(self._engine)
        try:
            if self._autocommit_after_checkout:
                try:
                    await conn.execution_options(isolation_level="AUTOCOMMIT")
                except Exception as exc:
                    with contextlib.suppress(Exception):
                        await asyncio.shield(conn.invalidate())
                    if mysql_not_sent(exc):  # died while idle in the application's pool
                        raise DeadBeforeSending(exc) from exc
                    raise
            driver_conn: Any = None
            if self._asyncpg:
                # read through the synchronous Connection (public; no greenlet hop, unlike
                # get_raw_connection(): 15-20 us of CPU per operation)
                sync_conn = conn.sync_connection
                raw = sync_conn.connection if sync_conn is not None else await conn.get_raw_connection()
                driver_conn = raw.driver_connection
                if driver_conn is not None and driver_conn.is_closed():
                    # died while idle in the application's pool (a database restart, no pre-ping)
                    await conn.invalidate()
                    raise DeadBeforeSending(ConnectionError("a pooled connection was closed"))
            fetch: Fetch
            if self._psycopg:
                fetch = _psycopg_rows(conn)
            elif self._mysql:
                fetch = _mysql_rows(conn)
            else:
                fetch = lambda sql, params: _rows(conn, sql, params)  # noqa: E731
            fetch, sent = _counted(fetch)
            try:
                return await self._execute(make_plan, plan, fetch)
            except BaseException as exc:
                # a statement that found the connection closed fails as one that does not survive
                # (SQLAlchemy wraps asyncpg's InterfaceError): not run again, its plan may have sent
                # statements before it; a connection that died idle was caught above
                if not connection_survives(exc):
                    with contextlib.suppress(Exception):
                        await asyncio.shield(conn.invalidate())
                # MySQL: the plan's first statement found the connection closed (it died idle)
                if self._mysql and sent[0] <= 1 and mysql_not_sent(exc):
                    raise DeadBeforeSending(exc) from exc
                raise
        finally:
            await _checkin(conn)

    async def listen_connection(self, timeout_s: float) -> tuple[Any, Callable[[], Awaitable[None]]]:
        conn = await self._engine.connect()
        try:
            driver_conn = (await conn.get_raw_connection()).driver_connection
        except BaseException:
            await conn.close()
            raise

        async def drop() -> None:
            with contextlib.suppress(Exception):
                await conn.invalidate()  # never give a LISTENing connection back to the pool
                await conn.close()

        return driver_conn, drop

    async def close(self, timeout_s: float) -> None:
        """Nothing to do: the engine and its pool belong to the application."""


async def _checkout(engine: AsyncEngine) -> Any:
    """A started ``AsyncConnection`` of ``engine``. The checkout runs shielded: a caller cancelled
    meanwhile gets ``CancelledError`` at once and the connection, when it arrives, goes back to the
    pool (a checkout cut short would leave it neither in the pool nor closed)."""
    conn = engine.connect()
    starting = asyncio.ensure_future(conn.start())
    try:
        await asyncio.shield(starting)
    except asyncio.CancelledError:

        def arrived(done: asyncio.Future[Any]) -> None:
            if not done.cancelled() and done.exception() is None:
                _closing(conn).add_done_callback(lambda closed: closed.cancelled() or closed.exception())

        starting.add_done_callback(arrived)
        raise
    return conn


_CLOSING: set[asyncio.Future[Any]] = set()  # closes in flight (a task needs a reference until done)


def _closing(conn: Any) -> asyncio.Future[Any]:
    """``conn.close()`` (back to its pool) as a task kept referenced until it is done."""
    closing: asyncio.Future[Any] = asyncio.ensure_future(conn.close())
    _CLOSING.add(closing)
    closing.add_done_callback(_CLOSING.discard)
    return closing


async def _checkin(conn: Any) -> None:
    """Give ``conn`` back to its pool, shielded from the caller's cancellation (as :func:`_checkout`)."""
    await asyncio.shield(_closing(conn))


async def _rows(conn: Any, sql: str, params: tuple[Any, ...]) -> list[Row]:
    result = await conn.exec_driver_sql(sql, params)
    return list(result.fetchall()) if result.returns_rows else []


def _mysql_rows(conn: Any) -> Fetch:
    async def fetch(sql: str, params: tuple[Any, ...]) -> list[Row]:
        result = await conn.exec_driver_sql(pyformat(sql), named(params))
        if not result.returns_rows:  # a statement without a result answers its row count
            return [(result.rowcount,)]
        return [mysql_row(row) for row in result.fetchall()]

    return fetch


def _utc(row: Sequence[Any]) -> Row:
    """A row with its ``timestamptz`` values in UTC (psycopg gives them in the session's TimeZone)."""
    return tuple(value.astimezone(UTC) if isinstance(value, datetime) else value for value in row)


def _psycopg_rows(conn: Any) -> Fetch:
    async def fetch(sql: str, params: tuple[Any, ...]) -> list[Row]:
        result = await conn.exec_driver_sql(pyformat(sql), named(params))
        return [_utc(row) for row in result.fetchall()] if result.returns_rows else []

    return fetch
