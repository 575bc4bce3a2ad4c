"""MySQL and MariaDB beyond the shared contract suites: URL forms and drivers, byte-for-byte keys,
exact millisecond TTLs, the application's own engines, the CLI, migrations and a least-privilege
user. The server is this machine's MariaDB unless SQL_LEASE_TEST_MYSQL_URL names another."""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from sql_lease import LeaseConfigError, LeaseError, MissingDriverError, SqlLeaseProvider, SyncSqlLeaseProvider
from sql_lease.sql.migrate import HEAD_REVISION
from sql_lease.sql.urls import to_async_url, to_sync_url
from tests.conftest import MYSQL_URL, mysql_connect, mysql_execute

pytestmark = pytest.mark.mysql
REPO = Path(__file__).resolve().parent.parent


def url_of(database: str, driver: str = "") -> str:
    base = sa.make_url(MYSQL_URL).set(database=database)
    if driver:
        base = base.set(drivername=driver)
    return base.render_as_string(hide_password=False)


@pytest.mark.parametrize(
    ("given", "async_driver", "sync_driver"),
    [
        ("mysql://u@h/db", "mysql+asyncmy", "mysql+pymysql"),
        ("mariadb://u@h/db", "mysql+asyncmy", "mysql+pymysql"),
        ("mysql+aiomysql://u@h/db", "mysql+aiomysql", "mysql+pymysql"),
        ("mysql+pymysql://u@h/db", "mysql+asyncmy", "mysql+pymysql"),
        ("mysql+mysqldb://u@h/db", "mysql+asyncmy", "mysql+mysqldb"),
    ],
)
def test_url_forms_map_to_each_faces_driver(given: str, async_driver: str, sync_driver: str) -> None:
    assert to_async_url(given).drivername == async_driver
    assert to_sync_url(given).drivername == sync_driver
    assert to_async_url(given).query["charset"] == "utf8mb4"


def test_a_missing_driver_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "asyncmy" else real(name, *a))
    with pytest.raises(MissingDriverError, match=r"sql-lease\[mysql\]"):
        SqlLeaseProvider(MYSQL_URL)


def test_keys_and_owners_compare_byte_for_byte(mysql_db: tuple[str, str]) -> None:
    url, schema = mysql_db
    prefix = f"case:{uuid.uuid4().hex}:"
    with SyncSqlLeaseProvider(url, schema=schema) as provider:
        for key in ("a", "A", "a ", "\u00e9", "e\u0301"):  # case, trailing space, composed or not
            assert provider.acquire_lease(prefix + key, "owner", 60_000).acquired, key
        assert not provider.acquire_lease(prefix + "a", "OWNER", 60_000).acquired  # owners too
        assert provider.get_lease_owner(prefix + "a ") == "owner"
        listed = [lease.key for lease in provider.list_leases(prefix=prefix)]
        assert sorted(listed) == sorted(prefix + key for key in ("a", "A", "a ", "\u00e9", "e\u0301"))


def test_ttls_keep_their_milliseconds(mysql_db: tuple[str, str]) -> None:
    url, schema = mysql_db
    key = f"ttl:{uuid.uuid4().hex}"
    with SyncSqlLeaseProvider(url, schema=schema) as provider:
        granted = provider.acquire_lease(key, "o", 1_234.5)
        lease = provider.get_lease(key)
        assert lease is not None and lease.acquired_at is not None and granted.expires_at is not None
        assert lease.expires_at - lease.acquired_at == timedelta(milliseconds=1_234.5)
        assert 1_000 < granted.remaining_ms <= 1_234.5


def test_the_applications_engines_on_both_faces(mysql_db: tuple[str, str]) -> None:
    url, schema = mysql_db
    key = f"engine:{uuid.uuid4().hex}"
    engine = sa.create_engine(to_sync_url(url))
    try:
        with SyncSqlLeaseProvider(engine, schema=schema) as provider:
            assert provider.acquire_lease(key, "sync", 60_000).acquired
            assert provider.release_lease(key, "sync")
    finally:
        engine.dispose()

    async def run(driver: str) -> None:
        engine = create_async_engine(to_async_url(url).set(drivername=driver))
        try:
            async with SqlLeaseProvider(engine, schema=schema) as provider:
                assert (await provider.acquire_lease(key, driver, 60_000)).acquired
                assert await provider.release_lease(key, driver)
        finally:
            await engine.dispose()

    for driver in ("mysql+asyncmy", "mysql+aiomysql"):
        asyncio.run(run(driver))


def test_a_url_naming_another_driver_runs_on_that_driver(
    mysql_db: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``mysql+aiomysql://`` (async face): the provider's own connections are aiomysql's, through a
    SQLAlchemy engine, step by step (the raw-driver executors are asyncmy's and PyMySQL's), so it
    works where asyncmy is not installed."""
    monkeypatch.setitem(sys.modules, "asyncmy", None)  # import asyncmy: ImportError
    url, schema = mysql_db
    key = f"driver:{uuid.uuid4().hex}"
    aiomysql_url = to_async_url(url).set(drivername="mysql+aiomysql").render_as_string(hide_password=False)

    async def run() -> None:
        async with SqlLeaseProvider(aiomysql_url, schema=schema) as provider:
            first = await provider.acquire_lease(key, "a", 60_000)
            assert first.acquired and not (await provider.acquire_lease(key, "b", 60_000)).acquired
            assert await provider.renew_lease(key, "a", 60_000)
            assert await provider.release_lease(key, "a")
            assert (await provider.acquire_lease(key, "b", 60_000)).fence > first.fence
            assert provider.engine.dialect.driver == "aiomysql"

    asyncio.run(run())


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sql_lease", *args], cwd=REPO, capture_output=True, text=True, timeout=60
    )


def test_cli_migrates_checks_and_runs_a_job(fresh_mysql_db: str) -> None:
    url = url_of(fresh_mysql_db)
    offline = run_cli("migrate", "--url", url, "--sql")
    assert offline.returncode == 0 and "VARBINARY(2048)" in offline.stdout and "DATETIME(6)" in offline.stdout
    first = run_cli("migrate", "--url", url)
    assert first.returncode == 0 and f"created sql_leases at revision {HEAD_REVISION}" in first.stdout, first
    again = run_cli("migrate", "--url", url)
    assert again.returncode == 0 and f"already at revision {HEAD_REVISION}" in again.stdout, again
    check = run_cli("check", "--url", url)
    assert check.returncode == 0 and ("MariaDB" in check.stdout or "MySQL" in check.stdout), check
    job = run_cli("exec", "--url", url, "nightly", "--", sys.executable, "-c", "print('ran')")
    assert job.returncode == 0 and "ran" in job.stdout, job
    assert run_cli("list", "--url", url).returncode == 0
    assert run_cli("acquire", "--url", url, "gone", "--owner", "o", "--ttl", "1ms").returncode == 0
    swept = run_cli("sweep", "--url", url)
    assert swept.returncode == 0 and swept.stdout.strip() == "removed 1 expired lease(s)", swept


def test_cli_configuration_errors_exit_78(fresh_mysql_db: str) -> None:
    missing_db = run_cli("check", "--url", url_of(fresh_mysql_db + "_nope"))
    assert missing_db.returncode == 78 and "does not exist" in missing_db.stdout + missing_db.stderr
    unmigrated = run_cli("list", "--url", url_of(fresh_mysql_db))
    assert unmigrated.returncode == 78 and "sql-lease migrate" in unmigrated.stderr
    with pytest.raises(LeaseConfigError, match="does not exist"):
        SyncSqlLeaseProvider(url_of(fresh_mysql_db + "_nope")).migrate()


def test_a_least_privilege_user_runs_every_lease_operation(fresh_mysql_db: str) -> None:
    user, password = f"lease_{uuid.uuid4().hex[:8]}", "pw-" + uuid.uuid4().hex[:8]
    with SyncSqlLeaseProvider(url_of(fresh_mysql_db)) as owner:
        owner.migrate()
    tables = ("sql_leases", "sql_leases_slots", "sql_leases_fence", "sql_leases_fences")
    mysql_execute(
        MYSQL_URL,
        f"CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'",
        *(f"GRANT SELECT, INSERT, UPDATE, DELETE ON `{fresh_mysql_db}`.`{table}` TO '{user}'@'%'" for table in tables),
        *(  # semaphores: migration 0009's procedures
            f"GRANT EXECUTE ON PROCEDURE `{fresh_mysql_db}`.`{procedure}` TO '{user}'@'%'"
            for procedure in ("sql_leases_slot_acquire", "sql_leases_slot_release")
        ),
    )
    try:
        url = sa.make_url(url_of(fresh_mysql_db)).set(username=user, password=password)
        with SyncSqlLeaseProvider(url) as provider:
            key = "least"
            granted = provider.acquire_lease(key, "a", 60_000)
            assert granted.acquired
            assert provider.renew_lease(key, "a", 60_000)
            assert provider.transfer_lease(key, "a", "b", 60_000)
            assert provider.get_lease(key).fence > granted.fence  # type: ignore[union-attr]
            assert provider.break_lease(key) is not None
            assert provider.acquire_lease(key, "c", 1).acquired
            assert provider.sweep_expired() >= 0
            assert [lease.key for lease in provider.list_leases(include_expired=True)] in ([], [key])
            slots = [provider.acquire_lease("sem", owner, 60_000, limit=2) for owner in ("s1", "s2", "s3")]
            assert [slot.acquired for slot in slots] == [True, True, False]
            assert provider.renew_lease("sem", "s1", 60_000) and provider.release_lease("sem", "s2")
            assert provider.break_lease("sem") is not None
            assert all(provider.acquire_leases(["many:1", "many:2"], "a", 60_000))  # one packet, an upsert in it
            with pytest.raises(LeaseConfigError, match=r"GRANT SELECT ON .*sql_lease_alembic_version") as denied:
                provider.migrate()  # a deploy that migrates as the application's user
            assert "need not migrate" in str(denied.value) and denied.value.__cause__ is not None
    finally:
        mysql_execute(MYSQL_URL, f"DROP USER IF EXISTS '{user}'@'%'")


def test_concurrent_grants_never_share_a_fence(mysql_db: tuple[str, str]) -> None:
    """Threads granting 10 new keys per call (one draw of 10 fences) beside threads granting one key per
    call, for 1.5 s: every tenure has a fence of its own (one insert's fences come consecutively, or the
    plan draws them one by one)."""
    from concurrent.futures import ThreadPoolExecutor

    url, schema = mysql_db
    tag, deadline = uuid.uuid4().hex, time.monotonic() + 1.5

    def grants(worker: int) -> list[int]:
        fences: list[int] = []
        with SyncSqlLeaseProvider(url, schema=schema) as provider:
            while time.monotonic() < deadline:
                prefix = f"unique:{tag}:{worker}:{len(fences)}"
                if worker % 2:
                    results = [provider.acquire_lease(prefix, "a", 60_000)]
                else:
                    results = provider.acquire_leases([f"{prefix}:{k}" for k in range(10)], "a", 60_000)
                assert all(results)
                fences.extend(result.fence for result in results)  # type: ignore[misc]
        return fences

    with ThreadPoolExecutor(4) as pool:
        fences = [fence for done in pool.map(grants, range(4)) for fence in done]
    assert len(fences) > 100 and len(set(fences)) == len(fences)


def test_a_new_keys_fence_is_drawn_after_its_row_is_locked() -> None:
    """The plan (no database): for a key without a row, the row is inserted (locked) before the
    fence is drawn, and a locked row's takeover draws it after the lock. Drawn earlier, a fence
    could be older than a whole tenure of the key that another acquirer granted and released
    meanwhile (READ COMMITTED locks nothing for a missing row)."""
    from sql_lease.sql.operations import acquire
    from sql_lease.sql.schema import LeaseTableNames
    from sql_lease.sql.statements import MysqlStatements

    s = MysqlStatements(LeaseTableNames(), lock_wait_s=5)
    steps = {text: name for name, text in s.steps.items()}
    plan = acquire(s, "k", "o", 1000)
    sent = [next(plan)]
    sent.append(plan.send(None))  # no holder: on to the transaction
    sent.append(plan.send((0,)))  # BEGIN done
    sent.append(plan.send(None))  # the row lock found no row
    while steps.get(sent[-1].sql) not in ("granted", None):
        sent.append(plan.send((1,)))
    names = [steps.get(query.sql, "holder") for query in sent]
    assert names.index("grant_new") < names.index("next_fence"), names


def test_an_operation_sends_no_rollback_at_check_in(mysql_db: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The provider's own engines skip the ROLLBACK that PyMySQL and asyncmy send at every pool
    check-in even in autocommit (SQLAlchemy 2.0.43's ``skip_autocommit_rollback``): a read is one
    round trip."""
    import pymysql.connections

    if tuple(int(part) for part in sa.__version__.split(".")[:3]) < (2, 0, 43):
        pytest.fail("the test environment installs SQLAlchemy >= 2.0.43 (pyproject's test extra)")
    sent: list[object] = []
    original = pymysql.connections.Connection._execute_command

    def spy(self: Any, command: int, sql: object) -> Any:
        sent.append(sql)
        return original(self, command, sql)

    url, schema = mysql_db
    with SyncSqlLeaseProvider(url, schema=schema) as provider:
        provider.get_lease_owner("warm")  # the connection and its session setup
        monkeypatch.setattr(pymysql.connections.Connection, "_execute_command", spy)
        provider.get_lease_owner("nobody")
        provider.get_lease_owner("nobody")
    assert len(sent) == 2 and not any(b"ROLLBACK" in bytes(str(s), "utf8") for s in sent), sent


def test_a_deadlock_runs_the_transaction_again_and_never_answers_falsely() -> None:
    """The plan (no database): a deadlock (1213, the server rolled back) or a duplicate key (1062)
    rolls back and runs the transaction again; past CONFLICT_RETRIES the error is raised, never a
    false "not acquired"."""
    import pymysql

    from sql_lease.sql.operations import acquire
    from sql_lease.sql.schema import LeaseTableNames
    from sql_lease.sql.statements import MysqlStatements
    from sql_lease.sql.transactional import CONFLICT_RETRIES

    s = MysqlStatements(LeaseTableNames(), lock_wait_s=5)
    name = {text: step for step, text in s.steps.items()}
    deadlock = pymysql.err.OperationalError(1213, "Deadlock found when trying to get lock")

    def run(failures: int) -> tuple[list[str], object]:
        plan = acquire(s, "k", "o", 1000)
        sent, query, left = [], next(plan), failures
        try:
            while True:
                step = name.get(query.sql, "holder")
                sent.append(step)
                if step == "lock_row" and left:
                    left -= 1
                    query = plan.throw(deadlock)
                    continue
                granted = ("o", 7, datetime(2026, 1, 1), 1000.0)  # owner, fence, expires_at, remaining_ms
                query = plan.send({"holder": None, "lock_row": None, "granted": granted}.get(step, (1,)))
        except StopIteration as done:
            return sent, done.value
        except pymysql.err.OperationalError as exc:
            return sent, exc

    sent, result = run(2)
    assert sent.count("begin") == 3 and sent.count("rollback") == 2 and sent[-1] == "commit", sent
    assert getattr(result, "acquired", None) is True and result.fence == 7  # type: ignore[attr-defined]
    sent, result = run(CONFLICT_RETRIES + 1)
    assert result is deadlock and sent.count("begin") == CONFLICT_RETRIES + 1


def test_a_sweep_that_meets_a_deadlock_runs_the_statement_again() -> None:
    """The plan (no database): each of the sweep's transactions (the expired rows it read locked,
    then deleted) whose delete met a deadlock (1213: the server rolled it back) runs again, and the
    count is still every lease deleted; past CONFLICT_RETRIES the error is raised."""
    import pymysql

    from sql_lease.sql.operations import sweep
    from sql_lease.sql.schema import LeaseTableNames
    from sql_lease.sql.statements import MysqlStatements
    from sql_lease.sql.transactional import CONFLICT_RETRIES

    s = MysqlStatements(LeaseTableNames(), lock_wait_s=5)
    deadlock = pymysql.err.OperationalError(1213, "Deadlock found when trying to get lock")
    reads = {  # the expired rows, read without a lock, then locked
        s.sweep: [("k",)],
        s.slots["slot_sweep_doomed"]: [("k", "o", 1)],
        s.slots["slot_sweep_lock"]: [("k",)],
    }

    def run(failures: int) -> tuple[int, object]:
        plan = sweep(s, 100)
        deletes, query, left = 0, next(plan), failures
        try:
            while True:
                if query.sql == s.steps["sweep_delete"]:
                    deletes += 1
                    if left:
                        left -= 1
                        query = plan.throw(deadlock)
                        continue
                query = plan.send(reads.get(query.sql, [(3,)] if query.many else (3,)))
        except StopIteration as done:
            return deletes, done.value
        except pymysql.err.OperationalError as exc:
            return deletes, exc

    clean_deletes, clean = run(0)
    assert clean == 3 + 3  # leases (heads not counted), then slots
    deletes, result = run(2)
    assert result == clean and deletes == clean_deletes + 2
    deletes, result = run(CONFLICT_RETRIES + 1)
    assert result is deadlock and deletes == CONFLICT_RETRIES + 1


def test_a_large_sweep_deletes_its_keys_in_ascending_chunks() -> None:
    """The plan (no database): the expired rows read are deleted by key, in ascending key order, at
    most SWEEP_DELETE_KEYS keys a statement (a batch of up to 10**6 keys would not fit a packet)."""
    import json

    from sql_lease.sql.operations import sweep
    from sql_lease.sql.schema import LeaseTableNames
    from sql_lease.sql.statements import MysqlStatements
    from sql_lease.sql.transactional import SWEEP_DELETE_KEYS

    s = MysqlStatements(LeaseTableNames(), lock_wait_s=5)
    expired = [f"k{i:05}" for i in range(2 * SWEEP_DELETE_KEYS + 7)][::-1]  # read oldest first, any key order
    plan, deletes = sweep(s, len(expired)), []
    query = next(plan)
    try:
        while True:
            if query.sql == s.sweep:
                answer: object = [(key,) for key in expired] if not query.params[2] else []
            elif query.sql == s.slots["slot_sweep_lock"]:  # every row free to lock
                answer = [(key,) for key in json.loads(query.params[0])]
            elif query.sql == s.steps["sweep_delete"]:
                deletes.append(json.loads(query.params[0]))
                answer = (len(deletes[-1]),)
            else:
                answer = [] if query.many else (0,)
            query = plan.send(answer)
    except StopIteration as done:
        assert done.value == len(expired)
    assert [len(chunk) for chunk in deletes] == [SWEEP_DELETE_KEYS, SWEEP_DELETE_KEYS, 7]
    assert [key for chunk in deletes for key in chunk] == sorted(expired)


def test_bad_urls_raise_config_or_backend_errors_with_the_password_masked(mysql_user: tuple[str, str]) -> None:
    """Both faces: a refused password, an unknown database or host raise LeaseConfigError; a server
    that does not answer, LeaseBackendError; the password masked, the driver's error on __cause__."""
    import socket

    from sql_lease import LeaseBackendError

    user, password = mysql_user
    base = sa.make_url(MYSQL_URL).set(username=user, password=password)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    cases = [
        (base.set(password="hunter2"), LeaseConfigError, "hunter2"),
        (base.set(database=f"{user}_nope"), LeaseConfigError, password),
        (base.set(host="sql-lease-no-such-host.invalid"), LeaseConfigError, password),
        (base.set(port=free_port), LeaseBackendError, password),
    ]

    async def read_async(url: str) -> None:
        async with SqlLeaseProvider(url, operation_timeout_s=5) as provider:
            await provider.get_lease_owner("k")

    def read_sync(url: str) -> None:
        with SyncSqlLeaseProvider(url, operation_timeout_s=5) as provider:
            provider.get_lease_owner("k")

    for url, error, secret in cases:
        given = url.render_as_string(hide_password=False)
        for read in (lambda url: asyncio.run(read_async(url)), read_sync):
            with pytest.raises(LeaseError) as raised:
                read(given)
            assert type(raised.value) is error, (given, raised.value)
            assert secret not in str(raised.value) and ":***@" in str(raised.value), raised.value
            assert raised.value.__cause__ is not None


def test_a_session_without_strict_mode_is_refused_before_anything_is_created(fresh_mysql_db: str) -> None:
    """An application's engine whose sessions run without STRICT_TRANS_TABLES (set on its own
    connections, never on the server): migrate refuses with a message naming it, and creates nothing."""

    async def migrate_on_a_lax_engine() -> None:
        engine = create_async_engine(
            to_async_url(url_of(fresh_mysql_db)),
            connect_args={"init_command": "SET SESSION sql_mode = 'NO_ENGINE_SUBSTITUTION'"},
        )
        try:
            async with SqlLeaseProvider(engine) as provider:
                await provider.migrate()
        finally:
            await engine.dispose()

    with pytest.raises(LeaseConfigError, match=r"sql_mode .*lacks STRICT_TRANS_TABLES"):
        asyncio.run(migrate_on_a_lax_engine())
    created = sa.create_engine(to_sync_url(url_of(fresh_mysql_db)))
    try:
        with created.connect() as conn:
            assert sa.inspect(conn).get_table_names() == []
    finally:
        created.dispose()


def test_a_lease_table_not_on_innodb_is_refused(fresh_mysql_db: str) -> None:
    """A lease table on another storage engine (no row locks, no transactions) is refused with a
    message by migrate (both faces and the CLI, exit 78) and failed by ``sql-lease check``."""
    url = url_of(fresh_mysql_db)
    assert run_cli("migrate", "--url", url).returncode == 0
    mysql_execute(MYSQL_URL, f"ALTER TABLE `{fresh_mysql_db}`.`sql_leases_fence` ENGINE=MyISAM")
    words = "sql_leases_fence is MyISAM"
    with pytest.raises(LeaseConfigError, match=words), SyncSqlLeaseProvider(url) as sync_provider:
        sync_provider.migrate()

    async def migrate_async() -> None:
        async with SqlLeaseProvider(url) as provider:
            await provider.migrate()

    with pytest.raises(LeaseConfigError, match=words):
        asyncio.run(migrate_async())
    migrated = run_cli("migrate", "--url", url)
    assert migrated.returncode == 78 and words in migrated.stderr and "InnoDB" in migrated.stderr, migrated
    checked = run_cli("check", "--url", url)
    assert checked.returncode == 78 and "FAIL  setup" in checked.stdout and words in checked.stdout, checked


def test_release_leases_locks_only_its_own_keys_rows(mysql_db: tuple[str, str]) -> None:
    """release_leases reaches its keys' rows by the primary key: a row another transaction holds
    locked, of a key it was not given, never makes it wait (a scan of the table would)."""
    url, schema = mysql_db
    tag = uuid.uuid4().hex
    mine, other = [f"rel:{tag}:{i}" for i in range(3)], f"rel:{tag}:other"
    with SyncSqlLeaseProvider(url, schema=schema) as provider:
        assert all(r.acquired for r in provider.acquire_leases(mine, "me", 60_000))
        assert provider.acquire_lease(other, "them", 60_000).acquired
        locker = mysql_connect(url, schema, autocommit=False)
        try:
            with locker.cursor() as cursor:
                cursor.execute("SELECT owner FROM sql_leases WHERE `key` = %s FOR UPDATE", (other,))
                released = provider.release_leases(mine, "me")  # before: lock wait timeout (1205)
        finally:
            locker.rollback()
            locker.close()
        assert released == 3
        assert provider.get_lease_owner(other) == "them"


def test_a_plain_release_that_frees_nothing_answers_false_on_a_table_at_0005(fresh_mysql_db: str) -> None:
    """Before semaphores (0005: no slot table) a plain release answers as ever; the slot packet it
    sends after a plain "no" must not turn that "no" into SchemaMissingError."""
    from alembic import command

    from sql_lease.sql.migrate import alembic_config

    url = url_of(fresh_mysql_db)
    with SyncSqlLeaseProvider(url) as provider:
        engine = sa.create_engine(to_sync_url(url))
        try:
            with engine.begin() as conn:
                command.upgrade(alembic_config(provider.names, connection=conn), "0005")
        finally:
            engine.dispose()
        assert provider.acquire_lease("k", "a", 60_000).acquired
        assert not provider.release_lease("k", "b")
        assert not provider.release_lease("never held", "a")
        assert provider.release_lease("k", "a")
        assert not provider.release_lease("k", "a")


def test_a_slot_grant_never_revives_a_plain_lease_that_expired_while_it_waited(mysql_db: tuple[str, str]) -> None:
    """A slot grant waiting for a plain lease's row (its holder's check_held guard) while that lease
    expires: the grant's upsert judged the row live when its statement began, so it is still a plain
    lease; the grant must refuse (or convert it), never insert a slot and raise the plain row's
    expiry and fence (the plain holder came back to life beside the slot, with the slot's fence)."""
    url, schema = mysql_db
    key = f"revive:{uuid.uuid4().hex}"
    with SyncSqlLeaseProvider(url, schema=schema) as provider:
        assert provider.acquire_lease(key, "X", 300).acquired
        guard = mysql_connect(url, schema, autocommit=False)
        try:
            with guard.cursor() as cursor:
                cursor.execute(
                    "SELECT fence FROM sql_leases WHERE `key` = %s AND owner = 'X' LOCK IN SHARE MODE", (key,)
                )
            answer: dict[str, Any] = {}
            granting = threading.Thread(
                target=lambda: answer.update(result=provider.acquire_lease(key, "S", 10_000, limit=2))
            )
            granting.start()
            time.sleep(0.5)  # the lease expires while the grant waits for the row
            guard.commit()
            granting.join(30)
        finally:
            guard.close()
        holders = provider.get_lease_holders(key)
        live = [(holder.owner, holder.fence) for holder in holders]
        assert "X" not in [owner for owner, _ in live], (answer, live)
        assert provider.renew_lease_info(key, "X", 1_000) is None
        if answer["result"].acquired:
            assert live == [("S", answer["result"].fence)]
        assert provider.acquire_lease(key, "T", 10_000, limit=2).acquired  # a second slot of two


@pytest.mark.parametrize("kind", ["lease", "semaphore"])
def test_a_sweep_waits_for_a_grant_on_an_expired_key_without_a_deadlock(
    fresh_mysql_db: str, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A grant locks an expired key's row, then moves its expires_at (a takeover; the slot procedure's
    head). A sweep that found the row through the expires_at index held that index entry while it
    waited for the row: the grant's update closed a cycle and the sweep was rolled back (1213; beside
    a busy semaphore 21 times in a row, then LeaseBackendError). The sweep waits for the grant without
    a deadlock, leaves the row it renewed and deletes the other expired rows."""
    from sql_lease.sql import transactional

    monkeypatch.setattr(transactional, "CONFLICT_RETRIES", 0)  # a deadlock the sweep meets is raised
    url = url_of(fresh_mysql_db)
    with SyncSqlLeaseProvider(url, operation_timeout_s=20) as provider:
        provider.migrate()
        live = [f"live:{i:03}" for i in range(200)]  # the sweep's statements plan an index range scan
        assert all(provider.acquire_leases(live[:100], "L", 60_000) + provider.acquire_leases(live[100:], "L", 60_000))
        key, limit = "taken", (2 if kind == "semaphore" else 1)
        short = [provider.acquire_lease(key, "A", 200, limit=limit)]
        short += [provider.acquire_lease(f"gone:{i}", "G", 200) for i in range(3)]
        short.append(provider.acquire_lease("gone:sem", "G", 200, limit=2))
        time.sleep(max(result.remaining_ms or 0.0 for result in short) / 1000 + 0.05)
        grant = mysql_connect(url, fresh_mysql_db, autocommit=False)
        watch = mysql_connect(url)
        with watch.cursor() as watching:
            watching.execute(f"ANALYZE TABLE `{fresh_mysql_db}`.sql_leases")
        out: dict[str, Any] = {}
        try:
            with grant.cursor() as cursor, watch.cursor() as watching:
                cursor.execute("SELECT owner FROM sql_leases WHERE `key` = %s FOR UPDATE", (key,))

                def sweep() -> None:
                    try:
                        out["swept"] = provider.sweep_expired(grace_ms=0)
                    except LeaseError as exc:  # reported below
                        out["error"] = exc

                sweeping = threading.Thread(target=sweep)
                sweeping.start()
                waits = (
                    "SELECT COUNT(*) FROM information_schema.INNODB_TRX AS t JOIN information_schema.PROCESSLIST AS p"
                    " ON p.ID = t.trx_mysql_thread_id WHERE t.trx_state = 'LOCK WAIT' AND p.DB = %s"
                )
                while sweeping.is_alive() and watching.execute(waits, (fresh_mysql_db,)) and not watching.fetchone()[0]:
                    time.sleep(0.2)  # the server refreshes INNODB_TRX once it went unread for 0.1 s
                renewed = "expires_at = UTC_TIMESTAMP(6) + INTERVAL 60 SECOND"
                if kind == "semaphore":  # the slot procedure's order: the owner's slot, then the head
                    cursor.execute(f"UPDATE sql_leases_slots SET {renewed} WHERE `key` = %s", (key,))
                    cursor.execute(f"UPDATE sql_leases SET {renewed} WHERE `key` = %s", (key,))
                else:  # a takeover
                    cursor.execute(f"UPDATE sql_leases SET owner = 'B', {renewed} WHERE `key` = %s", (key,))
                grant.commit()
                sweeping.join(30)
        finally:
            grant.close()
            watch.close()
        assert "swept" in out, out  # before: LeaseBackendError, 1213 (a deadlock)
        assert [lease.key for lease in provider.list_leases(include_expired=True)] == [*live, key]
        assert [holder.owner for holder in provider.get_lease_holders(key)] == ["A" if limit == 2 else "B"]


def test_a_large_slot_sweep_locks_and_deletes_in_ascending_chunks() -> None:
    """The plan (no database): the expired slots read are swept a chunk of SWEEP_DELETE_KEYS keys per
    transaction, each chunk's keys locked in ascending order, then every slot of those keys deleted."""
    import json

    from sql_lease.sql.operations import sweep
    from sql_lease.sql.schema import LeaseTableNames
    from sql_lease.sql.statements import MysqlStatements
    from sql_lease.sql.transactional import SWEEP_DELETE_KEYS

    s = MysqlStatements(LeaseTableNames(), lock_wait_s=5)
    keys = [f"k{i:05}" for i in range(SWEEP_DELETE_KEYS + 3)][::-1]
    expired = [(key, owner, 1) for key in keys for owner in ("a", "b")]  # two slots of each key, with its head
    plan, locks, deletes = sweep(s, len(expired)), [], []
    query = next(plan)
    try:
        while True:
            if query.sql == s.slots["slot_sweep_doomed"]:
                answer: object = expired
            elif query.sql == s.slots["slot_sweep_lock"]:
                locks.append(json.loads(query.params[0]))
                answer = [(key,) for key in locks[-1]]
            elif query.sql == s.slots["slot_sweep_delete"]:
                deletes.append(json.loads(query.params[0]))
                answer = [(len(deletes[-1]),)]
            else:
                answer = [] if query.many else (0,)
            query = plan.send(answer)
    except StopIteration as done:
        assert done.value == len(expired)
    assert [len(chunk) for chunk in locks] == [SWEEP_DELETE_KEYS, 3]
    assert [key for chunk in locks for key in chunk] == sorted(keys)
    assert sorted(tuple(slot) for chunk in deletes for slot in chunk) == sorted((k, o) for k, o, _ in expired)
    assert all({key for key, _ in chunk} == set(lock) for chunk, lock in zip(deletes, locks, strict=True))
