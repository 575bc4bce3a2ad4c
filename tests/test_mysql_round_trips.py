"""MySQL/MariaDB from a URL: the provider's own driver connections (asyncmy, PyMySQL; no SQLAlchemy
engine), where an uncontended acquire, re-acquire, takeover, refusal or release is one round trip
(a multi-statement packet), a stalled statement ends at the operation's deadline, and the fence of
a new tenure is still drawn only after the key's row is locked."""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from datetime import datetime
from typing import Any

import pytest

from sql_lease import LeaseBackendError, SqlLeaseProvider, SyncSqlLeaseProvider
from sql_lease.sql.dialects import mysql
from tests.conftest import MYSQL_URL, mysql_connect

pytestmark = pytest.mark.mysql


def _blocker() -> Any:
    return mysql_connect(MYSQL_URL)


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


def _check_keys_trips(
    sent: list[str], first: list[Any], again: list[Any], refused: list[Any], taken: list[Any]
) -> None:
    assert all(first) and len({r.fence for r in first}) == len(first)  # each key its own fence
    assert [r.fence for r in again] == [r.fence for r in first]  # the owner's tenures go on
    assert not any(refused) and refused[0].owner == "a" and refused[0].fence == first[0].fence
    assert refused[-1].owner is None  # the new key blocked nothing
    assert all(taken) and min(r.fence for r in taken) > max(r.fence for r in first)
    assert len(sent) == 5, sent  # grant, re-acquire, refusal, short grant, takeover: one packet each


def test_sync_acquire_leases_of_ten_keys_is_one_round_trip(mysql_db: tuple[str, str]) -> None:
    url, schema = mysql_db
    tag = uuid.uuid4().hex
    keys, lapsing = [f"many:{tag}:{i}" for i in range(10)], [f"many:{tag}:short:{i}" for i in range(10)]
    with SyncSqlLeaseProvider(url, schema=schema) as provider:
        sent: list[str] = []
        provider.on_statement(lambda sql, _params: sent.append(sql))
        first = provider.acquire_leases(keys, "a", 10_000)
        again = provider.acquire_leases(keys, "a", 10_000)
        refused = provider.acquire_leases([*keys[:3], f"many:{tag}:new"], "b", 10_000)
        assert all(provider.acquire_leases(lapsing, "a", 1))
        time.sleep(0.05)
        taken = provider.acquire_leases(lapsing, "b", 10_000)  # expired leases taken over
        _check_keys_trips(sent, first, again, refused, taken)


async def test_async_acquire_leases_of_ten_keys_is_one_round_trip(mysql_db: tuple[str, str]) -> None:
    url, schema = mysql_db
    tag = uuid.uuid4().hex
    keys, lapsing = [f"many:{tag}:{i}" for i in range(10)], [f"many:{tag}:short:{i}" for i in range(10)]
    async with SqlLeaseProvider(url, schema=schema) as provider:
        sent: list[str] = []
        provider.on_statement(lambda sql, _params: sent.append(sql))
        first = await provider.acquire_leases(keys, "a", 10_000)
        again = await provider.acquire_leases(keys, "a", 10_000)
        refused = await provider.acquire_leases([*keys[:3], f"many:{tag}:new"], "b", 10_000)
        assert all(await provider.acquire_leases(lapsing, "a", 1))
        await asyncio.sleep(0.05)
        taken = await provider.acquire_leases(lapsing, "b", 10_000)
        _check_keys_trips(sent, first, again, refused, taken)


def test_the_acquire_packet_locks_the_row_before_it_draws_a_fence() -> None:
    """The text (no database): the holder is read without a lock first, the row is locked (or
    inserted) before the fence is drawn, and the fence is set after it was drawn."""
    for packet in (mysql.ACQUIRE_PACKET, mysql.ACQUIRE_PACKET_NOWAIT):
        _assert_in_order(packet, "INTO @sl_owner", "INSERT INTO {table}", "fence = LAST_INSERT_ID()")


def _assert_in_order(packet: str, read: str, insert: str, fence_set: str) -> None:
    marks = [read, "START TRANSACTION", "FOR UPDATE", insert, "INSERT INTO {fence_counter}", fence_set, "COMMIT"]
    order = [packet.index(mark) for mark in marks]
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


def test_the_keys_packet_locks_every_row_before_it_draws_the_fences() -> None:
    """The text (no database): the holders are read without a lock first, every row is locked (or
    inserted) before the one draw of fences, and each fence is set from that draw; no row changes
    unless the lock found every key free (``@sl_granted``)."""
    packet = mysql.ACQUIRE_KEYS_PACKET
    _assert_in_order(packet, "INTO @sl_free", "WHERE FIND_IN_SET(r.n, @sl_missing)", "LAST_INSERT_ID() + r.n - 1")
    writes = [part for part in packet.split(";") if part.lstrip().startswith(("INSERT", "UPDATE", "DELETE"))]
    assert len(writes) == 3 and all("JSON_TABLE(IF(@sl_granted" in part for part in writes), writes


def test_the_keys_packet_notes_every_position_within_the_default_group_concat_length() -> None:
    """``GROUP_CONCAT`` cuts its result at ``group_concat_max_len`` (1024 bytes by default on MySQL):
    the positions of ``MAX_KEYS`` keys fit."""
    from sql_lease.contract import MAX_KEYS

    assert "GROUP_CONCAT(CASE WHEN held.`key` IS NULL THEN r.n END)" in mysql.ACQUIRE_KEYS_PACKET
    assert len(",".join(str(n) for n in range(1, MAX_KEYS + 1))) <= 1024


def _keys_plan(answers: dict[str, list[Any]], keys: list[str]) -> tuple[list[str], list[Any]]:
    """The packed all-or-nothing acquire plan for ``keys`` (no database): the steps it sent, each answered
    by the next of ``answers[step]``'s row lists, and its results."""
    from sql_lease.sql.operations import acquire_keys
    from sql_lease.sql.schema import LeaseTableNames
    from sql_lease.sql.statements import MysqlStatements

    s = MysqlStatements(LeaseTableNames(), lock_wait_s=5, packed=True)
    name = {text: step for step, text in s.steps.items()}
    plan = acquire_keys(s, keys, "o", 1000)
    sent: list[str] = []
    query = next(plan)
    try:
        while True:
            sent.append(name[query.sql])
            rows = answers[sent[-1]].pop(0) if len(answers[sent[-1]]) > 1 else answers[sent[-1]][0]
            query = plan.send(rows if query.many else rows[0])
    except StopIteration as done:
        return sent, done.value


WHEN = datetime(2026, 1, 1)


def test_without_consecutive_auto_increments_the_keys_go_step_by_step() -> None:
    """A server whose ``innodb_autoinc_lock_mode`` is 2 (MySQL 8's default) may interleave one insert's
    values with another's: the packet then locks and writes nothing (its rows say free, not bulk) and the
    plan goes on with a packet per step, each new tenure's fence drawn on its own after the locks."""
    expired = ("b", "x", 3, WHEN, -5.0, None, WHEN, 0)
    answers = {
        "acquire_keys_packet": [[("a", *[None] * 8, 1, 0, 0), (*expired, 0, 1, 0, 0), ("c", *[None] * 8, 1, 0, 0)]],
        "lock_rows_packet": [[(*expired[:7], 0, 0)]],
        "grant_new_keys": [[(2,)]],
        "fence_new_packet": [[(1,)]],
        "fence_take_over_packet": [[(1,)]],
        "granted_keys_packet": [[(key, "o", fence, WHEN, 1000.0) for key, fence in (("a", 7), ("b", 8), ("c", 9))]],
    }
    sent, results = _keys_plan(answers, ["c", "b", "a"])
    assert sent == [
        "acquire_keys_packet",
        "lock_rows_packet",
        "grant_new_keys",
        "fence_new_packet",
        "fence_take_over_packet",
        "fence_new_packet",
        "granted_keys_packet",
    ], sent
    assert [(r.acquired, r.fence) for r in results] == [(True, 9), (True, 8), (True, 7)]


def test_a_key_taken_before_the_packet_locked_it_is_refused_by_its_read_back() -> None:
    """Free at the read, taken under the lock (``@sl_granted`` 0: nothing written): the read-back names
    the holder; a holder gone by the read-back (a refusal naming nobody) sends the packet again."""
    held = ("b", "x", 4, WHEN, 500.0, None, WHEN, 0, 1)
    refused = [("a", *[None] * 8, 1, 1, 0), (*held, 1, 1, 0)]
    gone = [("a", *[None] * 8, 0, 0, 0), ("b", "x", 4, WHEN, -1.0, None, WHEN, 0, 0, 0, 0, 0)]
    sent, results = _keys_plan({"acquire_keys_packet": [refused]}, ["a", "b"])
    assert sent == ["acquire_keys_packet"] and [(r.acquired, r.owner) for r in results] == [(False, None), (False, "x")]
    granted = [(key, "o", fence, WHEN, 1000.0, None, WHEN, 0, 1, 1, 1, 1) for key, fence in (("a", 5), ("b", 6))]
    sent, results = _keys_plan({"acquire_keys_packet": [gone, granted]}, ["a", "b"])
    assert sent == ["acquire_keys_packet"] * 2 and [r.fence for r in results] == [5, 6]


@pytest.mark.parametrize("setting", ["auto_increment_increment = 2", "group_concat_max_len = 4"])
def test_sessions_the_packet_cannot_serve_take_the_keys_step_by_step(
    mysql_db: tuple[str, str], monkeypatch: pytest.MonkeyPatch, setting: str
) -> None:
    """On sessions with ``auto_increment_increment = 2`` (as a server in lock mode 2 may interleave one
    insert's values), or a ``group_concat_max_len`` that could cut the packet's lists of positions, the
    packet changes nothing and the plan goes on with a packet per step: every key granted, each its
    own fence, a takeover's larger than the tenure before it."""
    from sql_lease.sql import setup

    original = setup.mysql_session_setup
    monkeypatch.setattr(setup, "mysql_session_setup", lambda s: (*original(s), f"SET SESSION {setting}"))
    url, schema = mysql_db
    tag = uuid.uuid4().hex
    keys = [f"steps:{tag}:{i}" for i in range(3)]
    with SyncSqlLeaseProvider(url, schema=schema) as provider:
        steps = {text: name for name, text in provider.statements.steps.items()}
        sent: list[str] = []
        provider.on_statement(lambda sql, _params: sent.append(steps.get(sql, sql)))
        first = provider.acquire_leases(keys, "a", 1)
        time.sleep(0.05)
        taken = provider.acquire_leases([*keys, f"steps:{tag}:new"], "b", 10_000)
    assert all(first) and all(taken)
    assert len({r.fence for r in [*first, *taken]}) == 7 and min(r.fence for r in taken) > max(r.fence for r in first)
    assert sent[:2] == ["acquire_keys_packet", "lock_rows_packet"] and sent.count("acquire_keys_packet") == 2, sent
    assert sent.count("fence_take_over_packet") == 3 and sent.count("fence_new_packet") == 4, sent


def _check_slot_trips(sent: list[str], first: Any, again: Any, second: Any, refused: Any, released: bool) -> None:
    assert first.acquired and again.acquired and again.fence == first.fence  # the owner's slot goes on
    assert second.acquired and second.fence > first.fence
    assert not refused.acquired and refused.owner == "a" and refused.fence == first.fence  # the oldest holder
    assert released
    # grant, re-acquire, second grant, refusal, release: one packet each (the provider granted slots of the
    # key, so its release sends the slot's packet first, without the plain release's statement): each one
    # statement, a CALL of migration 0009's procedures (no multi-statement packet parsed on every call)
    assert len(sent) == 5, sent
    assert all(text.lstrip().startswith("CALL ") and ";" not in text for text in sent), sent


def test_sync_semaphore_slot_grant_and_release_are_one_round_trip_each(mysql_db: tuple[str, str]) -> None:
    url, schema = mysql_db
    key = f"slots:{uuid.uuid4().hex}"
    with SyncSqlLeaseProvider(url, schema=schema) as provider:
        sent: list[str] = []
        provider.on_statement(lambda sql, _params: sent.append(sql))
        first = provider.acquire_lease(key, "a", 10_000, limit=2)
        again = provider.acquire_lease(key, "a", 10_000, limit=2)
        second = provider.acquire_lease(key, "b", 10_000, limit=2)
        refused = provider.acquire_lease(key, "c", 10_000, limit=2)
        released = provider.release_lease(key, "b")
        _check_slot_trips(sent, first, again, second, refused, released)
        assert [h.owner for h in provider.get_lease_holders(key)] == ["a"]


async def test_async_semaphore_slot_grant_and_release_are_one_round_trip_each(mysql_db: tuple[str, str]) -> None:
    url, schema = mysql_db
    key = f"slots:{uuid.uuid4().hex}"
    async with SqlLeaseProvider(url, schema=schema) as provider:
        sent: list[str] = []
        provider.on_statement(lambda sql, _params: sent.append(sql))
        first = await provider.acquire_lease(key, "a", 10_000, limit=2)
        again = await provider.acquire_lease(key, "a", 10_000, limit=2)
        second = await provider.acquire_lease(key, "b", 10_000, limit=2)
        refused = await provider.acquire_lease(key, "c", 10_000, limit=2)
        released = await provider.release_lease(key, "b")
        _check_slot_trips(sent, first, again, second, refused, released)
        assert [h.owner for h in await provider.get_lease_holders(key)] == ["a"]


def _migration_0009() -> Any:
    # migration 0009's module (the slot procedures' bodies), loaded from its file
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[1] / "migrations" / "versions" / "0009_mysql_slot_procedures.py"
    spec = importlib.util.spec_from_file_location("sql_lease_0009", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_the_slot_procedures_lock_the_head_before_they_draw_a_fence_or_write_a_slot() -> None:
    """The texts (no database): the slot grant makes the head (a key without a row) or locks the existing row
    with its upsert (an exclusive lock, new row or not) before it reads the slots, draws the fence after that
    lock and inserts the slot with it; the slot release writes a slot only under the head's lock."""
    procedures = _migration_0009()
    grant = procedures._ACQUIRE
    marks = ["START TRANSACTION", "ON DUPLICATE KEY", "LEFT JOIN {slot_table}", "INSERT INTO {fence_counter}"]
    order = [grant.index(mark) for mark in [*marks, "INSERT INTO {slot_table}", "LAST_INSERT_ID()"]]
    assert order == sorted(order), order
    assert "{slot_table}" not in grant[: grant.index("ON DUPLICATE KEY")]
    release = procedures._RELEASE
    locked = release.index("FOR UPDATE")
    assert release.index("START TRANSACTION") < locked < release.index("UPDATE {slot_table}")
    assert "{slot_table}" not in release[:locked] and locked < release.index("DELETE FROM {slot_table}")
    assert grant.rstrip().endswith("COMMIT;\nEND") and release.rstrip().endswith("COMMIT;\nEND")


def _names(s: Any) -> dict[str, str]:
    """The name of each statement text of MySQL statements ``s``."""
    return (
        {text: step for step, text in s.slots.items() if text}
        | {text: step for step, text in s.steps.items()}
        | {s.release: "release"}
    )


def _slot_plan(plan: Any, failures: list[BaseException], answers: dict[str, Any]) -> tuple[list[str], object]:
    from sql_lease.sql.schema import LeaseTableNames
    from sql_lease.sql.statements import MysqlStatements

    s = MysqlStatements(LeaseTableNames(), lock_wait_s=5, packed=True)
    name = _names(s)
    run = plan(s)
    sent: list[str] = []
    query = next(run)
    try:
        while True:
            sent.append(name[query.sql])
            if sent[-1].endswith("_packet") and failures:
                query = run.throw(failures.pop(0))
                continue
            query = run.send(answers.get(sent[-1]))
    except StopIteration as done:
        return sent, done.value
    except Exception as exc:
        return sent, exc


def test_a_slot_packet_that_met_a_deadlock_runs_again_and_one_whose_lock_wait_ran_out_is_refused() -> None:
    """A deadlock (1213) in a slot packet: ROLLBACK, then the whole packet again; a lock wait timeout
    (1205) at the grant's head lock: ROLLBACK, then a refusal naming the oldest holder read afresh."""
    import pymysql

    from sql_lease.sql.operations import acquire, release

    deadlock = pymysql.err.OperationalError(1213, "Deadlock found when trying to get lock")
    timeout = pymysql.err.OperationalError(1205, "Lock wait timeout exceeded; try restarting transaction")
    granted = (0, 1, "", 3, WHEN, 0.0, 0, "o", 7, WHEN, 1000.0)
    grant = functools.partial(acquire, key="k", owner="o", ttl_ms=1000, limit=2)
    sent, result = _slot_plan(grant, [deadlock], {"slot_acquire_packet": granted})
    assert sent == ["slot_acquire_packet", "rollback", "slot_acquire_packet"], sent
    assert getattr(result, "fence", None) == 7 and result.acquired  # type: ignore[attr-defined]
    oldest = [("b", 5, WHEN, 800.0, None, WHEN, 0)]
    sent, result = _slot_plan(grant, [timeout], {"slot_holders": oldest})
    assert sent == ["slot_acquire_packet", "rollback", "slot_holders"], sent
    assert getattr(result, "owner", None) == "b" and not result.acquired  # type: ignore[attr-defined]
    answers = {"release": (0,), "slot_release_packet": (1, 1)}
    sent, result = _slot_plan(lambda s: release(s, "k", "o"), [deadlock], answers)
    assert sent == ["release", "slot_release_packet", "rollback", "release", "slot_release_packet"], sent
    assert result is True


def test_a_wrong_hint_that_a_key_is_a_semaphores_costs_a_round_trip_and_changes_no_answer(
    mysql_db: tuple[str, str],
) -> None:
    """The provider remembers keys it was granted slots of; once such a key is a plain lease (its last slot
    released, then taken as a lease through another provider), a release sends the slot's packet first, finds
    no head there and goes on to the plain release: the answers are those of a release without the hint."""
    url, schema = mysql_db
    held, lost = f"hint:{uuid.uuid4().hex}", f"hint:{uuid.uuid4().hex}"
    with SyncSqlLeaseProvider(url, schema=schema) as provider, SyncSqlLeaseProvider(url, schema=schema) as other:
        for key in (held, lost):
            assert provider.acquire_lease(key, "a", 10_000, limit=2).acquired
            assert provider.release_lease(key, "a")
            assert other.acquire_lease(key, "b", 10_000).acquired  # the head expired at the release: taken over
        names, sent = _names(provider.statements), []
        provider.on_statement(lambda sql, _params: sent.append(names[sql]))
        assert provider.release_lease(held, "b")  # the plain lease, released through the provider that had the hint
        assert sent == ["slot_release_first_packet", "release"], sent
        assert other.get_lease(held) is None
        sent.clear()
        assert not provider.release_lease(lost, "a")  # not its lease: nothing released, the plain path says so
        assert sent == ["slot_release_first_packet", "release", "slot_release_packet"], sent
        assert other.get_lease_owner(lost) == "b"
        sent.clear()
        assert provider.release_lease(lost, "b")
        assert sent == ["release"], sent  # the hint was dropped when the packet found no head


async def test_a_key_not_remembered_as_a_semaphores_is_released_as_before_and_then_remembered(
    mysql_db: tuple[str, str],
) -> None:
    """A slot granted by another provider: the first release goes the plain way (the plain release, then the
    slot's packet), which tells the provider the key is a semaphore's; its next slot release is one packet."""
    url, schema = mysql_db
    key = f"hint:{uuid.uuid4().hex}"
    async with SqlLeaseProvider(url, schema=schema) as provider, SqlLeaseProvider(url, schema=schema) as other:
        assert (await other.acquire_lease(key, "a", 10_000, limit=2)).acquired
        assert (await other.acquire_lease(key, "b", 10_000, limit=2)).acquired
        names, sent = _names(provider.statements), []
        provider.on_statement(lambda sql, _params: sent.append(names[sql]))
        assert await provider.release_lease(key, "a")
        assert sent == ["release", "slot_release_packet"], sent
        sent.clear()
        assert await provider.release_lease(key, "b")
        assert not await provider.release_lease(key, "b")  # released already: the slot's packet says so
        assert sent == ["slot_release_first_packet", "slot_release_first_packet"], sent
        assert await other.get_lease_holders(key) == []


def test_the_semaphore_key_memory_is_bounded_and_forgets_the_least_recently_remembered_first() -> None:
    from sql_lease.sql.hints import SemaphoreKeys

    hints = SemaphoreKeys(capacity=3)
    for key in ("a", "b", "c", "a", "d"):  # "a" again: the most recent; "b" is then the oldest
        hints.remember(key)
    assert len(hints) == 3 and "b" not in hints and all(key in hints for key in ("a", "c", "d"))
    hints.forget("c")
    hints.forget("never")
    assert "c" not in hints and len(hints) == 2


def test_a_remembered_keys_slot_packet_that_met_a_deadlock_runs_again() -> None:
    """A deadlock (1213) in the packet a remembered key's release sends first: ROLLBACK, then that packet again."""
    import pymysql

    from sql_lease.sql.operations import release

    def remembered(s: Any) -> Any:
        s.semaphore_keys.remember("k")
        return release(s, "k", "o")

    deadlock = pymysql.err.OperationalError(1213, "Deadlock found when trying to get lock")
    sent, result = _slot_plan(remembered, [deadlock], {"slot_release_first_packet": (1, 1)})
    assert sent == ["slot_release_first_packet", "rollback", "slot_release_first_packet"], sent
    assert result is True
