"""Operating leases from the API (issue 11): list_leases and break_lease on every provider, both faces."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest

from sql_lease import InMemoryLeaseProvider, LeaseBackendError, LeaseInfo, SqlLeaseProvider, SyncInMemoryLeaseProvider
from sql_lease.sql.operations import prefix_upper_bound
from tests.support.counting import StatementCounter

TTL = 60_000

BAD_LIST_ARGS = [
    ({"prefix": 1}, TypeError),
    ({"prefix": b"job"}, TypeError),
    ({"prefix": "x" * 513}, ValueError),
    ({"include_expired": "yes"}, TypeError),
    ({"include_expired": 1}, TypeError),
    ({"limit": 0}, ValueError),
    ({"limit": 100_001}, ValueError),
    ({"limit": True}, TypeError),
    ({"limit": 1.5}, TypeError),
    ({"limit": "10"}, TypeError),
]
BAD_BREAK_ARGS = [("", ValueError), (None, TypeError), ("k" * 513, ValueError)]


async def _acquire(provider: Any, key: str, owner: str, ttl_ms: float = TTL) -> int:
    result = await provider.acquire_lease(key, owner, ttl_ms)
    assert result.acquired
    return int(result.fence)


# -- the asyncio face ---------------------------------------------------------------------------


async def test_list_by_prefix_in_key_order(provider: Any, key: str) -> None:
    fences = {}
    for suffix, owner in [("b1", "bob"), ("a2", "ann"), ("a1", "amy"), ("c", "cid")]:
        fences[suffix] = await _acquire(provider, f"{key}:{suffix}", owner)
    listed = await provider.list_leases(prefix=f"{key}:a")
    assert [info.key for info in listed] == [f"{key}:a1", f"{key}:a2"]
    assert all(isinstance(info, LeaseInfo) for info in listed)
    first = listed[0]
    assert (first.owner, first.fence) == ("amy", fences["a1"])
    assert first.expires_at.tzinfo is not None and 0 < first.remaining_ms <= TTL
    everything = await provider.list_leases(prefix=f"{key}:")
    assert [info.key for info in everything] == [f"{key}:{s}" for s in ("a1", "a2", "b1", "c")]
    assert await provider.list_leases(prefix=f"{key}:zz") == []


async def test_list_limit_and_no_prefix(provider: Any, key: str) -> None:
    for i in range(5):
        await _acquire(provider, f"{key}:{i}", "o")
    limited = await provider.list_leases(prefix=key, limit=2)
    assert [info.key for info in limited] == [f"{key}:0", f"{key}:1"]
    unfiltered = await provider.list_leases(limit=100_000)
    assert {f"{key}:{i}" for i in range(5)} <= {info.key for info in unfiltered}
    keys = [info.key for info in await provider.list_leases(limit=3)]
    assert len(keys) <= 3 and keys == sorted(keys)


async def test_list_skips_expired_unless_asked(provider: Any, key: str) -> None:
    await _acquire(provider, f"{key}:live", "o")
    await _acquire(provider, f"{key}:gone", "o", ttl_ms=1)
    await asyncio.sleep(0.05)
    assert [info.key for info in await provider.list_leases(prefix=key)] == [f"{key}:live"]
    both = await provider.list_leases(prefix=key, include_expired=True)
    assert [info.key for info in both] == [f"{key}:gone", f"{key}:live"]
    assert both[0].remaining_ms <= 0 < both[1].remaining_ms


async def test_prefix_is_literal_not_a_pattern(provider: Any, key: str) -> None:
    for suffix in ("abc", "a%c", "a_c", "a\\c", "A", "é", "\U0010ffff"):
        await _acquire(provider, f"{key}:{suffix}", "o")
    for literal in ("a%", "a_", "a\\"):
        assert [info.key for info in await provider.list_leases(prefix=f"{key}:{literal}")] == [f"{key}:{literal}c"]
    assert [info.key for info in await provider.list_leases(prefix=f"{key}:a")] != []
    assert [info.key for info in await provider.list_leases(prefix=f"{key}:A")] == [f"{key}:A"]  # case counts
    assert [info.key for info in await provider.list_leases(prefix=f"{key}:é")] == [f"{key}:é"]
    assert [info.key for info in await provider.list_leases(prefix=f"{key}:\U0010ffff")] == [f"{key}:\U0010ffff"]


def test_prefix_upper_bound() -> None:
    assert prefix_upper_bound("job:") == "job;"
    assert prefix_upper_bound("a\U0010ffff") == "b"
    assert prefix_upper_bound("\ud7ff") == "\ue000"
    assert prefix_upper_bound("\U0010ffff") > "\U0010ffff" * 512


async def test_break_then_acquire_gives_a_larger_fence(provider: Any, key: str) -> None:
    fence = await _acquire(provider, key, "stuck")
    broken = await provider.break_lease(key)
    assert isinstance(broken, LeaseInfo)
    assert (broken.key, broken.owner, broken.fence) == (key, "stuck", fence)
    assert await provider.get_lease_owner(key) is None
    assert not await provider.renew_lease(key, "stuck", TTL)
    assert not await provider.release_lease(key, "stuck")
    again = await provider.acquire_lease(key, "stuck", TTL)  # even the same owner: a new tenure
    assert again.acquired and again.fence > fence
    assert (await provider.break_lease(key)).fence == again.fence
    assert (await provider.acquire_lease(key, "next", TTL)).fence > again.fence


async def test_break_of_a_free_or_expired_key_is_none(provider: Any, key: str) -> None:
    assert await provider.break_lease(key) is None
    await _acquire(provider, key, "o", ttl_ms=1)
    await asyncio.sleep(0.05)
    assert await provider.break_lease(key) is None
    assert await provider.list_leases(prefix=key, include_expired=True) == []  # the row is gone all the same


async def test_holder_of_a_broken_lease_sees_the_loss(provider: Any, key: str) -> None:
    async with provider.hold(key, "worker", ttl_ms=3_000, renew_every_ms=100, on_lost="flag") as lease:
        assert await provider.break_lease(key) is not None
        await asyncio.wait_for(lease.lost.wait(), timeout=5)
        assert "refused" in (lease.lost_reason or "")
    taken = await provider.acquire_lease(key, "operator-chosen", TTL)
    assert taken.acquired and taken.fence > lease.fence


@pytest.mark.parametrize(("kwargs", "expected"), BAD_LIST_ARGS)
async def test_bad_list_arguments_send_no_sql(provider: Any, kwargs: dict[str, Any], expected: type) -> None:
    counter = StatementCounter(provider)
    with pytest.raises(expected):
        await provider.list_leases(**kwargs)
    assert counter.count == 0


@pytest.mark.parametrize(("bad", "expected"), BAD_BREAK_ARGS)
async def test_bad_break_key_sends_no_sql(provider: Any, bad: Any, expected: type) -> None:
    counter = StatementCounter(provider)
    with pytest.raises(expected):
        await provider.break_lease(bad)
    assert counter.count == 0


async def test_statements_sent(sql_provider: SqlLeaseProvider, key: str) -> None:
    seen: list[tuple[str, tuple[Any, ...]]] = []
    sql_provider.on_statement(lambda sql, params: seen.append((sql, params)))
    await sql_provider.list_leases(prefix=key)
    await sql_provider.list_leases()
    await sql_provider.break_lease(key)
    s = sql_provider.statements
    broke = [s.steps["begin"], s.break_lease, s.steps["commit"]] if s.transactional else [s.break_lease]
    # no probe transaction: the statement answers a semaphore's head itself, or (SQLite) one read asks
    is_head = [s.slots["slot_is_head"]] if s.slots["slot_is_head"] and not s.transactional else []
    assert [sql for sql, _ in seen] == [s.list_leases, s.list_all, *broke, *is_head]  # semaphores listed in one
    assert seen[0][1] == (key, False, 1000, prefix_upper_bound(key))


async def test_a_plain_lease_lost_costs_no_probe_transaction(sql_provider: SqlLeaseProvider, key: str) -> None:
    """Renew, transfer, release and break of a plain lease another owner holds answer "no" without
    the slot steps' transaction (BEGIN, lock the head, COMMIT) asking whether the key is a semaphore's."""
    s = sql_provider.statements
    assert (await sql_provider.acquire_lease(key, "a", TTL)).acquired
    seen: list[str] = []
    sql_provider.on_statement(lambda sql, params: seen.append(sql))
    assert not await sql_provider.renew_lease(key, "b", TTL)
    assert not await sql_provider.transfer_lease(key, "b", "c", TTL)
    assert not await sql_provider.release_lease(key, "b")
    assert await sql_provider.break_lease(key, fence=10**12) is None
    assert s.slots["slot_lock_only_head"] not in seen, seen  # the probe's statement
    assert await sql_provider.get_lease_owner(key) == "a"


@pytest.mark.postgres
async def test_break_wakes_a_waiter_at_once(pg_schema: tuple[str, str], key: str) -> None:
    url, schema = pg_schema
    async with SqlLeaseProvider(url, schema=schema) as leases:
        await _acquire(leases, key, "stuck")  # 60 s TTL: without NOTIFY the waiter would sleep
        waiter = asyncio.ensure_future(leases.acquire_lease_wait(key, "next", TTL, timeout_s=20))
        await asyncio.sleep(0.5)  # the waiter listens and has flagged the row
        started = time.monotonic()
        assert await leases.break_lease(key) is not None
        result = await asyncio.wait_for(waiter, 10)
        assert result.acquired and time.monotonic() - started < 2.0


# -- the synchronous face -------------------------------------------------------------------------


def test_sync_list_and_break(sync_provider: Any, key: str) -> None:
    first = sync_provider.acquire_lease(f"{key}:b", "bob", TTL)
    sync_provider.acquire_lease(f"{key}:a", "ann", TTL)
    sync_provider.acquire_lease(f"{key}:x", "old", 1)
    time.sleep(0.05)
    assert [i.key for i in sync_provider.list_leases(prefix=key)] == [f"{key}:a", f"{key}:b"]
    assert [i.key for i in sync_provider.list_leases(key, True, 2)] == [f"{key}:a", f"{key}:b"]
    assert len(sync_provider.list_leases(key, include_expired=True)) == 3
    broken = sync_provider.break_lease(f"{key}:b", timeout_s=5)
    assert (broken.owner, broken.fence) == ("bob", first.fence)
    assert sync_provider.break_lease(f"{key}:b") is None
    assert sync_provider.acquire_lease(f"{key}:b", "bob", TTL).fence > first.fence


def test_sync_holder_of_a_broken_lease_sees_the_loss(sync_provider: Any, key: str) -> None:
    lost = threading.Event()
    with sync_provider.hold(key, "worker", ttl_ms=3_000, renew_every_ms=100, on_lost="flag") as lease:
        lease_fence = lease.fence
        assert sync_provider.break_lease(key) is not None
        assert lease.lost.wait(5)
        lost.set()
    assert lost.is_set()
    assert sync_provider.acquire_lease(key, "next", TTL).fence > lease_fence


@pytest.mark.parametrize(("kwargs", "expected"), BAD_LIST_ARGS)
def test_sync_bad_list_arguments_send_no_sql(sync_provider: Any, kwargs: dict[str, Any], expected: type) -> None:
    counter = StatementCounter(sync_provider)
    with pytest.raises(expected):
        sync_provider.list_leases(**kwargs)
    assert counter.count == 0


@pytest.mark.parametrize(("bad", "expected"), BAD_BREAK_ARGS)
def test_sync_bad_break_key_sends_no_sql(sync_provider: Any, bad: Any, expected: type) -> None:
    counter = StatementCounter(sync_provider)
    with pytest.raises(expected):
        sync_provider.break_lease(bad)
    assert counter.count == 0


# -- logs: a lost lease, a renewal failure, a backend error: one WARNING line each, key/owner/fence --


class _FlakyRenewals(InMemoryLeaseProvider):
    """Renewals fail with a backend error ``failures`` times, then work."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    async def renew_lease_info(self, key: str, owner: str, ttl_ms: int | float) -> LeaseInfo | None:
        if self.failures:
            self.failures -= 1
            raise LeaseBackendError("renew 'k': no answer from postgresql://app:***@db/app within 10 s")
        return await super().renew_lease_info(key, owner, ttl_ms)

    async def renew_many(self, items: Any) -> Any:  # hold() renews in batches where it can
        if self.failures:
            self.failures -= 1
            raise LeaseBackendError("renew 'k': no answer from postgresql://app:***@db/app within 10 s")
        return await super().renew_many(items)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "sql_lease" and r.levelno == logging.WARNING]


async def test_renewal_failure_and_loss_log_one_warning_each(key: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "sql_lease")
    leases = _FlakyRenewals(failures=1)
    async with leases.hold(key, "worker-1", ttl_ms=3_000, renew_every_ms=100, on_lost="flag") as lease:
        for _ in range(100):
            if _warnings(caplog):
                break
            await asyncio.sleep(0.02)
        (failure,) = _warnings(caplog)
        assert key in failure and "worker-1" in failure and f"fence {lease.fence}" in failure
        assert "LeaseBackendError" in failure and "***" in failure
        await leases.break_lease(key)
        await asyncio.wait_for(lease.lost.wait(), 5)
    lost = _warnings(caplog)[1:]
    assert len(lost) == 1 and key in lost[0] and "worker-1" in lost[0] and f"fence {lease.fence}" in lost[0]
    assert "lost" in lost[0]


def test_sync_renewal_failure_and_loss_log_warnings(key: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "sql_lease")
    leases = SyncInMemoryLeaseProvider()
    real_renew = leases.renew_lease_info
    failures = [1]

    def flaky(*args: Any, **kwargs: Any) -> Any:
        if failures[0]:
            failures[0] -= 1
            raise LeaseBackendError("renew: no answer from postgresql://app:***@db/app")
        return real_renew(*args, **kwargs)

    leases.renew_lease_info = flaky  # type: ignore[method-assign]
    with leases.hold(key, "worker-2", ttl_ms=3_000, renew_every_ms=100, on_lost="flag") as lease:
        deadline = time.monotonic() + 2
        while not _warnings(caplog) and time.monotonic() < deadline:
            time.sleep(0.02)
        leases.break_lease(key)
        assert lease.lost.wait(5)
    failure, lost = _warnings(caplog)
    for line in (failure, lost):
        assert key in line and "worker-2" in line and f"fence {lease.fence}" in line
    assert "retrying" in failure and "lost" in lost


@pytest.mark.postgres
async def test_sql_break_logs_the_broken_holder(
    pg_schema: tuple[str, str], key: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "sql_lease")
    url, schema = pg_schema
    async with SqlLeaseProvider(url, schema=schema) as leases:
        fence = await _acquire(leases, key, "stuck")
        await leases.break_lease(key)
    (line,) = _warnings(caplog)
    assert key in line and "stuck" in line and f"fence {fence}" in line and "broken" in line


# -- break_lease(key, fence=N): only that tenure (issue 20 item 9) -------------------------------------

BAD_FENCES = [
    (True, TypeError),
    (1.0, TypeError),
    ("3", TypeError),
    (0, ValueError),
    (-1, ValueError),
    (2**63, ValueError),
]


async def test_break_with_a_fence_breaks_only_that_tenure(provider: Any, key: str) -> None:
    first = await _acquire(provider, key, "a")
    assert await provider.release_lease(key, "a")
    second = await _acquire(provider, key, "b")  # the key changed hands after an operator looked
    assert await provider.break_lease(key, fence=first) is None
    assert await provider.get_lease_owner(key) == "b"  # left alone
    broken = await provider.break_lease(key, fence=second)
    assert broken is not None and (broken.owner, broken.fence) == ("b", second)
    assert await provider.get_lease_owner(key) is None


def test_sync_break_with_a_fence_breaks_only_that_tenure(sync_provider: Any, key: str) -> None:
    first = sync_provider.acquire_lease(key, "a", TTL).fence
    assert sync_provider.transfer_lease(key, "a", "b", TTL)
    second = sync_provider.get_lease(key).fence
    assert sync_provider.break_lease(key, fence=first) is None
    assert sync_provider.get_lease_owner(key) == "b"
    broken = sync_provider.break_lease(key, fence=second, timeout_s=5)
    assert broken is not None and (broken.owner, broken.fence) == ("b", second)
    assert sync_provider.get_lease_owner(key) is None


@pytest.mark.parametrize(("bad", "expected"), BAD_FENCES)
async def test_bad_break_fence_sends_no_sql(provider: Any, key: str, bad: Any, expected: type) -> None:
    counter = StatementCounter(provider)
    with pytest.raises(expected):
        await provider.break_lease(key, fence=bad)
    assert counter.count == 0


@pytest.mark.parametrize(("bad", "expected"), BAD_FENCES)
def test_sync_bad_break_fence_sends_no_sql(sync_provider: Any, key: str, bad: Any, expected: type) -> None:
    counter = StatementCounter(sync_provider)
    with pytest.raises(expected):
        sync_provider.break_lease(key, fence=bad)
    assert counter.count == 0


# -- list_leases: one statement per page, semaphores expanded in it (no query per head) --


def _semaphores(key: str) -> list[tuple[str, str]]:
    """(key, owner) of three semaphores of two holders each and a plain lease, under ``key``."""
    return [(f"{key}:s{i}", owner) for i in range(3) for owner in ("a", "b")] + [(f"{key}:z", "p")]


async def test_list_leases_sends_one_statement_however_many_semaphores(
    sql_provider: SqlLeaseProvider, key: str
) -> None:
    held = _semaphores(key)
    for name, owner in held:
        limit = 1 if name.endswith(":z") else 2
        assert (await sql_provider.acquire_lease(name, owner, TTL, limit=limit, data={"o": owner})).acquired
    await sql_provider.acquire_lease(f"{key}:s0", "gone", 1, limit=3)  # an expired slot, listed with --all
    await asyncio.sleep(0.05)
    seen: list[str] = []
    sql_provider.on_statement(lambda sql, params: seen.append(sql))
    listed = await sql_provider.list_leases(prefix=key)
    assert [(lease.key, lease.owner) for lease in listed] == held
    assert [lease.data for lease in listed] == [{"o": owner} for _, owner in held]
    assert all(lease.remaining_ms > 0 and lease.fence for lease in listed)
    everything = await sql_provider.list_leases(prefix=key, include_expired=True)
    assert [(lease.key, lease.owner) for lease in everything] == [held[0], held[1], (f"{key}:s0", "gone"), *held[2:]]
    assert [(lease.key, lease.owner) for lease in await sql_provider.list_leases(prefix=key, limit=3)] == held[:3]
    await sql_provider.list_leases()  # the shared table: other tests' semaphores too, in the one statement
    s = sql_provider.statements
    assert seen == [s.list_leases, s.list_leases, s.list_leases, s.list_all]


def test_sync_list_leases_sends_one_statement_however_many_semaphores(sync_sql_provider: Any, key: str) -> None:
    held = _semaphores(key)
    for name, owner in held:
        assert sync_sql_provider.acquire_lease(name, owner, TTL, limit=1 if name.endswith(":z") else 2).acquired
    seen: list[str] = []
    sync_sql_provider.on_statement(lambda sql, params: seen.append(sql))
    assert [(lease.key, lease.owner) for lease in sync_sql_provider.list_leases(prefix=key)] == held
    assert seen == [sync_sql_provider.statements.list_leases]


async def test_a_page_of_leases_is_not_filled_by_semaphores_nobody_holds(provider: Any, key: str) -> None:
    """Released semaphores (on PostgreSQL their heads outlive the slots: "Stale heads") take no
    place in a page: a page of 3 shows the 3 plain leases after them."""
    for i in range(3):
        assert (await provider.acquire_lease(f"{key}/a{i}", "s", 60_000, limit=2)).acquired
        assert await provider.release_lease(f"{key}/a{i}", "s")
    for i in range(3):
        assert (await provider.acquire_lease(f"{key}/b{i}", "p", 60_000)).acquired
    page = await provider.list_leases(prefix=f"{key}/", limit=3)
    assert [lease.key for lease in page] == [f"{key}/b{i}" for i in range(3)]


async def test_a_remembered_semaphore_key_is_released_in_one_statement(sql_provider: Any, key: str) -> None:
    """The provider remembers the keys it was granted slots of: their release sends the slot's own
    statement first (one statement, one round trip), and a wrong hint changes no answer."""
    assert (await sql_provider.acquire_lease(key, "a", 10_000, limit=2)).acquired
    assert (await sql_provider.acquire_lease(key, "b", 10_000, limit=2)).acquired
    sent: list[str] = []
    remove = sql_provider.on_statement(lambda sql, _params: sent.append(sql))
    try:
        assert await sql_provider.release_lease(key, "a")
        assert len(sent) == 1 and sent[0] != sql_provider.statements.release, sent  # not the plain release
        assert not await sql_provider.release_lease(key, "a")  # released already
        assert await sql_provider.release_lease(key, "b")
        # the key, still remembered, is now a plain lease: every answer as without the hint
        assert (await sql_provider.acquire_lease(key, "p", 10_000)).acquired
        assert not await sql_provider.release_lease(key, "a")
        assert await sql_provider.get_lease_owner(key) == "p"
        assert await sql_provider.release_lease(key, "p")
        assert await sql_provider.get_lease_owner(key) is None
        assert not await sql_provider.release_lease(key, "p")
    finally:
        remove()
