"""Issue 20 items 11 and 5 (async face): one provider used by one event loop after another
(``asyncio.run`` each time, as a worker running each job does), and by a process forked after using
it. Each loop, and each process, gets connections of its own; a finished loop's connections are
closed while it still runs; a child never closes or uses its parent's sockets."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest

from sql_lease import SqlLeaseProvider, acquire_lease_wait, hold
from tests.conftest import run_in_own_loop

KINDS = [
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("mysql", marks=pytest.mark.mysql),
    "sqlite",
    "sqlite-uri",
]


def make(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> SqlLeaseProvider:
    """A provider made outside any event loop (as a module-level one is)."""
    if kind.startswith("sqlite"):
        url = f"sqlite:///{tmp_path}/leases.db"
        if kind == "sqlite-uri":  # SQLAlchemy's own pooled engine opens it
            url = f"sqlite:///file:{tmp_path}/leases.db?mode=rwc&uri=true"

        async def migrate() -> None:
            async with SqlLeaseProvider(url) as setup:
                await setup.migrate()

        run_in_own_loop(migrate)
        return SqlLeaseProvider(url, operation_timeout_s=5)
    url, schema = request.getfixturevalue("mysql_db" if kind == "mysql" else "pg_schema")
    return SqlLeaseProvider(url, schema=schema, operation_timeout_s=5)


async def one_job(leases: SqlLeaseProvider, key: str) -> list[Any]:
    """acquire, hold, and wait for a lease another task holds, then release: every path."""
    seen: list[Any] = []
    first = await leases.acquire_lease(key, "a", 10_000)
    seen.append(first.acquired)
    assert await leases.release_lease(key, "a")
    async with hold(leases, key, "holder", ttl_ms=5_000) as held:
        seen.append(held.fence > 0)

        waiter = asyncio.ensure_future(acquire_lease_wait(leases, key, "waiter", 5_000, timeout_s=10))
        await asyncio.sleep(0.05)
        releasing = asyncio.ensure_future(leases.release_lease(key, "holder"))
        got = await waiter
        await releasing
        seen.append(got.acquired and got.owner == "waiter")
    assert await leases.release_lease(key, "waiter")
    return seen


@pytest.mark.parametrize("kind", KINDS)
def test_one_provider_in_three_event_loops_one_after_another(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    leases = make(kind, request, tmp_path)
    key = f"loops:{uuid.uuid4().hex}"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an unclosed connection of a finished loop is a failure
        for _ in range(3):
            assert asyncio.run(one_job(leases, key)) == [True, True, True]
            gc.collect()
        asyncio.run(leases.close())
        gc.collect()


def child_main(leases: SqlLeaseProvider, key: str, write_fd: int) -> None:
    """In the forked child: the same provider object, a new event loop; report over the pipe."""
    report: dict[str, Any] = {}
    try:

        async def job() -> None:
            got = await leases.acquire_lease(key, f"child-{os.getpid()}", 10_000)
            report["acquired"] = got.acquired
            report["owner"] = (await leases.get_lease(key)).owner  # type: ignore[union-attr]
            report["released"] = await leases.release_lease(key, f"child-{os.getpid()}")

        asyncio.run(asyncio.wait_for(job(), 20))
    except BaseException as exc:  # reported, never raised in the child
        report["error"] = f"{type(exc).__name__}: {exc}"
    os.write(write_fd, json.dumps(report).encode())
    os._exit(0)


@pytest.mark.parametrize("kind", KINDS)
def test_a_forked_child_gets_its_own_connections(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    leases = make(kind, request, tmp_path)
    key = f"fork:{uuid.uuid4().hex}"

    async def parent_uses_it() -> int:
        got = await leases.acquire_lease(key, "parent", 10_000)
        assert got.acquired
        assert await leases.release_lease(key, "parent")
        return got.fence

    asyncio.run(parent_uses_it())  # the pool now holds the parent's connections (of a finished loop)

    async def parent_and_children() -> None:
        await parent_uses_it()  # a live loop with idle connections at the time of the fork
        reports = []
        for _ in range(2):
            read_fd, write_fd = os.pipe()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (aiosqlite's)
                pid = os.fork()
            if pid == 0:
                os.close(read_fd)
                # leave the parent's running loop behind, as a forked worker does
                asyncio.events._set_running_loop(None)
                child_main(leases, key, write_fd)
            os.close(write_fd)
            chunks = []
            while chunk := await asyncio.get_running_loop().run_in_executor(None, os.read, read_fd, 65536):
                chunks.append(chunk)
            os.close(read_fd)
            _, status = await asyncio.get_running_loop().run_in_executor(None, os.waitpid, pid, 0)
            assert status == 0
            reports.append(json.loads(b"".join(chunks)))
            # the parent keeps working on the same pooled connections
            for _ in range(5):
                await parent_uses_it()
        for report in reports:
            assert report == {"acquired": True, "owner": report.get("owner"), "released": True}, report
            assert report["owner"].startswith("child-")

    asyncio.run(parent_and_children())
    asyncio.run(leases.close())


def test_waiters_on_one_provider_in_two_event_loops_at_once_each_get_the_lease() -> None:
    """The in-process waiting queue is per event loop: two threads, each running its own loop, wait
    for one key through one provider (an asyncio.Lock bound to the first loop failed the second)."""
    import threading

    from sql_lease import InMemoryLeaseProvider

    leases = InMemoryLeaseProvider()
    key = f"two-loops:{uuid.uuid4().hex}"
    assert run_in_own_loop(lambda: leases.acquire_lease(key, "holder", 60_000)).acquired
    waiting = threading.Barrier(3)
    outcomes: dict[str, object] = {}
    took: dict[str, float] = {}

    def waiter(owner: str) -> None:
        async def main() -> None:
            waiting.wait()
            started = time.monotonic()
            got = await acquire_lease_wait(leases, key, owner, 60_000, timeout_s=10, poll_max_s=0.05)
            took[owner] = time.monotonic() - started
            await asyncio.sleep(0.05)
            await leases.release_lease(key, owner)
            outcomes[owner] = got.acquired

        try:
            asyncio.run(main())
        except BaseException as exc:
            outcomes[owner] = exc

    threads = [threading.Thread(target=waiter, args=(owner,)) for owner in ("a", "b")]
    for thread in threads:
        thread.start()
    waiting.wait()
    run_in_own_loop(lambda: asyncio.sleep(0.2))
    assert run_in_own_loop(lambda: leases.release_lease(key, "holder"))
    for thread in threads:
        thread.join(15)
    assert outcomes == {"a": True, "b": True}
    assert max(took.values()) < 3.0, took  # polled every 50 ms once the holder released at 0.2 s


def test_loop_local_shared_by_threads_each_running_loops_keeps_one_state_per_loop() -> None:
    """Threads each running their own event loops on one LoopLocal: no lost or doubled state."""
    import collections
    import sys
    import threading

    from sql_lease.sql.executors import LoopLocal

    closed: collections.Counter[str] = collections.Counter()

    async def close(state: object) -> None:
        closed["closed"] += 1

    def abandon(state: object) -> None:
        closed["abandoned"] += 1

    local: LoopLocal[object] = LoopLocal(object, close, abandon)
    errors: list[BaseException] = []

    def worker() -> None:
        for _ in range(100):

            async def use() -> None:
                assert local.current() is local.current()

            try:
                asyncio.run(use())
            except BaseException as exc:
                errors.append(exc)

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        threads = [threading.Thread(target=worker) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        sys.setswitchinterval(switch)
    assert errors == []
    assert closed["closed"] == 800  # each loop's state closed once, as its asyncio.run ended
    run_in_own_loop(local.close)
    assert closed["abandoned"] == 0
