"""Holding leases on any provider: ``hold()``, the waiting acquire, handoff, and the sweeper.

One source for both faces. :mod:`~sql_lease.holding.rules` holds every rule without I/O (options,
a hold's state machine, the waiting acquire's decisions, the registry of holds);
:mod:`~sql_lease.holding.aio` drives them on an event loop (``hold``, ``HeldLease``,
``acquire_lease_wait`` for ``LeaseProvider``), :mod:`~sql_lease.holding.threads` from threads
(``SyncHeldLease`` and the same two functions for a ``SyncLeaseProvider``, also importable as
:mod:`sql_lease.sync_holding`), and :mod:`~sql_lease.holding.sweeper` deletes expired rows.

This package names the asyncio face's functions, as ``sql_lease.holding`` always did. Importing
it registers the functions the providers' ``hold()``/``acquire_lease_wait()`` methods call
(:class:`~sql_lease.contract.LeaseProviderBase`), so providers need not import this layer.
"""

from ..contract import LeaseProviderBase, provide_holding
from . import aio, threads
from .aio import HeldLease, HeldLeases, OnLost, acquire_lease_wait, hold, hold_all
from .rules import (
    ATTEMPT_GRACE_S,
    JITTER_S,
    LOSS_MARGIN,
    MAX_RENEW_FRACTION,
    RENEW_BATCH_SIZE,
    HoldRegistry,
    HoldRules,
    RenewalCourse,
    data_kw,
    new_owner_id,
    validate_hold_options,
)
from .sweeper import SWEEP_BATCH_SIZE, ExpirySweeper, SweepsExpired

__all__ = [
    "ATTEMPT_GRACE_S",
    "JITTER_S",
    "LOSS_MARGIN",
    "MAX_RENEW_FRACTION",
    "RENEW_BATCH_SIZE",
    "SWEEP_BATCH_SIZE",
    "ExpirySweeper",
    "HeldLease",
    "HeldLeases",
    "HoldRegistry",
    "HoldRules",
    "LeaseProviderBase",
    "OnLost",
    "RenewalCourse",
    "SweepsExpired",
    "acquire_lease_wait",
    "data_kw",
    "hold",
    "hold_all",
    "new_owner_id",
    "validate_hold_options",
]

provide_holding("async", hold=aio.hold, acquire_lease_wait=aio.acquire_lease_wait, hold_all=aio.hold_all)
provide_holding("sync", hold=threads.hold, acquire_lease_wait=threads.acquire_lease_wait, hold_all=threads.hold_all)
