"""Regression tests for the defects of the issue "The guarantees under attack": fences and
exclusion, durability, validation, holding and waiting. Each test names the defect it pins."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from sql_lease import (
    InMemoryLeaseProvider,
    LeaseBackendError,
    LeaseLostError,
    LeaseNotAcquiredError,
    SqlLeaseProvider,
    acquire_lease_wait,
    hold,
)
from sql_lease.contract import validate_seconds, validate_ttl_ms
from sql_lease.holding import ExpirySweeper
from tests.support.pgserver import start_again, throwaway_postgres


def plain(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://")


async def wait_until(predicate: Any, within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while not await predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


# -- 1. one table, two spellings ------------------------------------------------------------------


@pytest.mark.postgres
async def test_one_table_reached_under_two_spellings_orders_fence_draws_with_one_lock(
    pg_schema: tuple[str, str], key: str
) -> None:
    url, schema = pg_schema
    by_schema = SqlLeaseProvider(url, schema=schema)
    by_search_path = SqlLeaseProvider(
        url, engine_options={"connect_args": {"server_settings": {"search_path": schema}}}
    )
    raw = await asyncpg.connect(plain(url))
    try:
        assert (await by_schema.acquire_lease(key, "old", 1)).acquired
        await asyncio.sleep(0.01)  # expired, still in the table
        sequence = f'"{schema}".sql_leases_fence_seq'

        async def drawn() -> int:
            return int(await raw.fetchval(f"SELECT last_value FROM {sequence}"))

        blocker = await asyncpg.connect(plain(url))
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute(f'SELECT 1 FROM "{schema}".sql_leases WHERE key = $1 FOR UPDATE', key)

        async def lock_waiters() -> int:
            return int(
                await raw.fetchval(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND datname = current_database()"
                )
            )

        first = asyncio.create_task(by_schema.acquire_lease(key, "a", 10_000))
        await wait_until(lambda: _gt(lock_waiters, 0))
        before = await drawn()
        second = asyncio.create_task(by_search_path.acquire_lease(key, "b", 10_000))
        await wait_until(lambda: _gt(lock_waiters, 1))
        # While an acquire of this key is in flight, the other spelling must wait before drawing a fence.
        assert await drawn() == before
        await tx.rollback()
        await blocker.close()
        results = await asyncio.gather(first, second)
        assert [r.acquired for r in results].count(True) == 1
    finally:
        await raw.close()
        await by_schema.close()
        await by_search_path.close()


async def _gt(probe: Any, n: int) -> bool:
    return bool(await probe() > n)


@pytest.mark.postgres
async def test_waiter_under_another_spelling_is_woken_by_notify(pg_schema: tuple[str, str], key: str) -> None:
    url, schema = pg_schema
    holder = SqlLeaseProvider(url, schema=schema)
    waiter = SqlLeaseProvider(url, engine_options={"connect_args": {"server_settings": {"search_path": schema}}})
    try:
        assert (await holder.acquire_lease(key, "h", 60_000)).acquired
        waiting = asyncio.create_task(acquire_lease_wait(waiter, key, "w", 10_000, 30, listen_max_wait_s=20))
        await asyncio.sleep(0.5)  # the waiter has flagged the row and listens
        released = time.monotonic()
        assert await holder.release_lease(key, "h")
        await asyncio.wait_for(waiting, 30)
        assert time.monotonic() - released < 5, "woken by the fallback timer, not by NOTIFY"
    finally:
        await holder.close()
        await waiter.close()


# -- 2. a new tenure after the owner's own lease expired -----------------------------------------


async def test_reacquire_after_own_expiry_is_a_new_tenure_with_a_larger_fence(provider: Any, key: str) -> None:
    first = await provider.acquire_lease(key, "alice", 50)
    await asyncio.sleep(0.15)
    again = await provider.acquire_lease(key, "alice", 10_000)
    assert again.acquired and again.fence > first.fence
    # while unexpired, re-acquiring is idempotent (semantic 3)
    assert (await provider.acquire_lease(key, "alice", 10_000)).fence == again.fence


# -- 3. durability whatever the server's default ----------------------------------------------------


class _Faced:
    """One provider of ``face`` on ``url``, awaited the same way: ``url`` (the provider's own
    connections, pinned per session), ``engine`` (an application's engine, pinned per statement),
    ``pgbouncer`` (pinned per statement), ``sync`` (the synchronous face's own connections)."""

    def __init__(self, face: str, url: str) -> None:
        from sqlalchemy.ext.asyncio import create_async_engine

        from sql_lease import SyncSqlLeaseProvider

        async_url = url.replace("postgresql://", "postgresql+asyncpg://", 1)
        self.engine = create_async_engine(async_url) if face == "engine" else None
        if face == "sync":
            self.provider: Any = SyncSqlLeaseProvider(url)
        else:
            self.provider = SqlLeaseProvider(self.engine or url, pgbouncer=face == "pgbouncer")

    async def __call__(self, method: str, *args: Any) -> Any:
        result = getattr(self.provider, method)(*args)
        return await result if asyncio.iscoroutine(result) else result

    async def close(self) -> None:
        await self("close")
        if self.engine is not None:
            await self.engine.dispose()


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.parametrize("face", ["url", "engine", "pgbouncer", "sync"])
async def test_acknowledged_acquire_renew_transfer_survive_a_crash_with_synchronous_commit_off(face: str) -> None:
    from tests.test_faults import migrate, stop_server

    with throwaway_postgres(log_min_messages="error", synchronous_commit="off", wal_writer_delay="10000") as (
        url,
        executor,
    ):
        await migrate(url, None)
        leases = _Faced(face, url)
        try:
            early = await leases("acquire_lease", "renewed", "r", 60_000)
            assert (await leases("acquire_lease", "moved", "m", 600_000)).acquired
            raw = await asyncpg.connect(plain(url))
            await raw.execute("CHECKPOINT")  # these two are on disk before the measured operations
            await raw.close()
            acquired = [await leases("acquire_lease", f"k{i}", "owner", 600_000) for i in range(3)]
            assert await leases("renew_lease", "renewed", "r", 600_000)
            if hasattr(leases.provider, "renew_many"):  # the batch statement, pinned as renew is
                assert await leases("renew_many", [("renewed", "r", 600_000)])
            assert await leases("transfer_lease", "moved", "m", "m2", 600_000)
            stop_server(executor, "immediate")  # acknowledged, then the server crashes at once
        finally:
            with contextlib.suppress(Exception):
                await leases.close()
        start_again(executor)
        async with SqlLeaseProvider(url) as leases:
            for i, result in enumerate(acquired):
                lease = await leases.get_lease(f"k{i}")
                assert lease is not None and lease.fence == result.fence, f"acquire k{i} lost in the crash"
            assert await leases.get_lease_owner("moved") == "m2", "transfer lost in the crash"
            renewed = await leases.get_lease("renewed")
            assert renewed is not None and early.expires_at is not None
            assert renewed.expires_at > early.expires_at + timedelta(seconds=60), "renewal lost in the crash"


# -- 4. numbers that are not what they seem -----------------------------------------------------------


class SneakyFloat(float):
    def __float__(self) -> float:
        return -1e9

    def __lt__(self, other: object) -> bool:
        return False

    def __gt__(self, other: object) -> bool:
        return False


class SneakyInt(int):
    def __float__(self) -> float:
        return float("nan")


def test_number_subclasses_are_judged_by_their_value_not_their_methods() -> None:
    assert validate_ttl_ms(SneakyFloat(5000.0)) == 5000.0
    assert type(validate_ttl_ms(SneakyFloat(5000.0))) is float
    assert validate_ttl_ms(SneakyInt(5000)) == 5000.0
    with pytest.raises(ValueError):
        validate_ttl_ms(SneakyFloat(-5.0))
    with pytest.raises(ValueError):
        validate_ttl_ms(SneakyFloat("nan"))
    with pytest.raises(ValueError):
        validate_seconds(SneakyFloat("inf"), "timeout_s")


async def test_a_sneaky_ttl_cannot_write_an_expired_lease(provider: Any, key: str) -> None:
    result = await provider.acquire_lease(key, "alice", SneakyFloat(60_000.0))
    assert result.acquired
    assert not (await provider.acquire_lease(key, "bob", 1000)).acquired


# -- 5. nested holds by one owner -----------------------------------------------------------------------


async def test_nested_hold_by_the_same_owner_keeps_the_outer_lease(provider: Any, key: str) -> None:
    async with hold(provider, key, "job-1", ttl_ms=2_000) as outer:
        async with hold(provider, key, "job-1", ttl_ms=2_000) as inner:
            assert inner.fence == outer.fence
        assert await provider.get_lease_owner(key) == "job-1"
        assert not (await provider.acquire_lease(key, "intruder", 1000)).acquired
        assert not outer.lost.is_set()
    assert await provider.get_lease_owner(key) is None


# -- 6. a body that blocks the event loop ------------------------------------------------------------


async def test_loss_is_judged_from_the_acquire_even_when_the_body_blocks_first(provider: Any, key: str) -> None:
    lease = hold(provider, key, "blocker", ttl_ms=600, on_lost="flag")
    async with lease:
        time.sleep(0.75)  # noqa: ASYNC251 - blocks the loop past the whole TTL before the renewer ran
        taken = await provider.acquire_lease(key, "other", 10_000)
        assert taken.acquired
        await asyncio.sleep(0.05)  # one turn of the loop is enough to notice
        assert lease.lost.is_set(), "the body ran on with lost=False while another owner held the key"
        assert "did not answer" not in (lease.lost_reason or "")


# -- 7. a renewal cadence that can never meet the deadline -----------------------------------------


def test_renew_interval_must_leave_time_before_the_loss_deadline() -> None:
    provider = InMemoryLeaseProvider()
    for too_late in (950, 890, 800):  # the first renewal would have no time to answer and retry
        with pytest.raises(ValueError, match="renew_every_ms"):
            hold(provider, "k", ttl_ms=1000, renew_every_ms=too_late)
    hold(provider, "k", ttl_ms=1000, renew_every_ms=750)


# -- 8. cancellations from outside are never swallowed -------------------------------------------


async def test_outside_cancellation_during_loss_is_not_turned_into_lease_lost(key: str) -> None:
    provider = InMemoryLeaseProvider()
    cleanup_started = asyncio.Event()

    async def body() -> None:
        async with hold(provider, key, "a", ttl_ms=300):
            await provider.transfer_lease(key, "a", "thief", 10_000)  # the next renewal is refused
            try:
                await asyncio.sleep(10)
            finally:
                cleanup_started.set()
                await asyncio.sleep(0.2)  # the outer cancel lands while the body is cleaning up

    task = asyncio.create_task(body())
    await cleanup_started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_sweeper_stop_does_not_swallow_the_callers_cancellation() -> None:
    provider = InMemoryLeaseProvider()
    sweeper = ExpirySweeper(provider, interval_s=10)
    gate = asyncio.Event()

    async def slow_sweep(batch_size: int = 1000, grace_ms: float = 0) -> int:
        try:
            await asyncio.sleep(10)
        finally:
            await gate.wait()  # the sweeper takes a while to stop
        return 0

    provider.sweep_expired = slow_sweep  # type: ignore[method-assign]
    sweeper.start()
    await asyncio.sleep(0.05)
    stopping = asyncio.create_task(sweeper.stop())
    await asyncio.sleep(0.05)
    stopping.cancel()  # the caller is cancelled while it waits for the sweeper
    await asyncio.sleep(0.05)
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await stopping


async def test_transfer_to_does_not_swallow_the_callers_cancellation(provider: Any, key: str) -> None:
    finished: list[bool] = []

    class CancelledAfterTransfer:
        """Cancels the caller just after the transfer committed, while transfer_to stops the renewer."""

        def __getattr__(self, name: str) -> Any:
            return getattr(provider, name)

        async def transfer_lease(self, *args: Any, **kwargs: Any) -> Any:
            moved = await provider.transfer_lease(*args, **kwargs)
            asyncio.get_running_loop().call_soon(task.cancel)
            return moved

    async def body() -> None:
        async with hold(CancelledAfterTransfer(), key, "a", ttl_ms=60_000) as lease:
            await lease.transfer_to("b")
            finished.append(True)

    task = asyncio.create_task(body())
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not finished, "the body ran on after its task was cancelled"
    assert await provider.get_lease_owner(key) == "b"


# -- 9. a cancelled start leaves no orphan ------------------------------------------------------------


async def test_cancelled_acquire_in_flight_leaves_no_orphan_lease(provider: Any, key: str) -> None:
    committed = asyncio.Event()

    class SlowReply:
        """Commits the acquire, then takes long to answer (a lost or slow reply)."""

        def __getattr__(self, name: str) -> Any:
            return getattr(provider, name)

        async def acquire_lease(self, k: str, owner: str, ttl_ms: float) -> Any:
            result = await provider.acquire_lease(k, owner, ttl_ms)
            committed.set()
            await asyncio.sleep(10)
            return result

    task = asyncio.create_task(hold(SlowReply(), key, ttl_ms=60_000).__aenter__())
    await committed.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await provider.get_lease_owner(key) is None, "an orphan lease is left for a whole TTL"


# -- 10. the per-key waiter queue never wedges ---------------------------------------------------------


async def test_waiter_queue_lock_is_not_kept_by_a_deadline_at_the_handover() -> None:
    from sql_lease.holding.aio import _LocalQueue

    queue = _LocalQueue()
    loop = asyncio.get_running_loop()
    with pytest.raises(TimeoutError):
        await queue.wait_turn(asyncio.Event(), loop.time())  # free lock, deadline now: same iteration
    await asyncio.sleep(0.01)
    assert not queue.lock.locked(), "the queue's lock is held by nobody; later waiters hang"


async def test_waiter_queue_lock_is_not_kept_by_a_cancellation_at_the_handover() -> None:
    from sql_lease.holding.aio import _LocalQueue

    queue = _LocalQueue()
    await queue.lock.acquire()  # the head of the queue
    waiter = asyncio.create_task(queue.wait_turn(asyncio.Event(), None))
    await asyncio.sleep(0)
    queue.lock.release()  # handed to the waiter...
    await asyncio.sleep(0)
    waiter.cancel()  # ...which is cancelled in the same turn
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await asyncio.sleep(0.01)
    assert not queue.lock.locked(), "the queue's lock is held by nobody; later waiters hang"


async def test_waiters_after_an_impatient_one_still_get_the_key(provider: Any, key: str) -> None:
    assert (await provider.acquire_lease(key, "holder", 60_000)).acquired
    patient = asyncio.create_task(acquire_lease_wait(provider, key, "patient", 1000, timeout_s=None))
    await asyncio.sleep(0.05)
    for _ in range(5):
        with pytest.raises(LeaseNotAcquiredError):
            await acquire_lease_wait(provider, key, "impatient", 1000, timeout_s=0)
    assert await provider.release_lease(key, "holder")
    assert (await asyncio.wait_for(patient, 5)).acquired


# -- 11. PostgreSQL waiters in several processes -----------------------------------------------------


@pytest.mark.postgres
async def test_waiters_of_two_providers_are_each_woken_by_notify(pg_schema: tuple[str, str], key: str) -> None:
    """Two providers stand for two processes: each has its own LISTEN connection and local queue."""
    url, schema = pg_schema
    providers = [SqlLeaseProvider(url, schema=schema) for _ in range(3)]
    waits: list[float] = []
    rounds = 12

    async def player(index: int) -> None:
        leases = providers[index]
        for _ in range(rounds // 2):
            asked = time.monotonic()
            await acquire_lease_wait(leases, key, f"p{index}", 30_000, 60, listen_max_wait_s=30)
            waits.append(time.monotonic() - asked)
            await asyncio.sleep(0.05)
            assert await leases.release_lease(key, f"p{index}")
            await asyncio.sleep(0.01)

    try:
        assert (await providers[2].acquire_lease(key, "start", 30_000)).acquired
        players = [asyncio.create_task(player(i)) for i in range(2)]
        await asyncio.sleep(0.3)
        assert await providers[2].release_lease(key, "start")
        await asyncio.wait_for(asyncio.gather(*players), 120)
        # A missed wake-up waits for the 30 s fallback; a heard one comes within milliseconds.
        assert max(waits) < 5, f"a waiter missed its NOTIFY: waits {sorted(waits)[-3:]}"
    finally:
        for leases in providers:
            await leases.close()


@pytest.mark.postgres
async def test_has_waiters_is_cleared_when_the_owner_changes(pg_schema: tuple[str, str], key: str) -> None:
    url, schema = pg_schema
    async with SqlLeaseProvider(url, schema=schema) as leases:
        assert (await leases.acquire_lease(key, "short", 400)).acquired
        result = await acquire_lease_wait(leases, key, "next", 10_000, 10)  # flags the row, then takes it on expiry
        assert result.acquired
        raw = await asyncpg.connect(plain(url))
        try:
            flag = await raw.fetchval(f'SELECT has_waiters FROM "{schema}".sql_leases WHERE key = $1', key)
        finally:
            await raw.close()
        assert flag is False, "every later transfer of this key would send NOTIFY"


# -- 12. a client clock that is wrong ------------------------------------------------------------------


def client_clock_an_hour_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    import sql_lease.holding.rules as holding

    class AheadClock(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> datetime:  # type: ignore[override]
            return datetime.now(tz) + timedelta(hours=1)

    monkeypatch.setattr(holding, "datetime", AheadClock)


async def test_waiters_pace_by_the_remaining_ttl_not_the_client_clock(
    sql_provider: Any, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client_clock_an_hour_ahead(monkeypatch)
    attempts = 0
    real_acquire = sql_provider.acquire_lease

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal attempts
        attempts += 1
        return await real_acquire(*args, **kwargs)

    monkeypatch.setattr(sql_provider, "acquire_lease", counted)
    monkeypatch.setattr(sql_provider, "release_waiter", lambda key: None)  # polling, as on SQLite
    assert (await real_acquire(key, "holder", 1_000)).acquired
    result = await acquire_lease_wait(sql_provider, key, "waiter", 1000, 10, poll_initial_s=0.5, poll_max_s=0.5)
    assert result.acquired
    assert attempts < 10, f"{attempts} attempts while the holder's lease ran out"


# -- 13. HeldLease.expires_at comes from the database -------------------------------------------------


async def test_held_lease_expires_at_after_renewal_is_the_databases(
    sql_provider: Any, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client_clock_an_hour_ahead(monkeypatch)
    async with hold(sql_provider, key, "alice", ttl_ms=3_000, renew_every_ms=100) as lease:
        await asyncio.sleep(0.35)  # renewed a few times
        stored = await sql_provider.get_lease(key)
        assert stored is not None and lease.expires_at is not None
        assert abs(lease.expires_at - stored.expires_at) < timedelta(seconds=1)


# -- found by review of the fixes above ---------------------------------------------------------------


@pytest.mark.postgres
async def test_close_waits_for_operations_in_flight_after_earlier_ones_finished(
    pg_schema: tuple[str, str], key: str
) -> None:
    url, schema = pg_schema
    leases = SqlLeaseProvider(url, schema=schema)
    assert (await leases.acquire_lease(key, "a", 60_000)).acquired  # one operation came and went
    blocker = await asyncpg.connect(plain(url))
    tx = blocker.transaction()
    await tx.start()
    await blocker.execute(f'SELECT 1 FROM "{schema}".sql_leases WHERE key = $1 FOR UPDATE', key)
    renewing = asyncio.create_task(leases.renew_lease(key, "a", 60_000))
    await asyncio.sleep(0.2)
    closing = asyncio.create_task(leases.close())
    await asyncio.sleep(0.3)
    assert not closing.done(), "close() returned while a renewal was still running"
    await tx.rollback()
    await blocker.close()
    await closing
    assert renewing.done() and renewing.result() is True


@pytest.mark.postgres
async def test_close_while_a_waiter_opens_its_listen_connection_keeps_nothing(
    pg_schema: tuple[str, str], key: str
) -> None:
    url, schema = pg_schema
    raw = await asyncpg.connect(plain(url))
    try:
        async with SqlLeaseProvider(url, schema=schema) as holder:
            assert (await holder.acquire_lease(key, "holder", 60_000)).acquired
            for turns in range(0, 14, 2):
                name = f"sql_lease_race_{uuid.uuid4().hex[:8]}"
                leases = SqlLeaseProvider(
                    url, schema=schema, engine_options={"connect_args": {"server_settings": {"application_name": name}}}
                )
                waiting = asyncio.create_task(acquire_lease_wait(leases, key, "w", 10_000, 30, listen_max_wait_s=0.1))
                for _ in range(turns):
                    await asyncio.sleep(0)
                await leases.close()
                await asyncio.gather(waiting, return_exceptions=True)
                await asyncio.sleep(0.2)
                left = await raw.fetchval("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", name)
                assert left == 0, f"a connection stayed open after close() ({turns} turns)"
    finally:
        await raw.close()


class _RenewsOneByOne:
    """Forwards to a provider but hides ``renew_many``: ``hold()`` then renews with a task per lease."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.parametrize("renewing", ["batched", "one by one"])
async def test_a_cancellation_while_hold_exits_still_releases(provider: Any, key: str, renewing: str) -> None:
    leases = provider if renewing == "batched" else _RenewsOneByOne(provider)

    async def body() -> None:
        async with hold(leases, key, "me", ttl_ms=60_000):
            # lands in __aexit__'s first await: the release (batched), stopping the renewer task (one by one)
            asyncio.current_task().cancel()  # type: ignore[union-attr]

    task = asyncio.create_task(body())
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await provider.get_lease_owner(key) is None
    async with hold(leases, key, "me", ttl_ms=60_000):
        pass
    assert await provider.get_lease_owner(key) is None, "a stale nested-hold count kept later holds from releasing"


async def test_a_nested_hold_with_a_shorter_ttl_never_cuts_the_outer_lease_short(provider: Any, key: str) -> None:
    async with hold(provider, key, "me", ttl_ms=3_000) as outer:
        async with hold(provider, key, "me", ttl_ms=200):
            pass
        await asyncio.sleep(0.4)
        assert not (await provider.acquire_lease(key, "other", 1000)).acquired
        assert not outer.lost.is_set()


async def test_a_cancelled_acquire_never_releases_a_hold_that_started_meanwhile(provider: Any, key: str) -> None:
    committed, stay = asyncio.Event(), asyncio.Event()

    class Gated:
        slow = True

        def __getattr__(self, name: str) -> Any:
            return getattr(provider, name)

        async def acquire_lease(self, k: str, owner: str, ttl_ms: float) -> Any:
            result = await provider.acquire_lease(k, owner, ttl_ms)
            if Gated.slow:
                Gated.slow = False
                committed.set()
                await stay.wait()
            return result

    gated = Gated()
    late = asyncio.create_task(hold(gated, key, "me", ttl_ms=60_000).__aenter__())
    await committed.wait()
    async with hold(gated, key, "me", ttl_ms=60_000) as current:
        late.cancel()
        with pytest.raises(asyncio.CancelledError):
            await late
        assert await provider.get_lease_owner(key) == "me"
        assert not current.lost.is_set()


def test_a_waiting_acquire_asks_again_until_its_refusal_flags_the_row() -> None:
    """Regression (found with several waiting processes): after three empty answers a waiting
    acquire read the holder without flagging the row; finding the key free (or a holder it had not
    flagged), it slept its whole fallback timer, since no NOTIFY could come."""
    from sql_lease.sql.operations import acquire
    from sql_lease.sql.schema import LeaseTableNames
    from sql_lease.sql.statements import PostgresStatements

    s = PostgresStatements(LeaseTableNames())
    plan = acquire(s, "k", "waiter", 1000, waiting=True)
    asked = [next(plan)]
    for _ in range(6):  # the key changes hands under every attempt
        asked.append(plan.send(None))
    assert all(query.sql == s.acquire_waiting for query in asked)
    refused = (False, "holder", 7, datetime.now(UTC), 500.0)
    with pytest.raises(StopIteration) as done:
        plan.send(refused)
    assert done.value.value.owner == "holder" and not done.value.value.acquired


# == Issue 20: no holder believes it holds what another holds ==========================================


class _HangingRenewals(InMemoryLeaseProvider):
    """Renewals (batched and one by one) and transfers hang until ``release`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.hang_renewals = True
        self.hang_transfers = True

    async def renew_lease(self, *args: Any, **kwargs: Any) -> bool:
        if self.hang_renewals:
            await self.release.wait()
        return await super().renew_lease(*args, **kwargs)

    async def renew_lease_info(self, *args: Any, **kwargs: Any) -> Any:
        if self.hang_renewals:
            await self.release.wait()
        return await super().renew_lease_info(*args, **kwargs)

    async def renew_many(self, *args: Any, **kwargs: Any) -> Any:
        if self.hang_renewals:
            await self.release.wait()
        return await super().renew_many(*args, **kwargs)

    async def transfer_lease(self, *args: Any, **kwargs: Any) -> bool:
        if self.hang_transfers:
            await self.release.wait()
        return await super().transfer_lease(*args, **kwargs)


def _renewing(provider: Any, renewing: str) -> Any:
    return provider if renewing == "batched" else _RenewsOneByOne(provider)


@pytest.mark.parametrize("renewing", ["batched", "one by one"])
@pytest.mark.parametrize("on_lost", ["flag", "cancel"])
async def test_20_3_check_judges_by_the_clock_right_after_a_blocked_loop(renewing: str, on_lost: str) -> None:
    """Item 3: after the loop was blocked past the TTL, ``check()`` and ``valid`` know it before
    any await lets a renewer or timer run."""
    provider = InMemoryLeaseProvider()
    with contextlib.suppress(LeaseLostError):
        async with hold(_renewing(provider, renewing), "k", "me", ttl_ms=300, on_lost=on_lost) as lease:  # type: ignore[arg-type]
            assert lease.valid
            lease.check()
            time.sleep(0.35)  # noqa: ASYNC251 - the loop is blocked past the whole TTL
            assert not lease.valid
            with pytest.raises(LeaseLostError, match="no renewal succeeded"):
                lease.check()
            assert lease.lost.is_set()
            raised_at_once = True
    assert raised_at_once


@pytest.mark.parametrize("renewing", ["batched", "one by one"])
async def test_20_3_lost_is_set_before_later_wakeups_after_a_blocked_loop(renewing: str) -> None:
    """Item 3: a body whose sleep ended before the lease's deadline, but that runs after it (the
    loop was blocked), finds ``lost`` set: the loss is a loop timer at the deadline, not a
    renewer task's turn that comes after the body's."""
    provider = _HangingRenewals()
    loop = asyncio.get_running_loop()
    async with hold(_renewing(provider, renewing), "k", "me", ttl_ms=1_000, on_lost="flag") as lease:
        deadline = lease._valid_until - lease._margin_s
        await asyncio.sleep(0.45)  # a renewal is in flight (it hangs), waited for until the deadline
        seen: list[bool] = []

        async def body() -> None:
            await asyncio.sleep(deadline - 0.05 - loop.time())
            seen.append(lease.lost.is_set())

        task = asyncio.create_task(body())
        await asyncio.sleep(0)  # its timer is armed
        time.sleep(max(0.0, deadline + 0.1 - loop.time()))  # noqa: ASYNC251 - the loop blocked past the deadline
        await task
        assert seen == [True], "the body ran after the deadline with lost=False"
        provider.release.set()


@pytest.mark.parametrize("renewing", ["batched", "one by one"])
async def test_20_2_a_hung_transfer_does_not_suspend_loss_detection(renewing: str) -> None:
    """Item 2: a transfer stuck (behind a row lock) holds the renewal lock; the loss is still
    declared by the deadline, and transfer_to gives up there (its outcome unknown)."""
    provider = _HangingRenewals()
    provider.hang_renewals = False
    ttl_s = 1.0
    loop = asyncio.get_running_loop()
    async with hold(_renewing(provider, renewing), "k", "me", ttl_ms=ttl_s * 1000, on_lost="flag") as lease:
        started = loop.time()
        transfer = asyncio.create_task(lease.transfer_to("next"))
        await asyncio.wait_for(lease.lost.wait(), 3 * ttl_s)
        lost_after = loop.time() - started
        with pytest.raises(LeaseBackendError, match="outcome is unknown"):
            await asyncio.wait_for(transfer, ttl_s)
        provider.release.set()
    assert lost_after <= ttl_s * (1 - 0.1) + 0.1, f"loss declared {lost_after:.2f} s after the transfer began"


async def test_20_2_a_hung_transfer_in_the_body_ends_it_by_the_deadline() -> None:
    """Item 2, on_lost="cancel": the body waiting on a hung transfer is cancelled at the deadline."""
    provider = _HangingRenewals()
    provider.hang_renewals = False
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(LeaseLostError):
        async with asyncio.timeout(3), hold(provider, "k", "me", ttl_ms=1_000) as lease:
            await lease.transfer_to("next")
    assert loop.time() - started <= 0.9 + 0.15
    assert lease.lost.is_set() and lease.transferred_to is None


async def test_20_13_renewals_run_in_no_requests_context() -> None:
    """Item 13: the batcher's task starts in an empty context, so renewal spans (and anything
    else keyed on context variables) are not parented to whichever request started it."""
    request = contextvars.ContextVar("request", default="none")
    seen: list[str] = []

    class Recording(InMemoryLeaseProvider):
        async def renew_many(self, *args: Any, **kwargs: Any) -> Any:
            seen.append(request.get())
            return await super().renew_many(*args, **kwargs)

    provider = Recording()
    request.set("first request")
    async with hold(provider, "k", "me", ttl_ms=300):
        await asyncio.sleep(0.25)
    assert seen and set(seen) == {"none"}, seen
