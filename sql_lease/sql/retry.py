"""The executors' one interface and their one retry rule, for both faces, with no I/O.

Every executor, async (:mod:`.executors`, :mod:`.psycopg_async`) or blocking
(:mod:`.sync_executors`), offers the same three methods with the same arguments and meaning
(:class:`Executor` and :class:`AsyncExecutorInterface` differ only in ``async``):

- ``run(make_plan, plan=None, deadline=None)``: run ``plan`` (else ``make_plan()``) on one
  connection; ``deadline`` is a ``time.monotonic()`` value (seconds) or None (the caller bounds the
  call). A connection found dead before the statement was sent is replaced and a fresh
  ``make_plan()`` runs, by :class:`DeadConnectionRetry`.
- ``listen_connection(timeout_s)``: a driver connection of its own for PostgreSQL ``LISTEN`` (not
  pooled), and a function that drops it; ``NotImplementedError`` where there is none (SQLite).
- ``close(timeout_s)``: let the executor's own connections go, waiting at most ``timeout_s``
  seconds for polite closes.
"""

from __future__ import annotations

import select
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from .operations import LOCK_WAIT_SHARE, Plan, Query
from .translate import sqlite_busy

__all__ = [
    "SQLITE_TRY_BUSY_TIMEOUT_MS",
    "AsyncExecutorInterface",
    "DeadBeforeSending",
    "DeadConnectionRetry",
    "Executor",
    "SqliteLockWait",
    "readable_while_idle",
]

T = TypeVar("T")
StatementHook = Callable[[str, tuple[Any, ...]], None]


class DeadBeforeSending(Exception):
    """A connection was found dead before the statement was sent: nothing reached the database,
    so the plan may run again on another connection. ``error``: what showed it dead."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class DeadConnectionRetry:
    """The retry rule both faces apply: a connection that died before the statement was sent is
    retried on another connection, up to ``retries`` times, within the deadline."""

    __slots__ = ("retries",)

    def __init__(self, retries: int) -> None:
        self.retries = retries

    def again(self, dead: DeadBeforeSending, attempt: int, deadline: float | None) -> None:
        """Return when attempt ``attempt`` (0 for the first) that met ``dead`` may be followed by
        another; else raise the error that showed the connection dead (its last retry was used, or
        ``deadline``, a ``time.monotonic()`` value, has passed)."""
        if attempt >= self.retries or (deadline is not None and time.monotonic() >= deadline):
            raise dead.error from None


SQLITE_TRY_BUSY_TIMEOUT_MS = 50
"""The busy timeout of a provider's own SQLite connections (milliseconds): how long one try of a
statement waits for another writer's lock (:class:`SqliteLockWait` tries again)."""


class SqliteLockWait:
    """The lock-wait rule both faces apply on a provider's own SQLite connections: a statement that
    met another writer's lock (SQLITE_BUSY after :data:`SQLITE_TRY_BUSY_TIMEOUT_MS`; it wrote
    nothing) is sent again until ``busy_timeout_ms`` has passed since the operation began, or the
    share ``LOCK_WAIT_SHARE`` of the time left to ``deadline`` (``time.monotonic()`` seconds), if
    that comes first; an acquire's quick first try is not (its plan reads the holder instead)."""

    __slots__ = ("_until",)

    def __init__(self, busy_timeout_ms: int, deadline: float | None) -> None:
        now = time.monotonic()
        bound_s = busy_timeout_ms / 1000
        if deadline is not None:
            bound_s = min(bound_s, max(0.0, deadline - now) * LOCK_WAIT_SHARE)
        self._until = now + bound_s

    def __call__(self, exc: BaseException, query: Query) -> bool:
        return not query.quick and sqlite_busy(exc) and time.monotonic() < self._until


def readable_while_idle(fileno: int) -> bool:
    """True when the socket ``fileno`` of an idle connection (not LISTENing, no statement in
    flight) has something to read: the server ended the session (its goodbye and end-of-file).
    A poll with no wait; it reads nothing."""
    poller = select.poll()
    poller.register(fileno, select.POLLIN | select.POLLPRI)
    return bool(poller.poll(0))


class Executor(Protocol):
    """A blocking executor (:mod:`.sync_executors`)."""

    hooks: list[StatementHook]
    listens: bool
    retry: DeadConnectionRetry

    def run(self, make_plan: Callable[[], Plan[T]], plan: Plan[T] | None = None, deadline: float | None = None) -> T:
        """Run ``plan`` (else ``make_plan()``) on one connection by ``deadline``."""
        ...

    def listen_connection(self, timeout_s: float) -> tuple[Any, Callable[[], None]]:
        """A connection of its own for LISTEN, and a function that drops it."""
        ...

    def close(self, timeout_s: float) -> None:
        """Let the executor's own connections go within ``timeout_s`` seconds."""
        ...


class AsyncExecutorInterface(Protocol):
    """An async executor (:mod:`.executors`, :mod:`.psycopg_async`): :class:`Executor`, awaited."""

    hooks: list[StatementHook]
    listens: bool
    retry: DeadConnectionRetry

    async def run(
        self, make_plan: Callable[[], Plan[T]], plan: Plan[T] | None = None, deadline: float | None = None
    ) -> T:
        """Run ``plan`` (else ``make_plan()``) on one connection by ``deadline``."""
        ...

    async def listen_connection(self, timeout_s: float) -> tuple[Any, Callable[[], Awaitable[None]]]:
        """A connection of its own for LISTEN, and a coroutine function that drops it."""
        ...

    async def close(self, timeout_s: float) -> None:
        """Let the executor's own connections go within ``timeout_s`` seconds."""
        ...
