"""Database failures surface as the library's own errors, with the original on __cause__."""

from __future__ import annotations

import socket
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from sql_lease import LeaseBackendError, SchemaMissingError, SqlLeaseProvider


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def every_operation(provider: SqlLeaseProvider) -> list[Coroutine[Any, Any, Any]]:
    """One call of each of the five operations, not yet awaited."""
    return [
        provider.acquire_lease("k", "o", 1000),
        provider.get_lease_owner("k"),
        provider.release_lease("k", "o"),
        provider.renew_lease("k", "o", 1000),
        provider.transfer_lease("k", "o", "p", 1000),
    ]


@pytest.mark.postgres
async def test_missing_table_names_the_migrate_command(pg_url: str, fresh_pg_schema: str) -> None:
    async with SqlLeaseProvider(pg_url, schema=fresh_pg_schema) as provider:
        for call in every_operation(provider):
            with pytest.raises(SchemaMissingError, match="sql-lease migrate") as info:
                await call
            assert info.value.__cause__ is not None


async def test_missing_table_on_sqlite(tmp_path: Path) -> None:
    async with SqlLeaseProvider(f"sqlite:///{tmp_path}/empty.db") as provider:
        with pytest.raises(SchemaMissingError, match="sql-lease migrate"):
            await provider.acquire_lease("k", "o", 1000)


async def test_unreachable_database_raises_backend_error_without_password() -> None:
    url = f"postgresql://app:s3cr3t-pw@127.0.0.1:{closed_port()}/db"
    async with SqlLeaseProvider(url, operation_timeout_s=5) as provider:
        assert "s3cr3t-pw" not in repr(provider)
        for call in every_operation(provider):
            with pytest.raises(LeaseBackendError) as info:
                await call
            assert info.value.__cause__ is not None
            assert "s3cr3t-pw" not in str(info.value)


@pytest.fixture
def hanging_server_port() -> Iterator[int]:
    """A TCP port that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    yield listener.getsockname()[1]
    listener.close()


async def test_operation_timeout_bounds_a_hanging_server(hanging_server_port: int) -> None:
    url = f"postgresql://u@127.0.0.1:{hanging_server_port}/db"
    async with SqlLeaseProvider(url, operation_timeout_s=0.5) as provider:
        with pytest.raises(LeaseBackendError, match=r"within 0\.5 s"):
            await provider.acquire_lease("k", "o", 1000)


async def test_unwritable_sqlite_path_is_a_backend_error(tmp_path: Path) -> None:
    import asyncio

    (tmp_path / "a_directory").mkdir()  # (a path in a missing directory is refused up front: test_config.py)
    async with SqlLeaseProvider(f"sqlite:///{tmp_path}/a_directory") as provider:
        with pytest.raises(LeaseBackendError) as info:
            await provider.acquire_lease("k", "o", 1000)
        assert info.value.__cause__ is not None
    # aiosqlite stops the worker thread of a failed connect with a future on this event loop that
    # nobody awaits; give the thread time to answer it before pytest closes the loop.
    await asyncio.sleep(0.2)


async def test_timeouts_hold_their_bound_on_a_hanging_server(hanging_server_port: int) -> None:
    """The cleanup of a timed-out connection must not stretch the operation past its timeout."""
    import asyncio

    url = f"postgresql://u@127.0.0.1:{hanging_server_port}/db"
    async with SqlLeaseProvider(url, operation_timeout_s=0.5) as provider:
        loop = asyncio.get_running_loop()
        for _ in range(3):
            started = loop.time()
            with pytest.raises(LeaseBackendError):
                await provider.renew_lease("k", "o", 1000)
            assert loop.time() - started < 1.5


async def test_sqlite_write_lock_held_elsewhere_fails_within_the_timeout(tmp_path: Path) -> None:
    import asyncio
    import sqlite3

    url = f"sqlite:///{tmp_path}/locked.db"
    async with SqlLeaseProvider(url, operation_timeout_s=0.5) as provider:
        await provider.migrate()
        assert (await provider.acquire_lease("k", "o", 60_000)).acquired
        blocker = sqlite3.connect(tmp_path / "locked.db", isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")
        loop = asyncio.get_running_loop()
        try:
            started = loop.time()
            with pytest.raises(LeaseBackendError):
                await provider.release_lease("k", "o")
            assert loop.time() - started < 1.5
            # an acquire's lock wait that runs out wrote nothing: answered "not acquired", in time
            started = loop.time()
            assert not (await provider.acquire_lease("k2", "o", 60_000)).acquired
            assert loop.time() - started < 1.5
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert (await provider.acquire_lease("k2", "o", 60_000)).acquired  # the provider recovered


async def test_cancelled_operations_never_leak_pooled_connections(sql_provider: SqlLeaseProvider) -> None:
    """Regression: cancelling many operations mid-flight used to leave SQLite connections checked
    out until the pool was exhausted."""
    import asyncio

    provider = sql_provider
    for round_ in range(60):
        tasks = [asyncio.create_task(provider.get_lease_owner(f"k{i}")) for i in range(5)]
        await asyncio.sleep(0.0005 * (round_ % 7))
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.sleep(0.3)  # background discards finish
    # every connection came back: as many operations as the pool holds still run at once
    owners = await asyncio.wait_for(asyncio.gather(*(provider.get_lease_owner(f"k{i}") for i in range(10))), 5)
    assert owners == [None] * 10
    assert (await provider.acquire_lease("after-cancel", "o", 1000)).acquired
