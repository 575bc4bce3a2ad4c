"""Issue 20 item 12: libpq's URL parameters (what ``sql_lease_url_from_django`` emits) work on the
async face and in every CLI command, mapped for asyncpg; an unknown one, or a port that is not a
number, is a configuration error naming it (CLI exit 78, one line, no traceback)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest

from sql_lease import SqlLeaseProvider
from sql_lease.errors import LeaseConfigError
from sql_lease.sql.urls import to_async_url

CLI = [sys.executable, "-m", "sql_lease"]
LIBPQ = "sslmode=prefer&application_name=lease-app-7&connect_timeout=5&options=" + quote(
    "-c statement_timeout=4321 -c lock_timeout=1234"
)


@pytest.mark.postgres
async def test_libpq_parameters_reach_asyncpg(pg_schema: tuple[str, str], key: str) -> None:
    url, schema = pg_schema
    async with SqlLeaseProvider(f"{url}?{LIBPQ}", schema=schema) as leases:
        assert (await leases.acquire_lease(key, "a", 10_000)).acquired
        async with SqlLeaseProvider(url, schema=schema) as other:
            assert not (await other.acquire_lease(key, "b", 10_000)).acquired
        # the provider's idle pooled connection carries the settings
        import asyncpg

        conn = await asyncpg.connect(url)
        try:
            rows = await conn.fetch("SELECT pid FROM pg_stat_activity WHERE application_name = 'lease-app-7'")
            assert rows, "application_name did not reach the server"
        finally:
            await conn.close()
        executor = leases._executor
        own = executor._connections.take_idle()  # type: ignore[attr-defined]
        try:
            assert await own.fetchval("SHOW statement_timeout") == "4321ms"
            assert await own.fetchval("SHOW lock_timeout") == "1234ms"
        finally:
            executor._connections.give(own, healthy=True)  # type: ignore[attr-defined]
        assert await leases.release_lease(key, "a")
        assert await leases.migrate()  # the migrating engine takes them too


@pytest.mark.postgres
@pytest.mark.parametrize(
    "command",
    [["list"], ["check"], ["migrate"], ["migrate", "--fences-only"], ["status", "k"], ["exec", "k", "--", "true"]],
)
def test_every_cli_command_takes_libpq_parameters(pg_url: str, command: list[str], tmp_path: Path) -> None:
    done = subprocess.run(
        [*CLI, command[0], "--url", f"{pg_url}?{LIBPQ}", *command[1:]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode in (0, 1), done.stderr  # status: 1 when the key is free
    assert "Traceback" not in done.stderr


BAD = [
    ("?sslmod=require", "sslmod"),
    ("?sslmode=sometimes", "sslmode"),
    ("?connect_timeout=soon", "connect_timeout"),
    ("?options=-x", "options"),
    ("?host=127.0.0.1:abc", "port"),
    ("?port=abc", "port"),
    ("?host=127.0.0.1&port=99999", "port"),
]


@pytest.mark.parametrize(("query", "named"), BAD)
def test_a_bad_parameter_is_a_configuration_error_naming_it(query: str, named: str) -> None:
    with pytest.raises(LeaseConfigError, match=named) as raised:
        SqlLeaseProvider(f"postgresql://u:hunter2@127.0.0.1/db{query}")
    assert isinstance(raised.value, ValueError)
    assert "hunter2" not in str(raised.value)


@pytest.mark.parametrize(("query", "named"), BAD)
def test_the_cli_exits_78_for_a_bad_parameter(query: str, named: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [*CLI, "list", "--url", f"postgresql://u:hunter2@127.0.0.1/db{query}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 78, done.stderr
    assert named in done.stderr and "Traceback" not in done.stderr and "hunter2" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_multihost_url_may_have_an_at_sign_in_a_query_value() -> None:
    url = to_async_url("postgresql://u:pw@h1:5432,h2:5433/db?application_name=me@box")
    assert url.query["host"] == ("h1:5432", "h2:5433") or sorted(url.query["host"]) == ["h1:5432", "h2:5433"]
    assert url.query["application_name"] == "me@box"
    assert url.password == "pw"


MYSQL_BAD = [
    ("?foo=bar", "'foo'"),
    ("?ssl=true", "ssl_ca"),
    ("?ssl_disabled=true", "'ssl_disabled'"),
    ("?connect_timeout=soon", "connect_timeout"),
    ("?ssl_check_hostname=maybe", "ssl_check_hostname"),
]


@pytest.mark.parametrize(("query", "named"), MYSQL_BAD)
def test_a_bad_mysql_parameter_is_a_configuration_error_naming_it_on_both_faces(query: str, named: str) -> None:
    """Before, the driver met it at the first connect: a ``TypeError`` wrapped as
    ``LeaseBackendError`` (CLI exit 69, "unreachable")."""
    from sql_lease import SyncSqlLeaseProvider

    for face in (SqlLeaseProvider, SyncSqlLeaseProvider):
        with pytest.raises(LeaseConfigError, match=named) as raised:
            face(f"mysql://u:hunter2@127.0.0.1/db{query}")
        assert isinstance(raised.value, ValueError)
        assert "hunter2" not in str(raised.value)


def test_the_cli_exits_78_for_a_bad_mysql_parameter(tmp_path: Path) -> None:
    done = subprocess.run(
        [*CLI, "list", "--url", "mysql://u:hunter2@127.0.0.1:9/db?ssl=true"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 78, done.stderr
    assert "ssl_ca" in done.stderr and "Traceback" not in done.stderr and "hunter2" not in done.stderr


@pytest.mark.mysql
async def test_mysql_parameters_the_drivers_take_reach_them(mysql_db: tuple[str, str], key: str) -> None:
    from sql_lease import SyncSqlLeaseProvider

    url, database = mysql_db
    query = "?charset=utf8mb4&connect_timeout=5&read_timeout=30&program_name=leases"
    async with SqlLeaseProvider(url + query, schema=database) as leases:
        assert (await leases.acquire_lease(key, "a", 10_000)).acquired
    with SyncSqlLeaseProvider(url + query, schema=database) as sync_leases:
        assert sync_leases.get_lease_owner(key) == "a"
