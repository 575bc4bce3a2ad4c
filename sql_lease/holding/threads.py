"""Holding leases from threads: ``hold()`` with a renewal thread, and the waiting acquire.

The thread face of :mod:`sql_lease.holding`, for synchronous providers
(:class:`~sql_lease.SyncSqlLeaseProvider`, :class:`~sql_lease.SyncInMemoryLeaseProvider`, or any
object with the five lease methods as plain functions). The rules are
:mod:`sql_lease.holding.rules`, the asyncio face's own: renew every ``renew_every_ms`` (default
TTL/3, at most ``MAX_RENEW_FRACTION`` of the TTL) counted from the acquire; the lease is lost when a
renewal is refused, or when none succeeded before the last known expiry minus ``LOSS_MARGIN`` of
the TTL. A thread cannot be cancelled, so a loss sets ``lease.lost`` (a ``threading.Event``), calls
the ``on_lost`` callback if one was given, and makes ``lease.check()`` raise ``LeaseLostError``;
leaving the block after a loss raises ``LeaseLostError`` unless ``on_lost="flag"``.

Waits pace themselves by the holder's ``remaining_ms`` (the database's clock) and this process's
monotonic clock. A provider may offer a wake-up hook, ``release_waiter(key)`` (the sync SQL
provider on PostgreSQL: ``LISTEN``/``NOTIFY``); without one, waiters poll with jittered backoff.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Literal

from .. import observe
from ..contract import AcquireResult, LeaseInfo, SyncLeaseProvider, SyncReleaseWaiter
from ..errors import LeaseBackendError
from . import rules

__all__ = ["SyncHeldLease", "SyncHeldLeases", "acquire_lease_wait", "hold", "hold_all"]

log = logging.getLogger("sql_lease")

SyncOnLost = Literal["raise", "flag"] | Callable[["SyncHeldLease"], object]


def _timeout_kw(provider: Any, timeout_s: float | None) -> dict[str, float]:
    """``{"timeout_s": ...}`` for providers whose methods take a per-call bound, else nothing."""
    return rules.timeout_kw(provider, "accepts_timeout_s", timeout_s)


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
        self,
        owner: str,
        ttl_ms: int | float,
        timeout_s: float | None,
        *,
        data: dict[str, Any] | None = None,
        limit: int = 1,
    ) -> AcquireResult:
        given = {**rules.data_kw(data), **rules.limit_kw(limit), **_timeout_kw(self._provider, timeout_s)}
        result: AcquireResult = self._provider.acquire_lease(self.key, owner, ttl_ms, **given)
        return result

    def wait(self, timeout_s: float) -> bool:
        time.sleep(max(0.0, timeout_s))
        return False


class ThreadWaitingAcquire(rules.WaitingAcquire[SyncLeaseProvider]):
    """One waiting acquire in this thread: the rules' decisions, with blocking waits. Each
    attempt is bounded (on providers whose calls take a bound) by the deadline plus
    ``ATTEMPT_GRACE_S``."""

    def result(self) -> AcquireResult:
        """The successful ``AcquireResult``."""
        return self.timed()[0]

    def timed(self) -> tuple[AcquireResult, float]:
        """The successful ``AcquireResult`` and when (``time.monotonic()``) its attempt was sent."""
        self.start(time.monotonic())
        waiter: SyncReleaseWaiter = self.waiter(_PollingWaiter)
        with waiter:
            while True:
                sent = time.monotonic()
                result = waiter.acquire(self.owner, self.ttl_ms, self.attempt_limit(sent), **self.given)
                if result.acquired:
                    return result, sent
                waiter.wait(self.pause(result, time.monotonic(), waiter.listening))


acquire_lease_wait = rules.shortcut(
    ThreadWaitingAcquire,
    ThreadWaitingAcquire.result,
    "acquire_lease_wait",
    """Acquire ``key`` for ``owner`` (``ttl_ms`` milliseconds), blocking up to ``timeout_s``
    seconds (None: no limit) while another owner holds it; ``data``: the lease data to store
    (passed on only when given); ``limit``: one of at most ``limit`` slots of a semaphore (1: a plain
    lease; ``TypeError`` for ``limit`` > 1 with a provider without ``accepts_limit``). The thread
    twin of :func:`sql_lease.holding.acquire_lease_wait`, with the same pacing (the same rules:
    :class:`sql_lease.holding.rules.WaitingAcquire`).

    ``acquire_lease_wait(provider, key, owner, ttl_ms, timeout_s=None, *, poll_initial_s=0.02,
    poll_max_s=1.0, listen_max_wait_s=5.0, data=None, limit=1)``.

    Returns the successful ``AcquireResult``. Raises ``LeaseNotAcquiredError`` naming the holder
    when the timeout passes, ``LeaseBackendError`` when the database fails. ``timeout_s`` bounds
    the whole call, plus at most ``ATTEMPT_GRACE_S`` (1 s) for an attempt in flight, on providers
    whose calls take a bound (the bundled sync providers); ``timeout_s=0`` makes one attempt.

    A provider with a ``release_waiter(key)`` hook (the sync SQL provider on PostgreSQL:
    ``LISTEN``/``NOTIFY``) wakes the waiter as soon as the key is released, re-checking at the
    holder's expiry and at least every ``listen_max_wait_s`` seconds; other providers are polled
    with jittered exponential backoff (``poll_initial_s`` doubling to ``poll_max_s`` seconds),
    never sleeping past the holder's expiry (its ``remaining_ms``, by the database's clock).
    """,
)


# The hold() blocks of this process per provider and (key, owner): nested holds of one owner keep
# the lease until the outermost exits, and every renewal uses the longest TTL among them.
_holds: rules.HoldRegistry[SyncHeldLease] = rules.HoldRegistry(threading.Lock())  # apart from the async face's
observe.count_held_with(_holds.held_count)


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
        # The parent's leases are the parent's: the child neither holds nor loses them.
        self._cond, self._thread, self._at = threading.Condition(), None, float("inf")
        self._leases = set()

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
            with self._cond:
                now = time.monotonic()
                due, earliest = rules.due_losses(self._leases, now)
                if not due and not self._leases:  # no thread lingers while no lease is held
                    if self._thread is threading.current_thread():
                        self._thread = None
                    return
                if not due:
                    self._at = earliest
                    self._cond.wait(None if earliest == float("inf") else earliest - now)
                    self._at = float("inf")
                    continue
            for lease, late_s in due:  # outside the lock: a declaration logs and may call back
                lease._noticed(late_s)


_watch = _LossWatch()


class SyncHeldLease(rules.HoldRules[SyncLeaseProvider, SyncOnLost]):
    """A lease held while a ``with`` block runs, renewed by a background thread; made by
    :func:`hold`, which takes the same arguments: ``SyncHeldLease(provider, key, owner=None,
    ttl_ms=15_000, *, renew_every_ms=None, wait=False, timeout_s=None, on_lost="raise",
    data=None, min_hold_ms=None, limit=1)``.

    Attributes: ``key``, ``owner``, ``fence`` (this tenure's fencing token), ``expires_at`` (aware
    UTC, the database's answer: from the acquire, then from each renewal), ``lost`` (a
    ``threading.Event`` set when the lease is lost), ``lost_reason``, ``transferred_to``, ``data``
    (the lease data given to :func:`hold`, or None), ``limit`` (1, or the semaphore's limit: the
    hold is then one slot of the key).
    Call :meth:`check` (or read ``valid``) between steps of long work: it raises ``LeaseLostError``
    once the lease is lost, judged by the clock when called (the last known expiry less 10% of the
    TTL), even while a renewal or transfer statement hangs. A process-wide watch thread declares
    the loss at that deadline too, whatever the renewer is doing.
    """

    stall_cause = "the renewal thread was held up (a suspended process, or a call holding the GIL)"
    default_on_lost = "raise"
    lost: threading.Event
    _registry = _holds

    def _accept_on_lost(self, on_lost: object) -> str:
        self._callback: Callable[[SyncHeldLease], object] | None = None
        if callable(on_lost):
            self._callback = on_lost
            return "raise"
        if on_lost not in ("raise", "flag"):
            raise ValueError(f"on_lost must be 'raise', 'flag' or a callable, not {on_lost!r}")
        return on_lost  # type: ignore[return-value]

    def _setup(self) -> None:
        self.lost = threading.Event()
        self._lock = threading.Lock()  # one renewal or transfer at a time
        self._stop = threading.Event()
        self._declaring = threading.Lock()  # the renewer and the watch may both declare
        self._renewer: threading.Thread | None = None

    def _clock(self) -> float:
        return time.monotonic()

    def _finished(self) -> bool:
        return self._stop.is_set() or super()._finished()

    def __enter__(self) -> SyncHeldLease:
        try:
            if self._handoff is not None:
                first_due = self._adopted(*self._read_back())
            elif self.wait:
                waiting = self._waiting(ThreadWaitingAcquire)
                result, sent = waiting.timed()
            else:
                sent = time.monotonic()
                result = self.provider.acquire_lease(self.key, self.owner, self._call_ttl_ms, **self._acquire_kw())
            if self._handoff is None:
                first_due = self._acquired(result, sent)
                late = self._entered_late()
                if late is not None:  # the body must not start on a lease about to be lost
                    if self._leave() and not self._kept_by_another():
                        self._release(self._margin_s)
                    raise late
            self._renewer = threading.Thread(
                target=self._renew_loop, args=(first_due,), name=f"sql_lease renew {self.key}", daemon=True
            )
            self._renewer.start()
            _watch.add(self)
        except rules.NOTHING_TAKEN:
            raise  # nothing can have been acquired
        except BaseException as exc:
            self._stop.set()
            _watch.discard(self)
            self._leave()
            self._undo_acquire(exc)
            raise
        return self

    def _read_back(self) -> tuple[LeaseInfo | AcquireResult | list[LeaseInfo] | None, float]:
        """The tenure handed to this owner, as the database has it, and when the answer came,
        bounded by the handoff's deadline: ``get_lease`` (``get_lease_holders`` for a semaphore),
        or, for a provider without it, an acquire by the owner (it extends the tenure, whichever it is)."""
        window = max(0.001, self._handoff_window(time.monotonic()))
        reader = self._reader()
        try:
            if reader is not None:
                found = reader(self.key, **_timeout_kw(self.provider, window))
            else:
                given = {**self._acquire_kw(), **_timeout_kw(self.provider, window)}
                found = self.provider.acquire_lease(self.key, self.owner, self._call_ttl_ms, **given)
        except LeaseBackendError:
            if self._handoff_window(time.monotonic()) > 0:
                raise
            return None, time.monotonic()  # the bound we set ran out: judged too late, as on the async face
        return found, time.monotonic()

    def _undo_acquire(self, exc: BaseException) -> None:
        """The acquire may have committed (a timeout, Ctrl-C): release whatever it took, unless an
        outer hold of this owner keeps it. A database failure releases in the background (don't
        make the caller wait for a second timeout); an interrupt (``KeyboardInterrupt``,
        ``SystemExit``) releases before it goes on, bounded by the TTL: the interpreter may be
        exiting, and a background thread would die with it."""
        if self._kept_by_another():
            return
        if isinstance(exc, Exception):
            self._release_in_background()
        else:
            self._release(self.ttl_ms / 1000)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._in_child():  # a fork of the holder leaves the block: it never held the lease
            return
        self._stop.set()
        _watch.discard(self)
        renewer, self._renewer = self._renewer, None
        if renewer is not None and renewer is not threading.current_thread():
            # A renewal in flight is bounded by the provider; a release racing it is harmless (a
            # renewal never recreates a released lease), so don't wait long for it.
            renewer.join(timeout=0.2)
        if self._leave():
            self._release(self._release_limit_s(), ran=True)
        self._exit_loss(exc_type)

    def _release(self, limit_s: float | None, ran: bool = False) -> None:
        """Release (with the minimum hold once the body ``ran``) within ``limit_s`` seconds."""
        try:
            answer = self.provider.release_lease(
                self.key, self.owner, **self._release_kw(ran=ran), **_timeout_kw(self.provider, limit_s)
            )
        except Exception as exc:
            self._release_failed(exc)
        else:
            if ran:
                self._released(answer)

    def _release_in_background(self) -> None:
        threading.Thread(target=self._release, args=(None,), name=f"sql_lease release {self.key}", daemon=True).start()

    def _declare_lost(self, reason: str) -> None:
        with self._declaring:
            if self.lost.is_set() or self.transferred_to is not None:
                return
            self.lost_reason = reason
            self.lost.set()
        self._announce_loss(reason)
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
        call, with_info = rules.renewal_method(self.provider)
        raw = call(self.key, self.owner, self._call_ttl_ms, **self._renew_kw(), **_timeout_kw(self.provider, wait_s))
        return rules.renewal_answer(raw, with_info)

    def _renew_loop(self, first_due: float) -> None:
        course = rules.RenewalCourse(self, self.renew_every_ms / 1000)
        next_at: float | None = first_due
        while next_at is not None and not self._stop.wait(max(0.0, next_at - time.monotonic())):
            with self._lock:
                sent = time.monotonic()
                turn = course.turn(next_at, sent)
                if turn is None:
                    return
                late, deadline = turn
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
        ttl = self._transfer_ttl(next_owner, ttl_ms, data)
        with self._lock:
            window = self._transfer_window()
            if window is None:
                return False
            given = {**rules.data_kw(data), **self._renew_kw(), **_timeout_kw(self.provider, window)}
            sent = time.monotonic()
            try:
                moved = bool(self.provider.transfer_lease(self.key, self.owner, next_owner, ttl, **given))
            except Exception as exc:
                self._transfer_failed(next_owner, exc)
                raise
            if self._transferred(moved, next_owner, ttl, sent) and self.transferred_to is not None:
                self._stop.set()
        return moved


hold = rules.shortcut(
    SyncHeldLease,
    rules.itself,
    "hold",
    """Hold ``key`` on a synchronous provider while a ``with`` block runs, renewing it from a
    background thread.

    ``hold(provider, key, owner=None, ttl_ms=15_000, *, renew_every_ms=None, wait=False,
    timeout_s=None, on_lost="raise", data=None, min_hold_ms=None, limit=1)`` returns a :class:`SyncHeldLease`::

        with leases.hold("report:daily", ttl_ms=30_000) as lease:
            for chunk in chunks:
                lease.check()               # raises LeaseLostError once the lease is lost
                write(chunk, fence=lease.fence)

    Args:
        owner: the owner id; None generates a unique one (``host:pid:random``).
        ttl_ms: lease TTL in milliseconds; renewed every ``renew_every_ms`` milliseconds (default
            TTL/3, at most 75% of the TTL), counted from the acquire.
        wait: wait for the key (up to ``timeout_s`` seconds; None: no limit) instead of failing;
            ``ValueError`` for ``timeout_s`` without ``wait=True``.
        on_lost: ``"raise"`` (default): leaving the block after a loss raises ``LeaseLostError``;
            ``"flag"``: only ``lease.lost`` is set; a callable: called with the lease (from the
            renewal thread) when the loss is declared, then as ``"raise"``.
        data: lease data stored at the acquire (a ``dict``, see ``LeaseProvider``); passed to the
            provider only when given.
        min_hold_ms: the release on leaving the block keeps the lease until this many
            milliseconds after the tenure began, as with :func:`sql_lease.hold`.
        limit: hold one of at most ``limit`` slots of ``key`` (a semaphore), as with
            :func:`sql_lease.hold`; ``wait=True`` waits for any slot.

    Renewals, transfers and the release carry the tenure's fence, as with :func:`sql_lease.hold`.

    Raises ``LeaseNotAcquiredError`` (naming the holder) when another owner holds the key,
    or when the acquire answered at or after the lease's deadline (90% of the TTL
    after it was sent: the lease is then released, bounded, and the block never starts),
    ``LeaseBackendError`` when the database fails at acquire (whatever it may have taken is then
    released in the background). The lease is lost when a renewal is refused, or when none
    succeeded before the last known expiry minus 10% of the TTL (renewals that raise are retried
    with backoff). On exit the lease is released unless it was transferred or an outer ``hold()``
    of the same owner in this process still holds it.
    A process forked inside the block does not hold the lease: there ``valid`` is False,
    ``check()`` raises ``LeaseLostError``, and leaving the block neither releases nor renews it
    (nor declares it lost); the parent keeps it.
    """,
)


class _Member(rules.GroupMember, SyncHeldLease):
    """One key of a :class:`SyncHeldLeases`; the first key's renewer renews every key (the others have none)."""

    def _renew_once(self, wait_s: float) -> LeaseInfo | bool:
        sent, members = time.monotonic(), self.group.members
        renewed = self.provider.renew_leases(  # type: ignore[attr-defined]
            [member.key for member in members],
            self.owner,
            self._call_ttl_ms,
            fences=[member.fence for member in members],
            **_timeout_kw(self.provider, wait_s),
        )
        if not all(renewed):  # a key of the hold is no longer ours: the whole hold is lost, named by that key
            refused = next(member for member, done in zip(members, renewed, strict=True) if not done)
            if refused is not self:
                refused._declare_lost("renewal refused: the lease expired or another owner holds it")
            return False
        for member in members:
            if member is not self:
                member._renewed(True, sent)
        return True


class SyncHeldLeases(rules.HeldKeys):
    """Several leases held, all or nothing, while a ``with`` block runs; made by :func:`hold_all`,
    which takes the same arguments: ``SyncHeldLeases(provider, keys, owner=None, ttl_ms=15_000, *,
    renew_every_ms=None, wait=False, timeout_s=None, on_lost="raise", data=None)``.

    Entering takes every key with one ``acquire_leases`` (``LeaseNotAcquiredError`` naming the holder
    of the first key that blocked; nothing is held then; ``wait=True``: one per attempt until all are
    taken or ``timeout_s`` passes). One background thread renews every key
    with one ``renew_leases`` per interval, each key's fencing token given, so an old tenure is never
    renewed; the process-wide watch declares losses at each key's deadline. A loss of any key is the
    loss of the whole hold (``lost`` is set, the ``on_lost`` callable is called once, leaving raises
    ``LeaseLostError`` unless ``on_lost="flag"``). Leaving releases every key with one ``release_leases``,
    each key's fencing token given, so it never frees a newer tenure of the same owner.

    Attributes: ``keys``, ``owner``, ``fences`` (by key), ``leases`` (the :class:`SyncHeldLease` of
    each key, in the order of ``keys``), ``lost`` (a ``threading.Event``), ``lost_reason``;
    ``check()`` and ``valid`` as on a ``SyncHeldLease``, for every key at once.
    """

    _member = _Member
    _event = threading.Event
    lost: threading.Event
    leases: list[SyncHeldLease]

    def __enter__(self) -> SyncHeldLeases:
        first, pacing = self.leases[0], self._pacing()
        if pacing is not None:
            pacing.start(time.monotonic())
        while True:
            sent = time.monotonic()
            limit = {} if pacing is None else _timeout_kw(self.provider, pacing.attempt_limit(sent))
            try:
                results = self.provider.acquire_leases(  # type: ignore[attr-defined]
                    self.keys, self.owner, first._call_ttl_ms, **rules.data_kw(first.data), **limit
                )
            except rules.NOTHING_TAKEN:
                raise
            except BaseException:  # the acquire may have committed: free what it took
                threading.Thread(target=self._release, args=(self.keys, None), daemon=True).start()
                raise
            if pacing is None or all(result.acquired for result in results):
                break
            time.sleep(self._pause(results, pacing, time.monotonic()))
        due, late = self._granted(results, sent)
        if late is not None:  # the body must not start on leases about to be lost
            self._release(self._group.take_releasing(), first._margin_s)
            raise late
        first._renewer = threading.Thread(
            target=first._renew_loop, args=(due[0],), name=f"sql_lease renew {len(self.keys)} keys", daemon=True
        )
        first._renewer.start()
        for lease in self.leases:
            _watch.add(lease)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        errors: list[BaseException] = []
        for lease in self.leases:
            try:
                lease.__exit__(exc_type, exc, tb)
            except BaseException as error:
                errors.append(error)
        self._release(self._group.take_releasing(), self._exit_limit_s())
        raised = rules.HoldGroup.first_error(errors)
        if raised is not None:
            raise raised

    def _release(self, keys: list[str], limit_s: float | None) -> None:
        """Release ``keys`` in one statement within ``limit_s`` seconds (None: the provider's own limit)."""
        if not keys:
            return
        try:
            answer = self.provider.release_leases(  # type: ignore[attr-defined]
                keys, self.owner, **self._group.release_kw(keys), **_timeout_kw(self.provider, limit_s)
            )
            self._released(keys, answer)
        except Exception as exc:
            log.error("releasing %d leases of %r failed: %s", len(keys), self.owner, exc)


hold_all = rules.shortcut(
    SyncHeldLeases,
    rules.itself,
    "hold_all",
    """Hold every key of ``keys`` (all or nothing) on a synchronous provider while a ``with`` block
    runs, renewing them together from one thread.

    ``hold_all(provider, keys, owner=None, ttl_ms=15_000, *, renew_every_ms=None, wait=False,
    timeout_s=None, on_lost="raise", data=None)`` returns a :class:`SyncHeldLeases`::

        with hold_all(provider, ["account:1", "account:2"], ttl_ms=15_000) as leases:
            move_money(fences=leases.fences)

    ``provider`` must have ``acquire_leases``, ``renew_leases`` and ``release_leases`` (every
    provider of sql_lease). ``LeaseNotAcquiredError`` when a key is held by another owner (nothing is
    held then); with ``wait=True`` it waits until every key can be taken at once, at most
    ``timeout_s`` seconds (None: no limit; polling, nothing held while waiting), then raises it as
    ``hold(wait=True)`` does. A loss of any key is the loss of all (``lost``, ``check()``,
    ``LeaseLostError``).""",
)
