"""Regression tests for the issue on `exec` and configuration, items 7, 11 and 12: borrowed
connections come back unchanged, errors say what to do, and close() leaves nothing behind."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from sql_lease import (
    InMemoryLeaseProvider,
    LeaseBackendError,
    LeaseConfigError,
    ProviderClosedError,
    SqlLeaseProvider,
    acquire_lease_wait,
)


def plain(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://")


def with_database(url: str, database: str) -> str:
    return plain(url).rsplit("/", 1)[0] + "/" + database


# -- 7. the application's connections come back as they came ---------------------------------------


@pytest.mark.postgres
async def test_a_given_engines_connections_come_back_with_the_same_session_settings(
    pg_schema: tuple[str, str], key: str
) -> None:
    """The server session of a lent connection is as it was (no ``SET``), and SQLAlchemy's view of
    it too: the isolation level it reports, and autocommit off. (Read on the driver connection,
    outside any transaction: SQLAlchemy's ``AUTOCOMMIT`` option, the public way to autocommit, puts
    back the default level it detected, so the next transaction's ``BEGIN`` names that level
    explicitly: the same level, as for any application that uses the option.)"""
    url, schema = pg_schema
    engine = create_async_engine(url.replace("postgresql://", "postgresql+asyncpg://"), pool_size=1, max_overflow=0)
    query = (
        "SELECT pg_backend_pid(), array_agg(name || '=' || setting ORDER BY name)"
        " FROM pg_settings WHERE source = 'session'"
    )

    async def session() -> tuple[Any, ...]:
        async with engine.connect() as conn:
            driver = (await conn.get_raw_connection()).driver_connection
            assert driver is not None
            row = await driver.fetchrow(query)  # no transaction of SQLAlchemy's around it
            level = await conn.get_isolation_level()
            await conn.exec_driver_sql("SELECT 1")
            assert conn.in_transaction()  # autocommit is off again
            return (*row, level)

    try:
        before = await session()
        leases = SqlLeaseProvider(engine, schema=schema, pool_size=1)
        assert (await leases.acquire_lease(key, "a", 10_000)).acquired
        assert await leases.renew_lease(key, "a", 10_000)
        assert await leases.transfer_lease(key, "a", "b", 10_000)
        assert (await leases.get_lease(key)) is not None
        assert await leases.release_lease(key, "b")
        await leases.close()
        after = await session()
        assert after[0] == before[0], "not the same connection: the test proves nothing"
        assert after[1:] == before[1:]
    finally:
        await engine.dispose()


# -- 11. errors that say what to do -------------------------------------------------------------------


@pytest.mark.postgres
async def test_a_missing_database_is_a_configuration_error(pg_url: str) -> None:
    async with SqlLeaseProvider(with_database(pg_url, f"no_such_db_{uuid.uuid4().hex[:8]}")) as leases:
        with pytest.raises(LeaseConfigError, match="database does not exist") as caught:
            await leases.get_lease("k")
    assert isinstance(caught.value.__cause__, Exception)


@pytest.mark.postgres
def test_the_cli_exits_78_with_a_hint_for_a_missing_database(pg_url: str, tmp_path: Path) -> None:
    from tests.test_cli import run_cli

    done = run_cli(["status", "k", "--url", with_database(pg_url, "no_such_db_for_cli")], tmp_path)
    assert done.returncode == 78, done.stderr
    assert "database does not exist" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.postgres
async def test_a_missing_role_is_a_configuration_error(pg_url: str) -> None:
    url = plain(pg_url).replace("postgres@", f"no_such_role_{uuid.uuid4().hex[:6]}@", 1)
    async with SqlLeaseProvider(url) as leases:
        with pytest.raises(LeaseConfigError, match="role"):
            await leases.acquire_lease("k", "o", 1000)


async def test_a_closed_provider_says_so_and_is_not_retryable(sql_provider: Any, key: str) -> None:
    await sql_provider.close()
    with pytest.raises(ProviderClosedError) as caught:
        await sql_provider.acquire_lease(key, "a", 1000)
    assert not isinstance(caught.value, LeaseBackendError)


# -- 12. close() and deadlines leave nothing behind ---------------------------------------------------


async def _connections_named(url: str, name: str) -> int:
    conn = await asyncpg.connect(plain(url))
    try:
        return int(await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", name))
    finally:
        await conn.close()


def _named_provider(url: str, schema: str, name: str, **options: Any) -> SqlLeaseProvider:
    settings = {"connect_args": {"server_settings": {"application_name": name}}}
    return SqlLeaseProvider(url, schema=schema, engine_options=settings, **options)


@pytest.mark.postgres
async def test_close_while_a_waiter_listens_leaves_no_connection(pg_schema: tuple[str, str], key: str) -> None:
    url, schema = pg_schema
    name = f"sql_lease_waiter_{uuid.uuid4().hex[:8]}"
    async with SqlLeaseProvider(url, schema=schema) as holder:
        assert (await holder.acquire_lease(key, "holder", 60_000)).acquired
        leases = _named_provider(url, schema, name)
        waiting = asyncio.create_task(acquire_lease_wait(leases, key, "waiter", 10_000, 30, listen_max_wait_s=0.2))
        await asyncio.sleep(0.5)  # it listens and re-checks every 0.2 s
        await leases.close()
        with pytest.raises(ProviderClosedError):
            await asyncio.wait_for(waiting, 10)
        await asyncio.sleep(0.5)
        assert await _connections_named(url, name) == 0


@pytest.mark.postgres
async def test_close_with_operations_in_flight_leaves_no_connection(pg_schema: tuple[str, str]) -> None:
    url, schema = pg_schema
    name = f"sql_lease_busy_{uuid.uuid4().hex[:8]}"
    leases = _named_provider(url, schema, name, pool_size=10)
    busy = [asyncio.create_task(leases.acquire_lease(f"busy:{name}:{i}", "o", 1000)) for i in range(30)]
    await asyncio.sleep(0.01)
    await leases.close()
    await asyncio.gather(*busy, return_exceptions=True)
    await asyncio.sleep(0.5)
    assert await _connections_named(url, name) == 0


async def test_a_waiting_acquire_over_a_stalled_network_ends_by_its_deadline(key: str) -> None:
    inner = InMemoryLeaseProvider()
    assert (await inner.acquire_lease(key, "holder", 60_000)).acquired

    class Stalling:
        """Answers once, then every statement hangs (a network that stopped delivering)."""

        calls = 0

        async def acquire_lease(self, k: str, owner: str, ttl_ms: float) -> Any:
            Stalling.calls += 1
            if Stalling.calls > 1:
                await asyncio.sleep(60)
            return await inner.acquire_lease(k, owner, ttl_ms)

        def __getattr__(self, name: str) -> Any:
            return getattr(inner, name)

    started = time.monotonic()
    with pytest.raises(LeaseBackendError, match="outcome is unknown"):
        await asyncio.wait_for(acquire_lease_wait(Stalling(), key, "waiter", 1000, timeout_s=0.5), 30)
    assert time.monotonic() - started < 0.5 + 1.0 + 0.5  # timeout_s plus ATTEMPT_GRACE_S, and slack
