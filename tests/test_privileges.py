"""Least privilege on PostgreSQL (the README's grants are enough for every lease operation, and
not for migrations), and passwords that never leak into messages, logs or CLI output."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
import traceback
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from sql_lease import LeaseBackendError, LeaseConfigError, LeaseNotAcquiredError, SqlLeaseProvider, acquire_lease_wait

REPO = Path(__file__).resolve().parent.parent


async def execute(url: str, *statements: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(make_url(url).set(drivername="postgresql").render_as_string(hide_password=False))
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


@pytest.fixture
async def app_role(pg_url: str, fresh_pg_schema: str) -> AsyncIterator[tuple[str, str, str]]:
    """A login role with exactly the README's grants on a freshly migrated schema, and a second,
    empty schema it may use but not create in. Yields (role's URL, schema, empty schema)."""
    schema, empty = fresh_pg_schema, f"{fresh_pg_schema}_empty"
    role = f"lease_app_{uuid.uuid4().hex[:8]}"
    async with SqlLeaseProvider(pg_url, schema=schema) as admin:
        await admin.migrate()
    await execute(
        pg_url,
        f'CREATE ROLE "{role}" LOGIN',
        f'CREATE SCHEMA "{empty}"',
        f'GRANT USAGE ON SCHEMA "{schema}", "{empty}" TO "{role}"',
        f'GRANT SELECT, INSERT, UPDATE, DELETE ON "{schema}".sql_leases TO "{role}"',
        f'GRANT SELECT, INSERT, UPDATE, DELETE ON "{schema}".sql_leases_slots TO "{role}"',
        f'GRANT USAGE ON SEQUENCE "{schema}".sql_leases_fence_seq TO "{role}"',
    )
    try:
        yield make_url(pg_url).set(username=role).render_as_string(hide_password=False), schema, empty
    finally:
        await execute(
            pg_url,
            f'DROP SCHEMA IF EXISTS "{empty}" CASCADE',
            f'DROP OWNED BY "{role}"',
            f'DROP ROLE IF EXISTS "{role}"',
        )


@pytest.mark.postgres
async def test_the_readme_grants_are_enough_for_every_lease_operation(app_role: tuple[str, str, str], key: str) -> None:
    url, schema, _empty = app_role
    async with SqlLeaseProvider(url, schema=schema, operation_timeout_s=5) as leases:
        first = await leases.acquire_lease(key, "a", 60_000)
        assert first.acquired and first.fence is not None
        refused = await leases.acquire_lease(key, "b", 60_000)
        assert (refused.acquired, refused.owner, refused.fence) == (False, "a", first.fence)
        assert (await leases.acquire_lease(key, "a", 60_000)).fence == first.fence
        assert await leases.get_lease_owner(key) == "a"
        assert (await leases.get_lease(key)) is not None
        assert await leases.renew_lease(key, "a", 60_000)
        assert await leases.transfer_lease(key, "a", "b", 60_000)
        assert await leases.release_lease(key, "b")
        # expiry and the sweep (DELETE ... FOR UPDATE SKIP LOCKED needs no more than the grants)
        assert (await leases.acquire_lease(key, "short", 1)).acquired
        await asyncio.sleep(0.02)
        assert await leases.sweep_expired() >= 1
        # hold(), and waiting through LISTEN/NOTIFY (a refused waiting acquire marks has_waiters)
        async with leases.hold(key, "holder", ttl_ms=1500) as held:  # a TTL a loaded CI machine does not outrun
            await asyncio.sleep(1.8)
            assert not held.lost.is_set()

            waiter = asyncio.create_task(acquire_lease_wait(leases, key, "waiter", 5_000, timeout_s=0.1))
            with pytest.raises(LeaseNotAcquiredError):
                await waiter
        async with leases.hold(key, "second", ttl_ms=5_000) as second:
            waiting = asyncio.create_task(leases.acquire_lease_wait(key, "third", 5_000, timeout_s=5))
            await asyncio.sleep(0.3)
            assert not waiting.done()
        third = await waiting
        assert third.acquired and third.fence is not None and second.fence is not None and third.fence > second.fence
        # semaphores: the slot table's grants (migration 0006)
        assert await leases.release_lease(key, "third")
        slots = [await leases.acquire_lease(key, owner, 60_000, limit=2) for owner in ("s1", "s2", "s3")]
        assert [slot.acquired for slot in slots] == [True, True, False]
        assert [holder.owner for holder in await leases.get_lease_holders(key)] == ["s1", "s2"]
        assert await leases.renew_lease(key, "s1", 60_000) and await leases.transfer_lease(key, "s2", "s4", 60_000)
        assert await leases.release_lease(key, "s1") and await leases.break_lease(key) is not None
        assert (await leases.acquire_lease(key, "short", 1, limit=2)).acquired
        await asyncio.sleep(0.02)
        assert await leases.sweep_expired() >= 1


@pytest.mark.postgres
async def test_the_application_role_cannot_migrate(app_role: tuple[str, str, str]) -> None:
    url, schema, empty = app_role
    for target in (empty, schema):
        async with SqlLeaseProvider(url, schema=target, operation_timeout_s=10) as leases:
            with pytest.raises(LeaseConfigError, match="permission denied") as info:
                await leases.migrate()
            assert info.value.__cause__ is not None
            if target == schema:  # a migrated schema: the role could not even read which revision it is at
                assert "need not migrate" in str(info.value), info.value
                assert f"GRANT SELECT ON {schema}.sql_lease_alembic_version" in str(info.value), info.value
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        created = await conn.fetchval("SELECT count(*) FROM pg_tables WHERE schemaname = $1", empty)
    finally:
        await conn.close()
    assert created == 0


@pytest.mark.postgres
def test_check_names_a_missing_execute_on_the_slot_functions(
    app_role: tuple[str, str, str], pg_url: str, tmp_path: Path
) -> None:
    from tests.support.cli import invoke

    url, schema, _ = app_role
    role = make_url(url).username
    asyncio.run(execute(pg_url, f'GRANT SELECT ON "{schema}".sql_lease_alembic_version TO "{role}"'))
    granted = invoke(["check", "--url", url, "--schema", schema], tmp_path)
    assert granted.returncode == 0 and "EXECUTE on the slot functions" in granted.stdout, granted.stdout
    asyncio.run(
        execute(
            pg_url,
            f'REVOKE EXECUTE ON FUNCTION "{schema}".sql_leases_slot_acquire FROM PUBLIC',
            f'REVOKE EXECUTE ON FUNCTION "{schema}".sql_leases_slot_release FROM PUBLIC',
        )
    )
    revoked = invoke(["check", "--url", url, "--schema", schema], tmp_path)
    assert revoked.returncode == 78, revoked.stdout
    assert "lacks EXECUTE on function" in revoked.stdout and "sql_leases_slot_acquire" in revoked.stdout


# -- passwords -------------------------------------------------------------------------------------

PASSWORD = "S3cretPw"
ENCODED = "p%40ss%3Aw%2Frd-S3cretPw2"  # decoded: p@ss:w/rd-S3cretPw2
SECRETS = (PASSWORD, "S3cretPw2", "p@ss:w/rd", "p%40ss")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def assert_no_secret(text: str, where: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"password {secret!r} leaked into {where}: {text[:500]}"


def everything_about(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)) + repr(exc) + repr(exc.__cause__)


def urls() -> list[str]:
    port = closed_port()
    return [
        f"postgresql://lease_user:{PASSWORD}@127.0.0.1:{port}/db",
        f"postgresql+asyncpg://lease_user:{ENCODED}@127.0.0.1:{port}/db",
        f"postgres://lease_user:{PASSWORD}@127.0.0.1:{port}/db?application_name=x",
    ]


@pytest.mark.parametrize("url", urls(), ids=["plain", "encoded", "postgres-scheme"])  # ids: the port varies
async def test_password_never_in_exceptions_repr_or_logs(url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with SqlLeaseProvider(url, operation_timeout_s=3) as leases:
        assert_no_secret(repr(leases), "repr(provider)")
        assert_no_secret(str(leases.safe_url), "safe_url")
        assert_no_secret(repr(leases.engine.url), "repr(engine.url)")
        for call in (
            leases.acquire_lease("k", "o", 1000),
            leases.get_lease_owner("k"),
            leases.get_lease("k"),
            leases.release_lease("k", "o"),
            leases.renew_lease("k", "o", 1000),
            leases.transfer_lease("k", "o", "p", 1000),
            leases.sweep_expired(),
            leases.migrate(),
            leases.acquire_lease_wait("k", "o", 1000, timeout_s=0.2),
        ):
            with pytest.raises(LeaseBackendError) as info:
                await call
            assert_no_secret(everything_about(info.value), "an exception")
        with pytest.raises(LeaseBackendError) as info:
            async with leases.hold("k", "o", ttl_ms=1000):
                pass
        assert_no_secret(everything_about(info.value), "hold()'s exception")
    assert caplog.records is not None
    assert_no_secret(caplog.text, "the log")
    assert_no_secret("".join(str(r.__dict__) for r in caplog.records), "log records")


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql//lease_user:{PASSWORD}@127.0.0.1:5432/db",  # a typo: no colon after the scheme
        f"host=127.0.0.1 user=lease_user password={PASSWORD}",  # a libpq keyword DSN, not a URL
        f"postgresql://lease_user:{PASSWORD}@127.0.0.1:notaport/db",
        f"mysql+mysqlconnector://lease_user:{PASSWORD}@127.0.0.1/db",
        f"postgresql+pg8000://lease_user:{PASSWORD}@127.0.0.1/db",
        f"sqlite://lease_user:{PASSWORD}@somehost/db",
    ],
    ids=["missing-colon", "keyword-dsn", "bad-port", "mysql", "pg8000", "sqlite-host"],
)
def test_password_never_in_errors_about_a_malformed_url(url: str) -> None:
    with pytest.raises((ValueError, TypeError)) as info:
        SqlLeaseProvider(url)
    assert_no_secret(everything_about(info.value), "the error about a malformed URL")


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sql_lease", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(
    "url",
    [*urls()[:2], f"postgresql//lease_user:{PASSWORD}@127.0.0.1:5432/db"],
    ids=["plain", "encoded", "malformed"],
)
def test_password_never_in_cli_output(url: str) -> None:
    runs = {
        "exec": run_cli("exec", "k", "--url", url, "--", "true"),
        "exec --wait": run_cli("exec", "k", "--url", url, "--wait", "--timeout", "1s", "--", "true"),
        "status": run_cli("status", "k", "--url", url),
        "migrate": run_cli("migrate", "--url", url),
        "sweep": run_cli("sweep", "--url", url),
        "status via $SQL_LEASE_URL": run_cli("status", "k", env={"SQL_LEASE_URL": url}),
        "migrate via $SQL_LEASE_URL": run_cli("migrate", env={"SQL_LEASE_URL": url}),
    }
    for name, result in runs.items():
        assert result.returncode != 0, (name, result)
        assert_no_secret(result.stdout + result.stderr, f"the output of `sql-lease {name}`")
        assert result.stdout + result.stderr, f"`sql-lease {name}` failed without saying why"
    # the SQL script for a DBA needs no connection; its output names no password either
    script = run_cli("migrate", "--url", url, "--sql")
    assert_no_secret(script.stdout + script.stderr, "`sql-lease migrate --sql`")


@pytest.mark.postgres
async def test_password_never_in_the_logs_of_a_hold_that_loses_its_database(
    pg_schema: tuple[str, str], key: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A held lease whose database goes silent logs retries, the loss and the failed release
    (each with the error); none of it names the password. (Trust auth ignores the password.)"""
    from sql_lease import LeaseLostError
    from tests.support.tcp_proxy import TcpProxy

    caplog.set_level(logging.DEBUG)
    url, schema = pg_schema
    target = make_url(url)
    async with TcpProxy(target.host or "127.0.0.1", target.port or 5432) as proxy:
        secret_url = target.set(host="127.0.0.1", port=proxy.port, password=PASSWORD)
        async with SqlLeaseProvider(secret_url, schema=schema, operation_timeout_s=0.3) as leases:
            with pytest.raises(LeaseLostError) as info:
                async with leases.hold(key, "o", ttl_ms=1_500):
                    proxy.stall()
                    await asyncio.sleep(10)
            assert_no_secret(everything_about(info.value), "LeaseLostError")
            proxy.resume()
    messages = [r.getMessage() for r in caplog.records]
    assert any("lost" in m for m in messages) and any("failed" in m for m in messages), messages
    assert_no_secret(caplog.text, "the log")
    assert_no_secret("".join(str(r.__dict__) for r in caplog.records), "log records")
