"""The semaphore contract (issue 25): ``acquire_lease(..., limit=N)`` on every provider, both faces.

Each test runs on the async and the sync face of every provider (the ``face`` fixture wraps a sync
provider's calls in threads, so one body serves both). Times are generous for a loaded machine.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from sql_lease import LeaseLostError
from sql_lease.contract import MAX_LIMIT
from tests.conftest import PROVIDER_KINDS, make_provider, make_sync_provider
from tests.support.counting import StatementCounter

TTL = 30_000
SHORT_TTL = 1_500  # ms; a slot that is to lapse (tests wait SHORT_WAIT seconds)
SHORT_WAIT = 2.0


class SyncFace:
    """A sync provider's methods as coroutines (each call in a thread), so a test body serves both faces."""

    def __init__(self, provider: Any) -> None:
        self.provider = provider
        self.face = "sync"

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.provider, name)
        if not callable(attribute):
            return attribute

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await asyncio.to_thread(functools.partial(attribute, *args, **kwargs))

        return call


@pytest.fixture(params=PROVIDER_KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=["async", "sync"])
async def face(request: pytest.FixtureRequest, kind: str, tmp_path: os.PathLike[str]) -> AsyncIterator[Any]:
    """The provider of ``kind`` on one face, its calls awaitable."""
    if request.param == "async":
        made = await make_provider(kind, request, tmp_path)
        made.face = "async"
        yield made
        if hasattr(made, "close"):
            await made.close()
        return
    sync = make_sync_provider(kind, request, tmp_path)
    yield SyncFace(sync)
    await asyncio.to_thread(sync.close)


@pytest.fixture
def key() -> str:
    return f"sem:{os.urandom(8).hex()}"


def raw(face: Any) -> Any:
    return getattr(face, "provider", face)


# -- limit: checked first, nothing sent -----------------------------------------------------------


@pytest.mark.parametrize(
    ("limit", "error"),
    [
        ("2", TypeError),
        (2.0, TypeError),
        (True, TypeError),
        (None, TypeError),
        (0, ValueError),
        (-1, ValueError),
        (MAX_LIMIT + 1, ValueError),
    ],
)
async def test_a_bad_limit_is_refused_before_anything_is_sent(face: Any, key: str, limit: Any, error: type) -> None:
    counter = StatementCounter(raw(face))
    with pytest.raises(error, match="limit"):
        await face.acquire_lease(key, "alice", TTL, limit=limit)
    with pytest.raises(error, match="limit"):  # checked before the other arguments
        await face.acquire_lease(None, None, -5, limit=limit)
    assert counter.count == 0
    assert await face.get_lease_holders(key) == []


def test_providers_that_take_limit_say_so(kind: str) -> None:
    from sql_lease import InMemoryLeaseProvider, SqlLeaseProvider, SyncInMemoryLeaseProvider, SyncSqlLeaseProvider

    classes = (
        (InMemoryLeaseProvider, SyncInMemoryLeaseProvider)
        if kind == "memory"
        else (SqlLeaseProvider, SyncSqlLeaseProvider)
    )
    assert all(getattr(cls, "accepts_limit", False) is True for cls in classes)


@pytest.mark.applies_to(lambda kind, face: kind != "memory")  # statements are the SQL providers'
async def test_limit_one_sends_the_plain_statements(face: Any, key: str) -> None:
    sent: list[str] = []
    raw(face).on_statement(lambda sql, _params: sent.append(sql))
    await face.acquire_lease(key, "alice", TTL)
    plain, sent[:] = list(sent), []
    await face.acquire_lease(key + "b", "alice", TTL, limit=1)
    assert sent == plain


# -- granting and refusing --------------------------------------------------------------------------


async def test_at_most_limit_owners_hold_slots_with_fences_increasing(face: Any, key: str) -> None:
    granted = [await face.acquire_lease(key, f"o{i}", TTL, limit=3) for i in range(3)]
    assert all(result.acquired for result in granted)
    fences = [result.fence for result in granted]
    assert fences == sorted(set(fences))  # type: ignore[type-var]
    refused = await face.acquire_lease(key, "o3", TTL, limit=3)
    assert not refused.acquired
    oldest = granted[0]
    assert (refused.owner, refused.fence, refused.expires_at) == ("o0", oldest.fence, oldest.expires_at)
    assert refused.remaining_ms is not None and 0 < refused.remaining_ms <= TTL
    holders = await face.get_lease_holders(key)
    assert [(h.owner, h.fence) for h in holders] == [("o0", fences[0]), ("o1", fences[1]), ("o2", fences[2])]
    assert await face.get_lease_owner(key) == "o0"
    lease = await face.get_lease(key)
    assert lease is not None and (lease.owner, lease.fence) == ("o0", fences[0])


async def test_the_limit_is_the_callers_per_call(face: Any, key: str) -> None:
    assert (await face.acquire_lease(key, "a", TTL, limit=3)).acquired
    assert (await face.acquire_lease(key, "b", TTL, limit=3)).acquired
    assert not (await face.acquire_lease(key, "c", TTL, limit=2)).acquired
    assert (await face.acquire_lease(key, "c", TTL, limit=4)).acquired


async def test_a_slot_holders_reacquire_renews_its_slot_same_fence_same_tenure(face: Any, key: str) -> None:
    first = await face.acquire_lease(key, "a", 5_000, limit=2)
    before = (await face.get_lease_holders(key))[0]
    await asyncio.sleep(0.05)
    again = await face.acquire_lease(key, "a", TTL, limit=2, data={"n": 2})
    assert again.acquired and again.fence == first.fence
    assert again.expires_at is not None and first.expires_at is not None and again.expires_at > first.expires_at
    after = (await face.get_lease_holders(key))[0]
    assert after.acquired_at == before.acquired_at and after.data == {"n": 2}
    assert len(await face.get_lease_holders(key)) == 1


async def test_a_plain_lease_refuses_a_semaphore_acquire_and_its_owner_reacquires_it_plain(face: Any, key: str) -> None:
    plain = await face.acquire_lease(key, "alice", TTL)
    refused = await face.acquire_lease(key, "bob", TTL, limit=3)
    assert not refused.acquired and (refused.owner, refused.fence) == ("alice", plain.fence)
    again = await face.acquire_lease(key, "alice", TTL, limit=3)  # kept plain: same fence and tenure
    assert again.acquired and again.fence == plain.fence
    holders = await face.get_lease_holders(key)
    assert [(h.owner, h.fence) for h in holders] == [("alice", plain.fence)]
    assert not (await face.acquire_lease(key, "bob", TTL)).acquired  # still a plain lease


async def test_a_plain_acquire_is_refused_while_any_slot_is_held_and_granted_when_the_last_is_released(
    face: Any, key: str
) -> None:
    a = await face.acquire_lease(key, "a", TTL, limit=2)
    b = await face.acquire_lease(key, "b", TTL, limit=2)
    for owner in ("a", "c"):  # the slot holders' own plain acquires too
        refused = await face.acquire_lease(key, owner, TTL)
        assert not refused.acquired and (refused.owner, refused.fence) == ("a", a.fence)
    assert await face.release_lease(key, "a")
    refused = await face.acquire_lease(key, "c", TTL)
    assert not refused.acquired and refused.owner == "b"
    assert await face.release_lease(key, "b")
    plain = await face.acquire_lease(key, "c", TTL)
    assert plain.acquired and plain.fence > b.fence > a.fence  # type: ignore[operator]
    assert [h.owner for h in await face.get_lease_holders(key)] == ["c"]


async def test_an_expired_slot_frees_its_place_and_the_key(face: Any, key: str) -> None:
    assert (await face.acquire_lease(key, "a", SHORT_TTL, limit=2)).acquired
    b = await face.acquire_lease(key, "b", SHORT_TTL, limit=2)
    assert not (await face.acquire_lease(key, "c", TTL, limit=2)).acquired
    await asyncio.sleep(SHORT_WAIT)
    assert await face.get_lease_holders(key) == [] and await face.get_lease_owner(key) is None
    c = await face.acquire_lease(key, "c", TTL, limit=2)
    assert c.acquired and c.fence > b.fence  # type: ignore[operator]
    assert (await face.acquire_lease(key, "b", TTL, limit=2)).fence > c.fence  # a new tenure for b
    await face.release_lease(key, "c")
    await face.release_lease(key, "b")
    assert (await face.acquire_lease(key, "plain", TTL)).acquired


async def test_a_kept_slot_counts_as_held(face: Any, key: str) -> None:
    assert (await face.acquire_lease(key, "a", TTL, limit=2)).acquired
    assert (await face.acquire_lease(key, "b", TTL, limit=2)).acquired
    assert await face.release_lease(key, "a", min_hold_ms=TTL)  # kept, released
    assert not (await face.acquire_lease(key, "c", TTL, limit=2)).acquired
    assert not (await face.acquire_lease(key, "a", TTL, limit=2)).acquired  # its own kept slot refuses it
    assert not await face.renew_lease(key, "a", TTL)
    holders = await face.get_lease_holders(key)
    assert [(h.owner, h.released) for h in holders] == [("a", True), ("b", False)]


async def test_a_slot_kept_past_its_expiry_keeps_plain_acquires_out(face: Any, key: str) -> None:
    """A minimum hold longer than the slot's TTL extends the slot's tenure; until it ends no plain
    lease is granted (PostgreSQL's 0008 release left the head at the old expiry: a plain acquire won)."""
    assert (await face.acquire_lease(key, "a", 300, limit=2)).acquired
    assert await face.release_lease(key, "a", min_hold_ms=4_000)  # kept, released, until 4 s after it began
    await asyncio.sleep(0.7)  # past the slot's TTL and past one more TTL of slack
    assert [(h.owner, h.released) for h in await face.get_lease_holders(key)] == [("a", True)]
    refused = await face.acquire_lease(key, "plain", 1_000)
    assert not refused.acquired and refused.owner == "a", refused


async def test_keys_with_nul_and_look_alike_owners(face: Any) -> None:
    key = f"sem\x00{os.urandom(4).hex()}\x01"
    assert (await face.acquire_lease(key, "a", TTL, limit=2)).acquired
    assert (await face.acquire_lease(key, "A", TTL, limit=2)).acquired  # owners compared byte for byte
    assert not (await face.acquire_lease(key, "a ", TTL, limit=2)).acquired
    assert [h.key for h in await face.get_lease_holders(key)] == [key, key]
    assert [lease.owner for lease in await face.list_leases(prefix=key)] == ["a", "A"]


# -- acting on one's slot ----------------------------------------------------------------------------


async def test_renew_release_and_transfer_act_on_the_owners_slot_scoped_by_fence(face: Any, key: str) -> None:
    a = await face.acquire_lease(key, "a", 5_000, limit=3)
    b = await face.acquire_lease(key, "b", TTL, limit=3)
    assert not await face.renew_lease(key, "a", TTL, fence=b.fence)
    info = await face.renew_lease_info(key, "a", TTL, fence=a.fence)
    assert info is not None and (info.owner, info.fence) == ("a", a.fence) and info.remaining_ms > 5_000
    assert not await face.renew_lease(key, "z", TTL)
    assert not await face.transfer_lease(key, "a", "b", TTL)  # b holds a slot already: nothing changes
    assert not await face.transfer_lease(key, "a", "c", TTL, fence=b.fence)
    assert await face.transfer_lease(key, "a", "a", TTL)  # to oneself: a renewal
    assert (await face.get_lease_holders(key))[0].fence == a.fence
    assert await face.transfer_lease(key, "a", "c", TTL, data={"to": "c"})
    holders = await face.get_lease_holders(key)
    assert [h.owner for h in holders] == ["b", "c"]  # c's tenure began now
    assert holders[1].fence > b.fence and holders[1].data == {"to": "c"}  # type: ignore[operator]
    assert not await face.release_lease(key, "a")
    assert not await face.release_lease(key, "c", fence=a.fence)
    assert await face.release_lease(key, "c", fence=holders[1].fence)
    assert [h.owner for h in await face.get_lease_holders(key)] == ["b"]


@pytest.mark.applies_to(lambda kind, face: face == "async")  # the renewal batcher's batch renewal
async def test_renew_many_renews_slots_beside_plain_leases(face: Any, key: str) -> None:
    await face.acquire_lease(key, "a", 5_000, limit=2)
    await face.acquire_lease(key + ":plain", "a", 5_000)
    renewed = await face.renew_many([(key, "a", TTL), (key + ":plain", "a", TTL), (key + ":none", "a", TTL)])
    assert set(renewed) == {key, key + ":plain"} and renewed[key].remaining_ms > 5_000


# -- reading, listing, breaking, sweeping ------------------------------------------------------------


async def test_list_shows_one_row_per_holder_and_no_head(face: Any, key: str) -> None:
    await face.acquire_lease(key + ":a", "x", TTL)
    for owner in ("p", "q", "r"):
        await face.acquire_lease(key + ":b", owner, TTL, limit=3)
    await face.acquire_lease(key + ":c", "y", TTL)
    listed = await face.list_leases(prefix=key)
    assert [(lease.key, lease.owner) for lease in listed] == [
        (key + ":a", "x"),
        (key + ":b", "p"),
        (key + ":b", "q"),
        (key + ":b", "r"),
        (key + ":c", "y"),
    ]
    assert len(await face.list_leases(prefix=key, limit=2)) == 2
    assert all(lease.owner for lease in await face.list_leases(include_expired=True, limit=10_000))


async def test_list_with_expired_shows_expired_slots(face: Any, key: str) -> None:
    await face.acquire_lease(key, "a", SHORT_TTL, limit=2)
    await face.acquire_lease(key, "b", SHORT_TTL, limit=2)
    await asyncio.sleep(SHORT_WAIT)
    assert await face.list_leases(prefix=key) == []
    expired = await face.list_leases(prefix=key, include_expired=True)
    assert [lease.owner for lease in expired] == ["a", "b"] and all(lease.remaining_ms <= 0 for lease in expired)


async def test_break_ends_every_holder_or_the_one_of_a_fence(face: Any, key: str) -> None:
    a = await face.acquire_lease(key, "a", TTL, limit=3)
    b = await face.acquire_lease(key, "b", TTL, limit=3)
    await face.acquire_lease(key, "c", TTL, limit=3)
    assert await face.break_lease(key, fence=b.fence + 1000) is None  # type: ignore[operator]
    broken = await face.break_lease(key, fence=b.fence)
    assert broken is not None and (broken.owner, broken.fence) == ("b", b.fence)
    assert [h.owner for h in await face.get_lease_holders(key)] == ["a", "c"]
    oldest = await face.break_lease(key)
    assert oldest is not None and (oldest.owner, oldest.fence) == ("a", a.fence)
    assert await face.get_lease_holders(key) == [] and await face.break_lease(key) is None
    assert not await face.renew_lease(key, "c", TTL)
    plain = await face.acquire_lease(key, "d", TTL)
    assert plain.acquired and plain.fence > b.fence  # type: ignore[operator]


@pytest.mark.parametrize("limit", [1, 2], ids=["lease", "semaphore"])
async def test_break_answers_the_holder_as_get_lease_did(face: Any, key: str, limit: int) -> None:
    """Every provider and face answers break_lease with every field of the holder it ended: data,
    tenure start and released flag too, as get_lease read them just before."""
    await face.acquire_lease(key, "a", TTL, limit=limit, data={"job": 7})
    assert await face.release_lease(key, "a", min_hold_ms=TTL)  # kept, released
    before = await face.get_lease(key)
    broken = await face.break_lease(key)
    assert before is not None and broken is not None
    fields = ("key", "owner", "fence", "expires_at", "data", "acquired_at", "released")
    assert {f: getattr(broken, f) for f in fields} == {f: getattr(before, f) for f in fields}
    assert broken.acquired_at is not None and broken.released and broken.data == {"job": 7}
    assert await face.get_lease(key) is None


async def test_sweep_removes_expired_slots(face: Any, key: str) -> None:
    await face.acquire_lease(key, "a", SHORT_TTL, limit=2)
    await face.acquire_lease(key, "b", SHORT_TTL, limit=2)
    await asyncio.sleep(SHORT_WAIT)
    assert await face.sweep_expired(batch_size=10_000) >= 2
    assert await face.list_leases(prefix=key, include_expired=True) == []
    assert (await face.acquire_lease(key, "c", TTL, limit=2)).acquired


# -- fenced writes ------------------------------------------------------------------------------------


@pytest.mark.applies_to(lambda kind, face: kind != "memory")  # check_held runs on a SQL database
async def test_check_held_holds_for_a_slot_holder(face: Any, key: str) -> None:
    provider = raw(face)
    a = await face.acquire_lease(key, "a", TTL, limit=2)
    await face.acquire_lease(key, "b", TTL, limit=2)
    if face.face == "async":

        async def check(fence: int) -> None:
            async with provider.engine.begin() as conn:
                await provider.check_held(conn, key, "a", fence)

    else:
        from sqlalchemy import create_engine

        engine = create_engine(provider._url)  # the URL the provider was made from

        async def check(fence: int) -> None:
            def run() -> None:
                with engine.begin() as conn:
                    provider.check_held(conn, key, "a", fence)

            await asyncio.to_thread(run)

    try:
        await check(a.fence)
        with pytest.raises(LeaseLostError):
            await check(a.fence + 1)
        assert await face.release_lease(key, "a")
        with pytest.raises(LeaseLostError):
            await check(a.fence)
    finally:
        if face.face == "sync":
            engine.dispose()


# -- waiting --------------------------------------------------------------------------------------------


@pytest.mark.applies_to(lambda kind, face: (kind, face) == ("postgres", "async"))  # NOTIFY; others poll
async def test_a_release_of_any_slot_wakes_a_waiter(face: Any, key: str) -> None:
    provider = raw(face)
    await face.acquire_lease(key, "a", TTL, limit=2)
    await face.acquire_lease(key, "b", TTL, limit=2)
    waiter = provider.release_waiter(key)
    assert waiter is not None
    async with waiter:
        assert not await waiter.acquire("c", TTL, limit=2)
        started = time.monotonic()
        release = asyncio.create_task(face.release_lease(key, "b"))
        assert await waiter.wait(20)
        assert time.monotonic() - started < 10 and await release
        assert (await waiter.acquire("c", TTL, limit=2)).acquired


# -- semaphores beside all-or-nothing calls -------------------------------------------------------


async def test_an_all_or_nothing_acquire_refused_by_a_semaphore_names_its_oldest_holder(face: Any, key: str) -> None:
    await face.acquire_lease(key, "a", TTL, limit=3)
    await face.acquire_lease(key, "b", TTL, limit=3)
    free = f"{key}:free"
    results = await face.acquire_leases([free, key], "c", TTL)
    assert [r.acquired for r in results] == [False, False]
    assert results[0].owner is None and results[1].owner == "a"
    assert await face.get_lease_owner(free) is None
    assert [h.owner for h in await face.get_lease_holders(key)] == ["a", "b"]


async def test_release_and_renew_of_several_keys_reach_the_owners_slots(face: Any, key: str) -> None:
    plain = f"{key}:plain"
    slot = await face.acquire_lease(key, "a", TTL, limit=2)
    await face.acquire_lease(key, "b", TTL, limit=2)
    assert (await face.acquire_lease(plain, "a", TTL)).acquired
    assert await face.renew_leases([key, plain], "a", TTL) == [True, True]
    assert [h.fence for h in await face.get_lease_holders(key) if h.owner == "a"] == [slot.fence]
    assert await face.release_leases([key, plain], "a") == 2
    assert [h.owner for h in await face.get_lease_holders(key)] == ["b"]
    assert await face.get_lease_owner(plain) is None
    assert await face.release_leases([key, plain], "a") == 0


# -- a head whose only slot was re-acquired with a shorter TTL (tests/test_properties.py found it) --


async def test_a_plain_acquire_takes_a_key_whose_only_slot_was_shortened_and_expired(face: Any, key: str) -> None:
    """PostgreSQL's slot function raised the head's expiry to the longest it had seen, never lowered it
    when the holder re-acquired its slot with a shorter TTL: once that slot expired the head still
    refused plain acquires for the old TTL, naming nobody, while no one held the key."""
    assert (await face.acquire_lease(key, "alice", TTL, limit=2)).acquired
    assert (await face.acquire_lease(key, "alice", 1, limit=2)).acquired  # the same slot, now 1 ms
    await asyncio.sleep(0.02)
    assert await face.get_lease_holders(key) == []
    taken = await face.acquire_lease(key, "bob", TTL)
    assert (taken.acquired, taken.owner) == (True, "bob"), taken
    assert [h.owner for h in await face.get_lease_holders(key)] == ["bob"]


async def test_acquire_leases_takes_a_key_whose_only_slot_was_shortened_and_expired(face: Any, key: str) -> None:
    assert (await face.acquire_lease(key, "alice", TTL, limit=3)).acquired
    assert (await face.acquire_lease(key, "alice", 1, limit=3)).acquired
    await asyncio.sleep(0.02)
    results = await face.acquire_leases([key, key + ":other"], "bob", TTL)
    assert [r.acquired for r in results] == [True, True], results
    assert await face.get_lease_owner(key) == "bob"
