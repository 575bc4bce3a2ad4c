"""Fenced writes (issue 15): ``check_held`` and ``accept_fence`` in the application's transaction.

On PostgreSQL (the session schema) and SQLite (a fresh file), sync and async faces: a stalled
holder's guarded write fails after a takeover (real processes), a takeover waits for an open
guarded transaction, the holder's own renewal waits without deadlock or loss, 16 concurrent
writers never move a resource's recorded fence down, and ``hold()``/``@leased`` bodies guard their
writes with the lease they are handed.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from sql_lease import (
    HeldLease,
    LeaseError,
    LeaseLostError,
    SqlLeaseProvider,
    StaleFenceError,
    SyncHeldLease,
    SyncSqlLeaseProvider,
    leased,
)
from sql_lease.sql.urls import to_async_url, to_sync_url
from tests.support.processes import json_summaries, run_scripts

REPO = Path(__file__).resolve().parent.parent
GUARDED_TTL_MS = 1_500  # ms: checked under a guard right after the acquire, so seconds on a loaded machine
BACKENDS = [
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("mysql", marks=pytest.mark.mysql),
]


@pytest.fixture(params=BACKENDS)
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A migrated lease database and an application table ``app_writes`` beside the leases:
    url, schema, app (the qualified table name), sync and async SQLAlchemy URLs."""
    if request.param == "sqlite":
        url, schema = f"sqlite:///{tmp_path}/app.db", None
        with SyncSqlLeaseProvider(url) as provider:
            provider.migrate()
        ddl = "CREATE TABLE app_writes (id INTEGER PRIMARY KEY AUTOINCREMENT, writer TEXT, fence BIGINT)"
        app = "app_writes"
    elif request.param == "mysql":
        url, schema = request.getfixturevalue("mysql_db")
        app = f"`{schema}`.app_writes_{random.randrange(10**9)}"
        ddl = f"CREATE TABLE {app} (id BIGINT AUTO_INCREMENT PRIMARY KEY, writer TEXT, fence BIGINT)"
    else:
        url, schema = request.getfixturevalue("pg_schema")
        app = f'"{schema}".app_writes_{random.randrange(10**9)}'
        ddl = f"CREATE TABLE {app} (id bigserial PRIMARY KEY, writer text, fence bigint)"
    engine = sa.create_engine(to_sync_url(url))
    with engine.begin() as conn:
        conn.exec_driver_sql(ddl)
    engine.dispose()
    yield {
        "kind": request.param,
        "url": url,
        "schema": schema,
        "app": app,
        "sync_url": to_sync_url(url).render_as_string(hide_password=False),
        "async_url": to_async_url(url).render_as_string(hide_password=False),
    }
    if request.param in ("postgres", "mysql"):
        engine = sa.create_engine(to_sync_url(url))
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE {app}")
        engine.dispose()


def sync_engine(db: dict[str, Any], **options: Any) -> sa.Engine:
    if db["kind"] == "sqlite":
        options.setdefault("connect_args", {"timeout": 30})
    return sa.create_engine(db["sync_url"], **options)


def writes(db: dict[str, Any]) -> list[tuple[str, int]]:
    engine = sync_engine(db)
    try:
        with engine.connect() as conn:
            return [(w, f) for w, f in conn.exec_driver_sql(f"SELECT writer, fence FROM {db['app']} ORDER BY id")]
    finally:
        engine.dispose()


# -- arguments ------------------------------------------------------------------------------------


class RecordingConnection:
    """Looks like a sync SQLAlchemy connection; records every statement it is asked to run."""

    def __init__(self) -> None:
        self.dialect = sa.create_mock_engine("sqlite://", lambda *a, **k: None).dialect
        self.executed: list[Any] = []

    def execute(self, *args: Any) -> Any:
        self.executed.append(args)
        raise AssertionError("no SQL may run for bad arguments")


@pytest.mark.parametrize(
    ("key", "owner", "fence", "error"),
    [
        ("k", "o", True, TypeError),
        ("k", "o", 1.0, TypeError),
        ("k", "o", "1", TypeError),
        ("k", "o", 0, ValueError),
        ("k", "o", 2**63, ValueError),
        ("", "o", 1, ValueError),
        ("k", "", 1, ValueError),
        ("k", None, 1, TypeError),
        ("k", "o\x00", 1, ValueError),  # a NUL is refused in owners (keys take any str)
    ],
)
def test_bad_arguments_raise_before_any_sql(tmp_path: Path, key: Any, owner: Any, fence: Any, error: type) -> None:
    conn = RecordingConnection()
    with SyncSqlLeaseProvider(f"sqlite:///{tmp_path}/x.db") as leases:
        with pytest.raises(error):
            leases.check_held(conn, key, owner, fence)
        if fence != 1:
            with pytest.raises(error):
                leases.accept_fence(conn, "resource", fence)
    assert conn.executed == []


def test_bad_resource_or_connection(tmp_path: Path) -> None:
    conn = RecordingConnection()
    with SyncSqlLeaseProvider(f"sqlite:///{tmp_path}/x.db") as leases:
        for resource, error in (("", ValueError), ("x" * 513, ValueError), (b"r", TypeError), ("a\x00", ValueError)):
            with pytest.raises(error):
                leases.accept_fence(conn, resource, 1)
        with pytest.raises(TypeError, match="Connection or Session"):
            leases.check_held(object(), "k", "o", 1)
        with pytest.raises(TypeError, match="Connection or Session"):
            leases.accept_fence("sqlite://", "r", 1)
    assert conn.executed == []


# -- check_held: the rules --------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", ["", ":resource\x00thread\x01\ud800"])  # any str is a key (issue 24)
def test_check_held_accepts_only_the_holder_with_its_fence(db: dict[str, Any], key: str, suffix: str) -> None:
    key += suffix
    engine = sync_engine(db)
    with SyncSqlLeaseProvider(db["url"], schema=db["schema"]) as leases:
        held = leases.acquire_lease(key, "a", 60_000)
        with Session(engine) as session, session.begin():  # an ORM Session works as a Connection does
            leases.check_held(session, key, "a", held.fence)
        for owner, fence in (("b", held.fence), ("a", held.fence + 1), ("a", held.fence - 1 or 2)):
            with engine.begin() as conn, pytest.raises(LeaseLostError) as lost:
                leases.check_held(conn, key, owner, fence)
            assert lost.value.key == key and lost.value.owner == owner
        with engine.begin() as conn, pytest.raises(LeaseLostError):
            leases.check_held(conn, "missing:" + key, "a", held.fence)
        short = leases.acquire_lease(key + ":short", "a", 50)
        time.sleep(0.2)
        with engine.begin() as conn, pytest.raises(LeaseLostError):  # expired by the database's clock
            leases.check_held(conn, key + ":short", "a", short.fence)
        assert leases.release_lease(key, "a")
        with engine.begin() as conn, pytest.raises(LeaseLostError):
            leases.check_held(conn, key, "a", held.fence)
    engine.dispose()


async def test_async_check_held_on_connection_and_session(db: dict[str, Any], key: str) -> None:
    engine = create_async_engine(db["async_url"])
    try:
        async with SqlLeaseProvider(db["url"], schema=db["schema"]) as leases:
            held = await leases.acquire_lease(key, "a", 60_000)
            async with engine.begin() as conn:
                await leases.check_held(conn, key, "a", held.fence)
                await conn.exec_driver_sql(f"INSERT INTO {db['app']} (writer, fence) VALUES ('a', {held.fence})")
            async with AsyncSession(engine) as session, session.begin():
                await leases.check_held(session, key, "a", held.fence)
                assert await leases.accept_fence(session, "res:" + key, held.fence + 1) == held.fence + 1
            async with engine.begin() as conn:
                with pytest.raises(LeaseLostError):
                    await leases.check_held(conn, key, "b", held.fence)
                with pytest.raises(StaleFenceError) as stale:
                    await leases.accept_fence(conn, "res:" + key, held.fence)
                assert stale.value.accepted == held.fence + 1
    finally:
        await engine.dispose()
    assert writes(db) == [("a", held.fence)]


# -- accept_fence: the rules --------------------------------------------------------------------------


def test_accept_fence_keeps_the_highest_and_accepts_equal(db: dict[str, Any], key: str) -> None:
    engine = sync_engine(db)
    resource = "orders:" + key
    with SyncSqlLeaseProvider(db["url"], schema=db["schema"]) as leases:
        with engine.begin() as conn:
            assert leases.accept_fence(conn, resource, 5) == 5
        with engine.begin() as conn:
            assert leases.accept_fence(conn, resource, 5) == 5  # the same holder's next write
        with engine.begin() as conn, pytest.raises(StaleFenceError) as stale:
            leases.accept_fence(conn, resource, 4)
        assert (stale.value.resource, stale.value.fence, stale.value.accepted) == (resource, 4, 5)
        assert isinstance(stale.value, LeaseError)  # StaleFenceError(LeaseError): one except catches both
        with engine.connect() as conn:
            with conn.begin() as tx:
                assert leases.accept_fence(conn, resource, 9) == 9
                tx.rollback()  # in the caller's transaction: rolled back with it
            with conn.begin():
                assert leases.accept_fence(conn, resource, 6) == 6
    engine.dispose()


# -- a stalled holder, real processes ------------------------------------------------------------------------

WORKER = textwrap.dedent(
    """
    import asyncio, json, os, sys, time
    import sqlalchemy as sa
    from sqlalchemy.ext.asyncio import create_async_engine
    from sql_lease import LeaseLostError, SqlLeaseProvider, SyncSqlLeaseProvider

    role, face, url, schema, sync_url, async_url, app, key, acquired_mark, taken_mark = sys.argv[1:11]
    schema = schema or None
    sqlite = sync_url.startswith("sqlite")
    insert = sa.text(f"INSERT INTO {app} (writer, fence) VALUES (:w, :f)")

    def wait_for(path):  # the other process's step, signalled by a file (no race with the 300 ms TTL)
        deadline = time.monotonic() + 30
        while not os.path.exists(path):
            assert time.monotonic() < deadline, path
            time.sleep(0.01)

    def mark(path):
        with open(path, "w"):
            pass

    def sync_main():
        engine = sa.create_engine(sync_url, **({"connect_args": {"timeout": 30}} if sqlite else {}))
        with SyncSqlLeaseProvider(url, schema=schema) as leases:
            if role == "stalled":
                held = leases.acquire_lease(key, "stalled", 300)
                assert held.acquired
                mark(acquired_mark)
                time.sleep(1.0)  # a GC pause, a frozen VM: past the TTL...
                wait_for(taken_mark)  # ...while another owner takes over
                outcome = "committed"
                try:
                    with engine.begin() as conn:
                        conn.execute(insert, {"w": "stalled", "f": held.fence})
                        leases.check_held(conn, key, "stalled", held.fence)
                except LeaseLostError as exc:
                    outcome = "lost: " + str(exc)
                result = {"fence": held.fence, "outcome": outcome}
            else:
                wait_for(acquired_mark)
                held = leases.acquire_lease_wait(key, "taker", 10_000, timeout_s=10)
                mark(taken_mark)
                for _ in range(3):
                    with engine.begin() as conn:
                        leases.check_held(conn, key, "taker", held.fence)
                        conn.execute(insert, {"w": "taker", "f": held.fence})
                leases.release_lease(key, "taker")
                result = {"fence": held.fence, "outcome": "committed"}
        engine.dispose()
        return result

    async def async_main():
        engine = create_async_engine(async_url, **({"connect_args": {"timeout": 30}} if sqlite else {}))
        async with SqlLeaseProvider(url, schema=schema) as leases:
            if role == "stalled":
                held = await leases.acquire_lease(key, "stalled", 300)
                assert held.acquired
                mark(acquired_mark)
                time.sleep(1.0)  # a blocked event loop: past the TTL...
                wait_for(taken_mark)  # ...while another owner takes over
                outcome = "committed"
                try:
                    async with engine.begin() as conn:
                        await conn.execute(insert, {"w": "stalled", "f": held.fence})
                        await leases.check_held(conn, key, "stalled", held.fence)
                except LeaseLostError as exc:
                    outcome = "lost: " + str(exc)
                result = {"fence": held.fence, "outcome": outcome}
            else:
                await asyncio.to_thread(wait_for, acquired_mark)
                held = await leases.acquire_lease_wait(key, "taker", 10_000, timeout_s=10)
                mark(taken_mark)
                for _ in range(3):
                    async with engine.begin() as conn:
                        await leases.check_held(conn, key, "taker", held.fence)
                        await conn.execute(insert, {"w": "taker", "f": held.fence})
                await leases.release_lease(key, "taker")
                result = {"fence": held.fence, "outcome": "committed"}
        await engine.dispose()
        return result

    print(json.dumps(sync_main() if face == "sync" else asyncio.run(async_main())))
    """
)


@pytest.mark.parametrize("face", ["sync", "async"])
def test_a_stalled_holder_cannot_commit_after_a_takeover(
    db: dict[str, Any], key: str, tmp_path: Path, face: str
) -> None:
    script = tmp_path / "fence_worker.py"
    script.write_text(WORKER)
    marks = [str(tmp_path / "acquired"), str(tmp_path / "taken")]
    args = [face, db["url"], db["schema"] or "", db["sync_url"], db["async_url"], db["app"], key, *marks]
    stalled, taker = json_summaries(run_scripts(script, [["stalled", *args], ["taker", *args]], REPO, timeout_s=60))
    assert stalled["outcome"].startswith("lost: "), stalled
    assert taker["outcome"] == "committed" and taker["fence"] > stalled["fence"]
    assert writes(db) == [("taker", taker["fence"])] * 3  # nothing the stalled holder wrote is visible


# -- a takeover waits for an open guarded transaction -------------------------------------------------------


async def test_a_takeover_waits_for_the_guarded_transaction(db: dict[str, Any], key: str) -> None:
    engine = create_async_engine(db["async_url"])
    try:
        async with (
            SqlLeaseProvider(db["url"], schema=db["schema"]) as holder,
            SqlLeaseProvider(db["url"], schema=db["schema"]) as other,
        ):
            async with engine.connect() as conn:
                await conn.begin()
                held = await holder.acquire_lease(key, "a", GUARDED_TTL_MS)
                await holder.check_held(conn, key, "a", held.fence)  # first: nothing written yet
                await asyncio.sleep(GUARDED_TTL_MS / 1000 + 0.2)  # expired by now, but the check still guards
                takeover = asyncio.create_task(other.acquire_lease(key, "b", 60_000))
                await asyncio.sleep(0.7)
                assert not takeover.done(), "the takeover must wait for the guarded transaction"
                await conn.exec_driver_sql(f"INSERT INTO {db['app']} (writer, fence) VALUES ('a', {held.fence})")
                await conn.commit()
            taken = await asyncio.wait_for(takeover, 5)
            assert taken.acquired and taken.owner == "b" and taken.fence > held.fence
            async with engine.begin() as conn:
                with pytest.raises(LeaseLostError):
                    await holder.check_held(conn, key, "a", held.fence)
                await other.check_held(conn, key, "b", taken.fence)
                await conn.exec_driver_sql(f"INSERT INTO {db['app']} (writer, fence) VALUES ('b', {taken.fence})")
    finally:
        await engine.dispose()
    assert writes(db) == [("a", held.fence), ("b", taken.fence)]


def test_sync_takeover_waits_for_the_guarded_transaction(db: dict[str, Any], key: str) -> None:
    engine = sync_engine(db)
    result: dict[str, Any] = {}
    with (
        SyncSqlLeaseProvider(db["url"], schema=db["schema"]) as holder,
        SyncSqlLeaseProvider(db["url"], schema=db["schema"], operation_timeout_s=10) as other,
    ):
        with engine.begin() as conn:
            held = holder.acquire_lease(key, "a", GUARDED_TTL_MS)
            holder.check_held(conn, key, "a", held.fence)
            time.sleep(GUARDED_TTL_MS / 1000 + 0.2)  # the lease has expired by now, but the check still guards
            takeover = threading.Thread(target=lambda: result.update(lease=other.acquire_lease(key, "b", 60_000)))
            takeover.start()
            time.sleep(0.7)
            assert takeover.is_alive(), "the takeover must wait for the guarded transaction"
            conn.exec_driver_sql(f"INSERT INTO {db['app']} (writer, fence) VALUES ('a', {held.fence})")
        takeover.join(10)
        taken = result["lease"]
        assert taken.acquired and taken.owner == "b" and taken.fence > held.fence
        with engine.begin() as conn:
            with pytest.raises(LeaseLostError):
                holder.check_held(conn, key, "a", held.fence)
            other.check_held(conn, key, "b", taken.fence)
            conn.exec_driver_sql(f"INSERT INTO {db['app']} (writer, fence) VALUES ('b', {taken.fence})")
    engine.dispose()
    assert writes(db) == [("a", held.fence), ("b", taken.fence)]


# -- the holder's own renewal --------------------------------------------------------------------------------


async def test_the_holders_renewal_waits_for_its_guarded_transaction_without_deadlock(
    db: dict[str, Any], key: str
) -> None:
    engine = create_async_engine(db["async_url"])
    try:
        async with (
            SqlLeaseProvider(db["url"], schema=db["schema"], operation_timeout_s=5) as leases,
            SqlLeaseProvider(db["url"], schema=db["schema"]) as observer,
            leases.hold(key, ttl_ms=3_000, renew_every_ms=500) as lease,
        ):
            first = (await observer.get_lease(key)).expires_at  # type: ignore[union-attr]
            async with engine.connect() as conn:
                await conn.begin()
                await leases.check_held(conn, key, lease.owner, lease.fence)
                await conn.exec_driver_sql(f"INSERT INTO {db['app']} (writer, fence) VALUES ('a', {lease.fence})")
                await asyncio.sleep(1.6)  # three renewals fall due meanwhile
                during = (await observer.get_lease(key)).expires_at  # type: ignore[union-attr]
                assert during == first, "a renewal must wait for the guarded transaction"
                await conn.commit()
            await asyncio.sleep(0.8)
            after = await observer.get_lease(key)
            assert after is not None and after.owner == lease.owner and after.fence == lease.fence
            assert after.expires_at > first and not lease.lost.is_set()
            async with engine.begin() as conn:
                await leases.check_held(conn, key, lease.owner, lease.fence)
    finally:
        await engine.dispose()
    assert writes(db) == [("a", lease.fence)]


def test_sync_hold_renewal_waits_for_a_guarded_transaction(db: dict[str, Any], key: str) -> None:
    engine = sync_engine(db)
    with (
        SyncSqlLeaseProvider(db["url"], schema=db["schema"], operation_timeout_s=5) as leases,
        leases.hold(key, ttl_ms=3_000, renew_every_ms=500) as lease,
    ):
        first = leases.get_lease(key).expires_at  # type: ignore[union-attr]
        with engine.begin() as conn:
            leases.check_held(conn, key, lease.owner, lease.fence)
            conn.exec_driver_sql(f"INSERT INTO {db['app']} (writer, fence) VALUES ('a', {lease.fence})")
            time.sleep(1.6)
        time.sleep(0.8)
        lease.check()
        assert leases.get_lease(key).expires_at > first  # type: ignore[union-attr]
        with engine.begin() as conn:
            leases.check_held(conn, key, lease.owner, lease.fence)
    engine.dispose()
    assert writes(db) == [("a", lease.fence)]


# -- accept_fence under concurrency ------------------------------------------------------------------------


def test_accept_fence_under_16_concurrent_writers(db: dict[str, Any], key: str) -> None:
    resource = "orders:" + key
    engine = sync_engine(db, pool_size=16, max_overflow=0)
    counter = itertools.count(1)
    counter_lock = threading.Lock()
    refused: list[tuple[int, int | None]] = []
    attempted: list[int] = []
    errors: list[BaseException] = []
    start = threading.Barrier(16)

    def writer(n: int) -> None:
        rng = random.Random(n)
        try:
            with SyncSqlLeaseProvider(db["url"], schema=db["schema"]) as leases:
                start.wait()
                for _ in range(20):
                    with counter_lock:
                        fence = max(1, next(counter) - rng.randint(0, 6))  # interleaved, some stale
                        attempted.append(fence)
                    try:
                        with engine.begin() as conn:
                            leases.accept_fence(conn, resource, fence)
                            conn.execute(
                                sa.text(f"INSERT INTO {db['app']} (writer, fence) VALUES (:w, :f)"),
                                {"w": f"w{n}", "f": fence},
                            )
                            if rng.random() < 0.3:
                                time.sleep(0.001)  # hold the row a while: others queue behind it
                    except StaleFenceError as exc:
                        assert exc.fence == fence and exc.resource == resource
                        refused.append((fence, exc.accepted))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    engine.dispose()
    assert not errors, errors
    log = [fence for _, fence in writes(db)]  # in commit order: every writer queued on the fence row
    assert len(log) + len(refused) == len(attempted) == 16 * 20
    assert log == sorted(log), "the recorded fence went down"
    assert refused, "interleaved fences must produce stale writes"
    assert all(accepted is not None and fence < accepted for fence, accepted in refused)
    final = sa.create_engine(db["sync_url"])
    with final.connect() as conn:
        quote = conn.dialect.identifier_preparer.quote_identifier
        table = f"{quote(db['schema'])}.sql_leases_fences" if db["schema"] else "sql_leases_fences"
        recorded = conn.execute(sa.text(f"SELECT fence FROM {table} WHERE resource = :r"), {"r": resource}).scalar()
    final.dispose()
    assert recorded == max(attempted) == log[-1]


async def test_async_accept_fence_under_16_concurrent_writers(db: dict[str, Any], key: str) -> None:
    resource = "orders:" + key
    options = {"connect_args": {"timeout": 30}} if db["kind"] == "sqlite" else {}
    engine = create_async_engine(db["async_url"], pool_size=16, max_overflow=0, **options)
    fences = itertools.count(1)
    attempted: list[int] = []
    refused: list[tuple[int, int | None]] = []
    start = asyncio.Barrier(16)
    try:
        async with SqlLeaseProvider(db["url"], schema=db["schema"]) as leases:

            async def writer(n: int) -> None:
                rng = random.Random(n)
                await start.wait()
                for _ in range(20):
                    fence = max(1, next(fences) - rng.randint(0, 6))  # interleaved, some stale
                    attempted.append(fence)
                    try:
                        async with engine.begin() as conn:
                            await leases.accept_fence(conn, resource, fence)
                            await conn.execute(
                                sa.text(f"INSERT INTO {db['app']} (writer, fence) VALUES (:w, :f)"),
                                {"w": f"w{n}", "f": fence},
                            )
                            await asyncio.sleep(0.001 if rng.random() < 0.3 else 0)  # others queue behind
                    except StaleFenceError as exc:
                        assert exc.fence == fence and exc.resource == resource
                        refused.append((fence, exc.accepted))

            await asyncio.wait_for(asyncio.gather(*(writer(n) for n in range(16))), 120)
    finally:
        await engine.dispose()
    log = [fence for _, fence in writes(db)]  # in commit order: every writer queued on the fence row
    assert len(log) + len(refused) == len(attempted) == 16 * 20
    assert log == sorted(log), "the recorded fence went down"
    assert refused, "interleaved fences must produce stale writes"
    assert all(accepted is not None and fence < accepted for fence, accepted in refused)
    assert max(log) == max(attempted)


# -- @leased hands the lease (key, owner, fence) to the body ------------------------------------------------


def test_sync_leased_body_guards_its_write(db: dict[str, Any], key: str) -> None:
    engine = sync_engine(db)
    with SyncSqlLeaseProvider(db["url"], schema=db["schema"]) as leases:

        @leased(leases, key, ttl_ms=10_000, owner="cron@host-1")
        def job(lease: SyncHeldLease, fence: int) -> int:
            assert (lease.key, lease.owner, lease.fence) == (key, "cron@host-1", fence)
            with Session(engine) as session, session.begin():
                leases.check_held(session, lease.key, lease.owner, lease.fence)
                session.execute(sa.text(f"INSERT INTO {db['app']} (writer, fence) VALUES ('job', :f)"), {"f": fence})
            return fence

        fence = job()
        with engine.begin() as conn, pytest.raises(LeaseLostError):  # released after the call
            leases.check_held(conn, key, "cron@host-1", fence)
    engine.dispose()
    assert writes(db) == [("job", fence)]


async def test_async_leased_and_hold_bodies_guard_their_writes(db: dict[str, Any], key: str) -> None:
    engine = create_async_engine(db["async_url"])
    try:
        async with SqlLeaseProvider(db["url"], schema=db["schema"]) as leases:

            @leased(leases, key, ttl_ms=10_000)
            async def job(lease: HeldLease) -> int:
                assert lease.fence is not None
                async with AsyncSession(engine) as session, session.begin():
                    await leases.check_held(session, lease.key, lease.owner, lease.fence)
                    insert = sa.text(f"INSERT INTO {db['app']} (writer, fence) VALUES ('job', :f)")
                    await session.execute(insert, {"f": lease.fence})
                return lease.fence

            first = await job()
            async with leases.hold(key, ttl_ms=10_000) as lease:
                assert lease.fence is not None and lease.fence > first
                async with engine.begin() as conn:
                    await leases.check_held(conn, lease.key, lease.owner, lease.fence)
                    await conn.exec_driver_sql(
                        f"INSERT INTO {db['app']} (writer, fence) VALUES ('hold', {lease.fence})"
                    )
    finally:
        await engine.dispose()
    assert writes(db) == [("job", first), ("hold", lease.fence)]


# -- the fence table elsewhere: migrate --fences-only -------------------------------------------------------


def test_migrate_fences_only_creates_just_the_fence_table(tmp_path: Path) -> None:
    from sql_lease.cli import cli

    url = f"sqlite:///{tmp_path}/resource.db"
    for _ in range(2):  # idempotent
        done = CliRunner().invoke(cli, ["migrate", "--fences-only", "--url", url])
        assert done.exit_code == 0, done.output
        assert "fence table sql_leases_fences" in done.output
    engine = sa.create_engine(url)
    assert set(sa.inspect(engine).get_table_names()) == {"sql_leases_fences"}
    with SyncSqlLeaseProvider(f"sqlite:///{tmp_path}/leases.db") as leases:  # leases elsewhere
        with engine.begin() as conn:
            assert leases.accept_fence(conn, "r", 3) == 3
        with engine.begin() as conn, pytest.raises(StaleFenceError):
            leases.accept_fence(conn, "r", 2)
    engine.dispose()
    sql = CliRunner().invoke(cli, ["migrate", "--fences-only", "--sql", "--url", "postgresql://u@h/d"])
    assert sql.exit_code == 0 and "CREATE TABLE IF NOT EXISTS sql_leases_fences" in sql.output
    assert "TIMESTAMP WITH TIME ZONE" in sql.output


@pytest.mark.postgres
def test_migrate_fences_only_on_postgres(pg_url: str, fresh_pg_schema: str) -> None:
    from sql_lease.cli import cli

    done = CliRunner().invoke(cli, ["migrate", "--fences-only", "--url", pg_url, "--schema", fresh_pg_schema])
    assert done.exit_code == 0, done.output
    engine = sa.create_engine(to_sync_url(pg_url))
    assert sa.inspect(engine).get_table_names(schema=fresh_pg_schema) == ["sql_leases_fences"]
    engine.dispose()


# -- a check that guards nothing is refused (issue 20 item 6) -------------------------------------------


def test_check_held_in_autocommit_or_a_sqlite_savepoint_is_a_config_error(db: dict[str, Any], key: str) -> None:
    from sql_lease import LeaseConfigError
    from sql_lease.sql.fencing import UnguardedCheckError

    autocommit_engine = sync_engine(db, isolation_level="AUTOCOMMIT")
    engine = sync_engine(db)
    with SyncSqlLeaseProvider(db["url"], schema=db["schema"]) as leases:
        held = leases.acquire_lease(key, "a", 60_000)
        with autocommit_engine.connect() as conn, pytest.raises(UnguardedCheckError, match="AUTOCOMMIT") as caught:
            leases.check_held(conn, key, "a", held.fence)
        assert isinstance(caught.value, LeaseConfigError) and not isinstance(caught.value, LeaseLostError)
        with engine.connect() as conn:
            one = conn.execution_options(isolation_level="AUTOCOMMIT")
            with pytest.raises(UnguardedCheckError, match="autocommit"):
                leases.check_held(one, key, "a", held.fence)
        with Session(autocommit_engine) as session, pytest.raises(UnguardedCheckError):
            leases.check_held(session, key, "a", held.fence)
        with engine.connect() as conn, conn.begin():
            nested = conn.begin_nested()
            if db["kind"] == "sqlite":  # releasing a savepoint that opened the transaction commits it
                with pytest.raises(UnguardedCheckError, match="SAVEPOINT"):
                    leases.check_held(conn, key, "a", held.fence)
            else:  # PostgreSQL: locks taken in a savepoint pass to the transaction when it is released
                leases.check_held(conn, key, "a", held.fence)
            nested.rollback()
        with Session(engine) as session, session.begin():
            leases.check_held(session, key, "a", held.fence)  # a plain transaction still passes
        # a lost lease in autocommit: the configuration is reported first, it is what to fix
        with autocommit_engine.connect() as conn, pytest.raises(UnguardedCheckError):
            leases.check_held(conn, key, "b", held.fence)
    autocommit_engine.dispose()
    engine.dispose()


async def test_async_check_held_in_autocommit_or_a_sqlite_savepoint_is_a_config_error(
    db: dict[str, Any], key: str
) -> None:
    from sql_lease.sql.fencing import UnguardedCheckError

    autocommit_engine = create_async_engine(db["async_url"], isolation_level="AUTOCOMMIT")
    engine = create_async_engine(db["async_url"])
    try:
        async with SqlLeaseProvider(db["url"], schema=db["schema"]) as leases:
            held = await leases.acquire_lease(key, "a", 60_000)
            async with autocommit_engine.connect() as conn:
                with pytest.raises(UnguardedCheckError, match="autocommit"):
                    await leases.check_held(conn, key, "a", held.fence)
            async with AsyncSession(autocommit_engine) as session:
                with pytest.raises(UnguardedCheckError):
                    await leases.check_held(session, key, "a", held.fence)
            async with AsyncSession(engine) as session, session.begin():
                await session.begin_nested()
                if db["kind"] == "sqlite":
                    with pytest.raises(UnguardedCheckError, match="SAVEPOINT"):
                        await leases.check_held(session, key, "a", held.fence)
                else:
                    await leases.check_held(session, key, "a", held.fence)
            async with engine.begin() as conn:
                await leases.check_held(conn, key, "a", held.fence)
    finally:
        await autocommit_engine.dispose()
        await engine.dispose()
