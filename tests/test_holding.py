"""hold(), waiting acquire and handoff, the sweeper: on every provider."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from sql_lease import (
    ExpirySweeper,
    LeaseBackendError,
    LeaseLostError,
    LeaseNotAcquiredError,
    acquire_lease_wait,
    hold,
)
from tests.support.counting import StatementCounter


class Faulty:
    """Wraps a provider; renewals and releases can be made to fail, hang or lag."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.renew_failures = 0  # the next N renewals raise LeaseBackendError
        self.renew_paused = False  # renewals hang while True
        self.release_delay_s = 0.0
        self.renewals = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def renew_lease(self, key: str, owner: str, ttl_ms: float) -> bool:
        self.renewals += 1
        while self.renew_paused:  # noqa: ASYNC110 - a plain flag keeps the tests readable
            await asyncio.sleep(0.01)
        if self.renew_failures:
            self.renew_failures -= 1
            raise LeaseBackendError("simulated database blip")
        return await self.inner.renew_lease(key, owner, ttl_ms)  # type: ignore[no-any-return]

    async def release_lease(self, key: str, owner: str) -> bool:
        await asyncio.sleep(self.release_delay_s)
        return await self.inner.release_lease(key, owner)  # type: ignore[no-any-return]


async def test_hold_renews_past_the_ttl_and_releases(provider: Any, key: str) -> None:
    async with hold(provider, key, "alice", ttl_ms=1_200) as lease:  # renewed every 0.4 s
        assert lease.fence is not None and lease.owner == "alice"
        await asyncio.sleep(3.0)
        assert not (await provider.acquire_lease(key, "bob", 1000)).acquired
        assert not lease.lost.is_set()
    assert await provider.get_lease_owner(key) is None


async def test_hold_generates_unique_owners(provider: Any, key: str) -> None:
    async with hold(provider, key) as first:
        pass
    async with hold(provider, key) as second:
        pass
    assert first.owner != second.owner
    assert second.fence > first.fence  # type: ignore[operator]


async def test_hold_refused_names_the_holder(provider: Any, key: str) -> None:
    await provider.acquire_lease(key, "bob", 10_000)
    with pytest.raises(LeaseNotAcquiredError, match="bob") as info:
        async with hold(provider, key, "alice"):
            pytest.fail("the body must not run")
    assert info.value.holder == "bob"


async def test_lapsed_lease_is_lost_and_the_body_cancelled(provider: Any, key: str) -> None:
    """Renewals hang: loss is declared before the TTL runs out (10% margin), so the body is
    cancelled before anyone else can take the key."""
    faulty = Faulty(provider)
    reached_end = False
    owner_when_cancelled = "not cancelled"
    with pytest.raises(LeaseLostError, match="no renewal succeeded"):
        async with hold(faulty, key, "alice", ttl_ms=1000) as lease:
            faulty.renew_paused = True
            try:
                await asyncio.sleep(5)
                reached_end = True
            except asyncio.CancelledError:
                owner_when_cancelled = await provider.get_lease_owner(key)
                raise
    assert not reached_end
    assert lease.lost.is_set()
    assert owner_when_cancelled == "alice"  # cancelled while the lease was still ours
    faulty.renew_paused = False
    await asyncio.sleep(0.1)
    assert (await provider.acquire_lease(key, "bob", 10_000)).acquired


async def test_taken_over_lease_is_lost(provider: Any, key: str) -> None:
    # a TTL long enough that a renewal late under load still comes before the clock's deadline
    with pytest.raises(LeaseLostError, match="refused"):
        async with hold(provider, key, "alice", ttl_ms=3_000):
            assert await provider.transfer_lease(key, "alice", "bob", 10_000)
            await asyncio.sleep(10)
    assert await provider.get_lease_owner(key) == "bob"


async def test_on_lost_flag_only_sets_the_event(provider: Any, key: str) -> None:
    async with hold(provider, key, "alice", ttl_ms=3_000, on_lost="flag") as lease:
        assert await provider.transfer_lease(key, "alice", "bob", 10_000)
        await asyncio.wait_for(lease.lost.wait(), 10)
    assert lease.lost_reason and "refused" in lease.lost_reason


async def test_transient_renewal_errors_do_not_declare_loss(provider: Any, key: str) -> None:
    faulty = Faulty(provider)
    async with hold(faulty, key, "alice", ttl_ms=900, renew_every_ms=150) as lease:
        faulty.renew_failures = 3
        await asyncio.sleep(1.5)
        assert faulty.renew_failures == 0 and faulty.renewals > 4
        assert not lease.lost.is_set()
        assert await provider.get_lease_owner(key) == "alice"


async def test_cancellation_during_release_leaves_no_half_state(provider: Any, key: str) -> None:
    faulty = Faulty(provider)
    faulty.release_delay_s = 0.3
    entered = asyncio.Event()

    async def worker() -> None:
        async with hold(faulty, key, "alice", ttl_ms=10_000):
            entered.set()
        # never reached when cancelled during the release

    task = asyncio.create_task(worker())
    await entered.wait()
    await asyncio.sleep(0.1)  # now inside the release
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await provider.get_lease_owner(key) is None  # the shielded release completed


async def test_transfer_to_hands_over_without_a_gap(provider: Any, key: str) -> None:
    """A third contender hammering acquire never gets the key between the two owners."""
    stolen: list[bool] = []
    done = asyncio.Event()

    async def contender() -> None:
        while not done.is_set():
            if (await provider.acquire_lease(key, "thief", 10_000)).acquired:
                stolen.append(True)
            await asyncio.sleep(0)

    async with hold(provider, key, "run-1", ttl_ms=10_000) as lease:
        contending = asyncio.create_task(contender())
        await asyncio.sleep(0.05)
        assert await lease.transfer_to("run-2")
        assert lease.transferred_to == "run-2"
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.05)  # run-1's exit must not release run-2's lease
    done.set()
    await contending
    assert stolen == []
    holder = await provider.get_lease(key)
    assert holder.owner == "run-2" and holder.fence > lease.fence


async def test_wait_times_out_naming_the_holder(provider: Any, key: str) -> None:
    await provider.acquire_lease(key, "bob", 10_000)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(LeaseNotAcquiredError, match="bob") as info:
        await acquire_lease_wait(provider, key, "alice", 1000, timeout_s=0.3)
    assert 0.25 < loop.time() - started < 3
    assert info.value.holder == "bob" and info.value.waited_s is not None


async def test_wait_acquires_when_the_holder_releases(provider: Any, key: str) -> None:
    await provider.acquire_lease(key, "bob", 10_000)

    async def release_soon() -> None:
        await asyncio.sleep(0.2)
        await provider.release_lease(key, "bob")

    releaser = asyncio.create_task(release_soon())
    result = await acquire_lease_wait(provider, key, "alice", 1000, timeout_s=10)
    await releaser
    assert result.acquired and result.owner == "alice"


async def test_a_wait_of_the_longest_allowed_time_limit_acquires(provider: Any, key: str) -> None:
    """A wait of 10 years (the longest ``timeout_s``, ``exec --wait --timeout 3650d``) gives each
    attempt at most that long: before, the attempt's limit (time left plus a grace) was refused."""
    result = await acquire_lease_wait(provider, key, "alice", 1000, timeout_s=10 * 365 * 86_400)
    assert result.acquired and result.owner == "alice"
    async with provider.hold(key, "alice", 1000, wait=True, timeout_s=10 * 365 * 86_400) as lease:
        assert lease.owner == "alice"


async def test_wait_acquires_when_the_holder_expires(provider: Any, key: str) -> None:
    await provider.acquire_lease(key, "bob", 300)
    result = await acquire_lease_wait(provider, key, "alice", 1000, timeout_s=10)
    assert result.acquired


async def test_sweeper_removes_expired_rows_only(provider: Any, key: str) -> None:
    fences = []
    for i in range(7):
        fences.append((await provider.acquire_lease(f"{key}:old{i}", "o", 50)).fence)
    live = await provider.acquire_lease(f"{key}:live", "o", 60_000)
    await asyncio.sleep(0.2)
    sweeper = ExpirySweeper(provider, interval_s=60, batch_size=3)
    assert await sweeper.sweep_once() >= 7
    assert await provider.get_lease_owner(f"{key}:live") == "o"
    again = await provider.acquire_lease(f"{key}:old0", "p", 1000)
    assert again.fence > max([*fences, live.fence])  # type: ignore[operator]
    async with ExpirySweeper(provider, interval_s=0.05) as background:
        await provider.acquire_lease(f"{key}:brief", "o", 20)
        await asyncio.sleep(0.3)
    assert background.swept_total >= 1


async def test_sweeper_by_default_sweeps_small_batches_a_quarter_of_the_time() -> None:
    """A backlog is swept in batches of 500 with pauses of three times each batch's duration: each
    commit's WAL stays small and acquires beside it meet a batch a quarter of the time (p99 of
    acquires during a sweep of 3 x 10^5 rows: 1.4-1.5 x without at 1000 rows and half the time,
    1.0-1.24 x at 500 and a quarter; docs/statements.md, "Sweeping")."""

    class Backlog:
        def __init__(self) -> None:
            self.batches: list[int] = []

        async def sweep_expired(self, batch_size: int = 1000, grace_ms: float = 0) -> int:
            self.batches.append(batch_size)
            await asyncio.sleep(0.02)
            return batch_size if len(self.batches) < 6 else 0

    backlog = Backlog()
    sweeper = ExpirySweeper(backlog)
    started = time.monotonic()
    assert await sweeper.sweep_once() == 5 * 500
    elapsed = time.monotonic() - started
    assert backlog.batches == [500] * 6
    assert elapsed >= 6 * 0.02 + 5 * 3 * 0.02 * 0.9, f"swept more than a quarter of {elapsed:.3f} s"


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"ttl_ms": 0}, ValueError),
        ({"renew_every_ms": 20_000}, ValueError),
        ({"on_lost": "explode"}, ValueError),
        ({"timeout_s": -1}, ValueError),
        ({"owner": ""}, ValueError),
    ],
)
def test_hold_rejects_bad_arguments(kwargs: dict[str, Any], expected: type) -> None:
    from sql_lease import InMemoryLeaseProvider

    with pytest.raises(expected):
        hold(InMemoryLeaseProvider(), "k", **kwargs)


@pytest.mark.postgres
@pytest.mark.parametrize("suffix", ["", ":resource\x00thread\x01\ud800"])  # NOTIFY names the stored form
async def test_postgres_waiter_wakes_on_notify_not_on_a_timer(
    pg_schema: tuple[str, str], key: str, suffix: str
) -> None:
    from sql_lease import SqlLeaseProvider

    url, schema = pg_schema
    key += suffix
    async with SqlLeaseProvider(url, schema=schema) as provider:
        await provider.acquire_lease(key, "holder", 60_000)
        counter = StatementCounter(provider)
        loop = asyncio.get_running_loop()
        waiting = asyncio.create_task(
            acquire_lease_wait(provider, key, "waiter", 10_000, timeout_s=20, listen_max_wait_s=30)
        )
        await asyncio.sleep(1.0)
        queries_while_waiting = counter.count
        released_at = loop.time()
        assert await provider.release_lease(key, "holder")
        result = await waiting
        assert result.acquired and result.owner == "waiter"
        # without the NOTIFY it would sleep 30 s (listen_max_wait_s) or until the holder's expiry
        assert loop.time() - released_at < 5
        assert queries_while_waiting <= 1  # one refused attempt, then no polling


@pytest.mark.postgres
async def test_postgres_waiters_survive_a_dead_listen_connection(pg_schema: tuple[str, str], key: str) -> None:
    import asyncpg

    from sql_lease import SqlLeaseProvider

    url, schema = pg_schema
    async with SqlLeaseProvider(url, schema=schema) as provider:
        await provider.acquire_lease(key, "holder", 60_000)
        waiting = asyncio.create_task(
            acquire_lease_wait(provider, key, "waiter", 10_000, timeout_s=20, listen_max_wait_s=30)
        )
        await asyncio.sleep(0.5)
        listener = provider._listener
        assert listener is not None and listener.listening
        admin = await asyncpg.connect(url)
        try:
            await admin.execute("SELECT pg_terminate_backend($1)", listener._driver.get_server_pid())
        finally:
            await admin.close()
        await asyncio.sleep(0.5)
        released_at = asyncio.get_running_loop().time()
        assert await provider.release_lease(key, "holder")
        result = await waiting
        assert result.acquired
        assert asyncio.get_running_loop().time() - released_at < 5  # re-listened, not the 30 s timer


async def test_many_waiters_in_one_process_do_not_stampede(sql_provider: Any, key: str) -> None:
    """Eight tasks queue for one key, each holds it briefly: the database sees a bounded number of
    statements per handoff, not one per waiting task per poll."""
    provider = sql_provider
    counter = StatementCounter(provider)
    order: list[int] = []

    async def worker(i: int) -> None:
        async with hold(provider, key, f"w{i}", ttl_ms=10_000, wait=True, timeout_s=30):
            order.append(i)
            await asyncio.sleep(0.05)

    await asyncio.gather(*(worker(i) for i in range(8)))
    assert sorted(order) == list(range(8))
    # Per handoff: the winner's acquire and release, and the polls of the one waiter at the head of
    # the local queue while the holder works 50 ms (on SQLite a refused poll is 2 statements: the
    # attempt and the read of the holder; on MySQL a grant is a transaction of 6 statements after
    # the read of the holder). Without the queue, 7 waiters would each poll.
    per_handoff = 14 if getattr(provider, "statements", None) is not None and provider.statements.transactional else 10
    assert counter.count <= 8 * per_handoff, counter.count


class Broken(Faulty):
    """A provider whose renewals raise a non-library exception (a bug, say)."""

    async def renew_lease(self, key: str, owner: str, ttl_ms: float) -> bool:
        raise RuntimeError("bug in a custom provider")


async def test_unexpected_renewal_errors_end_in_loss_not_silence(provider: Any, key: str) -> None:
    owner_when_cancelled = "not cancelled"
    with pytest.raises(LeaseLostError, match="RuntimeError"):
        async with hold(Broken(provider), key, "alice", ttl_ms=1000):
            try:
                await asyncio.sleep(5)
            except asyncio.CancelledError:
                owner_when_cancelled = await provider.get_lease_owner(key)
                raise
    assert owner_when_cancelled == "alice"  # stopped before the lease could lapse
    assert await provider.get_lease_owner(key) is None  # and still released


async def test_hold_after_a_long_wait_is_not_falsely_lost(provider: Any, key: str) -> None:
    """Regression: the TTL was counted from before the wait, so a wait longer than the TTL looked
    like a lapsed lease."""
    await provider.acquire_lease(key, "bob", 1500)
    async with hold(provider, key, "alice", ttl_ms=1000, wait=True, timeout_s=10) as lease:
        await asyncio.sleep(1.2)
        assert not lease.lost.is_set()
        assert await provider.get_lease_owner(key) == "alice"


async def test_transfer_to_a_waiter_behind_others_in_this_process(provider: Any, key: str) -> None:
    """Waiters on one key queue in this process; a lease handed to one further back must reach it
    without waiting for the ones in front (they would wait forever: the key is not free)."""
    order: list[str] = []

    async def run(owner: str) -> None:
        async with hold(provider, key, owner, ttl_ms=10_000, wait=True, timeout_s=8) as lease:
            order.append(owner)
            if owner == "run-1":
                await asyncio.sleep(0.2)  # run-2 and run-3 are queued by now
                assert await lease.transfer_to("run-3")

    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.gather(run("run-1"), run("run-2"), run("run-3"))
    assert order == ["run-1", "run-3", "run-2"]
    assert loop.time() - started < 5


def test_thread_worker_example_runs(tmp_path: Any) -> None:
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parent.parent / "examples" / "thread_worker.py"
    done = subprocess.run(
        [sys.executable, str(example), f"sqlite:///{tmp_path}/example.db"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "run-1 owns thread t-42 with fence 1",
        "run-1 handed thread t-42 to run-2",
        "run-2 owns thread t-42 with fence 2",
        "run-2 handed thread t-42 to run-3",
        "run-3 owns thread t-42 with fence 3",
        "thread t-42 is free again: True",
    ]


def test_a_late_renewal_blames_the_blocked_loop_only_when_it_was_late_by_more_than_jitter() -> None:
    """A TTL too short to renew (15 ms, from a user thinking in seconds) must not be reported as a
    blocked event loop: scheduling jitter alone makes such a renewal late."""
    from sql_lease import InMemoryLeaseProvider
    from sql_lease.holding import HeldLease

    short = HeldLease(InMemoryLeaseProvider(), "k", "a", ttl_ms=15)
    note = short._late(0.01)
    assert "TTL of 15 ms" in note and "blocked" not in note
    assert short._late(0.001) == ""  # within the loss margin: no note
    assert "event loop was blocked" in HeldLease(InMemoryLeaseProvider(), "k", "a", ttl_ms=15_000)._late(2.0)
    assert "event loop was blocked" in short._late(0.5)


# -- an acquire answering past the lease's deadline does not enter the block ------------------------


class _LateAcquire:
    """Forwards to ``inner``; each acquire answers ``late_s`` seconds after it committed."""

    def __init__(self, inner: Any, late_s: float) -> None:
        self.inner, self.late_s = inner, late_s

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def acquire_lease(self, *a: Any, **k: Any) -> Any:
        result = await self.inner.acquire_lease(*a, **k)
        await asyncio.sleep(self.late_s)
        return result


async def test_hold_does_not_enter_with_an_acquire_answered_past_the_deadline(provider: Any, key: str) -> None:
    """Reviewer: an acquire that answered later than 0.9 x TTL after it was sent still entered the
    block. Now: released, and not acquired."""
    entered: list[bool] = []
    late = _LateAcquire(provider, 0.3 * 0.95)
    with pytest.raises(LeaseNotAcquiredError, match="past the lease's deadline"):
        async with hold(late, key, ttl_ms=300):
            entered.append(True)
    assert entered == []
    assert await provider.get_lease_owner(key) is None  # released, not left to expire


# -- a process forked inside hold() never acts as the holder -------------------------------------------


async def test_a_child_forked_inside_hold_does_not_release_the_lease(key: str) -> None:
    """Reviewer's fk.py, asyncio: a child forked inside ``async with hold()`` that leaves the block
    (on an event loop of its own: the parent's does not run in the child) released the lease. Seen
    on the in-memory provider's copy in the child: the child must not have released it."""
    import os
    import warnings

    from sql_lease import InMemoryLeaseProvider

    provider = InMemoryLeaseProvider()
    read_end, write_end = os.pipe()
    async with hold(provider, key, ttl_ms=30_000, on_lost="flag") as lease:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            try:

                async def leave() -> None:
                    await lease.__aexit__(None, None, None)
                    os.write(write_end, str(await provider.get_lease_owner(key)).encode())

                asyncio.run(leave())
            finally:
                os._exit(0)
        await asyncio.to_thread(os.waitpid, pid, 0)
        os.close(write_end)
        with os.fdopen(read_end) as seen:
            assert seen.read() == lease.owner, "the child released the lease"
        assert lease.valid
