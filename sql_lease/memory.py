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
    validate_limit,
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
    accepts_limit = True
    """``acquire_lease`` takes (and checks) ``limit``, so ``hold(limit=)`` serves: every caller holds a slot."""

    async def acquire_lease(
        self, key: str, owner: str, ttl_ms: int | float, *, limit: int = 1, data: dict[str, Any] | None = None
    ) -> AcquireResult:
        validate_limit(limit)
        validate_key(key), validate_owner(owner), validate_ttl_ms(ttl_ms), encode_data(data)
        return AcquireResult(acquired=True, owner=owner)

    async def get_lease_holders(self, key: str) -> list[LeaseInfo]:
        """Always ``[]``: the no-op provider keeps nothing."""
        validate_key(key)
        return []

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

    async def release_leases(self, keys: Sequence[str], owner: str, *, fences: Sequence[int] | None = None) -> int:
        checked = validate_keys(keys)
        validate_owner(owner), validate_fences(fences, len(checked))
        return len(checked)

    async def renew_leases(
        self, keys: Sequence[str], owner: str, ttl_ms: int | float, *, fences: Sequence[int] | None = None
    ) -> list[bool]:
        checked = validate_keys(keys)
        validate_owner(owner), validate_ttl_ms(ttl_ms), validate_fences(fences, len(checked))
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


def _tenure_order(tenure: _Tenure) -> tuple[float, int]:
    """Holders of a key are ordered by tenure start, then fence: the oldest first."""
    return tenure.acquired_at_ms, tenure.fence


class MemoryLeases:
    """The lease table of the in-memory providers: every rule, synchronous and thread-safe (one
    lock around each operation). :class:`InMemoryLeaseProvider` (asyncio) and
    :class:`SyncInMemoryLeaseProvider` (threads) are two faces of it.

    Expiry uses ``clock`` (a float number of milliseconds, default :func:`monotonic_ms`);
    ``expires_at`` is the UTC wall time at which the monotonic deadline falls.

    A key is held either as a plain lease (``_tenures``) or as a semaphore (``_slots``: one tenure
    per holder, by owner); fences come from one counter, so every grant's is larger than every
    earlier one's.
    """

    def __init__(self, clock: Callable[[], float] = monotonic_ms) -> None:
        self._clock = clock
        # Wall time of clock() == 0, fixed once so an expiry always maps to the same datetime.
        self._wall_epoch = datetime.now(UTC) - timedelta(milliseconds=clock())
        self._tenures: dict[str, _Tenure] = {}
        self._slots: dict[str, dict[str, _Tenure]] = {}  # semaphore keys: each holder's slot by owner
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

    # -- semaphores: the slots of a key ---------------------------------------------------------

    def _live_slots(self, key: str, now_ms: float) -> list[_Tenure]:
        """The unexpired slots of ``key`` (kept ones included), oldest tenure first (then fence)."""
        slots = self._slots.get(key)
        if not slots:
            return []
        return sorted((t for t in slots.values() if t.expires_at_ms > now_ms), key=_tenure_order)

    def _holders(self, key: str, now_ms: float) -> list[_Tenure]:
        """Every unexpired holder of ``key``: its plain lease, or its slots oldest first."""
        plain = self._live(key, now_ms)
        return [plain] if plain is not None else self._live_slots(key, now_ms)

    def _own(self, key: str, owner: str) -> _Tenure | None:
        """``owner``'s tenure of ``key``, expired or not: its plain lease, else its slot."""
        plain = self._tenures.get(key)
        if plain is not None and plain.owner == owner:
            return plain
        return self._slots.get(key, {}).get(owner)

    def _drop(self, key: str, tenure: _Tenure) -> None:
        """Forget ``tenure`` of ``key`` (the plain lease or a slot)."""
        if self._tenures.get(key) is tenure:
            del self._tenures[key]
            return
        slots = self._slots.get(key, {})
        if slots.get(tenure.owner) is tenure:
            del slots[tenure.owner]
            if not slots:
                del self._slots[key]

    def _refusal(self, holder: _Tenure, now_ms: float) -> AcquireResult:
        remaining = holder.expires_at_ms - now_ms
        return AcquireResult(False, holder.owner, holder.fence, self._wall(holder.expires_at_ms), remaining)

    def _acquire_slot(
        self, key: str, owner: str, ttl: float, text: str | None, limit: int, now: float
    ) -> AcquireResult:
        """A semaphore acquire of a key no plain lease holds (under the lock)."""
        holders = self._live_slots(key, now)
        mine = self._slots.get(key, {}).get(owner)
        if mine is not None and mine.expires_at_ms > now:
            if mine.released:  # kept for its minimum hold: refused, as a kept lease is
                return self._refusal(holders[0], now)
            mine.expires_at_ms = now + ttl
            mine.data = mine.data if text is None else text
            return AcquireResult(True, owner, mine.fence, self._wall(mine.expires_at_ms), ttl)
        if len(holders) >= limit:
            return self._refusal(holders[0], now)
        self._tenures.pop(key, None)  # an expired plain lease: the key is a semaphore now
        slot = self._slots.setdefault(key, {})[owner] = _Tenure(owner, self._next_fence(), now + ttl, now, text)
        return AcquireResult(True, owner, slot.fence, self._wall(slot.expires_at_ms), ttl)

    def get_holders(self, key: str) -> list[LeaseInfo]:
        key = validate_key(key)
        with self._lock:
            now = self._clock()
            return [self._info(key, tenure, now) for tenure in self._holders(key, now)]

    # -- every key ------------------------------------------------------------------------------

    def acquire(self, key: str, owner: str, ttl_ms: object, data: object = None, limit: object = 1) -> AcquireResult:
        checked_limit = validate_limit(limit)
        key, owner = validate_key(key), validate_owner(owner)
        ttl = validate_ttl_ms(ttl_ms)
        text = encode_data(data)
        with self._lock:
            now = self._clock()
            if self._live(key, now) is None and checked_limit > 1:
                return self._acquire_slot(key, owner, ttl, text, checked_limit, now)
            refusal = self._blocker(key, owner, now)
            return self._grant(key, owner, ttl, text, now) if refusal is None else refusal

    def _blocker(self, key: str, owner: str, now: float) -> AcquireResult | None:
        """The refusal of a plain acquire of ``key`` by ``owner`` naming the holder: another owner's
        lease, ``owner``'s released one kept, or any slot (the oldest holder named); None if free."""
        current = self._live(key, now)
        if current is None:
            slots = self._live_slots(key, now)
            return self._refusal(slots[0], now) if slots else None
        return self._refusal(current, now) if current.owner != owner or current.released else None

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
            refusals = [self._blocker(key, owner, now) for key in checked]
            if any(refusal is not None for refusal in refusals):
                return [AcquireResult(False, None) if refusal is None else refusal for refusal in refusals]
            return [self._grant(key, owner, ttl, text, now) for key in checked]

    def release_many(self, keys: object, owner: object, fences: object = None) -> int:
        """How many of ``owner``'s unexpired leases on ``keys`` (of ``fences``' tenures, if given) were released."""
        checked, owner = validate_keys(keys), validate_owner(owner)
        tenures = validate_fences(fences, len(checked))
        return sum(self.release(key, owner, fence) for key, fence in zip(checked, tenures, strict=True))

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
            holders = self._holders(key, self._clock())
            return holders[0].owner if holders else None

    def get_lease(self, key: str) -> LeaseInfo | None:
        key = validate_key(key)
        with self._lock:
            now = self._clock()
            holders = self._holders(key, now)
            if not holders:
                return None
            return self._info(key, holders[0], now)

    def release(self, key: str, owner: str, fence: object = None, min_hold_ms: object = None) -> bool:
        key, owner = validate_key(key), validate_owner(owner)
        checked_fence, min_hold = validate_tenure_options(fence, min_hold_ms)
        with self._lock:
            now = self._clock()
            current = self._own(key, owner)
            if current is None or checked_fence not in (None, current.fence):
                return False
            if current.expires_at_ms <= now:
                self._drop(key, current)
                return False
            if current.released:
                return False  # kept for its minimum hold
            if min_hold is not None and current.acquired_at_ms + min_hold > now:
                current.released, current.expires_at_ms = True, current.acquired_at_ms + min_hold
                return True
            self._drop(key, current)
            return True

    def renew(self, key: str, owner: str, ttl_ms: object, fence: object = None) -> LeaseInfo | None:
        key, owner = validate_key(key), validate_owner(owner)
        ttl = validate_ttl_ms(ttl_ms)
        checked_fence = validate_tenure_options(fence)[0]
        with self._lock:
            return self._renew(key, owner, ttl, checked_fence)

    def _renew(self, key: str, owner: str, ttl: float, fence: int | None) -> LeaseInfo | None:
        now = self._clock()
        current = self._own(key, owner)
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
            current = self._own(key, from_owner)
            if current is None or not current.matches(from_owner, checked_fence, now):
                return False
            slots = self._slots.get(key, {})
            if to_owner != from_owner and slots.get(from_owner) is current:
                taken = slots.get(to_owner)
                if taken is not None and taken.expires_at_ms > now:
                    return False  # to_owner holds a slot of the key already
                del slots[from_owner]
                slots[to_owner] = current
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
            expired = [(k, t) for k, t in self._tenures.items() if t.expires_at_ms + grace <= now]
            expired += [(k, t) for k, s in self._slots.items() for t in s.values() if t.expires_at_ms + grace <= now]
            for key, tenure in expired[:size]:
                self._drop(key, tenure)
            return min(len(expired), size)

    def list(self, prefix: object = None, include_expired: object = False, limit: object = 1000) -> list[LeaseInfo]:
        prefix, include_expired, limit = validate_list(prefix, include_expired, limit)
        with self._lock:
            now = self._clock()
            tenures = [*self._tenures.items(), *((k, t) for k, s in self._slots.items() for t in s.values())]
            found = [
                (key, t)
                for key, t in tenures
                if (prefix is None or key.startswith(prefix)) and (include_expired or t.expires_at_ms > now)
            ]
            # The order of the stored keys, as SQLite's; a key's holders oldest tenure first.
            found.sort(key=lambda row: (encode_key(row[0]), _tenure_order(row[1])))
            return [self._info(key, t, now) for key, t in found[:limit]]

    def break_(self, key: str, fence: object = None) -> LeaseInfo | None:
        key = validate_key(key)
        fence = None if fence is None else validate_fence(fence)
        with self._lock:
            now = self._clock()
            every = [*filter(None, [self._tenures.get(key)]), *self._slots.get(key, {}).values()]
            if fence is not None:  # only that tenure; any other is left alone
                every = [tenure for tenure in every if tenure.fence == fence]
            for tenure in every:
                self._drop(key, tenure)
            live = sorted((tenure for tenure in every if tenure.expires_at_ms > now), key=_tenure_order)
            if not live:
                return None
            return self._info(key, live[0], now)


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
    accepts_limit = True
    """``acquire_lease`` takes ``limit`` (semaphores) and ``get_lease_holders`` lists every holder."""

    def __init__(self, *, clock: Callable[[], float] = monotonic_ms) -> None:
        self._leases = MemoryLeases(clock)

    async def acquire_lease(
        self, key: str, owner: str, ttl_ms: int | float, *, limit: int = 1, data: dict[str, Any] | None = None
    ) -> AcquireResult:
        """Acquire ``key`` for ``owner`` for ``ttl_ms`` milliseconds (rules 1-3 of ``LeaseProvider``)
        with lease ``data``; ``limit`` >= 2 takes one of at most ``limit`` slots of a semaphore
        (``LeaseProvider``, "Semaphores"). ``TypeError``/``ValueError`` for bad input (``limit``
        first); nothing changes."""
        return self._leases.acquire(key, owner, ttl_ms, data, limit)

    async def get_lease_holders(self, key: str) -> list[LeaseInfo]:
        """Every unexpired holder of ``key``, oldest tenure first (then fence): ``[]`` or the one
        plain lease, or each slot of a semaphore (kept ones included, ``released``)."""
        return self._leases.get_holders(key)

    async def get_lease_owner(self, key: str) -> str | None:
        return self._leases.get_owner(key)

    async def get_lease(self, key: str) -> LeaseInfo | None:
        """The unexpired lease on ``key`` (owner, fence, expiry; of a semaphore, the holder with the
        oldest tenure), or None."""
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

    async def release_leases(self, keys: Sequence[str], owner: str, *, fences: Sequence[int] | None = None) -> int:
        """Release ``owner``'s leases on ``keys`` (of ``fences``' tenures, if given: one fence per key, in
        order); how many unexpired ones were released."""
        return self._leases.release_many(keys, owner, fences)

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
        """Forget up to ``batch_size`` leases and semaphore slots that expired at least ``grace_ms`` ms
        ago; how many."""
        return self._leases.sweep(batch_size, grace_ms)

    async def list_leases(
        self, prefix: str | None = None, include_expired: bool = False, limit: int = 1000
    ) -> list[LeaseInfo]:
        """Leases ordered by key whose key starts with ``prefix`` (all when None), one per holder of a
        semaphore key (oldest tenure first), at most ``limit`` rows."""
        return self._leases.list(prefix, include_expired, limit)

    async def break_lease(self, key: str, *, fence: int | None = None) -> LeaseInfo | None:
        """Forget the lease on ``key`` whoever holds it (every slot of a semaphore), or (``fence``
        given) only the tenure with that fence; the lease broken (of a semaphore, the holder with
        the oldest tenure), or None if no such lease was held unexpired."""
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
    accepts_limit = True
    """``acquire_lease`` takes ``limit`` (semaphores) and ``get_lease_holders`` lists every holder."""

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
        limit: int = 1,
        data: dict[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> AcquireResult:
        """Acquire ``key`` for ``owner`` for ``ttl_ms`` milliseconds (rules 1-3 of ``LeaseProvider``)
        with lease ``data`` (see ``LeaseProvider``); ``limit`` >= 2 takes one of at most ``limit``
        slots of a semaphore. ``TypeError``/``ValueError`` for bad input (``limit`` first)."""
        return self._leases.acquire(key, owner, ttl_ms, data, limit)

    def get_lease_holders(self, key: str, *, timeout_s: float | None = None) -> list[LeaseInfo]:
        """Every unexpired holder of ``key``, oldest tenure first (then fence): ``[]`` or the one
        plain lease, or each slot of a semaphore (kept ones included, ``released``)."""
        return self._leases.get_holders(key)

    def get_lease_owner(self, key: str, *, timeout_s: float | None = None) -> str | None:
        """The owner of the unexpired lease on ``key``, or None."""
        return self._leases.get_owner(key)

    def get_lease(self, key: str, *, timeout_s: float | None = None) -> LeaseInfo | None:
        """The unexpired lease on ``key`` (owner, fence, expiry, remaining ms; of a semaphore, the
        holder with the oldest tenure), or None."""
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

    def release_leases(
        self, keys: Sequence[str], owner: str, *, fences: Sequence[int] | None = None, timeout_s: float | None = None
    ) -> int:
        """Release ``owner``'s leases on ``keys`` (of ``fences``' tenures, if given: one fence per key, in
        order); how many unexpired ones were released."""
        return self._leases.release_many(keys, owner, fences)

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
        """Forget up to ``batch_size`` leases and semaphore slots that expired at least ``grace_ms`` ms
        ago; how many."""
        return self._leases.sweep(batch_size, grace_ms)

    def list_leases(
        self,
        prefix: str | None = None,
        include_expired: bool = False,
        limit: int = 1000,
        *,
        timeout_s: float | None = None,
    ) -> list[LeaseInfo]:
        """Leases ordered by key whose key starts with ``prefix`` (all when None), one per holder of a
        semaphore key (oldest tenure first), at most ``limit`` rows."""
        return self._leases.list(prefix, include_expired, limit)

    def break_lease(self, key: str, *, fence: int | None = None, timeout_s: float | None = None) -> LeaseInfo | None:
        """Forget the lease on ``key`` whoever holds it (every slot of a semaphore), or (``fence``
        given) only the tenure with that fence; the lease broken (of a semaphore, the holder with
        the oldest tenure), or None if no such lease was held unexpired."""
        return self._leases.break_(key, fence)
