"""A SQL provider's setup, the rules both faces share (async, sync, Django), with no I/O.

What a provider is made of, decided from its arguments before any connection: the table's names
and the checked options (:func:`checked_sync_options` for the Django face), which engines each face takes
(:func:`engine_backend`), the SQLite file's directory, busy timeout and pragmas, and the messages
that tell an operator what to run (:func:`migrate_command_options`, :func:`schema_missing`,
:func:`database_file_missing`). The faces only open what these rules chose.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypedDict

from sqlalchemy.engine import URL

from ..errors import InvalidURLError, MissingDriverError, SchemaMissingError
from .operations import LOCK_WAIT_SHARE
from .options import MAX_SQLITE_BUSY_TIMEOUT_MS, ProviderOptions, validate_provider_options
from .retry import SQLITE_TRY_BUSY_TIMEOUT_MS
from .schema import DEFAULT_TABLE_NAME, LeaseTableNames, derived_version_table
from .statements import MYSQL_SESSION_SETUP
from .translate import describe, schema_outdated
from .urls import asyncpg_url_and_args, psycopg_conninfo, to_async_url

__all__ = [
    "ASYNC_ENGINE_DRIVERS",
    "SYNC_ENGINE_DRIVERS",
    "SyncProviderOptions",
    "autocommit_engine_options",
    "checked_sync_options",
    "database_file_missing",
    "engine_backend",
    "migrate_command_options",
    "mysql_connect_kwargs",
    "mysql_driver_checked",
    "mysql_engine",
    "mysql_lock_wait_s",
    "mysql_session_setup",
    "psycopg_conninfo_checked",
    "run_at_connect",
    "schema_missing",
    "sqlite_busy_timeout",
    "sqlite_directory",
    "sqlite_pragmas",
    "utc_timestamptz_loader",
]

# the drivers of an application's engine each face runs on, by backend
ASYNC_ENGINE_DRIVERS: Mapping[str, tuple[str, ...]] = {
    "postgresql": ("asyncpg", "psycopg"),
    "sqlite": ("aiosqlite",),
    "mysql": ("asyncmy", "aiomysql"),
}
SYNC_ENGINE_DRIVERS: Mapping[str, tuple[str, ...]] = {
    "postgresql": ("psycopg",),
    "sqlite": ("pysqlite",),
    "mysql": ("pymysql", "mysqldb"),
}


class SyncProviderOptions(TypedDict, total=False):
    """The keyword arguments of :class:`~sql_lease.SyncSqlLeaseProvider` after its URL or engine
    (see there for their meaning, units and defaults)."""

    table_name: str
    schema: str | None
    version_table: str | None
    operation_timeout_s: float
    pool_size: int | None
    sqlite_busy_timeout_ms: int | None
    sqlite_synchronous: str
    listen_notify: bool
    pgbouncer: bool


def checked_sync_options(options: SyncProviderOptions) -> tuple[LeaseTableNames, ProviderOptions]:
    """The table's names and the checked options of :class:`SyncProviderOptions` (the Django face's
    keywords), before any I/O: ``TypeError`` for a keyword the sync provider does not take or a
    wrong type, ``ValueError`` for a value out of range or a bad name."""
    unknown = sorted(set(options) - set(SyncProviderOptions.__annotations__))
    if unknown:
        raise TypeError(f"unexpected keyword argument(s): {', '.join(unknown)}")
    names = LeaseTableNames(
        options.get("table_name", DEFAULT_TABLE_NAME),
        options.get("schema"),
        options.get("version_table"),
    )
    checked = validate_provider_options(
        options.get("operation_timeout_s", 10.0),
        options.get("pool_size"),
        options.get("sqlite_busy_timeout_ms"),
        options.get("sqlite_synchronous", "FULL"),
    )
    return names, checked


def engine_backend(dialect_name: str, driver: str, drivers: Mapping[str, tuple[str, ...]], wanted: str) -> str:
    """The backend of an application's engine (``postgresql``/``sqlite``); ``ValueError`` naming
    ``wanted`` (the drivers this face takes, in words) for any other dialect or driver."""
    backend = "mysql" if dialect_name == "mariadb" else dialect_name
    if driver not in drivers.get(backend, ()):
        raise ValueError(f"the engine must use {wanted}, not {dialect_name}+{driver}")
    return backend


def sqlite_directory(path: Path) -> Path:
    """``path`` when its directory exists; ``ValueError`` telling to create it (only migrations
    create the database file, never its directory)."""
    if not path.parent.is_dir():
        raise ValueError(
            f"the directory {path.parent} of the SQLite database does not exist "
            "(or is not a directory); create it first"
        )
    return path


def sqlite_busy_timeout(given: int | None, operation_timeout_s: float, backend: str) -> int:
    """SQLite's busy timeout in milliseconds: ``given``, else half the operation timeout (the share an
    acquire may wait for a lock, ``LOCK_WAIT_SHARE``: a guarded expired lease is then answered "not
    acquired" within the time limit; at most SQLite's limit); ``ValueError`` when ``given`` for
    another backend than SQLite."""
    if given is not None and backend != "sqlite":
        raise ValueError(f"sqlite_busy_timeout_ms is only for SQLite databases, not {backend}")
    if given is None:
        return min(int(operation_timeout_s * 1000 * LOCK_WAIT_SHARE), MAX_SQLITE_BUSY_TIMEOUT_MS)
    return int(given)


def sqlite_pragmas(busy_timeout_ms: int, synchronous: str, *, retried: bool = False) -> tuple[str, ...]:
    """The statements that set up each new SQLite connection of a provider's own: the busy timeout
    (milliseconds), WAL, and ``PRAGMA synchronous`` (``FULL``, ``NORMAL`` or ``EXTRA``). ``retried``:
    the executor tries statements again (:class:`.retry.SqliteLockWait`), so each try waits at most
    :data:`.retry.SQLITE_TRY_BUSY_TIMEOUT_MS`."""
    if retried:
        busy_timeout_ms = min(busy_timeout_ms, SQLITE_TRY_BUSY_TIMEOUT_MS)
    return (
        f"PRAGMA busy_timeout = {int(busy_timeout_ms)}",
        "PRAGMA journal_mode = WAL",
        f"PRAGMA synchronous = {synchronous}",
    )


def migrate_command_options(names: LeaseTableNames) -> str:
    """The ``sql-lease migrate`` options that name this table (empty for the defaults), each with
    a leading space, for hints in messages."""
    options = "" if names.table == DEFAULT_TABLE_NAME else f" --table {names.table}"
    options += f" --schema {names.schema}" if names.schema else ""
    if names.version_table != derived_version_table(names.table):
        options += f" --version-table {names.version_table}"
    return options


def schema_missing(names: LeaseTableNames, safe_url: str, exc: BaseException) -> SchemaMissingError:
    """The error for a statement that found no lease table (or an older one) at ``safe_url`` (a URL
    without its password), with the command that fixes it."""
    # revision 0006, and 0007 (SQLite: "no such index" of the one-statement slot operations)
    later = (names.slot_table, names.slot_acquire_function, names.slot_release_function, names.slot_live_index)
    older = schema_outdated(exc) or any(name in str(exc) for name in later)
    problem = "is older than this sql_lease" if older else "not found"
    return SchemaMissingError(
        f"lease table {names.table!r} {problem} in {safe_url}: "
        f"run `sql-lease migrate --url URL{migrate_command_options(names)}` first ({describe(exc)})"
    )


def database_file_missing(names: LeaseTableNames, path: Path | None) -> SchemaMissingError:
    """The error for an operation on a SQLite database file that does not exist (yet)."""
    return SchemaMissingError(
        f"lease table {names.table!r} not found: the SQLite database file {path} "
        f"does not exist: run `sql-lease migrate --url URL{migrate_command_options(names)}` first"
    )


def async_postgres_driver() -> str:
    """The driver the async face uses for a PostgreSQL URL: asyncpg when installed, else psycopg 3's
    async API; ``MissingDriverError`` naming both extras when neither is installed."""
    if importlib.util.find_spec("asyncpg") is not None:
        return "asyncpg"
    if importlib.util.find_spec("psycopg") is not None:
        return "psycopg"
    raise MissingDriverError(
        "no PostgreSQL driver is installed: pip install 'sql-lease[postgresql]' (asyncpg) "
        "or 'sql-lease[psycopg]' (psycopg 3)",
        name="asyncpg",
    )


def mysql_driver_checked(url: URL) -> URL:
    """``url`` (a ``mysql+driver://`` URL) when its driver is installed; else ``MissingDriverError``
    naming the ``mysql`` extra."""
    driver = url.drivername.partition("+")[2]
    module = {"mysqldb": "MySQLdb"}.get(driver, driver)
    if importlib.util.find_spec(module) is None:
        raise MissingDriverError(
            f"the MySQL driver {driver} is not installed: pip install 'sql-lease[mysql]' (asyncmy and PyMySQL)",
            name=module,
        )
    return url


def mysql_lock_wait_s(operation_timeout_s: float) -> int:
    """The lock wait timeout of a provider's own MySQL sessions: the share ``LOCK_WAIT_SHARE`` of the
    operation timeout in whole seconds (the server's unit), at least 1."""
    return max(1, int(operation_timeout_s * LOCK_WAIT_SHARE))


def mysql_session_setup(operation_timeout_s: float) -> tuple[str, ...]:
    """The statements that set up each MySQL connection of a provider's own: READ COMMITTED, and
    :func:`mysql_lock_wait_s`."""
    return (*MYSQL_SESSION_SETUP, f"SET SESSION innodb_lock_wait_timeout = {mysql_lock_wait_s(operation_timeout_s)}")


def autocommit_engine_options() -> dict[str, Any]:
    """The ``create_engine`` options of an engine the provider makes for itself: AUTOCOMMIT, and no
    ``ROLLBACK`` at each check-in (PyMySQL and asyncmy send one even in autocommit) where the
    installed SQLAlchemy offers ``skip_autocommit_rollback`` (2.0.43 and later)."""
    import sqlalchemy as sa

    options: dict[str, Any] = {"isolation_level": "AUTOCOMMIT"}
    release = tuple(int(part) for part in sa.__version__.split(".")[:3] if part.isdigit())
    if release >= (2, 0, 43):
        options["skip_autocommit_rollback"] = True
    return options


def mysql_engine(url: URL, pool_size: int, operation_timeout_s: float) -> Any:
    """The sync face's own engine for a MySQL URL: ``pool_size`` connections in autocommit, each set
    up by :func:`mysql_session_setup`, with the driver's socket timeouts as a backstop (the
    watchdog ends a statement at its deadline)."""
    import sqlalchemy as sa

    statements = mysql_session_setup(operation_timeout_s)
    timeout_s = max(1, math.ceil(operation_timeout_s))
    engine = sa.create_engine(
        url,
        pool_size=pool_size,
        max_overflow=0,
        pool_recycle=3600,
        connect_args={"connect_timeout": timeout_s, "read_timeout": timeout_s + 5, "write_timeout": timeout_s + 5},
        **autocommit_engine_options(),
    )

    return run_at_connect(engine, statements)


MYSQL_MULTI_STATEMENTS = 1 << 16  # the protocol's CLIENT_MULTI_STATEMENTS capability flag


MYSQL_OWN_DRIVERS = ("asyncmy", "pymysql")
"""The drivers of a MySQL URL whose connections the provider runs itself (multi-statement packets);
a URL naming another (aiomysql, mysqlclient) runs on a SQLAlchemy engine of its own, step by step."""


def mysql_connect_kwargs(engine: Any, operation_timeout_s: float) -> dict[str, Any]:
    """The driver's ``connect()`` arguments for the provider's own MySQL connections: what
    SQLAlchemy's dialect makes of ``engine``'s URL (host, credentials, TLS, charset, its client
    flags), in autocommit, with multi-statement packets (one round trip per acquire) and a connect
    timeout (whole seconds) within the operation timeout. ``engine``: a sync ``Engine`` (an
    ``AsyncEngine``'s ``sync_engine``) that only migrates."""
    _, kwargs = engine.dialect.create_connect_args(engine.url)
    kwargs["client_flag"] = kwargs.get("client_flag", 0) | MYSQL_MULTI_STATEMENTS
    kwargs["autocommit"] = True
    kwargs.setdefault("connect_timeout", max(1, math.ceil(operation_timeout_s)))
    return dict(kwargs)


def run_at_connect(engine: Any, statements: Sequence[str]) -> Any:
    """``engine`` (a sync ``Engine``, or an ``AsyncEngine``'s ``sync_engine``), each new connection of
    which runs ``statements`` first: only for an engine the provider made itself."""
    import sqlalchemy as sa

    @sa.event.listens_for(engine, "connect")
    def configure(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            for statement in statements:
                cursor.execute(statement)
        finally:
            cursor.close()

    return engine


def async_engine_arguments(url: str | URL) -> tuple[URL, dict[str, Any]]:
    """The URL and ``connect_args`` of ``create_async_engine`` for ``url`` on the async face's
    driver (:func:`async_postgres_driver`; libpq's parameters mapped for asyncpg). ``ValueError``
    (``InvalidURLError``) for a URL neither driver would take."""
    parsed = to_async_url(url)
    if parsed.get_backend_name() != "postgresql":
        return parsed, {}
    if async_postgres_driver() == "psycopg":
        parsed = parsed.set(drivername="postgresql+psycopg")
        psycopg_conninfo_checked(parsed)
        return parsed, {}
    return asyncpg_url_and_args(parsed)


def psycopg_conninfo_checked(url: URL) -> str:
    """libpq's connection string for ``url``; ``InvalidURLError`` for a parameter libpq refuses."""
    try:
        return psycopg_conninfo(url)
    except InvalidURLError:
        raise
    except ValueError as exc:
        raise InvalidURLError(str(exc)) from None


def utc_timestamptz_loader() -> type:
    """A loader of ``timestamptz`` as aware UTC datetimes, whatever the session's TimeZone: the
    driver's own (C) loader does the parsing, then the value is moved to UTC."""
    import psycopg
    from psycopg.adapt import Loader
    from psycopg.pq import Format

    oid = psycopg.adapters.types["timestamptz"].oid
    found = psycopg.adapters.get_loader(oid, Format.TEXT)
    assert found is not None
    parser: Any = found

    class UtcTimestamptzLoader(Loader):
        def __init__(self, oid: int, context: Any = None) -> None:
            super().__init__(oid, context)
            self._parse = parser(oid, context).load

        def load(self, data: Any) -> datetime:
            return self._parse(data).astimezone(UTC)  # type: ignore[no-any-return]

    return UtcTimestamptzLoader
