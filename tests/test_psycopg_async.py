"""Issue 21 item 2: the async face (and so every CLI command) on psycopg 3 alone, for installs
without asyncpg (``sql-lease[psycopg]``): the same statements, session settings, deadlines, error
mapping and per-loop/per-process pools as on asyncpg. In this process the driver choice is
patched; the CLI tests hide asyncpg from a subprocess."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sql_lease import LeaseBackendError, SqlLeaseProvider, acquire_lease_wait, hold
from sql_lease.errors import LeaseConfigError
from sql_lease.sql import provider as provider_module

HIDE_ASYNCPG = "import sys, runpy; sys.modules['asyncpg'] = None; runpy.run_module('sql_lease', run_name='__main__')"
HIDE_BOTH = (
    "import sys, runpy; sys.modules['asyncpg'] = None; sys.modules['psycopg'] = None; "
    "runpy.run_module('sql_lease', run_name='__main__')"
)


@pytest.fixture
def psycopg_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(provider_module, "async_postgres_driver", lambda: "psycopg")


@pytest.fixture
def hanging_port() -> Iterator[int]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    yield listener.getsockname()[1]
    listener.close()


@pytest.mark.postgres
async def test_every_operation_on_psycopg(pg_url: str, fresh_pg_schema: str, psycopg_only: None, key: str) -> None:
    async with SqlLeaseProvider(f"{pg_url}?application_name=psy-face", schema=fresh_pg_schema) as leases:
        assert type(leases._executor).__name__ == "PsycopgAsyncPoolExecutor"
        assert await leases.migrate()
        first = await leases.acquire_lease(key, "a", 10_000, data={"n": 1})
        assert first.acquired and first.expires_at.utcoffset().total_seconds() == 0  # type: ignore[union-attr]
        refused = await leases.acquire_lease(key, "b", 10_000)
        assert not refused.acquired and refused.owner == "a" and refused.fence == first.fence
        held = await leases.get_lease(key)
        assert held is not None and held.data == {"n": 1} and held.remaining_ms > 0
        assert await leases.renew_lease(key, "a", 10_000)
        assert set(await leases.renew_many([(key, "a", 10_000)])) == {key}
        assert await leases.transfer_lease(key, "a", "b", 10_000)
        assert [lease.owner for lease in await leases.list_leases()] == ["b"]
        assert await leases.release_lease(key, "b")
        # a waiter polls and gets the lease once the holder lets go
        async with hold(leases, key, "holder", ttl_ms=5_000):
            waiter = asyncio.ensure_future(acquire_lease_wait(leases, key, "waiter", 5_000, timeout_s=10))
            await asyncio.sleep(0.1)
        assert (await waiter).acquired
        # the session settings of the provider's own connections
        lent = leases._executor._pools.current().take_idle()  # type: ignore[attr-defined]
        try:
            await lent.cursor.execute("SELECT current_setting('enable_seqscan'), current_setting('application_name')")
            assert await lent.cursor.fetchone() == ("off", "psy-face")
        finally:
            leases._executor._pools.current().give(lent, healthy=True)  # type: ignore[attr-defined]


@pytest.mark.postgres
def test_psycopg_pools_are_per_event_loop(pg_schema: tuple[str, str], psycopg_only: None) -> None:
    url, schema = pg_schema
    leases = SqlLeaseProvider(url, schema=schema)
    key = f"loops:{uuid.uuid4().hex}"

    async def job() -> bool:
        got = await leases.acquire_lease(key, "a", 10_000)
        return got.acquired and await leases.release_lease(key, "a")

    for _ in range(3):
        assert asyncio.run(job())
    asyncio.run(leases.close())


async def test_a_deadline_on_psycopg_is_kept_on_a_hanging_server(hanging_port: int, psycopg_only: None) -> None:
    async with SqlLeaseProvider(f"postgresql://u@127.0.0.1:{hanging_port}/db", operation_timeout_s=0.5) as leases:
        started = time.monotonic()
        with pytest.raises(LeaseBackendError, match=r"within 0\.5 s"):
            await leases.acquire_lease("k", "o", 1000)
        assert time.monotonic() - started < 2.0


@pytest.mark.postgres
async def test_a_statement_past_its_deadline_on_psycopg_raises_in_time(
    pg_schema: tuple[str, str], psycopg_only: None, key: str
) -> None:
    """A statement that hangs (its row locked by a transaction) is cut by the deadline; the
    operation does not wait for psycopg's cancel of the query."""
    import psycopg

    url, schema = pg_schema
    async with SqlLeaseProvider(url, schema=schema, operation_timeout_s=0.5) as leases:
        assert (await leases.acquire_lease(key, "a", 60_000)).acquired
        async with await psycopg.AsyncConnection.connect(url) as blocker:
            await blocker.execute(f'SELECT * FROM "{schema}".sql_leases WHERE key = %s FOR UPDATE', (key,))
            started = time.monotonic()
            with pytest.raises(LeaseBackendError, match=r"within 0\.5 s"):
                await leases.renew_lease(key, "a", 60_000)
            assert time.monotonic() - started < 1.5
            await blocker.rollback()
        assert await leases.renew_lease(key, "a", 60_000)  # a fresh connection serves the next call
        assert await leases.release_lease(key, "a")


@pytest.mark.postgres
async def test_configuration_errors_on_psycopg(pg_url: str, psycopg_only: None) -> None:
    base = pg_url.rsplit("/", 1)[0]
    async with SqlLeaseProvider(f"{base}/no_such_db_{uuid.uuid4().hex[:8]}") as leases:
        with pytest.raises(LeaseConfigError, match="does not exist"):
            await leases.get_lease("k")
    with pytest.raises(LeaseConfigError, match="nosuchparam"):
        SqlLeaseProvider(f"{pg_url}?nosuchparam=1")


COMMANDS = [
    ["migrate"],
    ["migrate", "--fences-only"],
    ["check"],
    ["list"],
    ["acquire", "{key}", "--owner", "me", "--ttl", "30s"],
    ["status", "{key}"],
    ["show", "{key}"],
    ["renew", "{key}", "--owner", "me", "--ttl", "30s"],
    ["transfer", "{key}", "--from", "me", "--to", "you", "--ttl", "30s"],
    ["release", "{key}", "--owner", "you"],
    ["acquire", "{key}", "--owner", "me", "--ttl", "30s"],
    ["break", "{key}", "--yes"],
    ["sweep"],
    ["exec", "{key}", "--", sys.executable, "-c", "print('ran')"],
]


def _in_one_process(hidden: list[str], commands: list[list[str]], cwd: Path) -> list[tuple[int, str, str]]:
    """``commands`` run one after another in one fresh process without the modules ``hidden``."""
    script = Path(__file__).resolve().parent / "support" / "cli_sequence.py"
    done = subprocess.run(
        [sys.executable, str(script), json.dumps(hidden), json.dumps(commands)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return [tuple(result) for result in json.loads(done.stdout)]  # type: ignore[misc]


@pytest.mark.postgres
def test_every_cli_command_runs_with_psycopg_alone(pg_url: str, fresh_pg_schema: str, tmp_path: Path) -> None:
    """Each command but exec in one process without asyncpg; exec in its own (its child needs a real one)."""
    key = f"cli:{uuid.uuid4().hex}"
    commands = [[part.format(key=key) for part in command] for command in COMMANDS]
    db = ["--url", pg_url, "--schema", fresh_pg_schema]
    results = _in_one_process(["asyncpg"], [[args[0], *db, *args[1:]] for args in commands[:-1]], tmp_path)
    for args, (code, out, err) in zip(commands, results, strict=False):
        assert code == 0, (args, out, err)
        assert "Traceback" not in err
    assert len(results) == len(commands) - 1
    exec_args = commands[-1]
    done = subprocess.run(
        [sys.executable, "-c", HIDE_ASYNCPG, exec_args[0], *db, *exec_args[1:]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, (exec_args, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    assert "ran" in done.stdout


def test_the_cli_without_any_postgres_driver_exits_78_naming_both_extras(tmp_path: Path) -> None:
    url = "postgresql://postgres@127.0.0.1:5432/test"
    commands = [["list", "--url", url], ["migrate", "--url", url], ["check", "--url", url]]
    results = _in_one_process(["asyncpg", "psycopg"], commands, tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", HIDE_BOTH, "exec", "--url", url, "k", "--", "true"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    results.append((done.returncode, done.stdout, done.stderr))
    assert len(results) == 4
    for command, (code, _out, err) in zip([*commands, ["exec"]], results, strict=True):
        assert code == 78, (command, err)
        assert "sql-lease[postgresql]" in err and "sql-lease[psycopg]" in err, (command, err)
        assert "Traceback" not in err, (command, err)


@pytest.mark.postgres
async def test_a_connection_that_died_idle_is_replaced_before_the_statement_is_sent(
    pg_url: str, fresh_pg_schema: str, psycopg_only: None, key: str
) -> None:
    """Issue 22 item 1: psycopg's async pool applies the one retry rule too (it had the retry
    budget but never found a connection dead): a pooled connection the server ended while it sat
    idle is replaced and the operation succeeds (before: ``LeaseBackendError``, AdminShutdown)."""
    import psycopg

    named = pg_url + ("&" if "?" in pg_url else "?") + "application_name=r2-retry-async"
    async with SqlLeaseProvider(named, schema=fresh_pg_schema, pool_size=2) as leases:
        await leases.migrate()
        assert (await leases.acquire_lease(key, "a", 10_000)).acquired
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as admin:
            cur = await admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = 'r2-retry-async' AND state = 'idle'"
            )
            row = await cur.fetchone()
            assert row is not None and row[0] >= 1
        await asyncio.sleep(0.2)  # the server's goodbye reaches the idle socket
        assert await leases.get_lease_owner(key) == "a"
        assert await leases.release_lease(key, "a")
