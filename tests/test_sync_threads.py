"""The synchronous face under threads and processes: mutual exclusion, hold() with renewal, loss
and transfer, waiting (LISTEN/NOTIFY on PostgreSQL), timeouts, and a given SQLAlchemy Engine."""

from __future__ import annotations

import itertools
import json
import logging
import shutil
import signal
import sys
import textwrap
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from sql_lease import (
    LeaseBackendError,
    LeaseLostError,
    LeaseNotAcquiredError,
    SyncHeldLease,
    SyncInMemoryLeaseProvider,
    SyncSqlLeaseProvider,
)
from tests.support.processes import json_summaries, run_scripts

REPO = Path(__file__).resolve().parent.parent


def _same_database(provider: Any, count: int) -> list[Any]:
    """``count`` providers on the database of ``provider`` (the memory provider is shared)."""
    if isinstance(provider, SyncInMemoryLeaseProvider):
        return [provider] * count
    url = provider._url
    return [provider] + [SyncSqlLeaseProvider(url, schema=provider.names.schema) for _ in range(count - 1)]


def test_threads_on_several_providers_never_share_a_key(sync_provider: Any) -> None:
    providers = _same_database(sync_provider, 3)
    keys = [f"threads:{uuid.uuid4().hex}:{i}" for i in range(2)]
    holders: dict[str, str] = {}
    fences: dict[str, list[int]] = defaultdict(list)
    violations: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    stop = time.monotonic() + 1.5

    def worker(n: int) -> None:
        provider = providers[n % len(providers)]
        me = f"t{n}"
        try:
            while time.monotonic() < stop:
                key = keys[n % 2 if n % 3 else (n // 3) % 2]
                result = provider.acquire_lease(key, me, 5_000)
                if not result.acquired:
                    continue
                with lock:
                    if key in holders:
                        violations.append(f"{me} and {holders[key]} on {key}")
                    holders[key] = me
                    fences[key].append(result.fence)
                time.sleep(0.001)
                with lock:
                    del holders[key]
                assert provider.release_lease(key, me)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for extra in providers[1:]:
        if extra is not sync_provider:
            extra.close()
    assert errors == [] and violations == []
    assert sum(len(f) for f in fences.values()) >= 20
    for seq in fences.values():
        assert all(a < b for a, b in itertools.pairwise(seq)), seq


WORKER = textwrap.dedent(
    """
    import json, os, sys, threading, time
    from sql_lease import SyncSqlLeaseProvider

    url, schema, prefix, markers, log, worker = sys.argv[1:7]
    stats = {"acquired": 0, "refused": 0, "violations": 0, "errors": 0}
    lock = threading.Lock()

    def run(provider, me):
        stop = time.monotonic() + 2.0
        while time.monotonic() < stop:
            key = f"{prefix}:{int(time.monotonic() * 1000) % 2}"
            try:
                result = provider.acquire_lease(key, me, 5000)
            except Exception as exc:
                with lock:
                    stats["errors"] += 1
                print(repr(exc), file=sys.stderr)
                continue
            if not result.acquired:
                with lock:
                    stats["refused"] += 1
                continue
            marker = os.path.join(markers, key.replace(":", "_"))
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                os.close(fd)
            except FileExistsError:
                with lock:
                    stats["violations"] += 1
                marker = None
            with open(log, "a") as out:
                out.write(f"{key} {result.fence} {me}\\n")
            time.sleep(0.002)
            if marker:
                os.unlink(marker)
            provider.release_lease(key, me)
            with lock:
                stats["acquired"] += 1

    with SyncSqlLeaseProvider(url, schema=schema or None) as provider:
        threads = [threading.Thread(target=run, args=(provider, f"p{worker}t{i}")) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    print(json.dumps(stats))
    """
)


@pytest.mark.slow
def test_processes_with_threads_never_share_a_key(sync_sql_provider: Any, tmp_path: Path) -> None:
    provider = sync_sql_provider
    url = provider._url.render_as_string(hide_password=False)
    script = tmp_path / "sync_worker.py"
    script.write_text(WORKER)
    markers = tmp_path / "markers"
    markers.mkdir()
    log = tmp_path / "sections.log"
    prefix = f"procs-{uuid.uuid4().hex[:8]}"
    argvs = [[url, provider.names.schema or "", prefix, str(markers), str(log), str(i)] for i in range(3)]
    summaries = json_summaries(run_scripts(script, argvs, REPO, 60))
    total = {k: sum(s[k] for s in summaries) for k in summaries[0]}
    assert total["violations"] == 0 and total["errors"] == 0, total
    assert total["acquired"] >= 20 and total["refused"] > 0, total
    fences: dict[str, list[int]] = defaultdict(list)
    for line in log.read_text().splitlines():
        key, fence, _owner = line.split(" ")
        fences[key].append(int(fence))
    for seq in fences.values():
        assert all(a < b for a, b in itertools.pairwise(seq)), seq


# -- hold() for threads ---------------------------------------------------------------------------


def test_hold_renews_past_its_ttl_and_releases(sync_provider: Any, key: str) -> None:
    with sync_provider.hold(key, ttl_ms=1_000) as lease:
        assert isinstance(lease, SyncHeldLease) and isinstance(lease.fence, int)
        first_expiry = lease.expires_at
        time.sleep(1.5)
        lease.check()
        assert sync_provider.get_lease_owner(key) == lease.owner
        assert lease.expires_at > first_expiry  # the database's answer to a renewal
        assert not lease.lost.is_set()
    assert sync_provider.get_lease_owner(key) is None


def test_hold_refused_then_waits(sync_provider: Any, key: str) -> None:
    sync_provider.acquire_lease(key, "other", 10_000)
    with pytest.raises(LeaseNotAcquiredError, match="other") as info:
        sync_provider.hold(key, ttl_ms=1_000).__enter__()
    assert info.value.holder == "other"
    threading.Timer(0.3, sync_provider.release_lease, (key, "other")).start()
    started = time.monotonic()
    with sync_provider.hold(key, owner="me", ttl_ms=1_000, wait=True, timeout_s=5) as lease:
        assert lease.owner == "me" and time.monotonic() - started >= 0.25
    with pytest.raises(LeaseNotAcquiredError):
        sync_provider.acquire_lease(key, "other", 10_000)
        with sync_provider.hold(key, ttl_ms=1_000, wait=True, timeout_s=0.2):
            pass


def test_loss_sets_the_flag_calls_back_and_raises_on_exit(sync_provider: Any, key: str) -> None:
    called: list[SyncHeldLease] = []
    with (
        pytest.raises(LeaseLostError, match="refused"),
        sync_provider.hold(key, ttl_ms=600, renew_every_ms=100, on_lost=called.append) as lease,
    ):
        assert sync_provider.transfer_lease(key, lease.owner, "thief", 10_000)  # taken from under us
        assert lease.lost.wait(2)
        for _ in range(100):  # the callback runs right after the flag is set
            if called:
                break
            time.sleep(0.01)
        assert called == [lease]
        with pytest.raises(LeaseLostError):
            lease.check()
    assert sync_provider.get_lease_owner(key) == "thief"  # the exit did not release the thief's lease


def test_loss_with_on_lost_flag_does_not_raise(sync_provider: Any, key: str) -> None:
    with sync_provider.hold(key, ttl_ms=600, renew_every_ms=100, on_lost="flag") as lease:
        sync_provider.transfer_lease(key, lease.owner, "thief", 10_000)
        assert lease.lost.wait(2)
    assert lease.lost_reason is not None


class FailingRenewals(SyncInMemoryLeaseProvider):
    """Renewals raise, as a database that went away would."""

    def renew_lease_info(self, *args: Any, **kwargs: Any) -> Any:
        raise LeaseBackendError("database unreachable")


def test_renewals_that_fail_lose_the_lease_before_it_expires(caplog: pytest.LogCaptureFixture) -> None:
    provider = FailingRenewals()
    caplog.set_level(logging.INFO, "sql_lease")
    started = time.monotonic()
    with pytest.raises(LeaseLostError, match="no renewal succeeded"), provider.hold("k", ttl_ms=500) as lease:
        assert lease.lost.wait(2)
        lost_after = time.monotonic() - started
    assert lost_after < 0.5 * (1 - 0.1) + 0.1  # declared before the expiry minus the margin (+ slack)
    assert "retrying" in caplog.text


def test_check_notices_a_stuck_renewer() -> None:
    class Stuck(SyncInMemoryLeaseProvider):
        accepts_timeout_s = False

        def renew_lease_info(self, *args: Any, **kwargs: Any) -> Any:
            time.sleep(1.0)
            return None

    with Stuck().hold("k", ttl_ms=300, on_lost="flag") as lease:
        time.sleep(0.4)
        with pytest.raises(LeaseLostError):
            lease.check()


def test_transfer_to_hands_over_and_skips_the_release(sync_provider: Any, key: str) -> None:
    with sync_provider.hold(key, ttl_ms=600, renew_every_ms=100) as lease:
        first = lease.fence
        assert lease.transfer_to("next", ttl_ms=5_000)
        assert not lease.transfer_to("again")  # no longer ours
        time.sleep(0.3)  # no renewal of ours runs after the transfer
    info = sync_provider.get_lease(key)
    assert info.owner == "next" and info.fence > first


def test_nested_holds_of_one_owner_keep_the_lease(sync_provider: Any, key: str) -> None:
    with sync_provider.hold(key, owner="me", ttl_ms=5_000) as outer:
        with sync_provider.hold(key, owner="me", ttl_ms=1_000) as inner:
            assert inner.fence == outer.fence
        assert sync_provider.get_lease_owner(key) == "me"
    assert sync_provider.get_lease_owner(key) is None


def test_hold_validates_like_the_async_one(sync_provider: Any) -> None:
    with pytest.raises(ValueError, match="renew_every_ms"):
        sync_provider.hold("k", ttl_ms=1_000, renew_every_ms=900)
    with pytest.raises(ValueError, match="on_lost"):
        sync_provider.hold("k", on_lost="cancel-everything")
    with pytest.raises(TypeError):
        sync_provider.hold(None)
    with pytest.raises(ValueError):
        sync_provider.hold("k", timeout_s=-1)


# -- waiting --------------------------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.parametrize("suffix", ["", ":resource\x00thread\x01\ud800"])  # NOTIFY names the stored form
def test_postgres_waiters_wake_on_notify(pg_schema: tuple[str, str], key: str, suffix: str) -> None:
    url, schema = pg_schema
    key += suffix
    with SyncSqlLeaseProvider(url, schema=schema) as holder, SyncSqlLeaseProvider(url, schema=schema) as waiter:
        holder.acquire_lease(key, "holder", 30_000)
        got: list[float] = []

        def wait() -> None:
            waiter.acquire_lease_wait(key, "waiter", 5_000, timeout_s=10)
            got.append(time.monotonic())

        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(1.5)  # past the polling backoff's first steps: only NOTIFY wakes it fast now
        released = time.monotonic()
        assert holder.release_lease(key, "holder")
        thread.join(5)
        assert got and got[0] - released < 0.3, got
        assert waiter._listener is not None and waiter._listener.listening
    assert not [t for t in threading.enumerate() if t.name.startswith("sql_lease")]


def test_wait_times_out_naming_the_holder(sync_provider: Any, key: str) -> None:
    sync_provider.acquire_lease(key, "holder", 30_000)
    started = time.monotonic()
    with pytest.raises(LeaseNotAcquiredError, match="holder") as info:
        sync_provider.acquire_lease_wait(key, "waiter", 1_000, timeout_s=0.3)
    assert 0.25 < time.monotonic() - started < 1.5
    assert info.value.waited_s is not None


def test_a_wait_of_the_longest_allowed_time_limit_acquires(sync_provider: Any, key: str) -> None:
    """As on the asyncio face: each attempt of a 10-year wait is given at most 10 years."""
    result = sync_provider.acquire_lease_wait(key, "waiter", 1_000, timeout_s=10 * 365 * 86_400)
    assert result.acquired and result.owner == "waiter"


def test_wait_takes_over_at_expiry(sync_provider: Any, key: str) -> None:
    sync_provider.acquire_lease(key, "holder", 400)
    started = time.monotonic()
    result = sync_provider.acquire_lease_wait(key, "waiter", 1_000, timeout_s=5)
    assert result.acquired and 0.3 < time.monotonic() - started < 1.5


# -- timeouts ------------------------------------------------------------------------------------


@pytest.mark.postgres
def test_a_stalled_postgres_statement_is_aborted(pg_schema: tuple[str, str], key: str) -> None:
    import psycopg

    url, schema = pg_schema
    with SyncSqlLeaseProvider(url, schema=schema, operation_timeout_s=0.5) as provider:
        assert provider.acquire_lease(key, "alice", 10_000).acquired
        with psycopg.connect(provider._executor._conninfo) as blocker:
            # the lease's row, locked by an open transaction: a release waits for it (an acquire
            # would answer "not acquired" at its lock_timeout instead, see test_guarded_waits.py)
            blocker.execute(f'SELECT 1 FROM "{schema}".sql_leases WHERE key = %s FOR UPDATE', (key,))
            started = time.monotonic()
            with pytest.raises(LeaseBackendError, match=r"within 0\.5 s") as info:
                provider.release_lease(key, "alice")
            assert time.monotonic() - started < 1.5
            assert info.value.__cause__ is not None
            blocker.rollback()
        # a fresh connection works (the aborted release's outcome is unknown: the lease may be free)
        assert provider.acquire_lease(key, "alice", 10_000).acquired


def test_a_stalled_sqlite_statement_is_aborted(tmp_path: Path, sync_sqlite_template: str) -> None:
    import sqlite3

    path = tmp_path / "stall.db"
    shutil.copyfile(sync_sqlite_template, path)
    with SyncSqlLeaseProvider(f"sqlite:///{path}", operation_timeout_s=0.5, sqlite_busy_timeout_ms=5_000) as provider:
        assert provider.acquire_lease("k", "alice", 10_000).acquired
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        started = time.monotonic()
        # a release waits for the write lock (an acquire would answer "not acquired" at its lock wait)
        with pytest.raises(LeaseBackendError):  # "no answer within 0.5 s", or "database is locked" as it ends
            provider.release_lease("k", "alice")
        assert time.monotonic() - started < 1.5
        blocker.execute("ROLLBACK")
        blocker.close()
        assert provider.release_lease("k", "alice")


def test_per_call_timeout_is_bounded_by_the_operation_timeout(tmp_path: Path, sync_sqlite_template: str) -> None:
    path = tmp_path / "t.db"
    shutil.copyfile(sync_sqlite_template, path)
    with SyncSqlLeaseProvider(f"sqlite:///{path}", operation_timeout_s=2) as provider:
        assert provider.acquire_lease("k", "a", 1_000, timeout_s=100).acquired
        with pytest.raises(ValueError):
            provider.acquire_lease("k", "a", 1_000, timeout_s=0)


def test_close_leaves_no_threads(sync_sql_provider: Any, key: str) -> None:
    with sync_sql_provider.hold(key, ttl_ms=1_000):
        pass
    sync_sql_provider.close()
    time.sleep(0.1)
    assert not [t for t in threading.enumerate() if t.name.startswith("sql_lease")]


EXITS_WITHOUT_CLOSE = textwrap.dedent(
    """
    import sys
    from sql_lease import SyncSqlLeaseProvider
    leases = SyncSqlLeaseProvider(sys.argv[1], schema=sys.argv[2] or None)  # module level, never closed
    leases.acquire_lease("exit-without-close", sys.argv[3], 60_000)
    """
)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_process_that_never_closes_its_provider_exits(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, sync_sqlite_template: str
) -> None:
    # Regression: the provider's finaliser waited for a lock held by a daemon thread frozen by the
    # interpreter's shutdown, and the process hung at exit (3 of 8 processes here).
    if kind == "postgres":
        url, schema = request.getfixturevalue("pg_schema")
    else:
        shutil.copyfile(sync_sqlite_template, tmp_path / "t.db")
        url, schema = f"sqlite:///{tmp_path / 't.db'}", ""
    script = tmp_path / "exits.py"
    script.write_text(EXITS_WITHOUT_CLOSE)
    results = run_scripts(script, [[url, schema, f"owner-{i}"] for i in range(12)], cwd=REPO, timeout_s=60)
    assert [code for code, _, _ in results] == [0] * 12, [err for code, _, err in results if code]


# -- a given Engine -------------------------------------------------------------------------------


SESSION_SETTINGS = "SELECT name, setting FROM pg_settings WHERE source = 'session' ORDER BY name"


@pytest.mark.postgres
def test_a_given_postgres_engine_lends_connections_unchanged(pg_schema: tuple[str, str], key: str) -> None:
    import sqlalchemy as sa

    url, schema = pg_schema
    engine = sa.create_engine(sa.engine.make_url(url).set(drivername="postgresql+psycopg"), pool_size=1, max_overflow=0)
    with engine.connect() as conn:
        before = conn.execute(sa.text(SESSION_SETTINGS)).all()
        isolation = conn.get_isolation_level()
    provider = SyncSqlLeaseProvider(engine, schema=schema)
    assert provider.engine is engine
    held = provider.acquire_lease(key, "alice", 10_000)
    assert held.acquired and engine.pool.checkedout() == 0
    assert not provider.acquire_lease(key, "bob", 10_000).acquired
    assert engine.pool.checkedout() == 0
    assert provider.renew_lease_info(key, "alice", 10_000).fence == held.fence
    with provider.hold(f"{key}:held", ttl_ms=300):
        time.sleep(0.4)
    assert provider.release_lease(key, "alice") and engine.pool.checkedout() == 0
    with engine.connect() as conn:  # the same (only) connection of the pool
        assert conn.execute(sa.text(SESSION_SETTINGS)).all() == before
        assert conn.get_isolation_level() == isolation
        assert conn.execute(sa.text("SELECT 1")).scalar() == 1
    provider.close()
    assert engine.pool.checkedout() == 0
    with engine.connect() as conn:  # the engine is the application's: still usable
        assert conn.execute(sa.text("SELECT 1")).scalar() == 1
    engine.dispose()


def test_a_given_sqlite_engine(tmp_path: Path, sync_sqlite_template: str) -> None:
    import sqlalchemy as sa

    path = tmp_path / "engine.db"
    shutil.copyfile(sync_sqlite_template, path)
    engine = sa.create_engine(f"sqlite:///{path}")
    with SyncSqlLeaseProvider(engine) as provider:
        assert provider.acquire_lease("k", "alice", 10_000).acquired
        assert not provider.acquire_lease("k", "bob", 10_000).acquired
        assert engine.pool.checkedout() == 0
        assert provider.release_lease("k", "alice")
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE app (x INTEGER)"))
    with engine.connect() as conn:  # the connection the provider used: back in the app's mode
        assert conn.connection.driver_connection.isolation_level == ""
        conn.execute(sa.text("INSERT INTO app VALUES (1)"))
        conn.rollback()
        assert conn.execute(sa.text("SELECT count(*) FROM app")).scalar() == 0
    engine.dispose()


def test_engines_of_other_drivers_are_refused() -> None:
    import sqlalchemy as sa
    from sqlalchemy.ext.asyncio import create_async_engine

    with pytest.raises(TypeError, match="SqlLeaseProvider"):
        SyncSqlLeaseProvider(create_async_engine("sqlite+aiosqlite:///x.db"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="psycopg"):
        SyncSqlLeaseProvider(sa.create_engine("postgresql+asyncpg://u@h/db"))


def test_json_worker_script_is_valid_python() -> None:
    compile(WORKER, "sync_worker.py", "exec")
    assert json.dumps({}) == "{}" and sys.executable


# -- migrations -----------------------------------------------------------------------------------


@pytest.mark.postgres
def test_migrate_on_postgres_needs_no_asyncpg(pg_url: str, fresh_pg_schema: str) -> None:
    import subprocess

    code = textwrap.dedent(
        f"""
        import sys
        from sql_lease import SyncSqlLeaseProvider
        with SyncSqlLeaseProvider({pg_url!r}, schema={fresh_pg_schema!r}) as leases:
            first, again = leases.migrate(), leases.migrate()
            assert first == again and first is not None, (first, again)
            assert leases.acquire_lease("k", "alice", 10_000).acquired
        assert "asyncpg" not in sys.modules, "asyncpg was imported"
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=60)


@pytest.mark.postgres
def test_migrate_through_a_given_engine(pg_url: str, fresh_pg_schema: str) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(sa.engine.make_url(pg_url).set(drivername="postgresql+psycopg"))
    with SyncSqlLeaseProvider(engine, schema=fresh_pg_schema) as leases:
        assert leases.migrate() is not None
        assert leases.acquire_lease("k", "alice", 10_000).acquired
    assert engine.pool.checkedout() == 0
    engine.dispose()


def test_sync_loss_is_declared_at_the_deadline_not_one_margin_later(key: str) -> None:
    """Regression (the asyncio twin was fixed earlier): when the last retry's turn came at the
    deadline, the thread renewer still sent a renewal and waited one more margin for it, so a
    holder cut off from the database learned of its loss only as its lease expired."""
    import time as _time

    from sql_lease import SyncInMemoryLeaseProvider

    class Unreachable(SyncInMemoryLeaseProvider):
        accepts_timeout_s = True

        def renew_lease_info(self, key: str, owner: str, ttl_ms: float, *, timeout_s: float | None = None) -> Any:
            # refused at once by a failing database, until it stops answering altogether
            if _time.monotonic() - started > ttl_s * 0.85:
                _time.sleep(timeout_s or 0)
            raise LeaseBackendError("renew: the database failed")

    leases = Unreachable()
    ttl_s = 1.0
    started = _time.monotonic()
    with leases.hold(key, "cut-off", ttl_ms=ttl_s * 1000, on_lost="flag") as lease:
        assert lease.lost.wait(5)
        lost_after = _time.monotonic() - started
    assert lost_after <= ttl_s * (1 - 0.1) + 0.05, f"loss declared {lost_after:.2f} s after the acquire"


# -- issue 20: a sync holder that has lost knows it before anyone else can hold ------------------------


class Hanging(SyncInMemoryLeaseProvider):
    """Renewals and transfers block until ``release`` is set, ignoring any per-call bound (a
    statement stuck in a C call, a frozen server)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.hang_renewals = True
        self.hang_transfers = True

    def renew_lease(self, *args: Any, **kwargs: Any) -> bool:
        if self.hang_renewals:
            self.release.wait()
        return super().renew_lease(*args, **kwargs)

    def renew_lease_info(self, *args: Any, **kwargs: Any) -> Any:
        if self.hang_renewals:
            self.release.wait()
        return super().renew_lease_info(*args, **kwargs)

    def transfer_lease(self, *args: Any, **kwargs: Any) -> bool:
        if self.hang_transfers:
            self.release.wait()
        return super().transfer_lease(*args, **kwargs)


def test_20_1_a_hold_whose_renewal_hangs_declares_its_loss_by_the_deadline() -> None:
    """Item 1: the loss is judged by the clock, by a timer that does not wait for the renewal."""
    provider = Hanging()
    ttl_s = 1.0
    called = threading.Event()
    try:
        started = time.monotonic()
        with provider.hold("k", "me", ttl_ms=ttl_s * 1000, on_lost=lambda lease: called.set()) as lease:
            assert lease.lost.wait(3 * ttl_s), "no loss declared while the renewal hangs"
            lost_after = time.monotonic() - started
            with pytest.raises(LeaseLostError, match="no renewal succeeded"):
                lease.check()
            assert called.wait(2), "the on_lost callback did not run"
            assert not lease.valid
    except LeaseLostError:
        pass
    finally:
        provider.release.set()
    assert lost_after <= ttl_s * (1 - 0.1) + 0.08, f"loss declared {lost_after:.2f} s after the acquire"


def test_20_1_check_raises_at_the_deadline_while_a_renewal_is_in_flight() -> None:
    """Item 1/2: check() judged with no margin while a statement held the renewal lock."""
    provider = Hanging()
    ttl_s = 1.0
    try:
        with provider.hold("k", "me", ttl_ms=ttl_s * 1000, on_lost="flag") as lease:
            time.sleep(ttl_s * (1 - 0.1) + 0.02)  # a renewal is in flight (it hangs); the deadline has passed
            with pytest.raises(LeaseLostError):
                lease.check()
    finally:
        provider.release.set()


def test_20_2_a_hung_transfer_does_not_suspend_loss_detection() -> None:
    """Item 2: a transfer stuck behind a row lock holds the renewal lock; the loss is still
    declared by the deadline and check() raises from then on (with the renewals' margin)."""
    provider = Hanging()
    provider.hang_renewals = False
    ttl_s = 1.0
    result: list[Any] = []
    try:
        with provider.hold("k", "me", ttl_ms=ttl_s * 1000, on_lost="flag") as lease:
            started = time.monotonic()
            transfer = threading.Thread(target=lambda: result.append(lease.transfer_to("next")))
            transfer.start()
            assert lease.lost.wait(3 * ttl_s), "no loss declared while the transfer hangs"
            lost_after = time.monotonic() - started
            with pytest.raises(LeaseLostError):
                lease.check()
            provider.release.set()
            transfer.join(5)
    finally:
        provider.release.set()
    assert lost_after <= ttl_s * (1 - 0.1) + 0.08, f"loss declared {lost_after:.2f} s after the transfer began"


def test_20_2_a_transfer_is_bounded_by_the_deadline(key: str) -> None:
    """Item 2: a provider that takes per-call bounds is given the time left to the deadline."""
    seen: list[float | None] = []

    class Bounded(SyncInMemoryLeaseProvider):
        def transfer_lease(self, *args: Any, timeout_s: float | None = None, **kwargs: Any) -> bool:
            seen.append(timeout_s)
            return super().transfer_lease(*args, timeout_s=timeout_s, **kwargs)

    with Bounded().hold(key, "me", ttl_ms=1_000) as lease:
        assert lease.transfer_to("next")
    assert seen and seen[0] is not None and 0 < seen[0] <= 0.9


def test_20_14_a_late_sync_renewal_blames_a_stalled_thread_only_when_late_by_more_than_jitter() -> None:
    """Item 14: the thread face uses the asyncio face's rule, and names its own cause."""
    short = SyncHeldLease(SyncInMemoryLeaseProvider(), "k", "a", ttl_ms=15)
    note = short._late(0.01)
    assert "TTL of 15 ms" in note and "late" in note
    assert short._late(0.001) == ""
    long = SyncHeldLease(SyncInMemoryLeaseProvider(), "k", "a", ttl_ms=15_000)._late(2.0)
    assert "event loop" not in long and "thread" in long


def test_20_8_keyboard_interrupt_during_the_acquire_releases_before_it_propagates(key: str) -> None:
    """Item 8: Ctrl-C landing while hold(wait=True) acquires (the statement committed) releases
    the lease synchronously, before the KeyboardInterrupt goes on, not in a daemon thread that
    dies with the interpreter."""
    released_in: list[str] = []

    class Interrupted(SyncInMemoryLeaseProvider):
        def acquire_lease(self, *args: Any, **kwargs: Any) -> Any:
            super().acquire_lease(*args, **kwargs)
            raise KeyboardInterrupt  # as if delivered just after the commit

        def release_lease(self, *args: Any, **kwargs: Any) -> bool:
            time.sleep(0.2)  # a release that takes a moment, as over a network
            released_in.append(threading.current_thread().name)
            return super().release_lease(*args, **kwargs)

    provider = Interrupted()
    with pytest.raises(KeyboardInterrupt), provider.hold(key, "me", ttl_ms=60_000, wait=True):
        pytest.fail("the body must not run")
    assert provider.get_lease_owner(key) is None, "the lease stayed held after Ctrl-C"
    assert released_in == [threading.current_thread().name]


def test_20_8_interrupt_main_during_a_waiting_hold_leaves_the_key_free(key: str) -> None:
    """Item 8 with a real interrupt: _thread.interrupt_main() while the acquire is in flight."""
    import _thread

    in_acquire = threading.Event()

    class Slow(SyncInMemoryLeaseProvider):
        def acquire_lease(self, *args: Any, **kwargs: Any) -> Any:
            result = super().acquire_lease(*args, **kwargs)
            in_acquire.set()
            for _ in range(200):  # the answer is on its way back (interruptible Python code)
                time.sleep(0.01)
            return result

        def release_lease(self, *args: Any, **kwargs: Any) -> bool:
            time.sleep(0.2)  # a release that takes a moment, as over a network
            return super().release_lease(*args, **kwargs)

    provider = Slow()
    # Python's own Ctrl-C handler, as in a program (a test runner's worker may ignore SIGINT, and
    # interrupt_main() then does nothing)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=lambda: (in_acquire.wait(5), _thread.interrupt_main())).start()
        with pytest.raises(KeyboardInterrupt), provider.hold(key, "me", ttl_ms=60_000, wait=True):
            pytest.fail("the body must not run")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert SyncInMemoryLeaseProvider.get_lease_owner(provider, key) is None


# -- an acquire answering past the lease's deadline does not enter the block ------------------------


class _LateAcquire:
    """Forwards to ``inner``; each acquire answers ``late_s`` seconds after it committed."""

    def __init__(self, inner: Any, late_s: float) -> None:
        self.inner, self.late_s = inner, late_s

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def acquire_lease(self, *a: Any, **k: Any) -> Any:
        result = self.inner.acquire_lease(*a, **k)
        time.sleep(self.late_s)
        return result


def test_hold_does_not_enter_with_an_acquire_answered_past_the_deadline(sync_provider: Any, key: str) -> None:
    """Reviewer: an acquire that answered later than 0.9 x TTL after it was sent still entered the
    block (a sync body runs until it calls check()). Now: released, and not acquired."""
    entered: list[bool] = []
    late = _LateAcquire(sync_provider, 0.3 * 0.95)
    with pytest.raises(LeaseNotAcquiredError, match="past the lease's deadline"), SyncHeldLease(late, key, ttl_ms=300):
        entered.append(True)
    assert entered == []
    assert sync_provider.get_lease_owner(key) is None  # released, not left to expire


# -- a process forked inside hold() never acts as the holder -------------------------------------------


def _fork() -> int:
    import os
    import warnings

    with warnings.catch_warnings():  # the renewal and watch threads: fork() in a threaded process
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


def test_a_child_forked_inside_hold_neither_releases_nor_loses_the_parents_lease(
    sync_sql_provider: Any, key: str
) -> None:
    """Reviewer's fk.py: a child forked inside hold() that left the block released the parent's
    lease (the parent still said valid), and the loss watch it inherited declared the parent's
    lease lost in the child, calling on_lost there."""
    import os

    read_end, write_end = os.pipe()

    def on_lost(lease: SyncHeldLease) -> None:
        os.write(write_end, f"on_lost in {os.getpid()}\n".encode())

    with SyncHeldLease(sync_sql_provider, key, ttl_ms=1_000, on_lost=on_lost) as lease:
        pid = _fork()
        if pid == 0:  # the child: a hold of its own starts its loss watch, past the parent's deadline
            try:
                with SyncHeldLease(sync_sql_provider, key + ":child", ttl_ms=5_000):
                    time.sleep(1.2)  # the parent's lease is renewed by the parent only
                lease.__exit__(None, None, None)  # the child leaves the parent's block
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        os.close(write_end)
        with os.fdopen(read_end) as calls:
            assert calls.read() == "", "on_lost was called for the parent's lease"
        assert lease.valid
        assert sync_provider_owner(sync_sql_provider, key) == lease.owner, "the child released the parent's lease"


def sync_provider_owner(provider: Any, key: str) -> str | None:
    return provider.get_lease_owner(key)  # type: ignore[no-any-return]
