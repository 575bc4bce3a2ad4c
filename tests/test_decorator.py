"""``@leased``: the three conflict modes for sync functions (sync providers) and async functions
(async providers), key functions, and the lease/fence parameters."""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from typing import Any

import pytest

from sql_lease import (
    HeldLease,
    InMemoryLeaseProvider,
    LeaseBackendError,
    LeaseNotAcquiredError,
    SyncHeldLease,
    SyncInMemoryLeaseProvider,
    leased,
)
from sql_lease.holding.rules import LateAcquireError
from sql_lease.sync_holding import hold as sync_hold

# -- sync functions, on every sync provider --------------------------------------------------------


def test_skip_returns_none_and_logs_the_holder(sync_provider: Any, key: str, caplog: pytest.LogCaptureFixture) -> None:
    runs: list[int] = []

    @leased(sync_provider, key, ttl_ms=5_000)
    def job(n: int) -> int:
        runs.append(n)
        return n * 2

    assert job(1) == 2  # free: runs, and releases afterwards
    assert sync_provider.get_lease_owner(key) is None
    sync_provider.acquire_lease(key, "elsewhere", 5_000)
    caplog.set_level(logging.INFO, "sql_lease")
    assert job(2) is None
    assert runs == [1]
    assert "held by 'elsewhere'" in caplog.text and "job skipped" in caplog.text


def test_raise_mode(sync_provider: Any, key: str) -> None:
    @leased(sync_provider, key, on_conflict="raise")
    def job() -> str:
        return "ran"

    sync_provider.acquire_lease(key, "elsewhere", 5_000)
    with pytest.raises(LeaseNotAcquiredError, match="elsewhere"):
        job()
    sync_provider.release_lease(key, "elsewhere")
    assert job() == "ran"


def test_wait_mode(sync_provider: Any, key: str) -> None:
    @leased(sync_provider, key, on_conflict="wait", timeout_s=5)
    def job() -> float:
        return time.monotonic()

    sync_provider.acquire_lease(key, "elsewhere", 5_000)
    released = time.monotonic() + 0.3
    threading.Timer(0.3, sync_provider.release_lease, (key, "elsewhere")).start()
    assert job() >= released - 0.05

    @leased(sync_provider, key, on_conflict="wait", timeout_s=0.2)
    def impatient() -> None:
        raise AssertionError("must not run")

    sync_provider.acquire_lease(key, "elsewhere", 5_000)
    with pytest.raises(LeaseNotAcquiredError):
        impatient()


def test_key_function_and_injected_lease_and_fence(sync_provider: Any, key: str) -> None:
    seen: list[tuple[Any, ...]] = []

    @leased(sync_provider, lambda tenant, **_: f"{key}:{tenant}", ttl_ms=3_000)
    def sync_tenant(tenant: str, lease: SyncHeldLease, fence: int, *, dry_run: bool = False) -> None:
        lease.check()
        seen.append((tenant, lease.key, fence, dry_run, sync_provider.get_lease_owner(lease.key) == lease.owner))

    sync_tenant("a")
    sync_tenant(tenant="b", dry_run=True)
    assert [s[:2] + s[3:] for s in seen] == [("a", f"{key}:a", False, True), ("b", f"{key}:b", True, True)]
    assert all(isinstance(s[2], int) for s in seen)
    assert list(inspect.signature(sync_tenant).parameters) == ["tenant", "dry_run"]
    with pytest.raises(TypeError, match="from @leased"):
        sync_tenant("c", fence=1)


def test_runs_once_across_threads(sync_provider: Any, key: str) -> None:
    """Eight callers at once: one runs, holding the lease until the other seven were refused (a
    slow machine may start a caller late; it must still find the lease held)."""
    runs: list[str] = []
    barrier = threading.Barrier(8)
    returned: list[str] = []
    others_refused = threading.Event()

    @leased(sync_provider, key, ttl_ms=5_000)
    def job() -> None:
        runs.append(threading.current_thread().name)
        others_refused.wait(timeout=30)

    def call() -> None:
        barrier.wait()
        job()
        returned.append(threading.current_thread().name)
        if len(returned) == 7:
            others_refused.set()

    threads = [threading.Thread(target=call) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(runs) == 1


def test_a_fixed_owner(sync_provider: Any, key: str) -> None:
    @leased(sync_provider, key, owner="cron@host-1")
    def job() -> str | None:
        return sync_provider.get_lease_owner(key)

    assert job() == "cron@host-1"


def test_a_fixed_owner_never_runs_two_calls_at_once(sync_provider: Any, key: str) -> None:
    """Issue 20 item 7: an acquire by the current owner succeeds, so with a fixed owner every
    concurrent call ran at once. Each call now takes the key under a fresh id, then hands it on."""
    running, overlaps, runs = [0], [0], [0]
    lock = threading.Lock()
    barrier = threading.Barrier(4)

    @leased(sync_provider, key, owner="cron@host-1", on_conflict="wait", timeout_s=30, ttl_ms=5_000)
    def job(fence: int) -> str | None:
        with lock:
            running[0] += 1
            runs[0] += 1
            overlaps[0] += running[0] > 1
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return sync_provider.get_lease_owner(key)

    def call() -> None:
        barrier.wait()
        assert job() == "cron@host-1"

    threads = [threading.Thread(target=call) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert runs[0] == 4 and overlaps[0] == 0, f"{overlaps[0]} calls ran while another held the key"
    assert sync_provider.get_lease_owner(key) is None


# -- async functions, on every async provider ------------------------------------------------------


async def test_async_a_fixed_owner_never_runs_two_calls_at_once(provider: Any, key: str) -> None:
    """Issue 20 item 7, asyncio: concurrent calls with one fixed owner never overlap."""
    running, overlaps, runs = 0, 0, 0

    @leased(provider, key, owner="cron@host-1", on_conflict="wait", timeout_s=30, ttl_ms=5_000)
    async def job(lease: HeldLease) -> str | None:
        nonlocal running, overlaps, runs
        running += 1
        runs += 1
        overlaps += running > 1
        await asyncio.sleep(0.05)
        running -= 1
        assert lease.owner == "cron@host-1"
        return await provider.get_lease_owner(key)  # type: ignore[no-any-return]

    assert await asyncio.gather(*(job() for _ in range(4))) == ["cron@host-1"] * 4
    assert runs == 4 and overlaps == 0, f"{overlaps} calls ran while another held the key"
    assert await provider.get_lease_owner(key) is None

    @leased(provider, key, owner="cron@host-1")
    async def skipped() -> None:
        raise AssertionError("must not run while the fixed owner holds the key")

    await provider.acquire_lease(key, "cron@host-1", 5_000)  # an earlier call still running
    assert await skipped() is None


async def test_async_modes(provider: Any, key: str, caplog: pytest.LogCaptureFixture) -> None:
    runs: list[int] = []

    @leased(provider, key, ttl_ms=5_000)
    async def job(n: int, lease: HeldLease) -> int:
        assert await provider.get_lease_owner(key) == lease.owner
        runs.append(n)
        return n

    assert await job(1) == 1
    await provider.acquire_lease(key, "elsewhere", 5_000)
    caplog.set_level(logging.INFO, "sql_lease")
    assert await job(2) is None
    assert runs == [1] and "held by 'elsewhere'" in caplog.text

    @leased(provider, key, on_conflict="raise")
    async def strict() -> None:
        raise AssertionError("must not run")

    with pytest.raises(LeaseNotAcquiredError):
        await strict()

    @leased(provider, lambda n: key, on_conflict="wait", timeout_s=5)
    async def patient(n: int, fence: int) -> int:
        return fence

    async def release_soon() -> None:
        await asyncio.sleep(0.2)
        await provider.release_lease(key, "elsewhere")

    releaser = asyncio.create_task(release_soon())
    fence = await patient(3)
    await releaser
    assert isinstance(fence, int)
    assert await provider.get_lease_owner(key) is None


async def test_async_runs_once_across_tasks(key: str) -> None:
    provider = InMemoryLeaseProvider()
    runs = 0

    @leased(provider, key)
    async def job() -> None:
        nonlocal runs
        runs += 1
        await asyncio.sleep(0.1)

    await asyncio.gather(*(job() for _ in range(8)))
    assert runs == 1


# -- misuse ---------------------------------------------------------------------------------------


def test_misuse_is_refused_when_decorating() -> None:
    sync_provider, async_provider = SyncInMemoryLeaseProvider(), InMemoryLeaseProvider()
    with pytest.raises(TypeError, match="async provider"):

        @leased(sync_provider, "k")
        async def a() -> None: ...

    with pytest.raises(TypeError, match="sync provider"):

        @leased(async_provider, "k")
        def b() -> None: ...

    with pytest.raises(ValueError, match="on_conflict"):
        leased(sync_provider, "k", on_conflict="queue")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a lease provider"):
        leased(object(), "k")
    with pytest.raises(ValueError):
        leased(sync_provider, "")
    with pytest.raises(TypeError):
        leased(sync_provider, 42)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        leased(sync_provider, "k", ttl_ms=0)
    with pytest.raises(TypeError, match="generator"):

        @leased(sync_provider, "k")
        def gen() -> Any:
            yield 1


# -- a fixed owner's hold is the tenure transferred to it, not a second acquire --------------------


CALL_B_TTL_MS = 10_000  # call B's tenure outlives the test, whatever the machine's load


class _StallAfterTransfer:
    """Forwards to ``inner``; the first transfer, once it answered, stalls past the TTL while a
    second call of the same fixed owner takes the key (under a fresh id) and hands it on too."""

    def __init__(self, inner: Any, ttl_s: float) -> None:
        self.inner, self.ttl_s, self.stalled = inner, ttl_s, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def acquire_lease(self, *a: Any, **k: Any) -> Any:
        return self.inner.acquire_lease(*a, **k)

    def renew_lease(self, *a: Any, **k: Any) -> Any:
        return self.inner.renew_lease(*a, **k)

    def release_lease(self, *a: Any, **k: Any) -> Any:
        return self.inner.release_lease(*a, **k)

    def get_lease_owner(self, *a: Any, **k: Any) -> Any:
        return self.inner.get_lease_owner(*a, **k)

    def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: Any, **k: Any) -> Any:
        moved = self.inner.transfer_lease(key, from_owner, to_owner, ttl_ms, **k)
        if not self.stalled:
            self.stalled = True
            time.sleep(self.ttl_s * 1.5)  # the process paused: the tenure handed to to_owner expired
            assert self.inner.acquire_lease(key, "call-b", CALL_B_TTL_MS).acquired  # call B, fresh id
            assert self.inner.transfer_lease(key, "call-b", to_owner, CALL_B_TTL_MS)
        return moved


def test_a_fixed_owner_call_stalled_after_its_transfer_does_not_run(sync_provider: Any, key: str) -> None:
    """Reviewer's deco2: the second hold under the fixed owner acquired again, and an acquire by
    the current owner succeeds, so a call stalled past the TTL after its transfer ran alongside
    the call that took the key meanwhile (same owner, same fence, both ``valid``)."""
    ran: list[int] = []
    stalling = _StallAfterTransfer(sync_provider, 0.3)

    @leased(stalling, key, owner="job", ttl_ms=300, on_conflict="raise")
    def job(fence: int) -> None:
        ran.append(fence)

    with pytest.raises(LeaseNotAcquiredError):
        try:
            job()
        finally:
            assert ran == [], "the stalled call ran alongside the call that took the key meanwhile"
    assert sync_provider.get_lease_owner(key) == "job"  # call B's tenure, not released by A


class _AsyncStallAfterTransfer(_StallAfterTransfer):
    """Asyncio: the first statement of the fixed owner after the transfer is delayed past the
    TTL (a slow network), while call B takes the key under a fresh id and hands it on too."""

    async def _stall(self, key: str, owner: str) -> None:
        if owner == "job" and not self.stalled:
            self.stalled = True
            await asyncio.sleep(self.ttl_s * 1.5)  # the tenure handed to "job" expired
            assert (await self.inner.acquire_lease(key, "call-b", CALL_B_TTL_MS)).acquired
            assert await self.inner.transfer_lease(key, "call-b", owner, CALL_B_TTL_MS)

    async def acquire_lease(self, key: str, owner: str, *a: Any, **k: Any) -> Any:  # type: ignore[override]
        await self._stall(key, owner)
        return await self.inner.acquire_lease(key, owner, *a, **k)

    async def get_lease(self, key: str) -> Any:
        await self._stall(key, "job")
        return await self.inner.get_lease(key)

    async def renew_lease(self, *a: Any, **k: Any) -> Any:  # type: ignore[override]
        return await self.inner.renew_lease(*a, **k)

    async def release_lease(self, *a: Any, **k: Any) -> Any:  # type: ignore[override]
        return await self.inner.release_lease(*a, **k)

    async def get_lease_owner(self, *a: Any, **k: Any) -> Any:  # type: ignore[override]
        return await self.inner.get_lease_owner(*a, **k)

    async def transfer_lease(self, *a: Any, **k: Any) -> Any:  # type: ignore[override]
        return await self.inner.transfer_lease(*a, **k)


async def test_async_a_fixed_owner_call_stalled_after_its_transfer_does_not_run(provider: Any, key: str) -> None:
    """Reviewer's deco2, asyncio."""
    ran: list[int] = []
    stalling = _AsyncStallAfterTransfer(provider, 0.3)

    @leased(stalling, key, owner="job", ttl_ms=300, on_conflict="raise")
    async def job(fence: int) -> None:
        ran.append(fence)

    with pytest.raises(LeaseNotAcquiredError):
        try:
            await job()
        finally:
            assert ran == [], "the stalled call ran alongside the call that took the key meanwhile"
    assert await provider.get_lease_owner(key) == "job"


class _FailingReads(SyncInMemoryLeaseProvider):
    """Reads that fail: at the end of their per-call bound (``slow``: a loaded machine), or at once."""

    accepts_timeout_s = True

    def __init__(self, slow: bool) -> None:
        super().__init__()
        self.slow = slow

    def get_lease(self, key: str, timeout_s: float | None = None) -> Any:  # type: ignore[override]
        time.sleep((timeout_s or 0) if self.slow else 0)
        raise LeaseBackendError(f"read {key!r}: no answer within {timeout_s} s")


@pytest.mark.parametrize(("late", "slow"), [(True, True), (False, True), (False, False)])
def test_a_sync_handoff_read_back_that_runs_out_of_its_window_is_too_late(late: bool, slow: bool) -> None:
    """The sync face bounds the read-back by the handoff's window: running out of it (late already,
    or a slow read) is the answer "too late" (LateAcquireError, as on the async face), not the read's
    LeaseBackendError; a read that fails with time left still raises its own error."""
    from sql_lease.holding.rules import Handoff

    provider = _FailingReads(slow)
    ttl_ms = 300
    sent = time.monotonic() - (ttl_ms / 1000 if late else 0)
    held = sync_hold(provider, "k", "job", ttl_ms=ttl_ms).adopting(Handoff("k", "job", ttl_ms, sent))
    expected = LateAcquireError if slow else LeaseBackendError
    with pytest.raises(expected), held:
        pass
