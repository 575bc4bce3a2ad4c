"""Lease statements beside a guarded transaction (issue 20 item 4, issue 21 item 7).

A caller's ``check_held`` transaction locks the lease row (PostgreSQL ``FOR SHARE``) or the
database (SQLite's write lock). A grant that had to wait for it counts its TTL from when it took
effect, not from when the statement began; a held lease is refused at once whatever guards it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from sql_lease import LeaseNotAcquiredError, SqlLeaseProvider, SyncSqlLeaseProvider
from sql_lease.sql.urls import to_sync_url

BACKENDS = [
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("mysql", marks=pytest.mark.mysql),
]
GUARD_S = 2.0
TTL_MS = 2_000
GUARDED_TTL_MS = 1_500  # ms: checked under a guard right after the acquire, so seconds on a loaded machine


@pytest.fixture(params=BACKENDS)
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """url, schema, kind and a sync SQLAlchemy engine on the lease database (migrated)."""
    if request.param == "sqlite":
        url, schema = f"sqlite:///{tmp_path}/leases.db", None
        with SyncSqlLeaseProvider(url) as provider:
            provider.migrate()
        engine = sa.create_engine(to_sync_url(url), connect_args={"timeout": 30})
    else:
        url, schema = request.getfixturevalue("mysql_db" if request.param == "mysql" else "pg_schema")
        engine = sa.create_engine(to_sync_url(url))
    yield {"kind": request.param, "url": url, "schema": schema, "engine": engine}
    engine.dispose()


def db_clock(conn: sa.Connection, kind: str) -> datetime:
    """The database's clock now, as the lease statements read it (aware UTC)."""
    if kind == "postgres":
        return conn.exec_driver_sql("SELECT clock_timestamp()").scalar_one()  # type: ignore[no-any-return]
    if kind == "mysql":
        return conn.exec_driver_sql("SELECT UTC_TIMESTAMP(6)").scalar_one().replace(tzinfo=UTC)  # type: ignore[no-any-return]
    ms = conn.exec_driver_sql("SELECT CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)").scalar_one()
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def in_thread(target: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = target()
        except BaseException as exc:  # reported by the test
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


# -- issue 20 item 4: the TTL counts from the grant ---------------------------------------------------


@pytest.mark.parametrize("operation", ["acquire", "transfer"])
def test_a_grant_after_a_guarded_transaction_counts_its_ttl_from_the_grant(
    db: dict[str, Any], key: str, operation: str
) -> None:
    with (
        SyncSqlLeaseProvider(db["url"], schema=db["schema"], operation_timeout_s=15) as a,
        SyncSqlLeaseProvider(db["url"], schema=db["schema"], operation_timeout_s=15) as b,
        SyncSqlLeaseProvider(db["url"], schema=db["schema"]) as c,
    ):
        # acquire: the guarded lease expires during the guard, so b's acquire is a takeover that waits.
        held = a.acquire_lease(key, "a", 300 if operation == "acquire" else 60_000)
        with db["engine"].connect() as conn:
            conn.begin()
            a.check_held(conn, key, "a", held.fence)
            if operation == "acquire":
                time.sleep(0.4)  # expired, still guarded
                thread, out = in_thread(lambda: b.acquire_lease(key, "b", TTL_MS))
            else:
                thread, out = in_thread(lambda: a.transfer_lease(key, "a", "b", TTL_MS))
            thread.join(GUARD_S)
            assert thread.is_alive(), f"the {operation} must wait for the guarded transaction"
            released = db_clock(conn, db["kind"])
            conn.commit()
        thread.join(15)
        assert "error" not in out, out
        info = b.get_lease(key)
        assert info is not None and info.owner == "b" and info.fence > held.fence
        if operation == "acquire":
            assert out["result"].acquired and out["result"].expires_at == info.expires_at
            assert out["result"].remaining_ms <= TTL_MS
        # the TTL runs from the grant (after the guard ended), by the database's clock
        assert info.expires_at >= released + timedelta(milliseconds=TTL_MS), (info, released)
        assert info.acquired_at is not None and info.acquired_at >= released
        assert info.remaining_ms > TTL_MS / 2
        third = c.acquire_lease(key, "c", TTL_MS)
        assert not third.acquired and third.owner == "b"


async def test_async_grant_after_a_guarded_transaction_counts_its_ttl_from_the_grant(
    db: dict[str, Any], key: str
) -> None:
    async with (
        SqlLeaseProvider(db["url"], schema=db["schema"], operation_timeout_s=15) as a,
        SqlLeaseProvider(db["url"], schema=db["schema"], operation_timeout_s=15) as b,
    ):
        a_sync = SyncSqlLeaseProvider(db["url"], schema=db["schema"])
        with db["engine"].connect() as conn:  # a sync guard: the event loop keeps running b's acquire
            conn.begin()
            held = await a.acquire_lease(key, "a", GUARDED_TTL_MS)
            a_sync.check_held(conn, key, "a", held.fence)
            await asyncio.sleep(GUARDED_TTL_MS / 1000 + 0.1)  # expired, still guarded
            takeover = asyncio.create_task(b.acquire_lease(key, "b", TTL_MS))
            await asyncio.sleep(GUARD_S)
            assert not takeover.done()
            released = db_clock(conn, db["kind"])
            conn.commit()
            a_sync.close()
        result = await asyncio.wait_for(takeover, 15)
        assert result.acquired and result.owner == "b"
        assert result.expires_at >= released + timedelta(milliseconds=TTL_MS)
        third = await a.acquire_lease(key, "c", TTL_MS)
        assert not third.acquired and third.owner == "b"


# -- issue 21 item 7: a held lease is refused at once, whatever transaction guards it ------------------


def test_a_guarded_held_lease_is_refused_at_once(db: dict[str, Any], key: str) -> None:
    with (
        SyncSqlLeaseProvider(db["url"], schema=db["schema"]) as a,
        SyncSqlLeaseProvider(db["url"], schema=db["schema"], operation_timeout_s=5) as b,
    ):
        held = a.acquire_lease(key, "a", 60_000)
        with db["engine"].connect() as conn:
            conn.begin()
            a.check_held(conn, key, "a", held.fence)
            started = time.monotonic()
            refused = b.acquire_lease(key, "b", 10_000)
            assert not refused.acquired and refused.owner == "a" and refused.fence == held.fence
            assert time.monotonic() - started < 1.5
            started = time.monotonic()
            with pytest.raises(LeaseNotAcquiredError) as waited:
                b.acquire_lease_wait(key, "b", 10_000, timeout_s=1)
            assert waited.value.holder == "a"
            assert time.monotonic() - started < 3.0
            conn.commit()
        assert a.get_lease(key).owner == "a"  # type: ignore[union-attr]


async def test_async_a_guarded_held_lease_is_refused_at_once(db: dict[str, Any], key: str) -> None:
    async with (
        SqlLeaseProvider(db["url"], schema=db["schema"]) as a,
        SqlLeaseProvider(db["url"], schema=db["schema"], operation_timeout_s=5) as b,
    ):
        held = await a.acquire_lease(key, "a", 60_000)
        with db["engine"].connect() as conn, SyncSqlLeaseProvider(db["url"], schema=db["schema"]) as guard:
            conn.begin()
            guard.check_held(conn, key, "a", held.fence)
            started = time.monotonic()
            refused = await b.acquire_lease(key, "b", 10_000)
            assert not refused.acquired and refused.owner == "a" and refused.fence == held.fence
            assert time.monotonic() - started < 1.5
            started = time.monotonic()
            with pytest.raises(LeaseNotAcquiredError) as waited:
                await b.acquire_lease_wait(key, "b", 10_000, timeout_s=1)
            assert waited.value.holder == "a"
            assert time.monotonic() - started < 3.0
            conn.commit()
        assert (await a.get_lease(key)).owner == "a"  # type: ignore[union-attr]


def test_a_waiting_acquire_refused_against_a_locked_row_answers_after_a_few_tries() -> None:
    """The plan: an unflagged refusal (the row is locked) is asked again, then answered as refused."""
    from sql_lease.sql.operations import UNFLAGGED_RETRIES, acquire
    from sql_lease.sql.schema import LeaseTableNames
    from sql_lease.sql.statements import PostgresStatements

    s = PostgresStatements(LeaseTableNames())
    plan = acquire(s, "k", "waiter", 1000, waiting=True)
    asked = [next(plan)]
    unflagged = (False, "holder", 7, datetime.now(UTC), 500.0, False)
    for _ in range(UNFLAGGED_RETRIES):
        asked.append(plan.send(unflagged))
    assert all(query.sql == s.acquire_waiting for query in asked)
    with pytest.raises(StopIteration) as done:
        plan.send(unflagged)
    assert done.value.value.owner == "holder" and not done.value.value.acquired


async def test_a_waiter_that_flagged_the_row_is_woken_by_the_release_after_a_guard(
    pg_schema: tuple[str, str], key: str
) -> None:
    """A waiter that came before the guard flagged the row; the holder guards, commits and releases,
    and the waiter is woken by NOTIFY (well before the 5 s re-check)."""
    url, schema = pg_schema
    engine = sa.create_engine(to_sync_url(url))
    async with SqlLeaseProvider(url, schema=schema) as a, SqlLeaseProvider(url, schema=schema) as b:
        held = await a.acquire_lease(key, "a", 60_000)
        waiter = asyncio.create_task(b.acquire_lease_wait(key, "b", 10_000, timeout_s=30))
        await asyncio.sleep(0.5)
        with engine.connect() as conn, SyncSqlLeaseProvider(url, schema=schema) as guard:
            conn.begin()
            guard.check_held(conn, key, "a", held.fence)
            await asyncio.sleep(0.3)
            conn.commit()
        released = time.monotonic()
        assert await a.release_lease(key, "a")
        got = await asyncio.wait_for(waiter, 30)
        assert got.acquired and time.monotonic() - released < 2.5
    engine.dispose()


# -- an expired lease under a guard: the takeover waits, within its time limit, then "not acquired" -----


def test_a_guarded_expired_lease_is_answered_not_acquired_within_the_timeout(db: dict[str, Any], key: str) -> None:
    with (
        SyncSqlLeaseProvider(db["url"], schema=db["schema"]) as a,
        SyncSqlLeaseProvider(db["url"], schema=db["schema"], operation_timeout_s=2) as b,
        SyncSqlLeaseProvider(db["url"], schema=db["schema"]) as c,  # the default time limit (10 s)
    ):
        with db["engine"].connect() as conn:
            conn.begin()
            held = a.acquire_lease(key, "a", GUARDED_TTL_MS)
            a.check_held(conn, key, "a", held.fence)
            time.sleep(GUARDED_TTL_MS / 1000 + 0.1)  # expired, still guarded
            started = time.monotonic()
            refused = b.acquire_lease(key, "b", 10_000)
            took = time.monotonic() - started
            assert not refused.acquired and 0.5 < took < 2.0, (refused, took)
            for waiter in (b, c):
                started = time.monotonic()
                with pytest.raises(LeaseNotAcquiredError):
                    waiter.acquire_lease_wait(key, "b", 10_000, timeout_s=1)
                assert time.monotonic() - started < 2.0
            started = time.monotonic()  # a plain acquire with a time limit shorter than the default
            assert not c.acquire_lease(key, "b", 10_000, timeout_s=1).acquired
            assert time.monotonic() - started < 2.0
            conn.commit()
        assert b.acquire_lease(key, "b", 10_000).acquired  # the guard ended: taken over at once


async def test_async_a_guarded_expired_lease_is_answered_not_acquired_within_the_timeout(
    db: dict[str, Any], key: str
) -> None:
    async with (
        SqlLeaseProvider(db["url"], schema=db["schema"]) as a,
        SqlLeaseProvider(db["url"], schema=db["schema"], operation_timeout_s=2) as b,
        SqlLeaseProvider(db["url"], schema=db["schema"]) as c,  # the default time limit (10 s)
    ):
        with db["engine"].connect() as conn, SyncSqlLeaseProvider(db["url"], schema=db["schema"]) as guard:
            conn.begin()
            held = await a.acquire_lease(key, "a", GUARDED_TTL_MS)
            guard.check_held(conn, key, "a", held.fence)
            await asyncio.sleep(GUARDED_TTL_MS / 1000 + 0.1)
            started = time.monotonic()
            refused = await b.acquire_lease(key, "b", 10_000)
            took = time.monotonic() - started
            assert not refused.acquired and 0.5 < took < 2.0, (refused, took)
            for waiter in (b, c):
                started = time.monotonic()
                with pytest.raises(LeaseNotAcquiredError):
                    await waiter.acquire_lease_wait(key, "b", 10_000, timeout_s=1)
                assert time.monotonic() - started < 2.0
            started = time.monotonic()  # a plain acquire with a time limit shorter than the default
            assert not (await c.acquire_lease(key, "b", 10_000, timeout_s=1)).acquired
            assert time.monotonic() - started < 2.0
            conn.commit()
        assert (await b.acquire_lease(key, "b", 10_000)).acquired


@pytest.mark.mysql
@pytest.mark.parametrize("face", ["sync", "async"])
def test_mysql_a_guarded_expired_lease_on_an_applications_engine_is_not_acquired_at_once(
    mysql_db: tuple[str, str], face: str, key: str
) -> None:
    """The application's engine keeps its own lock wait (50 s here, the server's default): a takeover
    of an expired lease whose row a ``check_held`` transaction locks does not wait for it (``FOR
    UPDATE NOWAIT``) but answers "not acquired" at once, on both faces; once the guard commits, the
    same engine takes the lease over."""
    from sqlalchemy.ext.asyncio import create_async_engine

    from sql_lease.sql.urls import to_async_url

    url, schema = mysql_db
    timeout_s = 8.0
    settings = {"init_command": "SET SESSION innodb_lock_wait_timeout = 50"}
    guard_engine = sa.create_engine(to_sync_url(url))
    app_sync = sa.create_engine(to_sync_url(url), connect_args=settings)

    def acquire_through_the_app() -> tuple[Any, float]:
        """The acquire's answer and how long the acquire alone took (the engine's connection is made first)."""
        if face == "sync":
            with app_sync.connect():
                pass
            with SyncSqlLeaseProvider(app_sync, schema=schema, operation_timeout_s=timeout_s) as leases:
                started = time.monotonic()
                return leases.acquire_lease(key, "b", 10_000), time.monotonic() - started

        async def acquire() -> tuple[Any, float]:
            app_async = create_async_engine(to_async_url(url), connect_args=settings)  # on this loop
            try:
                async with app_async.connect():
                    pass
                async with SqlLeaseProvider(app_async, schema=schema, operation_timeout_s=timeout_s) as leases:
                    started = time.monotonic()
                    return await leases.acquire_lease(key, "b", 10_000), time.monotonic() - started
            finally:
                await app_async.dispose()

        return asyncio.run(acquire())

    try:
        with app_sync.connect() as conn:  # the engine's sessions wait 50 s for a row lock
            assert conn.exec_driver_sql("SELECT @@SESSION.innodb_lock_wait_timeout").scalar_one() == 50
        with SyncSqlLeaseProvider(url, schema=schema) as holder:
            held = holder.acquire_lease(key, "a", 1_500)  # check_held must land in time on a loaded machine
            with guard_engine.connect() as guard:
                guard.begin()
                holder.check_held(guard, key, "a", held.fence)
                time.sleep(1.6)  # expired, still guarded
                refused, took = acquire_through_the_app()
                assert not refused.acquired, refused
                assert took < timeout_s / 4, took  # not the session's 50 s, nor the operation's limit
                guard.commit()
        taken, _took = acquire_through_the_app()
        assert taken.acquired and taken.fence > held.fence, taken
    finally:
        guard_engine.dispose()
        app_sync.dispose()
