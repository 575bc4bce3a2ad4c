"""Issue 13: a release that does not wait for the disk, and coalesced renewals."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg
import pytest

from sql_lease import SqlLeaseProvider, hold
from sql_lease.sql.schema import LeaseTableNames
from sql_lease.sql.statements import OWN_CONNECTION_SETUP, PostgresStatements, statements_for
from tests.support.pgserver import start_again, throwaway_postgres


def plain(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://")


class Counted:
    """Counts the statements a SQL provider sends (memory providers send none)."""

    def __init__(self, provider: Any) -> None:
        self.sql: list[str] = []
        hook = getattr(provider, "on_statement", None)
        self.remove = hook(lambda sql, params: self.sql.append(sql)) if hook else (lambda: None)

    def batch(self) -> int:
        # MySQL reads a batch's renewed rows back with a second statement (a SELECT): one batch
        return sum(
            any(batch in sql for batch in ("unnest", "json_each", "JSON_TABLE"))
            and not sql.lstrip().startswith("SELECT")
            for sql in self.sql
        )

    def single_renewals(self) -> int:
        return sum(
            sql.lstrip().startswith(("WITH durable", "WITH renewed", "UPDATE"))
            and not any(batch in sql for batch in ("unnest", "json_each", "JSON_TABLE", "last_fence"))
            for sql in self.sql
        )


# -- the relaxed release --------------------------------------------------------------------------


def test_release_is_relaxed_by_default_and_durable_on_request() -> None:
    names = LeaseTableNames()
    relaxed, durable = PostgresStatements(names), PostgresStatements(names, durable_release=True)
    assert "set_config('synchronous_commit', 'off', true)" in relaxed.release
    assert "'off'" not in durable.release.replace("WHEN 'off' THEN", "")
    assert durable.release.count("set_config") == 1
    for s in (relaxed, durable):  # the other writes stay pinned
        for statement in (s.acquire, s.acquire_waiting, s.renew, s.transfer, s.renew_many):
            assert "WHEN 'off' THEN 'on'" in statement
    assert statements_for("postgresql", names, durable_release=True).release == durable.release
    assert statements_for("sqlite", names).release == statements_for("sqlite", names, durable_release=True).release


def test_statements_for_a_durable_session_pin_nothing_themselves() -> None:
    names = LeaseTableNames()
    for durable_release in (False, True):
        s = statements_for("postgresql", names, durable_release=durable_release, durable_session=True)
        for statement in (s.acquire, s.acquire_waiting, s.renew, s.transfer, s.renew_many):
            assert "synchronous_commit" not in statement
        relaxing = "set_config('synchronous_commit', 'off', true)" in s.release
        assert relaxing is not durable_release and s.release.count("synchronous_commit") == int(relaxing)
    assert "WHEN 'off' THEN 'on'" in OWN_CONNECTION_SETUP[-1] and "false)" in OWN_CONNECTION_SETUP[-1]


@pytest.mark.postgres
async def test_provider_release_option_chooses_the_statement(pg_schema: tuple[str, str], key: str) -> None:
    url, schema = pg_schema
    for durable, relaxed in ((False, True), (True, False)):
        async with SqlLeaseProvider(url, schema=schema, durable_release=durable) as leases:
            seen = Counted(leases)
            assert (await leases.acquire_lease(key, "a", 10_000)).acquired
            assert await leases.release_lease(key, "a")
            assert ("'off', true" in seen.sql[-1]) is relaxed
            assert await leases.get_lease_owner(key) is None


@pytest.mark.postgres
async def test_only_connections_the_provider_made_are_pinned_per_session(pg_schema: tuple[str, str], key: str) -> None:
    """Its own connections are made durable once (no pin per statement, about 20 µs of server CPU
    each); a borrowed engine's and PgBouncer's shared ones get the pin in every statement instead."""
    from sqlalchemy import create_engine
    from sqlalchemy.ext.asyncio import create_async_engine

    from sql_lease import SyncSqlLeaseProvider

    url, schema = pg_schema
    app_engine = create_async_engine(url.replace("postgresql://", "postgresql+asyncpg://", 1))
    sync_engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    cases: list[tuple[str, Any, bool]] = [
        ("url", SqlLeaseProvider(url, schema=schema), False),
        ("pgbouncer", SqlLeaseProvider(url, schema=schema, pgbouncer=True), True),
        ("engine", SqlLeaseProvider(app_engine, schema=schema), True),
        ("sync url", SyncSqlLeaseProvider(url, schema=schema), False),
        ("sync engine", SyncSqlLeaseProvider(sync_engine, schema=schema), True),
    ]
    try:
        for name, leases, pinned in cases:
            seen = Counted(leases)
            ops = [("acquire", key, name, 10_000), ("renew", key, name, 10_000), ("release", key, name)]
            for op, *args in ops:
                call = getattr(leases, f"{op}_lease")(*args)
                result = await call if asyncio.iscoroutine(call) else call
                assert result, f"{name}: {op} failed"
            acquire, renew, release = seen.sql
            for statement in (acquire, renew):
                assert ("WHEN 'off' THEN 'on'" in statement) is pinned, f"{name}: {statement}"
            assert "'off', true" in release and "WHEN 'off' THEN 'on'" not in release
    finally:
        for _, leases, _ in cases:
            closing = leases.close()
            if asyncio.iscoroutine(closing):
                await closing
        await app_engine.dispose()
        sync_engine.dispose()


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.parametrize(
    ("limit", "several"),
    [(1, False), (3, False), (1, True), (3, True)],
    ids=["lease", "semaphore slot", "release_leases", "release_leases of a semaphore slot"],
)
async def test_relaxed_release_is_not_flushed_at_commit(limit: int, several: bool) -> None:
    """With a long wal_writer_delay, the WAL flush position stays behind a relaxed release's commit
    and reaches a durable release's commit: a plain lease's, and a semaphore slot's, by
    ``release_lease`` and by ``release_leases``."""
    from tests.test_faults import migrate

    with throwaway_postgres(log_min_messages="error", wal_writer_delay="10000") as (url, _executor):
        await migrate(url, None)
        raw = await asyncpg.connect(plain(url))
        try:
            for durable in (False, True):
                async with SqlLeaseProvider(url, durable_release=durable) as leases:
                    assert (await leases.acquire_lease("k", "a", 60_000, limit=limit)).acquired
                    await raw.execute("CHECKPOINT")
                    if several:
                        assert await leases.release_leases(["k"], "a") == 1
                    else:
                        assert await leases.release_lease("k", "a")
                    behind = await raw.fetchval(
                        "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), pg_current_wal_flush_lsn())"
                    )
                    if durable:
                        assert behind == 0, "a durable release returned before its commit was flushed"
                    else:
                        assert behind > 0, "a relaxed release was flushed at commit"
        finally:
            await raw.close()


@pytest.mark.slow
@pytest.mark.postgres
async def test_a_crash_right_after_relaxed_releases_never_hands_a_lease_to_another_owner() -> None:
    from tests.test_faults import migrate, stop_server

    with throwaway_postgres(log_min_messages="error", synchronous_commit="off", wal_writer_delay="10000") as (
        url,
        executor,
    ):
        await migrate(url, None)
        async with SqlLeaseProvider(url) as leases:
            held = {f"r{i}": await leases.acquire_lease(f"r{i}", f"owner{i}", 600_000) for i in range(20)}
            early = await leases.acquire_lease("renewed", "r", 60_000)
            assert (await leases.acquire_lease("moved", "m", 600_000)).acquired
            raw = await asyncpg.connect(plain(url))
            await raw.execute("CHECKPOINT")
            await raw.close()
            acquired = [await leases.acquire_lease(f"k{i}", "owner", 600_000) for i in range(3)]
            assert await leases.renew_lease("renewed", "r", 600_000)
            assert await leases.transfer_lease("moved", "m", "m2", 600_000)
            for i in range(20):
                assert await leases.release_lease(f"r{i}", f"owner{i}")
            highest = max([r.fence for r in held.values()] + [r.fence for r in acquired])  # type: ignore[type-var]
            stop_server(executor, "immediate")  # released, then the server crashes at once
        start_again(executor)
        async with SqlLeaseProvider(url) as leases:
            for key, result in held.items():
                lease = await leases.get_lease(key)
                assert lease is None or (lease.owner == result.owner and lease.fence == result.fence), (
                    f"{key}: after the crash {lease} instead of released or {result.owner}'s fence {result.fence}"
                )
            for i, result in enumerate(acquired):
                lease = await leases.get_lease(f"k{i}")
                assert lease is not None and lease.fence == result.fence, f"acquire k{i} lost in the crash"
            assert await leases.get_lease_owner("moved") == "m2", "transfer lost in the crash"
            renewed = await leases.get_lease("renewed")
            assert renewed is not None and early.expires_at is not None and renewed.expires_at is not None
            assert (renewed.expires_at - early.expires_at).total_seconds() > 60, "renewal lost in the crash"
            fresh = await leases.acquire_lease("after-the-crash", "new", 10_000)
            assert fresh.acquired and fresh.fence is not None and highest is not None and fresh.fence > highest


# -- batch renewal ------------------------------------------------------------------------------------


async def test_renew_many_renews_owned_live_leases_and_refuses_others(provider: Any, key: str) -> None:
    mine, theirs, short = f"{key}:mine", f"{key}:theirs", f"{key}:short"
    assert (await provider.acquire_lease(mine, "a", 5_000)).acquired
    assert (await provider.acquire_lease(theirs, "b", 5_000)).acquired
    assert (await provider.acquire_lease(short, "a", 50)).acquired
    await asyncio.sleep(0.15)
    seen = Counted(provider)
    renewed = await provider.renew_many(
        [(mine, "a", 60_000), (theirs, "a", 60_000), (short, "a", 60_000), (f"{key}:none", "a", 60_000)]
    )
    assert set(renewed) == {mine}
    info = renewed[mine]
    assert info.owner == "a" and info.remaining_ms is not None and info.remaining_ms > 50_000
    lease = await provider.get_lease(mine)
    assert lease is not None and lease.fence == info.fence and lease.remaining_ms > 50_000
    assert await provider.get_lease_owner(theirs) == "b"
    assert await provider.get_lease_owner(short) is None
    if hasattr(provider, "on_statement"):
        assert seen.batch() == 1
    assert await provider.renew_many([]) == {}


async def test_renew_many_refuses_bad_input_before_any_sql(provider: Any, key: str) -> None:
    seen = Counted(provider)
    bad: list[Any] = [
        "abc",
        [(key, "a")],
        [(key, "a", -1)],
        [(key, "", 1000)],
        [("", "a", 1000)],
        [(key, "a", 1000), (key, "b", 1000)],
        [(key, "a", float("nan"))],
        None,
    ]
    for items in bad:
        with pytest.raises((TypeError, ValueError)):
            await provider.renew_many(items)
    assert seen.sql == []


async def test_renew_many_beyond_one_statement(sql_provider: SqlLeaseProvider, key: str) -> None:
    keys = [f"{key}:{i}" for i in range(1_500)]
    for k in keys:
        assert (await sql_provider.acquire_lease(k, "a", 30_000)).acquired
    seen = Counted(sql_provider)
    renewed = await sql_provider.renew_many([(k, "a", 60_000) for k in keys])
    assert set(renewed) == set(keys)
    assert seen.batch() == 2


async def test_200_held_leases_renew_in_a_few_statements_per_interval(provider: Any, key: str) -> None:
    ttl_ms, every_ms = 1_500, 300
    holds = [
        hold(provider, f"{key}:{i}", f"owner-{i}", ttl_ms, renew_every_ms=every_ms, on_lost="flag") for i in range(200)
    ]
    for h in holds:
        await h.__aenter__()
    try:
        seen = Counted(provider)
        started = time.monotonic()
        await asyncio.sleep(2.0)
        intervals = (time.monotonic() - started) / (every_ms / 1000)
        if hasattr(provider, "on_statement"):
            assert seen.single_renewals() == 0
            assert seen.batch() <= 3 * intervals, f"{seen.batch()} statements in {intervals:.1f} intervals"
            assert seen.batch() >= intervals - 2
        assert not any(h.lost.is_set() for h in holds)
        for h in holds:  # every lease still has most of its TTL left by the database's clock
            lease = await provider.get_lease(h.key)
            assert lease is not None and lease.owner == h.owner and lease.remaining_ms > ttl_ms * 0.5
        # one of them taken over by another owner: its hold (alone) sees the loss within the TTL
        victim = holds[17]
        assert await provider.transfer_lease(victim.key, victim.owner, "thief", 60_000)
        taken = time.monotonic()
        await asyncio.wait_for(victim.lost.wait(), ttl_ms / 1000)
        assert time.monotonic() - taken < ttl_ms / 1000
        assert victim.lost_reason and "refused" in victim.lost_reason
        await asyncio.sleep(every_ms / 1000 * 2)
        assert [h for h in holds if h.lost.is_set()] == [victim]
    finally:
        seen.remove()
        for h in holds:
            await h.__aexit__(None, None, None)
    for h in holds[:5]:
        assert await provider.get_lease_owner(h.key) in (None, "thief")


async def test_batched_renewals_fail_over_to_loss_at_the_deadline(sql_provider: SqlLeaseProvider, key: str) -> None:
    """A batch statement that never answers: each hold declares its loss by its own deadline."""
    original = type(sql_provider).renew_many

    async def hang(self: Any, items: Any) -> Any:
        await asyncio.sleep(3600)

    async with hold(sql_provider, key, "a", 1_000, renew_every_ms=200, on_lost="flag") as lease:
        type(sql_provider).renew_many = hang  # type: ignore[method-assign]
        try:
            started = time.monotonic()
            await asyncio.wait_for(lease.lost.wait(), 1.5)
            assert time.monotonic() - started < 1.0
            assert lease.lost_reason and "no renewal succeeded" in lease.lost_reason
        finally:
            type(sql_provider).renew_many = original  # type: ignore[method-assign]


async def test_a_batch_renews_with_the_longest_ttl_of_a_nested_hold_not_due_in_it(provider: Any, key: str) -> None:
    """The outer hold (TTL 5 s) renews every 2 s; the inner one (TTL 600 ms) every 100 ms, so the
    inner hold's batches never carry the outer's renewal, and must still renew for 5 s."""
    async with hold(provider, key, "a", 5_000, renew_every_ms=2_000) as outer:
        async with hold(provider, key, "a", 600, renew_every_ms=100):
            await asyncio.sleep(0.5)
            lease = await provider.get_lease(key)
            assert lease is not None and lease.remaining_ms > 1_000  # the outer TTL, not the inner's
        assert not outer.lost.is_set()


async def test_nested_holds_share_one_batch_item_with_the_longest_ttl(provider: Any, key: str) -> None:
    async with hold(provider, key, "a", 600, renew_every_ms=100) as outer:
        async with hold(provider, key, "a", 5_000, renew_every_ms=100):
            await asyncio.sleep(0.5)
            lease = await provider.get_lease(key)
            assert lease is not None and lease.remaining_ms > 1_000  # the inner TTL, not the outer's
        await asyncio.sleep(0.3)
        assert not outer.lost.is_set()


async def test_held_leases_renewed_in_batches_cost_no_task_each(sql_provider: SqlLeaseProvider, key: str) -> None:
    """A process holding thousands of leases keeps a few objects per lease: no task per hold (a
    task with its coroutines and context per lease made the GC's full collections 2 % of a core)."""
    before = len(asyncio.all_tasks())
    holds = [hold(sql_provider, f"{key}:{i}", f"owner-{i}", 1_500, renew_every_ms=300) for i in range(100)]
    for h in holds:
        await h.__aenter__()
    try:
        await asyncio.sleep(0.7)  # renewed at least twice
        assert len(asyncio.all_tasks()) - before < 20, "a task per held lease"  # the batcher's few, not 100
        assert not any(h.lost.is_set() for h in holds)
    finally:
        for h in holds:
            await h.__aexit__(None, None, None)
    assert len(asyncio.all_tasks()) - before < 20
    assert await sql_provider.list_leases(prefix=key) == []


async def test_a_renew_many_that_raises_at_the_call_still_ends_in_a_declared_loss() -> None:
    """A provider whose ``renew_many`` is a plain method that raises before returning an
    awaitable: each hold retries, then declares its loss by its deadline (never runs on unrenewed)."""
    from sql_lease import InMemoryLeaseProvider

    class Broken(InMemoryLeaseProvider):
        def renew_many(self, items: Any) -> Any:  # type: ignore[override]
            raise ConnectionError("the database went away")

    provider = Broken()
    async with hold(provider, "k", "a", 600, renew_every_ms=100, on_lost="flag") as lease:
        started = time.monotonic()
        await asyncio.wait_for(lease.lost.wait(), 2.0)
        assert time.monotonic() - started < 0.7
        assert lease.lost_reason and "ConnectionError" in lease.lost_reason


def test_a_provider_held_from_one_event_loop_after_another_keeps_none_of_them() -> None:
    """A worker that runs each job with ``asyncio.run`` and one provider: the renewal batcher of a
    finished loop must not keep that loop (and everything on it) alive for the provider's life."""
    import gc
    import weakref

    from sql_lease import InMemoryLeaseProvider

    provider = InMemoryLeaseProvider()
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def job(i: int) -> None:
        async with hold(provider, f"job:{i}", "worker", 600, renew_every_ms=100):
            await asyncio.sleep(0.25)  # renewed at least once
        loops.append(weakref.ref(asyncio.get_running_loop()))

    for i in range(3):
        asyncio.run(job(i))
    gc.collect()
    assert [ref for ref in loops if ref() is not None] == [], "finished event loops kept alive"


# -- semaphore cycles -----------------------------------------------------------------------------


@pytest.mark.postgres
async def test_semaphore_cycles_rewrite_the_head_row_at_most_once_per_ttl(pg_schema: tuple[str, str], key: str) -> None:
    """Migration 0008: a grant within its TTL of the last head extension and a release (no waiters)
    leave the semaphore's head row as it was (a head whose expiry outlives its slots is tolerated:
    docs/statements.md, "Stale heads"), so a cycle writes only its slot row."""
    url, schema = pg_schema
    raw = await asyncpg.connect(plain(url))
    try:

        async def head_version() -> Any:
            return await raw.fetchval(f'SELECT xmin::text FROM "{schema}".sql_leases WHERE key = $1', key)

        async with SqlLeaseProvider(url, schema=schema) as leases:
            assert (await leases.acquire_lease(key, "a", 60_000, limit=2)).acquired
            first = await head_version()
            assert (await leases.acquire_lease(key, "b", 60_000, limit=2)).acquired
            for owner in ("a", "b") * 3:
                assert await leases.release_lease(key, owner)
                assert (await leases.acquire_lease(key, owner, 60_000, limit=2)).acquired
            assert await head_version() == first
            assert await leases.release_lease(key, "a") and await leases.release_lease(key, "b")
            assert await head_version() == first
            # the stale head refuses no one once its slots are gone
            assert (await leases.acquire_lease(key, "c", 60_000)).acquired
            assert await leases.get_lease_owner(key) == "c"
            assert await leases.release_lease(key, "c")
    finally:
        await raw.close()


# -- the provider's own work per MySQL cycle (issue 23) ----------------------------------------------


class _AnsweringCursor:
    """An asyncmy cursor stand-in: the acquire packet grants the key to its owner, a DELETE frees one row."""

    def __init__(self) -> None:
        self.description: Any = None
        self.rowcount = -1
        self._results: list[tuple[int, list[tuple[Any, ...]] | None]] = []

    async def execute(self, sql: str, args: dict[str, Any]) -> None:
        import datetime

        if sql.lstrip().startswith("DELETE"):
            self._results = [(1, None)]
        else:  # eight results: the steps, then the row read back, then COMMIT
            granted = (0, None, None, None, None, args["p2"].encode(), 7, datetime.datetime(2026, 1, 1), 900.0, 0)
            self._results = [(1, None)] * 6 + [(1, [granted]), (0, None)]
        self._next()

    def _next(self) -> None:
        self.rowcount, self._rows = self._results.pop(0)
        self.description = None if self._rows is None else (("column",),)

    async def fetchall(self) -> list[tuple[Any, ...]] | None:
        return self._rows

    async def nextset(self) -> bool | None:
        if not self._results:
            return None
        self._next()
        return True


class _AnsweringAsyncmy:
    connected = True
    _stream_broken = False

    def cursor(self) -> _AnsweringCursor:
        return _AnsweringCursor()

    def close(self) -> None:
        self.connected = False

    async def ensure_closed(self) -> None:
        self.connected = False


async def test_a_mysql_acquire_release_cycle_makes_few_python_calls_in_sql_lease() -> None:
    """The provider's own Python work per acquire + release on its MySQL connections (the driver
    stood in for, never reached), counted in calls into sql_lease: 107 before issue 23's cuts.
    Counted, not timed, so it holds on a busy machine; benchmarks/mysql.py measures the time."""
    import pathlib
    import sys

    import sql_lease
    from sql_lease.sql.executors import _AsyncmyConnection

    provider = SqlLeaseProvider("mysql://user@127.0.0.1:9/none")

    async def answering() -> Any:
        return _AsyncmyConnection(_AnsweringAsyncmy())

    provider._executor._new_connection = answering  # type: ignore[attr-defined]
    package = str(pathlib.Path(sql_lease.__file__).parent)
    calls = 0

    def count(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        calls += event == "call" and frame.f_code.co_filename.startswith(package)

    try:
        assert (await provider.acquire_lease("k", "o", 1000)).acquired  # the connection is made
        assert await provider.release_lease("k", "o")
        sys.setprofile(count)
        try:
            for _ in range(10):
                assert (await provider.acquire_lease("k", "o", 1000)).acquired
                assert await provider.release_lease("k", "o")
        finally:
            sys.setprofile(None)
    finally:
        await provider.close()
    assert calls / 10 <= 95, f"{calls / 10} calls into sql_lease per cycle"


async def test_a_batched_renewal_makes_few_python_calls_per_lease_in_sql_lease(tmp_path: Any) -> None:
    """The client's Python work per lease that ``hold()``'s batcher renews (issue 23's renewal row:
    10,000 leases renewed every 5 s within 5 % of a core), counted in calls into sql_lease over
    whole renewal rounds: from the start of the first batch after every hold began to the start of
    the batch three rounds later, so every counted batch was sent, answered and judged inside the
    count. The batcher's items were checked when each hold began: ``renew_many`` does not check them
    again."""
    import pathlib
    import sys

    import sql_lease

    package = str(pathlib.Path(sql_lease.__file__).parent)
    calls = renewed = batches = 0
    counted_batches = 3
    all_held, done = False, asyncio.Event()

    def count(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        calls += event == "call" and frame.f_code.co_filename.startswith(package)

    async with SqlLeaseProvider(f"sqlite:///{tmp_path / 'leases.db'}") as provider:
        await provider.migrate()
        renew_many = provider.renew_many

        async def counted(items: Any) -> Any:
            nonlocal renewed, batches
            batches += all_held  # counting starts at the first batch after every acquire
            if batches == 1:
                sys.setprofile(count)
            elif batches == 1 + counted_batches:
                sys.setprofile(None)
                done.set()
            if 1 <= batches <= counted_batches:
                renewed += len(items)
            return await renew_many(items)

        provider.renew_many = counted  # type: ignore[method-assign]
        holds = [hold(provider, f"k{i}", "o", 3_000, renew_every_ms=100) for i in range(200)]
        try:
            for held in holds:
                await held.__aenter__()
            all_held = True
            await asyncio.wait_for(done.wait(), 20)
        finally:
            sys.setprofile(None)
            for held in holds:
                await held.__aexit__(None, None, None)
    assert renewed >= 200 * counted_batches, renewed  # one batch per round: every lease in each
    assert calls / renewed <= 19, f"{calls / renewed:.2f} calls into sql_lease per lease renewed"
