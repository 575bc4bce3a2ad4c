"""The public API as the README uses it, checked by ``mypy --strict`` (tests/test_typing.py).

Nothing here runs against a database: the functions are only defined, so importing the module is
cheap. Every ``assert_type`` states what a user's editor must infer; a wrong inference (``Any``
included) fails the type check.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from datetime import datetime
from typing import Any, assert_type

from sql_lease import (
    AcquireResult,
    ExpirySweeper,
    HeldLease,
    InMemoryLeaseProvider,
    LeaseInfo,
    LeaseLostError,
    LeaseNotAcquiredError,
    NoopLeaseProvider,
    SqlLeaseProvider,
    SyncHeldLease,
    SyncInMemoryLeaseProvider,
    SyncLeaseProvider,
    SyncSqlLeaseProvider,
    acquire_lease_wait,
    hold,
    is_lease_provider,
    leased,
)
from sql_lease.contract import HoldsSeveralKeys, SyncHoldsSeveralKeys
from sql_lease.django import DjangoSqlLeaseProvider, accept_fence, check_held, provider
from sql_lease.sync_holding import acquire_lease_wait as sync_acquire_lease_wait
from sql_lease.sync_holding import hold as sync_hold


async def async_face(url: str) -> None:
    async with SqlLeaseProvider(url, table_name="leases", operation_timeout_s=5) as leases:
        assert_type(leases, SqlLeaseProvider)
        result = await leases.acquire_lease("thread:42", "worker-7", ttl_ms=15_000, data={"run": 1})
        assert_type(result, AcquireResult)
        assert_type(result.acquired, bool)
        assert_type(result.fence, int | None)
        assert_type(result.expires_at, datetime | None)
        assert_type(await leases.get_lease_owner("thread:42"), str | None)
        assert_type(await leases.renew_lease("thread:42", "worker-7", 15_000), bool)
        assert_type(await leases.transfer_lease("thread:42", "worker-7", "worker-8", 15_000), bool)
        assert_type(await leases.release_lease("thread:42", "worker-8"), bool)
        info = await leases.get_lease("thread:42")
        assert_type(info, LeaseInfo | None)
        if info is not None:
            assert_type(info.fence, int)
            assert_type(info.data, dict[str, Any] | None)
        assert_type(await leases.list_leases(prefix="thread:", limit=10), list[LeaseInfo])

        # hold(): an async context manager yielding the HeldLease itself
        async with hold(leases, "thread:42", ttl_ms=15_000, wait=True, timeout_s=5, data={"run": 2}) as lease:
            assert_type(lease, HeldLease)
            assert_type(lease.key, str)
            assert_type(lease.owner, str)
            assert_type(lease.fence, int | None)
            assert_type(lease.expires_at, datetime | None)
            assert_type(lease.lost, asyncio.Event)
            assert_type(lease.lost_reason, str | None)
            assert_type(lease.valid, bool)
            assert_type(lease.check(), None)
            assert_type(await lease.transfer_to("worker-8", ttl_ms=30_000, data={"from": "worker-7"}), bool)
        made = leases.hold("thread:43", "worker-7", 15_000, renew_every_ms=5_000, on_lost="flag")
        assert_type(made, HeldLease)
        async with made as same:
            assert_type(same, HeldLease)

        waited = await acquire_lease_wait(leases, "thread:42", "worker-7", 15_000, timeout_s=1, data={"run": 3})
        assert_type(waited, AcquireResult)
        waited = await leases.acquire_lease_wait("thread:42", "worker-7", 15_000, 1.0, poll_max_s=0.5)
        assert_type(waited, AcquireResult)

        async with leases.engine.begin() as conn:
            assert_type(await leases.check_held(conn, "thread:42", "worker-7", 3), None)
            assert_type(await leases.accept_fence(conn, "orders", 3), int)

        async with ExpirySweeper(leases, interval_s=60) as sweeper:
            assert_type(sweeper, ExpirySweeper)
            assert_type(await sweeper.sweep_once(), int)


async def in_memory_faces() -> None:
    memory = InMemoryLeaseProvider()
    async with memory.hold("k") as lease:
        assert_type(lease, HeldLease)
    noop = NoopLeaseProvider()
    assert_type(await noop.acquire_lease("k", "me", 1_000), AcquireResult)
    assert_type(is_lease_provider(memory), bool)


def sync_face(url: str) -> None:
    with SyncSqlLeaseProvider(url) as leases:
        assert_type(leases, SyncSqlLeaseProvider)
        assert_type(leases.acquire_lease("report:daily", "me", 30_000, timeout_s=2), AcquireResult)
        assert_type(leases.get_lease("report:daily"), LeaseInfo | None)
        assert_type(leases.list_leases(), list[LeaseInfo])

        def on_lost(lease: SyncHeldLease) -> None:
            print("lost", lease.key)

        with leases.hold("report:daily", ttl_ms=30_000, on_lost=on_lost) as lease:
            assert_type(lease, SyncHeldLease)
            assert_type(lease.fence, int | None)
            assert_type(lease.lost, threading.Event)
            assert_type(lease.valid, bool)
            lease.check()
            assert_type(lease.transfer_to("done:report", ttl_ms=60_000), bool)
        with sync_hold(leases, "report:daily", wait=True, timeout_s=10, on_lost="flag") as held:
            assert_type(held, SyncHeldLease)
        assert_type(leases.acquire_lease_wait("report:daily", "me", 30_000, timeout_s=5), AcquireResult)
        assert_type(sync_acquire_lease_wait(leases, "report:daily", "me", 30_000, 5, data={"a": 1}), AcquireResult)

        engine = leases.engine
        assert engine is not None  # None only once closed
        with engine.begin() as conn, leases.hold("invoice:42") as lease:
            assert lease.fence is not None  # None only from NoopLeaseProvider
            assert_type(leases.check_held(conn, lease.key, lease.owner, lease.fence), None)
            assert_type(leases.accept_fence(conn, "invoices", lease.fence), int)


def any_sync_provider(leases: SyncLeaseProvider) -> int | None:
    """Code written against the protocol of the sync face serves every sync provider."""
    with sync_hold(leases, "k", ttl_ms=5_000) as lease:
        return lease.fence


def use_any_sync_provider() -> None:
    assert_type(any_sync_provider(SyncInMemoryLeaseProvider()), int | None)


async def several_keys_on_every_provider(url: str) -> None:
    """Every bundled provider takes the all-or-nothing calls, ``fences`` included, on both faces."""
    async_faces: list[HoldsSeveralKeys] = [SqlLeaseProvider(url), InMemoryLeaseProvider(), NoopLeaseProvider()]
    sync_faces: list[SyncHoldsSeveralKeys] = [SyncSqlLeaseProvider(url), SyncInMemoryLeaseProvider()]
    assert_type(sync_faces[0].release_leases(["a", "b"], "me", fences=[3, 4]), int)
    assert_type(await async_faces[0].release_leases(["a", "b"], "me", fences=[3, 4]), int)
    async with InMemoryLeaseProvider().hold_all(["a", "b"], ttl_ms=5_000, wait=True, timeout_s=10) as both:
        assert_type(both.fences, dict[str, int | None])
    with SyncInMemoryLeaseProvider().hold_all(["a", "b"], ttl_ms=5_000, wait=True, timeout_s=10) as held:
        assert_type(held.fences, dict[str, int | None])


# -- @leased: sync functions on a sync provider, async functions on an async provider -------------

sync_leases = SyncInMemoryLeaseProvider()
async_leases = InMemoryLeaseProvider()


@leased(sync_leases, "nightly-report", ttl_ms=60_000)
def nightly_report(fence: int) -> int:
    return fence


@leased(sync_leases, "report", ttl_ms=30_000, on_conflict="skip")
def report(lease: SyncHeldLease) -> None:
    lease.transfer_to(f"done:{lease.key}", ttl_ms=60_000)


@leased(sync_leases, lambda tenant_id: f"sync:{tenant_id}", on_conflict="wait", timeout_s=30)
def sync_tenant(tenant_id: str) -> str:
    return tenant_id


@leased(sync_leases, lambda tenant_id: f"sync:{tenant_id}", on_conflict="raise", owner="me")
def sync_tenant_with_lease(tenant_id: str, lease: SyncHeldLease, fence: int) -> int:
    return fence


@leased(async_leases, "scheduler", data={"host": "a"})
async def run_scheduler(interval_s: float, *, name: str = "main") -> str:
    await asyncio.sleep(interval_s)
    return name


@leased(async_leases, "scheduler", on_conflict="wait", timeout_s=5)
async def run_scheduler_with_lease(lease: HeldLease) -> int | None:
    return lease.fence


@leased(async_leases, lambda job_id: f"job:{job_id}", on_conflict="raise")
async def run_job(job_id: int, fence: int) -> int:
    return job_id + fence


def use_decorated_sync() -> None:
    assert_type(nightly_report(), int | None)  # skipped: None
    assert_type(report(), None)
    assert_type(sync_tenant("t1"), str)  # waits or raises: never None
    assert_type(sync_tenant(tenant_id="t1"), str)  # the wrapped signature is kept
    assert_type(sync_tenant_with_lease("t1"), int)  # lease and fence are given by @leased
    assert_type(sync_tenant_with_lease(tenant_id="t1"), int)


async def use_decorated_async() -> None:
    call = assert_type(run_scheduler(0.1, name="x"), Coroutine[Any, Any, str | None])  # still async
    assert_type(await call, str | None)
    assert_type(await run_scheduler_with_lease(), int | None)
    assert_type(await run_job(7), int)
    assert_type(await run_job(job_id=7), int)


def errors_are_typed(exc: LeaseNotAcquiredError, lost: LeaseLostError) -> None:
    assert_type(exc.holder, str | None)
    assert_type(exc.key, str)


# -- Django ----------------------------------------------------------------------------------------

django_leases = provider("default", table_name="sql_leases", operation_timeout_s=5)
assert_type(django_leases, DjangoSqlLeaseProvider)


def django_fenced_write() -> None:
    with django_leases.hold("invoice:42", ttl_ms=15_000) as lease:
        assert_type(lease, SyncHeldLease)
        assert lease.fence is not None
        assert_type(check_held(lease.key, lease.owner, lease.fence), None)
        assert_type(accept_fence("invoice:42", lease.fence, using="default"), int)
