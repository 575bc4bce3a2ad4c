"""The library's exceptions: one base class, and one class per thing a caller acts on differently.

``LeaseError`` is the base. A refused acquire is *not* an error (it is ``AcquireResult(acquired=False)``);
errors mean the answer is unknown (``LeaseBackendError``), the database is not set up
(``SchemaMissingError``), or a holding helper could not get or keep a lease.
"""

from __future__ import annotations

from datetime import datetime


class LeaseError(Exception):
    """Base class of every exception sql_lease raises on purpose."""


class LeaseBackendError(LeaseError):
    """The database could not be reached, timed out, or failed the statement.

    The outcome of the operation is unknown: it is never reported as "acquired" or "not acquired";
    after an acquire, assume the owner may hold the lease. The driver's original exception is on
    ``__cause__``. Retrying is safe for ``acquire_lease`` (idempotent for the same owner while the
    lease is unexpired) and ``renew_lease``. Failures that no retry can fix raise
    ``LeaseConfigError``, ``SchemaMissingError`` or ``ProviderClosedError`` instead.
    """


class SchemaMissingError(LeaseError):
    """The lease table does not exist (or is not visible to this role).

    Create it with ``sql-lease migrate --url URL`` (or ``alembic upgrade head`` from a checkout).
    """


class LeaseConfigError(LeaseError):
    """The database refused the configuration: no such database, a role or password it does not
    accept, or a missing privilege (SQLSTATE class 28, 3D000, 42501).

    Retrying cannot help; the message says what to fix. The driver's exception is on ``__cause__``.
    """


class InvalidURLError(LeaseConfigError, ValueError):
    """The database URL cannot be used as written: a query parameter the driver does not take (the
    message names it), a port that is not a number. Raised before connecting; also a
    ``ValueError``, like any other bad argument."""


class MissingDriverError(LeaseConfigError, ModuleNotFoundError):
    """The database driver the URL needs is not installed; the message names the extra to install
    (``pip install 'sql-lease[postgresql]'`` for the async face, ``'sql-lease[psycopg]'`` for the
    synchronous one). Also a ``ModuleNotFoundError``, so ``except ImportError`` code still sees it."""


class ProviderClosedError(LeaseError, RuntimeError):
    """The provider was closed (``close()`` or the end of its ``async with``); make a new one."""


class LeaseNotAcquiredError(LeaseError):
    """``hold()`` or ``acquire_lease_wait()`` could not get the lease (held by another owner).

    ``holder``, ``fence`` and ``expires_at`` describe the current holder when it is known.
    """

    def __init__(
        self,
        key: str,
        holder: str | None,
        fence: int | None = None,
        expires_at: datetime | None = None,
        *,
        waited_s: float | None = None,
    ) -> None:
        self.key = key
        self.holder = holder
        self.fence = fence
        self.expires_at = expires_at
        self.waited_s = waited_s
        who = f"held by {holder!r}" if holder is not None else "held by another owner"
        if fence is not None:
            who += f" (fence {fence})"
        if expires_at is not None:
            who += f" until {expires_at.isoformat()}"
        waited = f" after waiting {waited_s:.1f} s" if waited_s is not None else ""
        super().__init__(f"lease {key!r} not acquired{waited}: {who}")


class LeaseLostError(LeaseError):
    """A held lease was lost: a renewal found another owner, or no renewal succeeded before expiry."""

    def __init__(self, key: str, owner: str, reason: str) -> None:
        self.key = key
        self.owner = owner
        self.reason = reason
        super().__init__(f"lease {key!r} lost by {owner!r}: {reason}")


class StaleFenceError(LeaseError):
    """``accept_fence`` refused a write: a larger fence was already accepted for the resource, so
    the writer's lease was taken over since it got its fence. Do not commit; stop writing.

    ``resource``, ``fence`` (refused) and ``accepted`` (the larger one on record, when known).
    """

    def __init__(self, resource: str, fence: int, accepted: int | None = None) -> None:
        self.resource = resource
        self.fence = fence
        self.accepted = accepted
        on_record = f"fence {accepted}" if accepted is not None else "a larger fence"
        super().__init__(f"stale fence {fence} for {resource!r}: {on_record} was already accepted")
