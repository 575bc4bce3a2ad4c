"""Operation deadlines for the asyncio face: one timer per provider and event loop, not one per call.

``asyncio.timeout`` schedules and cancels a timer for every call; on a lease provider's hot path
that cost about 20 µs of CPU per operation (a quarter of the client's CPU per acquire/release
cycle, measured in benchmarks/). Here each call registers a ticket; one timer, set for the
earliest deadline, cancels the tasks whose deadline passed. Cancellations are converted exactly
as ``asyncio.timeout`` converts them: only the one this watch caused, and only if no other
cancellation was requested meanwhile (``Task.uncancel``); any other goes on.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["DeadlineWatch", "Ticket"]


class Ticket:
    """One call under watch: its task, its deadline (``loop.time()``), and whether it was cut."""

    __slots__ = ("cancelling", "deadline", "fired", "task", "uncancelled", "watch")

    def __init__(self, watch: _LoopWatch, task: asyncio.Task[Any], deadline: float) -> None:
        self.watch, self.task, self.deadline = watch, task, deadline
        self.cancelling = task.cancelling()
        self.fired = False
        self.uncancelled = False


class _LoopWatch:
    """The tickets and the timer of one event loop; touched only from that loop's thread. It keeps
    no strong reference to its loop (nor a timer handle, which would): a finished loop can go."""

    __slots__ = ("active", "loop_ref", "timer_at")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            self.loop_ref: Callable[[], asyncio.AbstractEventLoop | None] = weakref.ref(loop)
        except TypeError:  # a loop class without weak references: kept while it is open
            self.loop_ref = lambda: loop
        self.active: set[Ticket] = set()
        self.timer_at = float("inf")

    def arm(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        # A timer set for a later time is not cancelled: it finds itself superseded and ends.
        self.timer_at = at
        loop.call_at(at, self.expire, loop, at)

    def expire(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        if at != self.timer_at:
            return  # superseded by an earlier timer, which did this work
        self.timer_at = float("inf")
        now = loop.time()
        earliest = float("inf")
        for ticket in self.active:
            if ticket.fired:
                continue
            if ticket.deadline <= now:
                ticket.fired = True
                ticket.task.cancel()
            elif ticket.deadline < earliest:
                earliest = ticket.deadline
        if earliest != float("inf"):
            self.arm(loop, earliest)


class DeadlineWatch:
    """Deadlines of the calls of one provider, in any number of event loops (one timer per loop),
    in any number of threads. A loop that finished is not kept alive."""

    def __init__(self) -> None:
        self._last: _LoopWatch | None = None
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopWatch] = weakref.WeakKeyDictionary()
        self._strong: dict[asyncio.AbstractEventLoop, _LoopWatch] = {}  # loops without weak references
        self._lock = threading.Lock()

    def _switch(self, loop: asyncio.AbstractEventLoop) -> _LoopWatch:
        """The watch of ``loop``, another than the last one used: found or made, then the last."""
        with self._lock:
            try:
                watch = self._loops.get(loop)
                if watch is None:
                    watch = self._loops[loop] = _LoopWatch(loop)
            except TypeError:  # no weak references to this loop class
                watch = self._strong.get(loop)
                if watch is None:
                    for closed in [other for other in self._strong if other.is_closed()]:
                        del self._strong[closed]
                    watch = self._strong[loop] = _LoopWatch(loop)
        self._last = watch
        return watch

    def start(self, seconds: float) -> Ticket:
        """Watch the current task: it is cancelled if :meth:`stop` is not called within ``seconds``."""
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        if task is None:
            raise RuntimeError("a deadline needs a task")
        watch = self._last
        if watch is None or watch.loop_ref() is not loop:
            watch = self._switch(loop)
        ticket = Ticket(watch, task, loop.time() + seconds)
        watch.active.add(ticket)
        if ticket.deadline < watch.timer_at:
            watch.arm(loop, ticket.deadline)
        return ticket

    def stop(self, ticket: Ticket) -> bool:
        """End the watch of ``ticket``; True if its deadline cut the call and no other cancellation
        was requested meanwhile (the caller then raises ``TimeoutError`` for its ``CancelledError``)."""
        ticket.watch.active.discard(ticket)  # the timer stays: it fires once, finds nothing due, and ends
        if ticket.fired and not ticket.uncancelled:
            ticket.uncancelled = True
            return ticket.task.uncancel() <= ticket.cancelling
        return False
