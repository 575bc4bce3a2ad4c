"""PostgreSQL LISTEN/NOTIFY wake-ups for waiting threads (the sync provider's ``release_waiter``).

One LISTEN connection per provider, opened when the first waiter arrives, read by one listener
thread with psycopg's ``notifies(timeout=...)``; each notification (payload: the stored key) sets the
``threading.Event`` of that key's waiters. Releases, transfers and sweeps of rows whose
``has_waiters`` flag is set send the NOTIFY (the statements do). If the connection cannot be
opened or dies, waiters are woken and poll until a later attempt listens again.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ..contract import AcquireResult
from . import forks
from .sync_executors import Watchdog, run_on_psycopg
from .waiters import Acquire, KeyedEvents, ListenerBase, ReleaseWaiterBase

SyncAcquire = Acquire[AcquireResult]
"""The provider's acquire, as this face's release waiter calls it."""


log = logging.getLogger("sql_lease")

__all__ = ["SyncAcquire", "SyncNotifyListener", "SyncPostgresReleaseWaiter"]

_READ_SLICE_S = 0.2  # how often the listener thread looks up from notifies() to see if it must stop


class _Generation:
    """One LISTEN connection and the thread reading it."""

    def __init__(self, conn: Any, discard: Callable[[], None]) -> None:
        self.conn = conn
        self.discard = discard
        self.stop = threading.Event()
        self.alive = True
        self.thread: threading.Thread | None = None


OpenConnection = Callable[[float], tuple[Any, Callable[[], None]]]


class SyncNotifyListener(ListenerBase[OpenConnection, threading.Event]):
    """The provider's LISTEN connection and the waiters registered per key: ``open_connection``
    (the executor's ``listen_connection``), the query that names the channel, whether the provider
    is closed, the operation timeout (seconds) that bounds the setup, the table (for logs), and the
    watchdog that aborts a stalled setup. It knows no provider."""

    def __init__(
        self,
        open_connection: OpenConnection,
        channel_query: str,
        is_closed: Callable[[], bool],
        timeout_s: float,
        table: str,
        watchdog: Watchdog,
    ) -> None:
        super().__init__(open_connection, channel_query, is_closed, timeout_s, table)
        self._watchdog = watchdog
        self._lock = threading.Lock()
        self._opening = threading.Lock()
        self._current: _Generation | None = None
        forks.on_fork_in_child(self, SyncNotifyListener._after_fork_in_child)

    def _after_fork_in_child(self) -> None:
        # The parent's LISTEN connection and its reader thread stay the parent's; the child's
        # waiters open their own.
        forks.abandon(self._current)
        self._current = None
        self._lock = threading.Lock()
        self._opening = threading.Lock()
        self._waiters = KeyedEvents()

    @property
    def listening(self) -> bool:
        current = self._current
        return current is not None and current.alive

    def register(self, key: str, event: threading.Event) -> None:
        with self._lock:
            self._waiters.register(key, event)

    def unregister(self, key: str, event: threading.Event) -> None:
        with self._lock:
            self._waiters.unregister(key, event)

    def _wake(self, payload: str | None) -> None:
        with self._lock:
            events = self._waiters.of(None) if payload is None else self._waiters.notified(payload)
        for event in events:
            event.set()

    def ensure_listening(self) -> bool:
        """Open the LISTEN connection if it is not open; False if that failed (then poll)."""
        if self.listening:
            return True
        with self._opening:
            if self.listening:
                return True
            if self._is_closed():
                return False
            self._drop()
            try:
                # Within the operation timeout, as every operation (the connection attempt: libpq's
                # connect_timeout, whole seconds, at least 2); close() waits for this lock.
                deadline = time.monotonic() + self._timeout_s
                conn, discard = self._open_connection(self._timeout_s)
                try:
                    run_on_psycopg(self._watchdog, conn, deadline, lambda: self._listen(conn))
                except BaseException:
                    discard()
                    raise
            except Exception as exc:
                log.warning("LISTEN for %s failed, waiters will poll: %s", self._table, exc)
                return False
            generation = _Generation(conn, discard)
            generation.thread = threading.Thread(
                target=self._read, args=(generation,), name="sql_lease listen", daemon=True
            )
            self._current = generation
            generation.thread.start()
            return True

    def _listen(self, conn: Any) -> None:
        from psycopg import sql

        channel = conn.execute(self._channel_query).fetchone()[0]
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))

    def _read(self, generation: _Generation) -> None:
        try:
            while not generation.stop.is_set():
                for notify in generation.conn.notifies(timeout=_READ_SLICE_S):
                    self._wake(notify.payload)
        except Exception as exc:
            if not generation.stop.is_set():
                log.warning("the LISTEN connection of %s failed, waiters poll: %s", self._table, exc)
        finally:
            generation.alive = False
            with contextlib.suppress(Exception):
                generation.discard()  # never reused: it was LISTENing
            self._wake(None)  # everyone re-checks at once (and polls until we listen again)

    def _drop(self) -> None:
        generation, self._current = self._current, None
        if generation is not None:
            generation.stop.set()
            thread = generation.thread
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=_READ_SLICE_S * 5)

    def close(self) -> None:
        with self._opening:
            self._drop()


class SyncPostgresReleaseWaiter(ReleaseWaiterBase[SyncNotifyListener, threading.Event, SyncAcquire]):
    """One waiting thread on one key: acquire attempts that flag the row, and waits that end on NOTIFY."""

    def __init__(self, listener: SyncNotifyListener, key: str, acquire: SyncAcquire) -> None:
        super().__init__(listener, key, acquire, threading.Event())

    def __enter__(self) -> SyncPostgresReleaseWaiter:
        self._listener.register(self.key, self._event)  # before the first attempt: no lost wake-up
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._listener.unregister(self.key, self._event)

    def acquire(
        self,
        owner: str,
        ttl_ms: int | float,
        timeout_s: float | None,
        *,
        data: dict[str, Any] | None = None,
        limit: int = 1,
    ) -> AcquireResult:
        """Try to acquire (with lease ``data``; ``limit`` >= 2: a slot of a semaphore) within
        ``timeout_s`` seconds; a refusal marks the row so that its release (of any slot) sends
        NOTIFY. (Re)opens the LISTEN connection first, so no release after it goes unheard."""
        listening = self._listener.ensure_listening()
        self._event.clear()
        return self._acquire(self.key, owner, ttl_ms, waiting=listening, data=data, timeout_s=timeout_s, limit=limit)

    def wait(self, timeout_s: float) -> bool:
        """Block until the key is released (True) or ``timeout_s`` seconds pass (False)."""
        return self._event.wait(max(0.0, timeout_s))
