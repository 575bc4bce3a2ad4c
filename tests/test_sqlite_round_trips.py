"""SQLite from a URL: each lease operation sends one statement when nothing contends for the
write lock (the async face pays one thread hop per statement), and a held lease under another
writer's transaction is still refused at once (the first try waits only a moment for the lock)."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path

from sql_lease import SqlLeaseProvider, SyncSqlLeaseProvider


def _migrated(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'leases.db'}"
    asyncio.run(SqlLeaseProvider(url).migrate())
    return url


def test_sync_uncontended_operations_send_one_statement_each(tmp_path: Path) -> None:
    with SyncSqlLeaseProvider(_migrated(tmp_path)) as provider:
        sent: list[str] = []
        provider.on_statement(lambda sql, _params: sent.append(sql))
        assert provider.acquire_lease("k", "a", 10_000).acquired
        assert provider.acquire_lease("k", "a", 10_000).acquired  # the holder's re-acquire
        assert provider.release_lease("k", "a")
        assert len(sent) == 3, sent
        sent.clear()
        provider.acquire_lease("k", "a", 10_000)
        refused = provider.acquire_lease("k", "b", 10_000)
        assert not refused.acquired and refused.owner == "a"
        assert len(sent) == 3, sent  # the refused acquire, then the holder read


async def test_async_uncontended_operations_send_one_statement_each(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'leases.db'}"
    async with SqlLeaseProvider(url) as provider:
        await provider.migrate()
        sent: list[str] = []
        provider.on_statement(lambda sql, _params: sent.append(sql))
        assert (await provider.acquire_lease("k", "a", 10_000)).acquired
        assert (await provider.acquire_lease("k", "a", 10_000)).acquired
        assert await provider.release_lease("k", "a")
        assert len(sent) == 3, sent


def test_a_release_waits_out_another_writers_transaction(tmp_path: Path) -> None:
    """A statement other than the first try of an acquire waits for the write lock (up to its
    share of the time limit), so a short transaction of another writer delays it, never fails it."""
    url = _migrated(tmp_path)
    with SyncSqlLeaseProvider(url) as provider:
        assert provider.acquire_lease("k", "a", 10_000).acquired
        other = sqlite3.connect(tmp_path / "leases.db", isolation_level=None, check_same_thread=False)
        other.execute("BEGIN IMMEDIATE")  # holds the write lock
        threading.Timer(0.6, other.execute, ("COMMIT",)).start()
        started = time.monotonic()
        assert provider.release_lease("k", "a")
        assert 0.4 < time.monotonic() - started < 3.0
        other.close()


def test_a_semaphore_slot_costs_one_statement_per_step(tmp_path: Path) -> None:
    """Migration 0007: a slot's grant is one statement; its renewal is the plain statement (which
    finds a semaphore's head) and one slot statement, its release the slot statement alone (the
    provider remembers the key as a semaphore's); a lost plain lease's renewal is one statement (no probe)."""
    with SyncSqlLeaseProvider(_migrated(tmp_path)) as provider:
        slots = provider.statements.slots
        sent: list[str] = []
        provider.on_statement(lambda sql, _params: sent.append(sql))
        assert provider.acquire_lease("sem", "a", 10_000, limit=2).acquired
        assert sent == [slots["slot_grant"]], sent
        sent.clear()
        assert provider.renew_lease("sem", "a", 10_000)
        assert sent == [provider.statements.renew, slots["slot_renew_one"]], sent
        sent.clear()
        assert provider.release_lease("sem", "a")
        assert sent == [slots["slot_release_one"]], sent
        assert provider.acquire_lease("plain", "a", 10_000).acquired
        sent.clear()
        assert not provider.renew_lease("plain", "b", 10_000)
        assert sent == [provider.statements.renew], sent
