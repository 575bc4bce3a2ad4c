"""Driver errors to the library's errors, decided by exception class and SQLSTATE, in one place
for every driver (asyncpg, psycopg, sqlite3/aiosqlite) and both faces."""

from __future__ import annotations

import socket
import sqlite3
from collections.abc import Callable

from sqlalchemy.exc import StatementError

from ..errors import LeaseBackendError, LeaseConfigError, LeaseError, SchemaMissingError

__all__ = [
    "connection_survives",
    "describe",
    "mysql_errno",
    "mysql_not_sent",
    "operation_label",
    "schema_behind",
    "schema_outdated",
    "sqlite_busy",
    "sqlite_error",
    "sqlstate",
    "translate",
    "unknown_host",
]

# SQLSTATEs that no retry can fix: the configuration is wrong (class 28: the role or password;
# 3D000: no such database; 42501: a missing privilege).
_CONFIG_HINTS = {
    "28": "the server refused the role or its password: check the user and password of the URL",
    "3D000": "the database does not exist: create it or fix the database name in the URL",
    "42501": (
        "the role lacks a privilege on the lease table, its slot table, functions or procedures, or its fence "
        "sequence or counter (docs/operations.md: least privilege; `sql-lease check` names what is missing)"
    ),
}
# 42P01 undefined_table; 3F000 invalid_schema_name (a statement names '"schema".table'::regclass)
_SCHEMA_MISSING = {"42P01", "3F000"}
# 42703 undefined_column: the table predates a migration that added a column the statements use;
# 42883 undefined_function: it predates migration 0006's slot functions (MySQL: 0009's procedures)
_SCHEMA_OUTDATED = {"42703", "42883"}
_SQLITE_SCHEMA_OUTDATED = ("no such column", "has no column named", "no such index")
# Class 08 (connection exception), 57P01-57P03 (shutdown, crash, cannot connect now), 53300 (too
# many connections): the server is gone or going, so the connection is not reusable.
_CONNECTION_GONE_PREFIXES = ("08", "57P")
# MySQL/MariaDB error numbers read as the SQLSTATE of the same meaning above: access denied (the
# user or password: 1045, 1698; a database or privilege: 1044, 1142, 1370 on a procedure), unknown database, a missing
# table, a missing column, a missing procedure. Numbers from 2000 are the client's own (no answer from the server).
_MYSQL_AS_SQLSTATE = {
    1045: "28000",
    1698: "28000",
    1044: "42501",
    1142: "42501",
    1370: "42501",
    1049: "3D000",
    1146: "42P01",
    1054: "42703",
    1305: "42883",
}
_MYSQL_CLIENT_ERRORS = 2000
UNKNOWN_HOST_HINT = "the host name does not resolve: fix the host of the URL"
# The resolver's definite "no such name" (EAI_NONAME, EAI_NODATA), as the drivers quote it (glibc,
# macOS); a temporary failure ("Temporary failure in name resolution") is not one.
_NO_SUCH_HOST = ("Name or service not known", "No address associated with hostname", "nodename nor servname provided")
_MYSQL_SERVER_GONE = 2006  # CR_SERVER_GONE_ERROR: the client could not send the statement


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a driver error (asyncpg ``sqlstate``, psycopg ``sqlstate``), also when it
    is wrapped by SQLAlchemy (``orig``) or chained (``__cause__``); for the MySQL errors of
    ``_MYSQL_AS_SQLSTATE``, PostgreSQL's SQLSTATE of the same meaning."""
    mapped = _MYSQL_AS_SQLSTATE.get(mysql_errno(exc) or 0)
    if mapped is not None:
        return mapped
    seen: BaseException | None = exc
    for _ in range(6):
        if seen is None:
            return None
        state = getattr(seen, "sqlstate", None)
        if isinstance(state, str) and state:
            return state
        seen = getattr(seen, "orig", None) or seen.__cause__
    return None


def mysql_errno(exc: BaseException) -> int | None:
    """The MySQL/MariaDB error number of a driver error (PyMySQL, asyncmy, aiomysql and mysqlclient
    put it first in ``args``), also when wrapped by SQLAlchemy (``orig``) or chained (``__cause__``)."""
    seen: BaseException | None = exc
    for _ in range(6):
        if seen is None:
            return None
        module = type(seen).__module__.split(".")[0]
        if module in ("pymysql", "asyncmy", "aiomysql", "MySQLdb") and seen.args and isinstance(seen.args[0], int):
            return seen.args[0]
        seen = getattr(seen, "orig", None) or seen.__cause__
    return None


def mysql_not_sent(exc: BaseException) -> bool:
    """True if ``exc`` is MySQL's client error 2006 (CR_SERVER_GONE_ERROR, "server has gone away"):
    the connection was found closed when the statement was to be written, so it was not sent
    (2013, CR_SERVER_LOST, is a statement sent whose answer never came)."""
    return mysql_errno(exc) == _MYSQL_SERVER_GONE


def unknown_host(exc: BaseException) -> bool:
    """True if ``exc`` (or an error it wraps or was raised from) is the resolver's answer that the
    URL's host name does not exist: configuration, not an outage."""
    no_such_name = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}
    seen: BaseException | None = exc
    for _ in range(6):
        if seen is None:
            return False
        if isinstance(seen, socket.gaierror):
            return seen.errno in no_such_name
        if any(text in str(seen) for text in _NO_SUCH_HOST):
            return True
        seen = getattr(seen, "orig", None) or seen.__cause__ or seen.__context__
    return False


def sqlite_error(exc: BaseException) -> sqlite3.Error | None:
    """The ``sqlite3`` error behind ``exc`` (itself, or found through ``.orig``/``__cause__``), else None."""
    seen: BaseException | None = exc
    for _ in range(6):
        if seen is None:
            return None
        if isinstance(seen, sqlite3.Error):
            return seen
        seen = getattr(seen, "orig", None) or seen.__cause__
    return None


def sqlite_busy(exc: BaseException) -> bool:
    """True if ``exc`` is SQLite's SQLITE_BUSY (any extended code; also wrapped by SQLAlchemy):
    another writer held the lock past the busy timeout, and the statement wrote nothing."""
    lite = sqlite_error(exc)
    return lite is not None and getattr(lite, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_BUSY


def schema_outdated(exc: BaseException) -> bool:
    """True if ``exc`` says a column of the lease table is missing: the schema needs ``sql-lease migrate``."""
    if sqlstate(exc) in _SCHEMA_OUTDATED:
        return True
    lite = sqlite_error(exc)
    return lite is not None and any(text in str(lite) for text in _SQLITE_SCHEMA_OUTDATED)


def schema_behind(exc: BaseException) -> bool:
    """True if ``exc`` says a table, column, index or function of the lease tables is missing: the
    schema is absent or older than this sql_lease (``sql-lease migrate``)."""
    lite = sqlite_error(exc)
    # SQLite reports a missing table only as text (SQLITE_ERROR is every kind of error).
    missing = sqlstate(exc) in _SCHEMA_MISSING or (lite is not None and "no such table" in str(lite))
    return missing or schema_outdated(exc)


def connection_survives(exc: BaseException) -> bool:
    """True if ``exc`` is the server's (or SQLite's) answer about the statement, so the connection
    that ran it can be reused; False for timeouts, cancellations and lost connections."""
    state = sqlstate(exc)
    if state is not None:
        return not state.startswith(_CONNECTION_GONE_PREFIXES) and state != "53300"
    errno = mysql_errno(exc)
    if errno is not None:
        return errno < _MYSQL_CLIENT_ERRORS
    return sqlite_error(exc) is not None


def describe(exc: BaseException) -> str:
    """``exc`` for a message: the driver error's class and the first line of its text, without
    SQL or statement parameters. SQLAlchemy's wrapper text (``[SQL: ...] [parameters: ...]``, lease
    data included) is left out, and its parameters are hidden wherever the chain is printed."""
    shown: BaseException = exc
    seen: BaseException | None = exc
    for _ in range(6):
        if seen is None:
            break
        if isinstance(seen, StatementError):
            seen.hide_parameters = True  # a traceback of the chain (a log's exc_info) shows none
            if seen.orig is not None:
                shown = seen.orig
        seen = seen.__cause__ or seen.__context__
    if isinstance(shown, StatementError):
        return type(shown).__name__  # no driver error under it: its own text is SQL and parameters
    lines = str(shown).strip().splitlines()  # libpq appends LINE n: <statement text> ^
    return f"{type(shown).__name__}: {lines[0]}" if lines else type(shown).__name__


def operation_label(operation: str, key: str | None) -> str:
    """How error messages name an operation: ``acquire 'k'``, or ``sweep`` without a key."""
    return f"{operation} {key!r}" if key is not None else operation


def translate(
    exc: BaseException, what: str, where: str, schema_missing: Callable[[BaseException], SchemaMissingError]
) -> LeaseError:
    """The library error for a driver error raised while doing ``what`` on ``where`` (a safe URL);
    ``schema_missing`` words the error for a missing table or column (it knows the migrate command)."""
    state = sqlstate(exc)
    if schema_behind(exc):
        return schema_missing(exc)
    if state is not None:
        hint = _CONFIG_HINTS.get(state) or (_CONFIG_HINTS["28"] if state.startswith("28") else None)
        if hint is not None:
            return LeaseConfigError(f"{what} on {where}: {hint} ({describe(exc)})")
    if unknown_host(exc):
        return LeaseConfigError(f"{what} on {where}: {UNKNOWN_HOST_HINT} ({describe(exc)})")
    return LeaseBackendError(f"{what} on {where} failed: {describe(exc)}")
