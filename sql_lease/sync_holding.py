"""Holding leases from threads: ``hold()`` with a renewal thread, and the waiting acquire.

The thread flavour of :mod:`sql_lease.holding`, for synchronous providers
(:class:`~sql_lease.SyncSqlLeaseProvider`, :class:`~sql_lease.SyncInMemoryLeaseProvider`, or any
object with the five lease methods as plain functions). The rules are holding.py's own (imported,
not copied): renew every ``renew_every_ms`` (default TTL/3, at most ``MAX_RENEW_FRACTION`` of the
TTL) counted from the acquire; the lease is lost when a renewal is refused, or when none succeeded
before the last known expiry minus ``LOSS_MARGIN`` of the TTL. A thread cannot be cancelled, so a
loss sets ``lease.lost`` (a ``threading.Event``), calls the ``on_lost`` callback if one was given,
and makes ``lease.check()`` raise ``LeaseLostError``; leaving the block after a loss raises
``LeaseLostError`` unless ``on_lost="flag"``.

Waits pace themselves by the holder's ``remaining_ms`` (the database's clock) and this process's
monotonic clock. A provider may offer a wake-up hook, ``release_waiter(key)`` (the sync SQL
provider on PostgreSQL: ``LISTEN``/``NOTIFY``); without one, waiters poll with jittered backoff.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable
from datetime import datetime
from types import TracebackType
from typing import Any, Literal, Protocol

from . import observe
from .contract import AcquireResult, LeaseInfo, encode_data, validate_key, validate_owner, validate_ttl_ms
from .errors import (
    LeaseConfigError,
    LeaseLostError,
    LeaseNotAcquiredError,
    ProviderClosedError,
    SchemaMissingError,
)
from .holding import (
    ATTEMPT_GRACE_S,
    JITTER_S,
    HoldRegistry,
    HoldRules,
    RenewalCourse,
    _seconds_left,
    _validate_timeout_s,
    data_kw,
    new_owner_id,
    validate_hold_options,
)

__all__ = [
    "SyncHeldLease",
    "SyncLeaseProvider",
    "SyncLeaseProviderBase",
    "SyncReleaseWaiter",
    "acquire_lease_wait",
    "hold",
]

log = logging.getLogger("sql_lease")

SyncOnLost = Literal["raise", "flag"] | Callable[["SyncHeldLease"], object]


class SyncLeaseProvider(Protocol):
    """The five lease methods as plain (blocking) functions: what :func:`hold`,
    :func:`acquire_lease_wait` and ``@leased`` on a plain function need. ``SyncSqlLeaseProvider``,
    ``SyncInMemoryLeaseProvider`` and ``DjangoSqlLeaseProvider`` have them (each also takes a
    keyword ``timeout_s``, seconds, and ``data`` where ``LeaseProvider`` describes it). The
    rules are ``LeaseProvider``'s; a static type, not checked at run time."""

    def acquire_lease(self, key: str, owner: str, ttl_ms: int | float) -> AcquireResult: ...

    def get_lease_owner(self, key: str) -> str | None: ...

    def release_lease(self, key: str, owner: str) -> bool: ...

    def renew_lease(self, key: str, owner: str, ttl_ms: int | float) -> bool: ...

    def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int | float) -> bool: ...


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
        within ``timeout_s`` seconds (None: the provider's own limit)."""
        ...

    def wait(self, timeout_s: float) -> bool:
        """Block until the key may be free (True) or ``timeout_s`` seconds pass (False)."""
        ...


def _timeout_kw(provider: Any, timeout_s: float | None) -> dict[str, float]:
    """``{"timeout_s": ...}`` for providers whose methods take a per-call bound, else nothing."""
    if timeout_s is None or not getattr(provider, "accepts_timeout_s", False):
        return {}
    return {"timeout_s": max(0.001, timeout_s)}


class _PollingWaiter:
    """The wake-up hook for providers without one: every wait is a plain sleep."""

    listening = False

    def __init__(self, provider: Any, key: str) -> None:
        self._provider, self.key = provider, key

    def __enter__(self) -> _PollingWaiter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def acquire(
        self, owner: str, ttl_ms: int | float, timeout_s: float | None, *, data: dict[str, Any] | None = None
    ) -> AcquireResult:
        result: AcquireResult = self._provider.acquire_lease(
            self.key, owner, ttl_ms, **data_kw(data), **_timeout_kw(self._provider, timeout_s)
        )
        return result

    def wait(self, timeout_s: float) -> bool:
        time.sleep(max(0.0, timeout_s))
        return False


def acquire_lease_wait(
    provider: SyncLeaseProvider,
    key: str,
    owner: str,
    ttl_ms: int | float,
    timeout_s: float | None = None,
    *,
    poll_initial_s: float = 0.02,
    poll_max_s: float = 1.0,
    listen_max_wait_s: float = 5.0,
    data: dict[str, Any] | None = None,
) -> AcquireResult:
    """Acquire ``key`` for ``owner`` (``ttl_ms`` milliseconds), blocking up to ``timeout_s``
    seconds (None: no limit) while another owner holds it; ``data``: the lease data to store
    (passed on only when given). The thread twin of :func:`sql_lease.holding.acquire_lease_wait`,
    with the same pacing.

    Returns the successful ``AcquireResult``. Raises ``LeaseNotAcquiredError`` naming the holder
    when the timeout passes, ``LeaseBackendError`` when the database fails. ``timeout_s`` bounds
    the whole call, plus at most ``ATTEMPT_GRACE_S`` (1 s) for an attempt in flight, on providers
    whose calls take a bound (the bundled sync providers); ``timeout_s=0`` makes one attempt.

    A provider with a ``release_waiter(key)`` hook (the sync SQL provider on PostgreSQL:
    ``LISTEN``/``NOTIFY``) wakes the waiter as soon as the key is released, re-checking at the
    holder's expiry and at least every ``listen_max_wait_s`` seconds; other providers are polled
    with jittered exponential backoff (``poll_initial_s`` doubling to ``poll_max_s`` seconds),
    never sleeping past the holder's expiry (its ``remaining_ms``, by the database's clock).
    """
    result, _sent = _acquire_wait_timed(
        provider, key, owner, ttl_ms, timeout_s, poll_initial_s, poll_max_s, listen_max_wait_s, data
    )
    return result


def _acquire_wait_timed(
    provider: Any,
    key: str,
    owner: str,
    ttl_ms: int | float,
    timeout_s: float | None,
    poll_initial_s: float,
    poll_max_s: float,
    listen_max_wait_s: float,
    data: dict[str, Any] | None = None,
) -> tuple[AcquireResult, float]:
    """``acquire_lease_wait``, also returning when (``time.monotonic()``) the successful attempt was sent."""
    key, owner = validate_key(key), validate_owner(owner)
    validate_ttl_ms(ttl_ms), encode_data(data)
    limit = _validate_timeout_s(timeout_s)
    started = time.monotonic()
    deadline = None if limit is None else started + limit
    hook = getattr(provider, "release_waiter", None)
    waiter: SyncReleaseWaiter = (hook(key) if callable(hook) else None) or _PollingWaiter(provider, key)
    with waiter:
        delay = poll_initial_s
        while True:
            sent = time.monotonic()
            bound = None if deadline is None else max(deadline, sent) + ATTEMPT_GRACE_S - sent
            result = waiter.acquire(owner, ttl_ms, bound, **data_kw(data))
            if result.acquired:
                return result, sent
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise LeaseNotAcquiredError(key, result.owner, result.fence, result.expires_at, waited_s=now - started)
            if waiter.listening:
                pause = listen_max_wait_s
            else:
                pause = delay * random.uniform(0.5, 1.0)
                delay = min(delay * 2, poll_max_s)
            until_expiry = _seconds_left(result)
            if until_expiry is not None:
                pause = min(pause, until_expiry - (time.monotonic() - now) + 0.001)
            if deadline is not None:
                pause = min(pause, deadline - now)
            waiter.wait(max(0.0, pause))


# The hold() blocks of this process per provider and (key, owner): nested holds of one owner keep
# the lease until the outermost exits, and every renewal uses the longest TTL among them.
_holds: HoldRegistry[SyncHeldLease] = HoldRegistry()  # apart from the async face's


def _renews_with_info(provider: Any) -> bool:
    return callable(getattr(type(provider), "renew_lease_info", None))


class _LossWatch:
    """One thread per process that declares each sync ``hold()`` lost at its deadline, by the
    clock, whether or not its renewal (or transfer) statement has returned: a renewer stuck in a
    statement cannot delay the loss. It only waits on a condition and reads the clock."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._leases: set[SyncHeldLease] = set()
        self._thread: threading.Thread | None = None
        self._at = float("inf")  # when the thread wakes next
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        # The parent's thread and lock state do not carry over; the next hold() starts a thread.
        self._cond, self._thread, self._at = threading.Condition(), None, float("inf")

    def add(self, lease: SyncHeldLease) -> None:
        with self._cond:
            self._leases.add(lease)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="sql_lease loss watch", daemon=True)
                self._thread.start()
            elif lease._deadline < self._at:
                self._cond.notify()

    def discard(self, lease: SyncHeldLease) -> None:
        with self._cond:
            self._leases.discard(lease)
            if not self._leases:
                self._cond.notify()  # nothing to watch: let the thread end

    def is_watcher(self) -> bool:
        return threading.current_thread() is self._thread

    def _run(self) -> None:
        while True:
            due: list[tuple[SyncHeldLease, float]] = []
            with self._cond:
                now = time.monotonic()
                earliest = float("inf")
                for lease in list(self._leases):
                    if lease._stop.is_set() or lease.lost.is_set() or lease.transferred_to is not None:
                        self._leases.discard(lease)
                        continue
                    deadline = lease._deadline
                    if now >= deadline:
                        due.append((lease, now - deadline))
                        self._leases.discard(lease)
                    elif deadline < earliest:
                        earliest = deadline
                if not due and not self._leases:  # no thread lingers while no lease is held
                    if self._thread is threading.current_thread():
                        self._thread = None
                    return
                if not due:
                    self._at = earliest
                    self._cond.wait(None if earliest == float("inf") else earliest - now)
                    self._at = float("inf")
                    continue
            for lease, late in due:  # outside the lock: a declaration logs and may call back
                note = f" (noticed {late:.2f} s after its deadline: {lease.stall_cause})" if late >= JITTER_S else ""
                lease._past_deadline(note)


_watch = _LossWatch()


class SyncHeldLease(HoldRules):
    """A lease held while a ``with`` block runs, renewed by a background thread; made by :func:`hold`.

    Attributes: ``key``, ``owner``, ``fence`` (this tenure's fencing token), ``expires_at`` (aware
    UTC, the database's answer: from the acquire, then from each renewal), ``lost`` (a
    ``threading.Event`` set when the lease is lost), ``lost_reason``, ``transferred_to``, ``data``
    (the lease data given to :func:`hold`, or None).
    Call :meth:`check` (or read ``valid``) between steps of long work: it raises ``LeaseLostError``
    once the lease is lost, judged by the clock when called (the last known expiry less 10% of the
    TTL), even while a renewal or transfer statement hangs. A process-wide watch thread declares
    the loss at that deadline too, whatever the renewer is doing.
    """

    stall_cause = "the renewal thread was held up (a suspended process, or a call holding the GIL)"

    provider: SyncLeaseProvider
    lost: threading.Event
    data: dict[str, Any] | None

    def __init__(
        self,
        provider: SyncLeaseProvider,
        key: str,
        owner: str | None = None,
        ttl_ms: int | float = 15_000,
        *,
        renew_every_ms: int | float | None = None,
        wait: bool = False,
        timeout_s: float | None = None,
        on_lost: SyncOnLost = "raise",
        data: dict[str, Any] | None = None,
    ) -> None:
        self.provider = provider
        encode_data(data)
        self.data = data
        self.key = validate_key(key)
        self.owner = validate_owner(owner) if owner is not None else new_owner_id()
        self.ttl_ms, self.renew_every_ms, self.timeout_s = validate_hold_options(ttl_ms, renew_every_ms, timeout_s)
        self._callback: Callable[[SyncHeldLease], object] | None = None
        if callable(on_lost):
            self._callback, self.on_lost = on_lost, "raise"
        elif on_lost in ("raise", "flag"):
            self.on_lost = on_lost
        else:
            raise ValueError(f"on_lost must be 'raise', 'flag' or a callable, not {on_lost!r}")
        self.wait = bool(wait)
        self.fence: int | None = None
        self.expires_at: datetime | None = None
        self.lost = threading.Event()
        self.lost_reason: str | None = None
        self.transferred_to: str | None = None
        self._valid_until = 0.0  # time.monotonic() up to which the lease is surely still ours
        self._acquired_at = 0.0
        self._acquired_expiry: datetime | None = None
        self._lock = threading.Lock()  # one renewal or transfer at a time
        self._stop = threading.Event()
        self._declaring = threading.Lock()  # the renewer and the watch may both declare
        self._renewer: threading.Thread | None = None
        self._counted = False

    def __repr__(self) -> str:
        state = (
            "lost"
            if self.lost.is_set()
            else f"transferred to {self.transferred_to!r}"
            if self.transferred_to
            else "held"
        )
        return f"<SyncHeldLease {self.key!r} owner={self.owner!r} fence={self.fence} {state}>"

    def _clock(self) -> float:
        return time.monotonic()

    @property
    def _call_ttl_ms(self) -> float:
        return _holds.longest_ttl(self)

    def __enter__(self) -> SyncHeldLease:
        try:
            if self.wait:
                result, sent = _acquire_wait_timed(
                    self.provider, self.key, self.owner, self._call_ttl_ms, self.timeout_s, 0.02, 1.0, 5.0, self.data
                )
            else:
                sent = time.monotonic()
                result = self.provider.acquire_lease(self.key, self.owner, self._call_ttl_ms, **data_kw(self.data))
            if not result.acquired:
                raise LeaseNotAcquiredError(self.key, result.owner, result.fence, result.expires_at)
            _holds.add(self)
            self._counted = True
            # The database counted the TTL from when it ran the statement, after `sent`: the safe side.
            self._acquired_at, self._valid_until = sent, sent + self.ttl_ms / 1000
            self.fence, self.expires_at = result.fence, result.expires_at
            self._acquired_expiry = result.expires_at
            first_due = sent + self.renew_every_ms / 1000  # from the acquire, not from the thread's start
            self._renewer = threading.Thread(
                target=self._renew_loop, args=(first_due,), name=f"sql_lease renew {self.key}", daemon=True
            )
            self._renewer.start()
            _watch.add(self)
        except (LeaseNotAcquiredError, LeaseConfigError, SchemaMissingError, ProviderClosedError):
            raise  # nothing can have been acquired
        except BaseException as exc:
            self._stop.set()
            _watch.discard(self)
            if self._counted:
                self._counted = False
                _holds.forget(self)
            self._undo_acquire(exc)
            raise
        return self

    def _undo_acquire(self, exc: BaseException) -> None:
        """The acquire may have committed (a timeout, Ctrl-C): release whatever it took, unless an
        outer hold of this owner keeps it. A database failure releases in the background (don't
        make the caller wait for a second timeout); an interrupt (``KeyboardInterrupt``,
        ``SystemExit``) releases before it goes on, bounded by the TTL: the interpreter may be
        exiting, and a background thread would die with it."""
        if _holds.holds_of(self.provider, self.key, self.owner):
            return
        if isinstance(exc, Exception):
            self._release_in_background()
        else:
            self._release(self.ttl_ms / 1000)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        _watch.discard(self)
        renewer, self._renewer = self._renewer, None
        if renewer is not None and renewer is not threading.current_thread():
            # A renewal in flight is bounded by the provider; a release racing it is harmless (a
            # renewal never recreates a released lease), so don't wait long for it.
            renewer.join(timeout=0.2)
        if self._counted:
            self._counted = False
            left = _holds.forget(self)
            if self.transferred_to is None and left == 0:  # an outer hold() of this owner keeps it
                limit = None
                if self.lost.is_set():  # a doomed release must not outlast the lease it could free
                    limit = max(0.05, self._valid_until - time.monotonic())
                self._release(limit)
        if self.lost.is_set() and self.on_lost != "flag" and exc_type is None:
            raise LeaseLostError(self.key, self.owner, self.lost_reason or "lost")

    def _release(self, limit_s: float | None) -> None:
        try:
            self.provider.release_lease(self.key, self.owner, **_timeout_kw(self.provider, limit_s))
        except Exception as exc:  # the lease expires by itself; don't mask the body's outcome
            log.warning("releasing lease %r held by %r (fence %s) failed: %s", self.key, self.owner, self.fence, exc)

    def _release_in_background(self) -> None:
        threading.Thread(target=self._release, args=(None,), name=f"sql_lease release {self.key}", daemon=True).start()

    def _declare_lost(self, reason: str) -> None:
        with self._declaring:
            if self.lost.is_set() or self.transferred_to is not None:
                return
            self.lost_reason = reason
            self.lost.set()
        log.warning("lease %r held by %r (fence %s) lost: %s", self.key, self.owner, self.fence, reason)
        if observe.observers:
            observe.lease_lost(self, reason)
        if self._callback is not None:
            if _watch.is_watcher():  # a slow callback must not delay other leases' losses
                threading.Thread(target=self._call_back, name=f"sql_lease on_lost {self.key}", daemon=True).start()
            else:
                self._call_back()

    def _call_back(self) -> None:
        assert self._callback is not None
        try:
            self._callback(self)
        except Exception:
            log.exception("the on_lost callback of lease %r raised", self.key)

    def _renew_once(self, wait_s: float) -> LeaseInfo | bool:
        bound = _timeout_kw(self.provider, wait_s)
        if _renews_with_info(self.provider):
            info: LeaseInfo | None = self.provider.renew_lease_info(  # type: ignore[attr-defined]
                self.key, self.owner, self._call_ttl_ms, **bound
            )
            return False if info is None else info
        return bool(self.provider.renew_lease(self.key, self.owner, self._call_ttl_ms, **bound))

    def _renew_loop(self, first_due: float) -> None:
        course = RenewalCourse(self, self.renew_every_ms / 1000)
        next_at: float | None = first_due
        while next_at is not None and not self._stop.wait(max(0.0, next_at - time.monotonic())):
            with self._lock:
                if self._stop.is_set() or self.lost.is_set() or self.transferred_to is not None:
                    return
                sent = time.monotonic()
                late = self._late(sent - next_at)
                deadline = self._deadline
                if sent >= deadline:  # woke too late (the last retry's turn, or a stalled thread)
                    course.lose_too_late(late)
                    return
                renewed: LeaseInfo | bool | None = None
                try:
                    renewed = self._renew_once(deadline - sent)
                except Exception as exc:
                    course.failed(exc)
                if self._stop.is_set():
                    return  # the block ended meanwhile (its release may have raced this renewal)
                next_at = course.after(renewed, time.monotonic(), sent, deadline, late)

    def transfer_to(
        self, next_owner: str, ttl_ms: int | float | None = None, *, data: dict[str, Any] | None = None
    ) -> bool:
        """Hand the lease to ``next_owner`` with no gap (``transfer_lease``) for ``ttl_ms``
        milliseconds (default: this lease's TTL), with lease ``data`` for the next owner (None:
        none). On success this holder stops renewing and does not release on exit. Returns False
        if the lease was no longer ours (lost, its deadline passed, or refused by the provider).

        The transfer is bounded by the lease's deadline (on providers whose calls take a bound);
        a database failure, that bound's included, leaves its outcome unknown (``next_owner`` may
        hold the lease): the lease is declared lost and the error raised. While it is in flight,
        the loss is still declared at the deadline and ``check()`` raises from then on."""
        validate_owner(next_owner, "next_owner"), encode_data(data)
        ttl = self.ttl_ms if ttl_ms is None else validate_ttl_ms(ttl_ms)
        with self._lock:
            if self.transferred_to is not None:
                return False
            window = self._transfer_window()
            if window is None:
                return False
            try:
                moved = bool(
                    self.provider.transfer_lease(
                        self.key, self.owner, next_owner, ttl, **data_kw(data), **_timeout_kw(self.provider, window)
                    )
                )
            except Exception as exc:
                self._transfer_failed(next_owner, exc)
                raise
            if self._transferred(moved, next_owner) and self.transferred_to is not None:
                self._stop.set()
        return moved


def hold(
    provider: SyncLeaseProvider,
    key: str,
    owner: str | None = None,
    ttl_ms: int | float = 15_000,
    *,
    renew_every_ms: int | float | None = None,
    wait: bool = False,
    timeout_s: float | None = None,
    on_lost: SyncOnLost = "raise",
    data: dict[str, Any] | None = None,
) -> SyncHeldLease:
    """Hold ``key`` on a synchronous provider while a ``with`` block runs, renewing it from a
    background thread.

    ::

        with leases.hold("report:daily", ttl_ms=30_000) as lease:
            for chunk in chunks:
                lease.check()               # raises LeaseLostError once the lease is lost
                write(chunk, fence=lease.fence)

    Args:
        owner: the owner id; None generates a unique one (``host:pid:random``).
        ttl_ms: lease TTL in milliseconds; renewed every ``renew_every_ms`` milliseconds (default
            TTL/3, at most 75% of the TTL), counted from the acquire.
        wait: wait for the key (up to ``timeout_s`` seconds; None: no limit) instead of failing.
        on_lost: ``"raise"`` (default): leaving the block after a loss raises ``LeaseLostError``;
            ``"flag"``: only ``lease.lost`` is set; a callable: called with the lease (from the
            renewal thread) when the loss is declared, then as ``"raise"``.
        data: lease data stored at the acquire (a ``dict``, see ``LeaseProvider``); passed to the
            provider only when given.

    Raises ``LeaseNotAcquiredError`` (naming the holder) when another owner holds the key,
    ``LeaseBackendError`` when the database fails at acquire (whatever it may have taken is then
    released in the background). The lease is lost when a renewal is refused, or when none
    succeeded before the last known expiry minus 10% of the TTL (renewals that raise are retried
    with backoff). On exit the lease is released unless it was transferred or an outer ``hold()``
    of the same owner in this process still holds it.
    """
    return SyncHeldLease(
        provider,
        key,
        owner,
        ttl_ms,
        renew_every_ms=renew_every_ms,
        wait=wait,
        timeout_s=timeout_s,
        on_lost=on_lost,
        data=data,
    )


class SyncLeaseProviderBase:
    """Holding helpers of the bundled synchronous providers (shortcuts to this module).

    ``accepts_timeout_s``: every lease method of the subclass takes a keyword ``timeout_s``
    (seconds) that bounds that one call; holding uses it to keep its deadlines.
    """

    accepts_timeout_s = True

    def hold(
        self,
        key: str,
        owner: str | None = None,
        ttl_ms: int | float = 15_000,
        *,
        renew_every_ms: int | float | None = None,
        wait: bool = False,
        timeout_s: float | None = None,
        on_lost: SyncOnLost = "raise",
        data: dict[str, Any] | None = None,
    ) -> SyncHeldLease:
        """Hold ``key`` while a ``with`` block runs, renewing it; see :func:`sql_lease.sync_holding.hold`."""
        return hold(
            self,  # type: ignore[arg-type]  # a subclass has the five methods
            key,
            owner,
            ttl_ms,
            renew_every_ms=renew_every_ms,
            wait=wait,
            timeout_s=timeout_s,
            on_lost=on_lost,
            data=data,
        )

    def acquire_lease_wait(
        self,
        key: str,
        owner: str,
        ttl_ms: int | float,
        timeout_s: float | None = None,
        *,
        poll_initial_s: float = 0.02,
        poll_max_s: float = 1.0,
        listen_max_wait_s: float = 5.0,
        data: dict[str, Any] | None = None,
    ) -> AcquireResult:
        """Block until ``key`` is acquired or ``timeout_s`` seconds pass; see
        :func:`sql_lease.sync_holding.acquire_lease_wait`."""
        return acquire_lease_wait(
            self,  # type: ignore[arg-type]  # a subclass has the five methods
            key,
            owner,
            ttl_ms,
            timeout_s,
            poll_initial_s=poll_initial_s,
            poll_max_s=poll_max_s,
            listen_max_wait_s=listen_max_wait_s,
            data=data,
        )
