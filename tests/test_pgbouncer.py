"""Through PgBouncer in transaction pooling mode (Debian's ``pgbouncer``, installed by
scripts/pgbouncer_setup.sh when missing): the contract with ``pgbouncer=True``, and the prepared
statement failures that make the option necessary."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import pwd
import random
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from sql_lease import LeaseBackendError, LeaseNotAcquiredError, SqlLeaseProvider
from tests.support.fault_worker import run_workers

pytestmark = pytest.mark.postgres

REPO = Path(__file__).resolve().parent.parent
SETUP = REPO / "scripts" / "pgbouncer_setup.sh"
SERVER_POOL_SIZE = 3  # few server connections, so every one is shared by many clients


def pgbouncer_binary() -> str:
    found = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/usr/local/sbin")
    if found:
        return found
    result = subprocess.run(["bash", str(SETUP)], capture_output=True, text=True, timeout=600)
    found = shutil.which("pgbouncer", path="/usr/sbin:/usr/local/sbin:/usr/bin")
    if result.returncode != 0 or not found:
        pytest.fail(
            f"PgBouncer is not installed and {SETUP.name} could not install it "
            f"(exit {result.returncode}): {result.stderr.strip()[-2000:]}",
            pytrace=False,
        )
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, proc: subprocess.Popen[bytes], logfile: Path, within_s: float = 15) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"pgbouncer exited with {proc.returncode}: {logfile.read_text()[-2000:]}", pytrace=False)
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    pytest.fail(f"pgbouncer did not listen on {port} within {within_s} s: {logfile.read_text()[-2000:]}")


@pytest.fixture(scope="module")
def pgbouncer(pg_url: str) -> Iterator[str]:
    """A PgBouncer in transaction pooling mode in front of the test database; yields its URL."""
    binary = pgbouncer_binary()
    target = make_url(pg_url)
    user, dbname = target.username or "postgres", target.database or "postgres"
    workdir = Path(tempfile.mkdtemp(prefix="sql_lease_pgbouncer_"))
    port = free_port()
    logfile = workdir / "pgbouncer.log"
    (workdir / "userlist.txt").write_text(f'"{user}" ""\n')
    (workdir / "pgbouncer.ini").write_text(
        f"""[databases]
{dbname} = host={target.host or "127.0.0.1"} port={target.port or 5432} dbname={dbname}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {workdir}/userlist.txt
pool_mode = transaction
default_pool_size = {SERVER_POOL_SIZE}
max_client_conn = 500
logfile = {logfile}
pidfile = {workdir}/pgbouncer.pid
admin_users = {user}
"""
    )
    command = [binary, str(workdir / "pgbouncer.ini")]
    if os.geteuid() == 0:  # PgBouncer refuses to run as root
        postgres = pwd.getpwnam("postgres")
        for path in [workdir, *workdir.iterdir()]:
            os.chown(path, postgres.pw_uid, postgres.pw_gid)
        command = ["runuser", "-u", "postgres", "--", *command]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # it logs to logfile
    try:
        wait_for_port(port, proc, logfile)
        yield target.set(host="127.0.0.1", port=port).render_as_string(hide_password=False)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def bounced(pgbouncer: str, pg_schema: tuple[str, str]) -> tuple[str, str]:
    """(PgBouncer URL, the session's migrated schema)."""
    return pgbouncer, pg_schema[1]


async def test_contract_operations_through_pgbouncer(bounced: tuple[str, str], key: str) -> None:
    url, schema = bounced
    async with SqlLeaseProvider(url, schema=schema, pgbouncer=True, operation_timeout_s=5) as leases:
        assert leases.release_waiter(key) is None  # no LISTEN through PgBouncer: waiters poll
        first = await leases.acquire_lease(key, "a", 60_000)
        assert first.acquired and first.owner == "a" and first.fence is not None
        refused = await leases.acquire_lease(key, "b", 60_000)
        assert (refused.acquired, refused.owner, refused.fence) == (False, "a", first.fence)
        again = await leases.acquire_lease(key, "a", 60_000)
        assert again.acquired and again.fence == first.fence
        assert await leases.renew_lease(key, "a", 60_000)
        assert not await leases.renew_lease(key, "b", 60_000)
        assert await leases.get_lease_owner(key) == "a"
        lease = await leases.get_lease(key)
        assert lease is not None and lease.fence == first.fence
        assert await leases.transfer_lease(key, "a", "b", 60_000)
        moved = await leases.get_lease(key)
        assert moved is not None and moved.owner == "b" and moved.fence > first.fence
        assert not await leases.transfer_lease(key, "a", "c", 60_000)
        assert not await leases.release_lease(key, "a")
        assert await leases.release_lease(key, "b")
        assert await leases.get_lease_owner(key) is None
        # expiry and the sweep
        assert (await leases.acquire_lease(key, "short", 1)).acquired
        await asyncio.sleep(0.02)
        assert await leases.get_lease_owner(key) is None
        assert await leases.sweep_expired(batch_size=1000) >= 1
        after = await leases.acquire_lease(key, "c", 60_000)
        assert after.acquired and after.fence is not None and after.fence > moved.fence
        assert await leases.release_lease(key, "c")
        # hold() renews through PgBouncer past its TTL, and releases at the end
        async with leases.hold(key, "holder", ttl_ms=1500) as held:  # a TTL a loaded CI machine does not outrun
            await asyncio.sleep(1.8)
            assert not held.lost.is_set()
            assert await leases.get_lease_owner(key) == "holder"
        assert await leases.get_lease_owner(key) is None


async def test_hold_wait_polls_through_pgbouncer(bounced: tuple[str, str], key: str) -> None:
    url, schema = bounced
    loop = asyncio.get_running_loop()
    async with SqlLeaseProvider(url, schema=schema, pgbouncer=True, operation_timeout_s=5) as leases:
        entered = asyncio.Event()

        async def first() -> int:
            async with leases.hold(key, "first", ttl_ms=5_000) as lease:
                entered.set()
                await asyncio.sleep(0.5)
                assert lease.fence is not None
                return lease.fence

        holder = asyncio.create_task(first())
        await entered.wait()
        started = loop.time()
        with pytest.raises(LeaseNotAcquiredError):
            async with leases.hold(key, "impatient", ttl_ms=5_000, wait=True, timeout_s=0.1):
                pytest.fail("entered while another owner held the key")
        async with leases.hold(key, "second", ttl_ms=5_000, wait=True, timeout_s=5) as second:
            waited = loop.time() - started
            assert await leases.get_lease_owner(key) == "second"
        first_fence = await holder
        assert second.fence is not None and second.fence > first_fence
        assert 0.3 < waited < 2.5, waited


async def test_concurrent_tasks_through_pgbouncer(bounced: tuple[str, str]) -> None:
    """Thirty tasks on three providers share three keys through three server connections."""
    url, schema = bounced
    prefix = f"bouncer-{uuid.uuid4().hex[:8]}"
    keys = [f"{prefix}:{i}" for i in range(3)]
    holders: dict[str, str] = {}
    fences: dict[str, list[int]] = defaultdict(list)
    stats = {"operations": 0, "acquired": 0, "violations": 0}
    providers = [
        SqlLeaseProvider(url, schema=schema, pgbouncer=True, pool_size=5, operation_timeout_s=10) for _ in range(3)
    ]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 3.0

    async def task(provider: SqlLeaseProvider, me: str) -> None:
        while loop.time() < deadline:
            key = random.choice(keys)
            stats["operations"] += 1
            result = await provider.acquire_lease(key, me, 10_000)
            if not result.acquired:
                await asyncio.sleep(random.uniform(0, 0.005))
                continue
            stats["acquired"] += 1
            if key in holders:
                stats["violations"] += 1
            holders[key] = me
            fences[key].append(result.fence)  # type: ignore[arg-type]
            await asyncio.sleep(random.uniform(0, 0.003))
            stats["operations"] += 2
            if not await provider.renew_lease(key, me, 10_000):
                stats["violations"] += 1
            if holders.get(key) != me:
                stats["violations"] += 1
            del holders[key]
            if not await provider.release_lease(key, me):
                stats["violations"] += 1

    try:
        await asyncio.gather(*(task(providers[i % 3], f"t{i}") for i in range(30)))
    finally:
        for provider in providers:
            await provider.close()
    print(f"\nCOUNTS fault=pgbouncer-concurrency {stats}", flush=True)
    assert stats["violations"] == 0, stats
    assert stats["acquired"] >= 30, stats
    for key, seq in fences.items():
        assert all(a < b for a, b in itertools.pairwise(seq)), (key, seq)


@pytest.mark.slow
def test_processes_through_pgbouncer(bounced: tuple[str, str], tmp_path: Path) -> None:
    """Several processes (each its own engine, statement names and first-connect queries) share
    PgBouncer's server connections: no errors, no two holders, fences grow."""
    url, schema = bounced
    markers = tmp_path / "markers"
    markers.mkdir()
    log = tmp_path / "tenures.log"
    prefix = f"bouncer-procs-{uuid.uuid4().hex[:8]}"
    args = ["hammer", "--url", url, "--schema", schema, "--prefix", prefix, "--keys", "2", "--duration", "3"]
    args += ["--pgbouncer", "--dir", str(markers), "--log", str(log)]
    results = run_workers([[*args, "--worker", str(i)] for i in range(4)], REPO, 60)
    totals: dict[str, int] = defaultdict(int)
    errors = []
    for code, out, err in results:
        assert code == 0, err
        for name, value in json.loads(out.strip().splitlines()[-1]).items():
            totals[name] += value
        errors += err.splitlines()
    print(f"\nCOUNTS fault=pgbouncer-processes {dict(totals)}", flush=True)
    assert totals["errors"] == 0 and totals["violations"] == 0, errors[:10]
    assert totals["acquired"] >= 20, totals
    by_key: dict[str, list[int]] = defaultdict(list)
    for line in log.read_text().splitlines():
        k, fence, _owner = line.split(" ")
        by_key[k].append(int(fence))
    for k, seq in by_key.items():
        assert all(a < b for a, b in itertools.pairwise(seq)), (k, seq)


async def test_migrate_through_pgbouncer(pgbouncer: str, fresh_pg_schema: str, key: str) -> None:
    async with SqlLeaseProvider(pgbouncer, schema=fresh_pg_schema, pgbouncer=True) as leases:
        assert await leases.migrate()
        assert await leases.migrate()  # idempotent
        assert (await leases.acquire_lease(key, "a", 60_000)).acquired


async def test_without_the_pgbouncer_option_prepared_statements_break(bounced: tuple[str, str]) -> None:
    """asyncpg's named prepared statements (its statement cache) do not survive transaction
    pooling: a statement prepared on one server connection is executed on another."""
    url, schema = bounced
    prefix = f"nobouncer-{uuid.uuid4().hex[:8]}"
    providers = [SqlLeaseProvider(url, schema=schema, pool_size=5, operation_timeout_s=10) for _ in range(3)]
    failures: list[BaseException] = []
    operations = 0
    try:
        for _round in range(20):
            calls: list[Any] = []
            for i, provider in enumerate(providers):
                for j in range(5):
                    key = f"{prefix}:{(i + j) % 4}"
                    calls += [
                        provider.acquire_lease(key, f"o{i}{j}", 1_000),
                        provider.get_lease_owner(key),
                        provider.renew_lease(key, f"o{i}{j}", 1_000),
                        provider.release_lease(key, f"o{i}{j}"),
                    ]
            operations += len(calls)
            results = await asyncio.gather(*calls, return_exceptions=True)
            failures += [r for r in results if isinstance(r, BaseException)]
            if failures:
                break
    finally:
        for provider in providers:
            await provider.close()
    print(
        f"\nCOUNTS fault=pgbouncer-without-option operations={operations} backend_errors={len(failures)} "
        f"first: {str(failures[0])[:300] if failures else None}",
        flush=True,
    )
    assert failures, "named prepared statements worked through transaction pooling; is pool_mode=transaction?"
    assert all(isinstance(f, LeaseBackendError) for f in failures), failures[:3]
    assert any("prepared statement" in str(f) for f in failures), [str(f) for f in failures[:3]]


async def test_given_engine_configured_as_the_readme_says(pgbouncer: str, fresh_pg_schema: str) -> None:
    """README: for a given engine through PgBouncer, ``connect_args={"statement_cache_size": 0}``
    and ``listen_notify=False``. Migrations (SQLAlchemy/Alembic statements) and concurrent lease
    operations on two such engines work."""
    from sqlalchemy.ext.asyncio import create_async_engine

    url = make_url(pgbouncer).set(drivername="postgresql+asyncpg")
    engines = [create_async_engine(url, connect_args={"statement_cache_size": 0}) for _ in range(2)]
    prefix = f"given-{uuid.uuid4().hex[:8]}"
    try:
        providers = [
            SqlLeaseProvider(engine, schema=fresh_pg_schema, listen_notify=False, operation_timeout_s=10)
            for engine in engines
        ]
        assert await providers[0].migrate()
        assert await providers[1].migrate()
        for round_ in range(10):
            results = await asyncio.gather(
                *(
                    p.acquire_lease(f"{prefix}:{(i + round_) % 3}", f"o{i}", 60_000)
                    for i, p in enumerate(providers * 4)
                ),
                return_exceptions=True,
            )
            assert not [r for r in results if isinstance(r, BaseException)], results
            for p in providers:
                for k in range(3):
                    await p.release_lease(f"{prefix}:{k}", "o0")
        for p in providers:
            await p.close()
    finally:
        for engine in engines:
            await engine.dispose()


async def on_every_server_connection(pgbouncer: str, sql: str, reset: bool = False) -> list[Any]:
    """Run ``sql`` once on each of PgBouncer's server connections (as many clients, each in a
    transaction at once, hold every one of them), after ``RESET ALL`` if ``reset``; one row each."""
    import asyncpg

    url = make_url(pgbouncer).set(drivername="postgresql").render_as_string(hide_password=False)
    clients = [await asyncpg.connect(url, statement_cache_size=0) for _ in range(SERVER_POOL_SIZE)]
    try:
        for client in clients:
            await client.execute("BEGIN; RESET ALL" if reset else "BEGIN")
        rows = [await client.fetchrow(sql) for client in clients]
        for client in clients:
            await client.execute("COMMIT")
        return rows
    finally:
        for client in clients:
            await client.close()


async def test_a_given_engine_leaves_pgbouncers_shared_server_connections_unchanged(
    pgbouncer: str, fresh_pg_schema: str
) -> None:
    """Regression (issue 9, item 7): with an application's engine through PgBouncer in transaction
    mode, the provider's session `SET`s (enable_seqscan, transaction_isolation) stayed on shared
    server connections, and unrelated clients saw `enable_seqscan = off`."""
    from sqlalchemy.ext.asyncio import create_async_engine

    # earlier tests of this module misconfigure providers on purpose: start from clean sessions
    await on_every_server_connection(pgbouncer, "SELECT 1", reset=True)
    engine = create_async_engine(
        make_url(pgbouncer).set(drivername="postgresql+asyncpg"), connect_args={"statement_cache_size": 0}
    )
    prefix = f"shared-{uuid.uuid4().hex[:8]}"
    try:
        leases = SqlLeaseProvider(engine, schema=fresh_pg_schema, listen_notify=False, operation_timeout_s=10)
        assert await leases.migrate()
        for _ in range(3):  # concurrent operations, so several server connections serve the engine
            keys = [f"{prefix}:{i}" for i in range(6)]
            assert all(r.acquired for r in await asyncio.gather(*(leases.acquire_lease(k, "o", 60_000) for k in keys)))
            assert all(await asyncio.gather(*(leases.renew_lease(k, "o", 60_000) for k in keys)))
            assert all(await asyncio.gather(*(leases.release_lease(k, "o") for k in keys)))
        await leases.close()
        # and a provider of its own, told it runs through PgBouncer: no session settings either
        async with SqlLeaseProvider(pgbouncer, schema=fresh_pg_schema, pgbouncer=True) as own:
            keys = [f"{prefix}:own:{i}" for i in range(6)]
            assert all(r.acquired for r in await asyncio.gather(*(own.acquire_lease(k, "o", 60_000) for k in keys)))
            assert all(await asyncio.gather(*(own.release_lease(k, "o") for k in keys)))
    finally:
        await engine.dispose()
    seen = await on_every_server_connection(
        pgbouncer,
        "SELECT pg_backend_pid() AS pid, current_setting('enable_seqscan') AS seqscan,"
        " array(SELECT name FROM pg_settings WHERE source = 'session' ORDER BY name) AS session",
    )
    assert len({row["pid"] for row in seen}) == SERVER_POOL_SIZE, seen
    for row in seen:
        assert row["seqscan"] == "on", seen
        assert not {"enable_seqscan", "transaction_isolation", "synchronous_commit"} & set(row["session"]), seen
