"""Holding leases on any ``LeaseProvider``: ``hold()``, waiting acquire, handoff, and the sweeper.

Built on the five protocol methods only, so it serves every provider. Mastra's signals runtime does
this by hand (renew every TTL/3, transfer to the queued run, release when drained); here it is one
API. A provider may offer a faster wake-up for waiters through an optional method
``release_waiter(key)`` (``SqlLeaseProvider`` on PostgreSQL: LISTEN/NOTIFY); without one, waiters
poll with backoff. Waits are derived from durations the provider reports (``remaining_ms``, by the
database's clock) and this process's monotonic clock, never from comparing timestamps.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import random
import socket
import threading
import uuid
import weakref
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Generic, Literal, Protocol, TypeVar

from . import observe
from .contract import (
    AcquireResult,
    LeaseInfo,
    LeaseProvider,
    encode_data,
    validate_key,
    validate_owner,
    validate_seconds,
    validate_sweep,
    validate_ttl_ms,
)
from .errors import (
    LeaseBackendError,
    LeaseConfigError,
    LeaseError,
    LeaseLostError,
    LeaseNotAcquiredError,
    ProviderClosedError,
    SchemaMissingError,
)

__all__ = [
    "ExpirySweeper",
    "HeldLease",
    "LeaseProviderBase",
    "SweepsExpired",
    "acquire_lease_wait",
    "hold",
    "new_owner_id",
]

log = logging.getLogger("sql_lease")

OnLost = Literal["cancel", "flag"]

LOSS_MARGIN = 0.1
"""``hold()`` declares a lease lost this fraction of its TTL before its last known expiry."""

JITTER_S = 0.05
"""A renewal late by less than this (seconds) was delayed by scheduling, not by a blocked loop."""

MAX_RENEW_FRACTION = 0.75
"""The longest accepted ``renew_every_ms``, as a fraction of the TTL: the first renewal is due then
and has until ``1 - LOSS_MARGIN`` of the TTL to succeed, retries included."""


def new_owner_id() -> str:
    """A unique owner id: ``host:pid:random``, readable in ``get_lease_owner`` output."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def data_kw(data: object) -> dict[str, Any]:
    """``{"data": data}`` when lease data was given, else nothing: providers without ``data`` still serve."""
    return {} if data is None else {"data": data}


def _validate_timeout_s(timeout_s: object) -> float | None:
    return None if timeout_s is None else validate_seconds(timeout_s, "timeout_s")


def validate_hold_options(
    ttl_ms: object, renew_every_ms: object, timeout_s: object
) -> tuple[float, float, float | None]:
    """``hold()``'s numbers, checked as both flavours (asyncio and threads) check them: the TTL and
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
    return ttl, every, _validate_timeout_s(timeout_s)


def _seconds_left(result: AcquireResult) -> float | None:
    """The holder's remaining TTL in seconds as the provider measured it, if it said."""
    return None if result.remaining_ms is None else max(0.0, result.remaining_ms / 1000)


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

    async def acquire(self, owner: str, ttl_ms: int | float, *, data: dict[str, Any] | None = None) -> AcquireResult:
        return await self._provider.acquire_lease(self.key, owner, ttl_ms, **data_kw(data))

    async def wait(self, timeout_s: float) -> bool:
        await asyncio.sleep(timeout_s)
        return False


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


_local_queues: weakref.WeakKeyDictionary[Any, dict[str, _LocalQueue]] = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def _local_queue(provider: LeaseProvider, key: str, owner: str) -> Iterator[tuple[_LocalQueue, asyncio.Event] | None]:
    try:
        queues = _local_queues.setdefault(provider, {})
    except TypeError:  # not weak-referenceable: no coalescing
        yield None
        return
    queue = queues.setdefault(key, _LocalQueue())
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
            del queues[key]


async def acquire_lease_wait(
    provider: LeaseProvider,
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
    """Acquire ``key`` for ``owner``, waiting up to ``timeout_s`` seconds (None: no limit) while
    another owner holds it; ``data``: the lease data to store (passed to the provider only when given).

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
    """
    result, _sent = await _acquire_wait_timed(
        provider, key, owner, ttl_ms, timeout_s, poll_initial_s, poll_max_s, listen_max_wait_s, data
    )
    return result


ATTEMPT_GRACE_S = 1.0
"""A waiting acquire's attempt may run this many seconds past the deadline (a release in the last
pause is still seen; a stalled network costs at most this much more than ``timeout_s``)."""


class _Tries:
    """Attempts of one waiting acquire, each ending by the deadline plus ``ATTEMPT_GRACE_S``."""

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline

    async def run(self, attempt: Any) -> AcquireResult:
        if self.deadline is None:
            return await attempt  # type: ignore[no-any-return]
        end = max(self.deadline, asyncio.get_running_loop().time()) + ATTEMPT_GRACE_S
        result: AcquireResult = await _bounded(attempt, end)
        return result


async def _acquire_wait_timed(
    provider: LeaseProvider,
    key: str,
    owner: str,
    ttl_ms: int | float,
    timeout_s: float | None,
    poll_initial_s: float,
    poll_max_s: float,
    listen_max_wait_s: float,
    data: dict[str, Any] | None = None,
) -> tuple[AcquireResult, float]:
    """``acquire_lease_wait``, also returning when (``loop.time()``) the successful attempt was sent."""
    validate_key(key), validate_owner(owner), validate_ttl_ms(ttl_ms), encode_data(data)
    given = data_kw(data)
    limit = _validate_timeout_s(timeout_s)
    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline = None if limit is None else started + limit
    tries = _Tries(deadline)
    with _local_queue(provider, key, owner) as local:
        while True:
            has_turn = False
            if local is not None:
                queue, nudge = local
                try:
                    has_turn = await queue.wait_turn(nudge, deadline)
                except TimeoutError:
                    sent = loop.time()
                    result = await tries.run(provider.acquire_lease(key, owner, ttl_ms, **given))  # names the holder
                    if result.acquired:
                        return result, sent
                    raise LeaseNotAcquiredError(
                        key, result.owner, result.fence, result.expires_at, waited_s=loop.time() - started
                    ) from None
                if not has_turn:  # nudged: the lease may have been handed to us
                    nudge.clear()
                    sent = loop.time()
                    result = await tries.run(provider.acquire_lease(key, owner, ttl_ms, **given))
                    if result.acquired:
                        return result, sent
                    continue
            try:
                return await _wait_at_head(
                    provider,
                    key,
                    owner,
                    ttl_ms,
                    started,
                    deadline,
                    poll_initial_s,
                    poll_max_s,
                    listen_max_wait_s,
                    local[0] if local else None,
                    tries,
                    given,
                )
            finally:
                if has_turn and local is not None:
                    local[0].lock.release()


async def _wait_at_head(
    provider: LeaseProvider,
    key: str,
    owner: str,
    ttl_ms: int | float,
    started: float,
    deadline: float | None,
    poll_initial_s: float,
    poll_max_s: float,
    listen_max_wait_s: float,
    queue: _LocalQueue | None,
    tries: _Tries,
    given: dict[str, Any],
) -> tuple[AcquireResult, float]:
    """The waiting loop of the one waiter (per process and key) that queries the database."""
    loop = asyncio.get_running_loop()
    hook = getattr(provider, "release_waiter", None)
    waiter = (hook(key) if callable(hook) else None) or _PollingWaiter(provider, key)
    async with waiter:
        delay = poll_initial_s
        while True:
            sent = loop.time()
            result = await tries.run(waiter.acquire(owner, ttl_ms, **given))
            if result.acquired:
                return result, sent
            if queue is not None and result.owner != owner:
                queue.nudge(result.owner)  # handed to a waiter behind us: let it take over
            now = loop.time()
            if deadline is not None and now >= deadline:
                raise LeaseNotAcquiredError(key, result.owner, result.fence, result.expires_at, waited_s=now - started)
            if waiter.listening:
                pause = listen_max_wait_s
            else:
                pause = delay * random.uniform(0.5, 1.0)
                delay = min(delay * 2, poll_max_s)
            until_expiry = _seconds_left(result)
            if until_expiry is not None:
                pause = min(pause, until_expiry - (loop.time() - now) + 0.001)
            if deadline is not None:
                pause = min(pause, deadline - now)
            await waiter.wait(pause)


def _consume_result(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


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
    thread: nested holds of one owner keep the lease until the outermost exits, and every renewal
    uses the longest TTL among them. A provider that is not weak-referenceable is not tracked."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
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
        with self._lock, contextlib.suppress(TypeError):  # not weak-referenceable: not tracked
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


_holds: HoldRegistry[HeldLease] = HoldRegistry()


def _renews_with_info(provider: LeaseProvider) -> bool:
    # Looked up on the class: a wrapper that forwards attributes must not bypass its renew_lease.
    return callable(getattr(type(provider), "renew_lease_info", None))


RENEW_BATCH_SIZE = 1000
"""``hold()`` blocks renewing through one batcher send at most this many leases per statement."""


_NO_ANSWER = object()
"""A batched renewal's answer when its statement had not answered by the lease's deadline."""


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


class _RenewalBatcher:
    """Coalesced renewals of the ``hold()`` blocks on one provider in one event loop (the provider
    has ``renew_leases``). When the earliest renewal falls due, one statement (per
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
                earliest = min(renewal.due for renewal in self._pending)
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
        horizon = now + min(renewal.course.interval for renewal in self._pending)
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
        for holders in _distinct_key_chunks(groups):
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
        items = []
        waiting: list[_BatchedRenewal] = []
        for holder in holders:
            group = groups[holder]
            if isinstance(group, list):
                waiting.extend(group)
                ttl_ms = max(r.lease.ttl_ms for r in group)
            else:
                waiting.append(group)
                ttl_ms = group.lease.ttl_ms
            longer = longest.get(holder, ttl_ms)
            items.append((holder[0], holder[1], longer if longer > ttl_ms else ttl_ms))
        answered_early = False
        try:
            statement = asyncio.ensure_future(provider.renew_leases(items))
        except Exception as raised:  # a provider's plain method that raised before returning an awaitable
            for renewal in waiting:
                self._answer(renewal, raised)
            return
        # Each lease is answered by its own deadline: one timer per statement, not per lease.
        while waiting:
            await asyncio.wait({statement}, timeout=max(0.0, min(r.deadline for r in waiting) - loop.time()))
            if statement.done():
                break
            now = loop.time()
            for renewal in waiting:
                if renewal.deadline <= now:
                    answered_early = True
                    self._answer(renewal, _NO_ANSWER)
            waiting = [renewal for renewal in waiting if renewal.deadline > now and not renewal.done]
        if not statement.done():  # every lease of it gave up: stop the statement (its connection is dropped)
            statement.cancel()
            statement.add_done_callback(_consume_result)
            return
        exc = None if statement.cancelled() else statement.exception()
        if statement.cancelled() or exc is not None:
            for renewal in waiting:
                self._answer(renewal, exc if exc is not None else _NO_ANSWER)
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
        ``_NO_ANSWER`` or the exception the statement raised."""
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
        if lease.transferred_to is not None or lease.lost.is_set():
            renewal.done = True
            return
        now = asyncio.get_running_loop().time()
        sent = renewal.sent
        if sent is None:  # never sent before the deadline (a blocked loop, or a retry's turn)
            course.lose_too_late(lease._late(now - renewal.due))
            renewal.done = True
            return
        late = lease._late(sent - renewal.due)
        renewed: LeaseInfo | bool | None = None
        if answer is _NO_ANSWER:
            course.no_answer()
        elif isinstance(answer, BaseException):
            course.failed(answer)
        else:
            renewed = answer
        next_at = course.after(renewed, now, sent, renewal.deadline, late)
        if next_at is None:
            renewal.done = True
            return
        renewal.due, renewal.deadline, renewal.sent = next_at, lease._deadline, None
        self._schedule(renewal)


def _distinct_key_chunks(holders: Iterable[tuple[str, str]]) -> Iterator[list[tuple[str, str]]]:
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


_batchers: weakref.WeakKeyDictionary[Any, weakref.WeakKeyDictionary[Any, _RenewalBatcher]] = weakref.WeakKeyDictionary()


def _batcher_for(provider: LeaseProvider) -> _RenewalBatcher | None:
    """The renewal batcher of ``provider`` in the running event loop, if the provider has
    ``renew_leases`` (looked up on the class, as ``renew_lease_info``); else None."""
    if not callable(getattr(type(provider), "renew_leases", None)):
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


class RenewalCourse:
    """What a renewer does after each renewal, shared by ``hold()``'s asyncio renewers (one lease
    at a time, or batched) and its thread renewer: retry with backoff until the lease's deadline,
    declare the loss with its true reason, or count the lease valid again and schedule the next
    renewal from when this one was sent. Times are the caller's monotonic clock, in seconds."""

    def __init__(self, lease: Any, interval: float) -> None:
        self.lease = lease
        self.interval = interval
        self.backoff = min(0.05, interval)
        lease._last_error = None

    @property
    def last_error(self) -> str | None:
        """The last failed renewal's error (kept on the lease, for its clock judge too)."""
        return self.lease._last_error  # type: ignore[no-any-return]

    @last_error.setter
    def last_error(self, error: str | None) -> None:
        self.lease._last_error = error

    def lose_too_late(self, late: str) -> None:
        """The renewal's turn came at or after the deadline: the loss, with why."""
        self.lease._declare_lost(self.lease._expired_reason(late))

    def no_answer(self) -> None:
        self.last_error = self.last_error or "the database did not answer in time"
        if observe.observers:
            observe.renewal_failed(self.lease, None)

    def failed(self, exc: BaseException) -> None:
        lease = self.lease
        self.last_error = f"{type(exc).__name__}: {exc}"
        if observe.observers:
            observe.renewal_failed(lease, exc)
        if not isinstance(exc, LeaseError):
            log.error(
                "renewing lease %r held by %r (fence %s) raised an unexpected error: %r",
                lease.key,
                lease.owner,
                lease.fence,
                exc,
            )

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
            log.warning(
                "renewing lease %r held by %r (fence %s) failed, retrying: %s",
                lease.key,
                lease.owner,
                lease.fence,
                self.last_error,
            )
            next_at = now + min(self.backoff, max(0.0, deadline - now))
            self.backoff = min(self.backoff * 2, self.interval)
            return next_at
        if renewed is False:
            lease._declare_lost(f"renewal refused: the lease expired or another owner holds it{late}")
            return None
        lease._valid_until = sent + lease.ttl_ms / 1000
        if isinstance(renewed, LeaseInfo):
            lease.expires_at = renewed.expires_at
        elif lease._acquired_expiry is not None:  # the database's expiry, moved on by elapsed time
            lease.expires_at = lease._acquired_expiry + timedelta(seconds=sent - lease._acquired_at)
        self.last_error, self.backoff = None, min(0.05, self.interval)
        return sent + self.interval


EXPIRED = "no renewal succeeded before the lease expired"


class HoldRules:
    """The rules both faces of ``hold()`` (:class:`HeldLease`, asyncio; ``SyncHeldLease``,
    threads) judge a lease by, in one place. Times are the face's monotonic clock (``_clock``), in
    seconds. The lease is surely ours up to ``_valid_until`` (when the last successful acquire or
    renewal was sent, plus the TTL); its loss is declared at the *deadline*, ``LOSS_MARGIN`` of
    the TTL before that, by the clock alone: whether a renewal or transfer statement has returned
    does not matter."""

    key: str
    owner: str
    ttl_ms: float
    fence: int | None
    lost: Any
    lost_reason: str | None
    transferred_to: str | None
    _valid_until: float
    _last_error: str | None = None  # the last failed renewal's error, until one succeeds
    stall_cause = "the event loop was blocked"
    """What delays a renewal by more than scheduling jitter on this face."""

    def _clock(self) -> float:
        raise NotImplementedError

    def _declare_lost(self, reason: str) -> None:
        raise NotImplementedError

    @property
    def _margin_s(self) -> float:
        """Loss is declared this long before the last known expiry, so the body stops in time."""
        return self.ttl_ms / 1000 * LOSS_MARGIN

    @property
    def _deadline(self) -> float:
        """When (``_clock()``) the loss is declared unless a renewal succeeds first."""
        return self._valid_until - self._margin_s

    def _past_deadline(self, late_note: str = "") -> bool:
        """Declare the loss if the deadline has passed by the clock now; True once lost."""
        if (
            not self.lost.is_set()
            and self.transferred_to is None
            and self.fence is not None
            and self._clock() >= self._deadline
        ):
            self._declare_lost(self._expired_reason(late_note))
        return bool(self.lost.is_set())

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
            raise LeaseLostError(self.key, self.owner, self.lost_reason or "lost")

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

    def _transfer_window(self) -> float | None:
        """Seconds a transfer may take (it is bounded by the deadline), or None when the deadline
        has passed (the loss is then declared: nothing is ours to hand on)."""
        if self._past_deadline():
            return None
        return self._deadline - self._clock()

    def _transferred(self, moved: bool, next_owner: str) -> bool:
        """A transfer's answer: on success to another owner this holder stops renewing."""
        if moved and next_owner != self.owner:
            self.transferred_to = next_owner
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
        now = asyncio.get_running_loop().time()
        earliest = float("inf")
        for lease in list(self.leases):
            if lease.lost.is_set() or lease.transferred_to is not None:
                self.leases.discard(lease)
                continue
            deadline = lease._deadline
            if now >= deadline:
                late = now - deadline
                note = f" (noticed {late:.2f} s after its deadline: {lease.stall_cause})" if late >= JITTER_S else ""
                lease._past_deadline(note)
                self.leases.discard(lease)
            elif deadline < earliest:
                earliest = deadline
        if earliest < float("inf"):
            self._arm(earliest)


_loss_timers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LossTimer] = weakref.WeakKeyDictionary()


def _loss_timer() -> _LossTimer:
    loop = asyncio.get_running_loop()
    timer = _loss_timers.get(loop)
    if timer is None:
        timer = _loss_timers[loop] = _LossTimer()
    return timer


class HeldLease(HoldRules):
    """A lease held for the duration of an ``async with`` block; made by :func:`hold`.

    Attributes: ``key``, ``owner``, ``fence`` (the fencing token of this tenure), ``expires_at``
    (aware UTC, by the database's clock: the acquire's answer, then each renewal's; for providers
    without ``renew_lease_info``, the acquire's answer advanced by the time elapsed since), ``lost``
    (an ``asyncio.Event`` set when the lease is lost), ``lost_reason``, ``transferred_to`` and
    ``data`` (the lease data given to :func:`hold`, or None).

    ``check()`` raises ``LeaseLostError`` and ``valid`` is False once the local deadline (the last
    confirmed expiry less 10% of the TTL, by the loop's clock) has passed, judged when called: ask
    right before a side effect, even after the loop was blocked. A loop timer at that deadline
    sets ``lost`` as soon as the loop runs again, before the task wake-ups of the same turn. A
    loss the body itself finds (``check()``, ``valid``, ``transfer_to``) does not cancel it: it
    acts on the answer, and with ``on_lost="cancel"`` leaving the block raises ``LeaseLostError``.
    """

    provider: LeaseProvider
    lost: asyncio.Event
    data: dict[str, Any] | None

    def __init__(
        self,
        provider: LeaseProvider,
        key: str,
        owner: str | None = None,
        ttl_ms: int | float = 15_000,
        *,
        renew_every_ms: int | float | None = None,
        wait: bool = False,
        timeout_s: float | None = None,
        on_lost: OnLost = "cancel",
        data: dict[str, Any] | None = None,
    ) -> None:
        self.provider = provider
        encode_data(data)
        self.data = data
        self.key = validate_key(key)
        self.owner = validate_owner(owner) if owner is not None else new_owner_id()
        self.ttl_ms, self.renew_every_ms, self.timeout_s = validate_hold_options(ttl_ms, renew_every_ms, timeout_s)
        if on_lost not in ("cancel", "flag"):
            raise ValueError(f"on_lost must be 'cancel' or 'flag', not {on_lost!r}")
        self.wait = bool(wait)
        self.on_lost: OnLost = on_lost
        self.fence: int | None = None
        self.expires_at: datetime | None = None
        self.lost = asyncio.Event()
        self.lost_reason: str | None = None
        self.transferred_to: str | None = None
        self._valid_until = 0.0  # loop.time() up to which the lease is surely still ours
        self._acquired_at = 0.0  # loop.time() when the successful acquire was sent
        self._acquired_expiry: datetime | None = None
        self._body_task: asyncio.Task[Any] | None = None
        self._cancelling = 0
        self._renewer: asyncio.Task[None] | None = None
        self._batched: _BatchedRenewal | None = None
        self._renew_lock = asyncio.Lock()
        self._cancelled_for_loss = False
        self._closing = False
        self._counted = False
        self._background: set[asyncio.Future[Any]] = set()
        self._time: Any = None  # the block's loop.time
        self._loss_timer: _LossTimer | None = None

    def __repr__(self) -> str:
        state = (
            "lost"
            if self.lost.is_set()
            else f"transferred to {self.transferred_to!r}"
            if self.transferred_to
            else "held"
        )
        return f"<HeldLease {self.key!r} owner={self.owner!r} fence={self.fence} {state}>"

    def _clock(self) -> float:
        """The event loop's clock (``loop.time()``, seconds), readable from the block's loop."""
        return self._time() if self._time is not None else asyncio.get_running_loop().time()

    @property
    def _call_ttl_ms(self) -> float:
        """The TTL of every acquire and renewal: the longest of this owner's holds of the key in
        this process, so no hold's renewal cuts short what another hold counts on."""
        return _holds.longest_ttl(self)

    async def __aenter__(self) -> HeldLease:
        loop = asyncio.get_running_loop()
        try:
            if self.wait:
                result, sent = await _acquire_wait_timed(
                    self.provider, self.key, self.owner, self._call_ttl_ms, self.timeout_s, 0.02, 1.0, 5.0, self.data
                )
            else:
                sent = loop.time()
                result = await self.provider.acquire_lease(
                    self.key, self.owner, self._call_ttl_ms, **data_kw(self.data)
                )
        except (LeaseNotAcquiredError, LeaseConfigError, SchemaMissingError, ProviderClosedError):
            raise  # nothing can have been acquired
        except BaseException as exc:
            # The acquire may have committed. Unless another hold() of this owner holds the key
            # here, release it, or the key stays taken for a whole TTL.
            if not _holds.holds_of(self.provider, self.key, self.owner):
                if isinstance(exc, asyncio.CancelledError):
                    await self._release_shielded(None)
                else:  # the database is failing: don't make the caller wait for a second timeout
                    self._release_in_background()
            raise
        if not result.acquired:
            raise LeaseNotAcquiredError(self.key, result.owner, result.fence, result.expires_at)
        _holds.add(self)
        self._counted = True
        # The database set expires_at = (its time when it ran the statement) + TTL, and it ran it
        # after we sent it: counting the TTL from `sent` can only underestimate, the safe side.
        self._acquired_at, self._valid_until = sent, sent + self.ttl_ms / 1000
        self.fence, self.expires_at = result.fence, result.expires_at
        self._acquired_expiry = result.expires_at
        self._body_task = asyncio.current_task()
        self._cancelling = self._body_task.cancelling() if self._body_task is not None else 0
        self._time = loop.time
        self._loss_timer = _loss_timer()
        self._loss_timer.add(self)  # the loss at the deadline, whatever the renewer is doing
        first_due = sent + self.renew_every_ms / 1000  # from the acquire, not from when renewing starts
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
            if self._counted:
                self._counted = False
                left = _holds.forget(self)
                if self.transferred_to is None and left == 0:  # an outer hold() of this owner keeps it
                    limit = None
                    if self.lost.is_set():  # a doomed release must not outlast the lease it could free
                        limit = max(0.05, self._valid_until - asyncio.get_running_loop().time())
                    await self._release_shielded(limit)
        if lost_by_our_cancel:
            raise LeaseLostError(self.key, self.owner, self.lost_reason or "lost") from exc
        if self.lost.is_set() and self.on_lost == "cancel" and exc_type is None:
            raise LeaseLostError(self.key, self.owner, self.lost_reason or "lost")
        return None

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
                log.error(
                    "renewing lease %r held by %r (fence %s) stopped with an unexpected error: %r",
                    self.key,
                    self.owner,
                    self.fence,
                    renewer.exception(),
                )

    async def _release_shielded(self, limit_s: float | None) -> None:
        """Release, finishing the one statement even if cancelled meanwhile; give up after
        ``limit_s`` seconds (None: the provider's own timeout)."""
        release = asyncio.ensure_future(self.provider.release_lease(self.key, self.owner))
        try:
            try:
                await asyncio.wait({release}, timeout=limit_s)
            except asyncio.CancelledError:
                await asyncio.wait({release}, timeout=limit_s)  # then let the cancellation go on
                raise
        finally:
            if not release.done():
                release.cancel()
                release.add_done_callback(_consume_result)
                log.warning(
                    "releasing lease %r held by %r (fence %s): no answer in time; it expires by its TTL",
                    self.key,
                    self.owner,
                    self.fence,
                )
            elif not release.cancelled() and release.exception() is not None:
                # the lease expires by itself; don't mask the body's outcome
                log.warning(
                    "releasing lease %r held by %r (fence %s) failed: %s",
                    self.key,
                    self.owner,
                    self.fence,
                    release.exception(),
                )

    def _release_in_background(self) -> None:
        release = asyncio.ensure_future(self.provider.release_lease(self.key, self.owner))
        self._background.add(release)
        release.add_done_callback(self._background.discard)
        release.add_done_callback(_consume_result)

    def _declare_lost(self, reason: str) -> None:
        if self.lost.is_set():
            return
        self.lost_reason = reason
        self.lost.set()
        log.warning("lease %r held by %r (fence %s) lost: %s", self.key, self.owner, self.fence, reason)
        if observe.observers:
            observe.lease_lost(self, reason)
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
        if _renews_with_info(self.provider):
            info: LeaseInfo | None = await self.provider.renew_lease_info(  # type: ignore[attr-defined]
                self.key, self.owner, self._call_ttl_ms
            )
            return False if info is None else info
        return bool(await self.provider.renew_lease(self.key, self.owner, self._call_ttl_ms))

    async def _renew_loop(self, first_due: float) -> None:
        """Renew this lease on its own, for a provider without ``renew_leases``; a provider with it
        renews through the batcher, which follows the same rules (:class:`RenewalCourse`)."""
        loop = asyncio.get_running_loop()
        course = RenewalCourse(self, self.renew_every_ms / 1000)
        next_at: float | None = first_due
        while next_at is not None:
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            async with self._renew_lock:
                if self.transferred_to is not None or self.lost.is_set():
                    return
                sent = loop.time()
                late = self._late(sent - next_at)
                deadline = self._deadline
                if sent >= deadline:  # woke too late (a blocked loop, or the last retry's turn came)
                    course.lose_too_late(late)
                    return
                # The renewal runs as its own task and is waited for only until the deadline, so loss
                # is declared on time even if the provider is slow to give up on a dead connection.
                renewal = asyncio.ensure_future(self._renew_once())
                try:
                    await asyncio.wait({renewal}, timeout=deadline - sent)
                except asyncio.CancelledError:
                    renewal.cancel()
                    renewal.add_done_callback(_consume_result)
                    raise
                renewed: LeaseInfo | bool | None = None
                if not renewal.done():
                    renewal.cancel()
                    renewal.add_done_callback(_consume_result)
                    course.no_answer()
                elif (exc := renewal.exception()) is not None:
                    course.failed(exc)
                else:
                    renewed = renewal.result()
                next_at = course.after(renewed, loop.time(), sent, deadline, late)

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
        validate_owner(next_owner, "next_owner"), encode_data(data)
        ttl = self.ttl_ms if ttl_ms is None else validate_ttl_ms(ttl_ms)
        async with self._renew_lock:
            if self.transferred_to is not None:
                return False
            window = self._transfer_window()
            if window is None:
                return False
            transfer = asyncio.ensure_future(
                self.provider.transfer_lease(self.key, self.owner, next_owner, ttl, **data_kw(data))
            )
            try:
                await asyncio.wait({transfer}, timeout=window)
            except asyncio.CancelledError:
                transfer.cancel()
                transfer.add_done_callback(_consume_result)
                raise
            if not transfer.done():  # the deadline passed: stop the statement
                transfer.cancel()
                transfer.add_done_callback(_consume_result)
                raise self._transfer_unanswered(next_owner)
            if not transfer.cancelled() and (exc := transfer.exception()) is not None:
                self._transfer_failed(next_owner, exc)
            moved = self._transferred(bool(transfer.result()), next_owner)
        if self.transferred_to is not None:
            await self._stop_renewer()
        return moved


def hold(
    provider: LeaseProvider,
    key: str,
    owner: str | None = None,
    ttl_ms: int | float = 15_000,
    *,
    renew_every_ms: int | float | None = None,
    wait: bool = False,
    timeout_s: float | None = None,
    on_lost: OnLost = "cancel",
    data: dict[str, Any] | None = None,
) -> HeldLease:
    """Hold ``key`` while an ``async with`` block runs, renewing it in the background.

    ::

        async with hold(provider, "thread:42", ttl_ms=15_000) as lease:
            await work(fence=lease.fence)

    Args:
        owner: the owner id; None generates a unique one (``host:pid:random``).
        ttl_ms: lease TTL in milliseconds; renewed every ``renew_every_ms`` (default TTL/3).
        wait: wait for the key (up to ``timeout_s`` seconds; None: no limit) instead of failing.
        on_lost: ``"cancel"`` (default) cancels the block and raises ``LeaseLostError`` from the
            ``async with``; ``"flag"`` only sets ``lease.lost``.
        data: lease data stored at the acquire (a ``dict``, see ``LeaseProvider``); passed to the
            provider only when given, so providers without lease data serve ``hold()`` without it.

    Raises ``LeaseNotAcquiredError`` (naming the holder) when the key is held by another owner,
    ``LeaseBackendError`` when the database fails at acquire. A renewal that raises is retried with
    backoff; the lease is declared lost only when no renewal succeeded before the last known expiry
    minus a safety margin (10% of the TTL), or a renewal returns False; ``lease.check()`` and
    ``lease.valid`` judge that deadline by the loop's clock when called. On exit (normal, exception
    or cancellation) the lease is released, shielded from cancellation, unless it was transferred.
    """
    return HeldLease(
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


SWEEP_BATCH_SIZE = 500
"""Rows an ``ExpirySweeper`` (and ``sql-lease sweep``) deletes per statement by default
(docs/statements.md, "Sweeping")."""


class SweepsExpired(Protocol):
    """A provider an :class:`ExpirySweeper` can sweep: it has ``sweep_expired`` (the SQL and
    in-memory async providers do)."""

    async def sweep_expired(self, batch_size: int = ..., grace_ms: int | float = ...) -> int: ...


class ExpirySweeper:
    """Deletes expired lease rows in the background, in bounded batches.

    ``provider`` must have ``sweep_expired(batch_size, grace_ms)`` (the SQL and in-memory providers
    do). Every ``interval_s`` seconds it sweeps batches of at most ``batch_size`` rows until a batch
    comes back short, spending at most ``duty_cycle`` (a fraction, default 0.25) of the time on it
    (it pauses between batches; ``batch_size`` default 500). Rows are removed only ``grace_ms``
    milliseconds after they expired. Errors are logged and the next round tries again. Use as
    ``async with ExpirySweeper(provider):`` or ``start()``/``await stop()``.
    """

    def __init__(
        self,
        provider: SweepsExpired,
        interval_s: float = 60.0,
        batch_size: int = SWEEP_BATCH_SIZE,
        grace_ms: int | float = 0,
        duty_cycle: float = 0.25,
    ) -> None:
        if not callable(getattr(provider, "sweep_expired", None)):
            raise TypeError(f"{type(provider).__name__} has no sweep_expired(); it cannot be swept")
        self.interval_s = validate_seconds(interval_s, "interval_s")
        if self.interval_s <= 0:
            raise ValueError(f"interval_s must be > 0 seconds, got {interval_s!r}")
        self.batch_size, self.grace_ms = validate_sweep(batch_size, grace_ms)
        if isinstance(duty_cycle, bool) or not isinstance(duty_cycle, (int, float)) or not 0 < duty_cycle <= 1:
            raise ValueError(f"duty_cycle must be a number in (0, 1], got {duty_cycle!r}")
        self.duty_cycle = float(duty_cycle)
        self.provider = provider
        self.swept_total = 0
        self._task: asyncio.Task[None] | None = None

    async def sweep_once(self) -> int:
        """Sweep batches until one comes back short; the number of rows removed.

        Between full batches it pauses so that sweeping takes at most ``duty_cycle`` of the time
        (default a quarter, in batches of 500): a backlog of a million rows never crowds out the
        acquires running beside it (docs/statements.md, "Sweeping").
        """
        removed = 0
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            batch: int = await self.provider.sweep_expired(batch_size=self.batch_size, grace_ms=self.grace_ms)
            removed += batch
            self.swept_total += batch
            if batch < self.batch_size:
                return removed
            await asyncio.sleep((loop.time() - started) * (1 / self.duty_cycle - 1))

    async def _run(self) -> None:
        while True:
            try:
                await self.sweep_once()
            except LeaseError as exc:
                log.warning("sweeping expired leases failed: %s", exc)
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="sql_lease sweeper")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task})  # the caller's own cancellation, if any, goes on from here

    async def __aenter__(self) -> ExpirySweeper:
        self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


class LeaseProviderBase:
    """Holding helpers shared by the bundled providers; they rely only on the five methods.

    :func:`hold` and :func:`acquire_lease_wait` serve any ``LeaseProvider``; these methods are
    shortcuts to them.
    """

    def hold(
        self,
        key: str,
        owner: str | None = None,
        ttl_ms: int | float = 15_000,
        *,
        renew_every_ms: int | float | None = None,
        wait: bool = False,
        timeout_s: float | None = None,
        on_lost: OnLost = "cancel",
        data: dict[str, Any] | None = None,
    ) -> HeldLease:
        """Hold ``key`` while an ``async with`` block runs, renewing it; see :func:`sql_lease.holding.hold`."""
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

    async def acquire_lease_wait(
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
        """Wait until ``key`` is acquired or ``timeout_s`` seconds pass; see
        :func:`sql_lease.holding.acquire_lease_wait`."""
        return await acquire_lease_wait(
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
