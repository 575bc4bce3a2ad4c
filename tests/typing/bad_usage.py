"""Uses of the public API that ``mypy --strict`` must reject: each line marked ``# E: <code>``
must have an error with that code, and no other line may have one (tests/test_typing.py)."""

from __future__ import annotations

import sql_lease
from sql_lease import InMemoryLeaseProvider, SyncHeldLease, SyncInMemoryLeaseProvider, acquire_lease_wait, hold, leased
from sql_lease.django import provider
from sql_lease.sync_holding import hold as sync_hold

leases = InMemoryLeaseProvider()
sync_leases = SyncInMemoryLeaseProvider()


async def async_misuse() -> None:
    hold(leases, "k", ttl_ms="x")  # E: arg-type
    leases.hold("k", on_lost="raise")  # E: arg-type
    leases.hold("k", renew_every=5_000)  # E: call-arg
    await acquire_lease_wait(leases, "k", "me", 1_000, timeout_s="5")  # E: arg-type
    await leases.acquire_lease_wait("k", "me", 1_000, poll_max=1)  # E: call-arg
    async with sync_leases.hold("k"):  # E: attr-defined
        pass
    with leases.hold("k"):  # E: attr-defined
        pass
    sync_hold(leases, "k")  # E: arg-type


def sync_misuse() -> None:
    sync_leases.hold("k", wait="yes")  # E: arg-type
    sync_leases.hold("k", on_lost="cancel")  # E: arg-type
    with sync_leases.hold("k") as lease:
        lease.transfer_to(42)  # E: arg-type
        lease.lost.wait_async()  # E: attr-defined
    provider("default", table="x")  # E: call-arg


@leased(sync_leases, "nightly")
def nightly(fence: int) -> int:
    return fence


@leased(sync_leases, lambda tenant_id: tenant_id, on_conflict="raise")
def tenant(tenant_id: str, lease: SyncHeldLease) -> int:
    return 1


@leased(leases, "job")  # E: arg-type
def sync_job_on_async_provider() -> None:
    pass


def decorated_misuse() -> None:
    nightly(5)  # E: call-arg
    done: int = nightly()  # E: assignment
    tenant(42)  # E: call-overload
    tenant(tenant_id=42)  # E: call-overload
    print(done, sql_lease.SyncHold)  # E: attr-defined
