"""How long a lease has been held: ``LeaseInfo.acquired_at``, the tenure's start by the database's
clock, on every provider and both faces, and the CLI's HELD FOR column and ``held_ms`` (issue 11)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from sql_lease import SqlLeaseProvider, SyncSqlLeaseProvider
from sql_lease.cli import _held_ms, cli
from sql_lease.sql.statements import qualified_name
from tests.test_cli import run_cli

# Long enough that two readings of each clock (SQLite's is in whole milliseconds) differ.
STEP_S = 0.02


def _start(lease: Any) -> datetime:
    assert lease is not None and lease.acquired_at is not None
    assert lease.acquired_at.utcoffset() is not None and lease.acquired_at.utcoffset().total_seconds() == 0
    return lease.acquired_at  # type: ignore[no-any-return]


async def test_tenure_start_async(provider: Any, key: str) -> None:
    async def start() -> datetime:
        (listed,) = await provider.list_leases(prefix=key)
        read = await provider.get_lease(key)
        assert listed.acquired_at == read.acquired_at  # both reads decode the same column
        return _start(read)

    first = await provider.acquire_lease(key, "a", 30_000)
    acquired = await start()
    assert acquired <= first.expires_at
    await asyncio.sleep(STEP_S)
    assert await provider.renew_lease(key, "a", 30_000)
    assert (await provider.acquire_lease(key, "a", 30_000)).fence == first.fence  # idempotent retry
    assert await provider.transfer_lease(key, "a", "a", 30_000)  # to oneself: a renewal
    assert await start() == acquired

    await asyncio.sleep(STEP_S)
    assert await provider.transfer_lease(key, "a", "b", 30_000)  # a new owner: a new tenure
    transferred = await start()
    assert transferred > acquired

    await asyncio.sleep(STEP_S)
    assert await provider.release_lease(key, "b")
    assert (await provider.acquire_lease(key, "b", 30_000)).acquired
    reacquired = await start()
    assert reacquired > transferred

    assert await provider.renew_lease(key, "b", 1)  # renewed to expire at once, tenure kept
    await asyncio.sleep(0.06)  # expired: the same owner starts a new tenure
    assert (await provider.acquire_lease(key, "b", 30_000)).acquired
    assert await start() > reacquired


def test_tenure_start_sync(sync_provider: Any, key: str) -> None:
    def start() -> datetime:
        (listed,) = sync_provider.list_leases(prefix=key)
        read = sync_provider.get_lease(key)
        assert listed.acquired_at == read.acquired_at
        return _start(read)

    first = sync_provider.acquire_lease(key, "a", 30_000)
    acquired = start()
    time.sleep(STEP_S)
    assert sync_provider.renew_lease(key, "a", 30_000)
    assert sync_provider.acquire_lease(key, "a", 30_000).fence == first.fence
    assert sync_provider.transfer_lease(key, "a", "a", 30_000)
    assert start() == acquired

    time.sleep(STEP_S)
    assert sync_provider.transfer_lease(key, "a", "b", 30_000)
    transferred = start()
    assert transferred > acquired

    time.sleep(STEP_S)
    assert sync_provider.release_lease(key, "b")
    assert sync_provider.acquire_lease(key, "b", 30_000).acquired
    reacquired = start()
    assert reacquired > transferred
    assert sync_provider.renew_lease(key, "b", 1)
    time.sleep(0.06)
    assert sync_provider.acquire_lease(key, "b", 30_000).acquired
    assert start() > reacquired


async def test_held_ms_grows_by_the_database_clock(provider: Any, key: str) -> None:
    await provider.acquire_lease(key, "a", 30_000)
    before = _held_ms(await provider.get_lease(key))
    await asyncio.sleep(0.05)
    assert await provider.renew_lease(key, "a", 30_000)
    after = _held_ms(await provider.get_lease(key))
    assert before is not None and after is not None
    assert 0 <= before < after
    assert after - before >= 40  # the pause, measured by the database's clock (ms resolution)

    await provider.acquire_lease(f"{key}:gone", "a", 30)
    await asyncio.sleep(0.06)
    (expired,) = await provider.list_leases(prefix=f"{key}:", include_expired=True)
    assert _held_ms(expired) == pytest.approx(30, abs=1)  # how long it lasted, not since


async def test_a_row_from_before_the_column_lists_with_an_unknown_start(
    sql_provider: SqlLeaseProvider, key: str
) -> None:
    first = await sql_provider.acquire_lease(key, "a", 30_000)
    await _forget_start(sql_provider, key)
    (listed,) = await sql_provider.list_leases(prefix=key)
    assert (listed.owner, listed.fence, listed.acquired_at) == ("a", first.fence, None)
    assert (await sql_provider.get_lease(key)).acquired_at is None and _held_ms(listed) is None
    assert await sql_provider.renew_lease(key, "a", 30_000)
    assert (await sql_provider.acquire_lease(key, "a", 30_000)).fence == first.fence
    assert (await sql_provider.get_lease(key)).acquired_at is None  # the same tenure: still unknown
    assert await sql_provider.transfer_lease(key, "a", "b", 30_000)
    assert _start(await sql_provider.get_lease(key)) is not None  # a new tenure records its start


async def test_a_minimum_hold_of_a_tenure_without_a_start_counts_from_the_release(
    sql_provider: SqlLeaseProvider, key: str
) -> None:
    """Issue 24: a row from before migration 0003 has no tenure start; its minimum hold is counted
    from the release (by the database's clock), never treated as already passed."""
    await sql_provider.acquire_lease(key, "a", 30_000)
    await _forget_start(sql_provider, key)
    await asyncio.sleep(0.3)  # a start counted from the acquire would leave less than 1.5 s
    assert await sql_provider.release_lease(key, "a", min_hold_ms=1_500)
    kept = await sql_provider.get_lease(key)
    assert kept is not None and kept.released and kept.acquired_at is None
    assert 1_300 < kept.remaining_ms <= 1_500  # from the release: the full hold, less the read's time
    assert not (await sql_provider.acquire_lease(key, "b", 30_000)).acquired


async def _forget_start(provider: SqlLeaseProvider, key: str) -> None:
    """Make ``key``'s row look like one written before migration 0003."""
    dialect = provider.engine.dialect
    table = qualified_name(dialect, provider.names, provider.names.table)
    column = dialect.identifier_preparer.quote_identifier("key")  # a reserved word on MySQL
    async with provider.engine.begin() as conn:
        await conn.execute(text(f"UPDATE {table} SET acquired_at = NULL WHERE {column} = :key"), {"key": key})


def test_cli_list_shows_held_for(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/leases.db"
    with SyncSqlLeaseProvider(url) as provider:
        provider.migrate()
        provider.acquire_lease("job:new", "ann", 60_000)
        provider.acquire_lease("job:old", "bob", 60_000)
        time.sleep(0.05)
        started = provider.get_lease("job:new").acquired_at
    with sqlite3.connect(tmp_path / "leases.db") as conn:
        conn.execute("UPDATE sql_leases SET acquired_at = NULL WHERE key = 'job:old'")

    listed = run_cli(["list", "--json", "--url", url], tmp_path)
    assert listed.returncode == 0, listed.stderr
    new, old = json.loads(listed.stdout)
    assert datetime.fromisoformat(new["acquired_at"]) == started
    assert new["held_ms"] >= 50
    assert (old["key"], old["acquired_at"], old["held_ms"]) == ("job:old", None, None)

    table = CliRunner().invoke(cli, ["list", "--url", url])  # in-process: a second interpreter is slow
    assert table.exit_code == 0, table.output
    header, new_row, old_row = table.output.splitlines()
    column = header.index("HELD FOR")
    assert header.split()[3:7] == ["EXPIRES", "IN", "HELD", "FOR"]
    assert new_row[column:].split()[0].endswith("s")  # e.g. 0.1s
    assert old_row[column:].startswith(" " * len("HELD FOR"))  # blank: unknown
