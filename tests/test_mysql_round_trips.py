"""MySQL/MariaDB from a URL: the provider's own driver connections (asyncmy, PyMySQL; no SQLAlchemy
engine), where an uncontended acquire, re-acquire, takeover, refusal or release is one round trip
(a multi-statement packet), a stalled statement ends at the operation's deadline, and the fence of
a new tenure is still drawn only after the key's row is locked."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import datetime
from typing import Any

import pytest

from sql_lease import LeaseBackendError, SqlLeaseProvider, SyncSqlLeaseProvider
from sql_lease.sql.dialects import mysql
from tests.conftest import MYSQL_URL

pytestmark = pytest.mark.mysql


def _blocker() -> Any:
    import pymysql
    import sqlalchemy as sa

    parsed = sa.make_url(MYSQL_URL)
    return pymysql.connect(
        host=parsed.host,
        port=parsed.port or 3306,
        user=parsed.username,
        password=parsed.password or "",
        autocommit=True,
    )


def test_sync_uncontended_operations_are_one_round_trip_each(mysql_db: tuple[str, str]) -> None:
    url, schema = mysql_db
    key = f"trips:{uuid.uuid4().hex}"
    with SyncSqlLeaseProvider(url, schema=schema) as provider:
        sent: list[str] = []
        provider.on_statement(lambda sql, _params: sent.append(sql))
        first = provider.acquire_lease(key, "a", 10_000)
        again = provider.acquire_lease(key, "a", 10_000)  # the holder's re-acquire: same tenure
        refused = provider.acquire_lease(key, "b", 10_000)
        assert first.acquired and again.acquired and again.fence == first.fence
        assert not refused.acquired and refused.owner == "a" and refused.fence == first.fence
        assert provider.release_lease(key, "a")
        assert len(sent) == 4, sent
        sent.clear()
        assert provider.acquire_lease(key, "a", 1).acquired
        time.sleep(0.05)
        taken = provider.acquire_lease(key, "b", 10_000)  # an expired lease taken over
        assert taken.acquired and taken.fence > first.fence
        assert len(sent) == 2, sent


async def test_async_uncontended_operations_are_one_round_trip_each(mysql_db: tuple[str, str]) -> None:
    url, schema = mysql_db
    key = f"trips:{uuid.uuid4().hex}"
    async with SqlLeaseProvider(url, schema=schema) as provider:
        sent: list[str] = []
        provider.on_statement(lambda sql, _params: sent.append(sql))
        first = await provider.acquire_lease(key, "a", 10_000)
        again = await provider.acquire_lease(key, "a", 10_000)
        refused = await provider.acquire_lease(key, "b", 10_000)
        assert first.acquired and again.acquired and again.fence == first.fence
        assert not refused.acquired and refused.owner == "a" and refused.fence == first.fence
        assert await provider.release_lease(key, "a")
        assert len(sent) == 4, sent
        sent.clear()
        assert (await provider.acquire_lease(key, "a", 1)).acquired
        await asyncio.sleep(0.05)
        taken = await provider.acquire_lease(key, "b", 10_000)
        assert taken.acquired and taken.fence > first.fence
        assert len(sent) == 2, sent


def test_sync_renewal_is_one_round_trip(mysql_db: tuple[str, str]) -> None:
    url, schema = mysql_db
    keys = [f"renew:{uuid.uuid4().hex}"]
    with SyncSqlLeaseProvider(url, schema=schema) as provider:
        fences = [provider.acquire_lease(key, "a", 10_000).fence for key in keys]
        sent: list[str] = []
        provider.on_statement(lambda sql, _params: sent.append(sql))
        renewed = provider.renew_lease_info(keys[0], "a", 20_000)
        assert renewed is not None and renewed.fence == fences[0] and renewed.remaining_ms > 15_000
        assert provider.renew_lease_info(keys[0], "b", 20_000) is None  # not the owner's
        assert len(sent) == 2, sent  # the refusal's packet says the key is no semaphore's: no probe


async def test_async_renewal_and_a_batch_are_one_round_trip_each(mysql_db: tuple[str, str]) -> None:
    url, schema = mysql_db
    keys = [f"renew:{uuid.uuid4().hex}" for _ in range(3)]
    async with SqlLeaseProvider(url, schema=schema) as provider:
        fences = [(await provider.acquire_lease(key, "a", 10_000)).fence for key in keys]
        sent: list[str] = []
        provider.on_statement(lambda sql, _params: sent.append(sql))
        renewed = await provider.renew_lease_info(keys[0], "a", 20_000)
        assert renewed is not None and renewed.fence == fences[0] and renewed.remaining_ms > 15_000
        assert await provider.renew_lease_info(keys[0], "b", 20_000) is None
        assert len(sent) == 2, sent  # the refusal's packet says the key is no semaphore's: no probe
        sent.clear()
        batch = await provider.renew_many([(key, "a", 30_000) for key in keys] + [("renew:none", "a", 30_000)])
        assert sorted(batch) == sorted(keys) and [batch[key].fence for key in keys] == fences
        is_head = provider.statements.slots["slot_is_head"]
        assert sent[1:] == [is_head], sent  # the one key not renewed: one read asks whether it is a semaphore


def test_the_acquire_packet_locks_the_row_before_it_draws_a_fence() -> None:
    """The text (no database): the holder is read without a lock first, the row is locked (or
    inserted) before the fence is drawn, and the fence is set after it was drawn."""
    for packet in (mysql.ACQUIRE_PACKET, mysql.ACQUIRE_PACKET_NOWAIT):
        order = [
            packet.index("INTO @sl_owner"),
            packet.index("START TRANSACTION"),
            packet.index("FOR UPDATE"),
            packet.index("INSERT INTO {table}"),
            packet.index("INSERT INTO {fence_counter}"),
            packet.index("fence = LAST_INSERT_ID()"),
            packet.index("COMMIT"),
        ]
        assert order == sorted(order), order
        assert "FOR UPDATE" not in packet[: packet.index("START TRANSACTION")]


def _lock_table(schema: str) -> Any:
    """A connection holding ``LOCK TABLES ... WRITE`` on the lease table: every statement on it waits."""
    blocker = _blocker()
    blocker.cursor().execute(f"LOCK TABLES `{schema}`.sql_leases WRITE")
    return blocker


def test_a_stalled_sync_statement_ends_at_the_deadline(mysql_db: tuple[str, str]) -> None:
    url, schema = mysql_db
    key = f"stall:{uuid.uuid4().hex}"
    with SyncSqlLeaseProvider(url, schema=schema, operation_timeout_s=0.5) as provider:
        assert provider.acquire_lease(key, "a", 10_000).acquired
        blocker = _lock_table(schema)
        try:
            started = time.monotonic()
            with pytest.raises(LeaseBackendError, match=r"within 0\.5 s") as info:
                provider.get_lease_owner(key)
            assert time.monotonic() - started < 1.5
            assert info.value.__cause__ is not None
        finally:
            blocker.close()
        assert provider.get_lease_owner(key) == "a"  # a fresh connection


async def test_a_stalled_async_statement_ends_at_the_deadline(mysql_db: tuple[str, str]) -> None:
    url, schema = mysql_db
    key = f"stall:{uuid.uuid4().hex}"
    async with SqlLeaseProvider(url, schema=schema, operation_timeout_s=0.5) as provider:
        assert (await provider.acquire_lease(key, "a", 10_000)).acquired
        blocker = _lock_table(schema)
        try:
            started = time.monotonic()
            with pytest.raises(LeaseBackendError, match=r"within 0\.5 s"):
                await provider.get_lease_owner(key)
            assert time.monotonic() - started < 1.5
        finally:
            blocker.close()
        assert await provider.get_lease_owner(key) == "a"


def _packed_run(failures: list[BaseException], answers: dict[str, Any]) -> tuple[list[str], object]:
    """The packed acquire plan (no database), its packet failing with ``failures`` in turn."""
    from sql_lease.sql.operations import acquire
    from sql_lease.sql.schema import LeaseTableNames
    from sql_lease.sql.statements import MysqlStatements

    s = MysqlStatements(LeaseTableNames(), lock_wait_s=5, packed=True)
    name = {text: step for step, text in s.steps.items()}
    plan = acquire(s, "k", "o", 1000)
    sent: list[str] = []
    query = next(plan)
    try:
        while True:
            step = name.get(query.sql, "holder")
            sent.append(step)
            if step == "acquire_packet" and failures:
                query = plan.throw(failures.pop(0))
                continue
            query = plan.send(answers.get(step, (0,)))
    except StopIteration as done:
        return sent, done.value
    except Exception as exc:
        return sent, exc


def test_a_deadlocked_packet_is_rolled_back_and_sent_again() -> None:
    """A deadlock (1213) or a duplicate key (1062) in the packet: ROLLBACK, then the whole packet
    again (its holder read included); past CONFLICT_RETRIES the error is raised, never a false answer."""
    import pymysql

    from sql_lease.sql.transactional import CONFLICT_RETRIES

    deadlock = pymysql.err.OperationalError(1213, "Deadlock found when trying to get lock")
    duplicate = pymysql.err.IntegrityError(1062, "Duplicate entry 'k' for key 'PRIMARY'")
    granted = (0, None, None, None, None, "o", 7, datetime(2026, 1, 1), 1000.0, 0)
    sent, result = _packed_run([deadlock, duplicate], {"acquire_packet": granted})
    assert sent == ["acquire_packet", "rollback", "acquire_packet", "rollback", "acquire_packet"], sent
    assert getattr(result, "acquired", None) is True and result.fence == 7  # type: ignore[attr-defined]
    sent, result = _packed_run([deadlock] * (CONFLICT_RETRIES + 1), {"acquire_packet": granted})
    assert result is deadlock and sent.count("acquire_packet") == CONFLICT_RETRIES + 1


def test_a_packet_whose_lock_wait_ran_out_answers_from_a_fresh_holder_read() -> None:
    """A lock wait timeout (1205) at the packet's row lock (an expired lease guarded by a caller's
    transaction): ROLLBACK, then the holder read answers "not acquired" (or names a new holder)."""
    import pymysql

    timeout = pymysql.err.OperationalError(1205, "Lock wait timeout exceeded; try restarting transaction")
    sent, result = _packed_run([timeout], {"holder": None})
    assert sent == ["acquire_packet", "rollback", "holder"], sent
    assert getattr(result, "acquired", None) is False and result.owner is None  # type: ignore[attr-defined]
    holder = ("b", 9, datetime(2026, 1, 1), 500.0)
    sent, result = _packed_run([timeout], {"holder": holder})
    assert getattr(result, "owner", None) == "b" and not result.acquired  # type: ignore[attr-defined]
