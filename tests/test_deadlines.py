"""The asyncio face's operation deadlines (sql_lease/sql/deadlines.py): one timer for many calls,
and cancellations converted exactly as ``asyncio.timeout`` converts them."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sql_lease.sql.deadlines import DeadlineWatch


async def watched(watch: DeadlineWatch, seconds: float, body: Any) -> Any:
    """``body()`` under a deadline, converting as the provider does."""
    ticket = watch.start(seconds)
    try:
        return await body()
    except asyncio.CancelledError:
        if watch.stop(ticket):
            raise TimeoutError from None
        raise
    finally:
        watch.stop(ticket)


async def test_a_call_past_its_deadline_becomes_timeout_error() -> None:
    watch = DeadlineWatch()
    with pytest.raises(TimeoutError):
        await watched(watch, 0.05, lambda: asyncio.sleep(10))


async def test_calls_within_their_deadline_are_untouched() -> None:
    watch = DeadlineWatch()
    assert await asyncio.gather(*(watched(watch, 5, lambda i=i: asyncio.sleep(0.01, i)) for i in range(50))) == list(
        range(50)
    )
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_only_the_late_calls_are_cut() -> None:
    watch = DeadlineWatch()
    results = await asyncio.gather(
        watched(watch, 0.05, lambda: asyncio.sleep(10)),
        watched(watch, 5, lambda: asyncio.sleep(0.2, "in time")),
        watched(watch, 0.1, lambda: asyncio.sleep(10)),
        return_exceptions=True,
    )
    assert isinstance(results[0], TimeoutError) and results[1] == "in time" and isinstance(results[2], TimeoutError)


async def test_a_cancellation_from_outside_goes_on() -> None:
    watch = DeadlineWatch()
    task = asyncio.ensure_future(watched(watch, 5, lambda: asyncio.sleep(10)))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_cancellation_from_outside_after_the_deadline_fired_goes_on() -> None:
    # As asyncio.timeout: a second cancel request means someone else wants the task gone too.
    watch = DeadlineWatch()
    started = asyncio.Event()

    async def stubborn() -> None:
        started.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await asyncio.sleep(0.1)  # still cleaning up when the outer cancel arrives
            raise

    task = asyncio.ensure_future(watched(watch, 0.05, stubborn))
    await started.wait()
    await asyncio.sleep(0.08)  # the deadline fired
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_many_sequential_calls_share_one_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()
    scheduled = 0
    real_call_at = loop.call_at

    def counting_call_at(when: float, callback: Any, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        nonlocal scheduled
        if getattr(callback, "__qualname__", "").endswith("expire"):
            scheduled += 1
        return real_call_at(when, callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_at", counting_call_at)
    watch = DeadlineWatch()
    for _ in range(500):
        await watched(watch, 30, lambda: asyncio.sleep(0))
    assert scheduled == 1  # asyncio.timeout would have scheduled 500


async def test_watches_in_two_event_loops_are_apart() -> None:
    watch = DeadlineWatch()

    def in_other_loop() -> str:
        async def main() -> str:
            try:
                await watched(watch, 0.05, lambda: asyncio.sleep(10))
            except TimeoutError:
                return "timed out"
            return "not cut"

        return asyncio.run(main())

    other = asyncio.get_running_loop().run_in_executor(None, in_other_loop)
    assert await watched(watch, 5, lambda: asyncio.sleep(0.2, "here")) == "here"
    assert await other == "timed out"


def test_a_finished_event_loop_is_not_kept_alive() -> None:
    import gc
    import weakref

    watch = DeadlineWatch()
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def job() -> None:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        await watched(watch, 5, lambda: asyncio.sleep(0))

    for _ in range(2):
        asyncio.run(job())
    gc.collect()
    assert [ref() for ref in loops] == [None, None]


def test_loops_in_many_threads_share_one_watch() -> None:
    import sys
    import threading

    watch = DeadlineWatch()
    errors: list[BaseException] = []

    async def job() -> None:
        for _ in range(3):
            await watched(watch, 5, lambda: asyncio.sleep(0))
        with pytest.raises(TimeoutError):
            await watched(watch, 0.001, lambda: asyncio.sleep(10))

    def worker() -> None:
        try:
            for _ in range(150):
                asyncio.run(job())
        except BaseException as exc:
            errors.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: races show up
    try:
        threads = [threading.Thread(target=worker) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
