"""Driver connections kept checked out of the engine's pool for lease statements.

Checking a connection out of SQLAlchemy's pool and back in for every statement costs several
greenlet switches and event-loop tasks, more than the statement itself on a local database. The
provider instead takes up to ``size`` connections out of the engine's pool once and reuses their
driver connections (asyncpg or aiosqlite) directly: an operation is then one hand-over from a deque
and one statement. SQLAlchemy still makes, configures and finally disposes the connections.

A connection that failed in a way that may leave it unusable (timeout, cancellation, network
error) is aborted at once and discarded in the background; one whose socket closed while idle
(a database restart) is noticed and replaced before it is handed out.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

log = logging.getLogger("sql_lease")

Slot = tuple[AsyncConnection, Any]  # (SQLAlchemy connection kept checked out, its driver connection)

_background_tasks: set[asyncio.Task[Any]] = set()


def in_background(coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
    """Run ``coroutine`` to completion without anyone waiting for it; its errors are logged."""
    task = asyncio.ensure_future(coroutine)
    _background_tasks.add(task)

    def done(finished: asyncio.Task[Any]) -> None:
        _background_tasks.discard(finished)
        if not finished.cancelled() and finished.exception() is not None:
            log.debug("sql_lease background cleanup failed: %r", finished.exception())

    task.add_done_callback(done)
    return task


async def _discard(conn: AsyncConnection) -> None:
    await conn.invalidate()
    await conn.close()


class ConnectionSlots:
    """At most ``size`` driver connections, lent to one operation at a time, most recent first."""

    def __init__(
        self,
        engine: AsyncEngine,
        size: int,
        prepare: Callable[[Any], Coroutine[Any, Any, None]],
        is_usable: Callable[[Any], bool],
    ) -> None:
        self._engine = engine
        self._size = size
        self._prepare = prepare
        self._is_usable = is_usable
        self._idle: collections.deque[Slot] = collections.deque()
        self._waiters: collections.deque[asyncio.Future[Slot | None]] = collections.deque()
        self._open = 0
        self._closed = False
        self._cleanups: set[asyncio.Task[Any]] = set()

    @property
    def size(self) -> int:
        return self._size

    @property
    def open_connections(self) -> int:
        return self._open

    async def take(self) -> Slot:
        """A slot for one operation; give it back with :meth:`give_back` (no await needed)."""
        while True:
            while self._idle:
                slot = self._idle.pop()
                if self._is_usable(slot[1]):
                    return slot
                self._forget(slot)
            if self._closed:
                raise RuntimeError("the provider is closed")
            if self._open < self._size:
                return await self._new_slot()
            waiter: asyncio.Future[Slot | None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                handed = await waiter
            except asyncio.CancelledError:
                handed_late = waiter.result() if waiter.done() and not waiter.cancelled() else None
                if handed_late is not None:
                    self.give_back(handed_late, healthy=True)  # handed over just as we gave up
                raise
            if handed is not None:
                return handed
            # None: a connection was dropped, so there is room to open one; loop and take it

    async def _new_slot(self) -> Slot:
        # The engine's pool may hold connections that died while idle (a database restart): skip
        # them, as many as the pool could hold, before giving up.
        for _ in range(self._size + 10):
            slot = await self._checkout_one()
            if self._is_usable(slot[1]):
                return slot
            self._forget(slot)
        raise ConnectionError("every connection the engine's pool handed out was already closed")

    async def _checkout_one(self) -> Slot:
        self._open += 1
        checkout = asyncio.ensure_future(self._engine.connect())
        try:
            conn = await asyncio.shield(checkout)  # a half-done checkout would orphan the connection
        except BaseException:
            self._open -= 1
            self._wake_one(None)

            def return_it(done: asyncio.Future[AsyncConnection]) -> None:
                if not done.cancelled() and done.exception() is None:
                    in_background(done.result().close())

            checkout.add_done_callback(return_it)
            raise
        try:
            driver_conn = (await conn.get_raw_connection()).driver_connection
            if not self._is_usable(driver_conn):
                return conn, driver_conn  # dead in the engine's pool: the caller drops it
            await self._prepare(driver_conn)
        except BaseException:
            self._open -= 1
            self._wake_one(None)
            self._track(in_background(_discard(conn)))
            raise
        return conn, driver_conn

    def give_back(self, slot: Slot, *, healthy: bool) -> None:
        """Return a slot after an operation; ``healthy=False`` discards its connection."""
        if not healthy or self._closed:
            self._forget(slot, close_only=healthy)
            self._wake_one(None)
            return
        if not self._wake_one(slot):
            self._idle.append(slot)

    def _wake_one(self, slot: Slot | None) -> bool:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(slot)
                return True
        return False

    def _forget(self, slot: Slot, close_only: bool = False) -> None:
        self._open -= 1
        self._track(in_background(slot[0].close() if close_only else _discard(slot[0])))

    def _track(self, task: asyncio.Task[Any]) -> None:
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    async def close(self) -> None:
        """Return every idle connection to the engine's pool; busy ones follow when given back."""
        self._closed = True
        idle, self._idle = list(self._idle), collections.deque()
        for conn, _ in idle:
            self._open -= 1
            await conn.close()
        while self._wake_one(None):
            pass
        if self._cleanups:  # let discarded connections finish closing while their loop still runs
            await asyncio.wait(set(self._cleanups), timeout=5)
