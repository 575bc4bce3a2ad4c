"""Providers without a database: the no-op fallback and a single-process in-memory provider."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from .contract import (
    AcquireResult,
    LeaseInfo,
    LeaseProviderBase,
    validate_key,
    validate_owner,
    validate_sweep,
    validate_ttl_ms,
)

__all__ = ["InMemoryLeaseProvider", "NoopLeaseProvider", "monotonic_ms"]


class NoopLeaseProvider(LeaseProviderBase):
    """The single-process fallback, as Mastra's: every caller "owns" every key.

    ``acquire_lease`` always succeeds for the caller (``fence`` and ``expires_at`` are None),
    ``get_lease_owner`` returns None, ``release_lease`` does nothing and returns True, and
    ``renew_lease``/``transfer_lease`` return True. Input is still validated, so code that works
    with the no-op provider does not fail when a real one is configured.
    """

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int | float) -> AcquireResult:
        validate_key(key), validate_owner(owner), validate_ttl_ms(ttl_ms)
        return AcquireResult(acquired=True, owner=owner)

    async def get_lease_owner(self, key: str) -> str | None:
        validate_key(key)
        return None

    async def release_lease(self, key: str, owner: str) -> bool:
        key, owner = validate_key(key), validate_owner(owner)
        return True

    async def renew_lease(self, key: str, owner: str, ttl_ms: int | float) -> bool:
        validate_key(key), validate_owner(owner), validate_ttl_ms(ttl_ms)
        return True

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int | float) -> bool:
        validate_key(key), validate_owner(from_owner, "from_owner")
        validate_owner(to_owner, "to_owner"), validate_ttl_ms(ttl_ms)
        return True


def monotonic_ms() -> float:
    """The in-memory provider's default clock: ``time.monotonic()`` in milliseconds."""
    return time.monotonic() * 1000.0


@dataclass(slots=True)
class _Tenure:
    owner: str
    fence: int
    expires_at_ms: float


class InMemoryLeaseProvider(LeaseProviderBase):
    """Leases in this process's memory, with exactly the SQL providers' semantics.

    For tests and single-process programs. Not shared between processes or threads (use it from
    one event loop). Expiry uses ``clock`` (default :func:`monotonic_ms`, a float number of
    milliseconds); tests may pass a controllable clock. ``expires_at`` in results is the UTC wall
    time at which the monotonic deadline falls.
    """

    def __init__(self, *, clock: Callable[[], float] = monotonic_ms) -> None:
        self._clock = clock
        # Wall time of clock() == 0, fixed once so an expiry always maps to the same datetime.
        self._wall_epoch = datetime.now(UTC) - timedelta(milliseconds=clock())
        self._tenures: dict[str, _Tenure] = {}
        self._last_fence = 0

    def _live(self, key: str, now_ms: float) -> _Tenure | None:
        tenure = self._tenures.get(key)
        if tenure is None or tenure.expires_at_ms <= now_ms:
            return None
        return tenure

    def _wall(self, expires_at_ms: float) -> datetime:
        return self._wall_epoch + timedelta(milliseconds=expires_at_ms)

    def _next_fence(self) -> int:
        self._last_fence += 1
        return self._last_fence

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int | float) -> AcquireResult:
        key, owner = validate_key(key), validate_owner(owner)
        ttl = validate_ttl_ms(ttl_ms)
        now = self._clock()
        current = self._tenures.get(key)
        if current is not None and current.owner != owner and current.expires_at_ms > now:
            return AcquireResult(
                False, current.owner, current.fence, self._wall(current.expires_at_ms), current.expires_at_ms - now
            )
        if current is None or current.owner != owner or current.expires_at_ms <= now:
            current = self._tenures[key] = _Tenure(owner, self._next_fence(), now + ttl)
        else:
            current.expires_at_ms = now + ttl
        return AcquireResult(True, owner, current.fence, self._wall(current.expires_at_ms), ttl)

    async def get_lease_owner(self, key: str) -> str | None:
        key = validate_key(key)
        tenure = self._live(key, self._clock())
        return tenure.owner if tenure else None

    async def get_lease(self, key: str) -> LeaseInfo | None:
        """The unexpired lease on ``key`` (owner, fence, expiry), or None."""
        key = validate_key(key)
        now = self._clock()
        tenure = self._live(key, now)
        if tenure is None:
            return None
        return LeaseInfo(key, tenure.owner, tenure.fence, self._wall(tenure.expires_at_ms), tenure.expires_at_ms - now)

    async def release_lease(self, key: str, owner: str) -> bool:
        key, owner = validate_key(key), validate_owner(owner)
        now = self._clock()
        current = self._tenures.get(key)
        if current is None or current.owner != owner:
            return False
        del self._tenures[key]
        return current.expires_at_ms > now

    async def renew_lease(self, key: str, owner: str, ttl_ms: int | float) -> bool:
        return await self.renew_lease_info(key, owner, ttl_ms) is not None

    async def renew_lease_info(self, key: str, owner: str, ttl_ms: int | float) -> LeaseInfo | None:
        """Renew as ``renew_lease``; the renewed lease, or None if it was not ``owner``'s unexpired lease."""
        key, owner = validate_key(key), validate_owner(owner)
        ttl = validate_ttl_ms(ttl_ms)
        now = self._clock()
        current = self._live(key, now)
        if current is None or current.owner != owner:
            return None
        current.expires_at_ms = now + ttl
        return LeaseInfo(key, owner, current.fence, self._wall(current.expires_at_ms), ttl)

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int | float) -> bool:
        key, from_owner = validate_key(key), validate_owner(from_owner, "from_owner")
        to_owner = validate_owner(to_owner, "to_owner")
        ttl = validate_ttl_ms(ttl_ms)
        now = self._clock()
        current = self._live(key, now)
        if current is None or current.owner != from_owner:
            return False
        if to_owner != from_owner:
            current.owner, current.fence = to_owner, self._next_fence()
        current.expires_at_ms = now + ttl
        return True

    async def sweep_expired(self, batch_size: int = 1000, grace_ms: int | float = 0) -> int:
        """Forget up to ``batch_size`` leases that expired at least ``grace_ms`` ms ago; the count."""
        batch_size, grace_ms = validate_sweep(batch_size, grace_ms)
        now = self._clock()
        expired = [k for k, t in self._tenures.items() if t.expires_at_ms + grace_ms <= now]
        for key in expired[:batch_size]:
            del self._tenures[key]
        return min(len(expired), batch_size)
