"""Django: the lease URL from ``settings.DATABASES``.

::

    # myproject/leases.py
    from sql_lease import SyncSqlLeaseProvider
    from sql_lease.django import sql_lease_url_from_django

    leases = SyncSqlLeaseProvider(sql_lease_url_from_django())  # module level: connects on first use

The provider keeps connections of its own (psycopg 3 in autocommit, or the standard ``sqlite3``):
lease statements never run inside Django's transaction (``ATOMIC_REQUESTS``, ``transaction.atomic``),
so an acquire commits at once and stays done when the request's transaction rolls back.

Django itself is imported only inside :func:`sql_lease_url_from_django`: importing this module
needs no Django.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

__all__ = ["sql_lease_url_from_django"]

_POSTGRES_ENGINES = (
    "django.db.backends.postgresql",
    "django.db.backends.postgresql_psycopg2",
    "django.contrib.gis.db.backends.postgis",
)
_SQLITE_ENGINES = ("django.db.backends.sqlite3", "django.contrib.gis.db.backends.spatialite")
# OPTIONS Django reads itself; they are not libpq connection parameters.
_DJANGO_ONLY_OPTIONS = frozenset(
    {"isolation_level", "server_side_binding", "pool", "assume_role", "cursor_factory", "context", "prepare_threshold"}
)


def sql_lease_url_from_django(alias: str = "default") -> str:
    """The ``sql_lease`` URL of the database ``settings.DATABASES[alias]`` names.

    PostgreSQL (``django.db.backends.postgresql``, PostGIS) becomes
    ``postgresql://USER:PASSWORD@HOST:PORT/NAME``, each part percent-encoded; a ``HOST`` that is a
    Unix socket directory (``/var/run/postgresql``) and the libpq parameters of ``OPTIONS``
    (``sslmode``, ``sslrootcert``, ``options``, ``service``, ``application_name``...: every
    ``str``/``int`` value except the options Django reads itself, such as ``isolation_level`` and
    ``pool``) go into the query. SQLite (``django.db.backends.sqlite3``) becomes
    ``sqlite:////absolute/path/of/NAME``.

    The URL holds the password in clear: pass it to ``SyncSqlLeaseProvider`` (or
    ``SqlLeaseProvider``), do not log it (the providers' ``repr`` and messages mask it).

    Raises ``KeyError`` for an alias that ``DATABASES`` lacks, and ``ValueError`` for another
    database engine or an in-memory SQLite database (each connection would see its own).
    """
    from django.conf import settings  # type: ignore[import-not-found,import-untyped,unused-ignore]

    databases: Mapping[str, Mapping[str, Any]] = settings.DATABASES
    if alias not in databases:
        raise KeyError(f"settings.DATABASES has no alias {alias!r} (it has {', '.join(map(repr, databases))})")
    return _url_from_settings_dict(databases[alias], alias)


def _url_from_settings_dict(db: Mapping[str, Any], alias: str) -> str:
    from sqlalchemy.engine import URL

    engine = str(db.get("ENGINE", ""))
    name = db.get("NAME")
    if engine in _SQLITE_ENGINES:
        text = str(name) if isinstance(name, (str, PurePath)) else ""
        if text in ("", ":memory:") or text.startswith("file:"):
            raise ValueError(
                f"DATABASES[{alias!r}] is an in-memory or URI SQLite database; leases need a file path "
                "(or use SyncInMemoryLeaseProvider in tests)"
            )
        import os

        return "sqlite:///" + os.path.abspath(text)
    if engine not in _POSTGRES_ENGINES:
        raise ValueError(f"DATABASES[{alias!r}] uses {engine or 'no ENGINE'}; sql_lease supports PostgreSQL and SQLite")
    query: dict[str, str] = {}
    options: Mapping[str, Any] = db.get("OPTIONS") or {}
    for option, value in options.items():
        if option in _DJANGO_ONLY_OPTIONS or isinstance(value, bool) or not isinstance(value, (str, int)):
            continue
        query[option] = str(value)
    host = str(db.get("HOST") or "") or None
    if host is not None and host.startswith("/"):  # a Unix socket directory: libpq takes it as host=
        query["host"] = host
        host = None
    port = db.get("PORT")
    url = URL.create(
        "postgresql",
        username=str(db.get("USER") or "") or None,
        password=str(db.get("PASSWORD") or "") or None,
        host=host,
        port=int(port) if port not in (None, "") else None,
        database=str(name) if name else None,
        query=query,
    )
    return url.render_as_string(hide_password=False)
