"""``hold()`` and the waiting acquire on an asyncio ``LeaseProvider``: the asyncio face.

Built on the five protocol methods only, so it serves every provider. The rules (when to renew,
when a lease is lost, what a transfer does, how long a waiter waits) are
:mod:`sql_lease.holding.rules`, shared with the thread face; this module adds the event loop's
waiting (tasks, timers, locks), the renewal batcher and the per-process waiter queues. A provider
may offer a faster wake-up for waiters through an optional method ``release_waiter(key)``
(``SqlLeaseProvider`` on PostgreSQL: LISTEN/NOTIFY); without one, waiters poll with backoff.
Waits are derived from durations the provider reports (``remaining_ms``, by the database's clock)
and this process's monotonic clock, never from comparing timestamps.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import operator
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterator
from types import TracebackType
from typing import Any, Literal

from .. import observe
from ..contract import AcquireResult, CheckedRenewItems, LeaseInfo, LeaseProvider, ReleaseWaiter
from ..errors import LeaseBackendError
from .rules import (
    NO_ANSWER,
    NOTHING_TAKEN,
    GroupMember,
    HeldKeys,
    HoldGroup,
    HoldRegistry,
    HoldRules,
    RenewalCourse,
    WaitingAcquire,
    data_kw,
    distinct_key_chunks,
    due_losses,
    itself,
    limit_kw,
    renewal_answer,
    renewal_method,
    shortcut,
    takes_fence,
    timeout_kw,
)

__all__ = ["HeldLease", "HeldLeases", "acquire_lease_wait", "hold", "hold_all"]

OnLost = Literal["cancel", "flag"]

log = logging.getLogger("sql_lease")


def _release_if_taken(taking: asyncio.Future[Any], lock: asyncio.Lock) -> None:
    if not taking.cancelled() and taking.exception() is None:
        lock.release()


async def _bounded(attempt: Any, deadline: float | None) -> Any:
    """Await ``attempt`` until ``deadline`` (``loop.time()``); past it, ``LeaseBackendError``: the
    outcome is unknown, so the caller must assume it may hold the lease."""
    if deadline is None:
        return await attempt
    try:
        async with asyncio.timeout_at(deadline):
            return await attempt
    except TimeoutError as exc:
        raise LeaseBackendError("the acquire attempt had no answer by the deadline; its outcome is unknown") from exc


class _PollingWaiter:
    """The wake-up hook for providers without one: every wait is a plain sleep."""

    listening = False

    def __init__(self, provider: LeaseProvider, key: str) -> None:
        self._provider, self.key = provider, key

    async def __aenter__(self) -> _PollingWaiter:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        return None

    async def acquire(
        self,
        owner: str,
        ttl_ms: int | float,
        *,
        data: dict[str, Any] | None = None,
        timeout_s: float | None = None,
        limit: int = 1,
    ) -> AcquireResult:
        return await self._provider.acquire_lease(
            self.key,
            owner,
            ttl_ms,
            **data_kw(data),
            **limit_kw(limit),
            **_acquire_timeout_kw(self._provider, timeout_s),
        )

    async def wait(self, timeout_s: float) -> bool:
        await asyncio.sleep(timeout_s)
        return False


def _acquire_timeout_kw(provider: Any, timeout_s: float | None) -> dict[str, Any]:
    """``{"timeout_s": ...}`` for providers whose ``acquire_lease`` takes a per-call limit."""
    return timeout_kw(provider, "acquire_accepts_timeout_s", timeout_s)


class _LocalQueue:
    """Waiters for one key in this process. They queue behind one lock, so only the first of them
    queries the database (a release costs one query per waiting process, not one per waiting task).
    A lease transferred to a waiter further back does not wait for its turn: the head, refused and
    told the holder, nudges that waiter, which then acquires at once (it is the owner)."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.nudges: dict[str, list[asyncio.Event]] = {}
        self.users = 0

    def nudge(self, owner: str | None) -> None:
        for event in self.nudges.get(owner or "", ()):
            event.set()

    async def wait_turn(self, nudge: asyncio.Event, deadline: float | None) -> bool:
        """Wait for the lock (True: caller must release it) or a nudge (False); TimeoutError."""
        taking = asyncio.ensure_future(self.lock.acquire())
        nudged = asyncio.ensure_future(nudge.wait())
        granted = False
        try:
            async with asyncio.timeout_at(deadline):
                await asyncio.wait({taking, nudged}, return_when=asyncio.FIRST_COMPLETED)
            # nudged and granted at once: the nudge wins and the turn passes on
            granted = taking.done() and not taking.cancelled() and not nudge.is_set()
            return granted
        finally:
            nudged.cancel()
            if not granted:
                # A lock granted in the same turn as a deadline, a cancellation or a nudge is passed on.
                taking.cancel()
                taking.add_done_callback(lambda done: _release_if_taken(done, self.lock))


# per provider, then per (event loop, key): an asyncio.Lock serves one loop only
_local_queues: weakref.WeakKeyDictionary[Any, dict[tuple[asyncio.AbstractEventLoop, str], _LocalQueue]] = (
    weakref.WeakKeyDictionary()
)


@contextlib.contextmanager
def _local_queue(provider: LeaseProvider, key: str, owner: str) -> Iterator[tuple[_LocalQueue, asyncio.Event] | None]:
    try:
        queues = _local_queues.setdefault(provider, {})
    except TypeError:  # not weak-referenceable: no coalescing
        yield None
        return
    slot = (asyncio.get_running_loop(), key)
    queue = queues.setdefault(slot, _LocalQueue())
    queue.users += 1
    nudge = asyncio.Event()
    queue.nudges.setdefault(owner, []).append(nudge)
    try:
        yield queue, nudge
    finally:
        queue.nudges[owner].remove(nudge)
        if not queue.nudges[owner]:
            del queue.nudges[owner]
        queue.users -= 1
        if queue.users == 0:
            del queues[slot]


class AsyncWaitingAcquire(WaitingAcquire[LeaseProvider]):
    """One waiting acquire on the event loop: the rules' decisions, with asyncio's waiting."""

    async def result(self) -> AcquireResult:
        """The successful ``AcquireResult``."""
        return (await self.timed())[0]

    async def timed(self) -> tuple[AcquireResult, float]:
        """The successful ``AcquireResult`` and when (``loop.time()``) its attempt was sent."""
        loop = asyncio.get_running_loop()
        self.start(loop.time())
        with _local_queue(self.provider, self.key, self.owner) as local:
            while True:
                has_turn = False
                if local is not None:
                    queue, nudge = local
                    try:
                        has_turn = await queue.wait_turn(nudge, self.deadline)
                    except TimeoutError:
                        result, sent = await self._attempt(self._acquire)  # names the holder
                        if result.acquired:
                            return result, sent
                        raise self.not_acquired(result, loop.time()) from None
                    if not has_turn:  # nudged: the lease may have been handed to us
                        nudge.clear()
                        result, sent = await self._attempt(self._acquire)
                        if result.acquired:
                            return result, sent
                        continue
                try:
                    return await self._at_head(local[0] if local else None)
                finally:
                    if has_turn and local is not None:
                        local[0].lock.release()

    def _acquire(self, limit_s: float | None) -> Awaitable[AcquireResult]:
        timeout_kw = _acquire_timeout_kw(self.provider, limit_s)
        return self.provider.acquire_lease(self.key, self.owner, self.ttl_ms, **self.given, **timeout_kw)

    async def _attempt(
        self, attempt: Callable[[float | None], Awaitable[AcquireResult]]
    ) -> tuple[AcquireResult, float]:
        """One attempt, given the time left until the deadline plus ``ATTEMPT_GRACE_S`` and abandoned
        then; with when it was sent."""
        sent = asyncio.get_running_loop().time()
        result: AcquireResult = await _bounded(attempt(self.attempt_limit(sent)), self.attempt_end(sent))
        return result, sent

    async def _at_head(self, queue: _LocalQueue | None) -> tuple[AcquireResult, float]:
        """The waiting loop of the one waiter (per process and key) that queries the database."""
        loop = asyncio.get_running_loop()
        waiter: ReleaseWaiter = self.waiter(_PollingWaiter)
        async with waiter:
            while True:
                result, sent = await self._attempt(
                    lambda limit_s: waiter.acquire(
                        self.owner, self.ttl_ms, **self.given, **_acquire_timeout_kw(self.provider, limit_s)
                    )
                )
                if result.acquired:
                    return result, sent
                if queue is not None and result.owner != self.owner:
                    queue.nudge(result.owner)  # handed to a waiter behind us: let it take over
                await waiter.wait(self.pause(result, loop.time(), waiter.listening))


acquire_lease_wait = shortcut(
    AsyncWaitingAcquire,
    AsyncWaitingAcquire.result,
    "acquire_lease_wait",
    """Acquire ``key`` for ``owner``, waiting up to ``timeout_s`` seconds (None: no limit) while
    another owner holds it; ``data``: the lease data to store (passed to the provider only when given);
    ``limit``: take one of at most ``limit`` slots of a semaphore (1: a plain lease; passed on only
    when > 1, and then ``TypeError`` for a provider without ``accepts_limit``), woken by a release
    of any slot.

    ``acquire_lease_wait(provider, key, owner, ttl_ms, timeout_s=None, *, poll_initial_s=0.02,
    poll_max_s=1.0, listen_max_wait_s=5.0, data=None, limit=1)``, awaited.

    Returns the successful ``AcquireResult``. Raises ``LeaseNotAcquiredError`` naming the holder
    when the timeout passes, and ``LeaseBackendError`` when the database fails. ``timeout_s``
    bounds the whole call: it returns within ``timeout_s`` plus at most ``ATTEMPT_GRACE_S`` (1 s)
    even over a stalled network; an attempt still in flight then is abandoned with
    ``LeaseBackendError`` (its outcome is unknown: ``owner`` may hold the lease; retrying with the
    same owner is safe). ``timeout_s=0`` makes one attempt.

    How it waits: a provider with a ``release_waiter(key)`` hook (``SqlLeaseProvider`` on
    PostgreSQL: ``LISTEN``/``NOTIFY``) wakes it as soon as the key is released; it re-checks at
    the holder's expiry and at least every ``listen_max_wait_s`` seconds. Other providers poll
    with jittered exponential backoff (``poll_initial_s`` doubling to ``poll_max_s``), never
    sleeping past the holder's expiry. The expiry is known as the holder's remaining TTL reported
    by the provider (by the database's clock), so a wrong client clock changes nothing. Waiters on
    the same key in one process queue behind each other (first come, first served), so only one
    of them queries the database.
    """,
)


def _consume_result(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


_holds: HoldRegistry[HeldLease] = HoldRegistry(threading.Lock())
observe.count_held_with(_holds.held_count)


class _BatchedRenewal:
    """The renewals of one ``hold()`` block through the batcher, for the block's whole life: the
    next renewal is due at ``due`` (``loop.time()``) and useless after ``deadline``; ``sent`` is
    when its statement was sent (None: not yet). ``done`` is set when renewing ends (the lease
    lost or transferred, or the block withdrawn). The batcher judges each answer with ``course``
    itself, so a held lease costs no task and a renewal no task wake-up nor any new object that
    outlives it."""

    __slots__ = ("batcher", "course", "deadline", "done", "due", "holder", "lease", "sent")

    def __init__(self, batcher: _RenewalBatcher, lease: HeldLease, course: RenewalCourse, due: float) -> None:
        self.batcher, self.lease, self.course, self.due = batcher, lease, course, due
        self.holder = (lease.key, lease.owner)
        self.deadline = lease._deadline
        self.sent: float | None = None
        self.done = False

    def withdraw(self) -> None:
        """The ``hold()`` block stopped renewing; a statement in flight goes on for the others."""
        self.batcher.withdraw(self)


_due, _deadline = operator.attrgetter("due"), operator.attrgetter("deadline")
_interval = operator.attrgetter("course.interval")


class _RenewalBatcher:
    """Coalesced renewals of the ``hold()`` blocks on one provider in one event loop (the provider
    has ``renew_many``). When the earliest renewal falls due, one statement (per
    ``RENEW_BATCH_SIZE``) renews every lease due before the next tick (now plus the shortest
    renewal interval waiting): a lease is renewed up to one interval early, never late. Renewed
    together, leases stay together, so N leases with one interval cost about N / 1000 statements per
    interval. Each lease is judged by its own answer and its own deadline, with the rules of
    :class:`RenewalCourse`, as the per-lease renewer judges it."""

    def __init__(self, provider: Any) -> None:
        self._provider = weakref.ref(provider)
        self._pending: set[_BatchedRenewal] = set()
        self._wake = asyncio.Event()
        self._wake_at = float("inf")
        self._task: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()

    def add(self, lease: HeldLease, first_due: float) -> _BatchedRenewal:
        """Renew ``lease`` from ``first_due`` on, until its loss or transfer, or until withdrawn (``done``)."""
        renewal = _BatchedRenewal(self, lease, RenewalCourse(lease, lease.renew_every_ms / 1000), first_due)
        self._schedule(renewal)
        return renewal

    def withdraw(self, renewal: _BatchedRenewal) -> None:
        """``renewal``'s hold() stopped renewing; a statement in flight goes on for the others."""
        renewal.done = True
        self._pending.discard(renewal)
        if not self._pending:
            self._wake.set()  # nothing left: let the flusher end

    def _schedule(self, renewal: _BatchedRenewal) -> None:
        self._pending.add(renewal)
        if renewal.due < self._wake_at:
            self._wake.set()
        if self._task is None or self._task.done():  # done: an eager task may end before it is assigned
            self._task = self._spawn(self._run(), "sql_lease renewal batcher")

    def _spawn(self, coro: Any, name: str | None = None) -> asyncio.Task[None]:
        # In an empty context: renewals are no request's work (spans, context variables).
        task = asyncio.get_running_loop().create_task(coro, name=name, context=contextvars.Context())
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._pending:
                now = loop.time()
                earliest = min(map(_due, self._pending))
                if earliest > now:
                    self._wake_at = earliest
                    self._wake.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(earliest - now):
                            await self._wake.wait()
                    self._wake_at = float("inf")
                    continue
                self._flush(now)
        finally:
            if self._task is asyncio.current_task():
                self._task = None
                self._wake = asyncio.Event()  # the old one is bound to this loop: keep no finished loop alive

    def _flush(self, now: float) -> None:
        provider = self._provider()
        horizon = now + min(map(_interval, self._pending))
        due = [renewal for renewal in self._pending if renewal.due < horizon]
        self._pending.difference_update(due)
        # One item per (key, owner): nested holds of one owner share it, with the longest TTL.
        # (Few objects per lease: a flush's temporaries, promoted by the GC, trigger full collections.)
        groups: dict[tuple[str, str], _BatchedRenewal | list[_BatchedRenewal]] = {}
        for renewal in due:
            if renewal.done:
                continue
            if now >= renewal.deadline or provider is None:
                self._answer(renewal, None)  # too late to renew: never sent, the loss is declared
                continue
            renewal.sent = now
            other = groups.setdefault(renewal.holder, renewal)
            if other is not renewal:
                if isinstance(other, list):
                    other.append(renewal)
                else:
                    groups[renewal.holder] = [other, renewal]
        for holders in distinct_key_chunks(groups):
            self._spawn(self._send(provider, holders, groups))

    async def _send(
        self,
        provider: Any,
        holders: list[tuple[str, str]],
        groups: dict[tuple[str, str], _BatchedRenewal | list[_BatchedRenewal]],
    ) -> None:
        loop = asyncio.get_running_loop()
        # The TTL is read now, as the per-lease path reads it at each renewal (nested holds).
        longest = _holds.longest_ttls(provider, holders)
        fenced = takes_fence(provider)
        items: list[Any] = CheckedRenewItems() if fenced else []  # each lease's items were checked as it began
        waiting: list[_BatchedRenewal] = []
        for holder in holders:
            group = groups[holder]
            if isinstance(group, list):
                waiting.extend(group)
                ttl_ms = max(r.lease.ttl_ms for r in group)
                fence = max((r.lease.fence for r in group if r.lease.fence is not None), default=None)
            else:
                waiting.append(group)
                ttl_ms, fence = group.lease.ttl_ms, group.lease.fence
            longer = longest.get(holder, ttl_ms)
            item = (holder[0], holder[1], longer if longer > ttl_ms else ttl_ms)
            items.append((*item, fence) if fenced else item)
        answered_early = False
        try:
            statement = asyncio.ensure_future(provider.renew_many(items))
        except Exception as raised:  # a provider's plain method that raised before returning an awaitable
            for renewal in waiting:
                self._answer(renewal, raised)
            return
        # Each lease is answered by its own deadline: one timer per statement, not per lease.
        while waiting:
            await asyncio.wait({statement}, timeout=max(0.0, min(map(_deadline, waiting)) - loop.time()))
            if statement.done():
                break
            now = loop.time()
            for renewal in waiting:
                if renewal.deadline <= now:
                    answered_early = True
                    self._answer(renewal, NO_ANSWER)
            waiting = [renewal for renewal in waiting if renewal.deadline > now and not renewal.done]
        if not statement.done():  # every lease of it gave up: stop the statement (its connection is dropped)
            statement.cancel()
            statement.add_done_callback(_consume_result)
            return
        exc = None if statement.cancelled() else statement.exception()
        if statement.cancelled() or exc is not None:
            for renewal in waiting:
                self._answer(renewal, exc if exc is not None else NO_ANSWER)
            return
        renewed: dict[str, LeaseInfo] = statement.result()
        unanswered = set(waiting) if answered_early else None
        for holder in holders:
            info = renewed.get(holder[0])
            result: LeaseInfo | bool = info if info is not None and info.owner == holder[1] else False
            group = groups[holder]
            for renewal in group if isinstance(group, list) else (group,):
                if unanswered is None or renewal in unanswered:
                    self._answer(renewal, result)

    def _answer(self, renewal: _BatchedRenewal, answer: Any) -> None:
        """Judge ``answer`` for ``renewal``: a ``LeaseInfo``, False (refused), None (never sent),
        ``NO_ANSWER`` or the exception the statement raised."""
        if renewal.done:
            return  # withdrawn meanwhile
        if renewal.lease._renew_lock.locked():  # a transfer is in flight: judge after it
            self._spawn(self._answer_after_transfer(renewal, answer))
            return
        self._judge(renewal, answer)

    async def _answer_after_transfer(self, renewal: _BatchedRenewal, answer: Any) -> None:
        async with renewal.lease._renew_lock:
            if not renewal.done:
                self._judge(renewal, answer)

    def _judge(self, renewal: _BatchedRenewal, answer: Any) -> None:
        lease, course = renewal.lease, renewal.course
        if lease._finished():
            renewal.done = True
            return
        now = asyncio.get_running_loop().time()
        sent = renewal.sent
        if sent is None:  # never sent before the deadline (a blocked loop, or a retry's turn)
            course.lose_too_late(lease._late(now - renewal.due))
            renewal.done = True
            return
        next_at = course.judge(answer, now, sent, renewal.deadline, lease._late(sent - renewal.due))
        if next_at is None:
            renewal.done = True
            return
        renewal.due, renewal.deadline, renewal.sent = next_at, lease._deadline, None
        self._schedule(renewal)


_batchers: weakref.WeakKeyDictionary[Any, weakref.WeakKeyDictionary[Any, _RenewalBatcher]] = weakref.WeakKeyDictionary()


def _batcher_for(provider: LeaseProvider) -> _RenewalBatcher | None:
    """The renewal batcher of ``provider`` in the running event loop, if the provider has
    ``renew_many`` (looked up on the class, as ``renew_lease_info``); else None."""
    if not callable(getattr(type(provider), "renew_many", None)):
        return None
    try:
        per_loop = _batchers.get(provider)
        if per_loop is None:
            per_loop = _batchers[provider] = weakref.WeakKeyDictionary()
    except TypeError:  # not weak-referenceable: renew one by one
        return None
    loop = asyncio.get_running_loop()
    batcher = per_loop.get(loop)
    if batcher is None:
        batcher = per_loop[loop] = _RenewalBatcher(provider)
    return batcher


class _LossTimer:
    """One event-loop timer at the earliest deadline of the ``hold()`` blocks in one loop: it
    declares each lease lost as soon as the loop runs after its deadline, before the wake-ups of
    tasks (a renewer's or a body's) that the same turn makes ready. No object per lease or renewal."""

    def __init__(self) -> None:
        self.leases: set[HeldLease] = set()
        self._handle: asyncio.TimerHandle | None = None
        self._at = float("inf")

    def add(self, lease: HeldLease) -> None:
        self.leases.add(lease)
        self._arm(lease._deadline)

    def discard(self, lease: HeldLease) -> None:
        self.leases.discard(lease)
        if not self.leases and self._handle is not None:
            self._handle.cancel()  # keep no finished loop alive
            self._handle, self._at = None, float("inf")

    def _arm(self, at: float) -> None:
        if at < self._at:
            if self._handle is not None:
                self._handle.cancel()
            self._at = at
            loop = asyncio.get_running_loop()
            self._handle = loop.call_at(at, self._fire, context=contextvars.Context())

    def _fire(self) -> None:
        self._handle, self._at = None, float("inf")
        due, earliest = due_losses(self.leases, asyncio.get_running_loop().time())
        for lease, late_s in due:
            lease._noticed(late_s)
        if earliest < float("inf"):
            self._arm(earliest)


_loss_timers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LossTimer] = weakref.WeakKeyDictionary()


def _loss_timer() -> _LossTimer:
    loop = asyncio.get_running_loop()
    timer = _loss_timers.get(loop)
    if timer is None:
        timer = _loss_timers[loop] = _LossTimer()
    return timer


class HeldLease(HoldRules[LeaseProvider, OnLost]):
    """A lease held for the duration of an ``async with`` block; made by :func:`hold`, which
    takes the same arguments: ``HeldLease(provider, key, owner=None, ttl_ms=15_000, *,
    renew_every_ms=None, wait=False, timeout_s=None, on_lost="cancel", data=None, min_hold_ms=None,
    limit=1)``.

    Attributes: ``key``, ``owner``, ``fence`` (the fencing token of this tenure), ``expires_at``
    (aware UTC, by the database's clock: the acquire's answer, then each renewal's; for providers
    without ``renew_lease_info``, the acquire's answer advanced by the time elapsed since), ``lost``
    (an ``asyncio.Event`` set when the lease is lost), ``lost_reason``, ``transferred_to`` and
    ``data`` (the lease data given to :func:`hold`, or None), ``limit`` (1, or the semaphore's
    limit: the hold is then one slot of the key).

    ``check()`` raises ``LeaseLostError`` and ``valid`` is False once the local deadline (the last
    confirmed expiry less 10% of the TTL, by the loop's clock) has passed, judged when called: ask
    right before a side effect, even after the loop was blocked. A loop timer at that deadline
    sets ``lost`` as soon as the loop runs again, before the task wake-ups of the same turn. A
    loss the body itself finds (``check()``, ``valid``, ``transfer_to``) does not cancel it: it
    acts on the answer, and with ``on_lost="cancel"`` leaving the block raises ``LeaseLostError``.
    """

    lost: asyncio.Event
    _registry = _holds

    def _setup(self) -> None:
        self.lost = asyncio.Event()
        self._body_task: asyncio.Task[Any] | None = None
        self._cancelling = 0
        self._renewer: asyncio.Task[None] | None = None
        self._batched: _BatchedRenewal | None = None
        self._renew_lock = asyncio.Lock()
        self._cancelled_for_loss = False
        self._closing = False
        self._background: set[asyncio.Future[Any]] = set()
        self._time: Any = None  # the block's loop.time
        self._loss_timer: _LossTimer | None = None

    def _clock(self) -> float:
        """The event loop's clock (``loop.time()``, seconds), readable from the block's loop."""
        return self._time() if self._time is not None else asyncio.get_running_loop().time()  # type: ignore[no-any-return]

    async def __aenter__(self) -> HeldLease:
        loop = asyncio.get_running_loop()
        if self._handoff is not None:
            first_due = self._adopted(*await self._read_back())
            return self._start_holding(first_due)
        try:
            if self.wait:
                waiting = self._waiting(AsyncWaitingAcquire)
                result, sent = await waiting.timed()
            else:
                sent = loop.time()
                result = await self.provider.acquire_lease(
                    self.key, self.owner, self._call_ttl_ms, **self._acquire_kw()
                )
        except NOTHING_TAKEN:
            raise  # nothing can have been acquired
        except BaseException as exc:
            # The acquire may have committed. Unless another hold() of this owner holds the key
            # here, release it, or the key stays taken for a whole TTL.
            if not self._kept_by_another():
                if isinstance(exc, asyncio.CancelledError):
                    await self._release_shielded(None)
                else:  # the database is failing: don't make the caller wait for a second timeout
                    self._release_in_background()
            raise
        first_due = self._acquired(result, sent)
        late = self._entered_late()
        if late is not None:  # the body must not start on a lease about to be lost
            if self._leave() and not self._kept_by_another():
                await self._release_shielded(self._margin_s)
            raise late
        return self._start_holding(first_due)

    async def _read_back(self) -> tuple[LeaseInfo | AcquireResult | list[LeaseInfo] | None, float]:
        """The tenure handed to this owner, as the database has it, and when the answer came,
        bounded by the handoff's deadline: ``get_lease`` (``get_lease_holders`` for a semaphore),
        or, for a provider without it, an acquire by the owner (it extends the tenure, whichever it is)."""
        loop = asyncio.get_running_loop()
        reader = self._reader()
        if reader is not None:
            call = reader(self.key)
        else:
            call = self.provider.acquire_lease(self.key, self.owner, self._call_ttl_ms, **self._acquire_kw())
        answer = await _until(asyncio.ensure_future(call), max(0.001, self._handoff_window(loop.time())))
        if answer is NO_ANSWER:
            return None, loop.time()  # judged too late: the window has passed
        if isinstance(answer, BaseException):
            raise answer
        return answer, loop.time()

    def _start_holding(self, first_due: float) -> HeldLease:
        loop = asyncio.get_running_loop()
        self._body_task = asyncio.current_task()
        self._cancelling = self._body_task.cancelling() if self._body_task is not None else 0
        self._time = loop.time
        self._loss_timer = _loss_timer()
        self._loss_timer.add(self)  # the loss at the deadline, whatever the renewer is doing
        batcher = _batcher_for(self.provider)
        if batcher is not None:
            self._batched = batcher.add(self, first_due)
        else:
            self._renewer = asyncio.create_task(self._renew_loop(first_due), name=f"sql_lease renew {self.key}")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._in_child():  # a fork of the holder leaves the block: it never held the lease
            return
        self._closing = True
        lost_by_our_cancel = False
        if self._cancelled_for_loss and self._body_task is not None:
            self._cancelled_for_loss = False
            # As asyncio.timeout does: convert only our own cancellation; one from outside goes on.
            if self._body_task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                lost_by_our_cancel = True
        try:
            await self._stop_renewer()
        finally:  # also when cancelled while stopping a per-lease renewer task
            if self._leave():
                await self._release_shielded(self._release_limit_s(), ran=True)
        if lost_by_our_cancel:
            raise self._lost_error() from exc
        self._exit_loss(exc_type)

    async def _stop_renewer(self) -> None:
        timer, self._loss_timer = self._loss_timer, None
        if timer is not None:
            timer.discard(self)
        batched, self._batched = self._batched, None
        if batched is not None:
            batched.withdraw()
        renewer, self._renewer = self._renewer, None
        if renewer is not None and renewer is not asyncio.current_task():
            renewer.cancel()
            await asyncio.wait({renewer})  # our own cancellation, if any, goes on from here
            if not renewer.cancelled() and renewer.exception() is not None:
                # the renewer never raises on purpose; don't skip the release
                self._log("renewing", " stopped with an unexpected error: %r", renewer.exception())

    async def _release_shielded(self, limit_s: float | None, *, ran: bool = False) -> None:
        """Release (with the minimum hold once the body ``ran``), finishing the one statement even
        if cancelled meanwhile; give up after ``limit_s`` seconds (None: the provider's own timeout)."""
        release = asyncio.ensure_future(self.provider.release_lease(self.key, self.owner, **self._release_kw(ran=ran)))
        try:
            try:
                await asyncio.wait({release}, timeout=limit_s)
            except asyncio.CancelledError:
                await asyncio.wait({release}, timeout=limit_s)  # then let the cancellation go on
                raise
        finally:
            if not release.done():
                _abandon(release)
                self._log("releasing", ": no answer in time; it expires by its TTL", level=logging.WARNING)
            elif not release.cancelled() and (failure := release.exception()) is not None:
                self._release_failed(failure)
            elif ran and not release.cancelled():
                self._released(release.result())

    def _release_in_background(self) -> None:
        release = asyncio.ensure_future(
            self.provider.release_lease(self.key, self.owner, **self._release_kw(ran=False))
        )
        self._background.add(release)
        release.add_done_callback(self._background.discard)
        release.add_done_callback(_consume_result)

    def _declare_lost(self, reason: str) -> None:
        if self.lost.is_set():
            return
        self.lost_reason = reason
        self.lost.set()
        self._announce_loss(reason)
        if self._batched is not None:
            self._batched.withdraw()  # nothing left to renew
        try:
            current = asyncio.current_task()
        except RuntimeError:
            current = None
        # Declared by the body itself (check(), valid, transfer_to): it acts on the answer at once.
        if self.on_lost == "cancel" and not self._closing and self._body_task not in (None, current):
            assert self._body_task is not None
            self._cancelled_for_loss = True
            self._body_task.cancel(f"sql_lease: lease {self.key!r} lost: {reason}")

    async def _renew_once(self) -> LeaseInfo | bool:
        call, with_info = renewal_method(self.provider)
        return renewal_answer(await call(self.key, self.owner, self._call_ttl_ms, **self._renew_kw()), with_info)

    async def _renew_loop(self, first_due: float) -> None:
        """Renew this lease on its own, for a provider without ``renew_many``; a provider with it
        renews through the batcher, which follows the same rules (:class:`RenewalCourse`)."""
        loop = asyncio.get_running_loop()
        course = RenewalCourse(self, self.renew_every_ms / 1000)
        next_at: float | None = first_due
        while next_at is not None:
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            async with self._renew_lock:
                sent = loop.time()
                turn = course.turn(next_at, sent)
                if turn is None:
                    return
                late, deadline = turn
                # The renewal runs as its own task and is waited for only until the deadline, so loss
                # is declared on time even if the provider is slow to give up on a dead connection.
                answer = await _until(asyncio.ensure_future(self._renew_once()), deadline - sent)
                next_at = course.judge(answer, loop.time(), sent, deadline, late)

    async def transfer_to(
        self, next_owner: str, ttl_ms: int | float | None = None, *, data: dict[str, Any] | None = None
    ) -> bool:
        """Hand the lease to ``next_owner`` with no gap (``transfer_lease``), for ``ttl_ms``
        milliseconds (default: this lease's TTL), with lease ``data`` for the next owner (None:
        none). On success this holder stops renewing and will not release on exit. Returns False
        if the lease was no longer ours (lost, its deadline passed, or refused by the provider).

        The transfer is bounded by the lease's deadline: with no answer by then its outcome is
        unknown (``next_owner`` may hold the lease), so the lease is declared lost and
        ``LeaseBackendError`` is raised. Loss detection goes on while a transfer is in flight."""
        ttl = self._transfer_ttl(next_owner, ttl_ms, data)
        async with self._renew_lock:
            window = self._transfer_window()
            if window is None:
                return False
            sent = asyncio.get_running_loop().time()
            call = self.provider.transfer_lease(
                self.key, self.owner, next_owner, ttl, **data_kw(data), **self._renew_kw()
            )
            answer = await _until(asyncio.ensure_future(call), window)
            if answer is NO_ANSWER:  # the deadline passed: the statement was stopped
                raise self._transfer_unanswered(next_owner)
            if isinstance(answer, BaseException):
                self._transfer_failed(next_owner, answer)
                raise answer
            moved = self._transferred(bool(answer), next_owner, ttl, sent)
        if self.transferred_to is not None:
            await self._stop_renewer()
        return moved


def _abandon(future: asyncio.Future[Any]) -> None:
    """Stop waiting for ``future``: cancel it, and retrieve its outcome when it comes."""
    future.cancel()
    future.add_done_callback(_consume_result)


async def _until(call: asyncio.Future[Any], timeout_s: float) -> Any:
    """``call``'s answer within ``timeout_s`` seconds: its result, the exception it raised, or
    ``NO_ANSWER`` (then it is cancelled). A cancellation of the caller cancels it too."""
    try:
        await asyncio.wait({call}, timeout=timeout_s)
    except asyncio.CancelledError:
        _abandon(call)
        raise
    if not call.done():
        _abandon(call)
        return NO_ANSWER
    return call.exception() or call.result()


hold = shortcut(
    HeldLease,
    itself,
    "hold",
    """Hold ``key`` while an ``async with`` block runs, renewing it in the background.

    ``hold(provider, key, owner=None, ttl_ms=15_000, *, renew_every_ms=None, wait=False,
    timeout_s=None, on_lost="cancel", data=None, min_hold_ms=None, limit=1)`` returns a :class:`HeldLease`::

        async with hold(provider, "thread:42", ttl_ms=15_000) as lease:
            await work(fence=lease.fence)

    Args:
        owner: the owner id; None generates a unique one (``host:pid:random``).
        ttl_ms: lease TTL in milliseconds; renewed every ``renew_every_ms`` (default TTL/3).
        wait: wait for the key (up to ``timeout_s`` seconds; None: no limit) instead of failing;
            ``ValueError`` for ``timeout_s`` without ``wait=True``.
        on_lost: ``"cancel"`` (default) cancels the block and raises ``LeaseLostError`` from the
            ``async with``; ``"flag"`` only sets ``lease.lost``.
        data: lease data stored at the acquire (a ``dict``, see ``LeaseProvider``); passed to the
            provider only when given, so providers without lease data serve ``hold()`` without it.
        min_hold_ms: a minimum hold in milliseconds (ShedLock's ``lockAtLeastFor``): the release
            on leaving the block keeps the lease, marked released, until that long after the
            tenure began (by the provider's clock), so a job that ran 50 ms does not run again on
            another host before then; ``TypeError`` for a provider without ``accepts_fence``.
        limit: hold one of at most ``limit`` slots of ``key`` (a semaphore: "at most N of these at
            once"); default 1, a plain lease. ``wait=True`` waits for any slot. ``TypeError`` for
            ``limit`` > 1 with a provider without ``accepts_limit``, before anything is sent.

    Every renewal, transfer and release the block sends carries its tenure's fence (on providers
    with ``accepts_fence``), so it never renews or releases a later tenure of the same owner id.

    Raises ``LeaseNotAcquiredError`` (naming the holder) when the key is held by another owner,
    or when the acquire answered at or after the lease's deadline (90% of the TTL
    after it was sent: the lease is then released, bounded, and the block never starts),
    ``LeaseBackendError`` when the database fails at acquire. A renewal that raises is retried with
    backoff; the lease is declared lost only when no renewal succeeded before the last known expiry
    minus a safety margin (10% of the TTL), or a renewal returns False; ``lease.check()`` and
    ``lease.valid`` judge that deadline by the loop's clock when called. On exit (normal, exception
    or cancellation) the lease is released, shielded from cancellation, unless it was transferred.
    A process forked inside the block does not hold the lease: there ``valid`` is False,
    ``check()`` raises ``LeaseLostError``, and leaving the block neither releases nor renews it
    (nor declares it lost); the parent keeps it.
    """,
)


class _Member(GroupMember, HeldLease):
    """One key of a :class:`HeldLeases`: renewed as a ``hold()`` (through the batcher, with its fence)."""

    _callback = None


class HeldLeases(HeldKeys):
    """Several leases held, all or nothing, while an ``async with`` block runs; made by
    :func:`hold_all`, which takes the same arguments: ``HeldLeases(provider, keys, owner=None,
    ttl_ms=15_000, *, renew_every_ms=None, wait=False, timeout_s=None, on_lost="cancel", data=None)``.

    Entering takes every key with one ``acquire_leases`` (``LeaseNotAcquiredError`` naming the holder
    of the first key that blocked; nothing is held then; ``wait=True``: one per attempt until all are
    taken or ``timeout_s`` passes). Each key is then held as by ``hold()``:
    renewed with its own fencing token, and on a provider with ``renew_many`` by the one renewal
    batcher, so the keys of one block are renewed by one statement per interval. A loss of any key
    is the loss of the whole hold: ``lost`` is set, ``on_lost="cancel"`` cancels the block once, and
    leaving raises ``LeaseLostError`` as ``hold()`` does. Leaving releases every key with one
    ``release_leases`` carrying each key's fence, so it never frees a newer tenure of the same owner.

    Attributes: ``keys``, ``owner``, ``fences`` (each key's fencing token, by key), ``leases`` (the
    :class:`HeldLease` of each key, in the order of ``keys``), ``lost`` (an ``asyncio.Event``),
    ``lost_reason``; ``check()`` and ``valid`` as on a ``HeldLease``, for every key at once.
    """

    _member = _Member
    _event = asyncio.Event
    lost: asyncio.Event
    leases: list[HeldLease]

    async def __aenter__(self) -> HeldLeases:
        loop = asyncio.get_running_loop()
        first, pacing = self.leases[0], self._pacing()
        if pacing is not None:
            pacing.start(loop.time())
        while True:
            sent = loop.time()
            try:
                results = await self._acquire_all(pacing, sent)
            except NOTHING_TAKEN:
                raise
            except BaseException:  # the acquire may have committed: free what it took
                self._release_in_background(self.keys)
                raise
            if pacing is None or all(result.acquired for result in results):
                break
            await asyncio.sleep(self._pause(results, pacing, loop.time()))
        due, late = self._granted(results, sent)
        if late is not None:  # the body must not start on leases about to be lost
            await self._release(self._group.take_releasing(), first._margin_s)
            raise late
        for lease, first_due in zip(self.leases, due, strict=True):
            lease._start_holding(first_due)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        errors: list[BaseException] = []
        for lease in self.leases:
            try:
                await lease.__aexit__(exc_type, exc, tb)
            except BaseException as error:
                errors.append(error)
        await self._release(self._group.take_releasing(), self._exit_limit_s())
        raised = HoldGroup.first_error(errors)
        if raised is not None:
            raise raised

    async def _acquire_all(self, pacing: WaitingAcquire[Any] | None, sent: float) -> list[AcquireResult]:
        """One ``acquire_leases`` of every key, sent at ``sent``; while waiting, bounded as a waiting
        single key's attempt."""
        first = self.leases[0]
        limit = {} if pacing is None else _acquire_timeout_kw(self.provider, pacing.attempt_limit(sent))
        attempt = self.provider.acquire_leases(  # type: ignore[attr-defined]
            self.keys, self.owner, first._call_ttl_ms, **data_kw(first.data), **limit
        )
        return await _bounded(attempt, None if pacing is None else pacing.attempt_end(sent))  # type: ignore[no-any-return]

    async def _release(self, keys: list[str], limit_s: float | None) -> None:
        """Release ``keys`` in one statement, finishing it even if cancelled meanwhile; give up after
        ``limit_s`` seconds (None: the provider's own timeout)."""
        if not keys:
            return
        release = asyncio.ensure_future(
            self.provider.release_leases(keys, self.owner, **self._group.release_kw(keys))  # type: ignore[attr-defined]
        )
        try:
            try:
                await asyncio.wait({release}, timeout=limit_s)
            except asyncio.CancelledError:
                await asyncio.wait({release}, timeout=limit_s)
                raise
        finally:
            if not release.done():
                _abandon(release)
                log.warning(
                    "releasing %d leases of %r: no answer in time; they expire by their TTL", len(keys), self.owner
                )
            elif not release.cancelled() and (failure := release.exception()) is not None:
                log.error("releasing %d leases of %r failed: %s", len(keys), self.owner, failure)
            elif not release.cancelled():
                self._released(keys, release.result())

    def _release_in_background(self, keys: list[str]) -> None:
        release = asyncio.ensure_future(
            self.provider.release_leases(keys, self.owner, **self._group.release_kw(keys))  # type: ignore[attr-defined]
        )
        release.add_done_callback(_consume_result)


hold_all = shortcut(
    HeldLeases,
    itself,
    "hold_all",
    """Hold every key of ``keys`` (all or nothing) while an ``async with`` block runs, renewing them together.

    ``hold_all(provider, keys, owner=None, ttl_ms=15_000, *, renew_every_ms=None, wait=False,
    timeout_s=None, on_lost="cancel", data=None)`` returns a :class:`HeldLeases`::

        async with hold_all(provider, ["account:1", "account:2"], ttl_ms=15_000) as leases:
            await move_money(fences=leases.fences)

    ``provider`` must have ``acquire_leases`` and ``release_leases`` (every provider of sql_lease).
    ``LeaseNotAcquiredError`` when a key is held by another owner (nothing is held then); with
    ``wait=True`` it waits until every key can be taken at once, at most ``timeout_s`` seconds (None:
    no limit; polling, nothing held while waiting), then raises it as ``hold(wait=True)`` does. A
    loss of any key is the loss of all (``lost``, ``check()``, ``LeaseLostError`` as ``hold()``).""",
)
