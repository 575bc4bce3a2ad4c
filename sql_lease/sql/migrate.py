"""Running the Alembic migrations that ship with the package, on an engine or for offline SQL.

The Alembic environment is ``migrations/`` in a checkout and ``sql_lease/_migrations`` inside an
installed wheel. It keeps version tables of its own (``sql_lease_alembic_version`` for the default
lease table, ``<table>_alembic_version`` for others) so it never touches the host application's
Alembic history, and each lease table is migrated on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import itertools
import os
import re
import sqlite3
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ..errors import LeaseBackendError, LeaseConfigError, LeaseError
from .schema import DEFAULT_VERSION_TABLE, LeaseTableNames
from .urls import MASK, sqlite_file

if TYPE_CHECKING:
    from alembic.config import Config

__all__ = [
    "HEAD_REVISION",
    "Upgrade",
    "alembic_config",
    "create_fence_table",
    "fence_table_sql",
    "migrate_error",
    "migrations_dir",
    "mysql_object_missing",
    "offline_sql",
    "read_state",
    "upgrade_engine",
    "upgrade_engine_report",
    "upgrade_sync_engine",
]

NAMES_ATTRIBUTE = "sql_lease_names"
# True: the connection's transactions are the migration's to end (on MySQL, one committed per revision)
COMMITS_ATTRIBUTE = "sql_lease_commits"

# The newest revision in migrations/versions (tests/test_migrations.py checks it against Alembic's
# view). Kept here so that checking a schema that is up to date needs no Alembic at all.
HEAD_REVISION = "0010"


def migrations_dir() -> Path:
    """The Alembic environment: packaged in the wheel, or ``migrations/`` of a source checkout."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "_migrations", package.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise LeaseError(f"sql_lease's migrations are missing next to {package}; reinstall the package")


def alembic_config(names: LeaseTableNames, **attributes: Any) -> Config:
    """An Alembic ``Config`` for the packaged migrations and the tables named by ``names``."""
    from alembic.config import Config

    config = Config(stdout=io.StringIO())
    config.set_main_option("script_location", str(migrations_dir()))
    config.attributes[NAMES_ATTRIBUTE] = names
    config.attributes.update(attributes)
    return config


@dataclasses.dataclass(frozen=True)
class Upgrade:
    """What one upgrade did, as read under the migration lock (so concurrent runs each tell the
    truth: one created the table, the others found it).

    ``table_existed``: the lease table was there before; ``previous``: the revisions its version
    table recorded then (None: no version table); ``revision``: the revision now in place."""

    table_existed: bool
    previous: tuple[str, ...] | None
    revision: str | None

    @property
    def changed(self) -> bool:
        """True if this run created or upgraded something."""
        return not (self.table_existed and self.previous == (self.revision,))


async def upgrade_engine(engine: AsyncEngine, names: LeaseTableNames) -> str | None:
    """Upgrade the lease schema on ``engine`` to head; returns the revision now in place
    (:func:`upgrade_engine_report` says also what was there before).

    A schema already at head costs one connection and two or three small reads; Alembic runs only
    when something is missing. Each lease table has a version table of its own (see
    :class:`LeaseTableNames`); a table that exists under the shared version table of earlier
    releases is taken over at its revision there.

    Concurrent upgrades are serialised: within this process by a lock (Alembic's ``context`` and
    ``op`` are process-global), across processes by the database itself: on PostgreSQL an
    advisory lock, on SQLite the write lock of ``BEGIN IMMEDIATE`` on the migrating connection
    (the whole upgrade is one transaction; no lock file). A missing SQLite database file is
    created here, and only here (its directory must exist).
    """
    return (await upgrade_engine_report(engine, names)).revision


async def upgrade_engine_report(engine: AsyncEngine, names: LeaseTableNames) -> Upgrade:
    """:func:`upgrade_engine`, returning what it did (:class:`Upgrade`, read under the migration
    lock). Raises as :func:`upgrade_engine` does."""
    try:
        return await _upgrade_engine(engine, names)
    except LeaseError:
        raise
    except Exception as exc:
        raise migrate_error(exc, engine.url) from exc


async def _upgrade_engine(engine: AsyncEngine, names: LeaseTableNames) -> Upgrade:
    head = HEAD_REVISION
    mysql = engine.dialect.name in ("mysql", "mariadb")
    if engine.dialect.name == "sqlite":
        await asyncio.to_thread(_create_sqlite_file, engine.url)
    async with engine.connect() as conn:
        table_exists, versions = await conn.run_sync(read_state, names)
        problems = await conn.run_sync(mysql_setup_problems, names) if mysql else []
        await conn.rollback()
    _refuse(problems, engine)  # before anything is created
    if table_exists and versions == (head,):
        return Upgrade(True, versions, head)
    async with _locked(_PROCESS_LOCK):
        upgrade = await _upgrade_in_transaction(engine, names, head)
    if mysql:  # tables just created: a server without InnoDB may have given them another engine
        async with engine.connect() as conn:
            _refuse(await conn.run_sync(mysql_setup_problems, names), engine)
    return upgrade


def mysql_setup_problems(connection: Connection, names: LeaseTableNames) -> list[str]:
    """What makes a MySQL session or lease table unfit, in words (none: fit): the session's
    ``sql_mode`` without ``STRICT_TRANS_TABLES`` (or ``STRICT_ALL_TABLES``), where a value that does
    not fit a column is cut short with a warning instead of refused, and a lease table that is not
    InnoDB, which has neither row locks nor transactions (two owners could be granted one lease)."""
    tables = (names.table, names.fence_counter, names.fence_table)
    row = connection.exec_driver_sql(
        "SELECT @@SESSION.sql_mode, (SELECT GROUP_CONCAT(CONCAT(TABLE_NAME, ' is ', ENGINE) ORDER BY TABLE_NAME "
        "SEPARATOR ', ') FROM information_schema.TABLES WHERE TABLE_SCHEMA = COALESCE(%(schema)s, DATABASE()) "
        "AND TABLE_NAME IN (%(t0)s, %(t1)s, %(t2)s) AND ENGINE <> 'InnoDB')",
        {"schema": names.schema, "t0": tables[0], "t1": tables[1], "t2": tables[2]},
    ).one()
    problems = []
    modes = str(row[0] or "").split(",")
    if "STRICT_TRANS_TABLES" not in modes and "STRICT_ALL_TABLES" not in modes:
        problems.append(
            f"the session's sql_mode ({row[0] or 'empty'}) lacks STRICT_TRANS_TABLES, so a value that does not "
            "fit would be cut short instead of refused: add it to the server's sql_mode (the default since "
            "MySQL 5.7 and MariaDB 10.2.4) or to your engine's connections"
        )
    if row[1]:
        problems.append(
            f"the lease tables must use InnoDB (row locks and transactions), but {row[1]}: "
            "ALTER TABLE ... ENGINE=InnoDB (with the server's InnoDB enabled)"
        )
    return problems


def mysql_denied(connection: Connection, explained: str) -> bool | None:
    """Whether MySQL refuses ``EXPLAIN explained`` for a missing privilege (1142, 1143): it checks
    the statement's privileges without running it. None if a table it names does not exist (1146)."""
    from .translate import mysql_errno

    try:
        connection.exec_driver_sql(f"EXPLAIN {explained}")
    except sa.exc.DBAPIError as exc:
        errno = mysql_errno(exc)
        if errno in (1142, 1143, 1146):
            return None if errno == 1146 else True
        raise
    return False


def _refuse(problems: list[str], engine: AsyncEngine) -> None:
    """``LeaseConfigError`` naming ``problems`` (see :func:`mysql_setup_problems`), if any."""
    from .urls import safe_url

    if problems:
        raise LeaseConfigError(f"migrating {safe_url(engine.url)}: {'; '.join(problems)}")


def upgrade_sync_engine(engine: Engine, names: LeaseTableNames) -> str | None:
    """:func:`upgrade_engine` on a synchronous PostgreSQL ``engine`` (no asyncpg needed); returns
    the revision now in place. Serialised as there: this process's lock, then the advisory lock."""
    if engine.dialect.name == "sqlite":
        raise ValueError("upgrade_sync_engine is for PostgreSQL; SQLite databases are upgraded by upgrade_engine")
    try:
        return _upgrade_sync_engine(engine, names)
    except LeaseError:
        raise
    except Exception as exc:
        raise migrate_error(exc, engine.url) from exc


def _upgrade_sync_engine(engine: Engine, names: LeaseTableNames) -> str | None:
    with engine.connect() as conn:
        table_exists, versions = read_state(conn, names)
        conn.rollback()
    if table_exists and versions == (HEAD_REVISION,):
        return HEAD_REVISION
    with _PROCESS_LOCK, engine.connect() as conn:
        upgrade = _upgrade_sync(conn, names, HEAD_REVISION)
        conn.commit()
        return upgrade.revision


# Errors no retry can fix: the URL names a database, role or password the server refuses, the role
# may not create the schema, or SQLite cannot open the file. SQLSTATE class 28 is authorization.
_CONFIG_STATES = {
    "3D000": "the database does not exist: create it or fix the database name in the URL",
    "42501": (
        "the role lacks a privilege that migrate needs (CREATE on the database or schema; on MySQL also CREATE "
        "ROUTINE, for the slot procedures of revision 0009)"
    ),
    "42704": "the role does not exist: create it or fix the user name in the URL",
}
_AUTHORIZATION = "the server refused the role or its password: check the user and password of the URL"
# psycopg reports a refused connection without its SQLSTATE (libpq keeps only the text): the
# server's words then decide, as they read with lc_messages in English.
_REFUSED_CONNECTION = (
    (re.compile(r'FATAL:\s+database ".*" does not exist'), "3D000"),
    (re.compile(r'FATAL:\s+role ".*" does not exist'), "28000"),
    (re.compile(r"FATAL:\s+(password|[\w-]+) authentication failed"), "28P01"),
    (re.compile(r"FATAL:\s+no pg_hba\.conf entry"), "28000"),
    (re.compile(r"FATAL:\s+permission denied for database"), "42501"),
)
_SQLITE_CONFIG = {
    "unable to open database file": "the SQLite database file cannot be opened: check its path and permissions",
    "readonly database": "the SQLite database is read-only to this user: check its permissions",
}


def _driver_message(exc: BaseException, password: str | None) -> str:
    """The driver's own words for ``exc`` on one line: without SQLAlchemy's wrapper (its
    documentation link, its statement) and with the URL's password masked."""
    orig = getattr(exc, "orig", None)
    inner: BaseException = orig if isinstance(orig, BaseException) else exc
    message = " ".join(str(inner).split()) or type(inner).__name__
    if password:
        message = message.replace(password, MASK)
    return message


def migrate_error(
    exc: BaseException, url: URL | str, what: str = "migrating", privilege_hint: str | None = None
) -> LeaseError:
    """The library's error for a driver error raised while ``what`` (``migrating``) the database
    at ``url``: ``LeaseConfigError`` for a missing database or role, a refused password, a missing
    privilege (said by ``privilege_hint`` if given) or an SQLite file that cannot be opened; else
    ``LeaseBackendError``. One line, the URL and the driver's text with the password masked; the
    original goes on ``__cause__``."""
    from .translate import UNKNOWN_HOST_HINT, sqlstate, unknown_host
    from .urls import safe_url

    url = sa.engine.make_url(url) if isinstance(url, str) else url
    where = safe_url(url)
    message = _driver_message(exc, url.password if isinstance(url.password, str) else None)
    state = sqlstate(exc)
    if state is None:
        state = next((code for pattern, code in _REFUSED_CONNECTION if pattern.search(message)), None)
    hint = _CONFIG_STATES.get(state or "") or (_AUTHORIZATION if state and state.startswith("28") else None)
    if state == "42501" and privilege_hint is not None:
        hint = privilege_hint
    if hint is None and _sqlite_error(exc) is not None:
        hint = next((h for text, h in _SQLITE_CONFIG.items() if text in str(_sqlite_error(exc))), None)
    if hint is None and unknown_host(exc):
        hint = UNKNOWN_HOST_HINT
    if hint is not None:
        return LeaseConfigError(f"{what} {where}: {hint} ({message})")
    inner = getattr(exc, "orig", None) or exc
    return LeaseBackendError(f"{what} {where} failed: {type(inner).__name__}: {message}")


def _sqlite_error(exc: BaseException) -> sqlite3.Error | None:
    seen: BaseException | None = exc
    for _ in range(6):
        if seen is None or isinstance(seen, sqlite3.Error):
            return seen
        seen = getattr(seen, "orig", None) or seen.__cause__
    return None


def _create_sqlite_file(url: URL) -> None:
    path = sqlite_file(url)
    if path is not None and path.exists():
        # checked here, not by a failing connect: aiosqlite's thread outlives a failed connect
        if not path.is_file():
            raise LeaseConfigError(f"the SQLite database {path} is not a file; fix the path in the URL")
        if not os.access(path, os.R_OK | os.W_OK):
            raise LeaseConfigError(f"the SQLite database {path} is not readable and writable by this user")
        return
    if path is None:
        return
    if not path.parent.is_dir():
        raise LeaseConfigError(f"the directory {path.parent} of the SQLite database does not exist; create it first")
    sqlite3.connect("file:" + quote(str(path), safe="/") + "?mode=rwc", uri=True).close()


def read_state(connection: Connection, names: LeaseTableNames) -> tuple[bool, tuple[str, ...] | None]:
    """(does the lease table exist, the revisions in its version table or None if that is missing);
    ``LeaseConfigError`` saying what to do if the role may not read the version table."""
    from .translate import sqlstate

    dialect = connection.dialect
    table_exists = dialect.has_table(connection, names.table, schema=names.schema)
    try:
        return table_exists, _versions(connection, names.version_table, names.schema)
    except sa.exc.DBAPIError as exc:  # a role that may not read it: most often the application's
        if sqlstate(exc) != "42501":
            raise
        hint = _reading_versions_hint(connection, names)
        raise migrate_error(exc, connection.engine.url, privilege_hint=hint) from exc


def _versions(connection: Connection, version_table: str, schema: str | None) -> tuple[str, ...] | None:
    if not connection.dialect.has_table(connection, version_table, schema=schema):
        return None
    table = sa.table(version_table, sa.column("version_num"), schema=schema)
    return tuple(sorted(connection.execute(sa.select(table.c.version_num)).scalars()))


def _reading_versions_hint(connection: Connection, names: LeaseTableNames) -> str:
    """What to do when the migrating role may not read the version table (most often: migrate run as
    the application's role, whose grants cover only the lease operations)."""
    quote = connection.dialect.identifier_preparer.quote
    table = ".".join(quote(part) for part in (names.schema, names.version_table) if part)
    return (
        f"the role may not read the version table {names.version_table}, so migrate cannot tell the schema's "
        "revision; run migrate as the role that owns the lease tables (the application's role need not "
        f"migrate), or let this role check it: GRANT SELECT ON {table}"
    )


def _upgrade_sync(connection: Connection, names: LeaseTableNames, head: str) -> Upgrade:

    with migration_lock(connection):  # concurrent deploys wait here, then find head
        return _upgrade_locked(connection, names, head)


def _upgrade_locked(connection: Connection, names: LeaseTableNames, head: str) -> Upgrade:
    from alembic import command
    from alembic.runtime.migration import MigrationContext

    table_exists, versions = read_state(connection, names)  # under the lock: what this run finds
    if table_exists and versions == (head,):
        return Upgrade(True, versions, head)
    where = f"{names.schema}.{names.table}" if names.schema else names.table
    mysql = connection.dialect.name in ("mysql", "mariadb")
    # a first migrate that stopped within 0001 (MySQL commits each DDL): 0001 runs again, skipping what exists
    stopped_in_0001 = (
        mysql and versions == () and not connection.dialect.has_table(connection, names.fence_table, names.schema)
    )
    if table_exists and not versions and not stopped_in_0001:
        # Earlier releases kept every lease table's revision in the shared version table.
        legacy = _versions(connection, DEFAULT_VERSION_TABLE, names.schema)
        if names.version_table == DEFAULT_VERSION_TABLE or not legacy or len(legacy) != 1:
            raise LeaseError(
                f"lease table {where} exists but its version table {names.version_table} records no "
                "revision, so its schema version is unknown; if it is complete, record its revision "
                f"with `alembic -x table={names.table} -x version_table={names.version_table} stamp <revision>`"
            )
        command.stamp(alembic_config(names, connection=connection), legacy[0])
        versions = legacy
    elif versions and not table_exists:
        if versions != (head,):
            raise LeaseError(
                f"lease table {where} does not exist but its version table {names.version_table} records "
                f"revision {', '.join(versions)}: that version table belongs to another lease table; give "
                f"{names.table} a version table of its own (leave out --version-table / version_table)"
            )
        # The version table is shared with another table at head: build this one from the start.
        connection.execute(sa.delete(sa.table(names.version_table, schema=names.schema)))
    if not mysql:
        command.upgrade(alembic_config(names, connection=connection), "head")
    else:
        # env.py commits each revision with its version row, and the revisions skip what a migrate that
        # stopped partway made (docs/operations.md): what stopped is named, and a re-run resumes there.
        try:
            command.upgrade(alembic_config(names, connection=connection, **{COMMITS_ATTRIBUTE: True}), "head")
        except sa.exc.DBAPIError as exc:
            hint = _mysql_privilege_hint(connection, exc, names)
            raise migrate_error(exc, connection.engine.url, privilege_hint=hint) from exc
    context = MigrationContext.configure(
        connection,
        opts={"version_table": names.version_table, "version_table_schema": names.schema},
    )
    return Upgrade(table_exists, versions, context.get_current_revision())


MIGRATION_LOCK_WAIT_S = 3600
"""How long a MySQL migrate waits for another's migration lock, in seconds (PostgreSQL's waits on)."""


@contextlib.contextmanager
def migration_lock(connection: Connection) -> Iterator[None]:
    """Hold the database's migration lock on ``connection`` (re-entrant; env.py takes it too), so
    concurrent migrations run one after another: PostgreSQL's advisory lock until the transaction
    ends; on MySQL/MariaDB the named lock ``sql_lease migrate`` (DDL commits by itself there, so no
    transaction can hold it) until the block ends. SQLite's is the write lock its caller took.
    ``LeaseBackendError`` if MySQL's lock is not granted within :data:`MIGRATION_LOCK_WAIT_S`."""
    dialect = connection.dialect.name
    if dialect == "postgresql":
        connection.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext('sql_lease migrate'))"))
    if dialect not in ("mysql", "mariadb"):
        yield
        return
    granted = connection.execute(
        sa.text("SELECT GET_LOCK('sql_lease migrate', :wait)"), {"wait": MIGRATION_LOCK_WAIT_S}
    ).scalar()
    if granted != 1:
        raise LeaseBackendError(
            f"another migration held the lock 'sql_lease migrate' (MySQL GET_LOCK) for {MIGRATION_LOCK_WAIT_S} s"
        )
    try:
        yield
    finally:
        if not connection.invalidated:  # a connection lost meanwhile: the server released it
            with contextlib.suppress(sa.exc.DBAPIError, sa.exc.InvalidRequestError):
                connection.execute(sa.text("SELECT RELEASE_LOCK('sql_lease migrate')"))


# The privilege a MySQL migration statement needs, by how the statement begins.
_MYSQL_PRIVILEGES = (
    ("CREATE PROCEDURE", "CREATE ROUTINE"),
    ("CREATE TEMPORARY TABLE", "CREATE TEMPORARY TABLES"),
    ("CREATE INDEX", "INDEX"),
    ("CREATE TABLE", "CREATE"),
    ("ALTER TABLE", "ALTER"),
    ("DROP", "DROP"),
    ("INSERT", "INSERT"),
    ("UPDATE", "UPDATE"),
    ("DELETE", "DELETE"),
)


def _mysql_privilege_hint(connection: Connection, exc: sa.exc.DBAPIError, names: LeaseTableNames) -> str | None:
    """What to grant for a MySQL migration statement refused for a missing privilege, and that the same
    migrate then resumes at the revision that stopped (the revisions before it are committed)."""
    from alembic.script import ScriptDirectory

    statement = " ".join(str(exc.statement or "").split()).upper()
    privilege = next((p for start, p in _MYSQL_PRIVILEGES if statement.startswith(start)), None)
    if privilege is None:
        return None
    with contextlib.suppress(Exception):
        connection.rollback()
    try:
        done = _versions(connection, names.version_table, names.schema) or ()
        user, _, host = str(connection.exec_driver_sql("SELECT CURRENT_USER()").scalar_one()).rpartition("@")
        grantee = f"'{user}'@'{host}'"
    except sa.exc.DBAPIError:
        done, grantee = (), "the user"
    script = ScriptDirectory.from_config(alembic_config(names))
    after = done[0] if len(done) == 1 else None
    revision = next((r.revision for r in script.walk_revisions() if (r.down_revision or None) == after), "?")
    database = names.schema or connection.engine.url.database
    return (
        f"the user lacks {privilege} on database {database}, which revision {revision} needs: GRANT {privilege} "
        f"ON `{database}`.* TO {grantee}, then run the same migrate again; it resumes at revision {revision} "
        "(the revisions before it are in place)"
    )


def mysql_object_missing(kind: str, name: str, table: str | None = None) -> bool:
    """For a step of a migration that runs: False if the MySQL object it makes (``kind``: table, column or
    index of ``table``, procedure) is there already, left by a migrate that stopped partway (MySQL commits
    each DDL by itself); True elsewhere (offline SQL; PostgreSQL and SQLite, whose DDL is transactional)."""
    from alembic import context, op

    if context.is_offline_mode() or op.get_context().dialect.name not in ("mysql", "mariadb"):
        return True
    names: LeaseTableNames = context.config.attributes[NAMES_ATTRIBUTE]
    where, parameters = _MYSQL_OBJECTS[kind], {"schema": names.schema, "name": name, "table": table}
    return not op.get_bind().exec_driver_sql(f"SELECT COUNT(*) FROM {where}", parameters).scalar_one()


# information_schema's rows of an object of the database (``schema``, else the connection's)
_MYSQL_OBJECTS = {
    "table": (
        "information_schema.TABLES WHERE TABLE_SCHEMA = COALESCE(%(schema)s, DATABASE()) AND TABLE_NAME = %(name)s"
    ),
    "column": (
        "information_schema.COLUMNS WHERE TABLE_SCHEMA = COALESCE(%(schema)s, DATABASE()) "
        "AND TABLE_NAME = %(table)s AND COLUMN_NAME = %(name)s"
    ),
    "index": (
        "information_schema.STATISTICS WHERE TABLE_SCHEMA = COALESCE(%(schema)s, DATABASE()) "
        "AND TABLE_NAME = %(table)s AND INDEX_NAME = %(name)s"
    ),
    "procedure": (
        "information_schema.ROUTINES WHERE ROUTINE_SCHEMA = COALESCE(%(schema)s, DATABASE()) "
        "AND ROUTINE_TYPE = 'PROCEDURE' AND ROUTINE_NAME = %(name)s"
    ),
}


_PROCESS_LOCK = threading.Lock()


@contextlib.asynccontextmanager
async def _locked(lock: threading.Lock) -> AsyncIterator[None]:
    """Hold a process-wide lock without blocking the event loop. It is polled rather than awaited
    in a thread, so a cancelled wait never takes the lock after its waiter has gone."""
    delay = 0.001
    while not lock.acquire(blocking=False):
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.05)
    try:
        yield
    finally:
        lock.release()


async def _switch_to_wal(conn: AsyncConnection) -> None:
    """Put the database in WAL mode (as the provider's connections do) before taking its write lock.

    In rollback-journal mode, another process's first ``PRAGMA journal_mode = WAL`` would need
    to promote its read lock while this migration holds the write lock, and SQLite fails such a
    promotion at once ("database is locked") instead of waiting. Concurrent switches can fail the
    same way, so a failed one is retried for a while.
    """
    for attempt in itertools.count():
        try:
            await conn.exec_driver_sql("PRAGMA journal_mode = WAL")
            return
        except sa.exc.OperationalError as exc:
            if "locked" not in str(exc) or attempt >= 200:
                raise
        await asyncio.sleep(0.05)


async def _upgrade_in_transaction(engine: AsyncEngine, names: LeaseTableNames, head: str) -> Upgrade:
    async with engine.connect() as conn:
        if engine.dialect.name != "sqlite":
            upgrade = await conn.run_sync(_upgrade_sync, names, head)
            await conn.commit()
            return upgrade
        # pysqlite begins transactions only before DML, so DDL would run in autocommit: take the
        # transaction (and with it the database's write lock) explicitly instead.
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        await _switch_to_wal(conn)
        await conn.exec_driver_sql("BEGIN IMMEDIATE")
        try:
            upgrade = await conn.run_sync(_upgrade_sync, names, head)
        except BaseException:
            with contextlib.suppress(Exception):
                await conn.exec_driver_sql("ROLLBACK")
            raise
        await conn.exec_driver_sql("COMMIT")
        return upgrade


def offline_sql(url: str | URL, names: LeaseTableNames) -> str:
    """The SQL that upgrades an empty database to head, for a DBA to review and run (``--sql``)."""
    from alembic import command

    buffer = io.StringIO()
    config = alembic_config(names, offline_url=url)
    config.output_buffer = buffer
    command.upgrade(config, "head", sql=True)
    return buffer.getvalue()


# -- the fence table alone (`sql-lease migrate --fences-only`) ---------------------------------------
#
# accept_fence() may guard a resource in another database than the leases. There only the fence
# table is needed: it is created from lease_metadata() with CREATE TABLE IF NOT EXISTS (idempotent,
# concurrent runs are harmless), outside Alembic: that database gets no version table, and a later
# full `migrate` of it would adopt nothing (keep the two uses in separate databases or schemas).


def _fence_table(names: LeaseTableNames, dialect_name: str) -> sa.Table:
    from .schema import lease_metadata

    metadata = lease_metadata(names, dialect_name)
    return metadata.tables[f"{names.schema}.{names.fence_table}" if names.schema else names.fence_table]


def fence_table_sql(url: str | URL, names: LeaseTableNames) -> str:
    """The DDL of the fence table alone, for a DBA (``--fences-only --sql``)."""
    from .urls import to_async_url

    async_url = to_async_url(url)
    dialect = sa.create_mock_engine(async_url, lambda *a, **k: None).dialect
    ddl = sa.schema.CreateTable(_fence_table(names, dialect.name), if_not_exists=True)
    return str(ddl.compile(dialect=dialect)).strip() + ";\n"


async def create_fence_table(url: str | URL, names: LeaseTableNames) -> str:
    """Create only the fence table of ``names`` (and its schema) in the database at ``url``; its
    qualified name. A missing SQLite file is created (its directory must exist)."""
    from sqlalchemy.ext.asyncio import create_async_engine
    from sqlalchemy.pool import NullPool

    from .setup import async_engine_arguments

    engine_url, connect_args = async_engine_arguments(url)  # asyncpg or psycopg, libpq parameters mapped
    engine = create_async_engine(engine_url, poolclass=NullPool, connect_args=connect_args)
    try:
        if engine.dialect.name == "sqlite":
            await asyncio.to_thread(_create_sqlite_file, engine.url)
        async with engine.begin() as conn:
            if engine.dialect.name == "postgresql" and names.schema:
                await conn.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{names.schema}"')
            table = _fence_table(names, engine.dialect.name)
            await conn.execute(sa.schema.CreateTable(table, if_not_exists=True))
    except LeaseError:
        raise
    except Exception as exc:
        raise migrate_error(exc, engine.url, "creating the fence table in") from exc
    finally:
        await engine.dispose()
    return f"{names.schema}.{names.fence_table}" if names.schema else names.fence_table
