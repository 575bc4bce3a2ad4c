"""Multi-host URLs: libpq's ``h1:p1,h2:p2`` list and SQLAlchemy's ``?host=h1:p1&host=h2:p2`` form,
parsed for both faces and their drivers, shown without the password, and used against a real server
behind a host that refuses connections (the failover cluster's own tests: tests/test_failover.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from sql_lease import SqlLeaseProvider, SyncSqlLeaseProvider
from sql_lease.sql.sync_executors import psycopg_conninfo
from sql_lease.sql.urls import hosts_and_ports, safe_url, to_async_url, to_sync_url
from tests.conftest import run_in_own_loop

REPO = Path(__file__).resolve().parent.parent
SECRET = "s3cr3t-Pw"
LIBPQ = f"postgresql://app:{SECRET}@db1.example:5432,db2.example:5433/leases?target_session_attrs=read-write"
SQLALCHEMY = (
    f"postgresql://app:{SECRET}@/leases?host=db1.example:5432&host=db2.example:5433&target_session_attrs=read-write"
)
COMMA_LISTS = f"postgresql://app:{SECRET}@/leases?host=db1.example,db2.example&port=5432,5433"
IPV6_LISTS = f"postgresql://app:{SECRET}@/leases?host=::1,fe80::2&port=5432,5433"


def asyncpg_args(url: str) -> dict[str, object]:
    parsed = to_async_url(url)
    return dict(parsed.get_dialect()().create_connect_args(parsed)[1])


@pytest.mark.parametrize("url", [LIBPQ, SQLALCHEMY, COMMA_LISTS, LIBPQ.replace("postgresql://", "postgres://")])
def test_every_multihost_form_reaches_both_drivers_with_every_host(url: str) -> None:
    args = asyncpg_args(url)
    assert (args["host"], args["port"]) == (["db1.example", "db2.example"], [5432, 5433])
    assert (args["database"], args["user"], args["password"]) == ("leases", "app", SECRET)
    conninfo = psycopg_conninfo(to_sync_url(url))
    assert "host=db1.example,db2.example" in conninfo.split()
    assert "port=5432,5433" in conninfo.split()
    if "target_session_attrs" in url:
        assert args["target_session_attrs"] == "read-write"
        assert "target_session_attrs=read-write" in conninfo.split()


def test_ipv6_hosts_go_as_lists() -> None:
    args = asyncpg_args(IPV6_LISTS)
    assert (args["host"], args["port"]) == (["::1", "fe80::2"], [5432, 5433])
    assert "host=::1,fe80::2" in psycopg_conninfo(to_sync_url(IPV6_LISTS)).split()


def test_the_libpq_form_becomes_the_sqlalchemy_form() -> None:
    assert to_async_url(LIBPQ) == to_async_url(SQLALCHEMY)
    assert to_sync_url(LIBPQ) == to_sync_url(SQLALCHEMY)
    assert to_async_url(LIBPQ).drivername == "postgresql+asyncpg"
    assert to_sync_url(LIBPQ).drivername == "postgresql+psycopg"


def test_a_host_without_a_port_gets_libpq_s_default() -> None:
    args = asyncpg_args("postgresql://app@db1.example,db2.example:6543/leases")
    assert (args["host"], args["port"]) == (["db1.example", "db2.example"], [5432, 6543])
    assert hosts_and_ports(to_sync_url("postgresql://app@db1,db2/x")) == ("db1,db2", "5432,5432")


def test_one_host_urls_are_unchanged() -> None:
    url = f"postgresql://app:{SECRET}@db1.example:5432/leases?sslmode=require"
    assert to_async_url(url) == make_url(url).set(drivername="postgresql+asyncpg")
    assert hosts_and_ports(to_sync_url(url)) == ("db1.example", "5432")
    assert hosts_and_ports(to_sync_url("postgresql:///leases")) == (None, None)
    assert hosts_and_ports(to_sync_url("postgresql:///leases?host=/run/postgresql")) == ("/run/postgresql", None)


@pytest.mark.parametrize("url", [LIBPQ, SQLALCHEMY, COMMA_LISTS])
def test_the_password_is_never_shown(url: str) -> None:
    for shown in (safe_url(url), safe_url(to_async_url(url)), repr(SqlLeaseProvider(url))):
        assert SECRET not in shown
        assert "db1.example" in shown and "db2.example" in shown


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://app:{SECRET}@db1:5432,db2:x/leases",
        f"postgresql://app:{SECRET}@db1:5432,/leases",
        f"postgresql://app:{SECRET}@[::1]:5432,db2:5432/leases",
        f"postgresql://app:{SECRET}@db1:5432,db2:5432/leases?port=5433",
        f"postgresql://app:{SECRET}@db1:5432,db2:5432/leases?host=db3",
    ],
)
def test_an_unreadable_host_list_is_refused_without_echoing_the_url(url: str) -> None:
    for parse in (to_async_url, to_sync_url, SqlLeaseProvider, SyncSqlLeaseProvider):
        with pytest.raises(ValueError) as info:
            parse(url)
        assert SECRET not in str(info.value)
    assert SECRET not in safe_url(url)


def test_a_comma_in_a_password_is_not_a_host_list() -> None:
    url = "postgresql://app:pa,ss@db1.example:5432/leases"
    assert to_async_url(url).password == "pa,ss"
    assert to_async_url(url).host == "db1.example"


def _refusing_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again: connecting is refused


def _behind_a_dead_host(pg_url: str, form: str) -> str:
    """``pg_url`` with a host that refuses connections listed before the real one."""
    real = make_url(pg_url)
    hosts = [f"127.0.0.1:{_refusing_port()}", f"{real.host}:{real.port or 5432}"]
    user = real.username + (f":{real.password}" if real.password else "")
    if form == "libpq":
        return f"postgresql://{user}@{','.join(hosts)}/{real.database}?target_session_attrs=read-write"
    query = "&".join(f"host={host}" for host in hosts)
    return f"postgresql://{user}@/{real.database}?{query}&target_session_attrs=read-write"


@pytest.mark.postgres
@pytest.mark.parametrize("form", ["libpq", "sqlalchemy"])
def test_both_faces_and_the_cli_skip_a_dead_host(pg_url: str, fresh_pg_schema: str, form: str) -> None:
    url = _behind_a_dead_host(pg_url, form)
    key = f"multihost:{uuid.uuid4().hex[:8]}"
    migrated = subprocess.run(
        [sys.executable, "-m", "sql_lease", "migrate", "--url", url, "--schema", fresh_pg_schema],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert migrated.returncode == 0, migrated.stderr

    async def acquire() -> bool:
        async with SqlLeaseProvider(url, schema=fresh_pg_schema) as provider:
            return (await provider.acquire_lease(key, "async-owner", 30_000)).acquired

    assert run_in_own_loop(acquire)
    with SyncSqlLeaseProvider(url, schema=fresh_pg_schema) as sync_provider:
        assert sync_provider.migrate()  # the revision in place, reached through SQLAlchemy's psycopg dialect
        assert sync_provider.get_lease_owner(key) == "async-owner"
        assert sync_provider.release_lease(key, "async-owner")
        assert sync_provider.acquire_lease(key, "sync-owner", 30_000).acquired
    status = subprocess.run(
        [sys.executable, "-m", "sql_lease", "status", key, "--url", url, "--schema", fresh_pg_schema],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert status.returncode == 0, status.stderr
    assert "sync-owner" in status.stdout
