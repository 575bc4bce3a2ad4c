"""Database URLs: parsing them for the async and the sync drivers, and showing them without their secrets.

Every URL sql_lease prints (in messages, ``repr``, ``sql-lease migrate`` and ``bench``) goes
through :func:`safe_url`. It masks the password of the user information and every query parameter
that can carry a credential (``password``, ``sslpassword``, and any name containing ``password``,
``passwd``, ``secret`` or ``token``).

A password containing an unencoded ``@`` (``postgresql://u:p@ss@host/db``) cannot be told apart
from a host name: SQLAlchemy would take the password to be ``p`` and the host ``ss@host``, and
libpq splits at the first ``@`` too. Such URLs are refused with a ``ValueError`` that asks for
``%40`` and never repeats the URL.

Several hosts (PostgreSQL under Patroni, or any primary with standbys) are written either as
libpq does, ``postgresql://u:pw@h1:5432,h2:5432/db?target_session_attrs=read-write``, or as
SQLAlchemy does, ``postgresql://u:pw@/db?host=h1:5432&host=h2:5432&target_session_attrs=read-write``.
The libpq form is rewritten to SQLAlchemy's on parsing (SQLAlchemy refuses it); both faces'
drivers then try the hosts in order and take the first that matches ``target_session_attrs``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncEngine

from ..errors import InvalidURLError, MissingDriverError

__all__ = [
    "asyncpg_url_and_args",
    "hosts_and_ports",
    "open_existing_sqlite_file_only",
    "safe_url",
    "sqlite_file",
    "to_async_url",
    "to_sync_url",
]

ASYNC_DRIVERS = {"postgresql": "asyncpg", "sqlite": "aiosqlite", "mysql": "asyncmy"}
SYNC_DRIVERS = {"postgresql": "psycopg", "sqlite": "pysqlite", "mysql": "pymysql"}
# MySQL drivers each face keeps when a URL names one (any other is mapped to the face's own).
_MYSQL_FACE_DRIVERS = {"asyncmy": ("asyncmy", "aiomysql"), "pymysql": ("pymysql", "mysqldb")}
# Driver names a URL may carry; each face maps them to its own driver (ASYNC_DRIVERS, SYNC_DRIVERS).
_ACCEPTED_DRIVERS = {
    "postgresql": ("asyncpg", "psycopg", "psycopg2"),
    "sqlite": ("aiosqlite", "pysqlite"),
    "mysql": ("asyncmy", "aiomysql", "pymysql", "mysqldb"),
}
MASK = "***"
_SECRET_WORDS = ("password", "passwd", "secret", "token")
_NOT_A_URL = (
    "not a database URL; expected postgresql://user@host:5432/dbname, mysql://user@host:3306/dbname "
    "or sqlite:///path/to/file.db"
)
_UNENCODED_AT = (
    "the database URL has an '@' that is not the separator before the host (in the password, "
    "user name or database name?); write each such '@' as %40 (URL text is not repeated here, "
    "it may hold a password)"
)


# scheme://[userinfo@]h1[:p1],h2[:p2][/db][?query]: no '@' between the user information and the
# query; a query value may hold one (application_name=me@host)
_LIBPQ_MULTIHOST = re.compile(
    r"^(?P<head>[\w+.-]+://(?:[^@/?#]*@)?)(?P<hosts>[^@/?#]*,[^@/?#]*)(?P<tail>(?:/[^@?]*)?(?:\?.*)?)$"
)
_HOST_PORT = re.compile(r"^(?P<host>[A-Za-z0-9._-]+)(?::(?P<port>\d{1,5}))?$")
_DEFAULT_PORT = "5432"


def _is_secret(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in _SECRET_WORDS)


def _from_libpq_multihost(text: str) -> str:
    """``scheme://u@h1:p1,h2:p2/db?q`` as ``scheme://u@/db?host=h1:p1&host=h2:p2&q`` (a host
    without a port gets 5432, as in libpq); other text unchanged. ``ValueError`` for a host list
    it cannot read, or one that a ``host``/``port`` query parameter contradicts."""
    match = _LIBPQ_MULTIHOST.match(text)
    if match is None:
        return text
    path, _, query = match["tail"].partition("?")
    names = {piece.partition("=")[0] for piece in query.split("&") if piece}
    if names & {"host", "hostaddr", "port"}:
        raise ValueError(
            "the database URL lists hosts both before the database name and in a host/port query parameter"
        )
    params = []
    for entry in match["hosts"].split(","):
        host_port = _HOST_PORT.match(entry)
        if host_port is None:
            raise ValueError(
                "the database URL's host list is not host:port,host:port (names or IPv4 addresses; "
                "IPv6 addresses need the ?host=a1,a2&port=p1,p2 form); URL text is not repeated here"
            )
        params.append(f"host={host_port['host']}:{host_port['port'] or _DEFAULT_PORT}")
    return f"{match['head']}{path or '/'}?{'&'.join(params + ([query] if query else []))}"


def hosts_and_ports(url: URL) -> tuple[str | None, str | None]:
    """The hosts and ports of a PostgreSQL ``url`` as libpq's comma-separated ``host`` and
    ``port`` values (``None`` where the URL has none), from ``@host:port``, ``?host=h:p&host=h2:p2``
    or ``?host=h1,h2&port=p1,p2``. ``ValueError`` for a port that is not a number."""
    hosts, ports = _hosts_and_ports(url)
    for port in (ports or "").split(","):
        if port and not (port.isdigit() and 0 < int(port) < 65536):
            raise InvalidURLError("a port of the database URL is not a number from 1 to 65535")
    return hosts, ports


def _hosts_and_ports(url: URL) -> tuple[str | None, str | None]:
    query_host, query_port = url.query.get("host"), url.query.get("port")
    if query_host is None:
        if query_port is not None:
            return url.host or None, query_port if isinstance(query_port, str) else ",".join(query_port)
        return url.host or None, None if url.port is None else str(url.port)
    entries = [
        piece for entry in ([query_host] if isinstance(query_host, str) else query_host) for piece in entry.split(",")
    ]
    if isinstance(query_host, str) and query_port is None and ":" not in query_host:
        return query_host, None
    if query_port is not None:
        return ",".join(entries), query_port if isinstance(query_port, str) else ",".join(query_port)
    hosts, ports = [], []
    for entry in entries:
        host, _, port = entry.rpartition(":") if ":" in entry else (entry, "", "")
        if port and not port.isdigit():
            raise InvalidURLError("a host=... query parameter of the database URL has a port that is not a number")
        hosts.append(host)
        ports.append(port)
    return ",".join(hosts), ",".join(ports) if any(ports) else None


# Query parameters asyncpg takes as they are (SQLAlchemy's asyncpg dialect passes them on).
_ASYNCPG_TAKES = frozenset(
    {"host", "port", "target_session_attrs", "prepared_statement_cache_size", "passfile", "krbsrvname", "gsslib"}
)
# libpq's TLS parameters, which asyncpg reads from a DSN only.
_SSL_PARAMS = frozenset(
    {
        "sslmode",
        "sslcert",
        "sslkey",
        "sslrootcert",
        "sslcrl",
        "sslpassword",
        "sslnegotiation",
        "ssl_min_protocol_version",
        "ssl_max_protocol_version",
    }
)
_SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
_OTHER_LIBPQ = ("application_name", "connect_timeout", "options")


def asyncpg_url_and_args(url: URL) -> tuple[URL, dict[str, Any]]:
    """``url`` without the libpq query parameters asyncpg does not take, and those parameters as
    ``asyncpg.connect`` arguments: ``sslmode`` and the other ``ssl*`` ones (as a DSN asyncpg
    reads), ``application_name`` and each ``-c name=value`` of ``options`` (``server_settings``),
    ``connect_timeout`` in seconds (``timeout``; 0 means asyncpg's default). ``InvalidURLError``
    (a ``LeaseConfigError`` and a ``ValueError``) names a parameter neither driver would take, or a
    value that cannot be right (an unknown ``sslmode``, a port that is not a number)."""
    hosts_and_ports(url)  # checks every port
    args: dict[str, Any] = {}
    ssl: dict[str, str] = {}
    settings: dict[str, str] = {}
    moved = []
    for name, value in url.query.items():
        if name in _ASYNCPG_TAKES:
            continue
        if name not in _SSL_PARAMS and name not in _OTHER_LIBPQ:
            known = ", ".join(sorted(_ASYNCPG_TAKES | _SSL_PARAMS | set(_OTHER_LIBPQ)))
            raise InvalidURLError(
                f"the database URL has a query parameter sql_lease does not know: {name!r} (known: {known})"
            )
        if not isinstance(value, str):
            raise InvalidURLError(f"the database URL gives the query parameter {name!r} more than once")
        moved.append(name)
        if name in _SSL_PARAMS:
            if name == "sslmode" and value not in _SSL_MODES:
                raise InvalidURLError(f"the database URL's sslmode must be one of {', '.join(_SSL_MODES)}")
            ssl[name] = value
        elif name == "application_name":
            settings[name] = value
        elif name == "connect_timeout":
            try:
                seconds = float(value)
            except ValueError:
                raise InvalidURLError("the database URL's connect_timeout is not a number of seconds") from None
            if not 0 <= seconds < float("inf"):
                raise InvalidURLError("the database URL's connect_timeout must be 0 or more seconds")
            if seconds > 0:
                args["timeout"] = max(seconds, 2.0)  # libpq's minimum: 2 s
        else:
            settings.update(_libpq_options(value))
    if ssl:
        args["dsn"] = "postgresql://?" + urlencode(ssl)
    if settings:
        args["server_settings"] = settings
    return url.difference_update_query(moved), args


def _libpq_options(text: str) -> dict[str, str]:
    """libpq's ``options`` (``-c name=value -c name2=value2``, ``--name=value``; ``\\ `` for a
    space in a value) as server settings; ``InvalidURLError`` for any other command-line option."""
    tokens: list[str] = []
    current, escaped, started = [], False, False
    for char in text:
        if escaped:
            current.append(char)
            escaped = False
        elif char == "\\":
            escaped, started = True, True
        elif char.isspace():
            if started:
                tokens.append("".join(current))
            current, started = [], False
        else:
            current.append(char)
            started = True
    if started:
        tokens.append("".join(current))
    settings: dict[str, str] = {}
    words = iter(tokens)
    for word in words:
        if word == "-c":
            setting = next(words, "")
        elif word.startswith("-c") or word.startswith("--"):
            setting = word[2:]
        else:
            setting = ""
        name, equals, value = setting.partition("=")
        if not equals or not name:
            raise InvalidURLError("the database URL's options must be -c name=value settings (as libpq's)")
        settings[name.replace("-", "_")] = value
    return settings


def _parse(url: str | URL) -> URL:
    """``make_url`` that never echoes the text (a malformed URL may still carry a password);
    a libpq multi-host URL is first rewritten to SQLAlchemy's ``?host=`` form."""
    if isinstance(url, str) and url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://") :]
    if isinstance(url, str) and not url.strip():
        raise ValueError("the database URL is empty (an unset variable?); " + _NOT_A_URL.split("; ", 1)[1])
    if isinstance(url, str) and url.startswith("postgresql"):
        url = _from_libpq_multihost(url)
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        # ValueError: SQLAlchemy's int() of a "port" such as "ss@host" names that text
        raise ValueError(_UNENCODED_AT if isinstance(url, str) and url.count("@") > 1 else _NOT_A_URL) from None
    if parsed.get_backend_name() != "sqlite" and (
        _misplaced_at(parsed) or (isinstance(url, str) and _at_in_query_name(url))
    ):
        raise ValueError(_UNENCODED_AT)
    return parsed


def _at_in_query_name(text: str) -> bool:
    """True if a query parameter's name (or a parameter without ``=``, which SQLAlchemy drops)
    after the user information holds an '@': the tail of a password such as ``p@?x@host``."""
    rest = text.partition("://")[2]
    query = rest[rest.find("@") + 1 :].partition("?")[2]
    return any("@" in piece.partition("=")[0] for piece in query.split("&"))


def _misplaced_at(parsed: URL) -> bool:
    """True if an '@' ended up after the user information: the password (or user name) had an
    unencoded '@' and its tail was read as the host, database or a query parameter."""
    return "@" in (parsed.host or "") or "@" in (parsed.database or "") or any("@" in k for k in parsed.query)


def to_async_url(url: str | URL) -> URL:
    """Parse ``url`` and map it to the async drivers: ``postgresql://``, ``postgres://``,
    ``postgresql+psycopg://`` and ``postgresql+psycopg2://`` to asyncpg; ``sqlite://`` and
    ``sqlite+pysqlite://`` to aiosqlite (each face picks its own driver for the same URL).

    Raises ``ValueError`` for another database or driver, for in-memory SQLite (each pooled
    connection would see its own empty database; use ``InMemoryLeaseProvider`` instead), and for
    an ``@`` that is not percent-encoded (``%40``) in a password, user or database name.

    A ``password`` query parameter (which asyncpg accepts) is moved into the URL's password, where
    SQLAlchemy itself hides it (``repr(engine.url)``); the driver gets the same password.
    """
    return _to_driver_url(url, ASYNC_DRIVERS)


def to_sync_url(url: str | URL) -> URL:
    """Parse ``url`` and map it to the synchronous drivers: ``postgresql://``, ``postgres://``,
    ``postgresql+asyncpg://`` and ``postgresql+psycopg2://`` to psycopg 3 (``postgresql+psycopg``);
    ``sqlite://`` and ``sqlite+aiosqlite://`` to the standard library's ``sqlite3``
    (``sqlite+pysqlite``). The same checks and ``ValueError``s as :func:`to_async_url`."""
    return _to_driver_url(url, SYNC_DRIVERS)


def _to_driver_url(url: str | URL, drivers: Mapping[str, str]) -> URL:
    parsed = _parse(url)
    backend, _, driver = parsed.drivername.partition("+")
    if backend == "mariadb":  # the same server protocol and statements as MySQL
        backend = "mysql"
    if backend not in drivers:
        raise ValueError(f"sql_lease supports postgresql://, mysql:// and sqlite:// URLs, not {backend}://")
    wanted = drivers[backend]
    if driver and driver not in _ACCEPTED_DRIVERS[backend]:
        accepted = ", ".join(f"{backend}+{name}://" for name in _ACCEPTED_DRIVERS[backend])
        raise ValueError(f"{backend} URLs may name the driver as {accepted} (or none), not {driver}")
    if backend == "sqlite" and parsed.host:
        raise ValueError(
            f"SQLite URLs have no host: use sqlite:///{parsed.host}{'/' + parsed.database if parsed.database else ''} "
            "(three slashes: a path relative to the working directory) or sqlite:////absolute/path"
        )
    if backend == "sqlite" and parsed.database in (None, "", ":memory:"):
        raise ValueError(
            "in-memory SQLite is not shared between connections; give a file path or use InMemoryLeaseProvider"
        )
    if backend == "postgresql" and "password" in parsed.query:
        password = parsed.query["password"]
        if not isinstance(password, str):
            raise ValueError("the database URL gives the password query parameter more than once")
        # asyncpg gets the query's password over the user information's (the query is applied last)
        parsed = parsed.set(password=password).difference_update_query(["password"])
    if backend == "mysql":
        _check_mysql_query(parsed)
        if driver in _MYSQL_FACE_DRIVERS[wanted]:
            wanted = driver
        if "charset" not in parsed.query:  # keys, owners and data are UTF-8 (utf8mb4: all of Unicode)
            parsed = parsed.update_query_dict({"charset": "utf8mb4"})
    return parsed.set(drivername=f"{backend}+{wanted}")


_MYSQL_TLS = ("ssl_ca", "ssl_cert", "ssl_key", "ssl_capath", "ssl_cipher", "ssl_check_hostname")
_MYSQL_PARAMS = ("charset", "connect_timeout", "read_timeout", "unix_socket", "program_name", *_MYSQL_TLS)
_BOOLEANS = ("true", "false", "yes", "no", "on", "off", "1", "0")


def _check_mysql_query(url: URL) -> None:
    """``InvalidURLError`` for a MySQL URL query parameter that SQLAlchemy does not hand both faces'
    drivers (asyncmy, PyMySQL) in a form they take, or a value they could not use."""
    for name, value in url.query.items():
        if name not in _MYSQL_PARAMS:
            hint = "; for TLS give ssl_ca=/path/to/ca.pem (and ssl_cert, ssl_key for a client certificate)"
            raise InvalidURLError(
                f"the database URL has a query parameter sql_lease does not know on MySQL: {name!r} "
                f"(known: {', '.join(sorted(_MYSQL_PARAMS))}){hint if name.startswith('ssl') else ''}"
            )
        if not isinstance(value, str):
            raise InvalidURLError(f"the database URL gives the query parameter {name!r} more than once")
        if name in ("connect_timeout", "read_timeout") and not value.isdigit():
            raise InvalidURLError(f"the database URL's {name} must be a whole number of seconds")
        if name == "ssl_check_hostname" and value.lower() not in _BOOLEANS:
            raise InvalidURLError("the database URL's ssl_check_hostname must be true or false")
        if name == "charset" and value != "utf8mb4":
            raise InvalidURLError("the database URL's charset must be utf8mb4 (keys, owners and data are Unicode)")


def _query_text(query: Mapping[str, str | Sequence[str]]) -> str:
    parts = []
    for name, value in query.items():
        for one in (value,) if isinstance(value, str) else value:
            shown = MASK if _is_secret(name) else quote(one, safe="/:,.-_~")
            parts.append(f"{quote(name, safe='_-.')}={shown}")
    return "?" + "&".join(parts) if parts else ""


def safe_url(url: str | URL) -> str:
    """``url`` as text fit for messages and logs: the password and every credential-carrying query
    parameter replaced by ``***``. SQLite paths are shown as given.

    Never raises for a ``str`` or ``URL``: text that does not parse, or has an unencoded ``@``
    after the user information, is shown as a placeholder without any part of it.
    """
    try:
        parsed = _parse(url) if isinstance(url, str) else url
        if parsed.get_backend_name() != "sqlite" and _misplaced_at(parsed):
            raise ValueError(_UNENCODED_AT)
    except ValueError:
        return "<database URL not shown: it does not parse, or has an '@' that is not written as %40>"
    query = _query_text(parsed.query)
    if parsed.get_backend_name() == "sqlite" and not (parsed.username or parsed.password or parsed.host):
        return f"{parsed.drivername}:///{parsed.database or ''}{query}"
    base = parsed.set(query={}).render_as_string(hide_password=True)
    return base + query


def sqlite_file(url: URL) -> Path | None:
    """The file of a SQLite URL as an absolute path (the URL's path is relative to the working
    directory, as SQLite opens it); None for in-memory databases and ``uri=true`` URLs."""
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    if str(url.query.get("uri", "")).lower() in ("true", "1", "yes", "on"):
        return None
    return Path(os.path.abspath(url.database))


def open_existing_sqlite_file_only(engine: AsyncEngine, path: Path, missing: Callable[[], Exception]) -> None:
    """Make ``engine`` (created for the SQLite file ``path``) open that file only if it exists:
    raise ``missing()`` instead, and open it with ``mode=rw`` so that not even a race creates it.

    SQLite creates a missing database file on open, so a read such as ``sql-lease status`` on a
    mistyped path would leave an empty file behind. ``sql_lease.sql.migrate`` creates the file.
    """
    uri = "file:" + quote(str(path), safe="/") + "?mode=rw"

    @event.listens_for(engine.sync_engine, "do_connect")
    def connect(dialect: Any, connection_record: Any, cargs: list[Any], cparams: dict[str, Any]) -> None:
        if not path.exists():
            raise missing()
        cargs[:] = [uri]
        cparams["uri"] = True


def psycopg_conninfo(url: Any) -> str:
    """A libpq connection string from a SQLAlchemy ``URL`` (``ValueError`` for a query parameter
    libpq does not know; the text is never repeated, it may hold a password)."""
    try:
        from psycopg.conninfo import make_conninfo
    except ImportError as exc:
        raise MissingDriverError(
            f"psycopg 3 is not installed: pip install 'sql-lease[psycopg]' ({exc})", name=exc.name
        ) from exc

    params: dict[str, Any] = {}
    for name, value in url.query.items():
        params[name] = value if isinstance(value, str) else ",".join(value)
    for name in ("host", "port"):
        params.pop(name, None)
    host, port = hosts_and_ports(url)
    for name, value in (
        ("host", host),
        ("port", port),
        ("dbname", url.database),
        ("user", url.username),
        ("password", url.password),
    ):
        if value is not None and value != "":
            params[name] = str(value)
    try:
        return make_conninfo("", **params)
    except Exception as exc:
        unknown = sorted(set(url.query) - {"host", "port", "dbname", "user"})
        raise ValueError(
            f"the database URL has a parameter libpq does not accept ({', '.join(unknown) or 'see the URL'}): "
            f"{type(exc).__name__}"
        ) from None
