"""The LeaseProvider contract (rules 1-10 of the foundation issue), on every provider."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sql_lease import MAX_KEY_LENGTH, MAX_OWNER_LENGTH, MAX_TTL_MS, AcquireResult, LeaseProvider, is_lease_provider
from tests.support.keys import KeysSeen, key_order, look_alike_keys

TTL = 10_000
SHORT_TTL = 300  # ms; tests wait SHORT_WAIT seconds for it to lapse
SHORT_WAIT = 0.6
RENEWED_TTL = 1_000  # ms; renewed every RENEWED_TTL/4 for longer than RENEWED_TTL


def assert_near_now_plus(moment: datetime | None, ttl_ms: float, slack_s: float = 5.0) -> None:
    assert moment is not None and moment.tzinfo is not None
    assert moment.utcoffset() == timedelta(0)
    expected = datetime.now(UTC) + timedelta(milliseconds=ttl_ms)
    assert abs((moment - expected).total_seconds()) < slack_s


async def test_is_a_lease_provider(provider: LeaseProvider) -> None:
    assert is_lease_provider(provider)
    assert isinstance(provider, LeaseProvider)


# 1. acquire on a free key
async def test_acquire_free_key(provider: LeaseProvider, key: str) -> None:
    result = await provider.acquire_lease(key, "alice", TTL)
    assert result == AcquireResult(True, "alice", result.fence, result.expires_at)
    assert isinstance(result.fence, int) and result.fence > 0
    assert_near_now_plus(result.expires_at, TTL)
    assert await provider.get_lease_owner(key) == "alice"


# 2. refused while another owner holds it, with the holder described
async def test_acquire_held_by_other_is_refused_with_holder(provider: LeaseProvider, key: str) -> None:
    held = await provider.acquire_lease(key, "alice", TTL)
    refused = await provider.acquire_lease(key, "bob", TTL)
    assert not refused.acquired and not refused
    assert (refused.owner, refused.fence, refused.expires_at) == (held.owner, held.fence, held.expires_at)
    assert await provider.get_lease_owner(key) == "alice"


# 3. acquire by the current owner: idempotent, expiry reset, fence unchanged
async def test_reacquire_by_owner_extends_and_keeps_fence(provider: LeaseProvider, key: str) -> None:
    first = await provider.acquire_lease(key, "alice", 1_000)
    await asyncio.sleep(0.02)
    again = await provider.acquire_lease(key, "alice", TTL)
    assert again.acquired and again.fence == first.fence
    assert again.expires_at is not None and first.expires_at is not None
    assert again.expires_at > first.expires_at
    assert_near_now_plus(again.expires_at, TTL)


# 4. fences strictly increase at every change of owner
async def test_fence_increases_on_every_change_of_owner(provider: LeaseProvider, key: str) -> None:
    fences = [(await provider.acquire_lease(key, "alice", TTL)).fence]
    assert await provider.release_lease(key, "alice")
    fences.append((await provider.acquire_lease(key, "bob", TTL)).fence)
    assert await provider.release_lease(key, "bob")
    fences.append((await provider.acquire_lease(key, "bob", TTL)).fence)  # same owner after a release
    assert await provider.transfer_lease(key, "bob", "carol", TTL)
    fences.append((await provider.acquire_lease(key, "carol", TTL)).fence)
    assert await provider.release_lease(key, "carol")
    fences.append((await provider.acquire_lease(key, "dave", SHORT_TTL)).fence)
    await asyncio.sleep(SHORT_WAIT)
    fences.append((await provider.acquire_lease(key, "erin", TTL)).fence)  # takeover after expiry
    assert all(isinstance(f, int) for f in fences)
    assert fences == sorted(set(fences)), fences  # type: ignore[type-var]


async def test_fence_increases_after_sweep(provider: LeaseProvider, key: str) -> None:
    first = await provider.acquire_lease(key, "alice", SHORT_TTL)
    await asyncio.sleep(SHORT_WAIT)
    assert await provider.sweep_expired(batch_size=1_000_000) >= 1  # type: ignore[attr-defined]
    assert await provider.get_lease_owner(key) is None
    second = await provider.acquire_lease(key, "bob", TTL)
    assert second.acquired and second.fence > first.fence  # type: ignore[operator]


async def test_fences_independent_keys_never_repeat(provider: LeaseProvider, key: str) -> None:
    seen = set()
    for i in range(20):
        result = await provider.acquire_lease(f"{key}:{i}", f"owner{i}", TTL)
        seen.add(result.fence)
    assert len(seen) == 20


# 5. get_lease_owner of expired or released leases
async def test_owner_of_expired_or_released_is_none(provider: LeaseProvider, key: str) -> None:
    assert await provider.get_lease_owner(key) is None
    await provider.acquire_lease(key, "alice", TTL)
    assert await provider.get_lease_owner(key) == "alice"
    assert await provider.renew_lease(key, "alice", SHORT_TTL)  # read under a long TTL, then let it lapse
    await asyncio.sleep(SHORT_WAIT)
    assert await provider.get_lease_owner(key) is None
    await provider.acquire_lease(key, "bob", TTL)
    assert await provider.release_lease(key, "bob")
    assert await provider.get_lease_owner(key) is None


# 6. release by a non-owner or a former owner
async def test_release_by_non_owner_is_refused(provider: LeaseProvider, key: str) -> None:
    held = await provider.acquire_lease(key, "alice", TTL)
    assert await provider.release_lease(key, "mallory") is False
    assert await provider.release_lease(f"{key}:other", "alice") is False
    again = await provider.acquire_lease(key, "alice", TTL)
    assert again.fence == held.fence and await provider.get_lease_owner(key) == "alice"


async def test_release_by_former_owner_after_takeover_is_refused(provider: LeaseProvider, key: str) -> None:
    await provider.acquire_lease(key, "alice", SHORT_TTL)
    await asyncio.sleep(SHORT_WAIT)
    taken = await provider.acquire_lease(key, "bob", TTL)
    assert taken.acquired
    assert await provider.release_lease(key, "alice") is False
    assert await provider.get_lease_owner(key) == "bob"


async def test_release_of_own_expired_lease_reports_false(provider: LeaseProvider, key: str) -> None:
    await provider.acquire_lease(key, "alice", SHORT_TTL)
    await asyncio.sleep(SHORT_WAIT)
    assert await provider.release_lease(key, "alice") is False
    assert (await provider.acquire_lease(key, "bob", TTL)).acquired


async def test_release_frees_the_key_at_once(provider: LeaseProvider, key: str) -> None:
    await provider.acquire_lease(key, "alice", TTL)
    assert await provider.release_lease(key, "alice") is True
    assert (await provider.acquire_lease(key, "bob", TTL)).acquired


# 7. renew
async def test_renew_by_owner_extends(provider: LeaseProvider, key: str) -> None:
    await provider.acquire_lease(key, "alice", TTL)
    assert await provider.renew_lease(key, "alice", 3 * TTL) is True
    lease = await provider.get_lease(key)  # type: ignore[attr-defined]
    assert lease is not None and lease.owner == "alice" and lease.remaining_ms > TTL  # past the first TTL
    assert not (await provider.acquire_lease(key, "bob", TTL)).acquired


async def test_renew_keeps_a_lease_past_its_ttl(provider: LeaseProvider, key: str) -> None:
    await provider.acquire_lease(key, "alice", RENEWED_TTL)
    for _ in range(5):  # 1.25 s in all, past the 1 s TTL; each renewal 0.75 s before the lease would lapse
        await asyncio.sleep(RENEWED_TTL / 4000)
        assert await provider.renew_lease(key, "alice", RENEWED_TTL)
    assert await provider.get_lease_owner(key) == "alice"


async def test_renew_after_expiry_or_by_non_owner_fails(provider: LeaseProvider, key: str) -> None:
    assert await provider.renew_lease(key, "alice", TTL) is False  # never held
    await provider.acquire_lease(key, "alice", SHORT_TTL)
    assert await provider.renew_lease(key, "bob", TTL) is False
    await asyncio.sleep(SHORT_WAIT)
    assert await provider.renew_lease(key, "alice", TTL) is False  # expired, nobody took it
    assert await provider.get_lease_owner(key) is None


# 8. transfer
async def test_transfer_hands_over_with_new_fence(provider: LeaseProvider, key: str) -> None:
    held = await provider.acquire_lease(key, "alice", TTL)
    assert await provider.transfer_lease(key, "alice", "bob", 3 * TTL) is True
    assert await provider.get_lease_owner(key) == "bob"
    lease = await provider.get_lease(key)  # type: ignore[attr-defined]
    assert lease is not None and lease.remaining_ms > TTL  # the new TTL counts from the transfer
    refused = await provider.acquire_lease(key, "alice", TTL)
    assert not refused.acquired and refused.owner == "bob"
    assert refused.fence > held.fence  # type: ignore[operator]
    assert await provider.release_lease(key, "alice") is False


async def test_transfer_to_self_acts_as_renew(provider: LeaseProvider, key: str) -> None:
    held = await provider.acquire_lease(key, "alice", TTL)
    assert await provider.transfer_lease(key, "alice", "alice", 3 * TTL) is True
    lease = await provider.get_lease(key)  # type: ignore[attr-defined]
    assert lease is not None and lease.remaining_ms > TTL  # renewed, as renew_lease would
    again = await provider.acquire_lease(key, "alice", TTL)
    assert again.fence == held.fence


async def test_transfer_by_non_owner_or_after_expiry_changes_nothing(provider: LeaseProvider, key: str) -> None:
    assert await provider.transfer_lease(key, "alice", "bob", TTL) is False
    assert await provider.get_lease_owner(key) is None
    held = await provider.acquire_lease(key, "alice", TTL)
    assert await provider.transfer_lease(key, "mallory", "bob", TTL) is False
    again = await provider.acquire_lease(key, "alice", TTL)
    assert again.fence == held.fence
    assert await provider.renew_lease(key, "alice", SHORT_TTL)  # then let it lapse
    await asyncio.sleep(SHORT_WAIT)
    assert await provider.transfer_lease(key, "alice", "bob", TTL) is False
    assert await provider.get_lease_owner(key) is None


async def test_transfer_leaves_no_gap(provider: LeaseProvider, key: str) -> None:
    """A contender hammering acquire never gets the key between the two owners."""
    await provider.acquire_lease(key, "owner0", TTL)
    stolen = []

    async def contender() -> None:
        for _ in range(200):
            if (await provider.acquire_lease(key, "thief", TTL)).acquired:
                stolen.append(True)
            await asyncio.sleep(0)

    async def relay() -> None:
        for i in range(40):
            assert await provider.transfer_lease(key, f"owner{i}", f"owner{i + 1}", TTL)
            await asyncio.sleep(0)

    await asyncio.gather(contender(), relay())
    assert stolen == []
    assert await provider.get_lease_owner(key) == "owner40"


# 9. limits that must be accepted
async def test_documented_limits_are_accepted(provider: LeaseProvider, key: str) -> None:
    long_key = key + "k" * (MAX_KEY_LENGTH - len(key))
    long_owner = "o" * MAX_OWNER_LENGTH
    assert (await provider.acquire_lease(long_key, long_owner, 24 * 3600 * 1000)).acquired
    assert await provider.get_lease_owner(long_key) == long_owner
    assert await provider.renew_lease(long_key, long_owner, MAX_TTL_MS)
    assert (await provider.acquire_lease(key, "alice", 1.5)).acquired  # fractional milliseconds


async def test_keys_and_owners_round_trip_exactly(provider: LeaseProvider, key: str) -> None:
    odd = ["it's", 'say "hi"', "100%", "a_b", "back\\slash", "new\nline", "tab\t", "emoji 🔒", "ünïcödé", " "]
    for _i, text in enumerate(odd):
        assert (await provider.acquire_lease(f"{key}:{text}", text, TTL)).acquired
        assert await provider.get_lease_owner(f"{key}:{text}") == text
    # LIKE metacharacters are not wildcards: "a_b" and "a%b" are different keys from "axb"
    assert await provider.get_lease_owner(f"{key}:axb") is None
    base = key + "x" * (MAX_KEY_LENGTH - len(key) - 1)
    assert (await provider.acquire_lease(base + "1", "one", TTL)).acquired
    assert (await provider.acquire_lease(base + "2", "two", TTL)).acquired
    assert await provider.get_lease_owner(base + "1") == "one"


# 11. any str is a key (issue 24): NUL, U+0001 (the escape of the stored form) and lone surrogates
async def test_any_str_is_a_key_of_its_own_and_reads_back_exactly(provider: Any, key: str) -> None:
    keys = look_alike_keys(key + ":")
    assert len(set(keys)) == len(keys)
    for i, k in enumerate(keys):
        assert (await provider.acquire_lease(k, f"o{i}", TTL, data={"i": i})).acquired, repr(k)  # a row of its own
    for i, k in enumerate(keys):
        lease = await provider.get_lease(k)
        assert lease is not None and (lease.key, lease.owner, lease.data) == (k, f"o{i}", {"i": i})
        assert await provider.get_lease_owner(k) == f"o{i}"
    in_order = sorted(keys, key=key_order)
    listed = await provider.list_leases(prefix=key + ":")
    assert [(lease.key, lease.owner) for lease in listed] == [(k, f"o{keys.index(k)}") for k in in_order]
    for part in ("\x00", "\x01", "\x01\x01", "\ud800", "\ud83d", "\\"):
        expected = [k for k in in_order if k.startswith(f"{key}:{part}")]
        assert expected
        assert [lease.key for lease in await provider.list_leases(prefix=f"{key}:{part}")] == expected

    nul, escape, surrogate, pair = keys[0], keys[5], keys[7], keys[9]
    renewed = await provider.renew_lease_info(nul, "o0", TTL)
    assert renewed is not None and renewed.key == nul
    batch = await provider.renew_many([(k, f"o{i}", TTL) for i, k in enumerate(keys)])
    assert sorted(batch, key=key_order) == in_order and all(info.key == k for k, info in batch.items())
    assert await provider.transfer_lease(nul, "o0", "next", TTL)
    assert not await provider.transfer_lease(keys[2], "o0", "next", TTL)  # the look-alike is o2's
    assert await provider.get_lease_owner(nul) == "next" and await provider.get_lease_owner(keys[2]) == "o2"
    assert await provider.release_lease(escape, "o5")
    assert await provider.get_lease_owner(escape) is None and await provider.get_lease_owner(keys[3]) == "o3"
    broken = await provider.break_lease(surrogate)
    assert broken is not None and (broken.key, broken.owner) == (surrogate, "o7")
    assert await provider.get_lease_owner(keys[6]) == "o6" and await provider.get_lease_owner(pair) == "o9"

    expiring = key + ":\x00\ud800gone"
    assert (await provider.acquire_lease(expiring, "short", SHORT_TTL)).acquired
    await asyncio.sleep(SHORT_WAIT)
    expired = await provider.list_leases(prefix=key + ":\x00\ud800", include_expired=True)
    assert [(lease.key, lease.remaining_ms is not None and lease.remaining_ms <= 0) for lease in expired] == [
        (expiring, True)
    ]
    assert await provider.sweep_expired(batch_size=1_000_000) >= 1
    assert await provider.list_leases(prefix=key + ":\x00\ud800", include_expired=True) == []
    assert await provider.get_lease_owner(keys[1]) == "o1"


async def test_observers_and_errors_name_the_key_as_given(sql_provider: Any, key: str) -> None:
    from sql_lease import LeaseNotAcquiredError
    from sql_lease.observe import add_observer

    odd = key + ":resource\x00thread\x01\ud800"
    keys = KeysSeen(key)
    remove = add_observer(keys)
    try:
        assert (await sql_provider.acquire_lease(odd, "alice", TTL)).acquired
        with pytest.raises(LeaseNotAcquiredError) as refused:
            await sql_provider.acquire_lease_wait(odd, "bob", TTL, timeout_s=0)
    finally:
        remove()
    assert keys.seen and set(keys.seen) == {odd}
    assert refused.value.key == odd and repr(odd) in str(refused.value)


@pytest.mark.parametrize("char", ["\x00", "\x01", "\ud800", "\U0010ffff"])
async def test_key_length_counts_the_key_as_given(provider: Any, key: str, char: str) -> None:
    longest = key + char * (MAX_KEY_LENGTH - len(key))
    assert (await provider.acquire_lease(longest, "alice", TTL)).acquired
    lease = await provider.get_lease(longest)
    assert lease is not None and lease.key == longest
    assert [lease.key for lease in await provider.list_leases(prefix=longest)] == [longest]
    assert list(await provider.renew_many([(longest, "alice", TTL)])) == [longest]
    assert await provider.release_lease(longest, "alice")
    with pytest.raises(ValueError):
        await provider.acquire_lease(longest + char, "alice", TTL)


# 10. the client's clock and time zone never matter (SQL providers read the database's clock)
async def test_client_clock_and_timezone_do_not_matter(
    sql_provider: LeaseProvider, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = sql_provider
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() - 10 * 365 * 86400)
    monkeypatch.setenv("TZ", "Pacific/Kiritimati")
    time.tzset()
    try:
        result = await provider.acquire_lease(key, "alice", TTL)
        assert result.acquired
        assert_near_now_plus(result.expires_at, TTL)  # datetime.now is unaffected by the patch
        assert not (await provider.acquire_lease(key, "bob", TTL)).acquired
    finally:
        monkeypatch.undo()
        time.tzset()


async def test_concurrent_acquires_elect_exactly_one(provider: LeaseProvider, key: str) -> None:
    results = await asyncio.gather(*(provider.acquire_lease(key, f"w{i}", TTL) for i in range(16)))
    winners = [r for r in results if r.acquired]
    assert len(winners) == 1
    assert {r.owner for r in results} == {winners[0].owner}


# -- issue 24: operations scoped to one tenure (fence=), and a minimum hold (min_hold_ms=) -----


async def test_fence_scopes_release_renew_and_transfer(provider: LeaseProvider, key: str) -> None:
    held = await provider.acquire_lease(key, "alice", TTL)
    other = held.fence + 1000  # type: ignore[operator]
    assert await provider.renew_lease(key, "alice", TTL, fence=other) is False  # type: ignore[call-arg]
    assert await provider.transfer_lease(key, "alice", "bob", TTL, fence=other) is False  # type: ignore[call-arg]
    assert await provider.release_lease(key, "alice", fence=other) is False  # type: ignore[call-arg]
    still = await provider.get_lease(key)  # type: ignore[attr-defined]
    assert (still.owner, still.fence, still.expires_at) == ("alice", held.fence, held.expires_at)
    assert await provider.renew_lease(key, "alice", TTL, fence=held.fence) is True  # type: ignore[call-arg]
    assert await provider.transfer_lease(key, "alice", "bob", TTL, fence=held.fence) is True  # type: ignore[call-arg]
    moved = await provider.get_lease(key)  # type: ignore[attr-defined]
    assert moved.owner == "bob" and moved.fence > held.fence
    assert await provider.release_lease(key, "bob", fence=held.fence) is False  # type: ignore[call-arg]
    assert await provider.release_lease(key, "bob", fence=moved.fence) is True  # type: ignore[call-arg]
    assert await provider.get_lease_owner(key) is None


async def test_an_old_tenures_release_never_ends_the_owners_new_one(provider: LeaseProvider, key: str) -> None:
    old = await provider.acquire_lease(key, "run-7", SHORT_TTL)
    await asyncio.sleep(SHORT_WAIT)
    new = await provider.acquire_lease(key, "run-7", TTL)  # the owner id comes back: a new tenure
    assert new.acquired and new.fence > old.fence  # type: ignore[operator]
    assert await provider.renew_lease(key, "run-7", TTL, fence=old.fence) is False  # type: ignore[call-arg]
    assert await provider.release_lease(key, "run-7", fence=old.fence) is False  # type: ignore[call-arg]
    assert (await provider.get_lease(key)).fence == new.fence  # type: ignore[attr-defined]


async def test_renew_many_items_may_carry_a_fence(provider: LeaseProvider, key: str) -> None:
    a = await provider.acquire_lease(f"{key}:a", "alice", TTL)
    await provider.acquire_lease(f"{key}:b", "alice", TTL)
    items = [(f"{key}:a", "alice", TTL, a.fence), (f"{key}:b", "alice", TTL, a.fence), (f"{key}:c", "x", TTL)]
    renewed = await provider.renew_many(items)  # type: ignore[attr-defined]
    assert set(renewed) == {f"{key}:a"} and renewed[f"{key}:a"].fence == a.fence


MIN_HOLD = 1_500  # ms: the kept lease is checked within it, then waited out


async def test_a_min_hold_release_keeps_the_lease_until_its_tenure_is_that_old(
    provider: LeaseProvider, key: str
) -> None:
    held = await provider.acquire_lease(key, "cron@a", TTL)
    assert await provider.release_lease(key, "cron@a", min_hold_ms=MIN_HOLD) is True  # type: ignore[call-arg]
    kept = await provider.get_lease(key)  # type: ignore[attr-defined]
    assert kept.owner == "cron@a" and kept.fence == held.fence and kept.released is True
    assert kept.acquired_at is not None
    assert abs((kept.expires_at - kept.acquired_at).total_seconds() * 1000 - MIN_HOLD) < 2
    assert await provider.get_lease_owner(key) == "cron@a"
    refused = await provider.acquire_lease(key, "cron@b", TTL)
    assert not refused.acquired and (refused.owner, refused.fence) == ("cron@a", held.fence)
    again = await provider.acquire_lease(key, "cron@a", TTL)  # released: the owner is refused too
    assert not again.acquired and again.owner == "cron@a" and again.expires_at == kept.expires_at
    assert await provider.renew_lease(key, "cron@a", TTL) is False
    assert await provider.transfer_lease(key, "cron@a", "cron@b", TTL) is False
    assert await provider.release_lease(key, "cron@a") is False  # released already: kept
    listed = await provider.list_leases(prefix=key)  # type: ignore[attr-defined]
    assert [(i.key, i.released, i.expires_at) for i in listed] == [(key, True, kept.expires_at)]
    assert (await provider.get_lease(key)).expires_at == kept.expires_at  # type: ignore[attr-defined]
    await asyncio.sleep(max(0.0, kept.remaining_ms / 1000) + 0.05)
    assert await provider.get_lease_owner(key) is None
    after = await provider.acquire_lease(key, "cron@b", TTL)
    assert after.acquired and after.fence > held.fence  # type: ignore[operator]
    assert (await provider.get_lease(key)).released is False  # type: ignore[attr-defined]


async def test_a_min_hold_already_passed_frees_at_once(provider: LeaseProvider, key: str) -> None:
    held = await provider.acquire_lease(key, "alice", TTL)
    await asyncio.sleep(SHORT_WAIT)
    assert await provider.release_lease(key, "alice", min_hold_ms=SHORT_TTL, fence=held.fence) is True  # type: ignore[call-arg]
    assert await provider.get_lease_owner(key) is None
    assert (await provider.acquire_lease(key, "bob", TTL)).acquired


async def test_a_min_hold_release_is_scoped_by_the_fence(provider: LeaseProvider, key: str) -> None:
    held = await provider.acquire_lease(key, "alice", TTL)
    other = held.fence + 1000  # type: ignore[operator]
    assert await provider.release_lease(key, "alice", fence=other, min_hold_ms=MIN_HOLD) is False  # type: ignore[call-arg]
    assert await provider.release_lease(key, "bob", min_hold_ms=MIN_HOLD) is False  # type: ignore[call-arg]
    info = await provider.get_lease(key)  # type: ignore[attr-defined]
    assert info.released is False and info.expires_at == held.expires_at


async def test_a_min_hold_may_outlast_the_ttl(provider: LeaseProvider, key: str) -> None:
    await provider.acquire_lease(key, "alice", TTL)
    assert await provider.release_lease(key, "alice", min_hold_ms=3 * TTL) is True  # type: ignore[call-arg]
    kept = await provider.get_lease(key)  # type: ignore[attr-defined]
    assert kept is not None and kept.remaining_ms > TTL  # kept past the TTL
    assert not (await provider.acquire_lease(key, "bob", TTL)).acquired


async def test_an_operator_may_break_a_kept_lease(provider: LeaseProvider, key: str) -> None:
    held = await provider.acquire_lease(key, "alice", TTL)
    assert await provider.release_lease(key, "alice", min_hold_ms=TTL)  # type: ignore[call-arg]
    broken = await provider.break_lease(key, fence=held.fence)  # type: ignore[attr-defined]
    assert broken is not None and (broken.owner, broken.fence) == ("alice", held.fence)
    after = await provider.acquire_lease(key, "alice", TTL)  # free again: a new tenure
    assert after.acquired and after.fence > held.fence  # type: ignore[operator]


ROUNDS = 1_000


async def test_an_old_tenures_release_racing_a_new_acquire_never_frees_it(provider: LeaseProvider, key: str) -> None:
    """The old tenure of an owner id ends (broken here); its release (fence=old) races the same
    owner id's new acquire, each started first in every other round: whichever lands first, the
    new tenure is never freed."""
    order: list[str] = []

    async def release(old_fence: int) -> bool:
        released = await provider.release_lease(key, "job", fence=old_fence)  # type: ignore[call-arg]
        order.append("release")
        return bool(released)

    async def acquire() -> AcquireResult:
        result = await provider.acquire_lease(key, "job", TTL)
        order.append("acquire")
        return result

    new_first = 0
    for round_ in range(ROUNDS):
        old = await provider.acquire_lease(key, "job", TTL)
        assert old.fence is not None and await provider.break_lease(key, fence=old.fence) is not None  # type: ignore[attr-defined]
        order.clear()
        if round_ % 2:
            released, new = await asyncio.gather(release(old.fence), acquire())
        else:
            new, released = await asyncio.gather(acquire(), release(old.fence))
        new_first += order[0] == "acquire"
        assert released is False and new.acquired and new.fence > old.fence  # type: ignore[operator]
        current = await provider.get_lease(key)  # type: ignore[attr-defined]
        assert current is not None and current.fence == new.fence, f"round {round_}: the new tenure was freed"
        assert await provider.release_lease(key, "job", fence=new.fence)  # type: ignore[call-arg]
    assert new_first > 0  # the dangerous order (the new acquire answered before the old release) happened


# -- all-or-nothing acquire of several keys (issue 25) ----------------------------------------------


async def test_acquire_leases_grants_every_key_its_own_fence_in_the_order_given(provider: Any, key: str) -> None:
    keys = [f"{key}:c", f"{key}:a", f"{key}:b"]
    results = await provider.acquire_leases(keys, "alice", TTL)
    assert [r.acquired for r in results] == [True, True, True]
    assert [r.owner for r in results] == ["alice"] * 3
    fences = [r.fence for r in results]
    assert all(isinstance(f, int) and f > 0 for f in fences) and len(set(fences)) == 3
    for k, r in zip(keys, results, strict=True):
        assert_near_now_plus(r.expires_at, TTL)
        lease = await provider.get_lease(k)
        assert (lease.owner, lease.fence) == ("alice", r.fence)


async def test_acquire_leases_is_all_or_nothing_and_names_the_blockers(provider: Any, key: str) -> None:
    free, held, also_free = f"{key}:free", f"{key}:held", f"{key}:also"
    blocker = await provider.acquire_lease(held, "bob", TTL)
    results = await provider.acquire_leases([free, held, also_free], "alice", TTL)
    assert [bool(r) for r in results] == [False, False, False]
    assert results[0] == AcquireResult(False, None) and results[2] == AcquireResult(False, None)
    assert (results[1].owner, results[1].fence, results[1].expires_at) == ("bob", blocker.fence, blocker.expires_at)
    assert await provider.get_lease_owner(free) is None and await provider.get_lease_owner(also_free) is None
    assert (await provider.get_lease(held)).fence == blocker.fence


async def test_acquire_leases_refusal_changes_nothing_the_owner_held(provider: Any, key: str) -> None:
    mine, theirs = f"{key}:mine", f"{key}:theirs"
    first = await provider.acquire_lease(mine, "alice", TTL)
    await provider.acquire_lease(theirs, "bob", TTL)
    results = await provider.acquire_leases([mine, theirs], "alice", 60_000)
    assert not any(results) and results[0] == AcquireResult(False, None) and results[1].owner == "bob"
    after = await provider.get_lease(mine)
    assert (after.owner, after.fence, after.expires_at) == ("alice", first.fence, first.expires_at)


async def test_acquire_leases_reacquire_keeps_tenures_and_fences(provider: Any, key: str) -> None:
    keys = [f"{key}:1", f"{key}:2"]
    single = await provider.acquire_lease(keys[1], "alice", 1_000)
    first = await provider.acquire_leases(keys, "alice", 1_000)
    assert first[1].fence == single.fence
    again = await provider.acquire_leases(keys, "alice", TTL)
    assert [r.fence for r in again] == [r.fence for r in first] and all(again)
    assert all(a.expires_at > f.expires_at for a, f in zip(again, first, strict=True))


async def test_acquire_leases_fences_exceed_earlier_tenures_and_expired_keys_are_taken_over(
    provider: Any, key: str
) -> None:
    keys = [f"{key}:x", f"{key}:y"]
    earlier = [
        await provider.acquire_lease(keys[0], "bob", SHORT_TTL),
        await provider.acquire_lease(keys[1], "carol", TTL),
    ]
    assert await provider.release_lease(keys[1], "carol")
    await asyncio.sleep(SHORT_WAIT)
    results = await provider.acquire_leases(keys, "alice", TTL)
    assert all(results)
    assert all(r.fence > e.fence for r, e in zip(results, earlier, strict=True))
    assert [await provider.get_lease_owner(k) for k in keys] == ["alice", "alice"]


async def test_release_leases_counts_the_owners_unexpired_leases(provider: Any, key: str) -> None:
    mine, other, free, short = f"{key}:m", f"{key}:o", f"{key}:f", f"{key}:s"
    assert all(await provider.acquire_leases([mine, short], "alice", TTL))
    await provider.renew_lease(short, "alice", 1)
    await provider.acquire_lease(other, "bob", TTL)
    await asyncio.sleep(0.05)
    assert await provider.release_leases([mine, other, free, short], "alice") == 1
    assert await provider.get_lease_owner(mine) is None and await provider.get_lease_owner(other) == "bob"
    assert await provider.release_leases([mine], "alice") == 0


async def test_renew_leases_answers_per_key_in_order(provider: Any, key: str) -> None:
    mine, other, free = f"{key}:m", f"{key}:o", f"{key}:f"
    held = await provider.acquire_lease(mine, "alice", 1_000)
    await provider.acquire_lease(other, "bob", TTL)
    assert await provider.renew_leases([other, mine, free], "alice", TTL) == [False, True, False]
    renewed = await provider.get_lease(mine)
    assert renewed.fence == held.fence and renewed.expires_at > held.expires_at
    assert_near_now_plus(renewed.expires_at, TTL)


async def test_acquire_leases_takes_keys_with_nul_and_surrogates(provider: Any, key: str) -> None:
    keys = look_alike_keys(key)
    results = await provider.acquire_leases(keys, "alice", TTL)
    assert all(results) and len({r.fence for r in results}) == len(keys)
    assert [(await provider.get_lease(k)).key for k in keys] == keys
    blocked = await provider.acquire_leases([keys[0], key + "\x00other"], "bob", TTL)
    assert [r.owner for r in blocked] == ["alice", None]
    assert await provider.renew_leases(keys, "alice", TTL) == [True] * len(keys)
    assert await provider.release_leases(keys, "alice") == len(keys)


async def test_all_or_nothing_calls_are_observed(sql_provider: Any, key: str) -> None:
    from sql_lease.observe import LeaseObserver, OperationEvent, add_observer

    class Seen(LeaseObserver):
        def __init__(self) -> None:
            self.events: list[tuple[str, str, int | None]] = []

        def on_operation(self, event: OperationEvent) -> None:
            if event.operation.endswith("_leases"):
                self.events.append((event.operation, event.outcome, event.rows))

    seen = Seen()
    remove = add_observer(seen)
    try:
        keys = [f"{key}:1", f"{key}:2"]
        assert all(await sql_provider.acquire_leases(keys, "alice", TTL))
        assert not any(await sql_provider.acquire_leases(keys, "bob", TTL))
        assert await sql_provider.renew_leases(keys, "alice", TTL) == [True, True]
        assert await sql_provider.release_leases(keys, "alice") == 2
    finally:
        remove()
    assert seen.events == [
        ("acquire_leases", "acquired", 2),
        ("acquire_leases", "refused", 2),
        ("renew_leases", "renewed", 2),
        ("release_leases", "released", 2),
    ]
