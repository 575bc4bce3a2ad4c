"""The lease contract: ``LeaseProvider``, ``AcquireResult``, input validation and structural detection.

The interface follows the ``LeaseProvider`` of the Mastra agent framework (``acquireLease``,
``getLeaseOwner``, ``releaseLease``, ``renewLease``, ``transferLease``, detected structurally by
``isLeaseProvider``), in Python naming. This module imports no database package, so the no-op and
in-memory providers work without SQLAlchemy or a driver installed.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, overload, runtime_checkable

if TYPE_CHECKING:  # the holding layer's signatures, for the shortcuts' types only (no import at run time)
    from .holding import aio as _aio
    from .holding import rules as _rules
    from .holding import threads as _threads

__all__ = [
    "MAX_DATA_BYTES",
    "MAX_DATA_DEPTH",
    "MAX_FENCE",
    "MAX_KEYS",
    "MAX_KEY_LENGTH",
    "MAX_LIMIT",
    "MAX_LIST_LIMIT",
    "MAX_OWNER_LENGTH",
    "MAX_TTL_MS",
    "MIN_TTL_MS",
    "AcquireResult",
    "CheckedRenewItems",
    "LeaseInfo",
    "LeaseProvider",
    "LeaseProviderBase",
    "ListsHolders",
    "ReleaseWaiter",
    "ReleaseWaiters",
    "RenewItem",
    "RenewsWithLeaseInfo",
    "SyncLeaseProvider",
    "SyncLeaseProviderBase",
    "SyncReleaseWaiter",
    "UnreadableData",
    "decode_data",
    "decode_key",
    "encode_data",
    "encode_key",
    "is_lease_provider",
    "validate_fence",
    "validate_key",
    "validate_keys",
    "validate_limit",
    "validate_list",
    "validate_min_hold_ms",
    "validate_owner",
    "validate_renew_items",
    "validate_seconds",
    "validate_sweep",
    "validate_tenure_options",
    "validate_ttl_ms",
]

MAX_KEY_LENGTH = 512
"""Longest accepted key, in characters (Unicode code points) of the key as given."""

MAX_OWNER_LENGTH = 512
"""Longest accepted owner id, in characters (Unicode code points)."""

MAX_TTL_MS = 365 * 24 * 3600 * 1000
"""Longest accepted TTL: 365 days, in milliseconds."""

LEASE_METHOD_NAMES = (
    "acquire_lease",
    "get_lease_owner",
    "release_lease",
    "renew_lease",
    "transfer_lease",
)


@dataclass(frozen=True, slots=True)
class AcquireResult:
    """The outcome of ``acquire_lease``.

    Attributes:
        acquired: True iff the caller now owns the lease.
        owner: the owner after the call: the caller when acquired, else the current holder
            (None only when the holder could not be determined, e.g. it released in between).
        fence: the fencing token of that owner's tenure, an ``int`` that strictly increases per key
            at every change of owner. Pass it to the resource you protect; it rejects smaller ones.
            ``None`` from ``NoopLeaseProvider``.
        expires_at: when that tenure expires, a timezone-aware UTC ``datetime`` by the database's
            clock (by the process clock for in-memory providers). ``None`` from ``NoopLeaseProvider``.
        remaining_ms: how long that tenure had left when the provider answered, a ``float`` number
            of milliseconds measured by the database's own clock (``expires_at - now()``), so a
            caller can wait for the expiry without comparing clocks. ``None`` when unknown. Not
            part of equality.
    """

    acquired: bool
    owner: str | None
    fence: int | None = None
    expires_at: datetime | None = None
    remaining_ms: float | None = field(default=None, compare=False)

    def __bool__(self) -> bool:
        return self.acquired


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    """An unexpired lease as read by ``get_lease``: its key, owner, fence and expiry (aware UTC),
    and ``remaining_ms``, the TTL left (float milliseconds, by the database's clock; not part of
    equality).

    ``data`` is the lease data given at acquire or transfer (a ``dict``, a JSON object), filled in
    by ``get_lease``, ``list_leases`` and ``break_lease``; None when the lease has none or the call
    does not read it (renewals). Not part of equality or hashing.

    ``acquired_at`` is when the current tenure began (aware UTC, by the database's clock): set by
    the acquire or transfer that drew the fence, kept by renewals, the owner's idempotent
    re-acquire and a transfer to oneself. Filled in by ``get_lease``, ``list_leases`` and
    ``break_lease``; None when unknown (a row written before migration 0003, or a call that does
    not read it). Not part of equality or hashing.

    ``released`` is True for a lease its owner released with ``min_hold_ms`` whose minimum hold
    has not run out: it is kept (nobody acquires, renews or transfers it) until ``expires_at``.
    Filled in by ``get_lease``, ``list_leases`` and ``break_lease``; False otherwise. Not part of equality."""

    key: str
    owner: str
    fence: int
    expires_at: datetime
    remaining_ms: float | None = field(default=None, compare=False)
    data: dict[str, Any] | None = field(default=None, compare=False)
    acquired_at: datetime | None = field(default=None, compare=False)
    released: bool = field(default=False, compare=False)


@runtime_checkable
class LeaseProvider(Protocol):
    """Single-owner leases with a time-to-live (TTL), keyed by a string.

    Rules every provider follows (T is the provider's clock when the operation runs; for SQL
    providers the database's clock, never the client's):

    1. ``acquire_lease`` on a free key (absent, released or expired) succeeds:
       ``expires_at = T + ttl`` and a new fencing token (``fence``).
    2. While another owner holds an unexpired lease, ``acquire_lease`` returns ``acquired=False``
       with the holder's ``owner``, ``fence`` and ``expires_at``.
    3. ``acquire_lease`` by the owner of the unexpired lease succeeds, resets ``expires_at = T + ttl``
       and keeps the fence, so a caller that lost the reply can simply retry. (After its own lease
       expired, the same owner starts a new tenure with a new, larger fence: rule 1.) An owner id
       therefore names one holder: two holders sharing one id are one holder to the provider.
    4. The fence strictly increases per key at every change of owner (release and re-acquire,
       transfer, expiry sweeps, database restarts).
    5. ``get_lease_owner`` of an expired or released lease returns None.
    6. ``release_lease`` by anyone but the unexpired owner returns False and changes nothing.
    7. ``renew_lease`` by the unexpired owner returns True with ``expires_at = T + ttl``;
       after expiry, or by a non-owner, False.
    8. ``transfer_lease`` from the unexpired owner returns True, sets the new owner with
       ``expires_at = T + ttl`` and a larger fence, atomically (the key is never free in between);
       ``to_owner == from_owner`` acts as renew. Otherwise False and nothing changes.

    ``key`` is any non-empty ``str`` (NUL and lone surrogates included) of at most
    ``MAX_KEY_LENGTH`` characters; ``owner`` a non-empty ``str`` without NUL, valid as UTF-8, of at
    most ``MAX_OWNER_LENGTH`` characters. ``ttl_ms`` is a finite ``int`` or ``float`` number of
    milliseconds, ``1 <= ttl_ms <= MAX_TTL_MS`` (365 days). Invalid input raises ``TypeError`` or
    ``ValueError`` before anything is sent to the database.

    Lease data (an extension: the bundled providers have it; this protocol does not require it, so
    providers written without it still qualify, and ``hold()`` passes ``data`` only when given):
    ``acquire_lease`` and ``transfer_lease`` take a keyword-only ``data`` (a ``dict``, checked by
    :func:`encode_data`; default None), read back by ``get_lease`` and ``list_leases`` as
    ``LeaseInfo.data``. Data belongs to a tenure: an acquire or transfer that starts a new tenure
    (a new fence) stores the given ``data`` (None: none); within the same tenure (the owner's
    idempotent re-acquire, a transfer to oneself) None keeps the stored data and a ``dict``
    replaces it. Renewals keep it; release, expiry sweeps and ``break_lease`` remove it with the row.

    Tenure-scoped operations and a minimum hold (extensions of the bundled providers, which say so
    with ``accepts_fence = True``; ``hold()``, ``@leased``, ``exec`` and ``hold_all`` pass them only
    to such providers, ``hold_all`` as ``release_leases(..., fences=)``): ``release_lease``,
    ``renew_lease`` and ``transfer_lease`` take a keyword-only ``fence`` (an ``int``,
    :func:`validate_fence`; None: any tenure of the owner): with it they act only while the key's
    current tenure has that fencing token, else return False and change nothing, so a reused owner
    id never releases or renews a later tenure. ``release_lease`` takes a keyword-only
    ``min_hold_ms`` (:func:`validate_min_hold_ms`): the lease is then kept, held by its owner and
    marked released (``LeaseInfo.released``), until ``min_hold_ms`` after its tenure began
    (``acquired_at``, by the provider's clock; for a tenure without a recorded start, from the
    release), and freed at once if that moment has passed. A kept lease refuses every acquire (its
    own owner's too: it was released), renewal, transfer and further release; it ends at that expiry
    (or by ``break_lease``), and the next acquire is a new tenure with a larger fence.

    Semaphores (an extension of the bundled providers, which say so with ``accepts_limit = True``;
    ``hold()``, ``acquire_lease_wait()``, ``@leased`` and ``exec`` pass ``limit`` only when it is
    not 1, and only to such providers, else ``TypeError`` naming the provider before anything is
    sent): ``acquire_lease`` takes a keyword-only ``limit`` (:func:`validate_limit`, an ``int``
    from 1 to ``MAX_LIMIT``, checked first; default 1, the plain lease of rules 1-3). With
    ``limit >= 2`` the key is a semaphore and each owner holds a *slot* of it, a tenure of its own:

    - A key is held either as a plain lease or as a semaphore. A semaphore acquire of a key held as
      an unexpired plain lease by another owner is refused naming it; by the same owner it is that
      lease's re-acquire (rule 3: kept plain, same fence). A plain acquire (``limit=1``) of a key
      with any unexpired slot is refused while anyone holds one, the slot holders included.
    - The owner of an unexpired slot re-acquires it: TTL renewed, same fence, same tenure start.
      Otherwise the slot is granted iff fewer than ``limit`` other owners hold unexpired slots (by
      the provider's clock); ``limit`` is the caller's, per call. A granted slot's fence is larger
      than every earlier grant of the key (one sequence per key across slots and plain tenures).
      A refusal names the holder with the oldest tenure (owner, fence, expiry, ``remaining_ms``).
    - A slot released with ``min_hold_ms`` is kept, and counted, until its minimum hold ends.
    - ``renew_lease``, ``renew_lease_info``, ``release_lease`` and ``transfer_lease`` act on that
      owner's slot (``fence`` scopes them to its tenure). A transfer to an owner that holds a slot
      of the key already is refused (False); otherwise the slot passes with a new fence, its
      tenure restarting; a transfer to oneself renews. Once the last slot is released or expired
      the key is free at once for a plain acquire.
    - ``get_lease_owner``/``get_lease`` name the holder with the oldest tenure; ``get_lease_holders(key)
      -> list[LeaseInfo]`` lists every unexpired holder, oldest tenure first (then fence): ``[]`` or
      the one plain lease for a plain key. ``list_leases`` gives one row per holder (``limit``
      counts rows; ``include_expired`` shows expired slots). ``break_lease(key)`` ends every holder
      and returns the oldest (None if none was unexpired); with ``fence`` only that holding.
      ``sweep_expired`` forgets expired slots. ``check_held`` holds for a slot as for a lease.
    """

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int | float) -> AcquireResult:
        """Acquire ``key`` for ``owner`` for ``ttl_ms`` milliseconds (rules 1-3)."""
        ...

    async def get_lease_owner(self, key: str) -> str | None:
        """The owner of the unexpired lease on ``key``, or None (rule 5)."""
        ...

    async def release_lease(self, key: str, owner: str) -> bool:
        """Release ``key`` if ``owner`` holds it unexpired; True iff it did (rule 6)."""
        ...

    async def renew_lease(self, key: str, owner: str, ttl_ms: int | float) -> bool:
        """Extend ``owner``'s unexpired lease to T + ``ttl_ms`` milliseconds (rule 7)."""
        ...

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int | float) -> bool:
        """Hand ``from_owner``'s unexpired lease to ``to_owner`` for ``ttl_ms`` ms (rule 8)."""
        ...


@runtime_checkable
class ListsHolders(Protocol):
    """Optional: every holder of a key (see ``LeaseProvider``, "Semaphores"); the bundled providers
    have it. ``sql-lease show`` uses it when a provider has it, and a semaphore ``hold()`` reads a
    handed-on slot back with it."""

    async def get_lease_holders(self, key: str) -> list[LeaseInfo]:
        """Every unexpired holder of ``key``, oldest tenure first (then fence); ``[]`` when free."""
        ...


@runtime_checkable
class RenewsWithLeaseInfo(Protocol):
    """Optional: a renewal that also returns the lease as the database now has it.

    ``hold()`` uses it, when a provider has it, to keep ``HeldLease.expires_at`` on the database's
    clock. The bundled SQL and in-memory providers have it.
    """

    async def renew_lease_info(self, key: str, owner: str, ttl_ms: int | float) -> LeaseInfo | None:
        """Renew as ``renew_lease``; the renewed lease, or None where ``renew_lease`` returns False."""
        ...


@runtime_checkable
class HoldsSeveralKeys(Protocol):
    """Optional: all-or-nothing calls on several keys (1 to ``MAX_KEYS`` distinct keys), what
    ``hold_all()`` needs; the bundled providers have them. ``fences`` (one fencing token per key, in
    the order of ``keys``) limits a release or renewal to those tenures, so a newer tenure of the same
    owner id is never touched; ``TypeError``/``ValueError`` for bad input before anything is sent."""

    async def acquire_leases(self, keys: Sequence[str], owner: str, ttl_ms: int | float) -> list[AcquireResult]:
        """Every key for ``owner`` for ``ttl_ms`` ms, or none; the results in the order of ``keys``."""
        ...

    async def release_leases(self, keys: Sequence[str], owner: str, *, fences: Sequence[int] | None = None) -> int:
        """Release ``owner``'s leases on ``keys`` (of ``fences``' tenures, if given); how many were released."""
        ...

    async def renew_leases(
        self, keys: Sequence[str], owner: str, ttl_ms: int | float, *, fences: Sequence[int] | None = None
    ) -> list[bool]:
        """Renew ``owner``'s leases on ``keys`` (of ``fences``' tenures, if given) for ``ttl_ms`` ms;
        whether each was renewed, in the order of ``keys``."""
        ...


class ReleaseWaiter(Protocol):
    """One waiter on one key, made by ``ReleaseWaiters.release_waiter`` (an async context manager:
    entering registers for wake-ups before the first attempt, so none is lost)."""

    @property
    def listening(self) -> bool:
        """True while wake-ups work; otherwise the waiter polls."""
        ...

    async def __aenter__(self) -> ReleaseWaiter: ...

    async def __aexit__(self, *exc_info: object) -> None: ...

    async def acquire(
        self, owner: str, ttl_ms: int | float, *, data: dict[str, Any] | None = None, timeout_s: float | None = None
    ) -> AcquireResult:
        """One acquire attempt (``data``: the lease data, given only when the caller gave it;
        ``timeout_s``: the attempt's time limit in seconds, None: the provider's); a refusal asks
        to be woken when the holder lets go. A provider with ``accepts_limit`` also takes a
        keyword ``limit`` (given only when not 1): a semaphore acquire, woken when any slot is let go."""
        ...

    async def wait(self, timeout_s: float) -> bool:
        """Wait until the key is let go (True) or ``timeout_s`` seconds pass (False)."""
        ...


@runtime_checkable
class ReleaseWaiters(Protocol):
    """Optional: a faster wake-up for ``acquire_lease_wait`` and ``hold(wait=True)`` than polling.

    ``SqlLeaseProvider`` has it on PostgreSQL (LISTEN/NOTIFY); ``release_waiter`` returns None where
    it has nothing better than polling.
    """

    def release_waiter(self, key: str) -> ReleaseWaiter | None: ...


class SyncLeaseProvider(Protocol):
    """The five lease methods as plain (blocking) functions: what ``hold()``,
    ``acquire_lease_wait()`` (:mod:`sql_lease.sync_holding`) and ``@leased`` on a plain function
    need. ``SyncSqlLeaseProvider``, ``SyncInMemoryLeaseProvider`` and ``DjangoSqlLeaseProvider``
    have them (each also takes a keyword ``timeout_s``, seconds, and ``data`` where
    ``LeaseProvider`` describes it). The rules are ``LeaseProvider``'s; a static type, not checked
    at run time."""

    def acquire_lease(self, key: str, owner: str, ttl_ms: int | float) -> AcquireResult: ...

    def get_lease_owner(self, key: str) -> str | None: ...

    def release_lease(self, key: str, owner: str) -> bool: ...

    def renew_lease(self, key: str, owner: str, ttl_ms: int | float) -> bool: ...

    def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int | float) -> bool: ...


class SyncHoldsSeveralKeys(Protocol):
    """The all-or-nothing calls of :class:`HoldsSeveralKeys` as plain (blocking) functions: what the
    synchronous ``hold_all()`` needs (the bundled providers also take a keyword ``timeout_s``)."""

    def acquire_leases(self, keys: Sequence[str], owner: str, ttl_ms: int | float) -> list[AcquireResult]: ...

    def release_leases(self, keys: Sequence[str], owner: str, *, fences: Sequence[int] | None = None) -> int: ...

    def renew_leases(
        self, keys: Sequence[str], owner: str, ttl_ms: int | float, *, fences: Sequence[int] | None = None
    ) -> list[bool]: ...


class SyncReleaseWaiter(Protocol):
    """The optional wake-up hook a sync provider returns from ``release_waiter(key)``: a context
    manager (registered for the key while entered) with a bounded acquire attempt and a wait."""

    @property
    def listening(self) -> bool:
        """True while release wake-ups work (else the waiter polls)."""
        ...

    def __enter__(self) -> SyncReleaseWaiter: ...

    def __exit__(self, *exc_info: object) -> None: ...

    def acquire(
        self, owner: str, ttl_ms: int | float, timeout_s: float | None, *, data: dict[str, Any] | None = None
    ) -> AcquireResult:
        """One acquire attempt with lease ``data`` (given only when the caller gave it), answered
        within ``timeout_s`` seconds (None: the provider's own limit); ``limit`` too, as
        :class:`ReleaseWaiter`'s."""
        ...

    def wait(self, timeout_s: float) -> bool:
        """Block until the key may be free (True) or ``timeout_s`` seconds pass (False)."""
        ...


def is_lease_provider(obj: object) -> bool:
    """True iff ``obj`` has all five ``LeaseProvider`` methods and each is callable.

    Structural, like Mastra's ``isLeaseProvider``: it works across copies of this package and for
    classes that never import it. A class (rather than an instance) is not a provider.
    """
    if isinstance(obj, type):
        return False
    return all(callable(getattr(obj, name, None)) for name in LEASE_METHOD_NAMES)


def _validate_identifier(value: object, what: str, max_length: int, any_text: bool = False) -> str:
    if type(value) is not str:
        if not isinstance(value, str):
            raise TypeError(f"{what} must be a str, not {type(value).__name__}")
        # An exact str copy: a subclass could override len(), "in" or encode() and slip past the checks.
        value = str.__str__(value)
    if not value:
        raise ValueError(f"{what} must not be empty")
    if len(value) > max_length:
        raise ValueError(f"{what} is {len(value)} characters long; the limit is {max_length}")
    if any_text:
        return value
    if "\x00" in value:
        raise ValueError(f"{what} must not contain NUL characters")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"{what} is not valid Unicode text (lone surrogate?): {exc}") from None
    return value


def validate_key(key: object) -> str:
    """Return ``key`` (as an exact ``str``) if it is a valid lease key: any non-empty ``str`` of at
    most ``MAX_KEY_LENGTH`` code points, NUL and lone surrogates included; else ``TypeError`` (not
    a ``str``) or ``ValueError`` (empty, too long)."""
    return _validate_identifier(key, "key", MAX_KEY_LENGTH, any_text=True)


KEY_ESCAPE = "\x01"
"""The one character the stored form of a key escapes with (:func:`encode_key`)."""

_STORED_SURROGATES = 0x0800  # a lone surrogate U+D800 + i is stored as KEY_ESCAPE + chr(0x0800 + i)
_TO_STORE = re.compile("[\x00\x01\ud800-\udfff]")
_STORED = re.compile("\x01([\x01\x02\u0800-\u0fff])")


def _store(match: re.Match[str]) -> str:
    code = ord(match.group())
    return KEY_ESCAPE + (chr(code + 1) if code <= 1 else chr(code - 0xD800 + _STORED_SURROGATES))


def _read(match: re.Match[str]) -> str:
    code = ord(match.group(1))
    return chr(code - 1) if code <= 2 else chr(code - _STORED_SURROGATES + 0xD800)


def encode_key(key: str) -> str:
    """The stored form of a valid ``key``: NUL as U+0001 U+0001, U+0001 as U+0001 U+0002, a lone
    surrogate U+D800+i as U+0001 and U+0800+i; every other character as it is. Valid UTF-8
    without NUL, at most two characters and four UTF-8 bytes per character of ``key``; injective,
    and ``encode_key(p)`` starts ``encode_key(k)`` exactly when ``p`` starts ``k``, and it keeps
    code point order (lone surrogates sort between U+0001 and U+0002). docs/statements.md, "Keys"."""
    if key.isascii() and "\x00" not in key and KEY_ESCAPE not in key:  # the usual key, without a regex
        return key
    return _TO_STORE.sub(_store, key) if _TO_STORE.search(key) else key


def decode_key(stored: str) -> str:
    """The key whose stored form is ``stored`` (:func:`encode_key`'s inverse). A U+0001 that
    starts no escape (a row an older release wrote) is read as it is."""
    return _STORED.sub(_read, stored) if KEY_ESCAPE in stored else stored


MAX_FENCE = 2**63 - 1
"""Largest fencing token (a signed 64-bit integer, as the databases store it)."""


def validate_fence(fence: object) -> int:
    """``fence`` if it is an ``int`` (not ``bool``) from 1 to 2**63-1, else ``TypeError``/``ValueError``."""
    if isinstance(fence, bool) or not isinstance(fence, int):
        raise TypeError(f"fence must be an int, not {type(fence).__name__}")
    if not 1 <= fence <= MAX_FENCE:
        raise ValueError(f"fence must be from 1 to {MAX_FENCE}, not {fence}")
    return int.__int__(fence)


def validate_min_hold_ms(min_hold_ms: object) -> float:
    """``min_hold_ms`` as a float number of milliseconds: an ``int`` or ``float`` (not ``bool``),
    finite, ``0 <= min_hold_ms <= MAX_TTL_MS``; ``TypeError``/``ValueError`` otherwise."""
    return _validate_number(min_hold_ms, "min_hold_ms", "milliseconds", 0, MAX_TTL_MS, True)


def validate_tenure_options(fence: object, min_hold_ms: object = None) -> tuple[int | None, float | None]:
    """The optional ``fence`` and ``min_hold_ms`` of a release, renewal or transfer, checked (None
    stays None): ``TypeError``/``ValueError`` otherwise."""
    return (
        None if fence is None else validate_fence(fence),
        None if min_hold_ms is None else validate_min_hold_ms(min_hold_ms),
    )


MAX_LIMIT = 10_000
"""Largest semaphore ``limit``: how many owners may hold one key at once."""


def validate_limit(limit: object) -> int:
    """``limit`` (how many owners may hold the key at once; 1 is a plain lease) if it is an ``int``
    (not ``bool``) from 1 to ``MAX_LIMIT``, else ``TypeError``/``ValueError``."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit must be an int, not {type(limit).__name__}")
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be from 1 to {MAX_LIMIT}, not {limit}")
    return int.__int__(limit)


MAX_KEYS = 100
"""Most keys one all-or-nothing call (``acquire_leases``, ``release_leases``, ``renew_leases``) takes."""


def validate_keys(keys: object) -> list[str]:
    """``keys`` of an all-or-nothing call as a list, each checked as :func:`validate_key` checks a
    key: a sequence (not a ``str``) of 1 to ``MAX_KEYS`` distinct keys; ``TypeError``/``ValueError``
    otherwise."""
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence):
        raise TypeError(f"keys must be a sequence of str keys, not {type(keys).__name__}")
    if not 1 <= len(keys) <= MAX_KEYS:
        raise ValueError(f"keys must hold from 1 to {MAX_KEYS} keys, not {len(keys)}")
    checked = [validate_key(key) for key in keys]
    seen: set[str] = set()
    for key in checked:
        if key in seen:
            raise ValueError(f"key {key!r} appears twice in keys")
        seen.add(key)
    return checked


def validate_fences(fences: object, count: int) -> list[int | None]:
    """The optional tenure ``fences`` of an all-or-nothing call on ``count`` keys: None (any tenure)
    gives ``count`` Nones; else a sequence (not a ``str``) of ``count`` fences, each checked as
    :func:`validate_fence` checks one; ``TypeError``/``ValueError`` otherwise."""
    if fences is None:
        return [None] * count
    if isinstance(fences, (str, bytes)) or not isinstance(fences, Sequence):
        raise TypeError(f"fences must be a sequence of fences, not {type(fences).__name__}")
    if len(fences) != count:
        raise ValueError(f"fences must hold one fence per key ({count}), not {len(fences)}")
    return [validate_fence(fence) for fence in fences]


MAX_LIST_LIMIT = 100_000
"""Most rows one ``list_leases`` call returns."""


def validate_list(prefix: object, include_expired: object, limit: object) -> tuple[str | None, bool, int]:
    """Validate ``list_leases`` arguments: ``prefix`` None or a str that could start a key (at most
    ``MAX_KEY_LENGTH`` characters; ``""`` means no prefix), ``include_expired`` a bool,
    ``1 <= limit <= MAX_LIST_LIMIT`` (an int)."""
    if prefix is not None:
        empty = isinstance(prefix, str) and str.__len__(prefix) == 0
        prefix = None if empty else _validate_identifier(prefix, "prefix", MAX_KEY_LENGTH, any_text=True)
    if not isinstance(include_expired, bool):
        raise TypeError(f"include_expired must be a bool, not {type(include_expired).__name__}")
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit must be an int, not {type(limit).__name__}")
    limit = int.__int__(limit)
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise ValueError(f"limit must be between 1 and {MAX_LIST_LIMIT}, got {limit}")
    return prefix, include_expired, limit


MAX_DATA_BYTES = 4096
"""Largest accepted lease data: its compact JSON text (as stored), in bytes of UTF-8."""

MAX_DATA_DEPTH = 16
"""Deepest accepted nesting of lease data: the object itself is depth 1."""

_DATA_SCALARS = (str, int, float, type(None))


def encode_data(data: object) -> str | None:
    """Lease data as the JSON text stored with the lease (None stays None), or ``TypeError``/``ValueError``.

    Accepts a ``dict`` (a JSON object) with ``str`` keys whose values are ``dict`` (``str`` keys),
    ``list``, ``str``, ``int``, finite ``float``, ``bool`` or None, nested at most
    ``MAX_DATA_DEPTH`` deep, whose compact UTF-8 JSON is at most ``MAX_DATA_BYTES`` (4096) bytes.
    These are exactly the values that read back equal, and of the same types (no tuples, no
    non-``str`` keys, no NaN or Infinity).
    """
    if data is None:
        return None
    if not isinstance(data, dict):
        raise TypeError(f"data must be a dict (a JSON object) or None, not {type(data).__name__}")
    pending: list[tuple[str, object, int]] = [("data", data, 1)]
    seen = 0
    while pending:
        path, value, depth = pending.pop()
        seen += 1
        if seen > MAX_DATA_BYTES:  # every JSON value takes at least one byte
            raise ValueError(f"data has more than {MAX_DATA_BYTES} values; the limit is {MAX_DATA_BYTES} bytes")
        if isinstance(value, (dict, list)) and depth > MAX_DATA_DEPTH:
            raise ValueError(f"{path} is nested deeper than {MAX_DATA_DEPTH} levels (or refers to itself)")
        if isinstance(value, dict):
            for name, item in value.items():
                if not isinstance(name, str):
                    raise TypeError(f"{path} has the {type(name).__name__} key {name!r}: JSON object keys are str")
                pending.append((f"{path}[{name!r}]", item, depth + 1))
        elif isinstance(value, list):
            pending.extend((f"{path}[{i}]", item, depth + 1) for i, item in enumerate(value))
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise ValueError(f"{path} is {value!r}: JSON has no NaN or Infinity")
        elif not isinstance(value, _DATA_SCALARS):
            raise TypeError(
                f"{path} is a {type(value).__name__}: lease data holds dict, list, str, int, float, bool and None"
            )
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ValueError(f"data is not valid Unicode text (lone surrogate?): {exc}") from None
    if size > MAX_DATA_BYTES:
        raise ValueError(f"data is {size} bytes as JSON (UTF-8); the limit is {MAX_DATA_BYTES}")
    return text


UNREADABLE_DATA_KEY = "sql_lease_unreadable"
"""The one key of :class:`UnreadableData`."""


class UnreadableData(dict[str, str]):
    """What :func:`decode_data` returns for stored lease data it cannot read back as a JSON object
    (written by something other than sql_lease): text that is not JSON, bytes (SQLite), nesting too
    deep to decode, ``NaN``/``Infinity`` or a number beyond a float (``1e400``), a JSON value that
    is not an object. A ``dict`` of one entry, ``{"sql_lease_unreadable": <why>}``, so it prints and
    serialises as strict JSON; tell it apart with ``isinstance(data, UnreadableData)``."""

    def __init__(self, reason: str) -> None:
        super().__init__({UNREADABLE_DATA_KEY: reason})

    @property
    def reason(self) -> str:
        """Why the stored data could not be read (no part of the data itself)."""
        return self[UNREADABLE_DATA_KEY]


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError("a number beyond the range of a float")
    return number


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def decode_data(text: object) -> dict[str, Any] | None:
    """Stored lease data (JSON text, or None for none) as the ``dict`` it encodes; a new object per
    call. Data that is not a JSON object of finite numbers decodes as :class:`UnreadableData`
    instead of raising, so one bad row does not hide the others."""
    if text is None:
        return None
    if not isinstance(text, str):
        return UnreadableData(f"stored as {type(text).__name__}, not text")
    try:
        value = json.loads(text, parse_float=_finite_float, parse_constant=_no_constant)
    except RecursionError:
        return UnreadableData("nested too deep to decode")
    except ValueError as exc:  # JSONDecodeError, or a number Python will not convert
        return UnreadableData(f"not valid JSON: {exc}")
    if not isinstance(value, dict):
        return UnreadableData(f"a JSON {type(value).__name__}, not an object")
    return value


def validate_owner(owner: object, what: str = "owner") -> str:
    """Return ``owner`` if it is a valid owner id, else raise ``TypeError``/``ValueError``."""
    return _validate_identifier(owner, what, MAX_OWNER_LENGTH)


def _validate_number(value: object, what: str, unit: str, low: float, high: float, low_inclusive: bool) -> float:
    number: int | float
    if type(value) is float or type(value) is int:
        number = value
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be an int or float number of {unit}, not {type(value).__name__}")
    else:  # judge the value, not a subclass's methods: an overridden __float__ or __lt__ must not decide
        number = float.__float__(value) if isinstance(value, float) else int.__int__(value)
    if type(number) is float and not math.isfinite(number):
        raise ValueError(f"{what} must be finite, got {number!r}")
    # Compare before converting: int(10**400) has no float.
    if number < low or (number == low and not low_inclusive) or number > high:
        bound = ">=" if low_inclusive else ">"
        raise ValueError(f"{what} must be {bound} {low:g} and <= {high:g} {unit}, got {number!r}")
    return float(number)


MIN_TTL_MS = 1
"""Shortest accepted TTL, in milliseconds (a shorter one could expire before the statement ends)."""


def validate_ttl_ms(ttl_ms: object, what: str = "ttl_ms") -> float:
    """Return ``ttl_ms`` as a float number of milliseconds, or raise ``TypeError``/``ValueError``.

    Accepts ``int`` and ``float`` (not ``bool``), finite, ``MIN_TTL_MS (1) <= ttl_ms <= MAX_TTL_MS``.
    """
    return _validate_number(ttl_ms, what, "milliseconds", MIN_TTL_MS, MAX_TTL_MS, True)


MAX_SWEEP_BATCH = 1_000_000
MAX_GRACE_MS = 10 * 365 * 86_400_000


def validate_sweep(batch_size: object, grace_ms: object) -> tuple[int, float]:
    """Validate ``sweep_expired`` arguments: ``1 <= batch_size <= 1_000_000`` rows,
    ``0 <= grace_ms <= 10 years`` in milliseconds."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise TypeError(f"batch_size must be an int, not {type(batch_size).__name__}")
    if not 1 <= batch_size <= MAX_SWEEP_BATCH:
        raise ValueError(f"batch_size must be between 1 and {MAX_SWEEP_BATCH}, got {batch_size}")
    return int(batch_size), _validate_number(grace_ms, "grace_ms", "milliseconds", 0, MAX_GRACE_MS, True)


MAX_SECONDS = 10 * 365 * 86_400
"""The longest time limit in seconds any call takes (10 years)."""


def validate_seconds(value: object, what: str) -> float:
    """A finite number of seconds from 0 to :data:`MAX_SECONDS` (``TypeError``/``ValueError`` otherwise)."""
    return _validate_number(value, what, "seconds", 0, MAX_SECONDS, True)


RenewItem = tuple[str, str, float, int | None]
"""A checked batch renewal item: key, owner, TTL in milliseconds, fence (None: any tenure)."""


class CheckedRenewItems(list[RenewItem]):
    """A batch renewal's items already in :func:`validate_renew_items`' form, from checked leases
    (``hold()``'s renewal batcher): that function returns it as it is."""


def validate_renew_items(items: object) -> list[RenewItem]:
    """``(key, owner, ttl_ms)`` or ``(key, owner, ttl_ms, fence)`` items, each checked as ``renew``
    checks its arguments, keys distinct; as ``(key, owner, ttl_ms, fence or None)``.
    ``TypeError``/``ValueError`` else."""
    if type(items) is CheckedRenewItems:
        return items
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
        raise TypeError(f"items must be a sequence of (key, owner, ttl_ms) tuples, not {type(items).__name__}")
    checked: list[RenewItem] = []
    seen: set[str] = set()
    for item in items:
        exact = type(item) is tuple
        if (not exact and (isinstance(item, (str, bytes)) or not isinstance(item, Sequence))) or len(item) not in (
            3,
            4,
        ):
            raise TypeError(f"each item must be a (key, owner, ttl_ms[, fence]) tuple, not {item!r}")
        key, owner, ttl = validate_key(item[0]), validate_owner(item[1]), validate_ttl_ms(item[2])
        fence = validate_fence(item[3]) if len(item) == 4 and item[3] is not None else None
        if key in seen:
            raise ValueError(f"key {key!r} appears twice in one batch renewal")
        seen.add(key)
        checked.append((key, owner, ttl, fence))
    return checked


# -- The providers' holding shortcuts ------------------------------------------------------------
# ``provider.hold(...)`` is ``hold(provider, ...)`` of the holding layer, which sits above the
# providers: it registers its functions here when imported (``import sql_lease`` imports it), so
# no provider imports the layer above it.

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

_holding: dict[tuple[str, str], Callable[..., Any]] = {}


def provide_holding(face: str, **functions: Callable[..., Any]) -> None:
    """The holding layer's functions (``hold``, ``acquire_lease_wait``) of ``face`` ("async" or
    "sync") that the providers' shortcut methods call; called by :mod:`sql_lease.holding`."""
    _holding.update({(face, name): function for name, function in functions.items()})


class HoldingShortcut(Generic[P, R]):
    """A provider method calling the holding layer's function of the same name with the provider
    first (registered by :func:`provide_holding`). ``RuntimeError`` if the layer is not imported."""

    __slots__ = ("_face", "_name")

    def __init__(self, face: str, name: str) -> None:
        self._face, self._name = face, name

    @overload
    def __get__(self, obj: None, owner: type[Any] | None = None) -> HoldingShortcut[P, R]: ...

    @overload
    def __get__(self, obj: object, owner: type[Any] | None = None) -> Callable[P, R]: ...

    def __get__(self, obj: object, owner: type[Any] | None = None) -> Any:
        if obj is None:
            return self
        try:
            function = _holding[self._face, self._name]
        except KeyError:
            raise RuntimeError(f"sql_lease.holding is not imported: {self._name}() is not available") from None
        return functools.partial(function, obj)


def _shortcut_to(make: Callable[Concatenate[Any, P], T], finish: Callable[[T], R]) -> HoldingShortcut[P, R]:
    """For the type checker: the shortcut to the function made by the holding layer's
    ``shortcut(make, finish)``: ``make``'s parameters after the provider, ``finish``'s result."""
    raise NotImplementedError


def _shortcuts(face: str) -> tuple[HoldingShortcut[..., Any], HoldingShortcut[..., Any], HoldingShortcut[..., Any]]:
    return HoldingShortcut(face, "hold"), HoldingShortcut(face, "acquire_lease_wait"), HoldingShortcut(face, "hold_all")


class LeaseProviderBase:
    """The holding shortcuts of the bundled asyncio providers: ``provider.hold(key, ...)`` is
    :func:`sql_lease.hold` ``(provider, key, ...)``, ``provider.hold_all(keys, ...)`` is
    :func:`sql_lease.hold_all` ``(provider, keys, ...)`` and ``await provider.acquire_lease_wait(key,
    owner, ttl_ms, ...)`` is :func:`sql_lease.acquire_lease_wait` ``(provider, ...)``."""

    if TYPE_CHECKING:
        hold = _shortcut_to(_aio.HeldLease, _rules.itself)
        acquire_lease_wait = _shortcut_to(_aio.AsyncWaitingAcquire, _aio.AsyncWaitingAcquire.result)
        hold_all = _shortcut_to(_aio.HeldLeases, _rules.itself)
    else:
        hold, acquire_lease_wait, hold_all = _shortcuts("async")


class SyncLeaseProviderBase:
    """The holding shortcuts of the bundled synchronous providers: ``provider.hold(key, ...)``,
    ``provider.hold_all(keys, ...)`` and ``provider.acquire_lease_wait(key, owner, ttl_ms, ...)`` are
    those of :mod:`sql_lease.sync_holding` with the provider first.

    ``accepts_timeout_s``: every lease method of the subclass takes a keyword ``timeout_s``
    (seconds) that bounds that one call; holding uses it to keep its deadlines.
    """

    accepts_timeout_s = True
    if TYPE_CHECKING:
        hold = _shortcut_to(_threads.SyncHeldLease, _rules.itself)
        acquire_lease_wait = _shortcut_to(_threads.ThreadWaitingAcquire, _threads.ThreadWaitingAcquire.result)
        hold_all = _shortcut_to(_threads.SyncHeldLeases, _rules.itself)
    else:
        hold, acquire_lease_wait, hold_all = _shortcuts("sync")
