"""Semaphores beside guarded writes and plain leases, on a real server (found by a review of issue 25):

- a slot holder's ``check_held`` guard keeps a new holder out until its transaction ends, as a plain
  holder's does, even when its slot expires meanwhile (PostgreSQL);
- a plain acquire racing a slot grant never gets a smaller fence than the grant, nor does a plain or
  all-or-nothing acquire when the head is deleted while it waits, nor when the head was made after
  its snapshot; a slot transfer draws its fence after a plain acquire of its key (PostgreSQL);
- a lost holder's renewal answers at once beside the new holder's guard, and does not stall the
  batch it is in (PostgreSQL);
- a slot acquire that meets a guard's lock answers "not acquired", as a plain acquire does (MariaDB).

Guards are threads holding a transaction open; each test checks the order of events (a call still
blocked, or already answered, while the guard is open), never a duration.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa

from sql_lease import LeaseLostError, SqlLeaseProvider, SyncSqlLeaseProvider
from tests.conftest import MYSQL_URL

POSTGRES_URL = os.environ.get("SQL_LEASE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture
def pg() -> Iterator[tuple[SyncSqlLeaseProvider, sa.Engine, str]]:
    schema = "sg_" + os.urandom(4).hex()
    engine = sa.create_engine(sa.make_url(POSTGRES_URL).set(drivername="postgresql+psycopg"))
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE SCHEMA {schema}"))
    provider = SyncSqlLeaseProvider(POSTGRES_URL, schema=schema, operation_timeout_s=20)
    provider.migrate()
    try:
        yield provider, engine, schema
    finally:
        provider.close()
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP SCHEMA {schema} CASCADE"))
        engine.dispose()


@pytest.fixture
def my() -> Iterator[tuple[SyncSqlLeaseProvider, sa.Engine, str]]:
    """A lease table of its own on MySQL: (provider, PyMySQL engine, table name); dropped afterwards."""
    table = "sg_" + os.urandom(4).hex()
    engine = sa.create_engine(sa.make_url(MYSQL_URL).set(drivername="mysql+pymysql"))
    provider = SyncSqlLeaseProvider(MYSQL_URL, table_name=table, operation_timeout_s=20)
    provider.migrate()
    try:
        yield provider, engine, table
    finally:
        provider.close()
        with engine.begin() as conn:
            for (name,) in conn.execute(sa.text("SHOW TABLES")).all():
                if name.startswith(table):
                    conn.execute(sa.text(f"DROP TABLE `{name}`"))
        engine.dispose()


class Guard:
    """A transaction that runs ``check_held`` for (key, owner, fence) and stays open until ``end()``."""

    def __init__(self, provider: Any, engine: sa.Engine, key: str, owner: str, fence: int, schema: str | None) -> None:
        self.opened, self.ending = threading.Event(), threading.Event()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, args=(provider, engine, key, owner, fence, schema))
        self.thread.start()
        assert self.opened.wait(20), self.errors

    def _run(self, provider: Any, engine: sa.Engine, key: str, owner: str, fence: int, schema: str | None) -> None:
        try:
            with engine.connect() as conn:
                if schema is not None:
                    conn.execute(sa.text(f"SET search_path TO {schema}"))
                    conn.commit()
                with conn.begin():
                    provider.check_held(conn, key, owner, fence)
                    self.opened.set()
                    self.ending.wait(60)
        except BaseException as exc:
            self.errors.append(exc)
            self.opened.set()

    def end(self) -> None:
        self.ending.set()
        self.thread.join(30)
        assert not self.errors, self.errors


def in_thread(call: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(call()))
    thread.start()
    return thread, out


@pytest.mark.parametrize("limit", [1, 2])
def test_a_guarded_slot_keeps_a_new_holder_out_until_its_transaction_ends(pg: Any, limit: int) -> None:
    provider, engine, schema = pg
    key = "g:" + os.urandom(4).hex()
    a = provider.acquire_lease(key, "A", 1_500, limit=2)
    provider.acquire_lease(key, "X", 1_500 if limit == 1 else 60_000, limit=2)  # limit 1: every slot lapses
    guard = Guard(provider, engine, key, "A", a.fence, schema)
    try:
        time.sleep(2.5)  # A's slot (and, for the plain acquire, X's) expires while A still writes
        thread, out = in_thread(lambda: provider.acquire_lease(key, "C", 60_000, limit=limit))
        thread.join(1.5)
        assert out == [] or not out[0].acquired, out  # not granted while A's guarded write is open
    finally:
        guard.end()
    thread.join(20)
    assert provider.acquire_lease(key, "C", 60_000, limit=limit).acquired  # free once the guard ended


def test_a_plain_acquire_racing_a_slot_grant_never_gets_a_smaller_fence(pg: Any) -> None:
    provider, engine, schema = pg
    key = "f:" + os.urandom(4).hex()
    provider.acquire_lease(key, "old", 1, limit=2)  # an expired head
    time.sleep(0.05)
    with engine.connect() as slot_side:
        slot_side.execute(sa.text(f"SET search_path TO {schema}"))
        started = slot_side.execute(  # a grant in progress: it holds the key's locks (advisory, head row)
            sa.text("SELECT * FROM sql_leases_slot_acquire(:k, 'A', 200, NULL, 2, false, NULL)"), {"k": key}
        ).one()
        assert started[0], started
        thread, out = in_thread(lambda: provider.acquire_lease(key, "P", 30_000))
        wait_for_a_lock_wait(slot_side, schema)  # P read the key free and waits (its fence drawn first, before f42fafd)
        granted = slot_side.execute(
            sa.text("SELECT * FROM sql_leases_slot_acquire(:k, 'B', 200, NULL, 2, false, NULL)"), {"k": key}
        ).one()
        assert granted[0], granted
        time.sleep(0.8)  # B's slot, and the head one TTL beyond it, lapse before P rechecks the row
        slot_side.commit()
    thread.join(20)
    (plain,) = out
    assert plain.acquired and plain.fence > granted[2], (plain, granted)


def wait_for_a_lock_wait(conn: sa.Connection, schema: str, at_least: int = 1) -> None:
    """Return once ``at_least`` statements on the schema's tables wait for a lock (a row's, a
    transaction's, an advisory one)."""
    for _ in range(2_000):
        conn.execute(sa.text("SELECT pg_stat_clear_snapshot()"))  # a transaction keeps its first reading
        waiting = conn.execute(
            sa.text(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid() "
                "AND position(:schema IN query) > 0"
            ),
            {"schema": schema},
        ).scalar_one()
        if waiting >= at_least:
            return
        time.sleep(0.01)
    raise AssertionError(f"fewer than {at_least} statements waited for a lock")


def plain_acquire_by(provider: SyncSqlLeaseProvider, key: str, call: str) -> tuple[Any, Any]:
    """(a release waiter of ``key``, to close, and a call acquiring ``key`` for P by one of the plain statements)."""
    waiter = provider.release_waiter(key)
    assert waiter is not None
    calls = {
        "acquire_leases": lambda: provider.acquire_leases([key, key + ":other"], "P", 30_000)[0],  # ACQUIRE_KEYS
        "acquire_lease": lambda: provider.acquire_lease(key, "P", 30_000),  # ACQUIRE
        "waiter": lambda: waiter.acquire("P", 30_000, 20),  # ACQUIRE_WAITING
    }
    return waiter, calls[call]


@pytest.mark.parametrize("head", ["expired", "made_after_the_snapshot"])
@pytest.mark.parametrize("call", ["acquire_leases", "acquire_lease", "waiter"])
def test_an_acquire_racing_slot_grants_and_a_break_never_gets_a_smaller_fence(pg: Any, call: str, head: str) -> None:
    """A plain acquire drew its fence, then waited for the key's head: a slot grant drew a larger one
    meanwhile, the head was deleted, and the acquire inserted its older fence as a later tenure (found
    by a hostile tester's audit triggers). Each acquire now locks the key's row before it draws, and
    (for a head made after its snapshot, which that lock misses) slot grants take the key's advisory
    lock, as plain acquires do. One session's steps stand for grants and a break that commit before
    the acquire wakes."""
    provider, engine, schema = pg
    key = "f:" + os.urandom(4).hex()
    if head == "expired":
        provider.acquire_lease(key, "old", 1, limit=2)
        time.sleep(0.05)
    waiter, acquire = plain_acquire_by(provider, key, call)
    grant = sa.text("SELECT * FROM sql_leases_slot_acquire(:k, :o, 60000, NULL, 2, false, NULL)")
    with waiter, engine.connect() as slot_side:
        slot_side.execute(sa.text(f"SET search_path TO {schema}"))
        started = slot_side.execute(grant, {"k": key, "o": "A"}).one()  # a grant in progress holds the key
        assert started[0], started
        thread, out = in_thread(acquire)
        wait_for_a_lock_wait(slot_side, schema)  # P read the key free and waits
        granted = slot_side.execute(grant, {"k": key, "o": "B"}).one()
        assert granted[0], granted
        slot_side.execute(  # the head goes, as a break of the semaphore deletes it (SLOT_DELETE_ALL)
            sa.text("WITH s AS (DELETE FROM sql_leases_slots WHERE key = :k) DELETE FROM sql_leases WHERE key = :k"),
            {"k": key},
        )
        slot_side.commit()
        thread.join(20)
    (taken,) = out
    assert taken.acquired and taken.fence > granted[2], (taken, granted)


class HeldAfterHeadLock:
    """An ``on_statement`` hook: the first slot transaction to reach SLOT_STATE (its head locked by
    then) stops there until ``go`` is set."""

    def __init__(self, provider: SyncSqlLeaseProvider) -> None:
        self.slot_state = provider.statements.slots["slot_state"]
        self.locked, self.go = threading.Event(), threading.Event()
        self._first = threading.Lock()

    def __call__(self, sql: str, params: Any) -> None:
        if sql == self.slot_state and self._first.acquire(blocking=False):
            self.locked.set()
            assert self.go.wait(20)


def outcome(call: Any) -> tuple[threading.Thread, list[Any]]:
    """``call`` in a thread; its list gets ("ok", result) or ("error", exception)."""
    out: list[Any] = []

    def body() -> None:
        try:
            out.append(("ok", call()))
        except Exception as exc:
            out.append(("error", exc))

    thread = threading.Thread(target=body)
    thread.start()
    return thread, out


@pytest.mark.parametrize("op", ["renew", "transfer", "release_beside"])
def test_a_slot_guard_beside_the_keys_slot_operations_waits_and_never_deadlocks(pg: Any, op: str) -> None:
    """A slot holder's guard (CHECK_SLOT) locked its slot row, then the head; renewals, transfers
    and releases lock the head, then the slot row: the server broke the cycle with a deadlock, in
    the application's ``check_held`` or in a release queued on the head (found by a hostile test's
    audit). The guard now locks the head first; each waits for the other (a guard that waited for a
    transfer of its slot finds it lost)."""
    provider, engine, schema = pg
    key = "d:" + os.urandom(4).hex()
    a = provider.acquire_lease(key, "A", 60_000, limit=2)
    assert provider.acquire_lease(key, "B", 60_000, limit=2).acquired
    hook = HeldAfterHeadLock(provider)
    remove = provider.on_statement(hook)
    calls = {
        "renew": lambda: provider.renew_lease(key, "A", 60_000),
        "transfer": lambda: provider.transfer_lease(key, "A", "A2", 60_000),
        "release_beside": lambda: provider.renew_lease(key, "A", 60_000),
    }
    guard: Guard | None = None
    try:
        first, first_out = outcome(calls[op])
        assert hook.locked.wait(20)  # it holds the head, about to read and write A's slot
        waiting = 0
        if op == "release_beside":
            releasing, released = outcome(lambda: provider.release_lease(key, "B"))
            waiting = 1
            with engine.connect() as conn:
                wait_for_a_lock_wait(conn, schema, waiting)  # B's release queues on the head first
        guard_thread, guard_out = outcome(lambda: Guard(provider, engine, key, "A", a.fence, schema))
        with engine.connect() as conn:
            wait_for_a_lock_wait(conn, schema, waiting + 1)  # A's guard waits too
        hook.go.set()
        first.join(1.0)  # the operation goes on: it waits for the guard, or (before) closed a cycle
        guard_thread.join(20)
        assert guard_out and guard_out[0][0] == "ok", guard_out
        guard = guard_out[0][1]
        lost = [type(error) for error in guard.errors] == [LeaseLostError]  # A's slot went to A2 first
        assert lost if op == "transfer" else not guard.errors, guard.errors  # was: DeadlockDetected
        if lost:
            guard.errors.clear()
    finally:
        hook.go.set()
        if guard is not None:
            guard.end()
        remove()
    first.join(20)
    assert first_out and first_out[0][0] == "ok", first_out
    if op == "release_beside":
        releasing.join(20)
        assert released == [("ok", True)], released


def test_a_slot_transfer_draws_its_fence_after_a_plain_acquire_of_its_key(pg: Any) -> None:
    """A transfer draws a new fence: it waits for the key's advisory lock, as acquires do, so a plain
    acquire that drew its fence first cannot insert it after the transfer's larger one."""
    provider, engine, schema = pg
    key = "t:" + os.urandom(4).hex()
    a = provider.acquire_lease(key, "A", 60_000, limit=2)
    with engine.connect() as plain_side:
        plain_side.execute(sa.text(f"SET search_path TO {schema}"))
        plain_side.execute(  # a plain acquire's step (ACQUIRE's serialised), its transaction open
            sa.text("SELECT pg_advisory_xact_lock('sql_leases'::regclass::oid::int4, hashtext(:k))"), {"k": key}
        )
        thread, out = in_thread(lambda: provider.transfer_lease(key, "A", "B", 60_000))
        wait_for_a_lock_wait(plain_side, schema)
        assert thread.is_alive() and out == []
        drawn = plain_side.execute(sa.text(f"SELECT nextval('{schema}.sql_leases_fence_seq')")).scalar_one()
        plain_side.commit()
        thread.join(20)
    assert out == [True]
    (b,) = provider.get_lease_holders(key)
    assert b.owner == "B" and b.fence > drawn > a.fence, (b, drawn, a)


async def test_a_lost_holders_renewal_answers_beside_the_new_holders_guard(pg: Any) -> None:
    sync, engine, schema = pg
    provider = SqlLeaseProvider(POSTGRES_URL, schema=schema, operation_timeout_s=20)
    try:
        k, j = "k:" + os.urandom(4).hex(), "j:" + os.urandom(4).hex()
        h2 = await provider.acquire_lease(k, "H2", 60_000)  # H1 lost K to H2
        await provider.acquire_lease(j, "H3", 60_000)
        guard = Guard(sync, engine, k, "H2", h2.fence, schema)
        try:
            assert await provider.renew_lease(k, "H1", 60_000) is False
            renewed = await provider.renew_many([(k, "H1", 60_000), (j, "H3", 60_000)])
            assert sorted(renewed) == [j]
            assert guard.thread.is_alive()  # answered while H2's guard was still open
        finally:
            guard.end()
    finally:
        await provider.close()


def test_a_slot_acquire_meeting_a_guards_lock_is_refused_on_mysql(my: Any) -> None:
    provider, engine, _ = my
    key = "g:" + os.urandom(4).hex()
    a = provider.acquire_lease(key, "A", 1_500, limit=2)
    provider.acquire_lease(key, "X", 60_000, limit=2)
    guard = Guard(provider, engine, key, "A", a.fence, None)
    try:
        time.sleep(2.5)
        refused = provider.acquire_lease(key, "C", 60_000, limit=2)  # raised a lock wait timeout before
        assert not refused.acquired
        assert guard.thread.is_alive()
    finally:
        guard.end()


def test_a_slot_sweep_leaves_a_slot_whose_grant_holds_the_head(pg: Any) -> None:
    """A grant judges its owner's slot live under the head's lock, then extends it: a sweep (grace 0)
    that deleted the slot in between, once it had lapsed, left a grant answered with no slot row
    (found by reading, issue 25's review). The sweep locks each key's head first, skipping a held one."""
    provider, engine, schema = pg
    key = "s:" + os.urandom(4).hex()
    provider.acquire_lease(key, "A", 300, limit=2)
    provider.acquire_lease(key, "B", 60_000, limit=2)  # the head stays live: only A's slot is the sweep's
    with engine.connect() as grant_side:
        grant_side.execute(sa.text(f"SET search_path TO {schema}"))
        grant_side.execute(sa.text("SELECT 1 FROM sql_leases WHERE key = :k FOR NO KEY UPDATE"), {"k": key})
        time.sleep(0.5)  # A's slot lapses while the grant, which judged it live, runs
        assert provider.sweep_expired(grace_ms=0) == 0  # A's slot left: its head is held
        grant_side.execute(
            sa.text("UPDATE sql_leases_slots SET expires_at = now() + interval '60 s' WHERE key = :k AND owner = 'A'"),
            {"k": key},
        )
        grant_side.commit()
    assert [holder.owner for holder in provider.get_lease_holders(key)] == ["A", "B"]


def test_a_slot_sweep_leaves_a_slot_whose_grant_holds_the_head_on_mysql(my: Any) -> None:
    provider, engine, table = my
    key = "s:" + os.urandom(4).hex()
    provider.acquire_lease(key, "A", 300, limit=2)
    provider.acquire_lease(key, "B", 60_000, limit=2)
    with engine.connect() as grant_side:
        grant_side.execute(sa.text(f"SELECT 1 FROM `{table}` WHERE `key` = :k FOR UPDATE"), {"k": key})
        time.sleep(0.5)
        assert provider.sweep_expired(grace_ms=0) == 0
        grant_side.execute(
            sa.text(
                f"UPDATE `{table}_slots` SET expires_at = UTC_TIMESTAMP(6) + INTERVAL 60 SECOND "
                "WHERE `key` = :k AND owner = 'A'"
            ),
            {"k": key},
        )
        grant_side.commit()
    assert [holder.owner for holder in provider.get_lease_holders(key)] == ["A", "B"]


@pytest.mark.parametrize("server", ["postgres", "mysql"])
def test_a_slot_sweep_beside_a_guard_holds_up_no_other_key(server: str, request: pytest.FixtureRequest) -> None:
    """A guard (check_held) left open on key A's slot, which lapses: the sweep leaves that slot, and a
    grant on key B, whose expired slot the same sweep removes, answers at once. Before (a review's
    reproduction), the sweep held B's head while it waited for A's slot row, and B's grant waited
    for the application's transaction."""
    provider, engine, where = request.getfixturevalue("pg" if server == "postgres" else "my")
    a = provider.acquire_lease("A", "o", 300, limit=2)
    provider.acquire_lease("B", "p", 300, limit=2)
    provider.acquire_lease("B", "q", 60_000, limit=2)
    with engine.connect() as guard:
        if server == "postgres":
            guard.execute(sa.text(f"SET search_path TO {where}"))
        provider.check_held(guard, "A", "o", a.fence)  # the application's transaction stays open
        time.sleep(0.6)  # A's and B's short slots lapse
        assert provider.sweep_expired(grace_ms=0) >= 1  # B's lapsed slot; what the guard holds is skipped
        granted = provider.acquire_lease("B", "r", 60_000, limit=2, timeout_s=3)
        assert granted.acquired, granted
        guard.commit()
    assert sorted(holder.owner for holder in provider.get_lease_holders("B")) == ["q", "r"]


def _pause_before_the_slot_extend(sql: str, params: Any) -> None:
    words = " ".join(sql.split())
    if words.startswith("UPDATE") and "_slots" in words.split(" SET ")[0] and "data =" in words:  # SLOT_EXTEND
        time.sleep(0.4)  # the slot lapses between the transaction's read of it and its extension


@pytest.mark.parametrize("op", ["renew", "renew_info", "renew_leases", "transfer to itself"])
@pytest.mark.parametrize("backend", ["sqlite", "postgres", "mysql"])
def test_a_slot_that_lapses_before_its_extension_is_not_renewed(
    backend: str, op: str, tmp_path: Any, request: pytest.FixtureRequest
) -> None:
    """The renewal (or transfer to itself) read the slot live, then its extension found it expired and
    changed nothing: it answered renewed, and two others then took slots beside the owner who
    believed it held one (a hostile test, session 13)."""
    if backend == "sqlite":
        url, options = f"sqlite:///{tmp_path / 'l.db'}", {}
    elif backend == "postgres":
        _, _, schema = request.getfixturevalue("pg")
        url, options = POSTGRES_URL, {"schema": schema}
    else:
        url, options = MYSQL_URL, {"schema": request.getfixturevalue("fresh_mysql_db")}
    with SyncSqlLeaseProvider(url, operation_timeout_s=20, **options) as provider:
        provider.migrate()
        key = "r:" + os.urandom(4).hex()
        a = provider.acquire_lease(key, "A", 200, limit=2)
        remove = provider.on_statement(_pause_before_the_slot_extend)
        if op == "renew":
            answers = [provider.renew_lease(key, "A", 60_000)]
        elif op == "renew_info":
            answers = [provider.renew_lease_info(key, "A", 60_000)]
        elif op == "renew_leases":
            answers = provider.renew_leases([key], "A", 60_000, fences=[a.fence])
        else:
            answers = [provider.transfer_lease(key, "A", "A", 60_000)]
        remove()
        holders = [holder.owner for holder in provider.get_lease_holders(key)]
        assert answers in ([False], [None]) or holders == ["A"], (answers, holders)


def test_a_postgres_slot_grant_that_meets_a_deadlock_runs_again() -> None:
    """The plan (no database): PostgreSQL's slot grant is one call of the slot function in autocommit;
    a deadlock (40P01, beside sweeps and other grants) rolled all of it back, so it runs again, as the
    other transactions do, instead of reaching the caller (a hostile test saw it 6 times in 20 s)."""
    import asyncpg

    from sql_lease.sql import transactional
    from sql_lease.sql.schema import LeaseTableNames
    from sql_lease.sql.statements import statements_for

    s = statements_for("postgresql", LeaseTableNames(), durable_session=True)
    deadlock = asyncpg.exceptions.DeadlockDetectedError("deadlock detected")
    plan = transactional.slot_acquire(s, "k", "o", 1000.0, None, 2, False)
    query = next(plan)
    assert query.sql == s.slots["slot_acquire_call"]
    for _ in range(2):
        query = plan.throw(deadlock)
        assert query.sql == s.slots["slot_acquire_call"]
    now = datetime.now(UTC)
    with pytest.raises(StopIteration) as done:
        plan.send((True, "o", 7, now, 1000.0, False))
    assert done.value.value.acquired and done.value.value.fence == 7


@pytest.mark.parametrize(("remembered", "min_hold_ms"), [(False, None), (False, 5_000.0), (True, None)])
def test_a_postgres_release_that_meets_a_deadlock_runs_again(remembered: bool, min_hold_ms: float | None) -> None:
    """The plan (no database): each PostgreSQL release statement (the plain one, which releases a
    slot through the release function, the minimum hold's, and a remembered semaphore key's slot
    release) is one statement in autocommit; a deadlock rolled all of it back, so it runs again, as
    the slot grant does, instead of reaching the caller (a hostile test's audit saw 8 in four runs)."""
    import asyncpg

    from sql_lease.sql import operations
    from sql_lease.sql.schema import LeaseTableNames
    from sql_lease.sql.statements import statements_for

    s = statements_for("postgresql", LeaseTableNames(), durable_session=True)
    if remembered:
        s.semaphore_keys.remember("k")
    deadlock = asyncpg.exceptions.DeadlockDetectedError("deadlock detected")
    plan = operations.release(s, "k", "o", None, min_hold_ms)
    query = next(plan)
    first = query.sql
    for _ in range(2):
        query = plan.throw(deadlock)
        assert query.sql == first
    with pytest.raises(StopIteration) as done:
        plan.send((True,) if remembered or min_hold_ms is None else (7,))
    assert done.value.value is True


@pytest.mark.parametrize("server", ["postgres", "mysql", "sqlite"])
def test_holders_are_read_at_no_earlier_time_than_the_newest_tenure_they_see(
    server: str, request: pytest.FixtureRequest, tmp_path: Any
) -> None:
    """A listing took its clock when its statement began and read tenures committed after that: a
    slot granted once A's had expired was listed beside A's, one holder more than the limit (a
    hostile test saw it on MariaDB). A tenure the listing sees began no later than the listing read
    it, so holders are judged at the newest start among them if that is later than the clock. Here
    B's tenure is made to begin after A's slot expires, as the grant that took A's place did."""
    if server == "sqlite":
        provider = SyncSqlLeaseProvider(f"sqlite:///{tmp_path / 'h.db'}")
        provider.migrate()
        engine, table = sa.create_engine(f"sqlite:///{tmp_path / 'h.db'}"), "sql_leases"
        later = {"soon": "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) + {ms}"}
    else:
        provider, engine, name = request.getfixturevalue("pg" if server == "postgres" else "my")
        table = f"{name}.sql_leases" if server == "postgres" else f"`{name}`"
        later = {
            "soon": "now() + {ms} * interval '1 millisecond'"
            if server == "postgres"
            else "UTC_TIMESTAMP(6) + INTERVAL {ms} * 1000 MICROSECOND"
        }
    slots = table[:-1] + "_slots`" if server == "mysql" else table + "_slots"
    key = "r:" + os.urandom(4).hex()
    try:
        assert provider.acquire_lease(key, "A", 60_000, limit=2).acquired
        assert provider.acquire_lease(key, "B", 60_000, limit=2).acquired
        soon = later["soon"]
        with engine.begin() as conn:
            conn.execute(sa.text(f"UPDATE {slots} SET expires_at = {soon.format(ms=30_000)} WHERE owner = 'A'"))
            conn.execute(sa.text(f"UPDATE {slots} SET acquired_at = {soon.format(ms=40_000)} WHERE owner = 'B'"))
        assert [holder.owner for holder in provider.get_lease_holders(key)] == ["B"]
        assert provider.get_lease_owner(key) == "B"
        assert not provider.acquire_lease(key, "C", 60_000).acquired  # B holds it
    finally:
        if server == "sqlite":
            provider.close()
            engine.dispose()


@pytest.mark.parametrize("guarded_limit", [1, 2])
@pytest.mark.parametrize("call", ["renew_leases", "acquire_leases", "release_leases", "sweep"])
def test_a_mysql_statement_on_several_keys_waits_for_no_guard_on_another_key(
    my: Any, call: str, guarded_limit: int
) -> None:
    """On a small table MariaDB planned the several-keys statements with the lease table first (a
    scan), so they locked, or waited for, every row: an application's guard on an unrelated key held
    up renew_leases of other keys until the lock wait ran out (found by a hostile test). The keys
    drive the join (STRAIGHT_JOIN) and reach their rows by the primary key (FORCE INDEX)."""
    provider, engine, _ = my
    g = provider.acquire_lease("G", "A", 60_000, limit=guarded_limit)
    for key in ("R1", "R2"):
        assert provider.acquire_lease(key, "R", 60_000).acquired
    provider.acquire_lease("X", "old", 1)  # an expired lease for the sweep
    time.sleep(0.05)
    guard = Guard(provider, engine, "G", "A", g.fence, None)
    try:
        if call == "renew_leases":
            assert provider.renew_leases(["R1", "R2"], "R", 60_000) == [True, True]
        elif call == "acquire_leases":
            assert [r.acquired for r in provider.acquire_leases(["R1", "R2", "N"], "R", 60_000)] == [True] * 3
        elif call == "release_leases":
            assert provider.release_leases(["R1", "R2"], "R") == 2
        else:
            assert provider.sweep_expired(grace_ms=0) == 1
        assert guard.thread.is_alive()  # answered while the guard on G was still open
    finally:
        guard.end()


def test_a_mysql_batch_renewal_locks_its_rows_in_key_order(my: Any) -> None:
    """The keys drive a batch renewal's join (STRAIGHT_JOIN), so its rows are locked in the order the
    keys are sent: sent as given, two overlapping batches (or a batch and an all-or-nothing acquire,
    which sorts its keys) could lock in opposite orders and deadlock (found by a review). They are
    sent in ascending key order, as every other statement on several keys sends them."""
    provider, _, _ = my
    keys = ["k3", "k1", "k2"]
    for key in keys:
        assert provider.acquire_lease(key, "R", 60_000).acquired
    sent: list[Any] = []
    remove = provider.on_statement(lambda sql, params: sent.append(params))
    try:
        assert provider.renew_leases(keys, "R", 60_000) == [True, True, True]  # in the order of keys
    finally:
        remove()
    batches = [json.loads(p[0]) for p in sent if p and isinstance(p[0], str) and p[0].startswith("[[")]
    assert batches, sent
    assert [item[0] for item in batches[0]] == sorted(keys)
