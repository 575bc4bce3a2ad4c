"""The application's engine is used the way it expects (issue "One core, two executors"): every
lease statement goes through SQLAlchemy, nothing is held between operations, the pool's own
settings apply, and the provider's own pool is a real one."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from sql_lease import SqlLeaseProvider


def app_engine(url: str, **options: Any) -> AsyncEngine:
    return create_async_engine(url.replace("postgresql://", "postgresql+asyncpg://"), **options)


@pytest.mark.postgres
async def test_a_given_engine_sees_every_statement_and_lends_each_connection_only_for_one_operation(
    pg_schema: tuple[str, str], key: str
) -> None:
    url, schema = pg_schema
    engine = app_engine(url, pool_size=3, max_overflow=0)
    seen: list[str] = []
    checked_out_between: list[int] = []

    @event.listens_for(engine.sync_engine, "before_cursor_execute")
    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    try:
        leases = SqlLeaseProvider(engine, schema=schema)
        operations = [
            lambda: leases.acquire_lease(key, "a", 10_000),
            lambda: leases.renew_lease(key, "a", 10_000),
            lambda: leases.get_lease(key),
            lambda: leases.get_lease_owner(key),
            lambda: leases.transfer_lease(key, "a", "b", 10_000),
            lambda: leases.release_lease(key, "b"),
            lambda: leases.sweep_expired(),
        ]
        for operation in operations:
            await operation()
            checked_out_between.append(engine.sync_engine.pool.checkedout())  # type: ignore[attr-defined]
        await leases.close()
        assert len(seen) >= len(operations), "lease statements bypassed the application's engine"
        assert checked_out_between == [0] * len(operations)
        assert engine.sync_engine.pool.checkedout() == 0  # type: ignore[attr-defined]
        # the application's pool limit holds: three connections, and more operations than that at once
        async with SqlLeaseProvider(engine, schema=schema) as busy:
            results = await asyncio.gather(*(busy.get_lease_owner(f"{key}:{i}") for i in range(12)))
            assert results == [None] * 12
    finally:
        await engine.dispose()


@pytest.mark.postgres
async def test_a_given_engines_pool_recycle_applies_to_lease_statements(pg_schema: tuple[str, str], key: str) -> None:
    url, schema = pg_schema
    engine = app_engine(url, pool_size=1, max_overflow=0, pool_recycle=1)
    pids: list[int] = []

    @event.listens_for(engine.sync_engine, "before_cursor_execute")
    def record(conn: Any, *args: Any) -> None:
        pids.append(conn.connection.dbapi_connection._connection.get_server_pid())

    try:
        async with SqlLeaseProvider(engine, schema=schema) as leases:
            await leases.get_lease_owner(key)
            await leases.get_lease_owner(key)
            assert pids[0] == pids[1], "a pool of one connection should reuse it"
            await asyncio.sleep(1.3)
            await leases.get_lease_owner(key)
            assert pids[-1] != pids[0], "pool_recycle was ignored"
    finally:
        await engine.dispose()


@pytest.mark.postgres
async def test_the_statement_hook_sees_what_the_provider_sends(pg_schema: tuple[str, str], key: str) -> None:
    url, schema = pg_schema
    async with SqlLeaseProvider(url, schema=schema) as leases:
        sent: list[tuple[str, tuple[Any, ...]]] = []
        stop = leases.on_statement(lambda sql, params: sent.append((sql, params)))
        await leases.acquire_lease(key, "a", 1000)
        stop()
        await leases.release_lease(key, "a")
        assert len(sent) == 1 and sent[0][1][:2] == (key, "a")


async def test_a_missing_postgres_driver_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name in ("asyncpg", "psycopg") else real_find_spec(name, *a),
    )
    with pytest.raises(ModuleNotFoundError, match=r"sql-lease\[postgresql\].*sql-lease\[psycopg\]"):
        SqlLeaseProvider("postgresql://u@h/db")


class FakeConnection:
    def __init__(self) -> None:
        self.closed = False

    def is_closed(self) -> bool:
        return self.closed

    def terminate(self) -> None:
        self.closed = True


async def test_a_waiter_cancelled_as_a_dropped_connection_frees_room_passes_the_turn_on() -> None:
    """Issue 20 item 14 (issue 14, "lost wake-up"): the pool is full, two operations wait; the
    connection in use is dropped, which hands the first waiter room to open one, and that waiter
    is cancelled in the same instant. The second waiter must get the room, not wait for ever."""
    from sql_lease.sql.executors import _Connections

    made: list[FakeConnection] = []

    async def connect() -> FakeConnection:
        made.append(FakeConnection())
        return made[-1]

    pool = _Connections(connect, 1)
    busy = await pool.take()
    first = asyncio.ensure_future(pool.take())
    second = asyncio.ensure_future(pool.take())
    await asyncio.sleep(0)  # both are waiting now
    pool.give(busy, healthy=False)  # dropped: the first waiter is told there is room
    first.cancel()  # ... and gives up before it runs
    with pytest.raises(asyncio.CancelledError):
        await first
    async with asyncio.timeout(5):
        conn = await second
    assert conn is made[-1] and len(made) == 2


async def test_a_waiter_cancelled_as_a_connection_is_handed_to_it_gives_it_back() -> None:
    from sql_lease.sql.executors import _Connections

    async def connect() -> FakeConnection:
        return FakeConnection()

    pool = _Connections(connect, 1)
    busy = await pool.take()
    first = asyncio.ensure_future(pool.take())
    second = asyncio.ensure_future(pool.take())
    await asyncio.sleep(0)
    pool.give(busy, healthy=True)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    async with asyncio.timeout(5):
        assert await second is busy


# -- issue 22 item 1: one executor interface, one retry rule, on both faces -------------------------


def _terminate_other_backends(url: str, schema: str) -> int:
    """End every session of the test database but this one (the provider's idle pooled ones)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as admin:
        row = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend' "
            "AND state = 'idle' AND application_name = 'r2-retry'"
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.postgres
@pytest.mark.parametrize("kind", ["url", "engine"])
def test_a_sync_connection_that_died_idle_is_replaced_before_the_statement_is_sent(
    pg_schema: tuple[str, str], key: str, kind: str
) -> None:
    """The sync face applies the async face's retry rule: a pooled connection found dead before
    its statement was sent (the server ended it while it sat idle) is replaced, and the operation
    succeeds; before, the first operation after it raised ``LeaseBackendError``."""
    import time

    import sqlalchemy as sa

    from sql_lease import SyncSqlLeaseProvider

    url, schema = pg_schema
    named = url + ("&" if "?" in url else "?") + "application_name=r2-retry"
    engine = sa.create_engine(named.replace("postgresql://", "postgresql+psycopg://"), pool_size=2)
    target: Any = engine if kind == "engine" else named
    try:
        with SyncSqlLeaseProvider(target, schema=schema, pool_size=2) as leases:
            assert leases.acquire_lease(key, "a", 10_000).acquired
            assert _terminate_other_backends(url, schema) >= 1
            time.sleep(0.2)  # the server's goodbye reaches the idle socket
            assert leases.get_lease_owner(key) == "a"
            assert leases.release_lease(key, "a")
    finally:
        engine.dispose()


def test_both_faces_offer_one_executor_interface() -> None:
    """Same method names and parameters on the async and the sync executors (async or not), and
    one retry rule object: a dead-before-sending connection is retried up to N times, within the
    deadline."""
    import inspect

    from sql_lease.sql import executors, psycopg_async, sync_executors
    from sql_lease.sql.retry import DeadBeforeSending, DeadConnectionRetry

    async_classes = [executors.AsyncpgPoolExecutor, executors.AiosqlitePoolExecutor, executors.EngineExecutor]
    async_classes.append(psycopg_async.PsycopgAsyncPoolExecutor)
    sync_classes = [sync_executors.PsycopgPoolExecutor, sync_executors.SqliteFileExecutor]
    sync_classes.append(sync_executors.EngineExecutor)
    for name in ("run", "listen_connection", "close"):
        every = async_classes + sync_classes
        shapes = {(cls.__name__, tuple(inspect.signature(getattr(cls, name)).parameters)) for cls in every}
        assert {params for _, params in shapes} == {next(iter(shapes))[1]}, shapes
        assert all(inspect.iscoroutinefunction(getattr(cls, name)) for cls in async_classes)
        assert not any(inspect.iscoroutinefunction(getattr(cls, name)) for cls in sync_classes)

    rule = DeadConnectionRetry(2)
    dead = DeadBeforeSending(ConnectionError("gone"))
    rule.again(dead, 0, None)
    rule.again(dead, 1, None)
    with pytest.raises(ConnectionError):
        rule.again(dead, 2, None)
    with pytest.raises(ConnectionError):
        rule.again(dead, 0, 0.0)  # past the deadline (time.monotonic() seconds)


class _ClosingConnection:
    """An asyncpg connection stand-in that closes after its first statement is sent."""

    def __init__(self) -> None:
        self.closed = False
        self.sent: list[str] = []

    def is_closed(self) -> bool:
        return self.closed

    def terminate(self) -> None:
        self.closed = True

    async def close(self) -> None:
        self.closed = True

    async def fetch(self, sql: str, *params: Any) -> list[Any]:
        import asyncpg

        if self.closed:  # as asyncpg does: checked before anything is written
            raise asyncpg.InterfaceError("connection is closed")
        self.sent.append(sql)
        self.closed = True  # the server goes away once the first statement was sent
        return [(1,)]


async def test_a_connection_dead_after_a_plans_first_statement_is_not_run_again() -> None:
    """A plan whose second statement finds the connection closed is not started again: its
    first statement was sent (and may have taken effect)."""
    import asyncpg

    from sql_lease.sql.executors import AsyncpgPoolExecutor
    from sql_lease.sql.operations import Query

    made: list[_ClosingConnection] = []

    class Stub(AsyncpgPoolExecutor):
        async def _new_connection(self) -> Any:
            made.append(_ClosingConnection())
            return made[-1]

    def two_statements() -> Any:
        yield Query("SELECT 1", ())
        yield Query("SELECT 2", ())
        return "done"

    executor = Stub({}, size=2, setup=())
    with pytest.raises(asyncpg.InterfaceError):
        await executor.run(two_statements)
    assert [conn.sent for conn in made] == [["SELECT 1"]]  # sent once, never again on a new connection
    await executor.close(0.1)
