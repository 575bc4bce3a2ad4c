"""Issue 20 item 10: every kind of application engine runs every operation: asyncpg, psycopg
(async), aiosqlite, asyncmy and aiomysql ``AsyncEngine``s, and a ``sqlite:///file:...?uri=true``
URL, each on the newest SQLAlchemy installed and on the oldest release pyproject allows (2.0.30, in
a subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import sqlalchemy
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from sql_lease import SqlLeaseProvider

OLDEST_SQLALCHEMY = "2.0.30"
ENGINES = [
    pytest.param("asyncpg", marks=pytest.mark.postgres),
    pytest.param("psycopg", marks=pytest.mark.postgres),
    "aiosqlite",
    pytest.param("asyncmy", marks=pytest.mark.mysql),
    pytest.param("aiomysql", marks=pytest.mark.mysql),
]


@pytest.fixture(params=ENGINES)
async def engine(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[AsyncEngine, str | None]]:
    kind = request.param
    if kind == "aiosqlite":
        made = create_async_engine(f"sqlite+aiosqlite:///{tmp_path}/app.db")
        schema = None
    elif kind in ("asyncmy", "aiomysql"):
        from tests.conftest import MYSQL_URL, mysql_execute

        schema = f"sql_lease_e_{uuid.uuid4().hex[:10]}"
        mysql_execute(MYSQL_URL, f"CREATE DATABASE `{schema}`")
        request.addfinalizer(lambda: mysql_execute(MYSQL_URL, f"DROP DATABASE IF EXISTS `{schema}`"))
        made = create_async_engine(sqlalchemy.make_url(MYSQL_URL).set(drivername=f"mysql+{kind}"))
    else:
        made = create_async_engine(request.getfixturevalue("pg_url").replace("postgresql://", f"postgresql+{kind}://"))
        schema = request.getfixturevalue("fresh_pg_schema")
    yield made, schema
    await made.dispose()


async def every_operation(leases: SqlLeaseProvider, key: str) -> None:
    await leases.migrate()
    first = await leases.acquire_lease(key, "a", 10_000, data={"n": 1})
    assert (
        first.acquired
        and first.expires_at.utcoffset() is not None
        and first.expires_at.utcoffset().total_seconds() == 0
    )
    refused = await leases.acquire_lease(key, "b", 10_000)
    assert not refused.acquired and refused.owner == "a" and refused.fence == first.fence
    held = await leases.get_lease(key)
    assert held is not None and held.owner == "a" and held.data == {"n": 1}
    assert await leases.get_lease_owner(key) == "a"
    assert await leases.renew_lease(key, "a", 10_000)
    assert set(await leases.renew_many([(key, "a", 10_000)])) == {key}
    assert await leases.transfer_lease(key, "a", "b", 10_000)
    assert [lease.owner for lease in await leases.list_leases()] == ["b"]
    assert await leases.release_lease(key, "b")
    assert await leases.sweep_expired() == 0
    assert await leases.break_lease(key) is None


async def test_every_operation_runs_on_a_given_engine(engine: tuple[AsyncEngine, str | None], key: str) -> None:
    app, schema = engine
    async with SqlLeaseProvider(app, schema=schema) as leases:
        await every_operation(leases, key)
    # the application's connections come back as they were lent: in a transaction of their own
    async with app.connect() as conn:
        assert await conn.get_isolation_level() != "AUTOCOMMIT"
        await conn.execute(text("SELECT 1"))
        assert conn.in_transaction()
        await conn.rollback()
    assert getattr(app.sync_engine.pool, "checkedout", lambda: 0)() == 0  # NullPool (aiosqlite on 2.0.30): none kept


async def test_a_uri_sqlite_url_runs_every_operation(tmp_path: Path, key: str) -> None:
    url = f"sqlite:///file:{tmp_path}/uri.db?mode=rwc&uri=true"
    async with SqlLeaseProvider(url) as leases:
        await every_operation(leases, key)


@pytest.mark.skipif(
    os.environ.get("SQL_LEASE_OLDEST_SQLALCHEMY") == "1", reason="already running on the oldest SQLAlchemy"
)
def test_the_engine_tests_pass_on_the_oldest_sqlalchemy(tmp_path: Path) -> None:
    """The tests above (and the MySQL tests of an application's sync and async engines), again,
    with SQLAlchemy 2.0.30 first on the path (a ``pip install --target`` of it; the same Python and
    the other packages of this environment). Fails, never skips, when that release cannot be installed."""
    target = tmp_path / "oldest"
    installed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            f"sqlalchemy=={OLDEST_SQLALCHEMY}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert installed.returncode == 0, f"could not install SQLAlchemy {OLDEST_SQLALCHEMY}: {installed.stderr[-2000:]}"
    root = Path(__file__).resolve().parent.parent
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(target), str(root)]),
        "SQL_LEASE_OLDEST_SQLALCHEMY": "1",
    }
    version = subprocess.run(
        [sys.executable, "-c", "import sqlalchemy; print(sqlalchemy.__version__)"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert version.stdout.strip() == OLDEST_SQLALCHEMY, (version.stdout, version.stderr, sqlalchemy.__version__)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-x",
            str(Path(__file__)),
            "tests/test_secrets.py",
            "tests/test_mysql.py::test_the_applications_engines_on_both_faces",  # the sync face's Engine too
            "tests/test_guarded_waits.py::test_mysql_a_guarded_expired_lease_on_an_applications_engine_is_not_acquired_at_once",
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout.split("\n")[-2].replace("1 skipped", ""), (
        done.stdout[-2000:]
    )


async def test_the_engine_path_sets_no_driver_attribute(
    engine: tuple[AsyncEngine, str | None], key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 22 item 5: autocommit on an application's engine goes through SQLAlchemy's public API
    (its ``AUTOCOMMIT`` isolation level); sql_lease sets no attribute of the driver's connection or
    of SQLAlchemy's adapter behind SQLAlchemy's back (it used to flip asyncpg's adapter flag)."""
    made, schema = engine
    async with made.connect() as conn:
        raw = await conn.get_raw_connection()
        classes = {type(raw.dbapi_connection), type(raw.driver_connection)}
    set_by_sql_lease: list[tuple[str, str]] = []
    for cls in classes:
        original = cls.__setattr__

        def recording(self: object, name: str, value: object, _original: object = original) -> None:
            if sys._getframe(1).f_globals.get("__name__", "").startswith("sql_lease"):
                set_by_sql_lease.append((type(self).__name__, name))
            _original(self, name, value)  # type: ignore[operator]

        monkeypatch.setattr(cls, "__setattr__", recording)
    async with SqlLeaseProvider(made, schema=schema) as leases:
        await every_operation(leases, key)
    assert set_by_sql_lease == []


@pytest.mark.parametrize("given", ["engine", "uri-url"])
async def test_a_sqlite_lock_wait_run_out_through_sqlalchemy_is_not_acquired(
    given: str, tmp_path: Path, key: str
) -> None:
    """SQLITE_BUSY wrapped by SQLAlchemy (an application's aiosqlite engine, a ``uri=true`` URL)
    on an expired lease under another connection's write lock: "not acquired", not a backend error."""
    import sqlite3

    path = tmp_path / "locked.db"
    url = f"sqlite:///file:{path}?mode=rwc&uri=true"
    async with SqlLeaseProvider(url) as setup:
        await setup.migrate()
        assert (await setup.acquire_lease(key, "a", 1)).acquired
    app = create_async_engine(f"sqlite+aiosqlite:///{path}", connect_args={"timeout": 0.3})
    guard = sqlite3.connect(path, isolation_level=None)
    try:
        guard.execute("BEGIN IMMEDIATE")  # the write lock, as a check_held guard holds it
        leases = SqlLeaseProvider(app) if given == "engine" else SqlLeaseProvider(url, operation_timeout_s=1)
        async with leases:
            refused = await leases.acquire_lease(key, "b", 10_000)
        assert not refused.acquired
    finally:
        guard.rollback()
        guard.close()
        await app.dispose()
