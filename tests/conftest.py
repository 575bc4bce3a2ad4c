from __future__ import annotations

import asyncio
import concurrent.futures
import os
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from sql_lease import InMemoryLeaseProvider, SqlLeaseProvider
from tests.support.pgserver import postgres_url

T = TypeVar("T")

PROVIDER_KINDS = [
    "memory",
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("mysql", marks=pytest.mark.mysql),
]

MYSQL_URL = os.environ.get("SQL_LEASE_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
"""The MySQL or MariaDB server the tests use (this machine's MariaDB unless the variable names another)."""


def mysql_connect(url: str, database: str | None = None, *, autocommit: bool = True) -> Any:
    """A PyMySQL connection to the MySQL server of ``url`` (in ``database``, if given)."""
    import pymysql
    import sqlalchemy as sa

    parsed = sa.make_url(url)
    return pymysql.connect(
        host=parsed.host,
        port=parsed.port or 3306,
        user=parsed.username,
        password=parsed.password or "",
        database=database,
        autocommit=autocommit,
    )


def mysql_execute(url: str, *statements: str) -> None:
    """Run ``statements`` on the MySQL server of ``url`` (PyMySQL, autocommit)."""
    conn = mysql_connect(url)
    try:
        with conn.cursor() as cursor:
            for statement in statements:
                cursor.execute(statement)
    finally:
        conn.close()


@pytest.fixture(scope="session")
def mysql_db() -> Iterator[tuple[str, str]]:
    """A database of its own on the MySQL server for this test session, migrated; dropped
    afterwards. (url, database name, given as the provider's ``schema``)"""
    database = f"sql_lease_test_{os.getpid()}"
    mysql_execute(MYSQL_URL, f"CREATE DATABASE IF NOT EXISTS `{database}`")

    async def migrate() -> None:
        async with SqlLeaseProvider(MYSQL_URL, schema=database) as provider:
            await provider.migrate()

    run_in_own_loop(migrate)
    yield MYSQL_URL, database
    mysql_execute(MYSQL_URL, f"DROP DATABASE IF EXISTS `{database}`")


@pytest.fixture
def mysql_user() -> Iterator[tuple[str, str]]:
    """A MySQL user ``lease_pw_<hex>`` with the password ``right-<hex>``, allowed everything on the
    databases ``lease_pw_<hex>%`` (none exists: a URL naming one gets "unknown database"); dropped
    afterwards. Yields (user, password)."""
    user, password = f"lease_pw_{uuid.uuid4().hex[:8]}", f"right-{uuid.uuid4().hex[:8]}"
    mysql_execute(
        MYSQL_URL,
        f"CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'",
        f"GRANT ALL ON `{user}%`.* TO '{user}'@'%'",
    )
    yield user, password
    mysql_execute(MYSQL_URL, f"DROP USER IF EXISTS '{user}'@'%'")


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """Base URL of the PostgreSQL the tests use (see tests/support/pgserver.py)."""
    with postgres_url() as url:
        yield url


def run_in_own_loop(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``main()`` on a fresh event loop in another thread (fixtures may be set up from inside
    a running loop, where asyncio.run is not allowed)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, main()).result()


async def _execute(url: str, sql: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def pg_schema(pg_url: str) -> Iterator[tuple[str, str]]:
    """A schema of its own for this test session, migrated; dropped afterwards. (url, schema)"""
    schema = f"sql_lease_test_{os.getpid()}"

    async def migrate() -> None:
        async with SqlLeaseProvider(pg_url, schema=schema) as provider:
            await provider.migrate()

    run_in_own_loop(migrate)
    yield pg_url, schema
    run_in_own_loop(lambda: _execute(pg_url, f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))


@pytest.fixture
def fresh_mysql_db() -> Iterator[str]:
    """An empty database (not migrated) on the MySQL server; dropped afterwards."""
    name = f"sql_lease_m_{uuid.uuid4().hex[:10]}"
    mysql_execute(MYSQL_URL, f"CREATE DATABASE `{name}`")
    yield name
    mysql_execute(MYSQL_URL, f"DROP DATABASE IF EXISTS `{name}`")


@pytest.fixture
def fresh_pg_schema(pg_url: str) -> Iterator[str]:
    """An empty schema name for a test that migrates it itself; dropped afterwards."""
    schema = f"sql_lease_t_{uuid.uuid4().hex[:10]}"
    yield schema
    run_in_own_loop(lambda: _execute(pg_url, f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))


async def make_provider(kind: str, request: pytest.FixtureRequest, tmp_path: os.PathLike[str]):  # type: ignore[no-untyped-def]
    if kind == "memory":
        return InMemoryLeaseProvider()
    if kind == "sqlite":
        provider = SqlLeaseProvider(f"sqlite:///{tmp_path}/leases.db")
        await provider.migrate()
        return provider
    url, schema = request.getfixturevalue("mysql_db" if kind == "mysql" else "pg_schema")
    return SqlLeaseProvider(url, schema=schema)


@pytest.fixture(params=PROVIDER_KINDS)
async def provider(request: pytest.FixtureRequest, tmp_path: os.PathLike[str]) -> AsyncIterator[object]:
    """Each provider in turn: in-memory, SQLite (fresh file), PostgreSQL (session schema)."""
    made = await make_provider(request.param, request, tmp_path)
    yield made
    if hasattr(made, "close"):
        await made.close()


@pytest.fixture(params=PROVIDER_KINDS[1:])
async def sql_provider(request: pytest.FixtureRequest, tmp_path: os.PathLike[str]) -> AsyncIterator[SqlLeaseProvider]:
    """Each SQL provider in turn: SQLite (fresh file), PostgreSQL (session schema)."""
    made = await make_provider(request.param, request, tmp_path)
    yield made
    await made.close()


@pytest.fixture(params=PROVIDER_KINDS[1:])
async def backend(request: pytest.FixtureRequest, tmp_path: os.PathLike[str]) -> dict[str, str]:
    """Where processes of a test meet, each SQL backend in turn: ``{"url": ..., "schema": ...}`` of a
    migrated SQLite file (schema ``""``), the session's PostgreSQL schema or MySQL database."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/shared.db"
        async with SqlLeaseProvider(url) as provider:
            await provider.migrate()
        return {"url": url, "schema": ""}
    url, schema = request.getfixturevalue("mysql_db" if request.param == "mysql" else "pg_schema")
    return {"url": url, "schema": schema}


@pytest.fixture
def key() -> str:
    """A key no other test uses."""
    return f"test:{uuid.uuid4().hex}"


# -- the synchronous face ---------------------------------------------------------------------


def make_sync_provider(kind: str, request: pytest.FixtureRequest, tmp_path: os.PathLike[str]) -> Any:
    """A synchronous provider of ``kind`` (memory, sqlite: a fresh migrated file, postgres: the
    session schema)."""
    from sql_lease import SyncInMemoryLeaseProvider, SyncSqlLeaseProvider

    if kind == "memory":
        return SyncInMemoryLeaseProvider()
    if kind == "sqlite":
        import shutil

        template = request.getfixturevalue("sync_sqlite_template")
        shutil.copyfile(template, f"{tmp_path}/sync_leases.db")
        return SyncSqlLeaseProvider(f"sqlite:///{tmp_path}/sync_leases.db")
    url, schema = request.getfixturevalue("mysql_db" if kind == "mysql" else "pg_schema")
    return SyncSqlLeaseProvider(url, schema=schema)


@pytest.fixture(scope="session")
def sync_sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A migrated SQLite database file, copied for each test that needs a fresh one."""
    from sql_lease import SyncSqlLeaseProvider

    path = tmp_path_factory.mktemp("sync_template") / "leases.db"
    with SyncSqlLeaseProvider(f"sqlite:///{path}") as provider:
        provider.migrate()
    return str(path)


@pytest.fixture(params=PROVIDER_KINDS)
def sync_provider(request: pytest.FixtureRequest, tmp_path: os.PathLike[str]) -> Iterator[Any]:
    """Each synchronous provider in turn: in-memory, SQLite (fresh file), PostgreSQL (session schema)."""
    made = make_sync_provider(request.param, request, tmp_path)
    yield made
    made.close()


@pytest.fixture(params=PROVIDER_KINDS[1:])
def sync_sql_provider(request: pytest.FixtureRequest, tmp_path: os.PathLike[str]) -> Iterator[Any]:
    """Each synchronous SQL provider in turn: SQLite (fresh file), PostgreSQL (session schema)."""
    made = make_sync_provider(request.param, request, tmp_path)
    yield made
    made.close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave out the parameters a test does not apply to (``@pytest.mark.applies_to(lambda kind, face:
    ...)``: a provider kind and face that lack the feature), rather than skip them."""
    kept, left_out = [], []
    for item in items:
        marker = item.get_closest_marker("applies_to")
        params = getattr(getattr(item, "callspec", None), "params", {})
        if marker is not None and not marker.args[0](params.get("kind"), params.get("face")):
            left_out.append(item)
        else:
            kept.append(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept
