"""The rules of holding a lease, without I/O: one source for both faces of ``hold()``.

The asyncio face (:mod:`sql_lease.holding.aio`) and the thread face
(:mod:`sql_lease.holding.threads`) drive these objects and add only their waiting primitive (an
event loop or threads) and their calls to the provider. Here: option validation; a hold's state
machine (when to renew, when the lease is lost, what a renewal answer, a late answer, a transfer
or an error does to it: :class:`HoldRules`, :class:`RenewalCourse`); the waiting acquire's
decisions (how long to wait next, when to give up, from the durations the database reports:
:class:`WaitingAcquire`); and the registry of this process's holds (:class:`HoldRegistry`).
Times are the face's monotonic clock, in seconds; nothing here reads a wall clock, sleeps or
blocks (a registry's lock is given by its face).
"""

from __future__ import annotations

import difflib
import inspect
import logging
import os
import random
import socket
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, suppress
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Generic, ParamSpec, Protocol, Self, TypeVar, cast

from .. import observe
from ..contract import (
    MAX_SECONDS,
    AcquireResult,
    LeaseInfo,
    encode_data,
    validate_key,
    validate_keys,
    validate_limit,
    validate_min_hold_ms,
    validate_owner,
    validate_seconds,
    validate_ttl_ms,
)
from ..errors import (
    LeaseBackendError,
    LeaseConfigError,
    LeaseError,
    LeaseLostError,
    LeaseNotAcquiredError,
    ProviderClosedError,
    SchemaMissingError,
)
from ..sql import forks

log = logging.getLogger("sql_lease")

LOSS_MARGIN = 0.1
"""``hold()`` declares a lease lost this fraction of its TTL before its last known expiry."""

JITTER_S = 0.05
"""A renewal late by less than this (seconds) was delayed by scheduling, not by a blocked loop."""

MAX_RENEW_FRACTION = 0.75
"""The longest accepted ``renew_every_ms``, as a fraction of the TTL: the first renewal is due then
and has until ``1 - LOSS_MARGIN`` of the TTL to succeed, retries included."""

ATTEMPT_GRACE_S = 1.0
"""A waiting acquire's attempt may run this many seconds past the deadline (a release in the last
pause is still seen; a stalled network costs at most this much more than ``timeout_s``)."""

RENEW_BATCH_SIZE = 1000
"""``hold()`` blocks renewing through one batcher send at most this many leases per statement."""

EXPIRED = "no renewal succeeded before the lease expired"

NOTHING_TAKEN = (LeaseNotAcquiredError, LeaseConfigError, SchemaMissingError, ProviderClosedError)
"""Errors of an acquire after which nothing can have been acquired (no release is needed)."""

NO_ANSWER = object()
"""A renewal's answer when its statement had not answered by the lease's deadline."""

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")
ProviderT = TypeVar("ProviderT")
OnLostT = TypeVar("OnLostT")


def new_owner_id() -> str:
    """A unique owner id: ``host:pid:random``, readable in ``get_lease_owner`` output."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def data_kw(data: object) -> dict[str, Any]:
    """``{"data": data}`` when lease data was given, else nothing: providers without ``data`` still serve."""
    return {} if data is None else {"data": data}


def timeout_kw(provider: Any, flag: str, timeout_s: float | None) -> dict[str, float]:
    """``{"timeout_s": ...}`` for a provider whose class sets ``flag`` (its calls take a per-call
    limit), kept within what a call takes (1 ms to :data:`~sql_lease.contract.MAX_SECONDS`)."""
    if timeout_s is None or not getattr(provider, flag, False):
        return {}
    return {"timeout_s": min(max(0.001, timeout_s), MAX_SECONDS)}


def takes_fence(provider: Any) -> bool:
    """Whether ``provider``'s release, renewals and transfer take ``fence`` (and release
    ``min_hold_ms``): its class says so with ``accepts_fence = True``; third-party providers need not.
    Looked up on the class, as ``renewal_method`` does: a wrapper that forwards attributes to such
    a provider does not take them itself."""
    return getattr(type(provider), "accepts_fence", False) is True


def fence_kw(provider: Any, fence: int | None) -> dict[str, Any]:
    """``{"fence": fence}`` for a provider that takes it and a known fence, else nothing: every
    release, renewal and transfer of a hold acts only on its own tenure where the provider can say so."""
    return {"fence": fence} if fence is not None and takes_fence(provider) else {}


def validate_min_hold(provider: Any, min_hold_ms: object) -> float | None:
    """A hold's ``min_hold_ms`` (None: none), checked; ``TypeError`` also for a provider whose
    ``release_lease`` does not take it (the hold would end without it)."""
    if min_hold_ms is None:
        return None
    checked = validate_min_hold_ms(min_hold_ms)
    if not takes_fence(provider):
        raise TypeError(
            f"min_hold_ms needs a provider whose release_lease takes it; {type(provider).__name__} does not"
        )
    return checked


def validate_hold_limit(provider: Any, limit: object) -> int:
    """A hold's or waiting acquire's semaphore ``limit`` (1: a plain lease), checked
    (:func:`~sql_lease.contract.validate_limit`); ``TypeError`` also for ``limit`` > 1 with a provider
    whose class does not say ``accepts_limit = True`` (naming it), before anything is sent."""
    checked = validate_limit(limit)
    if checked != 1 and getattr(type(provider), "accepts_limit", False) is not True:
        raise TypeError(
            f"limit={checked} needs a provider whose acquire_lease takes it (accepts_limit); "
            f"{type(provider).__name__} does not"
        )
    return checked


def limit_kw(limit: int) -> dict[str, int]:
    """``{"limit": limit}`` for a semaphore, nothing for a plain lease: providers without ``limit`` serve."""
    return {} if limit == 1 else {"limit": limit}


def validate_timeout_s(timeout_s: object) -> float | None:
    """A wait's ``timeout_s`` in seconds (None: no limit); ``TypeError``/``ValueError`` else."""
    return None if timeout_s is None else validate_seconds(timeout_s, "timeout_s")


def validate_wait(wait: object, timeout_s: object, how: str = "wait=True") -> tuple[bool, float | None]:
    """Whether to wait, and the wait's ``timeout_s`` in seconds (None: no limit); ``ValueError`` for
    a ``timeout_s`` without a wait (``how`` names the option that waits): it would be ignored."""
    if timeout_s is not None and not wait:
        raise ValueError(f"timeout_s goes with {how}: without it the acquire is tried once and refused at once")
    return bool(wait), validate_timeout_s(timeout_s)


def validate_hold_options(
    ttl_ms: object, renew_every_ms: object, timeout_s: object
) -> tuple[float, float, float | None]:
    """``hold()``'s numbers, checked as both faces (asyncio and threads) check them: the TTL and
    the renewal interval in milliseconds (default TTL/3, at most ``MAX_RENEW_FRACTION`` of the TTL)
    and the wait's ``timeout_s`` in seconds (None: no limit). ``TypeError``/``ValueError`` else."""
    ttl = validate_ttl_ms(ttl_ms)
    every = ttl / 3 if renew_every_ms is None else validate_ttl_ms(renew_every_ms, "renew_every_ms")
    longest = ttl * MAX_RENEW_FRACTION
    if every > longest:
        raise ValueError(
            f"renew_every_ms ({every:g}) must be at most {longest:g} ms ({MAX_RENEW_FRACTION:.0%} "
            f"of ttl_ms): loss is declared {LOSS_MARGIN:.0%} of the TTL before expiry, and the first renewal "
            "needs time to answer and to be retried before that"
        )
    return ttl, every, validate_timeout_s(timeout_s)


def seconds_left(result: AcquireResult) -> float | None:
    """The holder's remaining TTL in seconds as the provider measured it, if it said."""
    return None if result.remaining_ms is None else max(0.0, result.remaining_ms / 1000)


def shortcut(make: Callable[P, T], finish: Callable[[T], R], name: str, doc: str) -> Callable[P, R]:
    """A public function named ``name`` taking ``make``'s parameters (spelt out once, on
    ``make``): ``finish(make(...))``. Each face makes its ``hold()`` and ``acquire_lease_wait()``
    so, from the one signature its classes declare."""

    signature = inspect.signature(make).replace(return_annotation=inspect.Signature.empty)

    def making(args: Any, kwargs: Any) -> T:
        try:
            return make(*args, **kwargs)
        except TypeError:
            _explain_call(name, signature, args, kwargs)  # a call that does not fit: said in ``name``'s terms
            raise

    def made(*args: P.args, **kwargs: P.kwargs) -> R:
        return finish(making(args, kwargs))

    async def made_async(*args: P.args, **kwargs: P.kwargs) -> Any:
        return await finish(making(args, kwargs))  # type: ignore[misc]

    if inspect.iscoroutinefunction(finish):  # a coroutine function to inspect too, as ``async def`` was
        made = cast("Callable[P, R]", made_async)
    made.__signature__ = signature  # type: ignore[attr-defined]  # help() and editors show make's parameters
    made.__name__ = made.__qualname__ = name
    made.__doc__ = doc
    made.__module__ = getattr(make, "__module__", __name__)
    return made


def _explain_call(name: str, signature: inspect.Signature, args: Any, kwargs: Any) -> None:
    """``TypeError`` naming ``name`` (not the class behind it) if the arguments do not fit
    ``signature``, with the parameter a misspelt keyword most likely meant; nothing if they fit."""
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        unknown = [keyword for keyword in kwargs if keyword not in signature.parameters]
        if not unknown:
            raise TypeError(f"{name}() {exc}") from None
        close = difflib.get_close_matches(unknown[0], list(signature.parameters), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise TypeError(f"{name}() got an unexpected keyword argument {unknown[0]!r}{hint}") from None


def itself(value: T) -> T:
    """``value``: a ``shortcut`` that returns what it made."""
    return value


def renewal_method(provider: Any) -> tuple[Callable[..., Any], bool]:
    """The provider's renewal call, and whether it answers with a ``LeaseInfo`` (``renew_lease_info``)."""
    # Looked up on the class: a wrapper that forwards attributes must not bypass its renew_lease.
    if callable(getattr(type(provider), "renew_lease_info", None)):
        return provider.renew_lease_info, True
    return provider.renew_lease, False


def renewal_answer(raw: object, with_info: bool) -> LeaseInfo | bool:
    """A renewal call's answer as the rules read it: the renewed ``LeaseInfo``, or True/False."""
    if with_info:
        return False if raw is None else raw  # type: ignore[return-value]
    return bool(raw)


def distinct_key_chunks(holders: Iterable[tuple[str, str]]) -> Iterator[list[tuple[str, str]]]:
    """``holders`` (key, owner) in chunks of at most ``RENEW_BATCH_SIZE`` with distinct keys: a
    second owner of a key (rare) goes in a later chunk."""
    rest = list(holders)
    while rest:
        keys: set[str] = set()
        first, repeats = [], []
        for holder in rest:
            if holder[0] in keys:
                repeats.append(holder)
            else:
                keys.add(holder[0])
                first.append(holder)
        for start in range(0, len(first), RENEW_BATCH_SIZE):
            yield first[start : start + RENEW_BATCH_SIZE]
        rest = repeats


class WaitingAcquire(Generic[ProviderT]):
    """One waiting acquire's arguments and decisions, by both faces' ``acquire_lease_wait``: when
    an attempt must have answered, how long to wait after a refusal (jittered backoff, or the
    listening pause, never past the holder's expiry as the database reports it in ``remaining_ms``,
    nor past the deadline), and when to give up. Times are the face's monotonic clock (seconds).

    Arguments are checked when it is made (``TypeError``/``ValueError``, before any call).
    """

    def __init__(
        self,
        provider: ProviderT,
        key: str,
        owner: str,
        ttl_ms: int | float,
        timeout_s: float | None = None,
        *,
        poll_initial_s: float = 0.02,
        poll_max_s: float = 1.0,
        listen_max_wait_s: float = 5.0,
        data: dict[str, Any] | None = None,
        limit: int = 1,
    ) -> None:
        checked_limit = validate_hold_limit(provider, limit)
        self.provider = provider
        self.key, self.owner = validate_key(key), validate_owner(owner)
        validate_ttl_ms(ttl_ms), encode_data(data)
        self.ttl_ms, self.given = ttl_ms, {**data_kw(data), **limit_kw(checked_limit)}
        self.limit = validate_timeout_s(timeout_s)
        self.delay, self.poll_max_s, self.listen_max_wait_s = poll_initial_s, poll_max_s, listen_max_wait_s
        self.started = 0.0
        self.deadline: float | None = None

    def start(self, now: float) -> None:
        """The wait starts at ``now``: its deadline is ``timeout_s`` from then."""
        self.started = now
        self.deadline = None if self.limit is None else now + self.limit

    def waiter(self, polling: Callable[[Any, str], T]) -> T:
        """The provider's wake-up hook for the key (``release_waiter``), else a ``polling`` one."""
        hook = getattr(self.provider, "release_waiter", None)
        return (hook(self.key) if callable(hook) else None) or polling(self.provider, self.key)  # type: ignore[no-any-return]

    def attempt_end(self, now: float) -> float | None:
        """By when an attempt sent at ``now`` must answer: the deadline plus ``ATTEMPT_GRACE_S``
        (None: no limit)."""
        return None if self.deadline is None else max(self.deadline, now) + ATTEMPT_GRACE_S

    def attempt_limit(self, now: float) -> float | None:
        """The time limit in seconds of an attempt sent at ``now``: until :meth:`attempt_end`, at most
        what one call takes (:data:`~sql_lease.contract.MAX_SECONDS`); None: no limit."""
        end = self.attempt_end(now)
        return None if end is None else min(end - now, MAX_SECONDS)

    def not_acquired(self, result: AcquireResult, now: float) -> LeaseNotAcquiredError:
        """The error naming the holder, for a wait given up at ``now``."""
        return LeaseNotAcquiredError(
            self.key, result.owner, result.fence, result.expires_at, waited_s=now - self.started
        )

    def pause(self, result: AcquireResult, now: float, listening: bool) -> float:
        """Seconds to wait after the refusal ``result`` answered at ``now``; raises
        ``LeaseNotAcquiredError`` (naming the holder) once the deadline has passed."""
        deadline = self.deadline
        if deadline is not None and now >= deadline:
            raise self.not_acquired(result, now)
        if listening:
            pause = self.listen_max_wait_s
        else:
            pause = self.delay * random.uniform(0.5, 1.0)
            self.delay = min(self.delay * 2, self.poll_max_s)
        until_expiry = seconds_left(result)
        if until_expiry is not None:
            pause = min(pause, until_expiry + 0.001)
        if deadline is not None:
            pause = min(pause, deadline - now)
        return max(0.0, pause)


@dataclass(frozen=True, slots=True)
class Handoff:
    """A transfer that moved ``key`` to ``owner`` for ``ttl_ms`` milliseconds: its statement was
    sent at ``sent`` (the face's monotonic clock, seconds), from a tenure with fencing token
    ``from_fence`` (None: unknown). A hold of ``owner`` adopts it (``HoldRules.adopting``) instead
    of acquiring again: an acquire by the current owner succeeds, even on a later tenure of that
    owner taken after this one expired."""

    key: str
    owner: str
    ttl_ms: float
    sent: float
    from_fence: int | None = None


class LateAcquireError(LeaseNotAcquiredError):
    """The lease was taken (or handed on) but the answer came at or after its local deadline
    (``LOSS_MARGIN`` of the TTL before its expiry, counted from when the statement was sent): the
    body never ran, as if the lease had not been acquired."""

    def __init__(self, key: str, what: str, late_s: float) -> None:
        super().__init__(key, None)
        self.what, self.late_s = what, late_s

    def __str__(self) -> str:
        return (
            f"lease {self.key!r} not acquired: {self.what} answered {self.late_s:.2f} s past the lease's "
            "deadline (a stalled network or a paused process; the TTL may be too short)"
        )


class _Hold(Protocol):
    @property
    def provider(self) -> Any: ...
    @property
    def key(self) -> str: ...
    @property
    def owner(self) -> str: ...
    @property
    def lost(self) -> Any: ...
    @property
    def transferred_to(self) -> str | None: ...
    @property
    def ttl_ms(self) -> float: ...


_H = TypeVar("_H", bound=_Hold)


class HoldRegistry(Generic[_H]):
    """The ``hold()`` blocks of this process per provider and (key, owner), safe to use from any
    thread (under ``lock``, the face's): nested holds of one owner keep the lease until the
    outermost exits, and every renewal uses the longest TTL among them. A provider that is not
    weak-referenceable is not tracked."""

    def __init__(self, lock: AbstractContextManager[Any]) -> None:
        self._lock = lock
        self._holds: weakref.WeakKeyDictionary[Any, dict[tuple[str, str], list[_H]]] = weakref.WeakKeyDictionary()

    def holds_of(self, provider: Any, key: str, owner: str) -> list[_H]:
        """The holds of ``key`` as ``owner`` on ``provider`` (a copy)."""
        with self._lock:
            try:
                return list(self._holds.get(provider, {}).get((key, owner), []))
            except TypeError:  # not weak-referenceable: nested holds cannot be recognised
                return []

    def longest_ttls(self, provider: Any, holders: Iterable[tuple[str, str]]) -> dict[tuple[str, str], float]:
        """The longest ``ttl_ms`` among the holds of each (key, owner) of ``holders`` on
        ``provider`` (one lookup for a whole batch; holders without holds are left out)."""
        with self._lock:
            try:
                by_key = self._holds.get(provider) or {}
            except TypeError:
                return {}
            longest: dict[tuple[str, str], float] = {}
            for holder in holders:
                holds = by_key.get(holder)
                if holds:
                    longest[holder] = holds[0].ttl_ms if len(holds) == 1 else max(h.ttl_ms for h in holds)
            return longest

    def longest_ttl(self, lease: _H) -> float:
        """``lease.ttl_ms``, or the longest ``ttl_ms`` among the holds of its (provider, key, owner)."""
        holder = (lease.key, lease.owner)
        return max(lease.ttl_ms, self.longest_ttls(lease.provider, (holder,)).get(holder, lease.ttl_ms))

    def add(self, lease: _H) -> None:
        with self._lock, suppress(TypeError):  # not weak-referenceable: not tracked
            self._holds.setdefault(lease.provider, {}).setdefault((lease.key, lease.owner), []).append(lease)

    def held_count(self) -> int:
        """How many (provider, key, owner) have a hold whose lease is neither lost nor transferred."""
        with self._lock:
            groups = [holds for by_key in self._holds.values() for holds in by_key.values()]
            return sum(any(not h.lost.is_set() and h.transferred_to is None for h in holds) for holds in groups)

    def forget(self, lease: _H) -> int:
        """Remove ``lease`` from the holds of its (provider, key, owner); how many remain."""
        with self._lock:
            try:
                by_key = self._holds.get(lease.provider)
            except TypeError:
                return 0
            if by_key is None:
                return 0
            holds = by_key.get((lease.key, lease.owner), [])
            if lease in holds:
                holds.remove(lease)
            if not holds:
                by_key.pop((lease.key, lease.owner), None)
            return len(holds)


class RenewalCourse:
    """What a renewer does after each renewal, shared by ``hold()``'s asyncio renewers (one lease
    at a time, or batched) and its thread renewer: retry with backoff until the lease's deadline,
    declare the loss with its true reason, or count the lease valid again and schedule the next
    renewal from when this one was sent. Times are the caller's monotonic clock, in seconds."""

    __slots__ = ("backoff", "interval", "lease")

    def __init__(self, lease: HoldRules[Any, Any], interval: float) -> None:
        self.lease = lease
        self.interval = interval
        self.backoff = min(0.05, interval)
        lease._last_error = None

    def turn(self, due: float, now: float) -> tuple[str, float] | None:
        """A renewal due at ``due`` may be sent at ``now``: its late note and the lease's deadline
        (when to stop waiting for its answer), or None when there is nothing to renew (the lease
        lost or transferred) or it is too late (the loss is then declared, with how late)."""
        lease = self.lease
        if lease._finished():
            return None
        late = lease._late(now - due)
        deadline = lease._deadline
        if now >= deadline:  # woke too late (a blocked loop or thread, or the last retry's turn)
            self.lose_too_late(late)
            return None
        return late, deadline

    def lose_too_late(self, late: str) -> None:
        """The renewal's turn came at or after the deadline: the loss, with why."""
        self.lease._declare_lost(self.lease._expired_reason(late))

    def no_answer(self) -> None:
        lease = self.lease
        lease._last_error = lease._last_error or "the database did not answer in time"
        if observe.observers:
            observe.renewal_failed(lease, None)

    def failed(self, exc: BaseException) -> None:
        lease = self.lease
        lease._last_error = f"{type(exc).__name__}: {exc}"
        if observe.observers:
            observe.renewal_failed(lease, exc)
        if not isinstance(exc, LeaseError):
            lease._log("renewing", " raised an unexpected error: %r", exc)

    def judge(self, answer: object, now: float, sent: float, deadline: float, late: str) -> float | None:
        """A renewal sent at ``sent`` answered ``answer`` by ``now``: a ``LeaseInfo`` or True
        (renewed), False (refused), ``NO_ANSWER`` (none by the deadline) or the exception it
        raised. Returns when to renew next, or None once the lease was declared lost."""
        if answer is NO_ANSWER:
            self.no_answer()
            return self.after(None, now, sent, deadline, late)
        if isinstance(answer, BaseException):
            self.failed(answer)
            return self.after(None, now, sent, deadline, late)
        return self.after(answer, now, sent, deadline, late)  # type: ignore[arg-type]

    def after(
        self, renewed: LeaseInfo | bool | None, now: float, sent: float, deadline: float, late: str
    ) -> float | None:
        """``renewed``: the answer (None when there was none, after ``no_answer``/``failed``).
        Returns when to renew next, or None once the lease was declared lost."""
        lease = self.lease
        if renewed is None:
            if now >= deadline:
                self.lose_too_late(late)
                return None
            lease._log("renewing", " failed, retrying: %s", lease._last_error, level=logging.WARNING)
            next_at = now + min(self.backoff, max(0.0, deadline - now))
            self.backoff = min(self.backoff * 2, self.interval)
            return next_at
        if renewed is False:
            lease._declare_lost(f"renewal refused: the lease expired or another owner holds it{late}")
            return None
        if isinstance(renewed, LeaseInfo) and None not in (renewed.fence, lease.fence) and renewed.fence != lease.fence:
            lease._declare_lost(f"the renewal found another tenure of this owner (fence {renewed.fence}){late}")
            return None
        lease._renewed(renewed, sent)
        self.backoff = min(0.05, self.interval)
        return sent + self.interval


class HoldRules(Generic[ProviderT, OnLostT]):
    """A held lease's state and the rules both faces of ``hold()`` (``HeldLease``, asyncio;
    ``SyncHeldLease``, threads) judge it by, in one place. Times are the face's monotonic clock
    (``_clock``), in seconds. The lease is surely ours up to ``_valid_until`` (when the last
    successful acquire or renewal was sent, plus the TTL); its loss is declared at the *deadline*,
    ``LOSS_MARGIN`` of the TTL before that, by the clock alone: whether a renewal or transfer
    statement has returned does not matter.

    A face gives its clock, its ``lost`` event, its registry and how a loss is declared."""

    stall_cause = "the event loop was blocked"
    """What delays a renewal by more than scheduling jitter on this face."""
    default_on_lost = "cancel"
    _registry: HoldRegistry[Any]
    lost: Any

    def __init__(
        self,
        provider: ProviderT,
        key: str,
        owner: str | None = None,
        ttl_ms: int | float = 15_000,
        *,
        renew_every_ms: int | float | None = None,
        wait: bool = False,
        timeout_s: float | None = None,
        on_lost: OnLostT | None = None,
        data: dict[str, Any] | None = None,
        min_hold_ms: int | float | None = None,
        limit: int = 1,
    ) -> None:
        """``ttl_ms``/``renew_every_ms``/``min_hold_ms`` in milliseconds, ``timeout_s`` in seconds
        (None: no limit); ``on_lost`` None: the face's default; ``limit``: a semaphore's (1: a
        plain lease). ``TypeError``/``ValueError`` on bad input."""
        self.limit = validate_hold_limit(provider, limit)
        self.provider = provider
        encode_data(data)
        self.data = data
        self.min_hold_ms = validate_min_hold(provider, min_hold_ms)
        self.key = validate_key(key)
        self.owner = validate_owner(owner) if owner is not None else new_owner_id()
        self.ttl_ms, self.renew_every_ms, self.timeout_s = validate_hold_options(ttl_ms, renew_every_ms, timeout_s)
        self.on_lost: str = self._accept_on_lost(self.default_on_lost if on_lost is None else on_lost)
        self.wait = validate_wait(wait, timeout_s)[0]
        self.fence: int | None = None
        self.expires_at: datetime | None = None
        self.lost_reason: str | None = None
        self.transferred_to: str | None = None
        self.released: bool | None = None  # the answer of the release at the block's end
        self._valid_until = 0.0  # the clock up to which the lease is surely still ours
        self._acquired_at = 0.0  # when the successful acquire was sent
        self._acquired_expiry: datetime | None = None
        self._last_error: str | None = None  # the last failed renewal's error, until one succeeds
        self._counted = False  # in the registry
        self.handoff: Handoff | None = None  # set by a transfer to another owner, for its hold
        self._handoff: Handoff | None = None  # a transfer to this owner to adopt instead of acquiring
        self._pid = os.getpid()  # the process that holds it; a forked child never acts as the holder
        self._generation = forks.generation  # asked at every renewal: no getpid() system call
        self._setup()

    def _accept_on_lost(self, on_lost: object) -> str:
        if on_lost not in ("cancel", "flag"):
            raise ValueError(f"on_lost must be 'cancel' or 'flag', not {on_lost!r}")
        return on_lost  # type: ignore[return-value]

    def _setup(self) -> None:
        """The face's own state (its locks, tasks or threads), made with the lease."""

    def _clock(self) -> float:
        raise NotImplementedError

    def _declare_lost(self, reason: str) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        state = (
            "lost"
            if self.lost.is_set()
            else f"transferred to {self.transferred_to!r}"
            if self.transferred_to
            else "held"
        )
        return f"<{type(self).__name__} {self.key!r} owner={self.owner!r} fence={self.fence} {state}>"

    def _log(self, doing: str, what: str, *args: object, level: int = logging.ERROR) -> None:
        """Log ``doing`` the lease (renewing, releasing) and ``what`` happened."""
        log.log(level, f"{doing} lease %r held by %r (fence %s){what}", self.key, self.owner, self.fence, *args)

    def _release_kw(self, *, ran: bool) -> dict[str, Any]:
        """The keywords of this hold's release: its own tenure's fence, and, once the body ``ran``,
        its minimum hold."""
        given = fence_kw(self.provider, self.fence)
        if ran and self.min_hold_ms is not None:
            given["min_hold_ms"] = self.min_hold_ms
        return given

    def _waiting(self, make: Callable[..., T]) -> T:
        """This hold's waiting acquire (``wait=True``), made by the face's class."""
        return make(
            self.provider, self.key, self.owner, self._call_ttl_ms, self.timeout_s, data=self.data, limit=self.limit
        )

    def _acquire_kw(self) -> dict[str, Any]:
        """The keywords of this hold's acquire: its data and its semaphore limit, where given."""
        return {**data_kw(self.data), **limit_kw(self.limit)}

    def _reader(self) -> Callable[..., Any] | None:
        """The call that reads back a handed tenure: ``get_lease_holders`` for a semaphore (the
        oldest holder may be another), else ``get_lease``; None when the provider has neither."""
        reader = getattr(self.provider, "get_lease_holders" if self.limit != 1 else "get_lease", None)
        return reader if callable(reader) else None

    def _renew_kw(self) -> dict[str, Any]:
        """The keywords of this hold's renewals and transfers: its own tenure's fence."""
        return fence_kw(self.provider, self.fence)

    def _release_failed(self, exc: BaseException) -> None:
        """A release raised: the lease expires by itself; the body's outcome is not masked."""
        self._log("releasing", " failed: %s", exc, level=logging.WARNING)

    def _lost_error(self) -> LeaseLostError:
        if self._in_child() and not self.lost_reason:
            return LeaseLostError(self.key, self.owner, f"held by process {self._pid}; this is a fork of it")
        return LeaseLostError(self.key, self.owner, self.lost_reason or "lost")

    def _announce_loss(self, reason: str) -> None:
        """After ``lost`` was set: log the loss and tell the observers."""
        log.warning("lease %r held by %r (fence %s) lost: %s", self.key, self.owner, self.fence, reason)
        if observe.observers:
            observe.lease_lost(self, reason)

    def _finished(self) -> bool:
        """Nothing left to renew or watch: the lease is lost or transferred, or this process is a
        fork of the holder (it never held it)."""
        return bool(self.lost.is_set()) or self.transferred_to is not None or self._in_child()

    @property
    def _call_ttl_ms(self) -> float:
        """The TTL of every acquire and renewal: the longest of this owner's holds of the key in
        this process, so no hold's renewal cuts short what another hold counts on."""
        return self._registry.longest_ttl(self)

    def _acquired(self, result: AcquireResult, sent: float) -> float:
        """The acquire sent at ``sent`` answered ``result``: hold it (``LeaseNotAcquiredError``
        naming the holder if refused). Returns when the first renewal is due."""
        if not result.acquired:
            raise LeaseNotAcquiredError(self.key, result.owner, result.fence, result.expires_at)
        self._registry.add(self)
        self._counted = True
        # The database set expires_at = (its time when it ran the statement) + TTL, and it ran it
        # after we sent it: counting the TTL from `sent` can only underestimate, the safe side.
        self._acquired_at, self._valid_until = sent, sent + self.ttl_ms / 1000
        self.fence, self.expires_at = result.fence, result.expires_at
        self._acquired_expiry = result.expires_at
        return sent + self.renew_every_ms / 1000  # from the acquire, not from when renewing starts

    def adopting(self, handoff: Handoff) -> Self:
        """This hold takes the tenure ``handoff`` moved to its owner instead of acquiring: its
        fencing token is read back (``get_lease``, else an acquire by the owner) and judged by the
        handoff's clock: the lease is ours for a TTL from when the transfer was sent, and an answer
        at or after the deadline raises ``LateAcquireError`` (a ``LeaseNotAcquiredError``) without
        releasing (the key may be a later tenure of the same owner by then). Returns the hold.
        ``ValueError`` when the handoff is of another key or owner, or shorter than ``ttl_ms``."""
        if handoff.key != self.key or handoff.owner != self.owner:
            raise ValueError(f"the handoff is of {handoff.key!r} to {handoff.owner!r}, not of this hold")
        if handoff.ttl_ms < self.ttl_ms:
            raise ValueError(f"the handoff's TTL ({handoff.ttl_ms:g} ms) is shorter than ttl_ms ({self.ttl_ms:g})")
        self._handoff = handoff
        return self

    def _handoff_window(self, now: float) -> float:
        """Seconds left, at ``now``, to read back the handed tenure (<= 0: too late already)."""
        assert self._handoff is not None
        return self._handoff.sent + self.ttl_ms / 1000 * (1 - LOSS_MARGIN) - now

    def _adopted(self, found: LeaseInfo | AcquireResult | list[LeaseInfo] | None, answered: float) -> float:
        """The read-back of the handed tenure, answered at ``answered``: hold it, its lease counted
        from when the transfer was sent. ``LeaseNotAcquiredError`` (nothing to release) when it
        answered past the deadline, names another owner, or is not a later tenure than the one
        handed on. Returns when the first renewal is due."""
        handoff = self._handoff
        assert handoff is not None
        if isinstance(found, list):  # every holder: this owner's slot, else the oldest
            found = next((h for h in found if h.owner == self.owner), found[0] if found else None)
        late = -self._handoff_window(answered)
        if late >= 0:
            raise LateAcquireError(self.key, "the transfer to this owner", late)
        taken = getattr(found, "acquired", True) and not getattr(found, "released", False)
        if found is None or found.owner != self.owner or not taken:
            raise LeaseNotAcquiredError(
                self.key, *((found.owner, found.fence, found.expires_at) if found is not None else (None,))
            )
        if handoff.from_fence is not None and found.fence is not None and found.fence <= handoff.from_fence:
            raise LeaseNotAcquiredError(self.key, found.owner, found.fence, found.expires_at)
        result = AcquireResult(True, found.owner, found.fence, found.expires_at, found.remaining_ms)
        return self._acquired(result, handoff.sent)

    def _entered_late(self) -> LateAcquireError | None:
        """After ``_acquired``: the error to raise when the acquire answered at or after the
        lease's deadline (the body must not start on a lease about to be declared lost)."""
        late = self._clock() - self._deadline
        return LateAcquireError(self.key, "the acquire", late) if late >= 0 else None

    def _in_child(self) -> bool:
        """True in a process forked while the lease was held: it never held it (no renewal, no
        release)."""
        return forks.generation != self._generation

    def _renewed(self, renewed: LeaseInfo | bool, sent: float) -> None:
        """A renewal sent at ``sent`` succeeded (``renewed``: its ``LeaseInfo``, or True): the
        lease is surely ours for a TTL from then, and ``expires_at`` follows the database."""
        self._valid_until = sent + self.ttl_ms / 1000
        if isinstance(renewed, LeaseInfo):
            self.expires_at = renewed.expires_at
        elif self._acquired_expiry is not None:  # the database's expiry, moved on by elapsed time
            self.expires_at = self._acquired_expiry + timedelta(seconds=sent - self._acquired_at)
        self._last_error = None

    def _kept_by_another(self) -> bool:
        """Another ``hold()`` of this owner holds the key here: an acquire that failed must not
        release what it keeps."""
        return bool(self._registry.holds_of(self.provider, self.key, self.owner))

    def _leave(self) -> bool:
        """The block ends: out of the registry. True when this hold must release the lease (it was
        not transferred, and no outer ``hold()`` of this owner keeps it)."""
        if not self._counted:
            return False
        self._counted = False
        left = self._registry.forget(self)
        return self.transferred_to is None and left == 0

    def _release_limit_s(self) -> float | None:
        """Seconds the release may take: a doomed release must not outlast the lease it could
        free (once lost); None: the provider's own limit."""
        return max(0.05, self._valid_until - self._clock()) if self.lost.is_set() else None

    def _released(self, answer: object) -> None:
        """The release at the block's end answered ``answer`` (False: the tenure had already ended)."""
        self.released = answer if isinstance(answer, bool) else None

    def _exit_loss(self, exc_type: type[BaseException] | None) -> None:
        """Leaving the block after a loss raises ``LeaseLostError`` unless ``on_lost="flag"`` or
        the body raised."""
        if self.lost.is_set() and self.on_lost != "flag" and exc_type is None:
            raise self._lost_error()

    @property
    def _margin_s(self) -> float:
        """Loss is declared this long before the last known expiry, so the body stops in time."""
        return self.ttl_ms / 1000 * LOSS_MARGIN

    @property
    def _deadline(self) -> float:
        """When (``_clock()``) the loss is declared unless a renewal succeeds first."""
        return self._valid_until - self._margin_s

    def _past_deadline(self, late_note: str = "") -> bool:
        """Declare the loss if the deadline has passed by the clock now; True once lost, and in a
        fork of the holder (which never held it: nothing is declared there)."""
        if self._in_child():
            return True
        if (
            not self.lost.is_set()
            and self.transferred_to is None
            and self.fence is not None
            and self._clock() >= self._deadline
        ):
            self._declare_lost(self._expired_reason(late_note))
        return bool(self.lost.is_set())

    def _noticed(self, late_s: float) -> None:
        """A watch noticed ``late_s`` seconds after the deadline that it had passed: the loss."""
        note = f" (noticed {late_s:.2f} s after its deadline: {self.stall_cause})" if late_s >= JITTER_S else ""
        self._past_deadline(note)

    def _expired_reason(self, late_note: str) -> str:
        """Why a lease whose deadline passed is lost: how late its renewer or judge ran (a
        ``_late`` note), else the last renewal's error."""
        if late_note:
            cause = late_note.strip(" ()")
        else:
            cause = f"last error: {self._last_error}" if self._last_error else "no renewal answered in time"
        return f"{EXPIRED} ({cause})"

    def check(self) -> None:
        """Raise ``LeaseLostError`` if the lease is lost: a renewal was refused, or the local
        deadline (the last known expiry less 10% of the TTL, by this process's monotonic clock)
        has passed, judged when called, even if no renewer has run since (a blocked event loop, a
        renewal or transfer statement that hangs). Returns None while the lease is held, and
        after it was transferred (``valid`` is then False)."""
        if self._past_deadline():
            raise self._lost_error()

    @property
    def valid(self) -> bool:
        """True while this holder may act as the owner: acquired, neither lost nor transferred,
        and the local deadline not passed (judged by the clock when read, as :meth:`check`; reading
        it past the deadline declares the loss). Ask it, or call ``check()``, before a side effect."""
        return not self._past_deadline() and self.transferred_to is None and self.fence is not None

    def _late(self, late_s: float) -> str:
        """The note a reason gets when a renewal ran ``late_s`` seconds late: ``stall_cause``, or,
        when late by no more than scheduling jitter, a TTL too short to renew in."""
        if late_s <= self._margin_s:
            return ""
        if late_s < JITTER_S:
            return f" (the renewal ran {late_s:.3f} s late: a TTL of {self.ttl_ms:g} ms is too short to renew in)"
        return f" (the renewal ran {late_s:.2f} s late: {self.stall_cause})"

    def _transfer_ttl(self, next_owner: str, ttl_ms: object, data: object) -> float:
        """A transfer's arguments checked (``TypeError``/``ValueError``); its TTL in milliseconds
        (default: this lease's)."""
        validate_owner(next_owner, "next_owner"), encode_data(data)
        return self.ttl_ms if ttl_ms is None else validate_ttl_ms(ttl_ms)

    def _transfer_window(self) -> float | None:
        """Seconds a transfer may take (it is bounded by the deadline), or None when there is
        nothing to hand on: transferred already, or the deadline has passed (the loss is then
        declared)."""
        if self.transferred_to is not None or self._past_deadline():
            return None
        return self._deadline - self._clock()

    def _transferred(self, moved: bool, next_owner: str, ttl_ms: float, sent: float) -> bool:
        """A transfer (``ttl_ms``, sent at ``sent``) answered: on success to another owner this
        holder stops renewing, and ``handoff`` is what a hold of ``next_owner`` adopts."""
        if moved and next_owner != self.owner:
            self.transferred_to = next_owner
            self.handoff = Handoff(self.key, next_owner, ttl_ms, sent, self.fence)
        return moved

    def _transfer_failed(self, next_owner: str, exc: BaseException) -> None:
        """A transfer raised: a database failure leaves its outcome unknown (``next_owner`` may
        hold the lease), so the lease is lost to this holder (declared now)."""
        if isinstance(exc, LeaseBackendError) and not self.lost.is_set():
            self._declare_lost(f"the transfer to {next_owner!r} failed, its outcome unknown: {exc}")

    def _transfer_unanswered(self, next_owner: str) -> LeaseBackendError:
        """A transfer had no answer by the deadline: ``next_owner`` may hold the lease, so it is
        lost to this holder (declared now); the error to raise."""
        if not self.lost.is_set():
            self._declare_lost(
                f"the transfer to {next_owner!r} had no answer by the lease's deadline (its outcome is unknown)"
            )
        return LeaseBackendError(
            f"transferring lease {self.key!r} to {next_owner!r}: no answer by the lease's deadline; its outcome "
            "is unknown, and the lease is declared lost"
        )


W = TypeVar("W", bound=HoldRules[Any, Any])


def due_losses(leases: set[W], now: float) -> tuple[list[tuple[W, float]], float]:
    """For a loss watch at ``now``: the leases of ``leases`` past their deadline, with how many
    seconds past it; they and the finished ones are taken out of ``leases``. Also the earliest
    deadline left (``inf``: none)."""
    due: list[tuple[W, float]] = []
    earliest = float("inf")
    for lease in list(leases):
        if lease._finished():
            leases.discard(lease)
            continue
        deadline = lease._deadline
        if now >= deadline:
            due.append((lease, now - deadline))
            leases.discard(lease)
        elif deadline < earliest:
            earliest = deadline
    return due, earliest


class HoldGroup:
    """The rules of ``hold_all()``, a hold of several keys, all or nothing, on both faces: one hold
    per key (``members``, of the face's hold class), each judged by the rules of a single hold, and
    acquired together by one ``acquire_leases``. A loss of any member is the loss of all: the first
    one lost is declared as a single hold declares it (it cancels or flags the block), the others are
    then declared lost without acting on the block again. Leaving, the keys the block must release
    (no other ``hold()`` of the owner keeps them) are collected in ``releasing`` for one
    ``release_leases``. No I/O here."""

    def __init__(self, provider: Any, keys: object, owner: str | None) -> None:
        """``TypeError``/``ValueError`` for bad ``keys`` (1 to ``MAX_KEYS`` distinct keys) or owner."""
        self.provider = provider
        self.keys = validate_keys(keys)
        self.owner = validate_owner(owner) if owner is not None else new_owner_id()
        self.members: list[Any] = []
        self.lost_reason: str | None = None
        self.lost: Any = None  # the face's event, set once every member was declared lost
        self.releasing: list[str] = []

    def refusal(self, results: Sequence[AcquireResult], waited_s: float | None = None) -> LeaseNotAcquiredError | None:
        """The error ``hold_all()`` raises for the answer of its ``acquire_leases`` (None: all
        granted): the first key that blocked, naming its holder (``waited_s``: after a wait)."""
        if all(result.acquired for result in results):
            return None
        key, result = self.blocker(results)
        return LeaseNotAcquiredError(key, result.owner, result.fence, result.expires_at, waited_s=waited_s)

    def blocker(self, results: Sequence[AcquireResult]) -> tuple[str, AcquireResult]:
        """The first key of a refused ``acquire_leases`` that names its holder, with its result (the
        first key, unnamed, if none does)."""
        for key, result in zip(self.keys, results, strict=True):
            if result.owner is not None:
                return key, result
        return self.keys[0], AcquireResult(False, None)

    def member_lost(self, member: Any, reason: str) -> list[Any]:
        """``member`` is lost for ``reason``, so the whole hold is: the other members to declare lost
        (none when the hold was lost already)."""
        if self.lost_reason is not None:
            return []
        self.lost_reason = f"lease {member.key!r} lost: {reason}"
        return [other for other in self.members if other is not member and not other._finished()]

    def leaving(self, member: Any, must_release: bool) -> None:
        """``member`` leaves the block; ``must_release``: its own rules would release it."""
        if must_release:
            self.releasing.append(member.key)

    def take_releasing(self) -> list[str]:
        """The keys to release now (once)."""
        keys, self.releasing = self.releasing, []
        return keys

    @property
    def fences(self) -> dict[str, int | None]:
        """Each key's fencing token, by key."""
        return {member.key: member.fence for member in self.members}

    def release_kw(self, keys: Sequence[str]) -> dict[str, Any]:
        """``{"fences": [...]}`` for the ``release_leases`` of ``keys``: each key's tenure, so an old
        hold's exit never frees a newer tenure of the same owner id; nothing where a fence is not
        known (the acquire's answer was lost) or the provider does not take fences."""
        fences = self.fences
        chosen = [fences.get(key) for key in keys]
        if not takes_fence(self.provider) or None in chosen:
            return {}
        return {"fences": chosen}

    @property
    def valid(self) -> bool:
        """True while every member is (``HoldRules.valid``)."""
        return bool(self.members) and all(member.valid for member in self.members)

    def check(self) -> None:
        """``LeaseLostError`` (of the first key lost) if the hold is lost, judged when called."""
        for member in self.members:
            member.check()

    @staticmethod
    def first_error(errors: Sequence[BaseException]) -> BaseException | None:
        """What leaving the members raised, as one error: a ``LeaseLostError`` first."""
        for error in errors:
            if isinstance(error, LeaseLostError):
                return error
        return errors[0] if errors else None


class GroupMember:
    """What makes a face's hold class (``HeldLease``, ``SyncHeldLease``) a member of a
    :class:`HoldGroup`: it leaves without releasing (the group releases its keys together), and its
    loss is the loss of every member. Put it first among the bases."""

    group: HoldGroup

    def _leave(self) -> bool:
        self.group.leaving(self, super()._leave())  # type: ignore[misc]
        return False

    def _declare_lost(self, reason: str) -> None:
        first = self.group.lost_reason is None
        others = self.group.member_lost(self, reason)
        super()._declare_lost(reason)  # type: ignore[misc]
        for other in others:  # the block is cancelled (or called back) once, by the first loss
            other.on_lost, other._callback = "flag", None
            other._declare_lost(f"the hold of several keys was lost ({self.group.lost_reason})")
        if first and self.group.lost is not None:  # every member is lost by now
            self.group.lost.set()


class HeldKeys:
    """What both faces' ``hold_all()`` objects share (``HeldLeases``, ``SyncHeldLeases``): one
    member hold per key (of the face's ``_member`` class, a :class:`GroupMember`) in a
    :class:`HoldGroup`, the group's answers, and the judging of the ``acquire_leases`` answer."""

    _member: Callable[..., Any]
    _event: Callable[[], Any]

    def __init__(
        self,
        provider: Any,
        keys: Sequence[str],
        owner: str | None = None,
        ttl_ms: int | float = 15_000,
        *,
        renew_every_ms: int | float | None = None,
        wait: bool = False,
        timeout_s: float | None = None,
        on_lost: Any = None,
        data: dict[str, Any] | None = None,
    ) -> None:
        """``ttl_ms``/``renew_every_ms`` in milliseconds; ``wait``: wait until every key can be taken
        at once, up to ``timeout_s`` seconds (None: no limit); ``on_lost`` None: the face's default.
        ``TypeError``/``ValueError`` on bad input."""
        self.wait, self.timeout_s = validate_wait(wait, timeout_s)
        self._group = group = HoldGroup(provider, keys, owner)
        self.provider, self.keys, self.owner = provider, group.keys, group.owner
        self.leases: list[Any] = group.members
        for key in group.keys:
            member = self._member(
                provider, key, group.owner, ttl_ms, renew_every_ms=renew_every_ms, on_lost=on_lost, data=data
            )
            member.group = group
            group.members.append(member)
        self.lost = group.lost = self._event()
        self.released: bool | None = None  # whether the release at the block's end freed every key it released

    def _released(self, keys: Sequence[str], answer: object) -> None:
        """The release of ``keys`` at the block's end answered ``answer`` (a count, as ``release_leases``)."""
        self.released = answer == len(keys) if type(answer) is int else None

    @property
    def fences(self) -> dict[str, int | None]:
        """Each key's fencing token, by key."""
        return self._group.fences

    @property
    def lost_reason(self) -> str | None:
        """Why the hold was lost (the key lost first, and its reason), or None."""
        return self._group.lost_reason

    @property
    def valid(self) -> bool:
        """True while every key is held (see ``valid`` of a single hold)."""
        return self._group.valid

    def check(self) -> None:
        """``LeaseLostError`` if any key is lost (see ``check()`` of a single hold)."""
        self._group.check()

    def _granted(self, results: Sequence[AcquireResult], sent: float) -> tuple[list[float], LateAcquireError | None]:
        """The answer of ``acquire_leases`` sent at ``sent``: when each member's first renewal is due,
        and the error to raise if it came too late (its members then left: release
        ``_group.take_releasing()``); ``LeaseNotAcquiredError`` if refused."""
        refused = self._group.refusal(results)
        if refused is not None:
            raise refused
        due = [lease._acquired(result, sent) for lease, result in zip(self.leases, results, strict=True)]
        late = self.leases[0]._entered_late()
        if late is not None:
            for lease in self.leases:
                lease._leave()
        return due, late

    def _pacing(self) -> WaitingAcquire[Any] | None:
        """The pacing of a waiting entry (``wait=True``; None: one attempt): the deadline, each
        attempt's time limit and the pauses of ``hold(wait=True)`` on a provider without wake-ups."""
        if not self.wait:
            return None
        first = self.leases[0]
        return WaitingAcquire(self.provider, first.key, self.owner, first._call_ttl_ms, self.timeout_s)

    def _pause(self, results: Sequence[AcquireResult], pacing: WaitingAcquire[Any], now: float) -> float:
        """Seconds to wait after the refusal ``results`` answered at ``now`` (never past the blocking
        holder's expiry); ``LeaseNotAcquiredError`` naming it, as ``hold(wait=True)`` raises, once
        the deadline has passed. Nothing is held meanwhile: every attempt takes all keys or none."""
        if pacing.deadline is not None and now >= pacing.deadline:
            raise cast("LeaseNotAcquiredError", self._group.refusal(results, waited_s=now - pacing.started))
        return pacing.pause(self._group.blocker(results)[1], now, listening=False)

    def _exit_limit_s(self) -> float | None:
        """Seconds the release on exit may take (see ``_release_limit_s`` of a single hold)."""
        return max((lease._release_limit_s() or 0.0) for lease in self.leases) or None
