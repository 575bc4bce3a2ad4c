"""``hold_all()`` on both faces (issue 25): every key acquired at once, renewed together (one statement
per interval, counted with ``on_statement``), the loss of one key the loss of all, every key released on
exit with one statement."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from sql_lease import LeaseLostError, LeaseNotAcquiredError, hold_all
from sql_lease.sync_holding import hold_all as sync_hold_all

TTL, EVERY, HELD_S = 6_000, 300, 1.5


class Sent:
    """The statements a SQL provider sends (none for the in-memory ones)."""

    def __init__(self, provider: Any) -> None:
        self.texts: list[str] = []
        hook = getattr(provider, "on_statement", None)
        self.counts = hook is not None
        if hook is not None:
            hook(lambda sql, params: self.texts.append(sql))

    def since(self, mark: int) -> list[str]:
        return self.texts[mark:]

    def releases(self, provider: Any, mark: int) -> int:
        return sum(text == provider.statements.release_keys for text in self.texts[mark:])


def renewals_bound(held_s: float) -> int:
    """At most one statement per interval (and one more at the edges); renewing key by key sends three."""
    return int(held_s * 1000 / EVERY) + 2


async def test_hold_all_renews_its_keys_together_and_releases_them_at_once(provider: Any, key: str) -> None:
    keys = [f"{key}:{i}" for i in range(3)]
    sent = Sent(provider)
    async with hold_all(provider, keys, "alice", TTL, renew_every_ms=EVERY) as leases:
        first = {k: (await provider.get_lease(k)).expires_at for k in keys}
        assert set(leases.fences) == set(keys) and len(set(leases.fences.values())) == 3
        mark = len(sent.texts)
        await asyncio.sleep(HELD_S)
        renewing = sent.since(mark)
        leases.check()
        assert leases.valid and not leases.lost.is_set()
        for k in keys:
            lease = await provider.get_lease(k)
            assert (lease.owner, lease.fence) == ("alice", leases.fences[k]) and lease.expires_at > first[k]
        mark = len(sent.texts)
    if sent.counts:
        assert 3 <= len(renewing) <= renewals_bound(HELD_S), len(renewing)
        assert sent.releases(provider, mark) == 1  # one release_leases
    assert [await provider.get_lease_owner(k) for k in keys] == [None, None, None]


async def test_hold_all_is_refused_whole_and_names_the_holder(provider: Any, key: str) -> None:
    keys = [f"{key}:free", f"{key}:held"]
    await provider.acquire_lease(keys[1], "bob", TTL)
    with pytest.raises(LeaseNotAcquiredError) as refused:
        async with hold_all(provider, keys, "alice", TTL):
            pytest.fail("entered")
    assert (refused.value.key, refused.value.holder) == (keys[1], "bob")
    assert await provider.get_lease_owner(keys[0]) is None


async def test_hold_all_loses_every_key_when_one_is_broken(provider: Any, key: str) -> None:
    keys = [f"{key}:{i}" for i in range(3)]
    with pytest.raises(LeaseLostError):
        async with hold_all(provider, keys, "alice", TTL, renew_every_ms=EVERY) as leases:
            await provider.break_lease(keys[1])
            await asyncio.sleep(3 * EVERY / 1000)  # cancelled by the loss (on_lost="cancel")
            pytest.fail("not cancelled")
    assert leases.lost.is_set() and repr(keys[1]) in (leases.lost_reason or "")
    assert all(lease.lost.is_set() for lease in leases.leases)
    assert [await provider.get_lease_owner(k) for k in keys] == [None, None, None]


def test_sync_hold_all_renews_together_and_releases_at_once(sync_provider: Any, key: str) -> None:
    keys = [f"{key}:{i}" for i in range(3)]
    sent = Sent(sync_provider)
    with sync_hold_all(sync_provider, keys, "alice", TTL, renew_every_ms=EVERY) as leases:
        first = {k: sync_provider.get_lease(k).expires_at for k in keys}
        mark = len(sent.texts)
        time.sleep(HELD_S)
        renewing = sent.since(mark)
        leases.check()
        for k in keys:
            lease = sync_provider.get_lease(k)
            assert (lease.owner, lease.fence) == ("alice", leases.fences[k]) and lease.expires_at > first[k]
        mark = len(sent.texts)
    if sent.counts:
        assert 3 <= len(renewing) <= renewals_bound(HELD_S), len(renewing)
        assert sent.releases(sync_provider, mark) == 1
    assert [sync_provider.get_lease_owner(k) for k in keys] == [None, None, None]


def test_sync_hold_all_loses_every_key_when_one_is_broken(sync_provider: Any, key: str) -> None:
    keys = [f"{key}:{i}" for i in range(3)]
    with sync_hold_all(sync_provider, keys, "alice", TTL, renew_every_ms=EVERY, on_lost="flag") as leases:
        sync_provider.break_lease(keys[2])
        assert leases.lost.wait(5 * EVERY / 1000)
        with pytest.raises(LeaseLostError):
            leases.check()
        assert not leases.valid and all(lease.lost.is_set() for lease in leases.leases)
    assert repr(keys[2]) in (leases.lost_reason or "")
    assert [sync_provider.get_lease_owner(k) for k in keys] == [None, None, None]
    with pytest.raises(LeaseNotAcquiredError):
        sync_provider.acquire_lease(keys[0], "bob", TTL)
        with sync_hold_all(sync_provider, keys, "alice", TTL):
            pytest.fail("entered")


async def test_providers_have_a_hold_all_shortcut_on_both_faces() -> None:
    from sql_lease import InMemoryLeaseProvider, SyncInMemoryLeaseProvider

    leases = InMemoryLeaseProvider()
    async with leases.hold_all(["s:1", "s:2"], "a", ttl_ms=TTL) as held:
        assert [await leases.get_lease_owner(k) for k in ("s:1", "s:2")] == ["a", "a"]
        assert set(held.fences) == {"s:1", "s:2"}
    assert await leases.get_lease_owner("s:1") is None

    sync_leases = SyncInMemoryLeaseProvider()
    with sync_leases.hold_all(["s:1", "s:2"], "b", ttl_ms=TTL):
        assert sync_leases.get_lease_owner("s:2") == "b"
    assert sync_leases.get_lease_owner("s:2") is None


# -- an owner id that comes back (issue 24): a stale hold_all() exit frees only its own tenures --


async def test_an_old_hold_all_exit_leaves_a_newer_tenure_of_the_same_owner(provider: Any, key: str) -> None:
    keys = [f"{key}:a", f"{key}:b"]
    async with hold_all(provider, keys, "job", TTL, renew_every_ms=TTL // 2, on_lost="flag") as old:
        await provider.break_lease(keys[0])  # the old tenure of keys[0] ends; a retried job reuses the name
        newer = await provider.acquire_lease(keys[0], "job", TTL)
        assert newer.acquired and newer.fence != old.fences[keys[0]]
    lease = await provider.get_lease(keys[0])
    assert lease is not None and (lease.owner, lease.fence) == ("job", newer.fence)
    assert await provider.get_lease_owner(keys[1]) is None  # its own tenure: released


def test_sync_an_old_hold_all_exit_leaves_a_newer_tenure_of_the_same_owner(sync_provider: Any, key: str) -> None:
    keys = [f"{key}:a", f"{key}:b"]
    with sync_hold_all(sync_provider, keys, "job", TTL, renew_every_ms=TTL // 2, on_lost="flag") as old:
        sync_provider.break_lease(keys[1])
        newer = sync_provider.acquire_lease(keys[1], "job", TTL)
        assert newer.acquired and newer.fence != old.fences[keys[1]]
    lease = sync_provider.get_lease(keys[1])
    assert lease is not None and (lease.owner, lease.fence) == ("job", newer.fence)
    assert sync_provider.get_lease_owner(keys[0]) is None


async def test_release_leases_with_fences_frees_only_those_tenures(provider: Any, key: str) -> None:
    keys = [f"{key}:a", f"{key}:b", f"{key}:c"]
    granted = await provider.acquire_leases(keys, "job", TTL)
    fences = [result.fence for result in granted]
    stale = [fences[0], fences[1] + 1_000, fences[2]]
    assert await provider.release_leases(keys, "job", fences=stale) == 2
    assert [await provider.get_lease_owner(k) for k in keys] == [None, "job", None]
    assert await provider.release_leases(keys[1:2], "job", fences=[fences[1]]) == 1
    assert await provider.get_lease_owner(keys[1]) is None


async def test_release_leases_with_fences_frees_only_that_slot_of_a_semaphore(provider: Any, key: str) -> None:
    slot = await provider.acquire_lease(key, "job", TTL, limit=2)
    assert slot.acquired
    assert await provider.release_leases([key], "job", fences=[slot.fence + 1_000]) == 0
    assert [h.owner for h in await provider.get_lease_holders(key)] == ["job"]
    assert await provider.release_leases([key], "job", fences=[slot.fence]) == 1
    assert await provider.get_lease_holders(key) == []


def test_sync_release_leases_with_fences_frees_only_those_tenures(sync_provider: Any, key: str) -> None:
    keys = [f"{key}:a", f"{key}:b"]
    fences = [result.fence for result in sync_provider.acquire_leases(keys, "job", TTL)]
    assert sync_provider.release_leases(keys, "job", fences=[fences[0] + 1_000, fences[1]]) == 1
    assert [sync_provider.get_lease_owner(k) for k in keys] == ["job", None]


BAD_FENCES = [
    ([1], ValueError),
    ([1, 2, 3], ValueError),
    ([1, 0], ValueError),
    ([1, True], TypeError),
    ("12", TypeError),
]


@pytest.mark.parametrize(("fences", "error"), BAD_FENCES)
async def test_release_leases_refuses_bad_fences_before_any_sql(
    provider: Any, key: str, fences: Any, error: type[Exception]
) -> None:
    keys = [f"{key}:a", f"{key}:b"]
    await provider.acquire_leases(keys, "job", TTL)
    with pytest.raises(error):
        await provider.release_leases(keys, "job", fences=fences)
    assert [await provider.get_lease_owner(k) for k in keys] == ["job", "job"]


@pytest.mark.parametrize(("fences", "error"), BAD_FENCES)
def test_sync_release_leases_refuses_bad_fences_before_any_sql(
    sync_provider: Any, key: str, fences: Any, error: type[Exception]
) -> None:
    keys = [f"{key}:a", f"{key}:b"]
    sync_provider.acquire_leases(keys, "job", TTL)
    with pytest.raises(error):
        sync_provider.release_leases(keys, "job", fences=fences)
    assert [sync_provider.get_lease_owner(k) for k in keys] == ["job", "job"]


async def test_the_noop_provider_checks_fences_as_the_others_do() -> None:
    from sql_lease import NoopLeaseProvider

    noop = NoopLeaseProvider()
    assert await noop.release_leases(["a", "b"], "job", fences=[1, 2]) == 2
    with pytest.raises(ValueError):
        await noop.release_leases(["a", "b"], "job", fences=[1])
    with pytest.raises(TypeError):
        await noop.renew_leases(["a"], "job", TTL, fences=[True])


# -- hold_all(wait=True, timeout_s=...): all or nothing, waiting as hold(wait=True) waits --


async def test_hold_all_waits_for_a_holder_to_release_and_never_holds_part_meanwhile(provider: Any, key: str) -> None:
    keys = [f"{key}:free", f"{key}:held"]
    await provider.acquire_lease(keys[1], "bob", TTL)

    async def enter() -> dict[str, int | None]:
        async with hold_all(provider, keys, "alice", TTL, wait=True, timeout_s=10) as held:
            assert [await provider.get_lease_owner(k) for k in keys] == ["alice", "alice"]
            return held.fences

    waiting = asyncio.ensure_future(enter())
    await asyncio.sleep(0.3)
    assert not waiting.done()
    assert await provider.get_lease_owner(keys[0]) is None  # no partial set while waiting
    assert await provider.release_lease(keys[1], "bob")
    fences = await asyncio.wait_for(waiting, 10)
    assert set(fences) == set(keys)
    assert [await provider.get_lease_owner(k) for k in keys] == [None, None]


async def test_hold_all_wait_times_out_with_the_error_hold_wait_raises(provider: Any, key: str) -> None:
    from sql_lease import hold

    keys = [f"{key}:free", f"{key}:held"]
    bob = await provider.acquire_lease(keys[1], "bob", TTL)
    with pytest.raises(LeaseNotAcquiredError) as single:
        async with hold(provider, keys[1], "alice", TTL, wait=True, timeout_s=0.2):
            pytest.fail("entered")
    with pytest.raises(LeaseNotAcquiredError) as several:
        async with hold_all(provider, keys, "alice", TTL, wait=True, timeout_s=0.2):
            pytest.fail("entered")
    for error in (single.value, several.value):
        assert (error.key, error.holder, error.fence) == (keys[1], "bob", bob.fence)
        assert error.waited_s is not None and "after waiting" in str(error)
    assert await provider.get_lease_owner(keys[0]) is None


def test_sync_hold_all_waits_for_a_holder_to_release(sync_provider: Any, key: str) -> None:
    import threading

    keys = [f"{key}:free", f"{key}:held"]
    sync_provider.acquire_lease(keys[1], "bob", TTL)
    entered: list[list[str | None]] = []

    def enter() -> None:
        with sync_hold_all(sync_provider, keys, "alice", TTL, wait=True, timeout_s=10):
            entered.append([sync_provider.get_lease_owner(k) for k in keys])

    waiter = threading.Thread(target=enter)
    waiter.start()
    time.sleep(0.3)
    assert not entered and sync_provider.get_lease_owner(keys[0]) is None
    assert sync_provider.release_lease(keys[1], "bob")
    waiter.join(10)
    assert entered == [["alice", "alice"]]


def test_sync_hold_all_wait_times_out_with_the_error_hold_wait_raises(sync_provider: Any, key: str) -> None:
    from sql_lease.sync_holding import hold as sync_hold

    keys = [f"{key}:free", f"{key}:held"]
    bob = sync_provider.acquire_lease(keys[1], "bob", TTL)
    errors = []
    for holding in (
        lambda: sync_hold(sync_provider, keys[1], "alice", TTL, wait=True, timeout_s=0.2),
        lambda: sync_hold_all(sync_provider, keys, "alice", TTL, wait=True, timeout_s=0.2),
    ):
        with pytest.raises(LeaseNotAcquiredError) as refused, holding():
            pytest.fail("entered")
        errors.append(refused.value)
    for error in errors:
        assert (error.key, error.holder, error.fence) == (keys[1], "bob", bob.fence)
        assert error.waited_s is not None and "after waiting" in str(error)
    assert sync_provider.get_lease_owner(keys[0]) is None


async def test_a_hold_all_tells_what_its_final_release_answered(provider: Any, key: str) -> None:
    """As ``hold()``'s ``released``: False when the release at the block's end found a key gone
    (broken inside the block, unseen by any renewal), True when it freed every key."""
    keys = [f"{key}:a", f"{key}:b"]
    async with hold_all(provider, keys, "o", ttl_ms=10_000) as broken:
        assert broken.released is None
        assert await provider.break_lease(keys[1]) is not None
    assert broken.released is False and not broken.lost.is_set()
    async with hold_all(provider, keys, "o", ttl_ms=10_000) as kept:
        pass
    assert kept.released is True and [await provider.get_lease_owner(k) for k in keys] == [None, None]


def test_a_sync_hold_all_tells_what_its_final_release_answered(sync_provider: Any, key: str) -> None:
    keys = [f"{key}:a", f"{key}:b"]
    with sync_hold_all(sync_provider, keys, "o", ttl_ms=10_000) as broken:
        assert broken.released is None
        assert sync_provider.break_lease(keys[0]) is not None
    assert broken.released is False and not broken.lost.is_set()
    with sync_hold_all(sync_provider, keys, "o", ttl_ms=10_000) as kept:
        pass
    assert kept.released is True and [sync_provider.get_lease_owner(k) for k in keys] == [None, None]
