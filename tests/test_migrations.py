"""The Alembic migrations: idempotent, no drift from the declared schema, own version table,
offline SQL, `alembic upgrade head` from a checkout, and the migrations inside the built wheel."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import subprocess
import sys
import time
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection

from sql_lease import SqlLeaseProvider, SyncSqlLeaseProvider
from sql_lease.sql.migrate import HEAD_REVISION, offline_sql
from sql_lease.sql.schema import LeaseTableNames, lease_metadata
from sql_lease.sql.statements import SQLITE_NOW_MS
from tests.conftest import MYSQL_URL, mysql_connect, mysql_execute

REPO = Path(__file__).resolve().parent.parent


def _drift(connection: Connection, names: LeaseTableNames) -> list[Any]:
    context = MigrationContext.configure(
        connection,
        opts={
            "version_table": names.version_table,
            "version_table_schema": names.schema,
            "include_schemas": names.schema is not None,
            "compare_type": True,
            "include_name": lambda name, type_, parent: type_ != "schema" or name == names.schema,
        },
    )
    return list(compare_metadata(context, lease_metadata(names, connection.dialect.name)))


async def _schema_facts(provider: SqlLeaseProvider) -> dict[str, Any]:
    names = provider.names

    def read(connection: Connection) -> dict[str, Any]:
        inspector = inspect(connection)
        facts: dict[str, Any] = {
            "drift": _drift(connection, names),
            "tables": set(inspector.get_table_names(schema=names.schema)),
        }
        if connection.dialect.name == "postgresql":
            facts["sequences"] = set(inspector.get_sequence_names(schema=names.schema))
        else:
            facts["triggers"] = {
                row[0] for row in connection.execute(text("SELECT name FROM sqlite_master WHERE type = 'trigger'"))
            }
            facts["counter"] = connection.execute(text(f'SELECT id, last_fence FROM "{names.fence_counter}"')).all()
        return facts

    async with provider._base_engine.connect() as conn:
        return await conn.run_sync(read)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """A database URL and schema no other test uses."""
    if request.param == "sqlite":
        return {"url": f"sqlite:///{tmp_path}/m.db", "schema": None}
    return {"url": request.getfixturevalue("pg_url"), "schema": request.getfixturevalue("fresh_pg_schema")}


@pytest.mark.parametrize("table_name", ["sql_leases", "Job_Leases2"])
async def test_migrations_build_exactly_the_declared_schema(target: dict[str, Any], table_name: str) -> None:
    async with SqlLeaseProvider(target["url"], schema=target["schema"], table_name=table_name) as provider:
        assert await provider.migrate() == HEAD_REVISION
        assert await provider.migrate() == HEAD_REVISION  # idempotent
        facts = await _schema_facts(provider)
        names = provider.names
        assert facts["drift"] == []
        assert names.table in facts["tables"]
        assert names.version_table in facts["tables"]
        assert names.version_table == (
            "sql_lease_alembic_version" if table_name == "sql_leases" else f"{table_name}_alembic_version"
        )
        assert "alembic_version" not in facts["tables"]  # never the host application's table
        if provider.dialect_name == "postgresql":
            assert facts["sequences"] == {names.fence_sequence}
        else:
            assert facts["triggers"] == {f"{table_name}_fence_on_insert", f"{table_name}_fence_on_update"} | (
                set(names.slot_triggers()) if provider.dialect_name == "sqlite" else set()
            )
            assert facts["counter"] == [(1, 0)]
        assert (await provider.acquire_lease("k", "o", 1000)).acquired


async def test_custom_version_table(target: dict[str, Any]) -> None:
    async with SqlLeaseProvider(target["url"], schema=target["schema"], version_table="leases_schema_v") as provider:
        await provider.migrate()
        facts = await _schema_facts(provider)
        assert "leases_schema_v" in facts["tables"] and "sql_lease_alembic_version" not in facts["tables"]


async def test_concurrent_migrations_agree(target: dict[str, Any]) -> None:
    providers = [SqlLeaseProvider(target["url"], schema=target["schema"]) for _ in range(4)]
    try:
        assert await asyncio.gather(*(p.migrate() for p in providers)) == [HEAD_REVISION] * 4
    finally:
        for p in providers:
            await p.close()


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mysql", marks=pytest.mark.mysql),
    ]
)
def any_target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """As ``target``, MySQL too (a database of its own, dropped afterwards)."""
    if request.param == "sqlite":
        sqlite3.connect(tmp_path / "m.db").close()  # the provider's engine opens only a file that exists
        yield {"url": f"sqlite:///{tmp_path}/m.db", "schema": None}
        return
    if request.param == "postgres":
        yield {"url": request.getfixturevalue("pg_url"), "schema": request.getfixturevalue("fresh_pg_schema")}
        return
    database = f"sql_lease_m_{uuid.uuid4().hex[:10]}"
    mysql_execute(MYSQL_URL, f"CREATE DATABASE `{database}`")
    yield {"url": MYSQL_URL, "schema": database}
    mysql_execute(MYSQL_URL, f"DROP DATABASE IF EXISTS `{database}`")


async def _alembic(provider: SqlLeaseProvider, step: str, revision: str) -> None:
    from alembic import command

    from sql_lease.sql.migrate import alembic_config

    async with provider.engine.begin() as conn:
        await conn.run_sync(lambda c: getattr(command, step)(alembic_config(provider.names, connection=c), revision))


async def test_0007_sqlite_slot_triggers_upgrade_and_downgrade(tmp_path: Path) -> None:
    """0007 adds the slot table's triggers and live-slot index on SQLite (a semaphore's held slots
    keep their head through it); downgrading to 0006 drops them, and 0006's transactions run again."""
    path = tmp_path / "sem.db"
    sqlite3.connect(path).close()

    def objects() -> set[str]:
        with sqlite3.connect(path) as conn:
            rows = conn.execute("SELECT name FROM sqlite_master WHERE type IN ('trigger', 'index')").fetchall()
        return {row[0] for row in rows}

    async with SqlLeaseProvider(f"sqlite:///{path}") as provider:
        names = provider.names
        added = {names.slot_live_index, *names.slot_triggers()}
        await _alembic(provider, "upgrade", "0006")
        assert not added & objects()
        assert await provider.migrate() == HEAD_REVISION
        assert added <= objects()
        assert (await provider.acquire_lease("sem", "a", 60_000, limit=2)).acquired
        await _alembic(provider, "downgrade", "0006")
        assert not added & objects()
        assert [holder.owner for holder in await provider.get_lease_holders("sem")] == ["a"]
        assert await provider.migrate() == HEAD_REVISION
        assert not (await provider.acquire_lease("sem", "plain", 60_000)).acquired  # the head still holds it
        assert await provider.release_lease("sem", "a")
        assert (await provider.acquire_lease("sem", "plain", 60_000)).acquired


async def _function_sources(provider: SqlLeaseProvider, schema: str) -> list[str]:
    # The bodies of the schema's functions (PostgreSQL's slot acquire and release), by name
    async with provider.engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT prosrc FROM pg_proc WHERE pronamespace = CAST(:schema AS regnamespace) ORDER BY proname"),
            {"schema": schema},
        )
        return [row[0] for row in rows]


@pytest.mark.postgres
async def test_0007_shortens_the_postgres_slot_functions_and_downgrade_restores_them(
    pg_url: str, fresh_pg_schema: str
) -> None:
    async with SqlLeaseProvider(pg_url, schema=fresh_pg_schema) as provider:
        await _alembic(provider, "upgrade", "0006")
        old = await _function_sources(provider, fresh_pg_schema)
        assert await provider.migrate() == HEAD_REVISION
        new = await _function_sources(provider, fresh_pg_schema)
        assert len(new) == 2 and new != old and "FILTER" in new[0]  # the acquire reads its slot and the count at once
        assert (await provider.acquire_lease("sem", "a", 60_000, limit=2)).acquired
        await _alembic(provider, "downgrade", "0006")
        assert await _function_sources(provider, fresh_pg_schema) == old
        assert [holder.owner for holder in await provider.get_lease_holders("sem")] == ["a"]
        assert await provider.release_lease("sem", "a")


@pytest.mark.postgres
async def test_0008_quiets_the_postgres_semaphore_heads_and_downgrade_restores_0007(
    pg_url: str, fresh_pg_schema: str
) -> None:
    async with SqlLeaseProvider(pg_url, schema=fresh_pg_schema) as provider:
        await _alembic(provider, "upgrade", "0007")
        old = await _function_sources(provider, fresh_pg_schema)
        assert (await provider.acquire_lease("sem", "a", 60_000, limit=2)).acquired
        assert await provider.migrate() == HEAD_REVISION
        new = await _function_sources(provider, fresh_pg_schema)
        assert len(new) == 2 and all(before != after for before, after in zip(old, new, strict=True))
        assert "IF head.expires_at < until_" in new[0] and "head_row" not in new[1]
        assert (await provider.acquire_lease("sem", "b", 60_000, limit=2)).acquired
        assert await provider.release_lease("sem", "a")
        await _alembic(provider, "downgrade", "0007")
        assert await _function_sources(provider, fresh_pg_schema) == old
        assert [holder.owner for holder in await provider.get_lease_holders("sem")] == ["b"]
        assert await provider.release_lease("sem", "b")
        assert (await provider.acquire_lease("sem", "plain", 60_000)).acquired


@pytest.mark.postgres
async def test_0010_serialises_postgres_slot_grants_with_plain_acquires_and_downgrade_restores_0009(
    pg_url: str, fresh_pg_schema: str
) -> None:
    async with SqlLeaseProvider(pg_url, schema=fresh_pg_schema) as provider:
        await _alembic(provider, "upgrade", "0009")
        old = await _function_sources(provider, fresh_pg_schema)
        assert (await provider.acquire_lease("sem", "a", 60_000, limit=2)).acquired
        assert await provider.migrate() == HEAD_REVISION
        new = await _function_sources(provider, fresh_pg_schema)
        assert new[1] == old[1] and "pg_advisory_xact_lock" not in old[0]
        assert "PERFORM pg_advisory_xact_lock(" in new[0]
        assert (await provider.acquire_lease("sem", "b", 60_000, limit=2)).acquired
        assert not (await provider.acquire_lease("sem", "c", 60_000, limit=2)).acquired
        assert await provider.release_lease("sem", "a")
        await _alembic(provider, "downgrade", "0009")
        assert await _function_sources(provider, fresh_pg_schema) == old
        assert [holder.owner for holder in await provider.get_lease_holders("sem")] == ["b"]
        assert await provider.migrate() == HEAD_REVISION
        assert await _function_sources(provider, fresh_pg_schema) == new


async def _mysql_procedures(provider: SqlLeaseProvider, schema: str) -> list[str]:
    # The names of the schema's stored procedures (MySQL's slot acquire and release)
    async with provider.engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT ROUTINE_NAME FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = :schema "
                "AND ROUTINE_TYPE = 'PROCEDURE' ORDER BY ROUTINE_NAME"
            ),
            {"schema": schema},
        )
        return [row[0] for row in rows]


@pytest.mark.mysql
async def test_0009_mysql_slot_procedures_upgrade_and_downgrade_and_a_table_at_0008_names_the_migration() -> None:
    """0009 creates the slot acquire and release procedures on MySQL; at 0008 (none) plain leases work and a
    semaphore operation answers SchemaMissingError naming ``sql-lease migrate``; downgrading drops them."""
    from sql_lease import SchemaMissingError

    database = f"sql_lease_m_{uuid.uuid4().hex[:10]}"
    mysql_execute(MYSQL_URL, f"CREATE DATABASE `{database}`")
    try:
        async with SqlLeaseProvider(MYSQL_URL, schema=database) as provider:
            names = provider.names
            procedures = [names.slot_acquire_function, names.slot_release_function]
            await _alembic(provider, "upgrade", "0008")
            assert await _mysql_procedures(provider, database) == []
            assert (await provider.acquire_lease("plain", "a", 60_000)).acquired
            assert not await provider.release_lease("plain", "b")  # nothing released: the slot step asks too
            assert await provider.release_lease("plain", "a")
            assert not await provider.release_lease("plain", "a")
            with pytest.raises(SchemaMissingError, match=r"older than this sql_lease.*sql-lease migrate"):
                await provider.acquire_lease("sem", "a", 60_000, limit=2)
            missing = pytest.raises(SchemaMissingError, match=r"older than this sql_lease.*sql-lease migrate")
            with SyncSqlLeaseProvider(MYSQL_URL, schema=database) as sync_provider, missing:  # the other face
                sync_provider.acquire_lease("sem", "a", 60_000, limit=2)
            assert await provider.migrate() == HEAD_REVISION
            assert await _mysql_procedures(provider, database) == procedures
            assert (await provider.acquire_lease("sem", "a", 60_000, limit=2)).acquired
            assert (await provider.acquire_lease("sem", "b", 60_000, limit=2)).acquired
            assert await provider.release_lease("sem", "b")
            await _alembic(provider, "downgrade", "0008")
            assert await _mysql_procedures(provider, database) == []
            assert [holder.owner for holder in await provider.get_lease_holders("sem")] == ["a"]
            assert await provider.migrate() == HEAD_REVISION
            assert await provider.release_lease("sem", "a")
            assert (await provider.acquire_lease("sem", "plain", 60_000)).acquired
    finally:
        mysql_execute(MYSQL_URL, f"DROP DATABASE IF EXISTS `{database}`")


@pytest.mark.mysql
async def test_a_mysql_user_without_create_routine_is_told_what_0009_needs_and_migrates_once_granted() -> None:
    """A table at 0008 migrated by a user without CREATE ROUTINE: a LeaseConfigError naming it, the table left at
    0008 (plain leases work); granted, the same migrate goes through."""

    from sql_lease import LeaseConfigError

    with _mysql_migrator("SELECT, INSERT, UPDATE, DELETE, CREATE, DROP, INDEX, ALTER") as (database, user, as_user):
        async with SqlLeaseProvider(MYSQL_URL, schema=database) as admin:
            await _alembic(admin, "upgrade", "0008")
        async with SqlLeaseProvider(as_user, schema=database) as provider:
            with pytest.raises(LeaseConfigError, match="CREATE ROUTINE"):
                await provider.migrate()
            assert (await provider.acquire_lease("plain", "a", 60_000)).acquired
        mysql_execute(MYSQL_URL, f"GRANT CREATE ROUTINE, ALTER ROUTINE ON `{database}`.* TO '{user}'@'%'")
        async with SqlLeaseProvider(as_user, schema=database) as provider:
            assert await provider.migrate() == HEAD_REVISION
            assert (await provider.acquire_lease("sem", "a", 60_000, limit=2)).acquired


@contextlib.contextmanager
def _mysql_migrator(grants: str) -> Iterator[tuple[str, str, str]]:
    """A new MySQL database and a user with ``grants`` on it: (database, user, the user's URL); both dropped after."""
    from sqlalchemy.engine import make_url

    database, user = f"sql_lease_m_{uuid.uuid4().hex[:10]}", f"lease_mig_{uuid.uuid4().hex[:8]}"
    mysql_execute(
        MYSQL_URL,
        f"CREATE DATABASE `{database}`",
        f"CREATE USER '{user}'@'%' IDENTIFIED BY 'pw-{user}'",
        f"GRANT {grants} ON `{database}`.* TO '{user}'@'%'",
    )
    as_user = make_url(MYSQL_URL).set(username=user, password=f"pw-{user}", database=database)
    try:
        yield database, user, as_user.render_as_string(hide_password=False)
    finally:
        mysql_execute(MYSQL_URL, f"DROP USER IF EXISTS '{user}'@'%'", f"DROP DATABASE IF EXISTS `{database}`")


# -- a MySQL migrate that fails partway (its DDL commits statement by statement) is safe to re-run -----


_MIGRATOR_GRANTS = "SELECT, INSERT, UPDATE, DELETE, CREATE, DROP, INDEX, ALTER, CREATE TEMPORARY TABLES, CREATE ROUTINE"


def _mysql_facts(schema: str) -> dict[str, Any]:
    """What a MySQL database holds, as information_schema tells it (its own name written ``<db>``): tables,
    columns, indexes, procedures, the version rows."""
    import pymysql

    from tests.conftest import mysql_connect

    conn = mysql_connect(MYSQL_URL)
    queries = {
        "tables": "SELECT TABLE_NAME, ENGINE FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s ORDER BY 1",
        "columns": (
            "SELECT TABLE_NAME, ORDINAL_POSITION, COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, COLUMN_DEFAULT "
            "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s ORDER BY 1, 2"
        ),
        "indexes": (
            "SELECT TABLE_NAME, INDEX_NAME, SEQ_IN_INDEX, COLUMN_NAME, SUB_PART, NON_UNIQUE "
            "FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %s ORDER BY 1, 2, 3"
        ),
        "procedures": (
            "SELECT ROUTINE_NAME, ROUTINE_DEFINITION, SECURITY_TYPE FROM information_schema.ROUTINES "
            "WHERE ROUTINE_SCHEMA = %s ORDER BY 1"
        ),
    }
    try:
        with conn.cursor() as cursor:
            facts: dict[str, Any] = {}
            for fact, query in queries.items():
                cursor.execute(query, (schema,))
                facts[fact] = [tuple(str(v).replace(schema, "<db>") for v in row) for row in cursor.fetchall()]
            try:
                cursor.execute(f"SELECT version_num FROM `{schema}`.sql_lease_alembic_version")
                facts["versions"] = cursor.fetchall()
            except pymysql.err.ProgrammingError:
                facts["versions"] = None
            return facts
    finally:
        conn.close()


@pytest.mark.mysql
@pytest.mark.parametrize(
    ("withheld", "revision"),
    [("CREATE ROUTINE", "0009"), ("INDEX", "0001"), ("CREATE TEMPORARY TABLES", "0005")],
)
async def test_a_mysql_user_lacking_a_privilege_is_told_which_and_the_same_migrate_completes_once_granted(
    withheld: str, revision: str
) -> None:
    """A fresh MySQL database migrated by a user without a privilege one revision needs (CREATE ROUTINE: 0009's
    procedures; INDEX: 0001's expiry index, after the lease table; CREATE TEMPORARY TABLES: 0005's rekey): a
    LeaseConfigError naming the privilege and the revision, the tables before it left in place; granted, the
    same migrate completes the schema a clean migrate builds, and the table works."""

    from sql_lease import LeaseConfigError

    reference = f"sql_lease_m_{uuid.uuid4().hex[:10]}"
    granted = ", ".join(p.strip() for p in _MIGRATOR_GRANTS.split(",") if p.strip() != withheld)
    mysql_execute(MYSQL_URL, f"CREATE DATABASE `{reference}`")
    with _mysql_migrator(granted) as (database, user, as_user), contextlib.ExitStack() as cleanup:
        cleanup.callback(mysql_execute, MYSQL_URL, f"DROP DATABASE IF EXISTS `{reference}`")
        async with SqlLeaseProvider(MYSQL_URL, schema=reference) as admin:
            assert await admin.migrate() == HEAD_REVISION
        async with SqlLeaseProvider(as_user, schema=database) as provider:
            with pytest.raises(LeaseConfigError) as raised:
                await provider.migrate()
            message = str(raised.value)
            assert withheld in message and revision in message and "again" in message, message
            assert raised.value.__cause__ is not None and f"pw-{user}" not in message
        mysql_execute(MYSQL_URL, f"GRANT {withheld} ON `{database}`.* TO '{user}'@'%'")
        async with SqlLeaseProvider(as_user, schema=database) as provider:
            assert await provider.migrate() == HEAD_REVISION
            assert await provider.migrate() == HEAD_REVISION
            assert (await provider.acquire_lease("plain", "a", 60_000)).acquired
            assert (await provider.acquire_lease("sem", "a", 60_000, limit=2)).acquired
            assert (await provider.acquire_lease("sem", "b", 60_000, limit=2)).acquired
        facts, expected = _mysql_facts(database), _mysql_facts(reference)
        assert facts == expected


class _Interrupted(Exception):
    """The connection lost right after a statement of the migration ran."""


async def _migrate_interrupted_after(url: str, schema: str, writes: int | None) -> list[str]:
    """Migrate ``schema``, the connection failing right after its ``writes``-th statement that is not a
    read (None: never); the statements that ran, in order."""
    from sqlalchemy import event

    ran: list[str] = []

    def after(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        if statement.lstrip().upper().startswith(("SELECT", "SHOW", "EXPLAIN", "DESCRIBE")):
            return
        ran.append(statement)
        if len(ran) == writes:
            raise _Interrupted(statement)

    async with SqlLeaseProvider(url, schema=schema) as provider:
        event.listen(provider.engine.sync_engine, "after_cursor_execute", after)
        await provider.migrate()
    return ran


async def _mysql_database(start: str | None) -> str:
    """A new MySQL database: empty, or at revision ``start`` holding a key an earlier release stored with a raw
    U+0001 (which 0005 rewrites)."""
    database = f"sql_lease_m_{uuid.uuid4().hex[:10]}"
    mysql_execute(MYSQL_URL, f"CREATE DATABASE `{database}`")
    if start is not None:
        async with SqlLeaseProvider(MYSQL_URL, schema=database) as provider:
            await _alembic(provider, "upgrade", start)
            async with provider.engine.begin() as conn:
                await conn.execute(
                    text(
                        f"INSERT INTO `{database}`.sql_leases (`key`, owner, fence, expires_at) "
                        f"VALUES (:key, 'earlier', 7, {_IN_AN_HOUR['mysql']})"
                    ),
                    {"key": "old\x01key"},
                )
    return database


def _mysql_rows(schema: str) -> list[Any]:
    from tests.conftest import mysql_connect

    conn = mysql_connect(MYSQL_URL)
    try:
        with conn.cursor() as cursor:
            cursor.execute(f"SELECT `key`, owner, fence FROM `{schema}`.sql_leases ORDER BY `key`")
            return list(cursor.fetchall())
    finally:
        conn.close()


@pytest.mark.mysql
@pytest.mark.parametrize("start", [None, "0004"])
async def test_a_mysql_migrate_interrupted_after_any_statement_completes_when_run_again(start: str | None) -> None:
    """A MySQL database (new, or at 0004 with a key 0005 rewrites) whose migrate fails right after each one of
    its statements in turn (its DDL has committed): a library error, and a second migrate builds the schema and
    rows a clean migrate builds (0005's rewrite applied once)."""
    from sql_lease import LeaseError

    reference = await _mysql_database(start)
    try:
        statements = await _migrate_interrupted_after(MYSQL_URL, reference, None)
        expected, expected_rows = _mysql_facts(reference), _mysql_rows(reference)
    finally:
        mysql_execute(MYSQL_URL, f"DROP DATABASE IF EXISTS `{reference}`")
    assert any(s.lstrip().startswith("CREATE PROCEDURE") for s in statements)
    assert start is None or expected_rows == [(b"old\x01\x02key", b"earlier", 7)]
    stuck = []
    for writes in range(1, len(statements) + 1):
        database = await _mysql_database(start)
        try:
            with pytest.raises(LeaseError) as raised:
                await _migrate_interrupted_after(MYSQL_URL, database, writes)
            assert isinstance(raised.value.__cause__, _Interrupted), raised.value
            try:
                await _migrate_interrupted_after(MYSQL_URL, database, None)
            except LeaseError as exc:
                stuck.append((statements[writes - 1][:60], str(exc)[:200]))
                continue
            assert _mysql_facts(database) == expected, statements[writes - 1]
            assert _mysql_rows(database) == expected_rows, statements[writes - 1]
        finally:
            mysql_execute(MYSQL_URL, f"DROP DATABASE IF EXISTS `{database}`")
    assert stuck == [], "\n".join(map(repr, stuck))


_IN_AN_HOUR = {
    "postgresql": "now() + interval '1 hour'",
    "sqlite": f"{SQLITE_NOW_MS} + 3600000",
    "mysql": "UTC_TIMESTAMP(6) + INTERVAL 1 HOUR",
}


async def _stored_keys(provider: SqlLeaseProvider) -> list[str]:
    quote = provider.engine.dialect.identifier_preparer.quote
    table = ".".join(quote(part) for part in (provider.names.schema, provider.names.table) if part)
    async with provider.engine.connect() as conn:
        rows = (await conn.execute(text(f"SELECT {quote('key')} FROM {table}"))).all()
    return sorted(row[0].decode() if isinstance(row[0], bytes) else row[0] for row in rows)


async def test_0005_stores_earlier_keys_escaped_and_downgrades_to_what_0004_can_name(
    any_target: dict[str, Any],
) -> None:
    async with SqlLeaseProvider(any_target["url"], schema=any_target["schema"]) as provider:
        await _alembic(provider, "upgrade", "0004")
        quote = provider.engine.dialect.identifier_preparer.quote
        table = ".".join(quote(part) for part in (provider.names.schema, provider.names.table) if part)
        async with provider.engine.begin() as conn:  # an earlier release stored a U+0001 as it is
            await conn.execute(
                text(
                    f"INSERT INTO {table} ({quote('key')}, owner, fence, expires_at) "
                    f"VALUES (:key, 'earlier', 7, {_IN_AN_HOUR[provider.dialect_name]})"
                ),
                {"key": "old\x01key"},
            )
        assert await provider.migrate() == HEAD_REVISION
        assert await _stored_keys(provider) == ["old\x01\x02key"]
        lease = await provider.get_lease("old\x01key")
        assert lease is not None and (lease.key, lease.owner, lease.fence) == ("old\x01key", "earlier", 7)
        assert await provider.get_lease("old\x01\x02key") is None
        for key in ("new\x00key", "new\x01key", "new\ud800key"):
            assert (await provider.acquire_lease(key, "new", 60_000)).acquired

        await _alembic(provider, "downgrade", "0004")  # the keys 0004 cannot name go with their leases
        assert await _stored_keys(provider) == ["new\x01key", "old\x01key"]
        assert await provider.migrate() == HEAD_REVISION
        assert [lease.key for lease in await provider.list_leases()] == ["new\x01key", "old\x01key"]


async def test_0005_rewrites_keys_whose_new_forms_are_other_rows_old_keys(any_target: dict[str, Any]) -> None:
    """Rows an earlier release wrote with raw U+0001 where one row's stored form is another row's
    old key (``a\x01b`` -> ``a\x01\x02b``, which is also a row): a row-by-row rewrite meets the other
    row's key (PostgreSQL in insertion order, MySQL and SQLite in key order); upgrade and downgrade
    must both go through."""
    keys = ["a\x01b", "a\x01\x02b", "c\x01\x01d", "c\x01\x02\x01\x02d"]
    async with SqlLeaseProvider(any_target["url"], schema=any_target["schema"]) as provider:
        await _alembic(provider, "upgrade", "0004")
        quote = provider.engine.dialect.identifier_preparer.quote
        table = ".".join(quote(part) for part in (provider.names.schema, provider.names.table) if part)
        async with provider.engine.begin() as conn:
            for fence, key in enumerate(keys, 1):
                await conn.execute(
                    text(
                        f"INSERT INTO {table} ({quote('key')}, owner, fence, expires_at) "
                        f"VALUES (:key, 'earlier', {fence}, {_IN_AN_HOUR[provider.dialect_name]})"
                    ),
                    {"key": key},
                )
        assert await provider.migrate() == HEAD_REVISION
        for fence, key in enumerate(keys, 1):
            lease = await provider.get_lease(key)
            assert lease is not None and (lease.key, lease.fence) == (key, fence)
        await _alembic(provider, "downgrade", "0004")
        assert await _stored_keys(provider) == sorted(keys)


def test_the_head_revision_constant_is_alembics_head() -> None:
    from alembic.script import ScriptDirectory

    from sql_lease.sql.migrate import HEAD_REVISION, alembic_config

    assert ScriptDirectory.from_config(alembic_config(LeaseTableNames())).get_current_head() == HEAD_REVISION


_MIGRATE_IN_A_PROCESS = """
import asyncio, sys
from sql_lease import SqlLeaseProvider, SyncSqlLeaseProvider

async def main():
    async with SqlLeaseProvider(sys.argv[1], table_name=sys.argv[2]) as provider:
        print(await provider.migrate())
        assert (await provider.acquire_lease("k-" + sys.argv[3], "o", 60_000)).acquired

asyncio.run(main())
"""


@pytest.mark.slow
def test_concurrent_migrations_of_a_new_sqlite_file_in_separate_processes(tmp_path: Path) -> None:
    """SQLite migrations serialise on the database's own write lock (BEGIN IMMEDIATE), not on a
    lock file: eight processes migrating one new file all succeed, and no file but the database
    (and its WAL files) is left."""
    url = f"sqlite:///{tmp_path}/race.db"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _MIGRATE_IN_A_PROCESS, url, table, str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, table in enumerate(["sql_leases", "other_leases"] * 4)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0 and out.strip() == HEAD_REVISION, err
    assert {p.name for p in tmp_path.iterdir()} <= {"race.db", "race.db-wal", "race.db-shm"}


_MIGRATE_AT_ONCE = """
import asyncio, sys, time
from sql_lease import SqlLeaseProvider

async def main():
    async with SqlLeaseProvider(sys.argv[1], schema=sys.argv[2], table_name=sys.argv[3]) as provider:
        time.sleep(max(0.0, float(sys.argv[4]) - time.time()))  # every process starts its migrate at once
        print(await provider.migrate())

asyncio.run(main())
"""


@pytest.mark.slow
@pytest.mark.mysql
def test_concurrent_migrations_in_separate_processes_agree_on_mysql(fresh_mysql_db: str) -> None:
    """Parallel deploys on MySQL/MariaDB (whose DDL commits by itself) wait for each other on a named
    lock: every migrate of a new table, and of a table several revisions behind, succeeds, and the
    version table records one revision."""
    url, database = MYSQL_URL, fresh_mysql_db

    def migrate_at_once(table: str) -> None:
        start = time.time() + 4
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _MIGRATE_AT_ONCE, url, database, table, str(start)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(4)
        ]
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0 and out.strip() == HEAD_REVISION, err[-2000:]
        conn = mysql_connect(url)
        try:
            with conn.cursor() as cursor:
                cursor.execute(f"SELECT version_num FROM `{database}`.`{table}_alembic_version`")
                assert cursor.fetchall() == ((HEAD_REVISION,),)
        finally:
            conn.close()

    migrate_at_once("fresh_leases")
    import sqlalchemy as sa

    from sql_lease.sql.migrate import alembic_config

    engine = sa.create_engine(url.replace("mysql://", "mysql+pymysql://", 1))
    try:
        with engine.begin() as connection:
            from alembic import command

            names = LeaseTableNames(table="behind_leases", schema=database)
            command.upgrade(alembic_config(names, connection=connection), "0004")
    finally:
        engine.dispose()
    migrate_at_once("behind_leases")


@pytest.mark.parametrize("url", ["postgresql://deploy:hunter2@db.internal/app", "sqlite:///leases.db"])
def test_offline_sql_for_a_dba(url: str) -> None:
    sql = offline_sql(url, LeaseTableNames())
    assert "CREATE TABLE sql_leases" in sql
    assert "CREATE TABLE sql_lease_alembic_version" in sql
    assert "hunter2" not in sql
    if url.startswith("postgresql"):
        assert "CREATE SEQUENCE sql_leases_fence_seq" in sql
    else:
        assert "CREATE TRIGGER" in sql


@pytest.mark.mysql
def test_offline_mysql_sql_runs_in_the_mysql_client_and_creates_the_slot_procedures() -> None:
    """``sql-lease migrate --sql`` on MySQL: a script the ``mysql`` client runs as it is (``DELIMITER`` around
    each ``CREATE PROCEDURE``, whose body has semicolons of its own); semaphores work on what it made."""
    import shutil

    import sqlalchemy as sa

    client = shutil.which("mariadb") or shutil.which("mysql")
    assert client is not None, "the offline script needs the mariadb (or mysql) client: apt-get install mariadb-client"
    database = f"sql_lease_m_{uuid.uuid4().hex[:10]}"
    mysql_execute(MYSQL_URL, f"CREATE DATABASE `{database}`")
    try:
        parsed = sa.make_url(MYSQL_URL)
        script = offline_sql(MYSQL_URL, LeaseTableNames())
        assert script.count("DELIMITER //") == 2
        login = [f"--host={parsed.host}", f"--port={parsed.port or 3306}", f"--user={parsed.username}"]
        login += [f"--password={parsed.password}"] if parsed.password else []
        done = subprocess.run([client, *login, database], input=script, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        with SyncSqlLeaseProvider(MYSQL_URL, schema=database) as provider:
            assert provider.acquire_lease("sem", "a", 60_000, limit=2).acquired
            assert provider.acquire_lease("sem", "b", 60_000, limit=2).acquired
            assert not provider.acquire_lease("sem", "c", 60_000, limit=2).acquired
            assert provider.release_lease("sem", "a")
    finally:
        mysql_execute(MYSQL_URL, f"DROP DATABASE IF EXISTS `{database}`")


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_alembic_upgrade_head_from_a_checkout(any_target: dict[str, Any]) -> None:
    alembic = str(Path(sys.executable).with_name("alembic"))
    x_args = ["-x", f"url={any_target['url']}"]
    if any_target["schema"]:
        x_args += ["-x", f"schema={any_target['schema']}"]
    done = _run([alembic, *x_args, "upgrade", "head"], REPO)
    assert done.returncode == 0, done.stderr
    done = _run([alembic, *x_args, "current"], REPO)
    assert f"{HEAD_REVISION} (head)" in done.stdout, done.stdout + done.stderr


@pytest.mark.mysql
@pytest.mark.parametrize(("withheld", "stops_at"), [("CREATE ROUTINE", "0008"), ("CREATE TEMPORARY TABLES", "0004")])
def test_alembic_upgrade_head_from_a_checkout_that_stops_partway_on_mysql_resumes(withheld: str, stops_at: str) -> None:
    """``alembic upgrade head`` as a MySQL user without a privilege a revision needs stops at the revision
    before it, each revision committed with its version row; granted, the same command completes."""
    from sqlalchemy.engine import make_url

    alembic = str(Path(sys.executable).with_name("alembic"))
    database, user = f"sql_lease_m_{uuid.uuid4().hex[:10]}", f"lease_mig_{uuid.uuid4().hex[:8]}"
    mysql_execute(
        MYSQL_URL,
        f"CREATE DATABASE `{database}`",
        f"CREATE USER '{user}'@'%' IDENTIFIED BY 'pw-{user}'",
        f"GRANT {_MIGRATOR_GRANTS.replace(', ' + withheld, '')} ON `{database}`.* TO '{user}'@'%'",
    )
    url = make_url(MYSQL_URL).set(username=user, password=f"pw-{user}", database=database)
    x_args = ["-x", f"url={url.render_as_string(hide_password=False)}"]
    try:
        done = _run([alembic, *x_args, "upgrade", "head"], REPO)
        assert done.returncode != 0 and "1044" in done.stderr, done.stderr[-2000:]
        assert _mysql_facts(database)["versions"] == ((stops_at,),)
        mysql_execute(MYSQL_URL, f"GRANT {withheld} ON `{database}`.* TO '{user}'@'%'")
        done = _run([alembic, *x_args, "upgrade", "head"], REPO)
        assert done.returncode == 0, done.stderr[-2000:]
        assert _mysql_facts(database)["versions"] == ((HEAD_REVISION,),)
    finally:
        mysql_execute(MYSQL_URL, f"DROP USER IF EXISTS '{user}'@'%'", f"DROP DATABASE IF EXISTS `{database}`")


def test_alembic_reads_the_url_from_the_environment(tmp_path: Path) -> None:
    alembic = str(Path(sys.executable).with_name("alembic"))
    env = dict(os.environ, SQL_LEASE_URL=f"sqlite:///{tmp_path}/env.db")
    done = _run([alembic, "upgrade", "head"], REPO, env)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "env.db").exists()


@pytest.mark.slow
def test_wheel_carries_the_migrations_and_migrate_works_installed(tmp_path: Path) -> None:
    done = _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path / "dist")], REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = (tmp_path / "dist").glob("sql_lease-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "sql_lease/py.typed" in names
    assert "sql_lease/_migrations/env.py" in names
    assert "sql_lease/_migrations/versions/0001_create_lease_table.py" in names
    assert "sql_lease/_migrations/versions/0002_fence_table.py" in names
    assert "sql_lease/_migrations/versions/0003_lease_data.py" in names
    assert "sql_lease/_migrations/versions/0004_released.py" in names
    assert "sql_lease/_migrations/versions/0005_any_str_keys.py" in names
    site = tmp_path / "site"
    done = _run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(site), str(wheel)], tmp_path)
    assert done.returncode == 0, done.stderr
    env = dict(os.environ, PYTHONPATH=str(site))
    done = _run([sys.executable, "-c", "import sql_lease; print(sql_lease.__file__)"], tmp_path, env)
    assert done.stdout.startswith(str(site)), done.stdout + done.stderr  # the installed copy, not the checkout
    db = tmp_path / "installed.db"
    done = _run([sys.executable, "-m", "sql_lease", "migrate", "--url", f"sqlite:///{db}"], tmp_path, env)
    assert done.returncode == 0, done.stderr
    assert f"revision {HEAD_REVISION}" in done.stdout


@pytest.mark.postgres
async def test_postgres_lease_connections_never_plan_sequential_scans(pg_schema: tuple[str, str]) -> None:
    """Regression: a generic plan cached while the table was empty (a sequential scan) made every
    statement scan the whole table once it had grown; 10,000 renewals every 5 s fell behind."""
    url, schema = pg_schema
    from sql_lease.sql.operations import Query

    def show() -> Any:
        return (yield Query("SHOW enable_seqscan", ()))

    async with SqlLeaseProvider(url, schema=schema) as provider:
        row = await provider._executor.run(show)  # a connection of the provider's own pool
        assert row[0] == "off"


async def test_a_cancelled_migration_never_keeps_the_process_lock(tmp_path: Path) -> None:
    """Regression: the process-wide migration lock was taken in a worker thread; a migrate()
    cancelled while waiting for it took it afterwards and never released it, wedging every later
    migrate() in the process."""
    from sql_lease.sql import migrate

    async with SqlLeaseProvider(f"sqlite:///{tmp_path}/cancel.db") as provider:
        assert migrate._PROCESS_LOCK.acquire(blocking=False)  # another migration is under way
        try:
            waiting = asyncio.ensure_future(provider.migrate())
            await asyncio.sleep(0.2)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
        finally:
            migrate._PROCESS_LOCK.release()
        await asyncio.sleep(0.2)
        assert not migrate._PROCESS_LOCK.locked()
        assert await asyncio.wait_for(provider.migrate(), 10) == HEAD_REVISION


# -- configuration errors are configuration errors, on both faces (issue 21, item 3) -------------------


def _with(pg_url: str, **parts: Any) -> str:
    from sqlalchemy.engine import make_url

    return make_url(pg_url).set(**parts).render_as_string(hide_password=False)


async def _migrate_both_faces(url: str) -> list[BaseException]:
    """The error each face's ``migrate()`` raises for ``url``."""
    from sql_lease import SyncSqlLeaseProvider

    errors: list[BaseException] = []
    async with SqlLeaseProvider(url) as provider:
        with pytest.raises(Exception) as raised:
            await provider.migrate()
        errors.append(raised.value)

    def sync() -> None:
        with SyncSqlLeaseProvider(url) as provider, pytest.raises(Exception) as raised:
            provider.migrate()
        errors.append(raised.value)

    await asyncio.to_thread(sync)
    return errors


def _assert_config_error(error: BaseException, *words: str, secret: str | None = None, cause: bool = True) -> None:
    from sql_lease import LeaseConfigError

    message = str(error)
    assert isinstance(error, LeaseConfigError), repr(error)
    assert not cause or error.__cause__ is not None
    assert "\n" not in message and "sqlalche.me" not in message and "Background on this error" not in message
    for word in words:
        assert word in message, message
    if secret is not None:
        assert secret not in message


@pytest.mark.postgres
async def test_migrate_of_a_missing_database_is_a_configuration_error(pg_url: str) -> None:
    for error in await _migrate_both_faces(_with(pg_url, database="sql_lease_no_such_db")):
        _assert_config_error(error, "sql_lease_no_such_db", "does not exist")


@pytest.mark.postgres
async def test_migrate_as_an_unknown_role_is_a_configuration_error(pg_url: str) -> None:
    url = _with(pg_url, username="sql_lease_no_such_role", password="hunter2")
    for error in await _migrate_both_faces(url):
        _assert_config_error(error, "sql_lease_no_such_role", secret="hunter2")


@pytest.fixture(scope="module")
def password_cluster() -> Any:
    """A throwaway cluster that checks passwords on 127.0.0.1 (the shared one trusts loopback),
    with a role ``lease_user`` whose password is ``right-password``. Yields the cluster's URL."""
    import tempfile

    from tests.support.pgserver import throwaway_postgres

    hba_dir = tempfile.mkdtemp(prefix="sql_lease_hba_")
    os.chmod(hba_dir, 0o755)
    hba = Path(hba_dir) / "pg_hba.conf"
    hba.write_text(
        "local all all trust\nhost all postgres 127.0.0.1/32 trust\nhost all all 127.0.0.1/32 scram-sha-256\n"
    )
    hba.chmod(0o644)
    with throwaway_postgres(hba_file=str(hba), log_min_messages="fatal") as (url, _executor):
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE ROLE lease_user LOGIN PASSWORD 'right-password'")
        yield url


@pytest.mark.postgres
@pytest.mark.slow
async def test_migrate_with_a_wrong_password_is_a_configuration_error(password_cluster: str) -> None:
    wrong = _with(password_cluster, username="lease_user", password="wrong-password")
    for error in await _migrate_both_faces(wrong):
        _assert_config_error(error, "password", "lease_user", secret="wrong-password")
    # the right password gets past authentication (to a missing privilege, another configuration error)
    right = _with(password_cluster, username="lease_user", password="right-password")
    for error in await _migrate_both_faces(right):
        assert "password authentication failed" not in str(error)


async def test_migrate_of_an_unopenable_sqlite_file_is_a_configuration_error(tmp_path: Path) -> None:
    (tmp_path / "a-directory.db").mkdir()
    for error in await _migrate_both_faces(f"sqlite:///{tmp_path}/a-directory.db"):
        _assert_config_error(error, "a-directory.db", "not a file", cause=False)


def test_sqlite_that_cannot_open_its_file_is_a_configuration_error() -> None:
    import sqlite3

    from sql_lease.sql.migrate import migrate_error

    error = migrate_error(sqlite3.OperationalError("unable to open database file"), "sqlite:////srv/x.db")
    _assert_config_error(error, "/srv/x.db", "cannot be opened", cause=False)
    other = migrate_error(sqlite3.OperationalError("disk I/O error"), "sqlite:////srv/x.db")
    assert type(other).__name__ == "LeaseBackendError" and "disk I/O error" in str(other)


async def test_0007_sqlite_slot_trigger_never_takes_a_live_plain_lease(tmp_path: Path) -> None:
    """The grant trigger turns only an expired plain lease's row into a semaphore's head: a slot row
    written under a live plain lease (an edit by hand; no statement of sql_lease writes one) leaves
    the plain holder its lease."""
    path = tmp_path / "sem.db"
    async with SqlLeaseProvider(f"sqlite:///{path}") as provider:
        await provider.migrate()
        granted = await provider.acquire_lease("k", "plain", 60_000)
        assert granted.acquired
        names = provider.names
    with sqlite3.connect(path) as conn:
        conn.execute(
            f'INSERT INTO "{names.slot_table}" (key, owner, fence, expires_at, acquired_at) '
            "SELECT key, 'slot', fence + 1, expires_at, acquired_at FROM "
            f'"{names.table}" WHERE key = ?',
            ("k",),
        )
    async with SqlLeaseProvider(f"sqlite:///{path}") as provider:
        lease = await provider.get_lease("k")
        assert lease is not None and (lease.owner, lease.fence) == ("plain", granted.fence)


@pytest.mark.mysql
def test_an_applications_mariadb_engine_migrates_as_a_mysql_url_does() -> None:
    """SQLAlchemy names the dialect of a ``mariadb+pymysql://`` engine "mariadb": its migrate commits
    each revision and says what a refused one needs, as a ``mysql://`` URL's does (a review found it
    took the other dialects' path)."""
    import sqlalchemy as sa

    from sql_lease import LeaseConfigError

    with _mysql_migrator("SELECT, INSERT, UPDATE, DELETE, CREATE, DROP, INDEX, ALTER, CREATE TEMPORARY TABLES") as (
        database,
        user,
        as_user,
    ):
        engine = sa.create_engine(as_user.replace("mysql://", "mariadb+pymysql://", 1))
        try:
            provider = SyncSqlLeaseProvider(engine, schema=database)
            with pytest.raises(LeaseConfigError, match=r"CREATE ROUTINE.*resumes at revision 0009"):
                provider.migrate()
            mysql_execute(MYSQL_URL, f"GRANT CREATE ROUTINE, ALTER ROUTINE ON `{database}`.* TO '{user}'@'%'")
            assert provider.migrate() == HEAD_REVISION
            provider.close()
        finally:
            engine.dispose()


@pytest.mark.mysql
def test_a_mysql_migration_lock_on_a_lost_connection_raises_the_loss() -> None:
    """The connection lost inside the migration lock: the loss is raised, not SQLAlchemy's complaint
    about releasing the lock on it (the server released it with the connection)."""
    import sqlalchemy as sa

    from sql_lease.sql.migrate import migration_lock

    engine = sa.create_engine(MYSQL_URL.replace("mysql://", "mysql+pymysql://", 1))
    try:
        with engine.connect() as connection, pytest.raises(sa.exc.OperationalError), migration_lock(connection):
            own = connection.execute(sa.text("SELECT CONNECTION_ID()")).scalar()
            with engine.connect() as other:
                other.execute(sa.text(f"KILL {own}"))
            connection.execute(sa.text("SELECT 1"))
    finally:
        engine.dispose()
