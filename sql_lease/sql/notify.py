"""PostgreSQL LISTEN/NOTIFY wake-ups for waiters, behind the optional ``release_waiter`` hook.

One LISTEN connection per provider, opened when the first waiter arrives and shared by all of
them. Releases, transfers and sweeps of rows whose ``has_waiters`` flag is set send
``NOTIFY <channel>, <stored key>``; the listener wakes the waiters of that key. If the LISTEN connection
cannot be opened or dies, waiters fall back to polling (they are woken so they re-check at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ..contract import AcquireResult
from .waiters import Acquire as AcquireOf
from .waiters import ListenerBase, ReleaseWaiterBase

Acquire = AcquireOf[Awaitable[AcquireResult]]
"""The provider's acquire, as this face's release waiter calls it."""


log = logging.getLogger("sql_lease")


OpenDedicated = Callable[[float], Awaitable[tuple[Any, Callable[[], Awaitable[None]]]]]


class NotifyListener(ListenerBase[OpenDedicated, asyncio.Event]):
    """The provider's LISTEN connection and the waiters registered per key."""

    def __init__(
        self,
        open_dedicated: OpenDedicated,
        channel_query: str,
        is_closed: Callable[[], bool],
        timeout_s: float,
        table: str,
    ) -> None:
        super().__init__(open_dedicated, channel_query, is_closed, timeout_s, table)
        self._channel: str | None = None  # 'sql_lease_<table OID>': one per table, however it is named
        self._drop_connection: Callable[[], Awaitable[None]] | None = None
        self._driver: Any = None  # the asyncpg connection, LISTENing
        self._opening = asyncio.Lock()

    @property
    def listening(self) -> bool:
        return self._driver is not None and not self._driver.is_closed()

    def register(self, key: str, event: asyncio.Event) -> None:
        self._waiters.register(key, event)

    def unregister(self, key: str, event: asyncio.Event) -> None:
        self._waiters.unregister(key, event)

    async def ensure_listening(self) -> bool:
        """Open the LISTEN connection if it is not open; False if that failed (then poll)."""
        if self.listening:
            return True
        async with self._opening:
            if self.listening:
                return True
            if self._is_closed():  # never reopen after close(); the waiter's attempt then fails
                return False
            await self._drop()
            try:
                async with asyncio.timeout(self._timeout_s):
                    driver, drop = await self._open_connection(self._timeout_s)
                    try:
                        channel = await driver.fetchval(self._channel_query)
                        await driver.add_listener(channel, self._on_notify)
                        driver.add_termination_listener(self._on_terminated)
                    except BaseException:
                        await drop()
                        raise
            except Exception as exc:
                log.warning("LISTEN for %s failed, waiters will poll: %s", self._table, exc)
                return False
            self._drop_connection, self._driver, self._channel = drop, driver, channel
            if self._is_closed():  # closed while we connected: keep nothing open
                await self._drop()
                return False
            return True

    def _on_notify(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        for event in self._waiters.notified(payload):
            event.set()

    def _on_terminated(self, _conn: Any) -> None:
        self._driver = None
        for event in self._waiters.of(None):  # wake everyone to poll until we listen again
            event.set()

    async def _drop(self) -> None:
        drop, self._drop_connection, self._driver = self._drop_connection, None, None
        if drop is not None:
            with contextlib.suppress(Exception):
                await drop()  # never back into a pool: it LISTENs

    async def close(self) -> None:
        async with self._opening:  # a LISTEN connection being opened is dropped, not kept
            await self._drop()


class PostgresReleaseWaiter(ReleaseWaiterBase[NotifyListener, asyncio.Event, Acquire]):
    """One waiter on one key: acquire attempts that flag the row, and waits that end on NOTIFY."""

    def __init__(self, listener: NotifyListener, key: str, acquire: Acquire) -> None:
        super().__init__(listener, key, acquire, asyncio.Event())

    async def __aenter__(self) -> PostgresReleaseWaiter:
        self._listener.register(self.key, self._event)  # before the first attempt: no lost wake-up
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._listener.unregister(self.key, self._event)

    async def acquire(
        self,
        owner: str,
        ttl_ms: int | float,
        *,
        data: dict[str, Any] | None = None,
        timeout_s: float | None = None,
        limit: int = 1,
    ) -> AcquireResult:
        """Try to acquire (with lease ``data``, within ``timeout_s`` seconds: None, the provider's
        operation timeout; ``limit`` >= 2: a slot of a semaphore); a refusal marks the row so its
        release (of any slot) sends NOTIFY.

        (Re)opens the LISTEN connection first, so a release after this attempt cannot go unheard.
        """
        listening = await self._listener.ensure_listening()
        self._event.clear()
        return await self._acquire(
            self.key, owner, ttl_ms, waiting=listening, data=data, timeout_s=timeout_s, limit=limit
        )

    async def wait(self, timeout_s: float) -> bool:
        """Wait until the key is released (True) or ``timeout_s`` seconds pass (False)."""
        try:
            await asyncio.wait_for(self._event.wait(), timeout_s)
            return True
        except TimeoutError:
            return False
