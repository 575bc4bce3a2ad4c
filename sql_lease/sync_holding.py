"""Holding leases from threads: the thread face of :mod:`sql_lease.holding`.

Kept so ``from sql_lease.sync_holding import hold`` goes on working; the code is
:mod:`sql_lease.holding.threads` (and the rules it shares with the asyncio face,
:mod:`sql_lease.holding.rules`).
"""

from .contract import SyncLeaseProvider, SyncLeaseProviderBase, SyncReleaseWaiter
from .holding.threads import SyncHeldLease, SyncHeldLeases, SyncOnLost, acquire_lease_wait, hold, hold_all

__all__ = [
    "SyncHeldLease",
    "SyncHeldLeases",
    "SyncLeaseProvider",
    "SyncLeaseProviderBase",
    "SyncOnLost",
    "SyncReleaseWaiter",
    "acquire_lease_wait",
    "hold",
    "hold_all",
]
