"""sql_lease: distributed leases on the SQL database you already run.

Single-owner election with a time-to-live and fencing tokens, on PostgreSQL (asyncpg) or SQLite
(aiosqlite). The contract follows the ``LeaseProvider`` interface of the Mastra agent framework.

    async with SqlLeaseProvider("postgresql://app@db/app") as leases:
        result = await leases.acquire_lease("thread:42", "worker-7", ttl_ms=15_000)

Synchronous code (threads, Django, Flask, Celery, scripts) uses ``SyncSqlLeaseProvider`` (psycopg 3 or
sqlite3), ``SyncInMemoryLeaseProvider`` and the ``leased`` decorator.

``SqlLeaseProvider`` and ``SyncSqlLeaseProvider`` are imported lazily, so ``import sql_lease`` needs no
database package and the no-op and in-memory providers work without one.
"""

import typing as _typing

from .contract import (
    MAX_KEY_LENGTH,
    MAX_OWNER_LENGTH,
    MAX_TTL_MS,
    AcquireResult,
    LeaseInfo,
    LeaseProvider,
    is_lease_provider,
)
from .decorator import leased
from .errors import (
    LeaseBackendError,
    LeaseConfigError,
    LeaseError,
    LeaseLostError,
    LeaseNotAcquiredError,
    MissingDriverError,
    ProviderClosedError,
    SchemaMissingError,
    StaleFenceError,
)
from .holding import ExpirySweeper, HeldLease, HeldLeases, acquire_lease_wait, hold, hold_all
from .memory import InMemoryLeaseProvider, NoopLeaseProvider, SyncInMemoryLeaseProvider
from .sync_holding import SyncHeldLease, SyncLeaseProvider

if _typing.TYPE_CHECKING:
    from .sql.provider import SqlLeaseProvider
    from .sql.sync_provider import SyncSqlLeaseProvider

__version__ = "0.1.0"

__all__ = [
    "MAX_KEY_LENGTH",
    "MAX_OWNER_LENGTH",
    "MAX_TTL_MS",
    "AcquireResult",
    "ExpirySweeper",
    "HeldLease",
    "HeldLeases",
    "InMemoryLeaseProvider",
    "LeaseBackendError",
    "LeaseConfigError",
    "LeaseError",
    "LeaseInfo",
    "LeaseLostError",
    "LeaseNotAcquiredError",
    "LeaseProvider",
    "MissingDriverError",
    "NoopLeaseProvider",
    "ProviderClosedError",
    "SchemaMissingError",
    "SqlLeaseProvider",
    "StaleFenceError",
    "SyncHeldLease",
    "SyncInMemoryLeaseProvider",
    "SyncLeaseProvider",
    "SyncSqlLeaseProvider",
    "acquire_lease_wait",
    "hold",
    "hold_all",
    "is_lease_provider",
    "leased",
]


if not _typing.TYPE_CHECKING:  # to a type checker, a misspelt name is an error, not Any

    def __getattr__(name: str) -> _typing.Any:
        if name == "SqlLeaseProvider":
            from .sql.provider import SqlLeaseProvider

            return SqlLeaseProvider
        if name == "SyncSqlLeaseProvider":
            from .sql.sync_provider import SyncSqlLeaseProvider

            return SyncSqlLeaseProvider
        raise AttributeError(f"module 'sql_lease' has no attribute {name!r}")
