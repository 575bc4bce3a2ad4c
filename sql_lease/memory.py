"""Providers without a database: the no-op fallback and a single-process in-memory provider, with a
synchronous twin for threads sharing one core (:class:`MemoryLeases`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from .contract import (
    AcquireResult,
    LeaseInfo,
    LeaseProviderBase,
    SyncLeaseProviderBase,
    decode_data,
    encode_data,
    encode_key,
    validate_fence,
    validate_fences,
    validate_key,
    validate_keys,
    validate_list,
    validate_owner,
    validate_renew_items,
    validate_sweep,
    validate_tenure_options,
    validate_ttl_ms,
)

__all__ = ["InMemoryLeaseProvider", "MemoryLeases", "NoopLeaseProvider", "SyncInMemoryLeaseProvider", "monotonic_ms"]


class NoopLeaseProvider(LeaseProviderBase):
    """The single-process fallback, as Mastra's: every caller "owns" every key.

    ``acquire_lease`` always succeeds for the caller (``fence`` and ``expires_at`` are None),
    ``get_lease_owner`` returns None, ``release_lease`` does nothing and returns True, and
    ``renew_lease``/``transfer_lease`` return True; lease ``data``, ``fence`` and ``min_hold_ms``
    are checked and not kept (its tenures have no fence, so ``hold()`` sends none). Input is still
    validated, so code that works with the no-op provider does not fail when a real one is
    configured.
    """

    accepts_fence = True
    """The keywords of the SQL providers are taken (and checked), so ``hold(min_hold_ms=)`` serves."""

    async def acquire_lease(
        self, key: str, owner: str, ttl_ms: int | float, *, data: dict[str, Any] | None = None
    ) -> AcquireResult:
        validate_key(key), validate_owner(owner), validate_ttl_ms(ttl_ms), encode_data(data)
        return AcquireResult(acquired=True, owner=owner)

    async def get_lease_owner(self, key: str) -> str | None:
        validate_key(key)
        return None

    async def release_lease(
        self, key: str, owner: str, *, fence: int | None = None, min_hold_ms: int | float | None = None
    ) -> bool:
        validate_key(key), validate_owner(owner), validate_tenure_options(fence, min_hold_ms)
        return True

    async def renew_lease(self, key: str, owner: str, ttl_ms: int | float, *, fence: int | None = None) -> bool:
        validate_key(key), validate_owner(owner), validate_ttl_ms(ttl_ms), validate_tenure_options(fence)
        return True

    async def transfer_lease(
        self,
        key: str,
        from_owner: str,
        to_owner: str,
        ttl_ms: int | float,
        *,
        data: dict[str, Any] | None = None,
        fence: int | None = None,
    ) -> bool:
        validate_key(key), validate_owner(from_owner, "from_owner"), validate_tenure_options(fence)
        validate_owner(to_owner, "to_owner"), validate_ttl_ms(ttl_ms), encode_data(data)
        return True

    async def acquire_leases(
        self, keys: Sequence[str], owner: str, ttl_ms: int | float, *, data: dict[str, Any] | None = None
    ) -> list[AcquireResult]:
        checked = validate_keys(keys)
        validate_owner(owner), validate_ttl_ms(ttl_ms), encode_data(data)
        return [AcquireResult(acquired=True, owner=owner) for _ in checked]

    async def release_leases(self, keys: Sequence[str], owner: str) -> int:
        checked = validate_keys(keys)
        validate_owner(owner)
        return len(checked)

    async def renew_leases(
        self, keys: Sequence[str], owner: str, ttl_ms: int | float, *, fences: Sequence[int] | None = None
    ) -> list[bool]:
        checked = validate_keys(keys)
        validate_owner(owner), validate_ttl_ms(ttl_ms)
        return [True for _ in checked]


def monotonic_ms() -> float:
    """The in-memory provider's default clock: ``time.monotonic()`` in milliseconds."""
    return time.monotonic() * 1000.0


@dataclass(slots=True)
class _Tenure:
    owner: str
    fence: int
    expires_at_ms: float
    acquired_at_ms: float
    data: str | None = None  # JSON text, decoded afresh for every reader
    released: bool = False  # released with a minimum hold: kept, renewable by nobody, until it expires

    def matches(self, owner: str, fence: int | None, now_ms: float) -> bool:
        """``owner``'s unexpired, unreleased tenure (of ``fence``, if given)."""
        live = self.expires_at_ms > now_ms and not self.released
        return live and self.owner == owner and fence in (None, self.fence)


class MemoryLeases:
    """The lease table of the in-memory providers: every rule, synchronous and thread-safe (one
    lock around each operation). :class:`InMemoryLeaseProvider` (asyncio) and
    :class:`SyncInMemoryLeaseProvider` (threads) are two faces of it.

    Expiry uses ``clock`` (a float number of milliseconds, default :func:`monotonic_ms`);
    ``expires_at`` is the UTC wall time at which the monotonic deadline falls.
    """

    def __init__(self, clock: Callable[[], float] = monotonic_ms) -> None:
        self._clock = clock
        # Wall time of clock() == 0, fixed once so an expiry always maps to the same datetime.
        self._wall_epoch = datetime.now(UTC) - timedelta(milliseconds=clock())
        self._tenures: dict[str, _Tenure] = {}
        self._last_fence = 0
        self._lock = threading.Lock()

    def _live(self, key: str, now_ms: float) -> _Tenure | None:
        tenure = self._tenures.get(key)
        if tenure is None or tenure.expires_at_ms <= now_ms:
            return None
        return tenure

    def _wall(self, expires_at_ms: float) -> datetime:
        return self._wall_epoch + timedelta(milliseconds=expires_at_ms)

    def _info(self, key: str, tenure: _Tenure, now_ms: float) -> LeaseInfo:
        expires_at, remaining = self._wall(tenure.expires_at_ms), tenure.expires_at_ms - now_ms
        data, acquired_at = decode_data(tenure.data), self._wall(tenure.acquired_at_ms)
        return LeaseInfo(key, tenure.owner, tenure.fence, expires_at, remaining, data, acquired_at, tenure.released)

    def _next_fence(self) -> int:
        self._last_fence += 1
        return self._last_fence

    def acquire(self, key: str, owner: str, ttl_ms: object, data: object = None) -> AcquireResult:
        key, owner = validate_key(key), validate_owner(owner)
        ttl = validate_ttl_ms(ttl_ms)
        text = encode_data(data)
        with self._lock:
            now = self._clock()
            refusal = self._refusal(key, owner, now)
            return self._grant(key, owner, ttl, text, now) if refusal is None else refusal

    def _refusal(self, key: str, owner: str, now: float) -> AcquireResult | None:
        """The refusal naming the holder if another owner holds ``key`` (or ``owner``'s released one is kept)."""
        current = self._tenures.get(key)
        if current is not None and (current.owner != owner or current.released) and current.expires_at_ms > now:
            return AcquireResult(
                False, current.owner, current.fence, self._wall(current.expires_at_ms), current.expires_at_ms - now
            )
        return None

    def _grant(self, key: str, owner: str, ttl: float, text: str | None, now: float) -> AcquireResult:
        current = self._tenures.get(key)
        if current is None or current.owner != owner or current.expires_at_ms <= now:
            current = self._tenures[key] = _Tenure(owner, self._next_fence(), now + ttl, now, text)
        else:
            current.expires_at_ms = now + ttl
            current.data = current.data if text is None else text
        return AcquireResult(True, owner, current.fence, self._wall(current.expires_at_ms), ttl)

    def acquire_many(self, keys: object, owner: object, ttl_ms: object, data: object = None) -> list[AcquireResult]:
        """Every key of ``keys`` granted to ``owner``, or none (each key that blocked names its holder)."""
        checked, owner = validate_keys(keys), validate_owner(owner)
        ttl, text = validate_ttl_ms(ttl_ms), encode_data(data)
        with self._lock:
            now = self._clock()
            refusals = [self._refusal(key, owner, now) for key in checked]
            if any(refusal is not None for refusal in refusals):
                return [AcquireResult(False, None) if refusal is None else refusal for refusal in refusals]
            return [self._grant(key, owner, ttl, text, now) for key in checked]

    def release_many(self, keys: object, owner: object) -> int:
        """How many of ``owner``'s unexpired leases on ``keys`` were released."""
        checked, owner = validate_keys(keys), validate_owner(owner)
        return sum(self.release(key, owner) for key in checked)

    def renew_keys(self, keys: object, owner: object, ttl_ms: object, fences: object = None) -> list[bool]:
        """Whether each of ``owner``'s leases on ``keys`` (of ``fences``' tenures, if given) was renewed."""
        checked, owner, ttl = validate_keys(keys), validate_owner(owner), validate_ttl_ms(ttl_ms)
        tenures = validate_fences(fences, len(checked))
        with self._lock:
            return [
                self._renew(key, owner, ttl, fence) is not None for key, fence in zip(checked, tenures, strict=True)
            ]

    def get_owner(self, key: str) -> str | None:
        key = validate_key(key)
        with self._lock:
            tenure = self._live(key, self._clock())
            return tenure.owner if tenure else None

    def get_lease(self, key: str) -> LeaseInfo | None:
        key = validate_key(key)
        with self._lock:
            now = self._clock()
            tenure = self._live(key, now)
            if tenure is None:
                return None
            return self._info(key, tenure, now)

    def release(self, key: str, owner: str, fence: object = None, min_hold_ms: object = None) -> bool:
        key, owner = validate_key(key), validate_owner(owner)
        checked_fence, min_hold = validate_tenure_options(fence, min_hold_ms)
        with self._lock:
            now = self._clock()
            current = self._tenures.get(key)
            if current is None or current.owner != owner or checked_fence not in (None, current.fence):
                return False
            if current.expires_at_ms <= now:
                del self._tenures[key]
                return False
            if current.released:
                return False  # kept for its minimum hold
            if min_hold is not None and current.acquired_at_ms + min_hold > now:
                current.released, current.expires_at_ms = True, current.acquired_at_ms + min_hold
                return True
            del self._tenures[key]
            return True

    def renew(self, key: str, owner: str, ttl_ms: object, fence: object = None) -> LeaseInfo | None:
        key, owner = validate_key(key), validate_owner(owner)
        ttl = validate_ttl_ms(ttl_ms)
        checked_fence = validate_tenure_options(fence)[0]
        with self._lock:
            return self._renew(key, owner, ttl, checked_fence)

    def _renew(self, key: str, owner: str, ttl: float, fence: int | None) -> LeaseInfo | None:
        now = self._clock()
        current = self._tenures.get(key)
        if current is None or not current.matches(owner, fence, now):
            return None
        current.expires_at_ms = now + ttl
        return LeaseInfo(key, owner, current.fence, self._wall(current.expires_at_ms), ttl)

    def renew_many(self, items: object) -> dict[str, LeaseInfo]:
        renewed: dict[str, LeaseInfo] = {}
        for key, owner, ttl, fence in validate_renew_items(items):
            info = self.renew(key, owner, ttl, fence)
            if info is not None:
                renewed[key] = info
        return renewed

    def transfer(
        self, key: str, from_owner: str, to_owner: str, ttl_ms: object, data: object = None, fence: object = None
    ) -> bool:
        key, from_owner = validate_key(key), validate_owner(from_owner, "from_owner")
        to_owner = validate_owner(to_owner, "to_owner")
        ttl = validate_ttl_ms(ttl_ms)
        text = encode_data(data)
        checked_fence = validate_tenure_options(fence)[0]
        with self._lock:
            now = self._clock()
            current = self._tenures.get(key)
            if current is None or not current.matches(from_owner, checked_fence, now):
                return False
            if to_owner != from_owner:
                current.owner, current.fence, current.data = to_owner, self._next_fence(), text
                current.acquired_at_ms = now
            elif text is not None:
                current.data = text
            current.expires_at_ms = now + ttl
            return True

    def sweep(self, batch_size: object = 1000, grace_ms: object = 0) -> int:
        size, grace = validate_sweep(batch_size, grace_ms)
        with self._lock:
            now = self._clock()
            expired = [k for k, t in self._tenures.items() if t.expires_at_ms + grace <= now]
            for key in expired[:size]:
                del self._tenures[key]
            return min(len(expired), size)

    def list(self, prefix: object = None, include_expired: object = False, limit: object = 1000) -> list[LeaseInfo]:
        prefix, include_expired, limit = validate_list(prefix, include_expired, limit)
        with self._lock:
            now = self._clock()
            rows = [
                self._info(key, t, now)
                for key, t in self._tenures.items()
                if (prefix is None or key.startswith(prefix)) and (include_expired or t.expires_at_ms > now)
            ]
        rows.sort(key=lambda info: encode_key(info.key))  # the order of the stored keys, as SQLite's
        return rows[:limit]

    def break_(self, key: str, fence: object = None) -> LeaseInfo | None:
        key = validate_key(key)
        fence = None if fence is None else validate_fence(fence)
        with self._lock:
            now = self._clock()
            tenure = self._tenures.get(key)
            if tenure is not None and fence is not None and tenure.fence != fence:
                return None  # another tenure: left alone
            tenure = self._tenures.pop(key, None)
            if tenure is None or tenure.expires_at_ms <= now:
                return None
            expires_at, remaining = self._wall(tenure.expires_at_ms), tenure.expires_at_ms - now
            return LeaseInfo(key, tenure.owner, tenure.fence, expires_at, remaining)


class InMemoryLeaseProvider(LeaseProviderBase):
    """Leases in this process's memory, with exactly the SQL providers' semantics.

    For tests and single-process programs (use it from one event loop; for threads, see
    :class:`SyncInMemoryLeaseProvider`). Expiry uses ``clock`` (default :func:`monotonic_ms`, a
    float number of milliseconds); tests may pass a controllable clock. ``expires_at`` in results
    is the UTC wall time at which the monotonic deadline falls.
    """

    accepts_fence = True
    """``release_lease``, ``renew_lease(_info)``, ``transfer_lease`` take ``fence``, ``renew_many``
    items a fourth, and ``release_lease`` ``min_hold_ms``, as the SQL providers' do."""

    def __init__(self, *, clock: Callable[[], float] = monotonic_ms) -> None:
        self._leases = MemoryLeases(clock)

    async def acquire_lease(
        self, key: str, owner: str, ttl_ms: int | float, *, data: dict[str, Any] | None = None
    ) -> AcquireResult:
        return self._leases.acquire(key, owner, ttl_ms, data)

    async def get_lease_owner(self, key: str) -> str | None:
        return self._leases.get_owner(key)

    async def get_lease(self, key: str) -> LeaseInfo | None:
        """The unexpired lease on ``key`` (owner, fence, expiry), or None."""
        return self._leases.get_lease(key)

    async def release_lease(
        self, key: str, owner: str, *, fence: int | None = None, min_hold_ms: int | float | None = None
    ) -> bool:
        """Release as ``SqlLeaseProvider.release_lease`` (``fence``, ``min_hold_ms`` in milliseconds by the
        provider's clock). ``TypeError``/``ValueError`` for bad input (``fence`` included); nothing changes."""
        return self._leases.release(key, owner, fence, min_hold_ms)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int | float, *, fence: int | None = None) -> bool:
        """Extend ``owner``'s unexpired lease (of tenure ``fence``, if given) to now + ``ttl_ms``
        milliseconds; False if not held.
        ``TypeError``/``ValueError`` for bad input (``fence`` included); nothing changes."""
        return self._leases.renew(key, owner, ttl_ms, fence) is not None

    async def renew_lease_info(
        self, key: str, owner: str, ttl_ms: int | float, *, fence: int | None = None
    ) -> LeaseInfo | None:
        """Renew as ``renew_lease`` (``ttl_ms`` in milliseconds); the renewed lease, or None if it was not
        ``owner``'s unexpired lease.
        ``TypeError``/``ValueError`` for bad input (``fence`` included); nothing changes."""
        return self._leases.renew(key, owner, ttl_ms, fence)

    async def renew_many(self, items: Sequence[tuple[Any, ...]]) -> dict[str, LeaseInfo]:
        """Renew each ``(key, owner, ttl_ms[, fence])`` (keys distinct) as ``renew_lease_info``; the
        renewed leases by key (a missing key was refused), as ``SqlLeaseProvider.renew_many``."""
        return self._leases.renew_many(items)

    async def acquire_leases(
        self, keys: Sequence[str], owner: str, ttl_ms: int | float, *, data: dict[str, Any] | None = None
    ) -> list[AcquireResult]:
        """Acquire every key of ``keys`` for ``owner`` or none, in the order of ``keys``, as
        ``SqlLeaseProvider.acquire_leases``. ``TypeError``/``ValueError`` for bad input; nothing changes."""
        return self._leases.acquire_many(keys, owner, ttl_ms, data)

    async def release_leases(self, keys: Sequence[str], owner: str) -> int:
        """Release ``owner``'s leases on ``keys``; how many unexpired ones were released."""
        return self._leases.release_many(keys, owner)

    async def renew_leases(
        self, keys: Sequence[str], owner: str, ttl_ms: int | float, *, fences: Sequence[int] | None = None
    ) -> list[bool]:
        """Renew ``owner``'s leases on ``keys`` (of ``fences``' tenures, if given) by ``ttl_ms``
        milliseconds; whether each was renewed, in the order of ``keys``."""
        return self._leases.renew_keys(keys, owner, ttl_ms, fences)

    async def transfer_lease(
        self,
        key: str,
        from_owner: str,
        to_owner: str,
        ttl_ms: int | float,
        *,
        data: dict[str, Any] | None = None,
        fence: int | None = None,
    ) -> bool:
        """Hand ``from_owner``'s unexpired lease (of tenure ``fence``, if given) to ``to_owner`` for
        ``ttl_ms`` ms, atomically, with lease ``data`` (see ``LeaseProvider``).
        ``TypeError``/``ValueError`` for bad input (``fence`` included); nothing changes."""
        return self._leases.transfer(key, from_owner, to_owner, ttl_ms, data, fence)

    async def sweep_expired(self, batch_size: int = 1000, grace_ms: int | float = 0) -> int:
        """Forget up to ``batch_size`` leases that expired at least ``grace_ms`` ms ago; the count."""
        return self._leases.sweep(batch_size, grace_ms)

    async def list_leases(
        self, prefix: str | None = None, include_expired: bool = False, limit: int = 1000
    ) -> list[LeaseInfo]:
        """Leases ordered by key whose key starts with ``prefix`` (all when None), at most ``limit``."""
        return self._leases.list(prefix, include_expired, limit)

    async def break_lease(self, key: str, *, fence: int | None = None) -> LeaseInfo | None:
        """Forget the lease on ``key`` whoever holds it, or (``fence`` given) only the tenure with
        that fence; the lease broken, or None if no such lease was held."""
        return self._leases.break_(key, fence)


class SyncInMemoryLeaseProvider(SyncLeaseProviderBase):
    """The synchronous twin of :class:`InMemoryLeaseProvider`: the same rules, plain methods,
    safe to share between threads of one process. For tests of synchronous code (Django, Flask,
    Celery tasks, scripts) and single-process programs.

    ``clock`` is a function returning float milliseconds (default :func:`monotonic_ms`). Every
    method answers at once, so the keyword ``timeout_s`` (seconds) that the SQL provider's methods
    take is accepted and ignored. ``hold()`` and ``acquire_lease_wait()`` come from
    :mod:`sql_lease.sync_holding`.
    """

    accepts_fence = True
    """``release_lease``, ``renew_lease(_info)``, ``transfer_lease`` take ``fence``, and ``release_lease``
    ``min_hold_ms``, as the SQL providers' do."""

    def __init__(self, *, clock: Callable[[], float] = monotonic_ms) -> None:
        self._leases = MemoryLeases(clock)

    def __enter__(self) -> SyncInMemoryLeaseProvider:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Nothing to release; present so code can treat every sync provider alike."""

    def acquire_lease(
        self,
        key: str,
        owner: str,
        ttl_ms: int | float,
        *,
        data: dict[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> AcquireResult:
        """Acquire ``key`` for ``owner`` for ``ttl_ms`` milliseconds (rules 1-3 of ``LeaseProvider``)
        with lease ``data`` (see ``LeaseProvider``)."""
        return self._leases.acquire(key, owner, ttl_ms, data)

    def get_lease_owner(self, key: str, *, timeout_s: float | None = None) -> str | None:
        """The owner of the unexpired lease on ``key``, or None."""
        return self._leases.get_owner(key)

    def get_lease(self, key: str, *, timeout_s: float | None = None) -> LeaseInfo | None:
        """The unexpired lease on ``key`` (owner, fence, expiry, remaining ms), or None."""
        return self._leases.get_lease(key)

    def release_lease(
        self,
        key: str,
        owner: str,
        *,
        fence: int | None = None,
        min_hold_ms: int | float | None = None,
        timeout_s: float | None = None,
    ) -> bool:
        """Release ``key`` if ``owner`` holds it unexpired; True iff it did (``fence``, ``min_hold_ms``
        in milliseconds, as ``SqlLeaseProvider.release_lease``).
        ``TypeError``/``ValueError`` for bad input (``fence`` included); nothing changes."""
        return self._leases.release(key, owner, fence, min_hold_ms)

    def renew_lease(
        self,
        key: str,
        owner: str,
        ttl_ms: int | float,
        *,
        fence: int | None = None,
        timeout_s: float | None = None,
    ) -> bool:
        """Extend ``owner``'s unexpired lease (of tenure ``fence``, if given) to now + ``ttl_ms``
        milliseconds; False if not held.
        ``TypeError``/``ValueError`` for bad input (``fence`` included); nothing changes."""
        return self._leases.renew(key, owner, ttl_ms, fence) is not None

    def renew_lease_info(
        self,
        key: str,
        owner: str,
        ttl_ms: int | float,
        *,
        fence: int | None = None,
        timeout_s: float | None = None,
    ) -> LeaseInfo | None:
        """Renew as ``renew_lease`` (``ttl_ms`` in milliseconds); the renewed lease, or None if it was not
        ``owner``'s unexpired lease.
        ``TypeError``/``ValueError`` for bad input (``fence`` included); nothing changes."""
        return self._leases.renew(key, owner, ttl_ms, fence)

    def acquire_leases(
        self,
        keys: Sequence[str],
        owner: str,
        ttl_ms: int | float,
        *,
        data: dict[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> list[AcquireResult]:
        """Acquire every key of ``keys`` for ``owner`` or none, in the order of ``keys``, as
        ``SqlLeaseProvider.acquire_leases``."""
        return self._leases.acquire_many(keys, owner, ttl_ms, data)

    def release_leases(self, keys: Sequence[str], owner: str, *, timeout_s: float | None = None) -> int:
        """Release ``owner``'s leases on ``keys``; how many unexpired ones were released."""
        return self._leases.release_many(keys, owner)

    def renew_leases(
        self,
        keys: Sequence[str],
        owner: str,
        ttl_ms: int | float,
        *,
        fences: Sequence[int] | None = None,
        timeout_s: float | None = None,
    ) -> list[bool]:
        """Renew ``owner``'s leases on ``keys`` (of ``fences``' tenures, if given); whether each was renewed."""
        return self._leases.renew_keys(keys, owner, ttl_ms, fences)

    def transfer_lease(
        self,
        key: str,
        from_owner: str,
        to_owner: str,
        ttl_ms: int | float,
        *,
        data: dict[str, Any] | None = None,
        fence: int | None = None,
        timeout_s: float | None = None,
    ) -> bool:
        """Hand ``from_owner``'s unexpired lease (of tenure ``fence``, if given) to ``to_owner`` for
        ``ttl_ms`` ms, atomically, with lease ``data`` (see ``LeaseProvider``).
        ``TypeError``/``ValueError`` for bad input (``fence`` included); nothing changes."""
        return self._leases.transfer(key, from_owner, to_owner, ttl_ms, data, fence)

    def sweep_expired(
        self, batch_size: int = 1000, grace_ms: int | float = 0, *, timeout_s: float | None = None
    ) -> int:
        """Forget up to ``batch_size`` leases that expired at least ``grace_ms`` ms ago; the count."""
        return self._leases.sweep(batch_size, grace_ms)

    def list_leases(
        self,
        prefix: str | None = None,
        include_expired: bool = False,
        limit: int = 1000,
        *,
        timeout_s: float | None = None,
    ) -> list[LeaseInfo]:
        """Leases ordered by key whose key starts with ``prefix`` (all when None), at most ``limit``."""
        return self._leases.list(prefix, include_expired, limit)

    def break_lease(self, key: str, *, fence: int | None = None, timeout_s: float | None = None) -> LeaseInfo | None:
        """Forget the lease on ``key`` whoever holds it, or (``fence`` given) only the tenure with
        that fence; the lease broken, or None if no such lease was held."""
        return self._leases.break_(key, fence)
