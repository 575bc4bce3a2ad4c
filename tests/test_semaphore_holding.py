"""Semaphores above the providers (issue 25): ``hold(limit=N)``, ``acquire_lease_wait(limit=N)`` and
``@leased(limit=N)`` on both faces and every provider, the ``accepts_limit`` rule, and quick checks
of the in-memory providers' semaphore rules (the model the SQL providers are compared with)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from sql_lease import (
    InMemoryLeaseProvider,
    LeaseNotAcquiredError,
    SyncInMemoryLeaseProvider,
    acquire_lease_wait,
    hold,
    leased,
    sync_holding,
)

BAD_LIMITS = [(True, TypeError), (2.0, TypeError), ("2", TypeError), (0, ValueError), (10_001, ValueError)]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# -- the in-memory providers' semaphore rules --------------------------------------------------


async def test_memory_grants_limit_slots_with_growing_fences_and_refuses_naming_the_oldest() -> None:
    clock = Clock()
    leases = InMemoryLeaseProvider(clock=clock)
    fences = []
    for owner in ("a", "b", "c"):
        result = await leases.acquire_lease("k", owner, 10_000, limit=3)
        assert result.acquired and result.owner == owner
        fences.append(result.fence)
        clock.now += 1
    assert fences == sorted(set(fences))
    refused = await leases.acquire_lease("k", "d", 10_000, limit=3)
    assert (refused.acquired, refused.owner, refused.fence) == (False, "a", fences[0])
    assert refused.remaining_ms == 10_000 - 3 and refused.expires_at is not None
    assert (await leases.acquire_lease("k", "d", 10_000, limit=4)).acquired  # the limit is the caller's
    holders = await leases.get_lease_holders("k")
    assert [h.owner for h in holders] == ["a", "b", "c", "d"]
    assert await leases.get_lease_owner("k") == "a" and (await leases.get_lease("k")).owner == "a"  # type: ignore[union-attr]
    assert InMemoryLeaseProvider.accepts_limit is True and SyncInMemoryLeaseProvider.accepts_limit is True


async def test_memory_reacquire_keeps_the_slot_and_expired_slots_do_not_count() -> None:
    clock = Clock()
    leases = InMemoryLeaseProvider(clock=clock)
    first = await leases.acquire_lease("k", "a", 1_000, limit=2)
    started = (await leases.get_lease_holders("k"))[0].acquired_at
    clock.now += 500
    again = await leases.acquire_lease("k", "a", 5_000, limit=2, data={"n": 2})
    assert again.acquired and again.fence == first.fence and again.remaining_ms == 5_000
    (mine,) = await leases.get_lease_holders("k")
    assert mine.acquired_at == started and mine.data == {"n": 2}
    assert (await leases.acquire_lease("k", "b", 100, limit=2)).acquired
    assert not (await leases.acquire_lease("k", "c", 100, limit=2)).acquired
    clock.now += 200  # b's slot expired: it no longer counts
    c = await leases.acquire_lease("k", "c", 100, limit=2)
    assert c.acquired and c.fence > first.fence  # type: ignore[operator]
    clock.now += 200
    b = await leases.acquire_lease("k", "b", 100, limit=2)  # c expired too; b's new slot, new fence
    assert b.acquired and b.fence > c.fence  # type: ignore[operator]


async def test_memory_a_key_is_held_as_a_lease_or_as_a_semaphore() -> None:
    leases = InMemoryLeaseProvider()
    plain = await leases.acquire_lease("k", "a", 10_000)
    refused = await leases.acquire_lease("k", "b", 10_000, limit=3)
    assert (refused.acquired, refused.owner, refused.fence) == (False, "a", plain.fence)
    again = await leases.acquire_lease("k", "a", 10_000, limit=3)  # the plain holder's re-acquire
    assert again.acquired and again.fence == plain.fence
    assert [h.owner for h in await leases.get_lease_holders("k")] == ["a"]
    assert await leases.release_lease("k", "a")

    slot = await leases.acquire_lease("k", "a", 10_000, limit=3)
    assert (await leases.acquire_lease("k", "b", 10_000, limit=3)).acquired
    for owner in ("a", "b", "c"):  # refused while anyone holds it, the slot holders included
        refused = await leases.acquire_lease("k", owner, 10_000)
        assert (refused.acquired, refused.owner, refused.fence) == (False, "a", slot.fence)
    assert await leases.release_lease("k", "a") and await leases.release_lease("k", "b")
    after = await leases.acquire_lease("k", "c", 10_000)  # free at once after the last slot
    assert after.acquired and after.fence > slot.fence  # type: ignore[operator]
    assert await leases.get_lease_holders("nothing") == []


async def test_memory_renew_release_transfer_act_on_the_owners_slot() -> None:
    clock = Clock()
    leases = InMemoryLeaseProvider(clock=clock)
    a = await leases.acquire_lease("k", "a", 1_000, limit=3)
    clock.now += 1
    b = await leases.acquire_lease("k", "b", 1_000, limit=3)
    assert not await leases.renew_lease("k", "a", 5_000, fence=b.fence)
    info = await leases.renew_lease_info("k", "b", 5_000, fence=b.fence)
    assert info is not None and (info.owner, info.fence, info.remaining_ms) == ("b", b.fence, 5_000)
    assert await leases.renew_many([("k", "a", 6_000, a.fence)]) == {
        "k": await leases.renew_lease_info("k", "a", 6_000)
    }
    assert not await leases.transfer_lease("k", "a", "b", 1_000)  # b holds a slot already
    clock.now += 1
    assert await leases.transfer_lease("k", "a", "c", 2_000, data={"to": "c"}, fence=a.fence)
    holders = await leases.get_lease_holders("k")
    assert [h.owner for h in holders] == ["b", "c"]  # c's tenure restarted: now the newest
    c = holders[1]
    assert c.fence > b.fence and c.data == {"to": "c"} and c.remaining_ms == 2_000  # type: ignore[operator]
    assert await leases.transfer_lease("k", "c", "c", 3_000)  # to oneself: a renewal
    assert (await leases.get_lease_holders("k"))[1].fence == c.fence
    assert not await leases.release_lease("k", "a")
    assert not await leases.release_lease("k", "c", fence=b.fence)
    assert await leases.release_lease("k", "c", fence=c.fence)
    assert [h.owner for h in await leases.get_lease_holders("k")] == ["b"]


async def test_memory_a_kept_slot_counts_until_its_minimum_hold_ends() -> None:
    clock = Clock()
    leases = InMemoryLeaseProvider(clock=clock)
    await leases.acquire_lease("k", "a", 10_000, limit=2)
    await leases.acquire_lease("k", "b", 10_000, limit=2)
    assert await leases.release_lease("k", "a", min_hold_ms=1_000)
    (kept, _) = await leases.get_lease_holders("k")
    assert kept.released and kept.remaining_ms == 1_000
    refused = await leases.acquire_lease("k", "c", 10_000, limit=2)
    assert not refused.acquired and refused.owner == "a"
    assert not (await leases.acquire_lease("k", "a", 10_000, limit=2)).acquired  # its own: it was released
    assert not await leases.renew_lease("k", "a", 10_000)
    clock.now += 1_000
    assert (await leases.acquire_lease("k", "c", 10_000, limit=2)).acquired


async def test_memory_list_break_and_sweep_see_every_slot() -> None:
    clock = Clock()
    leases = InMemoryLeaseProvider(clock=clock)
    await leases.acquire_lease("s", "z", 10_000, limit=3)
    clock.now += 1
    y = await leases.acquire_lease("s", "y", 100, limit=3)
    clock.now += 1
    await leases.acquire_lease("s", "x", 10_000, limit=3)
    await leases.acquire_lease("t", "p", 10_000)
    rows = await leases.list_leases()
    assert [(r.key, r.owner) for r in rows] == [("s", "z"), ("s", "y"), ("s", "x"), ("t", "p")]
    assert [r.owner for r in await leases.list_leases(limit=2)] == ["z", "y"]
    clock.now += 100  # y's slot expired
    assert [r.owner for r in await leases.list_leases("s")] == ["z", "x"]
    assert [r.owner for r in await leases.list_leases("s", include_expired=True)] == ["z", "y", "x"]
    assert await leases.sweep_expired() == 1
    assert [r.owner for r in await leases.list_leases("s", include_expired=True)] == ["z", "x"]
    assert await leases.break_lease("s", fence=y.fence) is None
    x_fence = (await leases.get_lease_holders("s"))[1].fence
    broken = await leases.break_lease("s", fence=x_fence)
    assert broken is not None and broken.owner == "x"
    await leases.acquire_lease("s", "w", 10_000, limit=3)
    oldest = await leases.break_lease("s")
    assert oldest is not None and oldest.owner == "z"
    assert await leases.get_lease_holders("s") == [] and await leases.break_lease("s") is None
    assert (await leases.acquire_lease("s", "q", 10_000)).acquired


@pytest.mark.parametrize(("limit", "error"), BAD_LIMITS)
async def test_memory_bad_limits_are_refused_and_nothing_is_written(limit: Any, error: type[Exception]) -> None:
    leases = InMemoryLeaseProvider()
    with pytest.raises(error, match="limit"):
        await leases.acquire_lease("k", "a", 1_000, limit=limit)
    with pytest.raises(error, match="limit"):
        SyncInMemoryLeaseProvider().acquire_lease("k", "a", 1_000, limit=limit)
    assert await leases.list_leases(include_expired=True) == []


def test_sync_memory_has_the_same_rules() -> None:
    leases = SyncInMemoryLeaseProvider()
    a = leases.acquire_lease("k", "a", 10_000, limit=2)
    b = leases.acquire_lease("k", "b", 10_000, limit=2, timeout_s=1)
    assert a.acquired and b.acquired and b.fence > a.fence  # type: ignore[operator]
    assert not leases.acquire_lease("k", "c", 10_000, limit=2).acquired
    assert [h.owner for h in leases.get_lease_holders("k", timeout_s=1)] == ["a", "b"]
    assert leases.release_lease("k", "a")
    assert leases.acquire_lease("k", "c", 10_000, limit=2).acquired


# -- holding: hold(limit=N), acquire_lease_wait(limit=N), @leased(limit=N) ----------------------


async def test_hold_with_a_limit_admits_that_many_holders(provider: Any, key: str) -> None:
    async with (
        hold(provider, key, "a", ttl_ms=10_000, limit=2) as a,
        hold(provider, key, "b", ttl_ms=10_000, limit=2) as b,
    ):
        assert b.fence > a.fence
        with pytest.raises(LeaseNotAcquiredError) as refused:
            async with hold(provider, key, "c", ttl_ms=10_000, limit=2):
                pytest.fail("a third holder of a limit of 2")
        assert refused.value.holder == "a" and refused.value.fence == a.fence
        assert [h.owner for h in await provider.get_lease_holders(key)] == ["a", "b"]
    assert await provider.get_lease_holders(key) == []
    assert (await provider.acquire_lease(key, "plain", 10_000)).acquired  # free for a plain lease at once


async def test_hold_renews_its_slot_past_the_ttl(provider: Any, key: str) -> None:
    async with hold(provider, key, "a", ttl_ms=1_500, limit=2) as lease:  # renewed every 0.5 s
        await asyncio.sleep(3.0)
        assert not lease.lost.is_set()
        assert [h.owner for h in await provider.get_lease_holders(key)] == ["a"]
        assert (await provider.acquire_lease(key, "b", 10_000, limit=2)).acquired
        assert not (await provider.acquire_lease(key, "c", 10_000, limit=2)).acquired


async def test_a_waiting_hold_takes_the_first_slot_let_go(provider: Any, key: str) -> None:
    await provider.acquire_lease(key, "a", 30_000, limit=2)
    await provider.acquire_lease(key, "b", 30_000, limit=2)

    async def release_b_soon() -> None:
        await asyncio.sleep(0.3)
        assert await provider.release_lease(key, "b")

    releasing = asyncio.create_task(release_b_soon())
    async with hold(provider, key, "c", ttl_ms=10_000, limit=2, wait=True, timeout_s=20) as lease:
        assert lease.owner == "c"
        assert [h.owner for h in await provider.get_lease_holders(key)] == ["a", "c"]
    await releasing
    result = await acquire_lease_wait(provider, key, "d", 10_000, timeout_s=20, limit=2)
    assert result.acquired
    with pytest.raises(LeaseNotAcquiredError) as info:
        await acquire_lease_wait(provider, key, "e", 10_000, timeout_s=0.3, limit=2)
    assert info.value.holder == "a"


async def test_a_slot_handed_on_is_adopted_by_the_next_owners_hold(provider: Any, key: str) -> None:
    await provider.acquire_lease(key, "older", 30_000, limit=3)
    async with hold(provider, key, "a", ttl_ms=10_000, limit=3) as first:
        assert await first.transfer_to("b")
        assert first.handoff is not None
        async with hold(provider, key, "b", ttl_ms=10_000, limit=3).adopting(first.handoff) as second:
            assert second.fence > first.fence  # type: ignore[operator]
            assert [h.owner for h in await provider.get_lease_holders(key)] == ["older", "b"]
    assert [h.owner for h in await provider.get_lease_holders(key)] == ["older"]


async def test_a_minimum_hold_keeps_the_slot_counted(provider: Any, key: str) -> None:
    async with hold(provider, key, "a", ttl_ms=10_000, limit=1 + 1, min_hold_ms=60_000):
        pass
    (kept,) = await provider.get_lease_holders(key)
    assert kept.owner == "a" and kept.released
    assert (await provider.acquire_lease(key, "b", 10_000, limit=2)).acquired
    assert not (await provider.acquire_lease(key, "c", 10_000, limit=2)).acquired


class Plain:
    """A third-party provider: the five lease methods, no ``accepts_limit``; counts its calls."""

    def __init__(self) -> None:
        self.inner = InMemoryLeaseProvider()
        self.calls = 0

    async def acquire_lease(self, key: str, owner: str, ttl_ms: float) -> Any:
        self.calls += 1
        return await self.inner.acquire_lease(key, owner, ttl_ms)

    async def get_lease_owner(self, key: str) -> Any:
        return await self.inner.get_lease_owner(key)

    async def release_lease(self, key: str, owner: str) -> Any:
        self.calls += 1
        return await self.inner.release_lease(key, owner)

    async def renew_lease(self, key: str, owner: str, ttl_ms: float) -> Any:
        return await self.inner.renew_lease(key, owner, ttl_ms)

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: float) -> Any:
        return await self.inner.transfer_lease(key, from_owner, to_owner, ttl_ms)


async def test_a_limit_needs_a_provider_that_accepts_it() -> None:
    plain = Plain()
    with pytest.raises(TypeError, match="Plain"):
        hold(plain, "k", "a", limit=2)
    with pytest.raises(TypeError, match="Plain"):
        await acquire_lease_wait(plain, "k", "a", 1_000, limit=2)
    with pytest.raises(TypeError, match="Plain"):
        leased(plain, "k", limit=2)
    assert plain.calls == 0
    async with hold(plain, "k", "a", limit=1):  # limit 1 is not passed on: a plain lease
        pass
    assert (await acquire_lease_wait(plain, "k", "a", 1_000, limit=1)).acquired
    assert plain.calls == 3


@pytest.mark.parametrize(("limit", "error"), BAD_LIMITS)
async def test_bad_limits_are_refused_before_anything_is_sent(limit: Any, error: type[Exception]) -> None:
    plain = Plain()
    for make in (
        lambda: hold(plain, "k", "a", limit=limit),
        lambda: sync_holding.hold(plain, "k", "a", limit=limit),
        lambda: leased(plain, "k", limit=limit),
    ):
        with pytest.raises(error, match="limit"):
            make()
    with pytest.raises(error, match="limit"):
        await acquire_lease_wait(plain, "k", "a", 1_000, limit=limit)
    assert plain.calls == 0


async def test_leased_with_a_limit_runs_at_most_that_many_calls(provider: Any, key: str) -> None:
    running, most = 0, 0

    @leased(provider, key, ttl_ms=10_000, limit=2, on_conflict="wait", timeout_s=30)
    async def job() -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.2)
        running -= 1

    await asyncio.gather(*(job() for _ in range(5)))
    assert most == 2

    @leased(provider, key, ttl_ms=10_000, limit=2)
    async def skipped_when_full() -> str:
        return "ran"

    async with hold(provider, key, "x", ttl_ms=10_000, limit=2), hold(provider, key, "y", ttl_ms=10_000, limit=2):
        assert await skipped_when_full() is None
    assert await skipped_when_full() == "ran"


# -- the thread face ---------------------------------------------------------------------------


def test_sync_hold_with_a_limit_admits_that_many_holders(sync_provider: Any, key: str) -> None:
    with sync_provider.hold(key, "a", 10_000, limit=2) as a, sync_provider.hold(key, "b", 10_000, limit=2) as b:
        assert b.fence > a.fence
        with (
            pytest.raises(LeaseNotAcquiredError) as refused,
            sync_holding.hold(sync_provider, key, "c", 10_000, limit=2),
        ):
            pytest.fail("a third holder of a limit of 2")
        assert refused.value.holder == "a"
    assert sync_provider.get_lease_holders(key) == []


def test_sync_waiting_hold_takes_the_first_slot_let_go(sync_provider: Any, key: str) -> None:
    sync_provider.acquire_lease(key, "a", 30_000, limit=2)
    sync_provider.acquire_lease(key, "b", 30_000, limit=2)
    releaser = threading.Timer(0.3, lambda: sync_provider.release_lease(key, "a"))
    releaser.start()
    started = time.monotonic()
    with sync_holding.hold(sync_provider, key, "c", 10_000, limit=2, wait=True, timeout_s=20) as lease:
        assert time.monotonic() - started >= 0.25
        assert [h.owner for h in sync_provider.get_lease_holders(key)] == ["b", "c"]
        assert lease.fence is not None
    releaser.join()
    assert sync_holding.acquire_lease_wait(sync_provider, key, "d", 10_000, 20, limit=2).acquired
    with pytest.raises(LeaseNotAcquiredError):
        sync_holding.acquire_lease_wait(sync_provider, key, "e", 10_000, 0.2, limit=2)


def test_sync_leased_with_a_limit_runs_at_most_that_many_calls(sync_provider: Any, key: str) -> None:
    lock = threading.Lock()
    running, most = 0, 0

    @leased(sync_provider, key, ttl_ms=10_000, limit=3, on_conflict="wait", timeout_s=30)
    def job() -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.3)
        with lock:
            running -= 1

    threads = [threading.Thread(target=job) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert most == 3
