"""Configuration that never leaks state or secrets (issue 9, items 5, 8, 9 and 10): migrations that
run only when needed and leave no files behind, one migration state per lease table, URLs that
never show a credential, and SQLite paths, timeouts and pools that are checked up front."""

from __future__ import annotations

import asyncio
import math
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sql_lease import SchemaMissingError, SqlLeaseProvider
from sql_lease.cli import cli
from sql_lease.errors import LeaseBackendError
from sql_lease.sql.migrate import HEAD_REVISION
from sql_lease.sql.schema import DEFAULT_VERSION_TABLE, LeaseTableNames
from tests.conftest import run_in_own_loop

CLI = [sys.executable, "-m", "sql_lease"]
SECRET = "hunter2-Zq9"


def run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def invoke(args: list[str]) -> Any:
    """Run the CLI in this process (no running event loop allowed)."""
    return CliRunner().invoke(cli, args, catch_exceptions=False)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """A database URL and schema no other test uses, with the CLI options that name them."""
    if request.param == "sqlite":
        return {"url": f"sqlite:///{tmp_path}/c.db", "schema": None, "args": ["--url", f"sqlite:///{tmp_path}/c.db"]}
    url, schema = request.getfixturevalue("pg_url"), request.getfixturevalue("fresh_pg_schema")
    return {"url": url, "schema": schema, "args": ["--url", url, "--schema", schema]}


# -- item 5: migrate only when needed, and no lock files --------------------------------------


async def test_migrate_leaves_no_lock_file_next_to_the_database_or_in_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    for url in ("sqlite:///relative.db", f"sqlite:///{tmp_path}/data/absolute.db"):
        async with SqlLeaseProvider(url) as provider:
            assert await provider.migrate() == HEAD_REVISION
            assert (await provider.acquire_lease("k", "o", 1000)).acquired
    assert sorted(os.listdir(tmp_path)) == ["data", "relative.db"]
    assert sorted(os.listdir(tmp_path / "data")) == ["absolute.db"]


async def test_migrating_an_up_to_date_database_does_not_run_alembic(
    target: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from alembic import command

    calls: list[str] = []
    real_upgrade = command.upgrade

    def counting_upgrade(*args: Any, **kwargs: Any) -> Any:
        calls.append("upgrade")
        return real_upgrade(*args, **kwargs)

    monkeypatch.setattr(command, "upgrade", counting_upgrade)
    async with SqlLeaseProvider(target["url"], schema=target["schema"]) as provider:
        assert await provider.migrate() == HEAD_REVISION
    assert calls == ["upgrade"]
    for i in range(2):
        async with SqlLeaseProvider(target["url"], schema=target["schema"]) as provider:
            assert await provider.migrate() == HEAD_REVISION
            assert (await provider.acquire_lease(f"k{i}", "o", 1000)).acquired
    assert calls == ["upgrade"]


def test_exec_on_sqlite_leaves_no_lock_file(tmp_path: Path) -> None:
    for _ in range(2):
        done = run_cli(["exec", "k", "--", "true"], tmp_path)
        assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sql_lease.db"]


# -- item 8: one migration state per lease table ----------------------------------------------


def test_migrate_another_table_after_the_default_one_creates_it(target: dict[str, Any]) -> None:
    """Regression: the version table was shared, so `migrate --table T` found it at head, reported
    success and created nothing."""
    done = invoke(["migrate", *target["args"]])
    assert done.exit_code == 0, done.output
    done = invoke(["migrate", *target["args"], "--table", "other_leases"])
    assert done.exit_code == 0, done.output

    async def use() -> bool:
        async with SqlLeaseProvider(target["url"], schema=target["schema"], table_name="other_leases") as provider:
            return (await provider.acquire_lease("k", "o", 1000)).acquired

    assert run_in_own_loop(use)


@pytest.mark.parametrize(
    "options",
    [
        {"table_name": "job_leases"},
        {"table_name": "job_leases", "version_table": "job_schema_v"},
        {"table_name": "job_leases", "version_table": DEFAULT_VERSION_TABLE},
    ],
    ids=["table", "own-version-table", "shared-version-table"],
)
def test_the_schema_missing_hint_works_verbatim(target: dict[str, Any], options: dict[str, str]) -> None:
    """The command that SchemaMissingError names, run as it stands (with the URL filled in),
    creates what the provider needs, even when the default table was migrated before."""
    assert invoke(["migrate", *target["args"]]).exit_code == 0

    async def operate() -> Any:
        async with SqlLeaseProvider(target["url"], schema=target["schema"], **options) as provider:
            try:
                return await provider.acquire_lease("k", "o", 1000)
            except SchemaMissingError as exc:
                return exc

    missing = run_in_own_loop(operate)
    assert isinstance(missing, SchemaMissingError), missing
    command = re.search(r"`(sql-lease migrate [^`]*)`", str(missing))
    assert command, str(missing)
    args = shlex.split(command.group(1))[1:]
    args[args.index("URL")] = target["url"]
    done = invoke(args)
    assert done.exit_code == 0, done.output
    result = run_in_own_loop(operate)
    assert not isinstance(result, Exception) and result.acquired


def test_derived_version_tables() -> None:
    assert LeaseTableNames().version_table == DEFAULT_VERSION_TABLE == "sql_lease_alembic_version"
    assert LeaseTableNames("jobs").version_table == "jobs_alembic_version"
    assert LeaseTableNames("jobs", version_table="mine").version_table == "mine"
    assert LeaseTableNames("sql_leases", version_table=None).version_table == DEFAULT_VERSION_TABLE


POSTGRES_LIMIT = 63


def _derived_names(names: LeaseTableNames) -> list[str]:
    """Every name PostgreSQL gives an object of this lease table."""
    return [
        names.table,
        names.fence_sequence,
        names.expires_at_index,
        f"{names.table}_pkey",
        names.version_table,
        f"{names.version_table}_pkc",
    ]


@pytest.mark.parametrize("length", [44, 47, 49, 50, 51, 52, 53])
def test_table_names_whose_derived_names_are_too_long_are_refused(length: int) -> None:
    table = "t" * length
    with pytest.raises(ValueError, match="table_name"):
        LeaseTableNames(table)
    with pytest.raises(ValueError, match="table_name"):
        SqlLeaseProvider(f"postgresql://u:{SECRET}@127.0.0.1:{closed_port()}/db", table_name=table)
    if length >= 50:
        with pytest.raises(ValueError, match="table_name"):
            LeaseTableNames(table, version_table="short_v")


def test_every_accepted_name_fits_postgres() -> None:
    for length in range(1, 60):
        for version_table in (None, "v" * 59, "short_v"):
            try:
                names = LeaseTableNames("t" * length, version_table=version_table)
            except ValueError:
                continue
            assert max(len(n) for n in _derived_names(names)) <= POSTGRES_LIMIT, names
    with pytest.raises(ValueError, match="version_table"):
        LeaseTableNames("t", version_table="v" * 60)  # its primary key "<version_table>_pkc" would not fit


@pytest.mark.parametrize(("length", "version_table"), [(43, None), (49, "v" * 59)])
async def test_the_longest_accepted_table_names_migrate(
    target: dict[str, Any], length: int, version_table: str | None
) -> None:
    from sqlalchemy import inspect

    table = "L" * length
    async with SqlLeaseProvider(
        target["url"], schema=target["schema"], table_name=table, version_table=version_table
    ) as provider:
        assert await provider.migrate() == HEAD_REVISION
        assert await provider.migrate() == HEAD_REVISION
        assert (await provider.acquire_lease("k", "o", 1000)).acquired

        def indexes(connection: Any) -> set[str]:
            return {i["name"] for i in inspect(connection).get_indexes(table, schema=target["schema"])}

        async with provider._base_engine.connect() as conn:
            assert await conn.run_sync(indexes) == {provider.names.expires_at_index}


async def test_a_table_migrated_under_the_shared_version_table_is_adopted(target: dict[str, Any]) -> None:
    """A deployment of the previous release migrated table T with the shared version table; the
    next `migrate --table T` takes T's state over instead of failing on CREATE TABLE."""
    from sql_lease.sql.migrate import upgrade_engine

    async with SqlLeaseProvider(target["url"], schema=target["schema"], table_name="legacy") as provider:
        legacy = LeaseTableNames("legacy", target["schema"], DEFAULT_VERSION_TABLE)
        assert await upgrade_engine(provider._base_engine, legacy) == HEAD_REVISION
        assert (await provider.acquire_lease("k", "o", 60_000)).acquired
        assert await provider.migrate() == HEAD_REVISION
        assert (await provider.get_lease("k")) is not None  # the same table, not a new one


# -- item 9: no credential in any output --------------------------------------------------------

MASKED_FORMS = [
    (f"postgresql://u:{SECRET}@db.example:5432/app", "postgresql://u:***@db.example:5432/app"),
    (f"postgresql://u@db.example/app?password={SECRET}", "postgresql://u@db.example/app?password=***"),
    (
        f"postgresql://u@db.example/app?application_name=x&password={SECRET}&sslmode=require",
        "postgresql://u@db.example/app?application_name=x&password=***&sslmode=require",
    ),
    (
        f"postgresql://u@db.example/app?sslpassword={SECRET}&sslkey=/etc/k.pem",
        "postgresql://u@db.example/app?sslpassword=***&sslkey=/etc/k.pem",
    ),
    (f"postgresql://u@db.example/app?PASSWORD={SECRET}", "postgresql://u@db.example/app?PASSWORD=***"),
    (f"postgresql://u@db.example/app?api_token={SECRET}", "postgresql://u@db.example/app?api_token=***"),
    (f"postgresql://u@db.example/app?client_secret={SECRET}", "postgresql://u@db.example/app?client_secret=***"),
    (
        f"postgresql://u@db.example/app?password={SECRET}&password=x",
        "postgresql://u@db.example/app?password=***&password=***",
    ),
    ("postgresql://u:hunter%402-Zq9@db.example/app", "postgresql://u:***@db.example/app"),
    (f"postgresql+asyncpg://u:{SECRET}@db.example/app", "postgresql+asyncpg://u:***@db.example/app"),
    ("sqlite:////tmp/a@b/my leases.db", "sqlite:////tmp/a@b/my leases.db"),
    ("sqlite:///relative/x.db", "sqlite:///relative/x.db"),
    ("sqlite+aiosqlite:///x.db?timeout=3", "sqlite+aiosqlite:///x.db?timeout=3"),
]


@pytest.mark.parametrize(("url", "shown"), MASKED_FORMS)
def test_safe_url_masks_every_credential(url: str, shown: str) -> None:
    from sqlalchemy.engine import make_url

    from sql_lease.sql.urls import safe_url

    assert safe_url(url) == shown
    assert safe_url(make_url(url)) == shown
    for secret in (SECRET, "hunter", "Zq9"):
        assert secret not in safe_url(url)


AMBIGUOUS = [
    "postgresql://u:hunter@2-Zq9@db.example/app",
    "postgresql://u:hunter@2-Zq9@db.example:5432/app",
    "postgresql://u:hunter@2:Zq9@db.example/app",
    "postgresql://u:hunter@2:Zq9@db.example:5432/app",
    "postgresql://u:hunter@/2-Zq9@db.example/app",
    "postgresql://u:hunter?2@Zq9@db.example/app",
    "postgresql://u:hunter@?2-Zq9@db.example",
]


@pytest.mark.parametrize("url", AMBIGUOUS)
def test_an_unencoded_at_sign_is_refused_without_echoing_the_url(url: str) -> None:
    from sql_lease.sql.urls import safe_url, to_async_url

    with pytest.raises(ValueError, match="%40") as info:
        to_async_url(url)
    with pytest.raises(ValueError, match="%40") as info2:
        SqlLeaseProvider(url)
    shown = safe_url(url)
    for text in (str(info.value), str(info2.value), shown):
        for part in ("hunter", "Zq9"):
            assert part not in text, text


def test_an_at_sign_in_the_user_name() -> None:
    from sql_lease.sql.urls import safe_url, to_async_url

    for url in (f"postgresql://me%40corp:{SECRET}@db.example/app", f"postgresql://me@corp:{SECRET}@db.example/app"):
        parsed = to_async_url(url)
        assert (parsed.username, parsed.password, parsed.host) == ("me@corp", SECRET, "db.example")
        assert SECRET not in safe_url(url)


def test_a_repeated_password_parameter_is_refused_without_echoing_it() -> None:
    with pytest.raises(ValueError, match="more than once") as info:
        SqlLeaseProvider(f"postgresql://u@db.example/app?password={SECRET}&password=x")
    assert SECRET not in str(info.value)


def test_provider_move_a_query_password_out_of_the_engine_url() -> None:
    provider = SqlLeaseProvider(f"postgresql://u@db.example/app?password={SECRET}&application_name=x")
    assert SECRET not in repr(provider)
    assert SECRET not in provider.safe_url
    assert SECRET not in repr(provider.engine.url)
    assert provider.engine.url.password == SECRET  # still given to the driver
    assert "password" not in provider.engine.url.query


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://u@127.0.0.1:{{port}}/db?password={SECRET}",
        f"postgresql://u@127.0.0.1:{{port}}/db?application_name=x&password={SECRET}",
        f"postgresql://u:{SECRET}@127.0.0.1:{{port}}/db",
    ],
)
async def test_backend_errors_and_repr_never_show_a_query_password(url: str) -> None:
    async with SqlLeaseProvider(url.format(port=closed_port()), operation_timeout_s=5) as provider:
        assert SECRET not in repr(provider)
        with pytest.raises(LeaseBackendError) as info:
            await provider.get_lease("k")
        assert SECRET not in str(info.value)
        with pytest.raises(LeaseBackendError) as info:
            await provider.migrate()
        assert SECRET not in str(info.value)


def test_migrate_command_never_shows_a_query_password(tmp_path: Path) -> None:
    url = f"postgresql://u@127.0.0.1:{closed_port()}/db?password={SECRET}"
    done = run_cli(["migrate", "--url", url], tmp_path)
    assert done.returncode == 69, done.stderr
    assert SECRET not in done.stdout + done.stderr
    assert "u@127.0.0.1" in done.stderr and "password=***" in done.stderr  # as given, masked
    done = run_cli(["migrate", "--url", "postgresql://u:hunter@2-Zq9@127.0.0.1/db"], tmp_path)
    assert done.returncode == 78 and "%40" in done.stderr, done.stderr
    assert "hunter" not in done.stderr and "Zq9" not in done.stderr and "Traceback" not in done.stderr


@pytest.mark.postgres
def test_migrate_command_output_masks_a_query_password(pg_url: str, fresh_pg_schema: str) -> None:
    url = f"{pg_url}?password={SECRET}" if "?" not in pg_url else f"{pg_url}&password={SECRET}"
    done = invoke(["migrate", "--url", url, "--schema", fresh_pg_schema])
    assert done.exit_code == 0, done.output
    assert f"revision {HEAD_REVISION}" in done.output and SECRET not in done.output and "password=***" in done.output


# -- item 10: SQLite paths, busy timeout and pool -------------------------------------------


async def test_a_sqlite_path_in_a_missing_directory_is_refused(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "dir"
    with pytest.raises(ValueError, match=re.escape(str(missing))):
        SqlLeaseProvider(f"sqlite:///{missing}/x.db")
    assert not (tmp_path / "no").exists()


def test_the_cli_never_creates_a_missing_directory(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/no/such/dir/x.db"
    for args in (["migrate", "--url", url], ["exec", "k", "--url", url, "--", "true"], ["status", "k", "--url", url]):
        done = run_cli(args, tmp_path)
        assert done.returncode == 78, (args, done.stderr)
        assert "does not exist" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


async def test_operations_on_a_missing_sqlite_file_do_not_create_it(tmp_path: Path) -> None:
    db = tmp_path / "missing.db"
    async with SqlLeaseProvider(f"sqlite:///{db}") as provider:
        for call in (provider.get_lease("k"), provider.acquire_lease("k", "o", 1000), provider.sweep_expired()):
            with pytest.raises(SchemaMissingError, match="sql-lease migrate"):
                await call
        assert os.listdir(tmp_path) == []
        assert await provider.migrate() == HEAD_REVISION
        assert (await provider.acquire_lease("k", "o", 1000)).acquired


def test_status_and_sweep_on_a_missing_sqlite_file_leave_no_file(tmp_path: Path) -> None:
    for args in (["status", "k"], ["sweep"], ["status", "k", "--url", "sqlite:///other.db"]):
        done = run_cli(args, tmp_path)
        assert done.returncode == 78 and "sql-lease migrate" in done.stderr, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, TypeError),
        ("5000", TypeError),
        (None, None),
        (-1, ValueError),
        (2**31, ValueError),
        (10**12, ValueError),
        (math.inf, ValueError),
        (-math.inf, ValueError),
        (math.nan, ValueError),
    ],
)
def test_sqlite_busy_timeout_is_validated(tmp_path: Path, value: Any, expected: type[Exception] | None) -> None:
    url = f"sqlite:///{tmp_path}/x.db"
    if expected is None:
        SqlLeaseProvider(url, sqlite_busy_timeout_ms=value)
        return
    with pytest.raises(expected, match="sqlite_busy_timeout_ms"):
        SqlLeaseProvider(url, sqlite_busy_timeout_ms=value)


def test_sqlite_busy_timeout_is_refused_for_postgres() -> None:
    with pytest.raises(ValueError, match="only for SQLite"):
        SqlLeaseProvider("postgresql://u@db.example/app", sqlite_busy_timeout_ms=1000)


@pytest.mark.parametrize(("value", "expected"), [(86_401, ValueError), (25 * 86_400, ValueError), (1e300, ValueError)])
def test_operation_timeout_has_an_upper_bound(tmp_path: Path, value: Any, expected: type[Exception]) -> None:
    with pytest.raises(expected, match="operation_timeout_s"):
        SqlLeaseProvider(f"sqlite:///{tmp_path}/x.db", operation_timeout_s=value)


@pytest.mark.parametrize(
    ("options", "waits"),
    [
        ({"sqlite_busy_timeout_ms": 2**31 - 1}, True),  # overflowed to 0 before: failed at once
        ({"operation_timeout_s": 86_400}, True),
        ({"sqlite_busy_timeout_ms": 0}, False),
    ],
)
async def test_sqlite_busy_timeout_in_effect(tmp_path: Path, options: dict[str, Any], waits: bool) -> None:
    """A statement that meets another process's write lock waits up to the busy timeout."""
    import sqlite3

    path = tmp_path / "x.db"
    async with SqlLeaseProvider(f"sqlite:///{path}") as migrator:
        await migrator.migrate()
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    try:
        async with SqlLeaseProvider(f"sqlite:///{path}", **options) as provider:
            started = time.monotonic()
            with pytest.raises(LeaseBackendError) as caught:
                # a write (an acquire would answer "not acquired" when its lock wait runs out)
                await asyncio.wait_for(provider.release_lease("k", "o"), 0.6)
            elapsed = time.monotonic() - started
    except TimeoutError:
        elapsed, caught = 0.6, None  # still waiting for the lock when we gave up: it waits
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    if waits:
        assert caught is None or "locked" not in str(caught.value), "the busy timeout did not apply"
        assert elapsed >= 0.5
    else:
        assert caught is not None and "locked" in str(caught.value)


async def test_a_sqlite_pool_of_twenty_serves_twenty_at_once(tmp_path: Path) -> None:
    """Regression: SQLite's engine kept SQLAlchemy's default pool (5 + 10 overflow), so the 16th of
    20 concurrent operations waited for a connection that never came back."""
    async with SqlLeaseProvider(f"sqlite:///{tmp_path}/x.db", pool_size=20, operation_timeout_s=5) as provider:
        await provider.migrate()
        results = await asyncio.gather(*(provider.get_lease(f"k{i}") for i in range(20)))
        assert results == [None] * 20


@pytest.mark.parametrize("pool_size", [0, -1, True, 1.5, "3"])
def test_bad_pool_size_is_refused_before_an_engine_exists(tmp_path: Path, pool_size: Any) -> None:
    with pytest.raises((TypeError, ValueError), match="pool_size"):
        SqlLeaseProvider(f"sqlite:///{tmp_path}/x.db", pool_size=pool_size)


def test_no_file_is_created_by_constructing_or_closing(tmp_path: Path) -> None:
    async def main() -> None:
        async with SqlLeaseProvider(f"sqlite:///{tmp_path}/x.db"):
            pass

    asyncio.run(main())
    assert os.listdir(tmp_path) == []


def test_a_missing_sync_driver_is_a_configuration_error_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from sql_lease import SyncSqlLeaseProvider
    from sql_lease.errors import LeaseConfigError

    for name in [name for name in sys.modules if name.split(".")[0] in ("psycopg", "psycopg_pool")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if `pip install sql-lease` without [psycopg]
    monkeypatch.setitem(sys.modules, "psycopg_pool", None)
    with pytest.raises(LeaseConfigError, match=r"pip install 'sql-lease\[psycopg\]'") as raised:
        SyncSqlLeaseProvider("postgresql://postgres@127.0.0.1:5432/test")
    assert isinstance(raised.value, ModuleNotFoundError)  # what `except ImportError` code expects


# Without asyncpg the CLI runs on psycopg 3 (every command), and with neither driver it exits 78
# naming both extras: tests/test_psycopg_async.py.


@pytest.mark.parametrize("command", [["check"], ["list"], ["exec", "job", "--", "true"]])
def test_an_empty_url_says_it_is_empty(command: list[str]) -> None:
    """``--url "$DATABASE_URL"`` with the variable unset: exit 78 saying the URL is empty."""
    result = invoke([command[0], "--url", "", *command[1:]])
    assert result.exit_code == 78, result.output
    assert "URL is empty" in result.output and "Traceback" not in result.output
