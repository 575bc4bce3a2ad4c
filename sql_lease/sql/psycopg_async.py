"""The async face on psycopg 3, for installs without asyncpg (``pip install 'sql-lease[psycopg]'``).

:class:`PsycopgAsyncPoolExecutor` runs the same plans, with the same ``$n`` statements (psycopg's
raw cursors take them as they are), on up to ``pool_size`` autocommit ``psycopg.AsyncConnection``s
per event loop and process, lent as the asyncpg pool lends its own (:class:`.executors._Connections`).
Session settings are applied once per new connection; ``timestamptz`` values load as UTC.

A statement past its deadline is not waited for: the operation raises at once while psycopg
cancels the query on the server in the background (its own non-blocking cancel), and the
connection is closed after that and never reused. No call here blocks the event loop.
Waiters poll (no LISTEN on this driver).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any, TypeVar

from .executors import Fetch, LentPoolExecutor
from .sync_executors import ended_while_idle

__all__ = ["PsycopgAsyncPoolExecutor"]

T = TypeVar("T")
Row = Sequence[Any]


class _Lent:
    """One psycopg ``AsyncConnection`` and its raw cursor, in the interface ``_Connections`` lends."""

    __slots__ = ("conn", "cursor", "running")

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.cursor = conn.cursor()  # an AsyncRawCursor: $n placeholders, kept for its loaders
        self.running: asyncio.Task[Any] | None = None

    def is_closed(self) -> bool:
        return bool(self.conn.closed)

    def ended_while_idle(self) -> bool:
        """True when the server ended this idle connection (nothing is sent or awaited)."""
        return ended_while_idle(self.conn)

    def terminate(self) -> None:
        """Close the connection without awaiting; one with a statement still being cancelled is
        closed when psycopg is done with it."""
        running = self.running
        if running is not None and not running.done():
            running.add_done_callback(lambda _: self._finish())
        else:
            self._finish()

    def _finish(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.pgconn.finish()  # libpq's PQfinish: the socket is closed, nothing awaited

    async def close(self) -> None:
        await self.conn.close()

    async def fetch(self, sql: str, params: tuple[Any, ...]) -> list[Row]:
        running = self.running = asyncio.ensure_future(self._fetch(sql, params))
        try:
            return await asyncio.shield(running)
        except asyncio.CancelledError:
            running.cancel()  # psycopg cancels the query on the server; we do not wait for it
            running.add_done_callback(lambda done: done.cancelled() or done.exception())
            raise

    async def _fetch(self, sql: str, params: tuple[Any, ...]) -> list[Row]:
        cursor = self.cursor
        await cursor.execute(sql, params)
        return await cursor.fetchall() if cursor.description is not None else []  # type: ignore[no-any-return]


class PsycopgAsyncPoolExecutor(LentPoolExecutor):
    """The provider's own psycopg 3 async connections for a PostgreSQL URL (``conninfo``: libpq's
    connection string); the ``setup`` statements run once on each new connection."""

    def __init__(self, conninfo: str, size: int, setup: Sequence[str], *, pgbouncer: bool) -> None:
        import psycopg

        from .setup import utc_timestamptz_loader

        super().__init__(size)
        self._conninfo = conninfo
        self._setup = tuple(setup)
        self._kwargs: dict[str, Any] = {"autocommit": True, "cursor_factory": psycopg.AsyncRawCursor}
        if pgbouncer:
            self._kwargs["prepare_threshold"] = None  # PgBouncer's transaction mode cannot track them
        self._loader = utc_timestamptz_loader()

    async def _new_connection(self) -> _Lent:
        import psycopg

        from .sync_executors import ConnectError

        try:
            conn = await psycopg.AsyncConnection.connect(self._conninfo, **self._kwargs)
        except psycopg.OperationalError as exc:
            raise ConnectError(exc) from exc  # a SQLSTATE for what the server's text says
        try:
            conn.adapters.register_loader("timestamptz", self._loader)
            for statement in self._setup:
                await conn.execute(statement)
        except BaseException:
            conn.pgconn.finish()
            raise
        return _Lent(conn)

    def _fetch(self, conn: _Lent) -> Fetch:
        return conn.fetch

    def _dead_before_sending(self, conn: _Lent, exc: BaseException | None) -> bool:
        # psycopg sends without looking: a connection is checked while idle, before its statement
        return exc is None and conn.ended_while_idle()
