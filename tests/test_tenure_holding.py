"""hold(), @leased and exec act only on their own tenure (issue 24, part 2) and keep a minimum hold
(part 3): every renewal, batch renewal, transfer and release they send carries the tenure's
fence, the final release the minimum hold; providers without ``accepts_fence`` keep working."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from sql_lease import (
    AcquireResult,
    InMemoryLeaseProvider,
    LeaseNotAcquiredError,
    SyncInMemoryLeaseProvider,
    hold,
    leased,
)
from sql_lease.sync_holding import hold as sync_hold

TTL = 1_500  # ms: renewals every 500 ms land in time on a loaded machine
MIN_HOLD = 2_000


class Recording(InMemoryLeaseProvider):
    """The in-memory provider, recording the keywords of every release, renewal and transfer."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, Any]] = []

    async def release_lease(self, key: str, owner: str, **kw: Any) -> bool:
        self.calls.append(("release", kw))
        return await super().release_lease(key, owner, **kw)

    async def renew_many(self, items: Any) -> Any:
        self.calls.append(("renew_many", list(items)))
        return await super().renew_many(items)

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: Any, **kw: Any) -> bool:
        self.calls.append(("transfer", kw))
        return await super().transfer_lease(key, from_owner, to_owner, ttl_ms, **kw)


class RecordingOneByOne(Recording):
    """Without ``renew_many``: ``hold()`` renews each lease with ``renew_lease_info``."""

    renew_many = None  # type: ignore[assignment]

    async def renew_lease_info(self, key: str, owner: str, ttl_ms: Any, **kw: Any) -> Any:
        self.calls.append(("renew", kw))
        return await super().renew_lease_info(key, owner, ttl_ms, **kw)


class SyncRecording(SyncInMemoryLeaseProvider):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, Any]] = []

    def release_lease(self, key: str, owner: str, **kw: Any) -> bool:
        self.calls.append(("release", {k: v for k, v in kw.items() if k != "timeout_s"}))
        return super().release_lease(key, owner, **kw)

    def renew_lease_info(self, key: str, owner: str, ttl_ms: Any, **kw: Any) -> Any:
        self.calls.append(("renew", {k: v for k, v in kw.items() if k != "timeout_s"}))
        return super().renew_lease_info(key, owner, ttl_ms, **kw)

    def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: Any, **kw: Any) -> bool:
        self.calls.append(("transfer", {k: v for k, v in kw.items() if k not in ("timeout_s", "data")}))
        return super().transfer_lease(key, from_owner, to_owner, ttl_ms, **kw)


class ThirdParty:
    """A provider written without sql_lease's extensions: the five methods, no ``fence``."""

    def __init__(self) -> None:
        self.inner = InMemoryLeaseProvider()
        self.released: list[tuple[str, str]] = []

    async def acquire_lease(self, key: str, owner: str, ttl_ms: float) -> AcquireResult:
        return await self.inner.acquire_lease(key, owner, ttl_ms)

    async def get_lease_owner(self, key: str) -> str | None:
        return await self.inner.get_lease_owner(key)

    async def release_lease(self, key: str, owner: str) -> bool:
        self.released.append((key, owner))
        return await self.inner.release_lease(key, owner)

    async def renew_lease(self, key: str, owner: str, ttl_ms: float) -> bool:
        return await self.inner.renew_lease(key, owner, ttl_ms)

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: float) -> bool:
        return await self.inner.transfer_lease(key, from_owner, to_owner, ttl_ms)


@pytest.mark.parametrize("make", [Recording, RecordingOneByOne])
async def test_hold_sends_its_fence_with_every_renewal_transfer_and_release(make: Any) -> None:
    provider = make()
    async with hold(provider, "k", "a", TTL) as lease:
        await asyncio.sleep(TTL / 1000 * 0.6)  # one renewal, at TTL/3
        assert await lease.transfer_to("b")
    async with hold(provider, "k2", "c", TTL, min_hold_ms=MIN_HOLD) as other:
        pass
    renewals = [c for c in provider.calls if c[0] in ("renew", "renew_many")]
    assert renewals, provider.calls
    for kind, sent in renewals:
        assert (sent == [("k", "a", TTL, lease.fence)]) if kind == "renew_many" else sent == {"fence": lease.fence}
    assert ("transfer", {"fence": lease.fence}) in provider.calls
    assert provider.calls[-1] == ("release", {"fence": other.fence, "min_hold_ms": MIN_HOLD})
    kept = await provider.get_lease("k2")
    assert kept is not None and kept.released and kept.owner == "c"


def test_sync_hold_sends_its_fence_with_every_renewal_transfer_and_release() -> None:
    provider = SyncRecording()
    with sync_hold(provider, "k", "a", TTL) as lease:
        time.sleep(TTL / 1000 * 0.6)
        assert lease.transfer_to("b")
    with sync_hold(provider, "k2", "c", TTL, min_hold_ms=MIN_HOLD) as other:
        pass
    assert ("renew", {"fence": lease.fence}) in provider.calls
    assert ("transfer", {"fence": lease.fence}) in provider.calls
    assert provider.calls[-1] == ("release", {"fence": other.fence, "min_hold_ms": MIN_HOLD})
    assert provider.get_lease("k2").released


async def test_a_hold_never_releases_a_later_tenure_of_its_owner_id(provider: Any, key: str) -> None:
    """The owner id comes back (a reused run id): the block's release must not end the new tenure."""
    async with hold(provider, key, "run-7", ttl_ms=10_000, on_lost="flag") as lease:
        assert await provider.break_lease(key, fence=lease.fence) is not None
        new = await provider.acquire_lease(key, "run-7", 10_000)
        assert new.acquired and new.fence > lease.fence
    current = await provider.get_lease(key)
    assert current is not None and current.fence == new.fence


def test_a_sync_hold_never_releases_a_later_tenure_of_its_owner_id(sync_provider: Any, key: str) -> None:
    with sync_hold(sync_provider, key, "run-7", ttl_ms=10_000, on_lost="flag") as lease:
        assert sync_provider.break_lease(key, fence=lease.fence) is not None
        new = sync_provider.acquire_lease(key, "run-7", 10_000)
        assert new.acquired and new.fence > lease.fence
    current = sync_provider.get_lease(key)
    assert current is not None and current.fence == new.fence


async def test_a_hold_tells_what_its_final_release_answered(provider: Any, key: str) -> None:
    """Broken inside the block (an operator's `break`), unseen by any renewal: ``released`` is
    False, the release at the end found the lease gone; True after a normal block."""
    async with hold(provider, key, "a", ttl_ms=10_000) as broken:
        assert broken.released is None
        assert await provider.break_lease(key) is not None
    assert broken.released is False and not broken.lost.is_set()
    async with hold(provider, key, "a", ttl_ms=10_000) as kept:
        pass
    assert kept.released is True and await provider.get_lease_owner(key) is None


def test_a_sync_hold_tells_what_its_final_release_answered(sync_provider: Any, key: str) -> None:
    with sync_hold(sync_provider, key, "a", ttl_ms=10_000) as broken:
        assert broken.released is None
        assert sync_provider.break_lease(key) is not None
    assert broken.released is False and not broken.lost.is_set()
    with sync_hold(sync_provider, key, "a", ttl_ms=10_000) as kept:
        pass
    assert kept.released is True and sync_provider.get_lease_owner(key) is None


async def test_hold_with_a_minimum_hold_keeps_the_lease_after_the_block(provider: Any, key: str) -> None:
    async with hold(provider, key, ttl_ms=10_000, min_hold_ms=MIN_HOLD) as lease:
        pass  # a 1 ms job
    kept = await provider.get_lease(key)
    assert kept is not None and kept.released and kept.fence == lease.fence
    with pytest.raises(LeaseNotAcquiredError):
        async with hold(provider, key, ttl_ms=10_000):
            pass
    await asyncio.sleep(kept.remaining_ms / 1000 + 0.05)
    async with hold(provider, key, ttl_ms=10_000) as later:
        assert later.fence > lease.fence


def test_leased_runs_at_most_once_per_minimum_hold(sync_provider: Any, key: str) -> None:
    runs: list[int] = []

    @leased(sync_provider, key, ttl_ms=10_000, min_hold_ms=MIN_HOLD)
    def job(fence: int) -> int:
        runs.append(fence)
        return fence

    first = job()
    assert first is not None and job() is None  # another call within the period: skipped
    assert sync_provider.get_lease(key).released
    time.sleep(sync_provider.get_lease(key).remaining_ms / 1000 + 0.05)
    assert job() is not None and len(runs) == 2


async def test_leased_with_a_fixed_owner_keeps_the_minimum_hold(provider: Any, key: str) -> None:
    @leased(provider, key, ttl_ms=10_000, owner="nightly", min_hold_ms=MIN_HOLD)
    async def job(fence: int) -> int:
        return fence

    fence = await job()
    kept = await provider.get_lease(key)
    assert kept is not None and (kept.owner, kept.fence, kept.released) == ("nightly", fence, True)
    assert await job() is None


async def test_providers_without_fences_serve_hold_and_refuse_a_minimum_hold() -> None:
    provider = ThirdParty()
    async with hold(provider, "k", "a", TTL) as lease:
        await asyncio.sleep(TTL / 1000 * 0.6)
        assert lease.valid
    assert provider.released == [("k", "a")] and await provider.get_lease_owner("k") is None
    with pytest.raises(TypeError, match="min_hold_ms"):
        hold(provider, "k", "a", TTL, min_hold_ms=MIN_HOLD)
    with pytest.raises(TypeError, match="min_hold_ms"):
        leased(provider, "k", min_hold_ms=MIN_HOLD)


@pytest.mark.parametrize(("value", "expected"), [(-1, ValueError), (float("nan"), ValueError), (True, TypeError)])
def test_hold_and_leased_check_the_minimum_hold(value: Any, expected: type) -> None:
    with pytest.raises(expected):
        hold(InMemoryLeaseProvider(), "k", min_hold_ms=value)
    with pytest.raises(expected):
        leased(SyncInMemoryLeaseProvider(), "k", min_hold_ms=value)


async def test_a_waiter_gets_a_kept_lease_when_it_expires_not_at_the_release(provider: Any, key: str) -> None:
    """A minimum-hold release wakes nobody into a lease still held: the waiter's refusal reports the
    kept lease's time left, and it takes the key at that expiry (by the provider's clock)."""
    from sql_lease import acquire_lease_wait

    held = await provider.acquire_lease(key, "cron@a", 10_000)
    waiting = asyncio.ensure_future(acquire_lease_wait(provider, key, "cron@b", 10_000, timeout_s=15))
    await asyncio.sleep(0.3)  # the waiter is refused and waits (on PostgreSQL: flagged, listening)
    assert await provider.release_lease(key, "cron@a", min_hold_ms=MIN_HOLD)
    kept = await provider.get_lease(key)
    assert kept is not None and kept.released and not waiting.done()
    got = await waiting
    taken = await provider.get_lease(key)
    assert got.acquired and got.fence > held.fence and taken is not None and taken.owner == "cron@b"
    assert taken.acquired_at is not None and taken.acquired_at >= kept.expires_at


async def test_the_noop_provider_takes_and_checks_the_keywords() -> None:
    from sql_lease import NoopLeaseProvider

    noop = NoopLeaseProvider()
    async with hold(noop, "k", "a", TTL, min_hold_ms=MIN_HOLD) as lease:
        assert lease.fence is None
    assert await noop.release_lease("k", "a", fence=3, min_hold_ms=MIN_HOLD)
    with pytest.raises(ValueError):
        await noop.renew_lease("k", "a", TTL, fence=0)
    with pytest.raises(TypeError):
        await noop.transfer_lease("k", "a", "b", TTL, fence="3")  # type: ignore[arg-type]
